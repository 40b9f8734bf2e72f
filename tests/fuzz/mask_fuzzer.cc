// Fuzzes the mask model of common/mask.h: cu_seqlens validation and
// lowering, slice validation, and SliceArea against brute force.
//
// Each input is a small program read with FuzzedDataProvider:
//  * cu_seqlens + total_tokens: ValidateCuSeqlens must accept exactly the
//    lists a direct reading of its contract accepts; an accepted list lowers
//    to one valid slice per non-empty document whose areas sum to the
//    brute-force count of allowed (q, k) pairs.
//  * a slice list over [0, num_q) x [0, num_k): ValidateSlices must agree
//    with the contract; for every accepted slice SliceArea equals the count
//    of SliceAllows cells (small slices) and the sum of RowKeyRange widths
//    (slices up to 4096 rows), and stays in [0, num_q * num_k] for slices of
//    up to 2^31 tokens (attention validation's limit) — UBSan turns any
//    overflow on the way into a crash.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "common/mask.h"
#include "tests/fuzz/fuzz_util.h"

namespace hsap {
namespace {

using fuzz::AddSat;
using fuzz::Value;

int64_t BruteArea(const hsap::MaskSlice& s) {
  int64_t n = 0;
  for (int64_t r = 0; r < s.num_q(); ++r) {
    for (int64_t c = 0; c < s.num_k(); ++c) n += hsap::SliceAllows(s.type, s.offset, s.window, r, c);
  }
  return n;
}

int64_t RowSumArea(const hsap::MaskSlice& s) {
  int64_t n = 0;
  for (int64_t r = 0; r < s.num_q(); ++r) {
    int64_t lo, hi;
    hsap::RowKeyRange(s.type, s.offset, s.window, s.num_k(), r, &lo, &hi);
    FUZZ_CHECK(0 <= lo && lo <= hi && hi <= s.num_k());
    n += hi - lo;
  }
  return n;
}

void CheckArea(const hsap::MaskSlice& s) {
  const int64_t area = hsap::SliceArea(s);
  FUZZ_CHECK(area >= 0);
  FUZZ_CHECK(static_cast<__int128>(area) <= static_cast<__int128>(s.num_q()) * s.num_k());
  if (s.num_q() <= 4096) FUZZ_CHECK(area == RowSumArea(s));
  if (s.num_q() <= 64 && s.num_k() <= 64) FUZZ_CHECK(area == BruteArea(s));
}

void FuzzCuSeqlens(FuzzedDataProvider& in) {
  const size_t n = in.ConsumeIntegralInRange<size_t>(0, 12);
  std::vector<int64_t> cu;
  for (size_t i = 0; i < n; ++i) {
    // Mostly non-decreasing small steps so valid lists are common.
    const int64_t prev = cu.empty() ? 0 : cu.back();
    cu.push_back(in.ConsumeBool() ? AddSat(prev, in.ConsumeIntegralInRange<int64_t>(0, 9))
                                  : Value(in, 64, int64_t{1} << 31));
  }
  const int64_t total = in.ConsumeBool() && !cu.empty() ? cu.back() : Value(in, 64, int64_t{1} << 31);
  bool expect_ok = !cu.empty() && cu[0] == 0 && cu.back() == total;
  for (size_t i = 1; i < cu.size(); ++i) expect_ok = expect_ok && cu[i] >= cu[i - 1];
  const absl::Status st = hsap::ValidateCuSeqlens(cu, total);
  FUZZ_CHECK(st.ok() == expect_ok);
  if (!st.ok()) {
    FUZZ_CHECK(st.code() == absl::StatusCode::kInvalidArgument);
    FUZZ_CHECK(st.message().find("cu_seqlens") != absl::string_view::npos);
    return;
  }
  const bool causal = in.ConsumeBool();
  const int64_t window = causal ? in.ConsumeIntegralInRange<int64_t>(-1, 20) : -1;
  const std::vector<hsap::MaskSlice> slices = hsap::LowerDocuments(cu, causal, window);
  size_t nonempty = 0;
  for (size_t i = 0; i + 1 < cu.size(); ++i) nonempty += cu[i + 1] > cu[i];
  FUZZ_CHECK(slices.size() == nonempty);
  FUZZ_CHECK(hsap::ValidateSlices(slices, total, total).ok());
  int64_t prev_end = 0;
  for (const hsap::MaskSlice& s : slices) {
    FUZZ_CHECK(s.q_begin == s.k_begin && s.q_end == s.k_end && s.q_begin >= prev_end);
    FUZZ_CHECK(s.offset == 0 && s.window == (causal ? window : -1));
    prev_end = s.q_end;
    if (total <= (int64_t{1} << 31)) CheckArea(s);  // see FuzzSlices
  }
}

void FuzzSlices(FuzzedDataProvider& in) {
  const int64_t big = int64_t{1} << 31;
  const int64_t num_q = Value(in, 48, big), num_k = Value(in, 48, big);
  const size_t n = in.ConsumeIntegralInRange<size_t>(0, 6);
  std::vector<hsap::MaskSlice> slices;
  for (size_t i = 0; i < n; ++i) {
    hsap::MaskSlice s;
    s.q_begin = Value(in, 48, big);
    s.q_end = in.ConsumeBool() ? AddSat(s.q_begin, in.ConsumeIntegralInRange<int64_t>(0, 40))
                               : Value(in, 48, big);
    s.k_begin = Value(in, 48, big);
    s.k_end = in.ConsumeBool() ? AddSat(s.k_begin, in.ConsumeIntegralInRange<int64_t>(0, 40))
                               : Value(in, 48, big);
    s.type = in.ConsumeBool() ? hsap::MaskType::kCausal : hsap::MaskType::kFull;
    if (s.type == hsap::MaskType::kCausal || in.ConsumeIntegralInRange<int>(0, 9) == 0) {
      s.offset = Value(in, 48, int64_t{1} << 49);
      if (in.ConsumeBool() && s.offset != INT64_MIN) s.offset = -s.offset;
      s.window = Value(in, 48, int64_t{1} << 49);
    }
    slices.push_back(s);
  }
  bool expect_ok = true;
  constexpr int64_t kLimit = int64_t{1} << 48;
  for (const hsap::MaskSlice& s : slices) {
    expect_ok = expect_ok && 0 <= s.q_begin && s.q_begin <= s.q_end && s.q_end <= num_q &&
                0 <= s.k_begin && s.k_begin <= s.k_end && s.k_end <= num_k &&
                (s.type == hsap::MaskType::kCausal || (s.window < 0 && s.offset == 0)) &&
                -kLimit <= s.offset && s.offset <= kLimit && s.window <= kLimit;
  }
  const absl::Status st = hsap::ValidateSlices(slices, num_q, num_k);
  FUZZ_CHECK(st.ok() == expect_ok);
  if (!st.ok()) {
    FUZZ_CHECK(st.code() == absl::StatusCode::kInvalidArgument);
    return;
  }
  // SliceArea's range is that of attention requests: at most 2^31 tokens.
  if (num_q > big || num_k > big) return;
  for (const hsap::MaskSlice& s : slices) {
    CheckArea(s);
    (void)hsap::SliceDebugString(s);
  }
}

}  // namespace
}  // namespace hsap

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  if (in.ConsumeBool()) {
    hsap::FuzzCuSeqlens(in);
  } else {
    hsap::FuzzSlices(in);
  }
  return 0;
}
