// The data plane's one small interface (DESIGN.md §6): grouped point-to-point
// transfers of byte ranges between the ranks of one group, with a deadline,
// and abort. Implementations: in-process (ranks of one daemon, memcpy), UCX
// (host memory between daemons), NCCL (GPU memory). NCCL's model is the
// model here: NCCL's transport.h is a small table of operations too.
//
// Matching rule (the one that prevents the hangs users report in grouped
// point-to-point): within one Exchange, the k-th send from rank a to rank b
// matches the k-th receive on b from a, and both carry the same byte count.
// Every rank of the group calls Exchange for the same `tag` sequence; a tag
// is unique per (call, stage, phase) and is what keeps two calls or two
// stages from ever mixing their messages.
//
// Thread-safety: one thread drives a Transport endpoint at a time; Abort()
// may be called from any thread.
#ifndef HSAP_SERVER_TRANSPORT_TRANSPORT_H_
#define HSAP_SERVER_TRANSPORT_TRANSPORT_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace hsap::transport {

// Link tiers, for byte accounting (matches plan::LinkTier).
enum class Tier : uint8_t { kIntraNode = 0, kInterNode = 1 };

struct SendOp {
  int32_t peer = 0;
  const void* data = nullptr;
  int64_t bytes = 0;
};

struct RecvOp {
  int32_t peer = 0;
  void* data = nullptr;
  int64_t bytes = 0;
};

// A grouped exchange that has been posted and may still be in flight. The
// caller may compute on other memory meanwhile; the send buffers must stay
// valid and the receive buffers untouched until Wait() returns.
class PendingExchange {
 public:
  virtual ~PendingExchange() = default;  // REQUIRES: Wait() returned
  // Blocks until every send and receive of the exchange completed (OK),
  // the deadline passed (DEADLINE_EXCEEDED, naming the peers still owed),
  // or the endpoint was aborted (the abort's status, usually ABORTED or
  // UNAVAILABLE). After an error the exchange's buffers may be partially
  // written.
  virtual absl::Status Wait(absl::Time deadline) = 0;
  // Advances the exchange's transfers without blocking, for a caller that
  // computes while they are in flight (the executor, between kernel waves):
  // a transport that moves data only while driven (UCX) makes progress
  // here, so transfers overlap the compute instead of waiting for Wait.
  // Transfers that complete here are counted (counters()) at once. Returns
  // at once when another thread is driving the transport; reports nothing
  // (a failure found here is Wait's answer). Only the thread that started
  // the exchange calls it.
  virtual void Progress() {}
};

// Bytes this endpoint moved, by tier (what the transport itself counted).
struct TransferCounters {
  int64_t sent_bytes[2] = {0, 0};
  int64_t received_bytes[2] = {0, 0};
};

// One rank's endpoint into its group.
class Transport {
 public:
  virtual ~Transport() = default;

  virtual int32_t rank() const = 0;
  virtual int32_t size() const = 0;
  // Tier of the link to `peer` (intra-node or inter-node).
  virtual Tier TierOf(int32_t peer) const = 0;

  // Posts `sends` and `recvs` as one group (sends and receives with self are
  // allowed and are a copy). Returns at once; INVALID_ARGUMENT for a bad
  // peer or a negative size, the abort status after Abort().
  virtual absl::StatusOr<std::unique_ptr<PendingExchange>> Start(uint64_t tag,
                                                                 absl::Span<const SendOp> sends,
                                                                 absl::Span<const RecvOp> recvs) = 0;

  // Start + Wait.
  absl::Status Exchange(uint64_t tag, absl::Span<const SendOp> sends,
                        absl::Span<const RecvOp> recvs, absl::Time deadline) {
    auto pending = Start(tag, sends, recvs);
    if (!pending.ok()) return pending.status();
    return (*pending)->Wait(deadline);
  }

  // Fails every exchange in flight and every later one with `reason`
  // (on this endpoint; implementations also tell the peers where they can).
  virtual void Abort(const absl::Status& reason) = 0;

  virtual TransferCounters counters() const = 0;

  // Whether sends and receives may name device (GPU) memory (NCCL); the
  // others move host memory only.
  virtual bool moves_device_memory() const { return false; }
};

}  // namespace hsap::transport

#endif  // HSAP_SERVER_TRANSPORT_TRANSPORT_H_
