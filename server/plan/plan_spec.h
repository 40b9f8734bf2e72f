// The request of the plan compiler: everything that shapes a plan.
//
// A PlanSpec names a mask (packed documents as cu_seqlens, or mask slices),
// the topology (nodes x devices per node), the attention shape, the
// strategy, the assignment policy, the hardware profile and the receive
// buffer budget (DESIGN.md §5). ValidatePlanSpec() checks every field with
// overflow-safe arithmetic; ResolveSlices() lowers the mask to slices.
//
// Example:
//   PlanSpec spec;
//   spec.cu_seqlens = {0, 100, 350, 1000};
//   spec.total_tokens = 1000;
//   spec.topology = {.num_nodes = 2, .devices_per_node = 4};
//   spec.shape = {.num_heads_q = 32, .num_heads_kv = 8, .head_dim = 128,
//                 .dtype = DType::kBFloat16};
//   spec.strategy = Strategy::kSap;
//   HSAP_RETURN_IF_ERROR(ValidatePlanSpec(spec));
#ifndef HSAP_SERVER_PLAN_PLAN_SPEC_H_
#define HSAP_SERVER_PLAN_PLAN_SPEC_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/dtype.h"
#include "common/mask.h"
#include "server/plan/wire_layout.h"

namespace hsap::plan {

// How work is spread over the ranks (DESIGN.md §5). Values match the proto
// enum hsap.v1.Strategy.
enum class Strategy : uint8_t {
  kRing = 1,
  kAllGather = 2,
  kUlysses = 3,
  kUsp = 4,
  kSap = 5,
  kHsap = 6,
  kAuto = 7,
};

// Which global tokens each rank holds. Values match hsap.v1.AssignmentPolicy.
enum class AssignmentPolicy : uint8_t {
  kContiguous = 1,
  kZigzag = 2,
  kBalanced = 3,
};

// "ring", "allgather", "ulysses", "usp", "sap", "hsap", "auto".
absl::string_view StrategyName(Strategy s);
bool ParseStrategy(absl::string_view name, Strategy* out);
// "contiguous", "zigzag", "balanced".
absl::string_view AssignmentName(AssignmentPolicy a);
bool ParseAssignment(absl::string_view name, AssignmentPolicy* out);

// The sequence-parallel group: ranks = num_nodes * devices_per_node; rank r
// lives on node r / devices_per_node.
struct Topology {
  int32_t num_nodes = 1;
  int32_t devices_per_node = 1;

  int32_t num_ranks() const { return num_nodes * devices_per_node; }
  int32_t NodeOf(int32_t rank) const { return rank / devices_per_node; }
  bool operator==(const Topology& o) const {
    return num_nodes == o.num_nodes && devices_per_node == o.devices_per_node;
  }
};

// Q/K/V shape shared by all tokens: Q is [tokens, Hq, D], K and V are
// [tokens, Hkv, D] of `dtype`.
struct HeadShape {
  int32_t num_heads_q = 1;
  int32_t num_heads_kv = 1;
  int32_t head_dim = 128;
  DType dtype = DType::kBFloat16;

  bool operator==(const HeadShape& o) const {
    return num_heads_q == o.num_heads_q && num_heads_kv == o.num_heads_kv &&
           head_dim == o.head_dim && dtype == o.dtype;
  }
};

// Default receive-buffer budget per rank: 256 MiB.
inline constexpr int64_t kDefaultRecvBufferBytes = int64_t{256} << 20;
// Limits that keep all byte arithmetic far from int64 overflow.
inline constexpr int64_t kMaxTotalTokens = int64_t{1} << 40;
inline constexpr int32_t kMaxRanks = 1 << 16;
inline constexpr int32_t kMaxHeads = 1 << 12;
inline constexpr int32_t kMaxHeadDim = 1 << 12;
// Most stages a plan may have. The receive budget fixes a rank's memory, so
// a budget of a few token rows turns large needs into that many stages
// (collective steps), each a Stage per rank: ValidatePlanSpec requires a
// budget that holds all tokens in kMaxStages stages, and the compiler stops
// with INVALID_ARGUMENT when packing would need more.
inline constexpr int64_t kMaxStages = 1 << 12;

// The request. Exactly one of `cu_seqlens` (non-empty) and `slices`
// (non-empty, or total_tokens == 0) describes the mask.
struct PlanSpec {
  // Packed documents: [0, l1, l1 + l2, ..., total_tokens]; zero-length
  // documents allowed. Each document attends to itself only, causally when
  // `causal` (with a sliding window of `window` keys when window >= 0),
  // bidirectionally otherwise.
  std::vector<int64_t> cu_seqlens;
  bool causal = true;
  int64_t window = -1;
  // Or: the mask given directly as non-overlapping slices over
  // [0, total_tokens) x [0, total_tokens).
  std::vector<MaskSlice> slices;

  int64_t total_tokens = 0;
  Topology topology;
  HeadShape shape;
  Strategy strategy = Strategy::kAuto;
  AssignmentPolicy assignment = AssignmentPolicy::kBalanced;
  // A name from HardwareProfileNames() or a parametric "custom:..." profile
  // (cost_model.h, ParseHardwareProfile).
  std::string profile = "h100";
  // Upper bound on one stage's point-to-point receive buffer (K and V rows),
  // in bytes; it must hold at least one token row.
  int64_t recv_buffer_bytes = kDefaultRecvBufferBytes;

  bool operator==(const PlanSpec& o) const {
    return cu_seqlens == o.cu_seqlens && causal == o.causal && window == o.window &&
           slices == o.slices && total_tokens == o.total_tokens && topology == o.topology &&
           shape == o.shape && strategy == o.strategy && assignment == o.assignment &&
           profile == o.profile && recv_buffer_bytes == o.recv_buffer_bytes;
  }
};

// Checks every field: ranges, divisibility (Hq % Hkv), overflow of
// total_tokens * row bytes, the mask (cu_seqlens or slices, bounds, overlap),
// the profile name and the budget. Errors are INVALID_ARGUMENT and name the
// field and the values, e.g. "shape.num_heads_q (5) is not a multiple of
// shape.num_heads_kv (2)".
absl::Status ValidatePlanSpec(const PlanSpec& spec);

// The mask as slices: LowerDocuments(cu_seqlens, causal, window) or
// `slices` as given, empty slices dropped, sorted by (q_begin, k_begin).
// REQUIRES: ValidatePlanSpec(spec).ok().
std::vector<MaskSlice> ResolveSlices(const PlanSpec& spec);

// Bytes of one token's K and V rows for `kv_heads` heads (kappa in
// DESIGN.md §8): the wire layout of a kKv row (wire_layout.h).
inline int64_t KvRowBytes(const HeadShape& shape, int64_t kv_heads) {
  return PayloadRowBytes(Payload::kKv, 0, kv_heads, shape.head_dim, shape.dtype);
}

}  // namespace hsap::plan

#endif  // HSAP_SERVER_PLAN_PLAN_SPEC_H_
