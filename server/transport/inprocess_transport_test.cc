// Tests of the in-process transport: matching by (tag, peer, order), byte
// counts by tier, size mismatches, deadlines, aborts; every test bounded in
// time.
#include "server/transport/inprocess_transport.h"

#include <cstring>
#include <numeric>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace hsap::transport {
namespace {

std::unique_ptr<InProcessFabric> MakeFabric(int32_t n, int32_t dpn) {
  auto f = InProcessFabric::Create(n, dpn);
  EXPECT_TRUE(f.ok()) << f.status();
  return std::move(*f);
}

// Runs fn(rank) on one thread per rank and joins them.
template <typename F>
void OnEveryRank(int32_t n, F fn) {
  std::vector<std::thread> threads;
  for (int32_t r = 0; r < n; ++r) threads.emplace_back(fn, r);
  for (auto& t : threads) t.join();
}

TEST(InProcessFabric, RejectsBadTopology) {
  EXPECT_EQ(InProcessFabric::Create(0, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(InProcessFabric::Create(6, 4).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(InProcessFabric, TierByNode) {
  auto f = MakeFabric(8, 4);
  EXPECT_EQ(f->endpoint(1)->TierOf(3), Tier::kIntraNode);
  EXPECT_EQ(f->endpoint(1)->TierOf(4), Tier::kInterNode);
  EXPECT_EQ(f->endpoint(5)->TierOf(5), Tier::kIntraNode);
}

// All-to-all among 4 ranks over 2 nodes, two messages per pair under one
// tag (k-th send matches k-th receive) plus a self message; exact contents
// and exact byte counts by tier.
TEST(InProcessFabric, AllToAllMatchesInOrderAndCountsBytes) {
  constexpr int32_t kRanks = 4;
  auto f = MakeFabric(kRanks, 2);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  // Message (src, dst, k) has 8 + src + 3 * dst + k int32 values, each
  // src * 10000 + dst * 100 + k * 10 + i % 10.
  auto size_of = [](int s, int d, int k) { return 8 + s + 3 * d + k; };
  auto value = [](int s, int d, int k, int i) { return s * 10000 + d * 100 + k * 10 + i % 10; };
  std::vector<absl::Status> results(kRanks);
  std::vector<std::vector<std::vector<int32_t>>> got(kRanks);
  OnEveryRank(kRanks, [&](int32_t r) {
    std::vector<std::vector<int32_t>> out;
    std::vector<SendOp> sends;
    std::vector<RecvOp> recvs;
    got[r].resize(kRanks * 2);
    out.reserve(kRanks * 2);
    for (int32_t p = 0; p < kRanks; ++p) {
      for (int k = 0; k < 2; ++k) {
        std::vector<int32_t> msg(size_of(r, p, k));
        for (size_t i = 0; i < msg.size(); ++i) msg[i] = value(r, p, k, i);
        out.push_back(std::move(msg));
        sends.push_back({p, out.back().data(), static_cast<int64_t>(out.back().size() * 4)});
        auto& in = got[r][p * 2 + k];
        in.assign(size_of(p, r, k), -1);
        recvs.push_back({p, in.data(), static_cast<int64_t>(in.size() * 4)});
      }
    }
    results[r] = f->endpoint(r)->Exchange(/*tag=*/7, sends, recvs, deadline);
  });
  for (int32_t r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(results[r].ok()) << results[r];
    TransferCounters c = f->endpoint(r)->counters();
    int64_t expect_sent[2] = {0, 0}, expect_recv[2] = {0, 0};
    for (int32_t p = 0; p < kRanks; ++p) {
      const int tier = (r / 2 == p / 2) ? 0 : 1;
      for (int k = 0; k < 2; ++k) {
        expect_sent[tier] += 4 * size_of(r, p, k);
        expect_recv[tier] += 4 * size_of(p, r, k);
        const auto& in = got[r][p * 2 + k];
        for (size_t i = 0; i < in.size(); ++i) {
          ASSERT_EQ(in[i], value(p, r, k, i)) << "rank " << r << " from " << p << " k " << k;
        }
      }
    }
    for (int t = 0; t < 2; ++t) {
      EXPECT_EQ(c.sent_bytes[t], expect_sent[t]) << "rank " << r << " tier " << t;
      EXPECT_EQ(c.received_bytes[t], expect_recv[t]) << "rank " << r << " tier " << t;
    }
  }
}

// Two tags in flight at once never mix, even when posted in opposite orders.
TEST(InProcessFabric, TagsKeepExchangesApart) {
  auto f = MakeFabric(2, 2);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  int a1 = 1, a2 = 2, b1 = 0, b2 = 0;
  // Rank 0 posts tag 1 then tag 2; rank 1 receives tag 2 first.
  auto p1 = f->endpoint(0)->Start(1, {{1, &a1, 4}}, {});
  auto p2 = f->endpoint(0)->Start(2, {{1, &a2, 4}}, {});
  ASSERT_TRUE(p1.ok() && p2.ok());
  ASSERT_TRUE(f->endpoint(1)->Exchange(2, {}, {{0, &b2, 4}}, deadline).ok());
  ASSERT_TRUE(f->endpoint(1)->Exchange(1, {}, {{0, &b1, 4}}, deadline).ok());
  EXPECT_TRUE((*p1)->Wait(deadline).ok());
  EXPECT_TRUE((*p2)->Wait(deadline).ok());
  EXPECT_EQ(b1, 1);
  EXPECT_EQ(b2, 2);
}

TEST(InProcessFabric, SizeMismatchIsInternalNamingBothSides) {
  auto f = MakeFabric(2, 1);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  std::vector<char> a(100), b(80);
  absl::Status s0, s1;
  OnEveryRank(2, [&](int32_t r) {
    if (r == 0) s0 = f->endpoint(0)->Exchange(3, {{1, a.data(), 100}}, {}, deadline);
    if (r == 1) s1 = f->endpoint(1)->Exchange(3, {}, {{0, b.data(), 80}}, deadline);
  });
  for (const absl::Status& s : {s0, s1}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
    EXPECT_NE(s.message().find("rank 0 sends 100 bytes to rank 1"), std::string::npos) << s;
    EXPECT_NE(s.message().find("expects 80 bytes"), std::string::npos) << s;
  }
  EXPECT_EQ(f->endpoint(0)->counters().sent_bytes[1], 0);
}

TEST(InProcessFabric, BadArgumentsAreInvalidArgument) {
  auto f = MakeFabric(2, 1);
  int x = 0;
  EXPECT_EQ(f->endpoint(0)->Start(1, {{2, &x, 4}}, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(f->endpoint(0)->Start(1, {}, {{1, &x, -4}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(f->endpoint(0)->Start(1, {{1, nullptr, 4}}, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(InProcessFabric, MissingPeerIsDeadlineExceededNamingIt) {
  auto f = MakeFabric(3, 1);
  int x = 5, y = 0;
  const absl::Time start = absl::Now();
  absl::Status s = f->endpoint(0)->Exchange(9, {{2, &x, 4}}, {{1, &y, 4}},
                                            start + absl::Milliseconds(200));
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("send to rank 2 (4 bytes)"), std::string::npos) << s;
  EXPECT_NE(s.message().find("receive from rank 1 (4 bytes)"), std::string::npos) << s;
  EXPECT_GE(took, absl::Milliseconds(190));
  EXPECT_LT(took, absl::Seconds(5));
  // The withdrawn send is gone: a late receiver does not get it (and does
  // not read the caller's buffer); it times out too.
  int z = -1;
  s = f->endpoint(2)->Exchange(9, {}, {{0, &z, 4}}, absl::Now() + absl::Milliseconds(50));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_EQ(z, -1);
}

TEST(InProcessFabric, AbortFailsPendingAndLaterExchanges) {
  auto f = MakeFabric(2, 1);
  int y = 0;
  const absl::Time start = absl::Now();
  std::thread aborter([&] {
    absl::SleepFor(absl::Milliseconds(50));
    f->endpoint(0)->Abort(absl::AbortedError("peer lost"));
  });
  absl::Status s = f->endpoint(0)->Exchange(1, {}, {{1, &y, 4}}, start + absl::Seconds(30));
  aborter.join();
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  EXPECT_EQ(s.message(), "peer lost");
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(f->endpoint(0)->Start(2, {}, {}).status().code(), absl::StatusCode::kAborted);
  // The other endpoint is unaffected.
  int self = 3, back = 0;
  EXPECT_TRUE(f->endpoint(1)
                  ->Exchange(4, {{1, &self, 4}}, {{1, &back, 4}}, absl::Now() + absl::Seconds(5))
                  .ok());
  EXPECT_EQ(back, 3);
}

TEST(InProcessFabric, AbortAllFailsEveryRankPromptly) {
  constexpr int32_t kRanks = 4;
  auto f = MakeFabric(kRanks, 2);
  std::vector<absl::Status> results(kRanks);
  const absl::Time start = absl::Now();
  std::thread aborter([&] {
    absl::SleepFor(absl::Milliseconds(50));
    f->AbortAll(absl::AbortedError("node 1 lost"));
  });
  OnEveryRank(kRanks, [&](int32_t r) {
    int y = 0;
    // Everyone waits on a rank that never sends (rank (r + 1) % 4 receives
    // instead of sending).
    results[r] = f->endpoint(r)->Exchange(1, {}, {{(r + 1) % kRanks, &y, 4}},
                                          start + absl::Seconds(30));
  });
  aborter.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  for (const absl::Status& s : results) EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
}

// Many threads, many small tagged exchanges in a ring: stresses matching and
// wake-ups; the result is checked exactly.
TEST(InProcessFabric, RingStress) {
  constexpr int32_t kRanks = 8;
  constexpr int kRounds = 300;
  auto f = MakeFabric(kRanks, 4);
  std::vector<int64_t> sums(kRanks, 0);
  std::vector<absl::Status> results(kRanks);
  OnEveryRank(kRanks, [&](int32_t r) {
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    int64_t value = r;
    for (int i = 0; i < kRounds && results[r].ok(); ++i) {
      int64_t in = 0;
      results[r] = f->endpoint(r)->Exchange(static_cast<uint64_t>(i),
                                            {{(r + 1) % kRanks, &value, 8}},
                                            {{(r + kRanks - 1) % kRanks, &in, 8}}, deadline);
      value = in;
      sums[r] += in;
    }
  });
  for (int32_t r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(results[r].ok()) << results[r];
    // Round i delivers the value of rank r - 1 - i (mod P).
    int64_t expect = 0;
    for (int i = 0; i < kRounds; ++i) expect += ((r - 1 - i) % kRanks + kRanks) % kRanks;
    EXPECT_EQ(sums[r], expect);
    EXPECT_EQ(f->endpoint(r)->counters().sent_bytes[0] + f->endpoint(r)->counters().sent_bytes[1],
              8 * kRounds);
  }
}

}  // namespace
}  // namespace hsap::transport
