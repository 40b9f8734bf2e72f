// Device slots compute at the same time (issue "Speed", server/exec/
// device_slots.h): a real hsapd with two CPU slots of one kernel thread each
// (--devices=cpu:2 --cpu_threads=1) runs two one-rank calls of different
// groups, from two sessions, concurrently. Each slot has its own kernel pool,
// so the pair takes about one call's time; with one pool for both (the old
// design) it took two. Asserted, from the median of three rounds:
//  * the concurrent pair's wall time is under 1.5x one call's alone;
//  * the daemon's CPU time over the pair is over 1.5x the pair's wall time
//    (two threads computing at once).
// Tagged exclusive: Bazel runs it alone, so the other tests' load does not
// take the second core. Skipped on a machine with fewer than two cores.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cpp/attention_buffers.h"
#include "client/cpp/hsap_client.h"
#include "gtest/gtest.h"
#include "tests/integration/test_daemon.h"

namespace hsap {
namespace {

using client::AttentionBuffers;

// utime + stime of `pid`, seconds.
double CpuSeconds(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = all.rfind(')');
  if (close == std::string::npos) return -1;
  std::vector<std::string> fields;
  std::string f;
  for (size_t i = close + 2; i <= all.size(); ++i) {
    if (i == all.size() || all[i] == ' ') {
      fields.push_back(f);
      f.clear();
    } else {
      f += all[i];
    }
  }
  // Fields after the command: state is [0], utime [11], stime [12].
  if (fields.size() < 13) return -1;
  return (std::stod(fields[11]) + std::stod(fields[12])) / sysconf(_SC_CLK_TCK);
}

struct Rank {
  std::unique_ptr<client::Client> client;
  std::unique_ptr<AttentionBuffers> buffers;
  std::string group;
  uint64_t seq = 0;
};

// One one-rank causal forward of the whole buffer; true when OK.
bool RunCall(Rank* r) {
  hsap::v1::CallId id;
  id.set_group(r->group);
  id.set_group_size(1);
  id.set_call_seq(++r->seq);
  const int64_t T = r->buffers->dims().tokens;
  auto resp = r->client->Forward(r->buffers->ForwardRequest(id, client::DocumentMask({0, T}, true), {}));
  EXPECT_TRUE(resp.ok()) << resp.status();
  return resp.ok();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

TEST(SlotsParallelTest, TwoSlotsComputeAtTheSameTime) {
  if (std::thread::hardware_concurrency() < 2) GTEST_SKIP() << "needs two cores";
  auto daemon = testing::DaemonProcess::Start(testing::Runfile("server/hsapd"),
                                              {"--devices=cpu:2", "--cpu_threads=1"});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  Rank ranks[2];
  for (int i = 0; i < 2; ++i) {
    auto c = client::Client::Connect((*daemon)->socket());
    ASSERT_TRUE(c.ok()) << c.status();
    ranks[i].client = std::move(c).value();
    ranks[i].group = absl::StrCat("slot-test-", i);
    // ~0.3-0.5 s per call on one core here.
    auto b = AttentionBuffers::Create(ranks[i].client.get(), {6144, 4, 1, 64, DType::kBFloat16},
                                      ranks[i].group);
    ASSERT_TRUE(b.ok()) << b.status();
    (*b)->FillInputs(11 + i);
    ranks[i].buffers = std::move(b).value();
    ASSERT_TRUE(RunCall(&ranks[i]));  // warm: plan compiled and cached
  }
  const pid_t pid = (*daemon)->pid();
  std::vector<double> alone, pair, cpu_ratio;
  for (int round = 0; round < 3; ++round) {
    absl::Time t0 = absl::Now();
    ASSERT_TRUE(RunCall(&ranks[0]));
    alone.push_back(absl::ToDoubleSeconds(absl::Now() - t0));

    const double cpu0 = CpuSeconds(pid);
    t0 = absl::Now();
    bool ok[2] = {false, false};
    std::thread other([&] { ok[1] = RunCall(&ranks[1]); });
    ok[0] = RunCall(&ranks[0]);
    other.join();
    const double wall = absl::ToDoubleSeconds(absl::Now() - t0);
    ASSERT_TRUE(ok[0] && ok[1]);
    pair.push_back(wall);
    cpu_ratio.push_back((CpuSeconds(pid) - cpu0) / wall);
  }
  const double a = Median(alone), p = Median(pair), c = Median(cpu_ratio);
  std::printf("one call alone %.3f s; two concurrent calls on two slots %.3f s (%.2fx); daemon "
              "CPU over the pair %.2fx its wall time (medians of 3)\n",
              a, p, p / a, c);
  EXPECT_LT(p, 1.5 * a) << "the two slots did not compute at the same time";
  EXPECT_GT(c, 1.5) << "fewer than two threads computed during the pair";
}

}  // namespace
}  // namespace hsap
