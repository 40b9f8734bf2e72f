#include "common/mask.h"

#include <random>

#include "gtest/gtest.h"

namespace hsap {
namespace {

int64_t BruteArea(const MaskSlice& s) {
  int64_t n = 0;
  for (int64_t r = 0; r < s.num_q(); ++r)
    for (int64_t c = 0; c < s.num_k(); ++c) n += SliceAllows(s.type, s.offset, s.window, r, c);
  return n;
}

TEST(MaskTest, AreaAndRowRangeMatchBruteForce) {
  std::mt19937 rng(7);
  for (int iter = 0; iter < 5000; ++iter) {
    MaskSlice s;
    s.q_begin = rng() % 5;
    s.q_end = s.q_begin + rng() % 40;
    s.k_begin = rng() % 5;
    s.k_end = s.k_begin + rng() % 40;
    s.type = rng() % 4 ? MaskType::kCausal : MaskType::kFull;
    if (s.type == MaskType::kCausal) {
      s.offset = static_cast<int64_t>(rng() % 80) - 40;
      s.window = rng() % 2 ? static_cast<int64_t>(rng() % 20) : -1;
    }
    ASSERT_EQ(SliceArea(s), BruteArea(s)) << SliceDebugString(s);
    for (int64_t r = 0; r < s.num_q(); ++r) {
      int64_t lo, hi;
      RowKeyRange(s.type, s.offset, s.window, s.num_k(), r, &lo, &hi);
      for (int64_t c = 0; c < s.num_k(); ++c) {
        ASSERT_EQ(c >= lo && c < hi, SliceAllows(s.type, s.offset, s.window, r, c))
            << SliceDebugString(s) << " r=" << r << " c=" << c;
      }
    }
  }
}

TEST(MaskTest, CuSeqlensErrorsNameFieldAndValues) {
  std::vector<int64_t> cu;
  EXPECT_EQ(ValidateCuSeqlens(cu, 0).code(), absl::StatusCode::kInvalidArgument);
  cu = {1, 4};
  auto st = ValidateCuSeqlens(cu, 4);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("cu_seqlens[0] is 1"), std::string::npos) << st;
  cu = {0, 5, 3, 8};
  st = ValidateCuSeqlens(cu, 8);
  EXPECT_NE(st.message().find("decreases at index 2: 5 then 3"), std::string::npos) << st;
  cu = {0, 5};
  st = ValidateCuSeqlens(cu, 6);
  EXPECT_NE(st.message().find("ends at 5"), std::string::npos) << st;
  EXPECT_NE(st.message().find("6 tokens"), std::string::npos) << st;
  cu = {0, 0, 3, 3, 6};
  EXPECT_TRUE(ValidateCuSeqlens(cu, 6).ok());
}

TEST(MaskTest, LowerDocumentsSkipsEmptyDocuments) {
  std::vector<int64_t> cu = {0, 0, 3, 3, 7};
  auto slices = LowerDocuments(cu, true, 2);
  ASSERT_EQ(slices.size(), 2u);
  EXPECT_EQ(slices[0].q_begin, 0);
  EXPECT_EQ(slices[0].q_end, 3);
  EXPECT_EQ(slices[1].k_begin, 3);
  EXPECT_EQ(slices[1].k_end, 7);
  EXPECT_EQ(slices[1].window, 2);
  EXPECT_EQ(SliceArea(slices[0]), 6);  // 3 rows, window 2 covers whole triangle
  auto full = LowerDocuments(cu, false, -1);
  EXPECT_EQ(full[1].type, MaskType::kFull);
  EXPECT_EQ(SliceArea(full[1]), 16);
}

TEST(MaskTest, ValidateSlicesNamesIndex) {
  std::vector<MaskSlice> s(2);
  s[0] = {0, 4, 0, 4, MaskType::kCausal, 0, -1};
  s[1] = {2, 9, 0, 4, MaskType::kFull, 0, -1};
  auto st = ValidateSlices(s, 8, 8);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("slices[1] query range [2, 9)"), std::string::npos) << st;
}

}  // namespace
}  // namespace hsap
