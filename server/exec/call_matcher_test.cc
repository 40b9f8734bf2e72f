#include "server/exec/call_matcher.h"

#include <atomic>
#include <limits>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "absl/strings/str_cat.h"

namespace hsap {
namespace {

using ::testing::HasSubstr;

CallArrival Arrival(int32_t rank, uint64_t seq, const std::string& key = "k", int32_t size = 4) {
  CallArrival a;
  a.group = "g";
  a.group_size = size;
  a.rank = rank;
  a.call_seq = seq;
  for (int32_t r = 0; r < size; ++r) a.local_ranks.push_back(r);
  a.agreement_key = key;
  return a;
}

std::vector<absl::StatusOr<std::shared_ptr<const MatchedCall>>> RunRanks(
    CallMatcher& m, const std::vector<CallArrival>& arrivals, absl::Duration timeout) {
  std::vector<absl::StatusOr<std::shared_ptr<const MatchedCall>>> out(arrivals.size(),
                                                                       absl::UnknownError(""));
  std::vector<std::thread> threads;
  const absl::Time deadline = absl::Now() + timeout;
  for (size_t i = 0; i < arrivals.size(); ++i) {
    threads.emplace_back([&, i] { out[i] = m.Arrive(arrivals[i], deadline); });
  }
  for (auto& t : threads) t.join();
  return out;
}

struct Counted : GroupResources {
  explicit Counted(std::atomic<int>* n) { ++*n; }
};

TEST(CallMatcherTest, AllRanksMatchAndShareTheCall) {
  std::atomic<int> made{0};
  CallMatcher m([&](const CallArrival&) {
    return std::make_shared<Counted>(&made);
  });
  for (uint64_t seq = 1; seq <= 3; ++seq) {
    auto r = RunRanks(m, {Arrival(0, seq), Arrival(1, seq), Arrival(2, seq), Arrival(3, seq)},
                      absl::Seconds(10));
    for (auto& x : r) {
      ASSERT_TRUE(x.ok()) << x.status();
      EXPECT_EQ((*x).get(), (*r[0]).get());
      EXPECT_EQ((*x)->call_seq, seq);
    }
  }
  EXPECT_EQ(made.load(), 3);  // fresh resources for every call
}

TEST(CallMatcherTest, MissingRankFailsEveryoneWithDeadlineExceeded) {
  CallMatcher m;
  const absl::Time start = absl::Now();
  auto r = RunRanks(m, {Arrival(0, 1), Arrival(1, 1), Arrival(2, 1)}, absl::Milliseconds(200));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  for (auto& x : r) {
    EXPECT_EQ(x.status().code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_THAT(std::string(x.status().message()), HasSubstr("rank(s) 3 did not arrive"));
  }
  // The late rank gets the same failure at once; the next call works.
  auto late = m.Arrive(Arrival(3, 1), absl::Now() + absl::Seconds(10));
  EXPECT_EQ(late.status().code(), absl::StatusCode::kDeadlineExceeded);
  auto next = RunRanks(m, {Arrival(0, 2), Arrival(1, 2), Arrival(2, 2), Arrival(3, 2)},
                       absl::Seconds(10));
  for (auto& x : next) EXPECT_TRUE(x.ok()) << x.status();
}

TEST(CallMatcherTest, CancelledRankFailsEveryoneAtOnceWithCancelled) {
  CallMatcher m;
  std::atomic<bool> gave_up{false};
  CallArrival cancelling = Arrival(1, 1);
  cancelling.cancelled = [&gave_up] { return gave_up.load(); };
  std::thread canceller([&gave_up] {
    absl::SleepFor(absl::Milliseconds(150));
    gave_up = true;
  });
  const absl::Time start = absl::Now();
  // Rank 3 never comes; the deadline is far: only the cancellation ends it.
  auto r = RunRanks(m, {Arrival(0, 1), cancelling, Arrival(2, 1)}, absl::Seconds(30));
  canceller.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  for (auto& x : r) {
    EXPECT_EQ(x.status().code(), absl::StatusCode::kCancelled) << x.status();
    EXPECT_THAT(std::string(x.status().message()), HasSubstr("the client of rank 1 cancelled the call or went away"));
  }
  // The late rank sees the same failure; the next call works.
  EXPECT_EQ(m.Arrive(Arrival(3, 1), absl::Now() + absl::Seconds(10)).status().code(),
            absl::StatusCode::kCancelled);
  auto next = RunRanks(m, {Arrival(0, 2), Arrival(1, 2), Arrival(2, 2), Arrival(3, 2)},
                       absl::Seconds(10));
  for (auto& x : next) EXPECT_TRUE(x.ok()) << x.status();
}

TEST(CallMatcherTest, DisagreementIsInvalidArgumentForAll) {
  CallMatcher m;
  auto r = RunRanks(m, {Arrival(0, 1, "aaa"), Arrival(1, 1, "aaa"), Arrival(2, 1, "bbb"),
                        Arrival(3, 1, "aaa")},
                    absl::Seconds(10));
  for (auto& x : r) {
    EXPECT_EQ(x.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(x.status().message()), HasSubstr("disagree on call 1"));
  }
}

TEST(CallMatcherTest, MemberListDisagreementNamesBothLists) {
  CallMatcher m;
  std::vector<CallArrival> a = {Arrival(0, 1, "k", 2), Arrival(1, 1, "k", 2)};
  a[0].members = {"h:1", "h:2"};
  a[1].members = {"h:2", "h:1"};  // same nodes, another order: another group
  for (auto& x : RunRanks(m, a, absl::Seconds(10))) {
    EXPECT_EQ(x.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(x.status().message()), HasSubstr("disagree on call.nodes of call 1"));
    EXPECT_THAT(std::string(x.status().message()), HasSubstr("[h:1, h:2]"));
    EXPECT_THAT(std::string(x.status().message()), HasSubstr("[h:2, h:1]"));
  }
  // The same lists match.
  a[1].members = a[0].members;
  a[0].call_seq = a[1].call_seq = 2;
  for (auto& x : RunRanks(m, a, absl::Seconds(10))) EXPECT_TRUE(x.ok()) << x.status();
}

TEST(CallMatcherTest, ReplayAndSkipAreFailedPrecondition) {
  CallMatcher m;
  auto ok = RunRanks(m, {Arrival(0, 5, "k", 1)}, absl::Seconds(1));
  ASSERT_TRUE(ok[0].ok());
  auto replay = m.Arrive(Arrival(0, 5, "k", 1), absl::Now() + absl::Seconds(1));
  EXPECT_EQ(replay.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(replay.status().message()), HasSubstr("a replay"));
  auto skip = m.Arrive(Arrival(0, 9, "k", 1), absl::Now() + absl::Seconds(1));
  EXPECT_EQ(skip.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(skip.status().message()), HasSubstr("the next must be 6"));
  EXPECT_TRUE(m.Arrive(Arrival(0, 6, "k", 1), absl::Now() + absl::Seconds(1)).ok());
}

TEST(CallMatcherTest, GroupSizeMustNotChange) {
  CallMatcher m;
  ASSERT_TRUE(m.Arrive(Arrival(0, 1, "k", 1), absl::Now() + absl::Seconds(1)).ok());
  auto r = m.Arrive(Arrival(0, 2, "k", 2), absl::Now() + absl::Seconds(1));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("group 'g' has size 1"));
}

TEST(CallMatcherTest, AbortWakesWaitingRanks) {
  CallMatcher m;
  std::thread aborter([&] {
    absl::SleepFor(absl::Milliseconds(100));
    m.Abort(absl::UnavailableError("hsapd is draining"));
  });
  const absl::Time start = absl::Now();
  auto r = RunRanks(m, {Arrival(0, 1), Arrival(1, 1)}, absl::Seconds(30));
  aborter.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  for (auto& x : r) EXPECT_EQ(x.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(m.Arrive(Arrival(2, 1), absl::Now()).status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace hsap

namespace hsap {
namespace {

// Fast ranks run ahead into later calls (inserting into the group's table)
// while slow ranks still wait on earlier ones: references must stay valid.
TEST(CallMatcherTest, FastRanksRunAheadSafely) {
  CallMatcher m;
  constexpr int kRanks = 4, kCalls = 200;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      for (int seq = 1; seq <= kCalls; ++seq) {
        auto x = m.Arrive(Arrival(r, seq), absl::Now() + absl::Seconds(20));
        if (!x.ok() || (*x)->call_seq != static_cast<uint64_t>(seq)) ++failures;
        if (r == 3 && seq % 7 == 0) absl::SleepFor(absl::Microseconds(200));
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
}

}  // namespace
}  // namespace hsap

namespace hsap {
namespace {

CallArrival SessionArrival(uint64_t session, const std::string& group, int32_t rank, uint64_t seq,
                           int32_t size) {
  CallArrival a = Arrival(rank, seq, "k", size);
  a.group = group;
  a.session = session;
  return a;
}

TEST(CallMatcherGroupsTest, AGroupIsReleasedWhenItsSessionsClose) {
  CallMatcher m;
  ASSERT_TRUE(m.Arrive(SessionArrival(5, "X", 0, 1, 1), absl::Now() + absl::Seconds(1)).ok());
  // While session 5 lives, X keeps its size.
  auto two = m.Arrive(SessionArrival(6, "X", 0, 1, 2), absl::Now() + absl::Milliseconds(10));
  EXPECT_EQ(two.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(two.status().message()), HasSubstr("in use by 1 live session(s)"));
  EXPECT_EQ(m.num_groups(), 1);
  m.OnSessionClosed(5);
  EXPECT_EQ(m.num_groups(), 0);
  // A later 2-rank job may use the name.
  auto r = RunRanks(m, {SessionArrival(7, "X", 0, 1, 2), SessionArrival(8, "X", 1, 1, 2)},
                    absl::Seconds(10));
  for (auto& x : r) EXPECT_TRUE(x.ok()) << x.status();
  m.OnSessionClosed(7);
  EXPECT_EQ(m.num_groups(), 1);  // session 8 still has it
  m.OnSessionClosed(8);
  EXPECT_EQ(m.num_groups(), 0);
}

TEST(CallMatcherGroupsTest, AStrayRankIsForgottenWhenItsSessionCloses) {
  CallMatcher m;
  // Session 66 submits rank 0 of someone else's group and goes away.
  auto stray = m.Arrive(SessionArrival(66, "job", 0, 1, 2), absl::Now() + absl::Milliseconds(50));
  EXPECT_EQ(stray.status().code(), absl::StatusCode::kDeadlineExceeded);
  // The real rank 1 is already in the group (its session stays alive).
  ASSERT_EQ(m.Arrive(SessionArrival(2, "job", 1, 1, 2), absl::Now()).status().code(),
            absl::StatusCode::kDeadlineExceeded);  // call 1 already failed: the same failure
  m.OnSessionClosed(66);
  EXPECT_EQ(m.num_groups(), 1);
  // The real rank 0 may start at call_seq 1 ... (call 1 failed for everyone)
  EXPECT_EQ(m.Arrive(SessionArrival(1, "job", 0, 1, 2), absl::Now()).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  // ... and the group goes on with call 2.
  auto r = RunRanks(m, {SessionArrival(1, "job", 0, 2, 2), SessionArrival(2, "job", 1, 2, 2)},
                    absl::Seconds(10));
  for (auto& x : r) EXPECT_TRUE(x.ok()) << x.status();
}

TEST(CallMatcherGroupsTest, ThousandsOfOneCallGroupsLeaveNothingBehind) {
  CallMatcher m;
  // 10 sessions one after the other, each running 500 one-call groups.
  for (uint64_t s = 1; s <= 10; ++s) {
    for (int i = 0; i < 500; ++i) {
      ASSERT_TRUE(m.Arrive(SessionArrival(s, absl::StrCat("g", s, "-", i), 0, 1, 1),
                           absl::Now() + absl::Seconds(1))
                      .ok());
    }
    EXPECT_EQ(m.num_groups(), 500);
    m.OnSessionClosed(s);
    EXPECT_EQ(m.num_groups(), 0);
  }
}

TEST(CallMatcherGroupsTest, IdleGroupsAreReleasedAndTheTableIsBounded) {
  CallMatcher m;
  std::vector<std::string> refused;
  m.SetLimits({.max_groups = 3,
               .idle_timeout = absl::Milliseconds(300),
               .on_refusal = [&refused](const char* flag) { refused.push_back(flag); }});
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(m.Arrive(SessionArrival(1, absl::StrCat("g", i), 0, 1, 1), absl::Now()).ok());
  }
  auto full = m.Arrive(SessionArrival(1, "g3", 0, 1, 1), absl::Now());
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(full.status().message()), HasSubstr("--max_call_groups"));
  EXPECT_EQ(refused, std::vector<std::string>{"max_call_groups"});
  // Session 1 is still open, but its groups go idle and make room.
  absl::SleepFor(absl::Milliseconds(400));
  EXPECT_TRUE(m.Arrive(SessionArrival(1, "g3", 0, 1, 1), absl::Now()).ok());
  EXPECT_EQ(m.num_groups(), 1);
  // Arrivals without a session (0) are released by idleness alone.
  ASSERT_TRUE(m.Arrive(Arrival(0, 1, "k", 1), absl::Now()).ok());
  EXPECT_EQ(m.num_groups(), 2);
  absl::SleepFor(absl::Milliseconds(1100));  // sweeps run at most once a second
  EXPECT_TRUE(m.Arrive(SessionArrival(2, "late", 0, 1, 1), absl::Now()).ok());
  EXPECT_EQ(m.num_groups(), 1);
}

TEST(CallMatcherGroupsTest, TheLastCallSeqSaysTheSequenceIsExhausted) {
  CallMatcher m;
  const uint64_t last = std::numeric_limits<uint64_t>::max();
  ASSERT_TRUE(m.Arrive(SessionArrival(1, "w", 0, last, 1), absl::Now() + absl::Seconds(1)).ok());
  for (uint64_t next : {uint64_t{0}, last}) {
    auto r = m.Arrive(SessionArrival(1, "w", 0, next, 1), absl::Now() + absl::Seconds(1));
    EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(r.status().message()),
                HasSubstr("already submitted call_seq 18446744073709551615, the last one there is"));
    EXPECT_THAT(std::string(r.status().message()), ::testing::Not(HasSubstr("the next must be 0")));
  }
}

}  // namespace
}  // namespace hsap
