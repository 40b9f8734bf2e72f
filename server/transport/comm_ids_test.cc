// Tests of CommIdAllocator: ids unique among live leases (serially and
// from many threads), first-in-first-out reuse, exhaustion naming the
// limit, and leases that move or outlive the allocator.
#include "server/transport/comm_ids.h"

#include <atomic>
#include <set>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hsap::transport {
namespace {

using ::testing::HasSubstr;

TEST(CommIdAllocator, AllIdsDistinctThenExhaustedNamingTheLimit) {
  CommIdAllocator ids;
  EXPECT_EQ(ids.capacity(), 1024u);
  std::vector<CommIdAllocator::Lease> leases;
  std::set<uint32_t> seen;
  for (int i = 0; i < 1024; ++i) {
    auto lease = ids.Allocate();
    ASSERT_TRUE(lease.ok()) << i << ": " << lease.status();
    EXPECT_LT(lease->id(), 1024u);
    EXPECT_TRUE(seen.insert(lease->id()).second) << "id " << lease->id() << " handed out twice";
    leases.push_back(std::move(*lease));
  }
  EXPECT_EQ(ids.live(), 1024u);
  auto refused = ids.Allocate();
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(), HasSubstr("all 1024 UCX communicator ids"));
  EXPECT_THAT(refused.status().message(), HasSubstr("1024 live multi-node calls per node"));
  leases.pop_back();
  EXPECT_EQ(ids.live(), 1023u);
  EXPECT_TRUE(ids.Allocate().ok());
}

TEST(CommIdAllocator, FreedIdsReturnLastAndInTheOrderFreed) {
  CommIdAllocator ids(8);
  auto first = ids.Allocate();
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->id(), 0u);
  first->Release();
  EXPECT_FALSE(first->held());
  // The just-freed 0 comes back only after the 7 ids never used.
  for (uint32_t want = 1; want < 8; ++want) {
    auto lease = ids.Allocate();
    ASSERT_TRUE(lease.ok());
    EXPECT_EQ(lease->id(), want);
    // Released at once: each goes behind 0.
  }
  std::vector<uint32_t> order;
  std::vector<CommIdAllocator::Lease> held;
  for (int i = 0; i < 8; ++i) {
    auto lease = ids.Allocate();
    ASSERT_TRUE(lease.ok());
    order.push_back(lease->id());
    held.push_back(std::move(*lease));
  }
  EXPECT_EQ(order, (std::vector<uint32_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  // Free 5, 2, 7 (in that order): they come back in that order.
  held[5].Release();
  held[2].Release();
  held[7].Release();
  std::vector<uint32_t> again;
  for (int i = 0; i < 3; ++i) {
    auto lease = ids.Allocate();
    ASSERT_TRUE(lease.ok());
    again.push_back(lease->id());
    held.push_back(std::move(*lease));
  }
  EXPECT_EQ(again, (std::vector<uint32_t>{5, 2, 7}));
  EXPECT_EQ(ids.Allocate().status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(CommIdAllocator, CapacityIsClampedToTheTagField) {
  EXPECT_EQ(CommIdAllocator(0).capacity(), 1u);
  EXPECT_EQ(CommIdAllocator(5000).capacity(), 1024u);
}

TEST(CommIdAllocator, MovedLeaseReleasesOnceAndMayOutliveTheAllocator) {
  CommIdAllocator::Lease kept;
  {
    CommIdAllocator ids(2);
    auto a = ids.Allocate();
    ASSERT_TRUE(a.ok());
    CommIdAllocator::Lease moved(std::move(*a));
    EXPECT_FALSE(a->held());
    EXPECT_TRUE(moved.held());
    EXPECT_EQ(ids.live(), 1u);
    CommIdAllocator::Lease assigned;
    assigned = std::move(moved);
    EXPECT_EQ(ids.live(), 1u);
    auto b = ids.Allocate();
    ASSERT_TRUE(b.ok());
    assigned = std::move(*b);  // releases the first id
    EXPECT_EQ(ids.live(), 1u);
    kept = std::move(assigned);
  }
  EXPECT_TRUE(kept.held());
  kept.Release();  // the table is still there
  EXPECT_FALSE(kept.held());
}

// Many threads allocate and release; no id is ever held by two leases.
TEST(CommIdAllocator, UniqueAmongLiveLeasesUnderConcurrency) {
  CommIdAllocator ids(16);
  std::vector<std::atomic<int>> holders(16);
  std::atomic<int> violations{0}, exhausted{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 5000; ++i) {
        auto a = ids.Allocate();
        auto b = ids.Allocate();
        for (auto* lease : {&a, &b}) {
          if (!lease->ok()) {
            ++exhausted;
            continue;
          }
          if (holders[(*lease)->id()].fetch_add(1) != 0) ++violations;
        }
        for (auto* lease : {&a, &b}) {
          if (lease->ok()) holders[(*lease)->id()].fetch_sub(1);
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(violations.load(), 0);
  EXPECT_EQ(exhausted.load(), 0);  // 8 threads x 2 leases = 16 = capacity
  EXPECT_EQ(ids.live(), 0u);
}

}  // namespace
}  // namespace hsap::transport
