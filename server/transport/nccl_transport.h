// NcclTransport: the data-plane Transport (transport.h) for GPU memory over
// NCCL point-to-point operations (DESIGN.md §6). Every pointer in the
// SendOps and RecvOps given to Start is device memory on this endpoint's GPU
// (or memory NCCL can reach from it).
//
//   // node 0 of the cluster, once per epoch; the peer protocol carries the
//   // bytes to every daemon (JoinResponse.nccl_unique_id):
//   HSAP_ASSIGN_OR_RETURN(std::string id, NewNcclUniqueId());
//   // every rank (one per GPU), collectively:
//   HSAP_ASSIGN_OR_RETURN(auto t, NcclTransport::Create({
//       .unique_id = id, .nranks = 8, .rank = r, .device = r % 4,
//       .node_of_rank = {0, 0, 0, 0, 1, 1, 1, 1},
//       .init_deadline = absl::Now() + absl::Seconds(60)}));
//   HSAP_RETURN_IF_ERROR(t->Exchange(tag, sends, recvs, deadline));
//
// One world communicator per endpoint, created NON-BLOCKING (blocking = 0):
// no NCCL call blocks; completion and failures are polled
// (ncclCommGetAsyncError) against the caller's deadline.
//
// Start(tag, sends, recvs): validates, then posts the whole exchange as ONE
// ncclGroupStart/ncclGroupEnd on the endpoint's stream, in a deterministic
// order — for every peer in ascending rank order, its receives then its
// sends, each in the caller's order — and returns. Self transfers are
// ncclSend/ncclRecv to self inside the same group (NCCL supports them; one
// code path, which a one-GPU machine exercises too). Zero-byte operations
// are not posted (both halves of a pair are zero-byte, transport.h, so the
// k-th rule still holds for the rest).
//
// Why the order cannot deadlock: inside a group NCCL does not run the
// operations one after another; ncclGroupEnd hands the whole set to one
// scheduler that connects every peer and progresses all sends and receives
// concurrently. The posting order only decides which send matches which
// receive: NCCL matches the operations of one (peer, direction) in posting
// order, which is the caller's order, so transport.h's k-th-send-matches-
// k-th-receive rule holds. Ascending peer order makes the posted sequence a
// function of the plan alone (reproducible traces), not of hash or thread
// order.
//
// Wait(deadline) polls, with a short backoff: (1) the communicator until the
// group is enqueued (a non-blocking ncclGroupEnd may answer ncclInProgress
// while it connects to peers); then it records an event on the stream;
// (2) that event (cudaEventQuery) and the communicator's async error until
// the event completes. It returns:
//   * OK: every operation completed; the bytes are counted by tier;
//   * DEADLINE_EXCEEDED naming the exchange (tag), the rank and the peers
//     with operations in it: the communicator is aborted (ncclCommAbort; a
//     half-done NCCL group cannot be cancelled any other way);
//   * UNAVAILABLE (NCCL system/remote error: a peer or the network failed)
//     or ABORTED (any other NCCL error), with NCCL's message: aborted too;
//   * the Abort() reason when Abort() came first.
// After an abort the endpoint is unusable: every later Start fails with the
// abort's status (ABORTED naming the first cause). Recreate it (new id).
//
// Limits: one exchange at a time per endpoint is what the executor does and
// what NCCL's non-blocking mode wants: Start fails with FAILED_PRECONDITION
// while the previous group is still being enqueued (Wait for it first).
// NCCL cannot detect a size mismatch between a send and its receive on
// another rank (it may hang until the deadline or report an error); a
// mismatch among self transfers is caught at Start (INTERNAL, naming both).
// The send buffers must be ready before Start (work that produced them on
// another stream must have completed or be ordered before `stream()`).
//
// Thread-safety: one thread drives an endpoint (Start, Wait); Abort() and
// counters() may be called from any thread. The endpoint must outlive its
// exchanges.
#ifndef HSAP_SERVER_TRANSPORT_NCCL_TRANSPORT_H_
#define HSAP_SERVER_TRANSPORT_NCCL_TRANSPORT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "server/transport/transport.h"

// cudaStream_t without including CUDA (this header builds without it).
struct CUstream_st;

namespace hsap::transport {

struct NcclTransportOptions {
  // NCCL_UNIQUE_ID_BYTES (128) bytes from NewNcclUniqueId() on one rank,
  // identical on every rank.
  std::string unique_id;
  // The group size and this endpoint's rank in it.
  int32_t nranks = 0;
  int32_t rank = 0;
  // The CUDA device (ordinal among the visible ones) this rank runs on.
  int32_t device = 0;
  // node_of_rank[r]: the node hosting rank r, for byte accounting by tier.
  // Empty: every rank on one node. Otherwise its size is nranks, nodes >= 0.
  std::vector<int32_t> node_of_rank;
  // Communicator creation is collective: DEADLINE_EXCEEDED when not every
  // rank joined by then.
  absl::Time init_deadline = absl::InfiniteFuture();
};

// Checks `options` without touching CUDA: INVALID_ARGUMENT naming the field
// and the value for an id that is not 128 bytes, nranks < 1, a rank outside
// [0, nranks), a negative device, a node_of_rank of the wrong size or with a
// negative node.
absl::Status ValidateNcclTransportOptions(const NcclTransportOptions& options);

// A fresh NCCL unique id (128 bytes). FAILED_PRECONDITION when built without
// CUDA; NCCL's error otherwise.
absl::StatusOr<std::string> NewNcclUniqueId();

// Whether this binary has the real NCCL transport (false: built without the
// CUDA toolkit, every Create is FAILED_PRECONDITION).
bool NcclTransportBuilt();

class NcclTransport : public Transport {
 public:
  // Collective (every rank of the group calls it with the same id): the
  // endpoint of options.rank. INVALID_ARGUMENT as ValidateNcclTransportOptions
  // (checked first) or for a device that is not visible; FAILED_PRECONDITION
  // without a usable GPU ("no usable GPU: ...") or CUDA ("built without the
  // CUDA toolkit"), and when NCCL refuses the placement (two ranks on one
  // GPU); DEADLINE_EXCEEDED when the group did not form by init_deadline.
  static absl::StatusOr<std::unique_ptr<NcclTransport>> Create(NcclTransportOptions options);

  bool moves_device_memory() const override { return true; }
  // The stream every exchange of this endpoint runs on (cudaStream_t).
  virtual CUstream_st* stream() const = 0;
  virtual int32_t device() const = 0;
  // The abort status; OK while usable.
  virtual absl::Status abort_status() const = 0;
};

}  // namespace hsap::transport

#endif  // HSAP_SERVER_TRANSPORT_NCCL_TRANSPORT_H_
