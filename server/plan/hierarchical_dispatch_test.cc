// The `balanced` assignment on several nodes (balanced_dispatch.h): over
// random document structures and slice masks (windows, shared prefixes) and
// node counts, every rank holds its quota, every token is placed once, the
// result does not depend on the pool, one node is the rank-level solver,
// and documents that fit in a node stay inside it.
#include <algorithm>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/thread_pool.h"
#include "gtest/gtest.h"
#include "server/plan/demand.h"
#include "server/plan/dispatch.h"

namespace hsap::plan {
namespace {

// A random mask: causal or bidirectional documents (some windowed), and
// shared-prefix groups (a causal prefix; branches that see all of it and
// themselves causally), over exactly T tokens.
std::vector<MaskSlice> RandomMask(std::mt19937_64& rng, int64_t T) {
  std::vector<MaskSlice> slices;
  auto uni = [&](int64_t lo, int64_t hi) { return lo + static_cast<int64_t>(rng() % (hi - lo + 1)); };
  int64_t x = 0;
  while (x < T) {
    const int64_t kind = uni(0, 5);
    const int64_t left = T - x;
    if (kind == 0 && left >= 8) {  // shared prefix with 1-3 branches
      const int64_t prefix = uni(1, std::max<int64_t>(1, left / 4));
      slices.push_back({x, x + prefix, x, x + prefix, MaskType::kCausal, 0, -1});
      int64_t b = x + prefix;
      for (int64_t i = 0, n = uni(1, 3); i < n && b < T; ++i) {
        const int64_t len = std::min(T - b, uni(1, std::max<int64_t>(1, left / 3)));
        slices.push_back({b, b + len, x, x + prefix, MaskType::kFull, 0, -1});
        slices.push_back({b, b + len, b, b + len, MaskType::kCausal, 0, -1});
        b += len;
      }
      x = b;
      continue;
    }
    // Documents: many short ones, a few long (up to half the pack), length 1.
    const int64_t len = kind == 1 ? 1 : std::min(left, kind == 2 ? uni(1, T / 2 + 1) : uni(1, 300));
    const bool causal = uni(0, 3) != 0;
    const int64_t window = causal && uni(0, 4) == 0 ? uni(1, 64) : -1;
    slices.push_back({x, x + len, x, x + len, causal ? MaskType::kCausal : MaskType::kFull, 0,
                      window});
    x += len;
  }
  std::stable_sort(slices.begin(), slices.end(), [](const MaskSlice& a, const MaskSlice& b) {
    return a.q_begin != b.q_begin ? a.q_begin < b.q_begin : a.k_begin < b.k_begin;
  });
  return slices;
}

// Per node, the keys its rows see that none of its ranks holds, in tokens.
std::vector<int64_t> NodeNeeds(absl::Span<const MaskSlice> slices, const Dispatch& d,
                               int32_t rpn) {
  const SliceIndex index(slices);
  std::vector<int64_t> need(d.num_ranks() / rpn, 0);
  for (size_t n = 0; n < need.size(); ++n) {
    std::vector<TokenRange> rows;
    for (int32_t i = 0; i < rpn; ++i) {
      for (const TokenRange& t : d.ranges[n * rpn + i]) rows.push_back(t);
    }
    std::vector<OwnerSegment> held;
    int64_t row = 0;
    for (const TokenRange& t : Normalize(rows)) {
      held.push_back({t.begin, t.end, static_cast<int32_t>(n), row});
      row += t.size();
    }
    need[n] = TotalTokens(ExactNeed(ComputeDemands(index, held), held));
  }
  return need;
}

TEST(HierarchicalDispatchTest, RandomMasksAndNodeCountsKeepQuotasAndPartition) {
  std::mt19937_64 rng(2026);
  ThreadPool pool(2);
  int multi_node = 0;
  for (int c = 0; c < 300; ++c) {
    const int32_t nodes = 1 + static_cast<int32_t>(rng() % 8);
    const int32_t rpn = 1 + static_cast<int32_t>(rng() % 4);
    const int32_t P = nodes * rpn;
    const int64_t T = static_cast<int64_t>(rng() % 6000);
    const std::vector<MaskSlice> slices = RandomMask(rng, T);
    const Topology topo{nodes, rpn};
    const Dispatch d = ComputeDispatch(AssignmentPolicy::kBalanced, slices, T, topo);
    const std::string what = absl::StrCat("case ", c, ": ", nodes, " x ", rpn, ", T = ", T,
                                          ", ", slices.size(), " slices");
    ASSERT_EQ(d.num_ranks(), P) << what;
    ASSERT_TRUE(ValidateDispatch(d).ok()) << what << ": " << ValidateDispatch(d);
    for (int32_t r = 0; r < P; ++r) {
      ASSERT_EQ(d.TokensOf(r), T / P + (r < T % P)) << what << ", rank " << r;
    }
    // The same with the pool, and again.
    ASSERT_EQ(ComputeDispatch(AssignmentPolicy::kBalanced, slices, T, topo, &pool), d) << what;
    ASSERT_EQ(ComputeDispatch(AssignmentPolicy::kBalanced, slices, T, topo), d) << what;
    if (nodes == 1) {
      ASSERT_EQ(ComputeDispatch(AssignmentPolicy::kBalanced, slices, T, P), d) << what;
    } else {
      ++multi_node;
    }
  }
  EXPECT_GT(multi_node, 200);
}

TEST(HierarchicalDispatchTest, DocumentsThatFitInANodeStayInside) {
  // 4 nodes x 2 ranks, T = 8192: four documents of a node's share (2,048
  // tokens), each longer than a rank's (1,024), plus nothing else.
  const std::vector<MaskSlice> slices = LowerDocuments({0, 2048, 4096, 6144, 8192}, true, -1);
  const Dispatch nodes_first =
      ComputeDispatch(AssignmentPolicy::kBalanced, slices, 8192, Topology{4, 2});
  ASSERT_TRUE(ValidateDispatch(nodes_first).ok());
  for (int64_t need : NodeNeeds(slices, nodes_first, 2)) EXPECT_EQ(need, 0);
  // Every document lies on the two ranks of one node.
  for (int32_t n = 0; n < 4; ++n) {
    std::vector<TokenRange> held;
    for (int32_t i = 0; i < 2; ++i) {
      for (const TokenRange& t : nodes_first.ranges[2 * n + i]) held.push_back(t);
    }
    held = Normalize(held);
    ASSERT_EQ(held.size(), 1u) << "node " << n;
    EXPECT_EQ(held[0].size(), 2048) << "node " << n;
    EXPECT_EQ(held[0].begin % 2048, 0) << "node " << n;
  }
  // The rank-level solver on the same ranks cuts them across nodes.
  const Dispatch flat = ComputeDispatch(AssignmentPolicy::kBalanced, slices, 8192, 8);
  int64_t flat_need = 0;
  for (int64_t need : NodeNeeds(slices, flat, 2)) flat_need += need;
  EXPECT_GT(flat_need, 0) << "the flat layout happened to keep them: this shows nothing";
}

TEST(HierarchicalDispatchTest, ALongDocumentIsCutOverAsFewNodesAsBalanceAllows) {
  // One causal document of 12K tokens among short ones, 4 nodes x 2 ranks
  // at T = 16K: a node holds 4K, so the long document needs three nodes at
  // least; the short ones stay whole on one node each.
  std::vector<int64_t> cu = {0, 12288};
  while (cu.back() < 16384) cu.push_back(cu.back() + 64);
  const std::vector<MaskSlice> slices = LowerDocuments(cu, true, -1);
  const Dispatch d = ComputeDispatch(AssignmentPolicy::kBalanced, slices, 16384, Topology{4, 2});
  ASSERT_TRUE(ValidateDispatch(d).ok());
  std::vector<int32_t> node_of_token(16384, -1);
  for (int32_t r = 0; r < 8; ++r) {
    for (const TokenRange& t : d.ranges[r]) {
      for (int64_t x = t.begin; x < t.end; ++x) node_of_token[x] = r / 2;
    }
  }
  int cut_short = 0;
  for (size_t i = 2; i < cu.size(); ++i) {
    for (int64_t x = cu[i - 1] + 1; x < cu[i]; ++x) {
      if (node_of_token[x] != node_of_token[cu[i - 1]]) {
        ++cut_short;
        break;
      }
    }
  }
  // Equal token counts may force a cut where a node's last free tokens are
  // filled: at most one per node.
  EXPECT_LE(cut_short, 4);
  std::vector<bool> long_on(4, false);
  for (int64_t x = 0; x < 12288; ++x) long_on[node_of_token[x]] = true;
  EXPECT_GE(std::count(long_on.begin(), long_on.end(), true), 3);
}

}  // namespace
}  // namespace hsap::plan
