#include "server/exec/pack.h"

#include <algorithm>

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
  for (size_t g = 0; g < widths.size(); ++g) {
    offsets_.push_back(total_);
    total_ += rows * widths[g] * head_dim;
    for (int32_t i = 0; i < widths[g]; ++i) {
      group_of_.push_back(static_cast<int32_t>(g));
      within_.push_back(i);
    }
  }
}

}  // namespace hsap::exec
