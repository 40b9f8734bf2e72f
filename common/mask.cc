#include "common/mask.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace hsap {
namespace {

// Sum over r in [0, n) of clamp(r + c, 0, cap), in O(1).
int64_t SumClamped(int64_t n, int64_t c, int64_t cap) {
  if (n <= 0 || cap <= 0) return 0;
  // r + c < 0         for r < -c            -> 0
  // 0 <= r + c <= cap for -c <= r <= cap - c -> r + c
  // r + c > cap       for r > cap - c        -> cap
  const int64_t r0 = std::clamp<int64_t>(-c, 0, n);          // first r with r + c >= 0
  const int64_t r1 = std::clamp<int64_t>(cap - c + 1, 0, n);  // first r with r + c > cap
  int64_t total = 0;
  if (r1 > r0) {
    // Sum of (r + c) for r in [r0, r1): arithmetic series.
    const int64_t first = r0 + c, last = r1 - 1 + c, count = r1 - r0;
    total += (first + last) * count / 2;
  }
  total += (n - std::max(r1, r0)) * cap;
  return total;
}

}  // namespace

int64_t SliceArea(const MaskSlice& s) {
  const int64_t nq = s.num_q(), nk = s.num_k();
  if (nq <= 0 || nk <= 0) return 0;
  if (s.type == MaskType::kFull) return nq * nk;
  // hi(r) = clamp(r + offset + 1, 0, nk); lo(r) = clamp(r + offset - window, 0, nk)
  const int64_t hi = SumClamped(nq, s.offset + 1, nk);
  const int64_t lo = s.window >= 0 ? SumClamped(nq, s.offset - s.window, nk) : 0;
  return hi - lo;
}

absl::Status ValidateCuSeqlens(absl::Span<const int64_t> cu, int64_t total_tokens,
                               absl::string_view field) {
  if (cu.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " is empty: it needs at least [0, total_tokens]"));
  }
  if (cu[0] != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, "[0] is ", cu[0], ": it must start at 0"));
  }
  for (size_t i = 1; i < cu.size(); ++i) {
    if (cu[i] < cu[i - 1]) {
      return absl::InvalidArgumentError(absl::StrCat(field, " decreases at index ", i, ": ",
                                                     cu[i - 1], " then ", cu[i]));
    }
  }
  if (cu.back() != total_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(field, " ends at ", cu.back(),
                                                   " but the tensors hold ", total_tokens,
                                                   " tokens"));
  }
  return absl::OkStatus();
}

std::vector<MaskSlice> LowerDocuments(absl::Span<const int64_t> cu, bool causal,
                                      int64_t window) {
  std::vector<MaskSlice> out;
  for (size_t d = 0; d + 1 < cu.size(); ++d) {
    if (cu[d + 1] == cu[d]) continue;
    MaskSlice s;
    s.q_begin = s.k_begin = cu[d];
    s.q_end = s.k_end = cu[d + 1];
    s.type = causal ? MaskType::kCausal : MaskType::kFull;
    s.window = causal ? window : -1;
    out.push_back(s);
  }
  return out;
}

absl::Status ValidateSlices(absl::Span<const MaskSlice> slices, int64_t num_q, int64_t num_k,
                            absl::string_view field) {
  for (size_t i = 0; i < slices.size(); ++i) {
    const MaskSlice& s = slices[i];
    if (s.q_begin < 0 || s.q_begin > s.q_end || s.q_end > num_q) {
      return absl::InvalidArgumentError(absl::StrCat(field, "[", i, "] query range [", s.q_begin,
                                                     ", ", s.q_end, ") is not within [0, ",
                                                     num_q, ")"));
    }
    if (s.k_begin < 0 || s.k_begin > s.k_end || s.k_end > num_k) {
      return absl::InvalidArgumentError(absl::StrCat(field, "[", i, "] key range [", s.k_begin,
                                                     ", ", s.k_end, ") is not within [0, ",
                                                     num_k, ")"));
    }
    if (s.type == MaskType::kFull && (s.window >= 0 || s.offset != 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, "[", i, "] is FULL but has window ", s.window, " / offset ", s.offset,
          ": only CAUSAL slices take them"));
    }
    // Keep |offset| and |window| far from overflow in r + offset - window.
    constexpr int64_t kLimit = int64_t{1} << 48;
    if (s.offset > kLimit || s.offset < -kLimit || s.window > kLimit) {
      return absl::InvalidArgumentError(absl::StrCat(field, "[", i, "] offset ", s.offset,
                                                     " or window ", s.window, " exceeds 2^48"));
    }
  }
  return absl::OkStatus();
}

std::string SliceDebugString(const MaskSlice& s) {
  return absl::StrCat("q[", s.q_begin, ",", s.q_end, ") k[", s.k_begin, ",", s.k_end, ") ",
                      s.type == MaskType::kFull ? "FULL" : "CAUSAL",
                      s.type == MaskType::kCausal ? absl::StrCat(" off=", s.offset, " win=", s.window)
                                                  : "");
}

}  // namespace hsap
