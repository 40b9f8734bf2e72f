#include "server/plan/dispatch.h"

#include <random>
#include <set>

#include "gtest/gtest.h"

namespace hsap::plan {
namespace {

TEST(DispatchTest, ContiguousAndZigzagRanges) {
  Dispatch c = ComputeDispatch(AssignmentPolicy::kContiguous, {}, 10, 4);
  EXPECT_EQ(c.ranges[0], (std::vector<TokenRange>{{0, 2}}));
  EXPECT_EQ(c.ranges[1], (std::vector<TokenRange>{{2, 5}}));
  EXPECT_EQ(c.ranges[3], (std::vector<TokenRange>{{7, 10}}));
  Dispatch z = ComputeDispatch(AssignmentPolicy::kZigzag, {}, 16, 2);
  EXPECT_EQ(z.ranges[0], (std::vector<TokenRange>{{0, 4}, {12, 16}}));
  EXPECT_EQ(z.ranges[1], (std::vector<TokenRange>{{4, 12}}));  // chunks 1 and 2 merge
  EXPECT_TRUE(ValidateDispatch(z).ok());
  // Fewer tokens than ranks: some ranks hold nothing.
  Dispatch few = ComputeDispatch(AssignmentPolicy::kContiguous, {}, 3, 8);
  EXPECT_TRUE(ValidateDispatch(few).ok());
}

TEST(DispatchTest, RowAreaMatchesBruteForce) {
  std::vector<MaskSlice> slices = LowerDocuments({0, 5, 5, 17, 30}, true, 3);
  for (int64_t a = 0; a <= 30; ++a) {
    for (int64_t b = a; b <= 30; ++b) {
      int64_t brute = 0;
      for (const MaskSlice& s : slices) {
        for (int64_t q = std::max(a, s.q_begin); q < std::min(b, s.q_end); ++q) {
          for (int64_t k = s.k_begin; k < s.k_end; ++k) {
            brute += SliceAllows(s.type, s.offset, s.window, q - s.q_begin, k - s.k_begin);
          }
        }
      }
      ASSERT_EQ(RowArea(slices, a, b), brute) << a << " " << b;
    }
  }
}

TEST(DispatchTest, BalancedKeepsShortDocumentsWholeAndSplitsLongOnes) {
  // 8 ranks, 8192 tokens: one 4096-token document and 64 documents of 64.
  std::vector<int64_t> cu = {0, 4096};
  for (int i = 0; i < 64; ++i) cu.push_back(cu.back() + 64);
  std::vector<MaskSlice> slices = LowerDocuments(cu, true, -1);
  Dispatch d = ComputeDispatch(AssignmentPolicy::kBalanced, slices, 8192, 8);
  ASSERT_TRUE(ValidateDispatch(d).ok()) << ValidateDispatch(d);
  int64_t total_area = 0, max_area = 0;
  int ranks_with_long = 0;
  std::set<int64_t> cut_docs;
  for (int32_t r = 0; r < 8; ++r) {
    EXPECT_EQ(d.TokensOf(r), 1024);
    int64_t area = 0;
    bool long_doc = false;
    for (const TokenRange& t : d.ranges[r]) {
      area += RowArea(slices, t.begin, t.end);
      long_doc |= t.begin < 4096;
      for (int64_t x : {t.begin, t.end}) {
        if (x > 4096 && (x - 4096) % 64 != 0) cut_docs.insert((x - 4096) / 64);
      }
    }
    ranks_with_long += long_doc;
    total_area += area;
    max_area = std::max(max_area, area);
  }
  // Short documents stay whole, except at most one cut per rank where the
  // last free tokens of a rank are filled (equal token counts).
  EXPECT_LE(cut_docs.size(), 8u);
  EXPECT_LE(static_cast<double>(max_area) / (total_area / 8.0), 1.05);
  EXPECT_LE(ranks_with_long, 8);
}

TEST(DispatchTest, BalancedOnRandomPacksIsAPartitionWithEqualTokens) {
  std::mt19937_64 rng(7);
  for (int c = 0; c < 200; ++c) {
    const int32_t P = 1 + rng() % 64;
    const int64_t T = rng() % 5000;
    std::vector<int64_t> cu = {0};
    while (cu.back() < T) cu.push_back(std::min<int64_t>(T, cu.back() + rng() % 700));
    if (T == 0) cu.push_back(0);
    Dispatch d = ComputeDispatch(AssignmentPolicy::kBalanced, LowerDocuments(cu, true, -1), T, P);
    ASSERT_TRUE(ValidateDispatch(d).ok()) << ValidateDispatch(d);
    for (int32_t r = 0; r < P; ++r) {
      ASSERT_EQ(d.TokensOf(r), T / P + (r < T % P)) << "rank " << r;
    }
  }
}

TEST(DispatchTest, ValidateDispatchNamesTheProblem) {
  Dispatch d;
  d.total_tokens = 10;
  d.ranges = {{{0, 5}}, {{4, 10}}};
  absl::Status s = ValidateDispatch(d);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("held by two ranks"), std::string::npos) << s;
  d.ranges = {{{0, 5}}, {{6, 10}}};
  EXPECT_NE(ValidateDispatch(d).message().find("token 5 is held by no rank"), std::string::npos)
      << ValidateDispatch(d);
}

}  // namespace
}  // namespace hsap::plan
