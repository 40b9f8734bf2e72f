// The in-process transport: the ranks of one group live in one process (the
// tests, a single-node daemon with CPU devices) and move bytes with memcpy
// (DESIGN.md §6).
//
// An InProcessFabric owns one Transport endpoint per rank. Ranks are placed
// on nodes of `devices_per_node` consecutive ranks, only to classify links
// into tiers for byte accounting: rank r is on node r / devices_per_node.
//
// Matching (transport.h): messages rendezvous by (tag, source, destination)
// in posting order, so the k-th send from a to b under a tag matches the
// k-th receive on b from a under that tag. The thread that posts the second
// half of a pair copies the bytes; both halves then complete. A send whose
// byte count differs from its receive's fails both exchanges with INTERNAL,
// naming both ranks and both sizes (a plan or executor bug, not a user
// error).
//
// Failure: Wait(deadline) returns DEADLINE_EXCEEDED naming the peers still
// owed; Abort(reason) on an endpoint fails its in-flight and later exchanges
// with `reason`; AbortAll(reason) does it to every endpoint, the way a real
// transport reports a lost peer to everyone. On any error, Wait withdraws
// the exchange's unmatched operations before it returns, so no peer can
// touch the caller's buffers afterwards.
//
// Byte accounting: a completed pair adds its bytes to the sender's
// sent_bytes and the receiver's received_bytes under the tier of the link.
// Self-transfers (peer == rank) are allowed and counted as intra-node (a
// copy inside the device's own node); plans never contain them (the
// executor copies a rank's own rows itself), so the counters compare with
// the plan's RankStats byte figures one to one.
//
// Thread-safety: each endpoint is driven by one thread at a time (its rank's
// worker); different endpoints run concurrently. Abort and AbortAll may be
// called from any thread. The fabric must outlive every exchange.
//
// Example:
//   HSAP_ASSIGN_OR_RETURN(auto fabric, InProcessFabric::Create(8, 4));
//   // in rank r's thread:
//   transport::Transport* t = fabric->endpoint(r);
//   HSAP_RETURN_IF_ERROR(t->Exchange(tag, sends, recvs, deadline));
#ifndef HSAP_SERVER_TRANSPORT_INPROCESS_TRANSPORT_H_
#define HSAP_SERVER_TRANSPORT_INPROCESS_TRANSPORT_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/transport/transport.h"

namespace hsap::transport {

namespace internal {
class FabricCore;
}  // namespace internal

class InProcessFabric {
 public:
  // INVALID_ARGUMENT unless num_ranks >= 1, devices_per_node >= 1 and
  // num_ranks is a multiple of devices_per_node.
  static absl::StatusOr<std::unique_ptr<InProcessFabric>> Create(int32_t num_ranks,
                                                                 int32_t devices_per_node);
  ~InProcessFabric();  // REQUIRES: no exchange in flight
  InProcessFabric(const InProcessFabric&) = delete;
  InProcessFabric& operator=(const InProcessFabric&) = delete;

  int32_t size() const;
  // The endpoint of `rank`, owned by the fabric. REQUIRES: 0 <= rank < size().
  Transport* endpoint(int32_t rank);

  // Aborts every endpoint with `reason` (as each endpoint's Abort()).
  void AbortAll(const absl::Status& reason);

 private:
  explicit InProcessFabric(std::unique_ptr<internal::FabricCore> core);
  std::unique_ptr<internal::FabricCore> core_;
  std::vector<std::unique_ptr<Transport>> endpoints_;  // endpoints_[rank]
};

}  // namespace hsap::transport

#endif  // HSAP_SERVER_TRANSPORT_INPROCESS_TRANSPORT_H_
