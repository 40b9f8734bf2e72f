// The attention mask model shared by the planner, the kernels (CPU and CUDA)
// and the request validation.
//
// Every mask HSAP supports lowers to a list of *mask slices* (DESIGN.md §2):
// a rectangle [q_begin, q_end) x [k_begin, k_end) of the global attention
// matrix plus a rule inside it. For query row i and key j of a slice let
//
//     d(i, j) = (i - q_begin + offset) - (j - k_begin)
//
// FULL:   every (i, j) of the rectangle is allowed.
// CAUSAL: (i, j) is allowed iff d >= 0, and, when window >= 0, d <= window
//         (a sliding window of `window` keys before the diagonal, as
//         flash-attention's window_size = (window, 0)).
//
// offset 0 aligns the diagonal top-left (a document attending to itself);
// flash-attention's bottom-right alignment for unequal lengths is
// offset = (k_end - k_begin) - (q_end - q_begin).
//
// The functions below are header-only and marked host/device so the CUDA
// kernels use the very arithmetic the CPU tests cover.
#ifndef HSAP_COMMON_MASK_H_
#define HSAP_COMMON_MASK_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/dtype.h"  // HSAP_HOST_DEVICE

namespace hsap {

enum class MaskType : uint8_t {
  kFull = 0,
  kCausal = 1,
};

struct MaskSlice {
  int64_t q_begin = 0;
  int64_t q_end = 0;
  int64_t k_begin = 0;
  int64_t k_end = 0;
  MaskType type = MaskType::kFull;
  int64_t offset = 0;   // CAUSAL only: diagonal offset, see above.
  int64_t window = -1;  // CAUSAL only: < 0 means unbounded to the left.

  int64_t num_q() const { return q_end - q_begin; }
  int64_t num_k() const { return k_end - k_begin; }
  bool operator==(const MaskSlice& o) const {
    return q_begin == o.q_begin && q_end == o.q_end && k_begin == o.k_begin &&
           k_end == o.k_end && type == o.type && offset == o.offset && window == o.window;
  }
};

// Keys that query row r (relative to q_begin, 0 <= r < nq) may see, as a
// half-open range [*lo, *hi) relative to k_begin, clipped to [0, nk). Empty
// when *lo >= *hi. This is the one definition of the mask rule.
HSAP_HOST_DEVICE inline void RowKeyRange(MaskType type, int64_t offset, int64_t window,
                                         int64_t nk, int64_t r, int64_t* lo, int64_t* hi) {
  if (type == MaskType::kFull) {
    *lo = 0;
    *hi = nk;
    return;
  }
  int64_t h = r + offset + 1;              // keys j with d >= 0: j <= r + offset
  int64_t l = window >= 0 ? r + offset - window : 0;  // d <= window
  h = h < 0 ? 0 : (h > nk ? nk : h);
  l = l < 0 ? 0 : (l > nk ? nk : l);
  *lo = l;
  *hi = h > l ? h : l;
}

// Whether (row r, key c), both relative to the slice, is allowed.
HSAP_HOST_DEVICE inline bool SliceAllows(MaskType type, int64_t offset, int64_t window,
                                         int64_t r, int64_t c) {
  if (type == MaskType::kFull) return true;
  const int64_t d = r + offset - c;
  return d >= 0 && (window < 0 || d <= window);
}

// Number of allowed (q, k) pairs in a slice, in O(1).
int64_t SliceArea(const MaskSlice& s);

// Validates document boundaries for `total_tokens` tokens: non-empty, starts at
// 0, non-decreasing, ends at total_tokens. Errors are INVALID_ARGUMENT and name
// `field` and the offending index and values.
absl::Status ValidateCuSeqlens(absl::Span<const int64_t> cu_seqlens, int64_t total_tokens,
                               absl::string_view field = "cu_seqlens");

// Lowers packed documents to mask slices, one per non-empty document:
// causal documents get CAUSAL with offset 0 and the given window (-1 for
// none); bidirectional ones get FULL. REQUIRES: cu_seqlens is valid.
std::vector<MaskSlice> LowerDocuments(absl::Span<const int64_t> cu_seqlens, bool causal,
                                      int64_t window);

// Checks a slice list against a [0, num_q) x [0, num_k) matrix: ranges in
// bounds and ordered, window only on CAUSAL. Errors name `field`[index].
absl::Status ValidateSlices(absl::Span<const MaskSlice> slices, int64_t num_q, int64_t num_k,
                            absl::string_view field = "slices");

std::string SliceDebugString(const MaskSlice& s);

}  // namespace hsap

#endif  // HSAP_COMMON_MASK_H_
