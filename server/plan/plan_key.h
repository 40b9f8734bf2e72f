// The stable identity of a plan: a 128-bit hash of a canonical encoding of
// everything that shapes it (the PlanSpec) plus the plan format version.
//
// Every node computes the key independently and the daemons compare keys to
// agree on the plan, so the hash must be identical across processes,
// machines and builds: it is implemented here (two 64-bit multiply-rotate
// streams with different seeds, multipliers and rotations over the fields as
// 64-bit words, each finished with the splitmix finalizer), never std::hash
// or absl::Hash (both are seeded per process).
#ifndef HSAP_SERVER_PLAN_PLAN_KEY_H_
#define HSAP_SERVER_PLAN_PLAN_KEY_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace hsap::plan {

struct PlanSpec;

struct PlanKey {
  uint64_t hi = 0;
  uint64_t lo = 0;

  bool operator==(const PlanKey& o) const { return hi == o.hi && lo == o.lo; }
  bool operator!=(const PlanKey& o) const { return !(*this == o); }
  bool operator<(const PlanKey& o) const { return hi != o.hi ? hi < o.hi : lo < o.lo; }
  template <typename H>
  friend H AbslHashValue(H h, const PlanKey& k) {
    return H::combine(std::move(h), k.hi, k.lo);
  }
  // 32 lowercase hex digits, hi first.
  std::string ToHex() const;
  // Parses ToHex()'s form; false on anything else.
  static bool FromHex(absl::string_view hex, PlanKey* out);
};

// Key of the plan `spec` compiles to under `format_version`.
// Deterministic; O(size of the mask description).
PlanKey ComputePlanKey(const PlanSpec& spec, uint32_t format_version);

}  // namespace hsap::plan

#endif  // HSAP_SERVER_PLAN_PLAN_KEY_H_
