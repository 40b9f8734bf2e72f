// hsapctl against a live daemon, run as the real binary in a subprocess:
// `plans list` shows the plan that a real forward call compiled, with its
// hit count rising on the next identical call; `plans stats`, `plans evict
// --all`, `cluster` and the operator's `regions` over TCP with the token;
// a wrong token is UNAUTHENTICATED (exit 1).
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/cpp/attention_buffers.h"
#include "client/cpp/hsap_client.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "hsap/v1/cluster.pb.h"
#include "hsap/v1/plans.pb.h"
#include "hsap/v1/regions.pb.h"
#include "tests/integration/group_call.h"
#include "tests/integration/local_cluster.h"
#include "tests/integration/test_daemon.h"

namespace hsap {
namespace {

using ::testing::HasSubstr;

constexpr char kToken[] = "operator-token-0123456789abcdef";

struct CtlRun {
  int exit_code = -1;
  std::string out;  // stdout and stderr
};

CtlRun Hsapctl(const std::vector<std::string>& args) {
  const std::string command =
      absl::StrCat(testing::Runfile("client/hsapctl"), " ", absl::StrJoin(args, " "), " 2>&1");
  CtlRun run;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return run;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) run.out.append(buf, n);
  const int status = pclose(pipe);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

template <typename Message>
Message ParseJson(const CtlRun& run) {
  Message m;
  // Everything before the first '{' is a note on stderr (regions over Unix).
  const size_t brace = run.out.find('{');
  EXPECT_NE(brace, std::string::npos) << run.out;
  const auto st = google::protobuf::util::JsonStringToMessage(
      brace == std::string::npos ? "{}" : run.out.substr(brace), &m);
  EXPECT_TRUE(st.ok()) << st.ToString() << "\n" << run.out;
  return m;
}

class HsapctlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    DaemonOptions options;
    port_ = testing::FreePort();
    options.tcp_port = port_;
    options.tcp_token = kToken;
    daemon_ = testing::StartInProcessDaemon(options);
    token_file_ = daemon_->dir.path() + "/token";
    std::ofstream(token_file_) << kToken << "\n";
    chmod(token_file_.c_str(), 0600);
    auto c = client::Client::Connect(daemon_->socket());
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = std::move(c).value();
    auto b = client::AttentionBuffers::Create(client_.get(), {96, 4, 2, 32, DType::kFloat32}, "t");
    ASSERT_TRUE(b.ok()) << b.status();
    buffers_ = std::move(b).value();
    buffers_->FillInputs(5);
  }

  hsap::v1::CallStats Forward(uint64_t call_seq) {
    hsap::v1::CallId call;
    call.set_group("g");
    call.set_group_size(1);
    call.set_call_seq(call_seq);
    auto r = client_->Forward(
        buffers_->ForwardRequest(call, client::DocumentMask({0, 20, 50, 96}, true), {}));
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->stats() : hsap::v1::CallStats();
  }
  std::string Socket() const { return "--socket=" + daemon_->socket(); }
  std::string Target() const { return absl::StrCat("--target=127.0.0.1:", port_); }

  int port_ = 0;
  std::string token_file_;
  std::unique_ptr<testing::InProcessDaemon> daemon_;
  std::unique_ptr<client::Client> client_;
  std::unique_ptr<client::AttentionBuffers> buffers_;
};

const hsap::v1::PlanSummary* Find(const hsap::v1::ListPlansResponse& list, const std::string& key) {
  for (const auto& p : list.plans()) {
    if (p.plan_key() == key) return &p;
  }
  return nullptr;
}

TEST_F(HsapctlTest, PlansListShowsTheCompiledPlanAndItsHitsRise) {
  const hsap::v1::CallStats first = Forward(1);
  ASSERT_EQ(first.plan_key().size(), 32u);
  const CtlRun before = Hsapctl({"plans", "list", Socket(), "--format=json"});
  ASSERT_EQ(before.exit_code, 0) << before.out;
  const auto list1 = ParseJson<hsap::v1::ListPlansResponse>(before);
  const hsap::v1::PlanSummary* p1 = Find(list1, first.plan_key());
  ASSERT_NE(p1, nullptr) << before.out;
  EXPECT_EQ(p1->ranks(), 1);
  EXPECT_EQ(p1->total_tokens(), 96);
  const uint64_t hits_before = p1->hits();

  const hsap::v1::CallStats second = Forward(2);
  EXPECT_EQ(second.plan_key(), first.plan_key());
  EXPECT_TRUE(second.plan_cache_hit());
  const CtlRun after = Hsapctl({"plans", "list", Socket(), "--format=json"});
  ASSERT_EQ(after.exit_code, 0) << after.out;
  // Named: p2 points into it (a temporary here was a use-after-free, ASan).
  const hsap::v1::ListPlansResponse after_list = ParseJson<hsap::v1::ListPlansResponse>(after);
  const hsap::v1::PlanSummary* p2 = Find(after_list, first.plan_key());
  ASSERT_NE(p2, nullptr) << after.out;
  EXPECT_EQ(p2->hits(), hits_before + 1);

  // The table names the same plan; show and stats agree.
  const CtlRun table = Hsapctl({"plans", "list", Socket()});
  ASSERT_EQ(table.exit_code, 0) << table.out;
  EXPECT_THAT(table.out, HasSubstr("PLAN_KEY"));
  EXPECT_THAT(table.out, HasSubstr(first.plan_key()));
  const CtlRun show = Hsapctl({"plans", "show", first.plan_key(), Socket(), "--format=json"});
  ASSERT_EQ(show.exit_code, 0) << show.out;
  const auto shown = ParseJson<hsap::v1::ShowPlanResponse>(show);
  EXPECT_EQ(shown.summary().plan_key(), first.plan_key());
  EXPECT_EQ(shown.plan().ranks_size(), 1);
  const CtlRun stats = Hsapctl({"plans", "stats", Socket(), "--format=json"});
  ASSERT_EQ(stats.exit_code, 0) << stats.out;
  EXPECT_GE(ParseJson<hsap::v1::GetPlanCacheStatsResponse>(stats).stats().hits(), 1u);

  // Evict over TCP with the token; the list is then empty.
  const CtlRun evict = Hsapctl({"plans", "evict", "--all", Target(), "--token_file=" + token_file_});
  ASSERT_EQ(evict.exit_code, 0) << evict.out;
  EXPECT_THAT(evict.out, HasSubstr("evicted"));
  const CtlRun empty = Hsapctl({"plans", "list", Socket(), "--format=json"});
  EXPECT_EQ(ParseJson<hsap::v1::ListPlansResponse>(empty).plans_size(), 0) << empty.out;
  const CtlRun missing = Hsapctl({"plans", "show", first.plan_key(), Socket()});
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_THAT(missing.out, HasSubstr("NOT_FOUND"));
}

TEST_F(HsapctlTest, OperatorRegionsOverTcpSeeEverySession) {
  const CtlRun all = Hsapctl({"regions", Target(), "--token_file=" + token_file_, "--format=json"});
  ASSERT_EQ(all.exit_code, 0) << all.out;
  const auto regions = ParseJson<hsap::v1::ListRegionsResponse>(all);
  ASSERT_GE(regions.regions_size(), 1) << all.out;
  EXPECT_EQ(regions.regions(0).session_id(), client_->session_id());
  // Over the Unix socket hsapctl is its own session: it sees none.
  const CtlRun own = Hsapctl({"regions", Socket(), "--format=json"});
  ASSERT_EQ(own.exit_code, 0) << own.out;
  EXPECT_EQ(ParseJson<hsap::v1::ListRegionsResponse>(own).regions_size(), 0);
  EXPECT_THAT(own.out, HasSubstr("only its own regions"));
  const CtlRun table = Hsapctl({"regions", Target(), "--token_file=" + token_file_});
  EXPECT_THAT(table.out, HasSubstr("REGION"));
  EXPECT_THAT(table.out, HasSubstr("memfd"));
}

TEST_F(HsapctlTest, ClusterAndAuthenticationErrors) {
  const CtlRun cluster = Hsapctl({"cluster", Socket(), "--format=json"});
  ASSERT_EQ(cluster.exit_code, 0) << cluster.out;
  EXPECT_TRUE(ParseJson<hsap::v1::GetClusterStatusResponse>(cluster).formed());
  const CtlRun table = Hsapctl({"cluster", Target(), "--token_file=" + token_file_});
  ASSERT_EQ(table.exit_code, 0) << table.out;
  EXPECT_THAT(table.out, HasSubstr("formed"));

  const CtlRun no_token = Hsapctl({"plans", "stats", Target()});
  EXPECT_EQ(no_token.exit_code, 1);
  EXPECT_THAT(no_token.out, HasSubstr("UNAUTHENTICATED"));
  const std::string wrong = daemon_->dir.path() + "/wrong";
  std::ofstream(wrong) << "not-the-token-0123456789abcdef\n";
  chmod(wrong.c_str(), 0600);
  const CtlRun bad = Hsapctl({"cluster", Target(), "--token_file=" + wrong});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_THAT(bad.out, HasSubstr("does not match"));
  chmod(wrong.c_str(), 0644);
  const CtlRun readable = Hsapctl({"cluster", Target(), "--token_file=" + wrong});
  EXPECT_EQ(readable.exit_code, 1);
  EXPECT_THAT(readable.out, HasSubstr("chmod 600"));
  const CtlRun usage = Hsapctl({"plans", "frobnicate", Socket()});
  EXPECT_EQ(usage.exit_code, 2);
  const CtlRun format = Hsapctl({"plans", "list", Socket(), "--format=yaml"});
  EXPECT_EQ(format.exit_code, 2);
}

// `hsapctl cluster` on node 0 of two daemons while two run-time groups of
// them are live: the groups table (name, uid, state, members, ranks per
// node, calls) and the peers table (address, incarnation, state, refs).
TEST(HsapctlClusterTest, ShowsLiveGroupsAndPeers) {
  auto cluster = testing::LocalCluster::StartWithoutPeers(
      2, 2, {"--cpu_threads=1", "--ucx_transports=tcp", "--peer_linger_ms=300"});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const testing::GlobalProblem p =
      testing::MakeProblem({0, 5, 90, 150}, true, 7, /*with_reference=*/false);
  auto declared = [&](const std::string& name, int32_t rpn) {
    testing::GroupSpec spec;
    spec.group = name;
    spec.nodes = 2;
    spec.devices_per_node = rpn;
    spec.sockets = (*cluster)->sockets();
    spec.member_addresses = {(*cluster)->address(0), (*cluster)->address(1)};
    spec.strategy = hsap::v1::STRATEGY_SAP;
    spec.deadline_ms = 20000;
    return spec;
  };
  const std::string socket = "--socket=" + (*cluster)->sockets()[0];
  CtlRun table, json;
  testing::GroupSpec two = declared("job-two", 2);
  two.while_open = [&] {
    table = Hsapctl({"cluster", socket});
    json = Hsapctl({"cluster", socket, "--format=json"});
  };
  testing::GroupSpec one = declared("job-one", 1);
  one.while_open = [&] {  // job-one stays live while job-two runs
    auto r = testing::RunGroup(p, two);
    EXPECT_TRUE(r.ok()) << r.status();
  };
  auto r = testing::RunGroup(p, one);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(table.exit_code, 0) << table.out;
  std::printf("%s", table.out.c_str());
  const auto status = ParseJson<hsap::v1::GetClusterStatusResponse>(json);
  ASSERT_EQ(status.groups_size(), 2) << json.out;
  const std::string members =
      absl::StrCat((*cluster)->address(0), ",", (*cluster)->address(1));
  for (const auto& g : status.groups()) {
    const int32_t rpn = g.name() == "job-one" ? 1 : 2;
    EXPECT_EQ(g.ranks_per_node(), rpn) << g.name();
    EXPECT_EQ(g.calls(), 2u) << g.name();  // forward and backward
    EXPECT_EQ(g.state(), "UP") << g.name();
    EXPECT_NE(g.uid(), 0u) << g.name();
    // A row: GROUP UID STATE MEMBERS RANKS_PER_NODE CALLS PROFILES.
    EXPECT_THAT(table.out, ::testing::ContainsRegex(absl::StrCat(
                               g.name(), " +", g.uid(), " +UP +", members, " +", rpn, " +2 ")));
  }
  EXPECT_THAT(table.out, HasSubstr("GROUP"));
  EXPECT_THAT(table.out, HasSubstr("RANKS_PER_NODE"));
  // Node 1 as a peer: its address, incarnation, UP, referenced by both groups.
  const hsap::v1::NodeInfo* peer = nullptr;
  for (const auto& n : status.nodes()) {
    if (n.address() == (*cluster)->address(1)) peer = &n;
  }
  ASSERT_NE(peer, nullptr) << json.out;
  EXPECT_NE(peer->incarnation(), 0u);
  EXPECT_GE(peer->references(), 2u);
  EXPECT_THAT(table.out, ::testing::ContainsRegex(absl::StrCat(
                             (*cluster)->address(1), " +", peer->incarnation(), " +up +",
                             peer->references(), " ")));
}

}  // namespace
}  // namespace hsap
