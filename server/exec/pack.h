// Row-level helpers of the executor (executor.h): how a rank's slot of heads
// is cut into kernel calls, and the fp32 accumulators those calls write.
// (The byte layout of transfer rows is plan/wire_layout.h.)
//
// Head groups. A rank computes q heads [qb, qe) and holds kv heads
// [kb, ke) (plan::HeadSlotOf). The kernels map query head h of a call to
// kv head h / (Hq' / Hkv'), so a slot whose boundaries fall on GQA group
// boundaries (qb = kb * g, qe = ke * g) is one call; otherwise (a kv head
// shared with a neighbouring slot, e.g. 5 q heads over 4 ranks) each kv head
// and the slot's q heads that read it are one call with Hkv' = 1.
#ifndef HSAP_SERVER_EXEC_PACK_H_
#define HSAP_SERVER_EXEC_PACK_H_

#include <cstdint>
#include <vector>

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

// The layout of an fp32 accumulator over `rows` rows of a slot's heads,
// stored group-major: group g is [rows, widths[g], D] (the kernels' fixed row
// stride for a call with widths[g] heads), over memory bound with Bind()
// (backend memory of floats() floats, zero-filled by its allocation).
class GroupedAcc {
 public:
  GroupedAcc() = default;
  GroupedAcc(const std::vector<int32_t>& widths, int64_t rows, int32_t head_dim);

  int64_t rows() const { return rows_; }
  int64_t floats() const { return total_; }
  void Bind(float* base) { base_ = base; }
  // First float of `row` in group g; row stride RowStride(g) floats.
  float* At(int g, int64_t row) const { return base_ + offsets_[g] + row * widths_[g] * dim_; }
  int64_t RowStride(int g) const { return int64_t{widths_[g]} * dim_; }
  // D floats of slot head `h` (in slot order, across groups) of `row`.
  float* Head(int64_t row, int32_t h) const {
    return At(group_of_[h], row) + int64_t{within_[h]} * dim_;
  }
  // Row stride (floats) of the group holding slot head `h`.
  int64_t HeadRowStride(int32_t h) const { return RowStride(group_of_[h]); }
  int num_groups() const { return static_cast<int>(widths_.size()); }
  // Floats of rows [0, n) of group g: At(g, 0) .. + n * RowStride(g).

 private:
  float* base_ = nullptr;
  std::vector<int32_t> widths_;
  std::vector<int64_t> offsets_;
  std::vector<int32_t> group_of_, within_;
  int64_t rows_ = 0;
  int64_t total_ = 0;
  int32_t dim_ = 0;
};

}  // namespace hsap::exec

#endif  // HSAP_SERVER_EXEC_PACK_H_
