// Entry-point validation of attention requests (FlashAttention's
// flash_api.cpp habit): every field of an AttentionForwardRequest or
// AttentionBackwardRequest is checked here, with overflow-safe arithmetic,
// and every tensor is bound to a pinned region.
//
// Validation is total: a call that passes runs without further checks. Each
// error is INVALID_ARGUMENT / NOT_FOUND / UNIMPLEMENTED and its message names
// the field and the values ("k.shape[1] (Hkv) is 3 but Hq = 8 is not a
// multiple of it").
#ifndef HSAP_SERVER_GRPC_ATTENTION_VALIDATION_H_
#define HSAP_SERVER_GRPC_ATTENTION_VALIDATION_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "hsap/v1/attention.pb.h"
#include "server/exec/attention_call.h"
#include "server/shm/region_registry.h"

namespace hsap {

struct ValidationLimits {
  int32_t max_group_size = 1;  // ranks this deployment can serve
  int64_t max_tokens = int64_t{1} << 31;
  int64_t max_slices = 1 << 22;
  int max_heads = 1024;
};

absl::StatusOr<AttentionCall> ValidateForward(const hsap::v1::AttentionForwardRequest& request,
                                              uint64_t session, shm::RegionRegistry* regions,
                                              const ValidationLimits& limits);

absl::StatusOr<AttentionCall> ValidateBackward(const hsap::v1::AttentionBackwardRequest& request,
                                               uint64_t session, shm::RegionRegistry* regions,
                                               const ValidationLimits& limits);

}  // namespace hsap

#endif  // HSAP_SERVER_GRPC_ATTENTION_VALIDATION_H_
