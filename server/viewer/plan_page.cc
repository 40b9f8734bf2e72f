#include "server/viewer/plan_page.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/dtype.h"
#include "server/viewer/page_model.h"
#include "server/viewer/page_text.h"

namespace hsap::viewer {
namespace {

using internal::PageModel;

// Nothing may be fetched: no scripts, styles, images, fonts or connections
// from anywhere, the page's own inline ones excepted.
constexpr char kContentSecurityPolicy[] =
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "img-src data:; base-uri 'none'; form-action 'none'";

constexpr char kStyle[] = R"CSS(
body{font:13px/1.45 "DejaVu Sans",system-ui,sans-serif;margin:16px 24px 40px;color:#1d1f23;background:#fff;max-width:1340px}
h1{font-size:19px;margin:0 0 2px}h1 code{font-size:17px}
h2{font-size:15px;margin:22px 0 4px;padding-bottom:2px;border-bottom:1px solid #d0d4da}
p.sub{margin:0 0 10px;color:#444}p.note{margin:2px 0 6px;color:#555;font-size:12px}
.cols{display:flex;gap:28px;flex-wrap:wrap;align-items:flex-start}
table.kv th{text-align:left;font-weight:600;padding:1px 12px 1px 0;color:#333;vertical-align:top;white-space:nowrap}
table.kv td{padding:1px 0;max-width:470px;overflow-wrap:anywhere}
table.list{border-collapse:collapse}table.list th,table.list td{padding:3px 10px;border-bottom:1px solid #e3e6ea;text-align:right}
table.list th{background:#f3f4f6}table.list td.l,table.list th.l{text-align:left}
table.cand td{padding:1px 8px 1px 0}table.cand tr.chosen td{font-weight:700}
.bar{display:inline-block;height:10px;background:#8aa4c8;vertical-align:middle}
tr.chosen .bar{background:#2f6db5}
svg.fig{display:block;max-width:100%;height:auto;margin:4px 0}
svg text{font:11px "DejaVu Sans",sans-serif;fill:#222}svg text.t{font-weight:600;font-size:12px}
svg text.small{font-size:10px;fill:#333}svg text.mean{fill:#c0392b}
svg text.mean,svg text.halo{paint-order:stroke;stroke:#fff;stroke-width:3px;stroke-linejoin:round}
.sw{display:inline-block;width:11px;height:11px;vertical-align:-1px;margin:0 3px 0 10px;border:1px solid #0003}
.tip{position:fixed;pointer-events:none;background:#1d1f23;color:#fff;padding:5px 8px;border-radius:4px;font-size:12px;white-space:pre;z-index:9;max-width:520px}
#errors{color:#a00;background:#fee;border:1px solid #d99;padding:6px;white-space:pre-wrap}
#errors:empty{display:none}
footer{margin-top:24px;color:#777;font-size:11px}
code{font-family:"DejaVu Sans Mono",monospace}
)CSS";

void AppendDocumentStart(const std::string& title, std::string* out) {
  absl::StrAppend(out, "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n",
                  "<meta http-equiv=\"Content-Security-Policy\" content=\"",
                  kContentSecurityPolicy, "\">\n",
                  "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n",
                  "<title>", EscapeHtml(title), "</title>\n<style>", kStyle, "</style>\n",
                  "</head>\n<body>\n<pre id=\"errors\" hidden></pre>\n<script>",
                  internal::kErrorScript, "</script>\n");
}

std::string StrategyWord(plan::Strategy s) { return std::string(plan::StrategyName(s)); }

std::string Swatch(absl::string_view colour, absl::string_view label) {
  return absl::StrCat("<span class=\"sw\" style=\"background:", colour, "\"></span>",
                      EscapeHtml(label));
}

std::string ProfileText(const PageModel& m) {
  const std::string& name = m.plan->spec.profile;
  if (!m.profile_ok) return absl::StrCat(EscapeHtml(name), " (unknown to this build)");
  const plan::HardwareProfile& p = m.profile;
  std::string figures = absl::StrFormat(
      "per rank: intra-node %s/s, inter-node %s/s, %s FLOP/s attention", FormatBytes(p.intra_bytes_per_s),
      FormatBytes(p.inter_bytes_per_s), FormatShort(p.attention_flops));
  if (p.inter_link_ranks > 1) {
    absl::StrAppendFormat(&figures, "; %.0f ranks share an inter-node link", p.inter_link_ranks);
  }
  return absl::StrCat("<code>", EscapeHtml(name), "</code><br>", EscapeHtml(figures));
}

void Kv(std::string* out, absl::string_view key, const std::string& html,
        absl::string_view id = "") {
  absl::StrAppend(out, "<tr><th>", EscapeHtml(key), "</th><td",
                  id.empty() ? "" : absl::StrCat(" id=\"", id, "\""), ">", html, "</td></tr>\n");
}

void AppendHeader(const PageModel& m, std::string* out) {
  const plan::Plan& p = *m.plan;
  const plan::PlanSpec& spec = p.spec;
  const plan::PlanStats& st = p.stats;
  const plan::Topology& topo = spec.topology;
  absl::StrAppend(out, "<header>\n<h1>Plan <code id=\"plan-key\">", p.key.ToHex(), "</code></h1>\n");
  absl::StrAppendFormat(
      out, "<p class=\"sub\">%s%s &middot; %s &middot; %d &times; %d ranks &middot; T = %s &middot; modeled %s</p>\n",
      StrategyWord(p.strategy),
      spec.strategy != p.strategy ? absl::StrCat(" (requested ", StrategyWord(spec.strategy), ")")
                                  : "",
      plan::AssignmentName(spec.assignment), topo.num_nodes, topo.devices_per_node,
      FormatCount(spec.total_tokens), FormatUs(st.modeled_us));
  if (!m.info.index_link.empty()) {
    absl::StrAppend(out, "<p class=\"note\"><a href=\"", EscapeHtml(m.info.index_link),
                    "\">&larr; all cached plans</a></p>\n");
  }
  out->append("<div class=\"cols\">\n<table class=\"kv\">\n");
  Kv(out, "plan key", absl::StrCat("<code>", p.key.ToHex(), "</code>"));
  Kv(out, "strategy",
     absl::StrCat(StrategyWord(p.strategy), " (requested ", StrategyWord(spec.strategy),
                  "; head group ", p.head_group_size, ")"),
     "h-strategy");
  Kv(out, "assignment", std::string(plan::AssignmentName(spec.assignment)));
  Kv(out, "profile", ProfileText(m), "h-profile");
  Kv(out, "topology",
     absl::StrFormat("%d nodes &times; %d ranks = %d ranks", topo.num_nodes, topo.devices_per_node,
                     topo.num_ranks()),
     "h-topology");
  const std::string mask =
      spec.cu_seqlens.empty()
          ? absl::StrCat(spec.slices.size(), " mask slices")
          : absl::StrCat(FormatCount(static_cast<int64_t>(m.documents.size())), " documents, ",
                         spec.causal ? "causal" : "bidirectional",
                         spec.window >= 0 ? absl::StrCat(", window ", spec.window) : "");
  Kv(out, "tokens T", absl::StrCat(FormatCount(spec.total_tokens), " (", mask, ")"), "h-tokens");
  Kv(out, "heads",
     absl::StrFormat("Hq %d, Hkv %d, D %d, %s", spec.shape.num_heads_q, spec.shape.num_heads_kv,
                     spec.shape.head_dim, DTypeName(spec.shape.dtype)),
     "h-heads");
  Kv(out, "stages",
     absl::StrFormat("forward %d, backward %d; receive buffer %s per stage", st.num_fwd_stages,
                     st.num_bwd_stages, FormatBytes(static_cast<double>(spec.recv_buffer_bytes))));
  Kv(out, "compile time", FormatUs(static_cast<double>(st.compile_us)), "h-compile");
  Kv(out, "cache hits", m.info.cache_hits >= 0 ? FormatCount(m.info.cache_hits) : "- (not cached)",
     "h-hits");
  Kv(out, "source", EscapeHtml(m.info.origin));
  out->append("</table>\n<table class=\"kv\">\n");
  Kv(out, "modeled time",
     absl::StrCat(FormatUs(st.modeled_us), " (forward ", FormatUs(st.fwd_us), " + backward ",
                  FormatUs(st.bwd_us), ")"),
     "h-modeled");
  Kv(out, "lower bound",
     absl::StrCat(FormatUs(st.lower_bound_us),
                  " (busiest rank: compute or bytes over its links, forward + backward)"));
  Kv(out, "imbalance",
     absl::StrFormat("%.4f (busiest / mean head area; mask area %s)", st.imbalance,
                     FormatShort(static_cast<double>(st.total_area))),
     "h-imbalance");
  int64_t fwd[2] = {0, 0}, bwd[2] = {0, 0};
  for (const TierSplit& t : m.tiers) {
    for (int i = 0; i < 2; ++i) {
      fwd[i] += t.fwd[i];
      bwd[i] += t.bwd[i];
    }
  }
  Kv(out, "bytes forward",
     absl::StrCat(FormatBytes(fwd[0] + fwd[1]), ": intra-node ", FormatBytes(fwd[0]),
                  ", inter-node ", FormatBytes(fwd[1]), "; busiest rank ",
                  FormatBytes(static_cast<double>(st.max_fwd_recv_bytes))));
  Kv(out, "bytes backward",
     absl::StrCat(FormatBytes(bwd[0] + bwd[1]), ": intra-node ", FormatBytes(bwd[0]),
                  ", inter-node ", FormatBytes(bwd[1])));
  if (topo.num_nodes > 1) {
    const int64_t busiest = *std::max_element(m.floors.node_inter_need_bytes.begin(),
                                              m.floors.node_inter_need_bytes.end());
    Kv(out, "inter-node need",
       absl::StrCat("busiest node ", FormatBytes(static_cast<double>(busiest)), " of K/V from other nodes",
                    m.profile_ok ? absl::StrCat(": at least ", FormatUs(m.floors.inter_need_us),
                                                " per pass over its links")
                                 : ""));
  }
  Kv(out, "compute floor",
     absl::StrCat("forward ", FormatUs(m.floors.fwd_compute_us), ", backward ",
                  FormatUs(m.floors.bwd_compute_us), " (busiest rank)"));
  out->append("</table>\n");
  // Candidates (auto): every strategy's modeled time, or for those auto
  // skipped, the lower bound that let it skip them.
  out->append("<div><table class=\"cand\" id=\"candidates\">\n");
  if (st.candidates.empty()) {
    absl::StrAppend(out, "<tr><td>strategy ", StrategyWord(spec.strategy),
                    " requested: no candidates</td></tr>\n");
  } else {
    double worst = 0;
    for (const plan::StrategyCost& c : st.candidates) worst = std::max(worst, c.modeled_us);
    out->append("<tr><th class=\"l\">candidate</th><th>modeled</th><th></th></tr>\n");
    for (const plan::StrategyCost& c : st.candidates) {
      const bool chosen = c.strategy == p.strategy;
      absl::StrAppendFormat(
          out,
          "<tr%s><td>%s%s</td><td>%s</td><td><span class=\"bar\" style=\"width:%.0fpx\"></span></td></tr>\n",
          chosen ? " class=\"chosen\"" : "", StrategyWord(c.strategy), chosen ? " (chosen)" : "",
          FormatUs(c.modeled_us), worst > 0 ? std::max(1.0, 220 * c.modeled_us / worst) : 1.0);
    }
    out->append(
        "<tr><td colspan=\"3\" class=\"note\">auto's candidates: the modeled time, or for one it "
        "did not build, the lower bound that ruled it out</td></tr>\n");
  }
  out->append("</table></div>\n</div>\n</header>\n");
}

void AppendArray(JsonWriter* j, const std::array<int64_t, plan::kNumTiers>& a) {
  j->BeginArray();
  for (int64_t v : a) j->Int(v);
  j->EndArray();
}

// The data block: the figures' numbers, for tests and tooltips.
//   top level: version, plan_key, strategy, requested_strategy, assignment,
//     profile, nodes, devices_per_node, ranks, total_tokens, documents,
//     causal, window, heads_q, heads_kv, head_dim, dtype, head_group_size,
//     recv_buffer_bytes, compile_us, cache_hits (null: not cached), origin
//   stats: PlanStats' fields, and total_fwd_bytes_by_tier [intra, inter]
//   candidates: [{strategy, modeled_us}]
//   floors: fwd_compute_us, bwd_compute_us, inter_need_us,
//     node_inter_need_bytes [per node], plan_lower_bound_us
//   per_rank: [{rank, node, tokens, area, head_area, fwd_recv_bytes,
//     bwd_recv_bytes ([intra, inter], from the transfers), fwd_send_bytes,
//     bwd_send_bytes (RankStats), lower_bound_recv_bytes, exact_need_bytes,
//     peak_recv_buffer_bytes, fwd_compute_us, bwd_compute_us, fwd_us, bwd_us}]
//   row_level ("rank", "node", "node_run"), rows: [{label, first_rank,
//     last_rank, first_node, last_node, tokens, head_area, fwd_recv_bytes,
//     bwd_recv_bytes, lower_bound_recv_bytes, fwd_us, bwd_us}]
//   docs: [begin0, end0, begin1, end1, ...]; owners: [begin, end, rank, ...]
//   traffic: rows (and nodes): {n, labels, inter (0/1), fwd, bwd} dense n x n
//   timeline: fwd, bwd: {num_stages, stages_per_bin, stage_us (slowest rank
//     per stage), bin_start_us, bin_us, cells [row][bin] = [transfer,
//     overlap, compute, return, inter-node share, compute during the
//     returns]}; or timeline_error
void AppendData(const PageModel& m, std::string* out) {
  const plan::Plan& p = *m.plan;
  const plan::PlanSpec& spec = p.spec;
  const plan::PlanStats& st = p.stats;
  JsonWriter j;
  j.BeginObject();
  j.Key("version").Int(1);
  j.Key("plan_key").String(p.key.ToHex());
  j.Key("strategy").String(plan::StrategyName(p.strategy));
  j.Key("requested_strategy").String(plan::StrategyName(spec.strategy));
  j.Key("assignment").String(plan::AssignmentName(spec.assignment));
  j.Key("profile").String(spec.profile);
  j.Key("nodes").Int(spec.topology.num_nodes);
  j.Key("devices_per_node").Int(spec.topology.devices_per_node);
  j.Key("ranks").Int(spec.topology.num_ranks());
  j.Key("total_tokens").Int(spec.total_tokens);
  j.Key("documents").Int(static_cast<int64_t>(m.documents.size()));
  j.Key("causal").Bool(spec.causal);
  j.Key("window").Int(spec.window);
  j.Key("heads_q").Int(spec.shape.num_heads_q);
  j.Key("heads_kv").Int(spec.shape.num_heads_kv);
  j.Key("head_dim").Int(spec.shape.head_dim);
  j.Key("dtype").String(DTypeName(spec.shape.dtype));
  j.Key("head_group_size").Int(p.head_group_size);
  j.Key("recv_buffer_bytes").Int(spec.recv_buffer_bytes);
  j.Key("compile_us").Int(st.compile_us);
  j.Key("cache_hits");
  if (m.info.cache_hits >= 0) {
    j.Int(m.info.cache_hits);
  } else {
    j.Null();
  }
  j.Key("origin").String(m.info.origin);

  j.Key("stats").BeginObject();
  j.Key("total_area").Int(st.total_area);
  j.Key("imbalance").Double(st.imbalance);
  j.Key("max_fwd_recv_bytes").Int(st.max_fwd_recv_bytes);
  j.Key("total_fwd_bytes").Int(st.total_fwd_bytes);
  j.Key("total_bwd_bytes").Int(st.total_bwd_bytes);
  j.Key("total_fwd_bytes_by_tier");
  AppendArray(&j, st.total_fwd_bytes_by_tier);
  j.Key("fwd_us").Double(st.fwd_us);
  j.Key("bwd_us").Double(st.bwd_us);
  j.Key("modeled_us").Double(st.modeled_us);
  j.Key("lower_bound_us").Double(st.lower_bound_us);
  j.Key("num_fwd_stages").Int(st.num_fwd_stages);
  j.Key("num_bwd_stages").Int(st.num_bwd_stages);
  j.EndObject();

  j.Key("candidates").BeginArray();
  for (const plan::StrategyCost& c : st.candidates) {
    j.BeginObject();
    j.Key("strategy").String(plan::StrategyName(c.strategy));
    j.Key("modeled_us").Double(c.modeled_us);
    j.EndObject();
  }
  j.EndArray();

  j.Key("floors").BeginObject();
  j.Key("fwd_compute_us").Double(m.floors.fwd_compute_us);
  j.Key("bwd_compute_us").Double(m.floors.bwd_compute_us);
  j.Key("inter_need_us").Double(m.floors.inter_need_us);
  j.Key("node_inter_need_bytes").BeginArray();
  for (int64_t b : m.floors.node_inter_need_bytes) j.Int(b);
  j.EndArray();
  j.Key("plan_lower_bound_us").Double(m.floors.plan_lower_bound_us);
  j.EndObject();

  j.Key("per_rank").BeginArray();
  for (size_t r = 0; r < p.ranks.size(); ++r) {
    const plan::RankPlan& rp = p.ranks[r];
    const plan::RankStats& s = rp.stats;
    j.BeginObject();
    j.Key("rank").Int(rp.rank);
    j.Key("node").Int(rp.node);
    j.Key("tokens").Int(s.tokens);
    j.Key("area").Int(s.area);
    j.Key("head_area").Int(s.head_area);
    j.Key("fwd_recv_bytes");
    AppendArray(&j, m.tiers[r].fwd);
    j.Key("bwd_recv_bytes");
    AppendArray(&j, m.tiers[r].bwd);
    j.Key("fwd_send_bytes");
    AppendArray(&j, s.fwd_send_bytes);
    j.Key("bwd_send_bytes");
    AppendArray(&j, s.bwd_send_bytes);
    j.Key("lower_bound_recv_bytes").Int(s.lower_bound_recv_bytes);
    j.Key("exact_need_bytes").Int(s.exact_need_bytes);
    j.Key("peak_recv_buffer_bytes").Int(s.peak_recv_buffer_bytes);
    j.Key("fwd_compute_us").Double(s.fwd_compute_us);
    j.Key("bwd_compute_us").Double(s.bwd_compute_us);
    j.Key("fwd_us").Double(s.fwd_us);
    j.Key("bwd_us").Double(s.bwd_us);
    j.EndObject();
  }
  j.EndArray();

  j.Key("row_level").String(m.rows.level == RowLevel::kRank   ? "rank"
                            : m.rows.level == RowLevel::kNode ? "node"
                                                              : "node_run");
  j.Key("rows").BeginArray();
  for (size_t i = 0; i < m.rows.rows.size(); ++i) {
    const Row& row = m.rows.rows[i];
    const internal::RowLoad& l = m.loads[i];
    j.BeginObject();
    j.Key("label").String(row.label);
    j.Key("first_rank").Int(row.first_rank);
    j.Key("last_rank").Int(row.last_rank);
    j.Key("first_node").Int(row.first_node);
    j.Key("last_node").Int(row.last_node);
    j.Key("tokens").Int(l.tokens);
    j.Key("head_area").Int(l.head_area);
    j.Key("fwd_recv_bytes");
    AppendArray(&j, l.fwd_recv);
    j.Key("bwd_recv_bytes");
    AppendArray(&j, l.bwd_recv);
    j.Key("lower_bound_recv_bytes").Int(l.lower_bound_recv_bytes);
    j.Key("fwd_us").Double(l.fwd_us);
    j.Key("bwd_us").Double(l.bwd_us);
    j.EndObject();
  }
  j.EndArray();

  j.Key("docs").BeginArray();
  for (const internal::Document& d : m.documents) j.Int(d.begin).Int(d.end);
  j.EndArray();
  j.Key("owners").BeginArray();
  for (const plan::OwnerSegment& s : m.owners) j.Int(s.begin).Int(s.end).Int(s.rank);
  j.EndArray();

  auto matrix = [&](const TrafficMatrix& t, bool nodes) {
    j.BeginObject();
    j.Key("n").Int(t.size);
    j.Key("labels").BeginArray();
    for (int32_t i = 0; i < t.size; ++i) {
      j.String(nodes ? absl::StrCat("node ", i) : m.rows.rows[i].label);
    }
    j.EndArray();
    j.Key("inter").BeginArray();
    for (int32_t a = 0; a < t.size; ++a) {
      for (int32_t b = 0; b < t.size; ++b) {
        bool inter = a != b;
        if (!nodes) {
          const Row &ra = m.rows.rows[a], &rb = m.rows.rows[b];
          inter = ra.first_node != rb.first_node || ra.first_node != ra.last_node;
        }
        j.Int(inter ? 1 : 0);
      }
    }
    j.EndArray();
    j.Key("fwd").BeginArray();
    for (int64_t v : t.fwd) j.Int(v);
    j.EndArray();
    j.Key("bwd").BeginArray();
    for (int64_t v : t.bwd) j.Int(v);
    j.EndArray();
    j.EndObject();
  };
  j.Key("traffic").BeginObject();
  j.Key("rows");
  matrix(m.traffic, false);
  if (m.has_node_traffic) {
    j.Key("nodes");
    matrix(m.node_traffic, true);
  }
  j.EndObject();

  if (!m.timeline_error.empty()) {
    j.Key("timeline_error").String(m.timeline_error);
  } else {
    j.Key("timeline").BeginObject();
    for (int dir = 0; dir < 2; ++dir) {
      const BinnedTimeline& b = dir == 0 ? m.fwd_bins : m.bwd_bins;
      const std::vector<double>& stage_us =
          dir == 0 ? m.timeline.fwd_stage_us : m.timeline.bwd_stage_us;
      j.Key(dir == 0 ? "fwd" : "bwd").BeginObject();
      j.Key("num_stages").Int(b.num_stages);
      j.Key("stages_per_bin").Int(b.stages_per_bin);
      j.Key("stage_us").BeginArray();
      for (double v : stage_us) j.Double(v);
      j.EndArray();
      j.Key("bin_start_us").BeginArray();
      for (double v : b.bin_start_us) j.Rounded(v, 7);
      j.EndArray();
      j.Key("bin_us").BeginArray();
      for (double v : b.bin_us) j.Rounded(v, 7);
      j.EndArray();
      j.Key("cells").BeginArray();
      for (const auto& row : b.cells) {
        j.BeginArray();
        for (const auto& c : row) {
          j.BeginArray();
          for (double v : c) j.Rounded(v, 5);
          j.EndArray();
        }
        j.EndArray();
      }
      j.EndArray();
      j.EndObject();
    }
    j.EndObject();
  }
  j.EndObject();
  absl::StrAppend(out, "<script type=\"application/json\" id=\"plan-data\">", j.Take(),
                  "</script>\n");
}

void AppendSections(const PageModel& m, std::string* out) {
  const plan::Plan& p = *m.plan;
  const plan::Topology& topo = p.spec.topology;
  const std::string per = m.rows.level == RowLevel::kRank ? "rank" : "node";
  const std::string aggregated =
      m.rows.level == RowLevel::kRank
          ? ""
          : absl::StrCat(" More than ", kMaxRows, " ranks: one row per ",
                         m.rows.level == RowLevel::kNode ? "node" : "run of nodes",
                         " (sums of its ranks; times: its slowest rank).");

  out->append("<section id=\"layout\">\n<h2>Layout</h2>\n");
  absl::StrAppend(out,
                  "<p class=\"note\">The packed sequence from token 0 to T. Documents in "
                  "alternating shades (runs of documents too short to see in one shade); "
                  "each token range in the colour of the rank holding it (a hue per node, "
                  "lighter for later ranks of the node), outlined in its node's colour. "
                  "Hover a document for its length and the ranks and nodes it spans.</p>\n");
  internal::AppendLayoutSvg(m, out);
  if (topo.num_nodes > 1 && topo.num_nodes <= 16) {
    out->append("<p class=\"note\">nodes:");
    for (int32_t n = 0; n < topo.num_nodes; ++n) {
      out->append(Swatch(NodeColour(n), absl::StrCat(n)));
    }
    out->append("</p>\n");
  }
  out->append("</section>\n");

  out->append("<section id=\"load\">\n<h2>Load per rank</h2>\n");
  absl::StrAppend(
      out, "<p class=\"note\">", Swatch("#3d8b3d", "compute"),
      Swatch("#4a90d9", "intra-node bytes"), Swatch("#e6711c", "inter-node bytes"),
      Swatch("#c0392b", "mean (dashed)"), Swatch("#111", "exact-need lower bound (tick)"),
      ". Received bytes count every transfer into the ", per,
      " (K/V, head all-to-alls, dK/dV returns); the tier of a byte is that of the link it "
      "crossed.", aggregated, "</p>\n");
  internal::AppendLoadSvg(m, out);
  out->append("</section>\n");

  out->append("<section id=\"traffic\">\n<h2>Traffic matrix</h2>\n");
  absl::StrAppend(out,
                  "<p class=\"note\">Bytes each row sends to each column, forward and "
                  "backward; log colour scale shared by a pair. Blue: within a node; orange: "
                  "across nodes; lines separate nodes.",
                  aggregated, "</p>\n");
  internal::AppendTrafficSvg(m, out);
  out->append("</section>\n");

  out->append("<section id=\"timeline\">\n<h2>Stage timeline</h2>\n");
  if (!m.timeline_error.empty()) {
    absl::StrAppend(out, "<p class=\"note\">No timeline: ", EscapeHtml(m.timeline_error),
                    "</p>\n");
  } else {
    absl::StrAppend(
        out, "<p class=\"note\">The cost model's time of each stage (a collective step: "
             "stage s starts when every rank finished s &minus; 1). Per row, the upper lane "
             "is the stage's transfers, the lower its compute: ",
        Swatch("#9fd39f", "compute overlapping the transfers"),
        Swatch("#3d8b3d", "compute after them"), Swatch("#4a90d9", "intra-node transfer"),
        Swatch("#e6711c", "inter-node transfer"), Swatch("#8e5ac8", "dK/dV returns"),
        ". Lines: the modeled total and its floors (busiest rank's compute; busiest node's "
        "inter-node exact need at its inter-node bandwidth).",
        m.fwd_bins.stages_per_bin > 1 || m.bwd_bins.stages_per_bin > 1
            ? absl::StrCat(" Many stages: each column merges ",
                           std::max(m.fwd_bins.stages_per_bin, m.bwd_bins.stages_per_bin),
                           " consecutive stages (their sums).")
            : "",
        aggregated, "</p>\n");
    absl::StrAppendFormat(out, "<p class=\"note\"><b>forward</b>: %d stages, modeled %s</p>\n",
                          p.stats.num_fwd_stages, FormatUs(p.stats.fwd_us));
    internal::AppendTimelineSvg(m, false, out);
    absl::StrAppendFormat(out, "<p class=\"note\"><b>backward</b>: %d stages, modeled %s</p>\n",
                          p.stats.num_bwd_stages, FormatUs(p.stats.bwd_us));
    internal::AppendTimelineSvg(m, true, out);
  }
  out->append("</section>\n");
}

}  // namespace

std::string PlanPageHtml(const plan::Plan& plan, const PageInfo& info) {
  const PageModel m = internal::BuildModel(plan, info);
  std::string out;
  out.reserve(256 << 10);
  AppendDocumentStart(absl::StrCat("HSAP plan ", plan.key.ToHex().substr(0, 8), " ",
                                   plan::StrategyName(plan.strategy), " ",
                                   plan.spec.topology.num_nodes, "x",
                                   plan.spec.topology.devices_per_node),
                      &out);
  AppendHeader(m, &out);
  AppendSections(m, &out);
  out.append("<div id=\"tip\" class=\"tip\" hidden></div>\n");
  out.append(
      "<footer>HSAP plan viewer &middot; no tensor data: document boundaries, the assignment "
      "and the plan's statistics only &middot; opened in <span id=\"load-ms\"></span> ms</footer>\n");
  AppendData(m, &out);
  absl::StrAppend(&out, "<script>", internal::kPageScript, "</script>\n</body>\n</html>\n");
  return out;
}

std::string PlanIndexHtml(const std::vector<IndexEntry>& entries,
                          const plan::PlanCacheStats& stats, const std::string& origin,
                          const std::string& link_prefix) {
  std::string out;
  AppendDocumentStart("HSAP plan cache", &out);
  absl::StrAppend(&out, "<h1>Plan cache</h1>\n<p class=\"sub\">", EscapeHtml(origin), "</p>\n");
  const int64_t lookups = stats.hits + stats.misses;
  absl::StrAppendFormat(
      &out,
      "<p id=\"cache-stats\">%d plans, %s of %s; %d hits, %d misses%s; %d evictions; %d "
      "compiles (%s in total, longest %s), %d refused</p>\n",
      stats.entries, FormatBytes(static_cast<double>(stats.bytes)),
      FormatBytes(static_cast<double>(stats.max_bytes)), stats.hits, stats.misses,
      lookups > 0 ? absl::StrFormat(" (hit ratio %.3f)", static_cast<double>(stats.hits) / lookups)
                  : "",
      stats.evictions, stats.compiles, FormatUs(static_cast<double>(stats.compile_us_total)),
      FormatUs(static_cast<double>(stats.compile_us_max)), stats.compile_errors);
  if (entries.empty()) {
    out.append("<p>No plans cached yet: a plan is compiled on its first call.</p>\n");
  } else {
    out.append(
        "<table class=\"list\" id=\"plans\">\n<tr><th class=\"l\">plan key</th><th "
        "class=\"l\">strategy</th><th class=\"l\">assignment</th><th>topology</th><th>tokens</"
        "th><th>documents</th><th>size</th><th>hits</th><th>compile</th><th>modeled</th></tr>\n");
    for (const IndexEntry& e : entries) {
      const plan::PlanCacheEntry& c = e.entry;
      const std::string key = c.key.ToHex();
      absl::StrAppendFormat(
          &out,
          "<tr><td class=\"l\"><a href=\"%s%s\"><code>%s</code></a></td><td class=\"l\">%s%s</td>"
          "<td class=\"l\">%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td>"
          "<td>%s</td><td>%s</td></tr>\n",
          EscapeHtml(link_prefix), key, key, plan::StrategyName(c.strategy),
          c.requested != c.strategy ? absl::StrCat(" (", plan::StrategyName(c.requested), ")") : "",
          plan::AssignmentName(c.assignment),
          e.num_nodes > 0 ? absl::StrFormat("%d &times; %d", e.num_nodes, e.devices_per_node)
                          : absl::StrCat(c.num_ranks, " ranks"),
          FormatCount(c.total_tokens), e.documents >= 0 ? FormatCount(e.documents) : "-",
          FormatBytes(static_cast<double>(c.bytes)), FormatCount(c.hits),
          FormatUs(static_cast<double>(c.compile_us)), FormatUs(c.modeled_us));
    }
    out.append("</table>\n");
  }
  out.append(
      "<footer>HSAP plan viewer &middot; most recently used first &middot; a plan's page shows "
      "no tensor data</footer>\n</body>\n</html>\n");
  return out;
}

}  // namespace hsap::viewer
