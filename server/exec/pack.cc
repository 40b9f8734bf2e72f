#include "server/exec/pack.h"

#include <algorithm>
#include <cstring>

namespace hsap::exec {

std::vector<HeadGroup> HeadGroupsOf(int32_t qb, int32_t qe, int32_t kb, int32_t ke, int32_t gqa) {
  std::vector<HeadGroup> groups;
  if (qe <= qb) return groups;
  if (qb == kb * gqa && qe == ke * gqa) {
    groups.push_back({0, qe - qb, 0, ke - kb});
    return groups;
  }
  for (int32_t j = kb; j < ke; ++j) {
    const int32_t a = std::max(qb, j * gqa), b = std::min(qe, (j + 1) * gqa);
    if (a < b) groups.push_back({a - qb, b - a, j - kb, 1});
  }
  return groups;
}

GroupedAcc::GroupedAcc(const std::vector<int32_t>& widths, int64_t rows, int32_t head_dim)
    : widths_(widths), rows_(rows), dim_(head_dim) {
  int64_t total = 0;
  for (size_t g = 0; g < widths.size(); ++g) {
    offsets_.push_back(total);
    total += rows * widths[g] * head_dim;
    for (int32_t i = 0; i < widths[g]; ++i) {
      group_of_.push_back(static_cast<int32_t>(g));
      within_.push_back(i);
    }
  }
  data_.assign(total, 0.f);
}

void GroupedAcc::ZeroRows(int64_t n) {
  for (size_t g = 0; g < widths_.size(); ++g) {
    std::fill_n(data_.data() + offsets_[g], n * widths_[g] * dim_, 0.f);
  }
}

void StoreFloats(const float* src, int64_t n, DType dtype, void* dst) {
  if (dtype == DType::kFloat32) {
    std::memcpy(dst, src, n * sizeof(float));
    return;
  }
  for (int64_t i = 0; i < n; ++i) StoreFromFloat(dst, dtype, i, src[i]);
}

void AddAsFloats(const void* src, int64_t n, DType dtype, float* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] += LoadAsFloat(src, dtype, i);
}

int64_t PayloadRowBytes(plan::Payload payload, int64_t q_heads, int64_t kv_heads,
                        int32_t head_dim, DType dtype) {
  const int64_t e = int64_t{head_dim} * DTypeSize(dtype);
  switch (payload) {
    case plan::Payload::kKv:
    case plan::Payload::kGradKv: return 2 * kv_heads * e;
    case plan::Payload::kQkvHeads:
    case plan::Payload::kGradQkvHeads: return (q_heads + 2 * kv_heads) * e;
    case plan::Payload::kOutLseHeads: return q_heads * (e + 4);
    case plan::Payload::kBwdHeads: return (3 * q_heads + 2 * kv_heads) * e + 4 * q_heads;
  }
  return 0;
}

}  // namespace hsap::exec
