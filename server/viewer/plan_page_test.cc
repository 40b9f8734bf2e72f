// The plan page shows the plan's numbers: its embedded JSON data block
// (parsed here as JSON) equals the plan's statistics, and the SVG labels and
// header say the same; the page fetches nothing; text is escaped; a
// 512-rank plan's page stays small; /plans answers index, page, 400, 404.
#include "server/viewer/plan_page.h"

#include <chrono>
#include <cstdio>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/workload.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "server/plan/compiler.h"
#include "server/plan/plan_cache.h"
#include "server/viewer/page_text.h"
#include "server/viewer/plan_figures.h"
#include "server/viewer/plans_http.h"

namespace hsap::viewer {
namespace {

using google::protobuf::ListValue;
using google::protobuf::Struct;
using google::protobuf::Value;
using plan::Plan;

plan::PlanSpec Spec(int32_t nodes, int32_t dpn, plan::Strategy strategy,
                    std::vector<int64_t> cu) {
  plan::PlanSpec spec;
  spec.total_tokens = cu.back();
  spec.cu_seqlens = std::move(cu);
  spec.topology = {nodes, dpn};
  spec.shape = {.num_heads_q = 32, .num_heads_kv = 8, .head_dim = 128, .dtype = DType::kBFloat16};
  spec.strategy = strategy;
  spec.profile = "h100";
  return spec;
}

std::vector<int64_t> Pack(int64_t tokens, uint64_t seed = 7) {
  absl::StatusOr<std::vector<int64_t>> lengths = LoadDocumentLengths(FindWorkload());
  EXPECT_TRUE(lengths.ok()) << lengths.status();
  if (!lengths.ok()) return {0, tokens};
  return PackDocuments(*lengths, tokens, 1, seed)[0];
}

Plan Compile(const plan::PlanSpec& spec) {
  absl::StatusOr<Plan> p = plan::CompilePlan(spec);
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? *std::move(p) : Plan();
}

// The text of <script type="application/json" id="plan-data">, parsed.
Struct DataBlock(const std::string& html) {
  const std::string open = "<script type=\"application/json\" id=\"plan-data\">";
  const size_t begin = html.find(open);
  EXPECT_NE(begin, std::string::npos);
  const size_t end = html.find("</script>", begin);
  Struct data;
  if (begin == std::string::npos || end == std::string::npos) return data;
  const std::string json = html.substr(begin + open.size(), end - begin - open.size());
  const auto status = google::protobuf::util::JsonStringToMessage(json, &data);
  EXPECT_TRUE(status.ok()) << status.ToString();
  return data;
}

const Value& Field(const Struct& s, const std::string& key) {
  static const Value* kMissing = new Value();
  auto it = s.fields().find(key);
  EXPECT_NE(it, s.fields().end()) << "no field " << key;
  return it == s.fields().end() ? *kMissing : it->second;
}
double Num(const Struct& s, const std::string& key) { return Field(s, key).number_value(); }
const Struct& Obj(const Struct& s, const std::string& key) { return Field(s, key).struct_value(); }
const ListValue& List(const Struct& s, const std::string& key) {
  return Field(s, key).list_value();
}
std::array<int64_t, 2> Pair(const Struct& s, const std::string& key) {
  const ListValue& l = List(s, key);
  EXPECT_EQ(l.values_size(), 2) << key;
  if (l.values_size() != 2) return {-1, -1};
  return {static_cast<int64_t>(l.values(0).number_value()),
          static_cast<int64_t>(l.values(1).number_value())};
}

// The text of the element with id `id`: "<... id="id" ...>TEXT</".
std::string ElementText(const std::string& html, const std::string& id) {
  const size_t at = html.find(absl::StrCat("id=\"", id, "\""));
  if (at == std::string::npos) return "";
  const size_t gt = html.find('>', at);
  const size_t end = html.find("</", gt);
  return html.substr(gt + 1, end - gt - 1);
}

void ExpectDataMatchesPlan(const Plan& p, const std::string& html) {
  const Struct data = DataBlock(html);
  EXPECT_EQ(Field(data, "plan_key").string_value(), p.key.ToHex());
  EXPECT_EQ(Field(data, "strategy").string_value(), plan::StrategyName(p.strategy));
  EXPECT_EQ(Field(data, "requested_strategy").string_value(), plan::StrategyName(p.spec.strategy));
  EXPECT_EQ(Num(data, "ranks"), p.spec.topology.num_ranks());
  EXPECT_EQ(Num(data, "nodes"), p.spec.topology.num_nodes);
  EXPECT_EQ(Num(data, "total_tokens"), p.spec.total_tokens);
  EXPECT_EQ(Num(data, "heads_q"), p.spec.shape.num_heads_q);
  EXPECT_EQ(Field(data, "dtype").string_value(), "bfloat16");
  EXPECT_EQ(Num(data, "compile_us"), p.stats.compile_us);
  EXPECT_EQ(Num(data, "documents"), p.spec.cu_seqlens.size() - 1);

  const Struct& st = Obj(data, "stats");
  EXPECT_EQ(Num(st, "total_area"), p.stats.total_area);
  EXPECT_EQ(Num(st, "imbalance"), p.stats.imbalance);  // exact: shortest round trip
  EXPECT_EQ(Num(st, "max_fwd_recv_bytes"), p.stats.max_fwd_recv_bytes);
  EXPECT_EQ(Num(st, "total_fwd_bytes"), p.stats.total_fwd_bytes);
  EXPECT_EQ(Num(st, "total_bwd_bytes"), p.stats.total_bwd_bytes);
  EXPECT_EQ(Num(st, "fwd_us"), p.stats.fwd_us);
  EXPECT_EQ(Num(st, "bwd_us"), p.stats.bwd_us);
  EXPECT_EQ(Num(st, "modeled_us"), p.stats.modeled_us);
  EXPECT_EQ(Num(st, "lower_bound_us"), p.stats.lower_bound_us);
  EXPECT_EQ(Pair(st, "total_fwd_bytes_by_tier"), p.stats.total_fwd_bytes_by_tier);

  const ListValue& cands = List(data, "candidates");
  ASSERT_EQ(cands.values_size(), static_cast<int>(p.stats.candidates.size()));
  for (int i = 0; i < cands.values_size(); ++i) {
    const Struct& c = cands.values(i).struct_value();
    EXPECT_EQ(Field(c, "strategy").string_value(),
              plan::StrategyName(p.stats.candidates[i].strategy));
    EXPECT_EQ(Num(c, "modeled_us"), p.stats.candidates[i].modeled_us);
  }

  const ListValue& ranks = List(data, "per_rank");
  ASSERT_EQ(ranks.values_size(), static_cast<int>(p.ranks.size()));
  for (int r = 0; r < ranks.values_size(); ++r) {
    const Struct& j = ranks.values(r).struct_value();
    const plan::RankStats& s = p.ranks[r].stats;
    EXPECT_EQ(Num(j, "tokens"), s.tokens) << r;
    EXPECT_EQ(Num(j, "head_area"), s.head_area) << r;
    EXPECT_EQ(Pair(j, "fwd_recv_bytes"), s.fwd_recv_bytes) << r;
    EXPECT_EQ(Pair(j, "bwd_recv_bytes"), s.bwd_recv_bytes) << r;
    EXPECT_EQ(Num(j, "lower_bound_recv_bytes"), s.lower_bound_recv_bytes) << r;
    EXPECT_EQ(Num(j, "exact_need_bytes"), s.exact_need_bytes) << r;
    EXPECT_EQ(Num(j, "fwd_us"), s.fwd_us) << r;
    EXPECT_EQ(Num(j, "bwd_compute_us"), s.bwd_compute_us) << r;
  }

  // The documents and owners as given; owners cover [0, T).
  const ListValue& docs = List(data, "docs");
  ASSERT_EQ(docs.values_size(), 2 * static_cast<int>(p.spec.cu_seqlens.size() - 1));
  for (size_t i = 0; i + 1 < p.spec.cu_seqlens.size(); ++i) {
    EXPECT_EQ(docs.values(2 * i).number_value(), p.spec.cu_seqlens[i]);
    EXPECT_EQ(docs.values(2 * i + 1).number_value(), p.spec.cu_seqlens[i + 1]);
  }
  const ListValue& owners = List(data, "owners");
  double covered = 0;
  for (int i = 0; i + 2 < owners.values_size(); i += 3) {
    covered += owners.values(i + 1).number_value() - owners.values(i).number_value();
  }
  EXPECT_EQ(covered, p.spec.total_tokens);

  // The timeline's stages sum to the modeled times.
  const Struct& tl = Obj(data, "timeline");
  for (const char* dir : {"fwd", "bwd"}) {
    double sum = 0;
    for (const Value& v : List(Obj(tl, dir), "stage_us").values()) sum += v.number_value();
    const double want = std::string(dir) == "fwd" ? p.stats.fwd_us : p.stats.bwd_us;
    EXPECT_NEAR(sum, want, 1e-9 * want) << dir;
  }

  // Traffic: the rows' matrix sums to the forward bytes.
  const Struct& rows_m = Obj(Obj(data, "traffic"), "rows");
  double traffic = 0;
  for (const Value& v : List(rows_m, "fwd").values()) traffic += v.number_value();
  EXPECT_EQ(traffic, p.stats.total_fwd_bytes);

  // The SVG labels and header say the same.
  EXPECT_EQ(ElementText(html, "imbalance-label"),
            absl::StrCat("imbalance ", absl::StrFormat("%.4f", p.stats.imbalance),
                         " (busiest / mean)"));
  EXPECT_EQ(ElementText(html, "fwd-modeled"), absl::StrCat("modeled ", FormatUs(p.stats.fwd_us)));
  EXPECT_EQ(ElementText(html, "bwd-modeled"), absl::StrCat("modeled ", FormatUs(p.stats.bwd_us)));
  EXPECT_EQ(ElementText(html, "plan-key"), p.key.ToHex());
  EXPECT_TRUE(absl::StrContains(ElementText(html, "h-modeled"), FormatUs(p.stats.modeled_us)));
}

// Nothing on the page can reach the network.
void ExpectSelfContained(const std::string& html) {
  for (const char* bad : {"http:", "https:", "//cdn", " src=", "@import", "url(", "fetch(",
                          "XMLHttpRequest", "<link", "<iframe", "<img"}) {
    EXPECT_FALSE(absl::StrContains(html, bad)) << "page contains " << bad;
  }
  EXPECT_TRUE(absl::StrContains(html, "Content-Security-Policy\" content=\"default-src 'none'"));
  EXPECT_TRUE(absl::StrContains(html, "<pre id=\"errors\" hidden></pre>"));
}

TEST(PlanPageTest, TwoByTwoPlanShowsItsStatistics) {
  const Plan p = Compile(Spec(2, 2, plan::Strategy::kHsap, {0, 1500, 2600, 3000, 4096}));
  const std::string html = PlanPageHtml(p, {.origin = "test", .cache_hits = 3});
  ExpectDataMatchesPlan(p, html);
  ExpectSelfContained(html);
  const Struct data = DataBlock(html);
  EXPECT_EQ(Num(data, "cache_hits"), 3);
  EXPECT_EQ(Field(data, "row_level").string_value(), "rank");
  EXPECT_EQ(List(data, "rows").values_size(), 4);
  // Rank and node matrices, with the inter-node cells marked.
  const Struct& nodes = Obj(Obj(data, "traffic"), "nodes");
  EXPECT_EQ(Num(nodes, "n"), 2);
  EXPECT_EQ(List(nodes, "inter").values(1).number_value(), 1);
  EXPECT_EQ(List(nodes, "inter").values(0).number_value(), 0);
  EXPECT_EQ(ElementText(html, "h-hits"), "3");
  EXPECT_EQ(ElementText(html, "h-topology"), "2 nodes &times; 2 ranks = 4 ranks");
  EXPECT_EQ(ElementText(html, "h-heads"), "Hq 32, Hkv 8, D 128, bfloat16");
  EXPECT_TRUE(absl::StrContains(html, "id=\"fwd-inter-floor\""));
}

TEST(PlanPageTest, AutoPlanListsEveryCandidate) {
  const Plan p = Compile(Spec(4, 4, plan::Strategy::kAuto, Pack(1 << 16)));
  ASSERT_EQ(p.stats.candidates.size(), 6u);
  const std::string html = PlanPageHtml(p, {.origin = "test"});
  ExpectDataMatchesPlan(p, html);
  ExpectSelfContained(html);
  EXPECT_EQ(Field(DataBlock(html), "cache_hits").kind_case(), Value::kNullValue);
  for (const plan::StrategyCost& c : p.stats.candidates) {
    const std::string row = absl::StrCat(plan::StrategyName(c.strategy),
                                         c.strategy == p.strategy ? " (chosen)" : "", "</td><td>",
                                         FormatUs(c.modeled_us), "</td>");
    EXPECT_TRUE(absl::StrContains(html, row)) << row;
  }
}

TEST(PlanPageTest, OriginAndProfileAreEscaped) {
  const Plan p = Compile(Spec(1, 2, plan::Strategy::kSap, {0, 100, 256}));
  const std::string html = PlanPageHtml(p, {.origin = "<script>alert(1)</script>&\""});
  EXPECT_FALSE(absl::StrContains(html, "<script>alert"));
  EXPECT_TRUE(absl::StrContains(html, "&lt;script&gt;alert(1)&lt;/script&gt;&amp;&quot;"));
  // In the JSON block too: no "</script" inside it.
  EXPECT_TRUE(absl::StrContains(html, "\\u003cscript\\u003ealert(1)\\u003c/script\\u003e"));
  EXPECT_EQ(Field(DataBlock(html), "origin").string_value(), "<script>alert(1)</script>&\"");
}

TEST(PlanPageTest, AboveSixtyFourRanksRowsAreNodes) {
  const Plan p = Compile(Spec(16, 8, plan::Strategy::kHsap, Pack(1 << 18)));
  const std::string html = PlanPageHtml(p, {.origin = "test"});
  ExpectDataMatchesPlan(p, html);
  const Struct data = DataBlock(html);
  EXPECT_EQ(Field(data, "row_level").string_value(), "node");
  const ListValue& rows = List(data, "rows");
  ASSERT_EQ(rows.values_size(), 16);
  // A node row is the sum of its ranks.
  for (int n = 0; n < 16; ++n) {
    int64_t inter = 0, area = 0;
    for (int r = 8 * n; r < 8 * n + 8; ++r) {
      inter += p.ranks[r].stats.fwd_recv_bytes[1];
      area += p.ranks[r].stats.head_area;
    }
    const Struct& row = rows.values(n).struct_value();
    EXPECT_EQ(Pair(row, "fwd_recv_bytes")[1], inter) << n;
    EXPECT_EQ(Num(row, "head_area"), area) << n;
  }
  EXPECT_EQ(Num(Obj(Obj(data, "traffic"), "rows"), "n"), 16);
  EXPECT_EQ(Obj(data, "traffic").fields().count("nodes"), 0u);
}

// A 512-rank plan at T = 1M: hsap (3 stages) and ring (511 stages, the most
// transfers a plan of this size has). The page stays under 4 MB.
TEST(PlanPageTest, FiveHundredTwelveRanksStaySmall) {
  const std::vector<int64_t> cu = Pack(1 << 20);
  for (plan::Strategy s : {plan::Strategy::kHsap, plan::Strategy::kRing}) {
    const Plan p = Compile(Spec(64, 8, s, cu));
    const auto start = std::chrono::steady_clock::now();
    const std::string html = PlanPageHtml(p, {.origin = "test"});
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    std::printf("512 ranks, T = 1M, %s: page %zu bytes, generated in %.0f ms\n",
                std::string(plan::StrategyName(s)).c_str(), html.size(), ms);
    ::testing::Test::RecordProperty(absl::StrCat("page_bytes_", plan::StrategyName(s)),
                                    static_cast<int>(html.size()));
    EXPECT_LT(html.size(), 4u << 20) << plan::StrategyName(s);
    ExpectDataMatchesPlan(p, html);
    ExpectSelfContained(html);
  }
}

TEST(PlansHttpTest, IndexPagesAndErrors) {
  plan::PlanCache cache;
  bool hit = false;
  auto a = cache.GetOrCompile(Spec(2, 2, plan::Strategy::kSap, {0, 1000, 2048}), &hit);
  ASSERT_TRUE(a.ok()) << a.status();
  auto again = cache.GetOrCompile(Spec(2, 2, plan::Strategy::kSap, {0, 1000, 2048}), &hit);
  ASSERT_TRUE(again.ok() && hit);
  auto b = cache.GetOrCompile(Spec(1, 4, plan::Strategy::kAuto, {0, 300, 4096}));
  ASSERT_TRUE(b.ok()) << b.status();
  const std::string ka = (*a)->key.ToHex(), kb = (*b)->key.ToHex();

  HttpAnswer index = ServePlansPath(cache, "/plans", "node 0");
  EXPECT_EQ(index.status, 200);
  EXPECT_EQ(index.content_type, "text/html; charset=utf-8");
  EXPECT_TRUE(absl::StrContains(index.body, absl::StrCat("<a href=\"plans/", ka, "\">")));
  EXPECT_TRUE(absl::StrContains(index.body, absl::StrCat("<a href=\"plans/", kb, "\">")));
  EXPECT_TRUE(absl::StrContains(index.body, "2 &times; 2"));
  EXPECT_TRUE(absl::StrContains(ElementText(index.body, "cache-stats"), "2 plans"));
  // Most recently used first.
  EXPECT_LT(index.body.find(kb), index.body.find(ka));
  ExpectSelfContained(index.body);
  HttpAnswer slash = ServePlansPath(cache, "/plans/", "node 0");
  EXPECT_TRUE(absl::StrContains(slash.body, absl::StrCat("<a href=\"", ka, "\">")));

  HttpAnswer page = ServePlansPath(cache, absl::StrCat("/plans/", ka), "node 0");
  EXPECT_EQ(page.status, 200);
  EXPECT_EQ(Num(DataBlock(page.body), "cache_hits"), 1);
  EXPECT_TRUE(absl::StrContains(page.body, "href=\"../plans\""));
  ExpectDataMatchesPlan(**a, page.body);
  // The page views the cache without counting as a hit.
  EXPECT_EQ(cache.Stats().hits, 1);

  EXPECT_EQ(ServePlansPath(cache, "/plans/0123", "").status, 400);
  EXPECT_EQ(ServePlansPath(cache, "/plans/0123456789abcdef0123456789abcdef", "").status, 404);
  EXPECT_EQ(ServePlansPath(cache, "/plansx", "").status, 404);
  EXPECT_EQ(ServePlansPath(cache, absl::StrCat("/plans/", ka, "/x"), "").status, 400);
}

TEST(PageTextTest, Formats) {
  EXPECT_EQ(FormatBytes(0), "0 B");
  EXPECT_EQ(FormatBytes(1536), "1.50 KiB");
  EXPECT_EQ(FormatBytes(298332672), "285 MiB");
  EXPECT_EQ(FormatUs(850), "850 us");
  EXPECT_EQ(FormatUs(27347.4), "27.3 ms");
  EXPECT_EQ(FormatUs(1.25e6), "1.25 s");
  EXPECT_EQ(FormatCount(1048576), "1,048,576");
  EXPECT_EQ(FormatCount(999), "999");
  EXPECT_EQ(FormatCount(-1000), "-1,000");
  EXPECT_EQ(FormatShort(7644499362.0), "7.64 G");
  JsonWriter j;
  j.BeginObject().Key("a").Double(0.1).Key("b").BeginArray().Int(1).Null().EndArray();
  j.Key("c").String("</script>\n").EndObject();
  EXPECT_EQ(j.Take(), "{\"a\":0.1,\"b\":[1,null],\"c\":\"\\u003c/script\\u003e\\n\"}");
}

}  // namespace
}  // namespace hsap::viewer
