// A validated attention call: what the executor runs. Produced only by the
// entry-point validation (server/grpc/attention_validation.h), so every field
// here is known to be consistent and every tensor lies inside a pinned region.
#ifndef HSAP_SERVER_EXEC_ATTENTION_CALL_H_
#define HSAP_SERVER_EXEC_ATTENTION_CALL_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/mask.h"
#include "kernels/attention_params.h"
#include "server/plan/plan_spec.h"
#include "server/shm/region_registry.h"

namespace hsap {

// One tensor of a call, resolved to memory the daemon may touch while `pin`
// lives.
struct BoundTensor {
  shm::RegionPin pin;
  uint8_t* data = nullptr;
  uint64_t region_id = 0;
  uint64_t offset = 0;
  uint64_t bytes = 0;
  std::vector<int64_t> shape;
};

// What the entry-point validation (server/grpc/attention_validation.h)
// accepts at most.
struct ValidationLimits {
  int32_t max_group_size = 1;  // ranks this deployment can serve
  // The static cluster (--peers, in node order; empty without one) and
  // this daemon's index in it (the old rule for an empty call.nodes), its
  // advertised address (--advertise_address; empty without TCP) and its
  // device slots: what call.nodes is checked against.
  std::vector<std::string> peers;
  int32_t node_rank = 0;
  std::string self_address;
  int32_t device_slots = 1;
  int64_t max_tokens = int64_t{1} << 31;
  int64_t max_slices = 1 << 22;
  int max_heads = 1024;
};

struct AttentionCall {
  bool backward = false;
  // The client session that made the call (0 = unknown); the call matcher
  // scopes group state to sessions (CallArrival::session).
  uint64_t session = 0;
  // Collective identity.
  std::string group;
  int32_t rank = 0;
  int32_t group_size = 1;
  uint64_t call_seq = 0;
  // The member nodes the call declared (call.nodes): their advertised
  // addresses in group node order and this rank's place; empty when it
  // declared none (GroupTopology's rule).
  std::vector<std::string> member_addresses;
  int32_t node_index = 0;
  // Options.
  plan::Strategy strategy = plan::Strategy::kAuto;
  plan::AssignmentPolicy assignment = plan::AssignmentPolicy::kBalanced;
  uint32_t deadline_ms = 0;
  // Shapes and mask.
  kernels::AttentionShape shape;
  int64_t total_tokens = 0;  // T over the whole group
  int64_t local_tokens = 0;  // this rank's rows
  std::vector<int64_t> cu_seqlens;  // empty when the mask came as slices
  bool causal = true;
  int64_t window = -1;
  std::vector<MaskSlice> slices;  // the mask, lowered
  // Tensors (forward: q, k, v, o, lse; backward adds d_o, dq, dk, dv).
  BoundTensor q, k, v, o, lse, d_o, dq, dk, dv;
  // True once the caller gave up (the gRPC call was cancelled); may be empty.
  std::function<bool()> cancelled;
};

}  // namespace hsap

#endif  // HSAP_SERVER_EXEC_ATTENTION_CALL_H_
