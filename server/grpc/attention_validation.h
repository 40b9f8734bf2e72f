// Entry-point validation of attention requests (FlashAttention's
// flash_api.cpp habit): every field of an AttentionForwardRequest or
// AttentionBackwardRequest is checked here, with overflow-safe arithmetic,
// and every tensor is bound to a pinned region.
//
// What is left to check after it depends on the plan: that this rank holds
// the tokens the plan's dispatch gives it (PlanForCall) and the plan against
// itself (exec::LayoutFor). Each error is INVALID_ARGUMENT or NOT_FOUND and
// its message names the field and the values ("k.shape[1] (Hkv) is 3 but
// Hq = 8 is not a multiple of it").
#ifndef HSAP_SERVER_GRPC_ATTENTION_VALIDATION_H_
#define HSAP_SERVER_GRPC_ATTENTION_VALIDATION_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "hsap/v1/attention.pb.h"
#include "server/exec/attention_call.h"
#include "server/shm/region_registry.h"

namespace hsap {

absl::StatusOr<AttentionCall> ValidateForward(const hsap::v1::AttentionForwardRequest& request,
                                              uint64_t session, shm::RegionRegistry* regions,
                                              const ValidationLimits& limits);

absl::StatusOr<AttentionCall> ValidateBackward(const hsap::v1::AttentionBackwardRequest& request,
                                               uint64_t session, shm::RegionRegistry* regions,
                                               const ValidationLimits& limits);

}  // namespace hsap

#endif  // HSAP_SERVER_GRPC_ATTENTION_VALIDATION_H_
