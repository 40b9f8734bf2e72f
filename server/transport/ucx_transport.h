// UcxTransport: the data-plane Transport (transport.h) over UCX UCP tagged
// messages in host memory, between the hsapd daemons of a cluster.
//
//   // once per daemon:
//   HSAP_ASSIGN_OR_RETURN(auto worker, UcxWorker::Create({}));
//   ... exchange worker addresses, worker->Connect(node, address) ...
//   // once per local rank of a group (ranks 2n and 2n+1 live on node n);
//   // node 1 receives this call on comm id 3 and node 0 on 7 (comm_ids.h):
//   HSAP_ASSIGN_OR_RETURN(auto t, UcxTransport::Create(worker.get(),
//       {.recv_comm_id = 3, .send_comm_of_node = {7, 3}, .rank = 2,
//        .node_of_rank = {0, 0, 1, 1}}));
//   HSAP_RETURN_IF_ERROR(t->Exchange(tag, sends, recvs, deadline));
//
// Every message, same-node ones included, goes through UCX: ranks of one
// node share the daemon's worker and reach each other through its endpoint
// to itself (UCX's self transport, or whatever the configured transports
// offer for loopback). One code path, one set of counters; the price is a
// copy that an in-process memcpy would also pay.
//
// UCP tags: see ucx_tag.h (comm id, exchange ordinal, tag check, src, dst,
// k; full-mask receives). Receives are posted on the worker and match a
// message from any endpoint, so the comm id is the receiver's: each node
// draws its own for the call, unique among the calls alive on its worker
// (CommIdAllocator, comm_ids.h), and a send carries the id of the node it
// goes to (send_comm_of_node, learnt from the plan agreement).
//
// Wait(deadline) progresses the shared worker (ucx_worker.h: waiting threads
// drive progress) until every message of the exchange completed, or:
//   * the deadline passed: DEADLINE_EXCEEDED naming the peers still owed;
//   * a peer node's endpoint failed, or a send to it failed: UNAVAILABLE
//     naming the rank and node;
//   * Abort() was called: the abort's status;
//   * a message's size differed from its receive's: INTERNAL naming both.
// On any error the exchange's outstanding receives and sends are cancelled
// before Wait returns (see "Limits" below).
//
// Byte counters count completed messages, by tier: intra-node when the peer
// lives on this rank's node, inter-node otherwise.
//
// Limits: group size <= 4096 ranks, < 64 messages per (src, dst) pair per
// exchange, comm ids < 1024 (ucx_tag.h). UCX cannot always cancel a send
// that a slow peer has already started to fetch (rendezvous); such a send
// is released to UCX, which may read its buffer until the peer's receive
// ends or the endpoint closes. Abort() does not notify peers itself: the
// cluster layer's AbortCall does.
//
// Thread-safety: as transport.h: one thread drives an endpoint; Abort() and
// counters() from any thread. Many endpoints (rank threads) may share one
// UcxWorker concurrently.
#ifndef HSAP_SERVER_TRANSPORT_UCX_TRANSPORT_H_
#define HSAP_SERVER_TRANSPORT_UCX_TRANSPORT_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/transport/transport.h"
#include "server/transport/ucx_worker.h"

namespace hsap::transport {

struct UcxTransportOptions {
  // The communicator id this endpoint's receives match, < 1024: this node's
  // id for the call, unique among the calls alive on this worker (a
  // CommIdAllocator lease). It keeps the calls' messages apart on the worker.
  uint32_t recv_comm_id = 0;
  // send_comm_of_node[n]: the id node n receives this call on (its
  // recv_comm_id), for every node of node_of_rank; the entry of this rank's
  // node must equal recv_comm_id. Empty: SetSendComms() gives it before the
  // first Start.
  std::vector<uint32_t> send_comm_of_node;
  // This endpoint's rank in the group.
  int32_t rank = 0;
  // node_of_rank[r]: the node whose daemon hosts rank r (an index of
  // send_comm_of_node). Its size is the group size.
  std::vector<int32_t> node_of_rank;
  // endpoint_of_node[n]: the UcxWorker endpoint (its key, a peer id) that
  // reaches node n. Empty: node n's endpoint is n.
  std::vector<int32_t> endpoint_of_node;
};

class UcxTransport final : public Transport {
 public:
  // INVALID_ARGUMENT for a bad comm id (or send comm table, as
  // SetSendComms), rank, group size or node.
  // REQUIRES: `worker` outlives the transport and its exchanges.
  static absl::StatusOr<std::unique_ptr<UcxTransport>> Create(UcxWorker* worker,
                                                              UcxTransportOptions options);

  // Sets options.send_comm_of_node when Create had none (the ids are known
  // once the plan agreement ran, after the transport was made).
  // INVALID_ARGUMENT when an id is >= 1024, a node of node_of_rank has no
  // entry, or this node's entry is not recv_comm_id; FAILED_PRECONDITION
  // once Start has run or a table is already set. Called by the driving
  // thread.
  absl::Status SetSendComms(std::vector<uint32_t> send_comm_of_node);

  int32_t rank() const override { return options_.rank; }
  int32_t size() const override { return static_cast<int32_t>(options_.node_of_rank.size()); }
  Tier TierOf(int32_t peer) const override;

  // As Transport::Start. Also UNAVAILABLE / FAILED_PRECONDITION when a peer's
  // node has a failed or no endpoint, FAILED_PRECONDITION before the send
  // comm ids are set, INVALID_ARGUMENT for more than 63
  // messages to or from one peer. Every call, failing or not, advances the
  // exchange ordinal (ucx_tag.h), so ranks stay aligned as long as each
  // calls Start the same number of times.
  absl::StatusOr<std::unique_ptr<PendingExchange>> Start(uint64_t tag,
                                                         absl::Span<const SendOp> sends,
                                                         absl::Span<const RecvOp> recvs) override;

  // Fails the exchange being waited for (promptly: the waiting thread checks
  // between progress rounds) and every later Start. The first reason wins.
  void Abort(const absl::Status& reason) override;

  TransferCounters counters() const override;

  // The abort status, OK when not aborted.
  absl::Status abort_status() const;

 private:
  friend class UcxPendingExchange;
  UcxTransport(UcxWorker* worker, UcxTransportOptions options);
  int32_t NodeOf(int32_t peer) const { return options_.node_of_rank[peer]; }
  // The worker endpoint that reaches group node `node`.
  int32_t EndpointOf(int32_t node) const {
    return options_.endpoint_of_node.empty() ? node : options_.endpoint_of_node[node];
  }
  void Count(bool send, int32_t peer, int64_t bytes);
  // The checks of SetSendComms (and Create) on a table.
  static absl::Status ValidateSendComms(const UcxTransportOptions& options,
                                        const std::vector<uint32_t>& send_comm_of_node);

  UcxWorker* const worker_;
  // Only the driving thread touches these two. Declared before options_,
  // whose send_comm_of_node the constructor moves here.
  std::vector<uint32_t> send_comm_of_node_;
  uint64_t next_ordinal_ = 0;
  const UcxTransportOptions options_;

  std::atomic<bool> aborted_{false};
  mutable absl::Mutex abort_mu_;
  absl::Status abort_status_ ABSL_GUARDED_BY(abort_mu_);

  std::atomic<int64_t> sent_bytes_[2] = {0, 0};
  std::atomic<int64_t> received_bytes_[2] = {0, 0};
};

}  // namespace hsap::transport

#endif  // HSAP_SERVER_TRANSPORT_UCX_TRANSPORT_H_
