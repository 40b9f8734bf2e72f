// Row-level helpers of the executor (executor.h): how a rank's slot of
// heads is cut into kernel calls, the fp32 accumulators those calls write,
// and the byte layout of one row of each transfer payload.
//
// Head groups. A rank computes q heads [qb, qe) and holds kv heads
// [kb, ke) (plan::HeadSlotOf). The CPU kernels map query head h of a call to
// kv head h / (Hq' / Hkv'), so a slot whose boundaries fall on GQA group
// boundaries (qb = kb * g, qe = ke * g) is one call; otherwise (a kv head
// shared with a neighbouring slot, e.g. 5 q heads over 4 ranks) each kv head
// and the slot's q heads that read it are one call with Hkv' = 1.
//
// Payload rows (sender and receiver agree; bytes equal the plan's):
//   kKv, kGradKv:    K (or dK) of the kv heads, then V (or dV), dtype
//   kQkvHeads:       Q of the q heads, K, V of the kv heads, dtype
//   kOutLseHeads:    O of the q heads (dtype), LSE of the q heads (fp32)
//   kBwdHeads:       Q, O, dO of the q heads, K, V of the kv heads (dtype),
//                    LSE of the q heads (fp32)
//   kGradQkvHeads:   dQ of the q heads, dK, dV of the kv heads, dtype
#ifndef HSAP_SERVER_EXEC_PACK_H_
#define HSAP_SERVER_EXEC_PACK_H_

#include <cstdint>
#include <vector>

#include "common/dtype.h"
#include "server/plan/plan.h"

namespace hsap::exec {

// q heads [q_off, q_off + num_q) of a slot reading kv heads [kv_off,
// kv_off + num_kv) of the slot (offsets relative to the slot), with
// num_q % num_kv == 0 and the kernels' GQA mapping valid inside the group.
struct HeadGroup {
  int32_t q_off = 0;
  int32_t num_q = 0;
  int32_t kv_off = 0;
  int32_t num_kv = 0;
};

// The groups of slot q [qb, qe), kv [kb, ke) with GQA ratio `gqa` = Hq / Hkv,
// in head order; empty when the slot has no q heads.
std::vector<HeadGroup> HeadGroupsOf(int32_t qb, int32_t qe, int32_t kb, int32_t ke, int32_t gqa);

// An fp32 accumulator over `rows` rows of a slot's heads, stored group-major:
// group g is [rows, widths[g], D] (the kernels' fixed row stride for a call
// with widths[g] heads). Zero-initialised.
class GroupedAcc {
 public:
  GroupedAcc() = default;
  GroupedAcc(const std::vector<int32_t>& widths, int64_t rows, int32_t head_dim);

  int64_t rows() const { return rows_; }
  // First float of `row` in group g; row stride widths[g] * D.
  float* At(int g, int64_t row) { return data_.data() + offsets_[g] + row * widths_[g] * dim_; }
  // D floats of slot head `h` (in slot order, across groups) of `row`.
  float* Head(int64_t row, int32_t h) {
    return At(group_of_[h], row) + int64_t{within_[h]} * dim_;
  }
  // Zeroes rows [0, n) of every group.
  void ZeroRows(int64_t n);

 private:
  std::vector<float> data_;
  std::vector<int32_t> widths_;
  std::vector<int64_t> offsets_;
  std::vector<int32_t> group_of_, within_;
  int64_t rows_ = 0;
  int32_t dim_ = 0;
};

// dst[i] = src[i] rounded to `dtype`, n elements.
void StoreFloats(const float* src, int64_t n, DType dtype, void* dst);
// dst[i] += src[i] (src of `dtype`), n elements.
void AddAsFloats(const void* src, int64_t n, DType dtype, float* dst);

// Bytes of one row of `payload` carrying `q_heads` q heads and `kv_heads`
// kv heads of dimension `head_dim` in `dtype` (layouts above).
int64_t PayloadRowBytes(plan::Payload payload, int64_t q_heads, int64_t kv_heads,
                        int32_t head_dim, DType dtype);

// Calls fn(row, offset) for each row of the transfer in segment order, with
// `offset` the row's first byte in the transfer's contiguous data.
template <typename F>
void ForEachRow(const plan::Transfer& t, int64_t row_bytes, F&& fn) {
  int64_t offset = 0;
  for (const plan::Segment& s : t.segments) {
    for (int64_t i = 0; i < s.global_end - s.global_begin; ++i) {
      fn(s.row + i, offset);
      offset += row_bytes;
    }
  }
}

}  // namespace hsap::exec

#endif  // HSAP_SERVER_EXEC_PACK_H_
