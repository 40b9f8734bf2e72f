// The posting order of one NCCL exchange, as plain data (CUDA-free, so the
// rule is tested on machines without a GPU; nccl_transport.cc posts exactly
// this list between ncclGroupStart and ncclGroupEnd).
//
// Order: peers ascending; for each peer its receives, then its sends, each
// in the caller's order. Zero-byte operations are dropped (both halves of a
// pair have the same size, transport.h, so the k-th rule holds for the
// rest). Why this cannot deadlock inside one group, and why it keeps the
// matching rule: nccl_transport.h.
#ifndef HSAP_SERVER_TRANSPORT_NCCL_OPS_H_
#define HSAP_SERVER_TRANSPORT_NCCL_OPS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "server/transport/transport.h"

namespace hsap::transport {

struct NcclOp {
  bool send = false;     // ncclSend when true, ncclRecv otherwise
  int32_t peer = 0;
  void* data = nullptr;  // a send's buffer is only read
  int64_t bytes = 0;     // > 0
};

// The ordered operations of `rank`'s part of an exchange in a group of
// `nranks`. INVALID_ARGUMENT naming the operation for a peer outside the
// group, a negative size or a null buffer with bytes > 0; INTERNAL when the
// sends to self do not pair one to one, size for size, with the receives
// from self (NCCL would hang on them).
absl::StatusOr<std::vector<NcclOp>> OrderNcclOps(int32_t rank, int32_t nranks,
                                                 absl::Span<const SendOp> sends,
                                                 absl::Span<const RecvOp> recvs);

// "receives from [1, 3], sends to [1, 2]" (each peer once), for messages.
std::string DescribePeers(absl::Span<const NcclOp> ops);

}  // namespace hsap::transport

#endif  // HSAP_SERVER_TRANSPORT_NCCL_OPS_H_
