#include "server/transport/ucx_transport.h"

#include <sched.h>

#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "server/transport/ucx_status.h"
#include "server/transport/ucx_tag.h"

namespace hsap::transport {

// One posted message. `request` is null once it completed (or when UCX
// completed it in place).
struct UcxOp {
  bool send = false;
  int32_t peer = 0;
  int32_t node = 0;
  int64_t bytes = 0;
  void* request = nullptr;
  ucp_tag_recv_info_t info = {};  // receives: what arrived
};

class UcxPendingExchange final : public PendingExchange {
 public:
  UcxPendingExchange(UcxTransport* transport, uint64_t tag) : transport_(transport), tag_(tag) {}
  ~UcxPendingExchange() override {
    // Normally empty: Wait() settles every request. A caller that drops an
    // exchange without waiting gets its requests cancelled here.
    if (outstanding_ > 0) {
      absl::MutexLock lock(&transport_->worker_->mu());
      CancelLocked();
    }
  }

  absl::Status Wait(absl::Time deadline) override;
  void Progress() override;

  // Posts one message. REQUIRES the worker's mutex.
  absl::Status PostLocked(bool send, int32_t peer, void* data, int64_t bytes, uint64_t ucp_tag);
  void CancelLocked();

 private:
  // Polls every outstanding request; returns the first failure.
  absl::Status PollLocked();
  // The endpoint failures of nodes still owed a message.
  absl::Status NodeFailuresLocked() const;
  std::string Owed() const;
  std::string Describe(const UcxOp& op) const;

  UcxTransport* const transport_;
  const uint64_t tag_;
  std::vector<UcxOp> ops_;
  int outstanding_ = 0;
  absl::Status progress_failure_;  // the first failure Progress() found
};

std::string UcxPendingExchange::Describe(const UcxOp& op) const {
  return absl::StrCat(op.send ? "send to rank " : "receive from rank ", op.peer, " (node ",
                      op.node, ", ", op.bytes, " B)");
}

std::string UcxPendingExchange::Owed() const {
  std::vector<std::string> owed;
  for (const UcxOp& op : ops_) {
    if (op.request != nullptr) owed.push_back(Describe(op));
  }
  return absl::StrJoin(owed, ", ");
}

absl::Status UcxPendingExchange::PostLocked(bool send, int32_t peer, void* data, int64_t bytes,
                                            uint64_t ucp_tag) {
  UcxOp op;
  op.send = send;
  op.peer = peer;
  op.node = transport_->EndpointOf(transport_->NodeOf(peer));
  op.bytes = bytes;
  UcxWorker* worker = transport_->worker_;
  ucp_request_param_t params = {};
  ucs_status_ptr_t request;
  if (send) {
    HSAP_ASSIGN_OR_RETURN(ucp_ep_h ep, worker->EndpointLocked(op.node));
    request = ucp_tag_send_nbx(ep, data, static_cast<size_t>(bytes), ucp_tag, &params);
  } else {
    HSAP_RETURN_IF_ERROR(worker->NodeStatusLocked(op.node));
    // Always a request (NO_IMM_CMPL): its completion is read in one place,
    // PollLocked. RECV_INFO still covers an in-place completion.
    params.op_attr_mask = UCP_OP_ATTR_FLAG_NO_IMM_CMPL | UCP_OP_ATTR_FIELD_RECV_INFO;
    params.recv_info.tag_info = &op.info;
    request = ucp_tag_recv_nbx(worker->handle(), data, static_cast<size_t>(bytes), ucp_tag,
                               ucx_tag::kFullMask, &params);
  }
  if (UCS_PTR_IS_ERR(request)) {
    return HSAP_UCX_STATUS(UCS_PTR_STATUS(request),
                           absl::StrCat("rank ", transport_->rank(), ": posting ", Describe(op)));
  }
  if (request == nullptr) {  // completed in place
    if (!send && static_cast<int64_t>(op.info.length) != bytes) {
      return absl::InternalError(absl::StrCat("rank ", transport_->rank(), ": ", Describe(op),
                                              " got ", op.info.length, " B (UCP tag 0x",
                                              absl::Hex(op.info.sender_tag), " posted 0x", absl::Hex(ucp_tag), ")"));
    }
    transport_->Count(send, peer, bytes);
  } else {
    op.request = request;
    ++outstanding_;
  }
  ops_.push_back(op);
  return absl::OkStatus();
}

absl::Status UcxPendingExchange::PollLocked() {
  absl::Status first;
  for (UcxOp& op : ops_) {
    if (op.request == nullptr) continue;
    const ucs_status_t status = op.send ? ucp_request_check_status(op.request)
                                        : ucp_tag_recv_request_test(op.request, &op.info);
    if (status == UCS_INPROGRESS) continue;
    ucp_request_free(op.request);
    op.request = nullptr;
    --outstanding_;
    if (status != UCS_OK) {
      if (first.ok() && status == UCS_ERR_CANCELED) {
        // This exchange cancels nothing before it has failed, so a request
        // cancelled under it means its endpoint was closed: the peer node
        // was lost (the cluster layer closes the endpoint of a DOWN node).
        first = absl::UnavailableError(absl::StrCat(
            "rank ", transport_->rank(), ": ", Describe(op),
            " was cancelled: the connection to its node closed (node lost)"));
      } else if (first.ok()) {
        first = HSAP_UCX_STATUS(status, absl::StrCat("rank ", transport_->rank(), ": ",
                                                     Describe(op), " failed"));
      }
      continue;
    }
    if (!op.send && static_cast<int64_t>(op.info.length) != op.bytes) {
      if (first.ok()) {
        first = absl::InternalError(absl::StrCat("rank ", transport_->rank(), ": ", Describe(op),
                                                 " got ", op.info.length, " B (UCP tag 0x",
                                                 absl::Hex(op.info.sender_tag),
                                                 "): the ranks disagree on the message size"));
      }
      continue;
    }
    transport_->Count(op.send, op.peer, op.bytes);
  }
  return first;
}

absl::Status UcxPendingExchange::NodeFailuresLocked() const {
  for (const UcxOp& op : ops_) {
    if (op.request == nullptr) continue;
    absl::Status node = transport_->worker_->NodeStatusLocked(op.node);
    if (!node.ok()) {
      return absl::UnavailableError(absl::StrCat("rank ", transport_->rank(), ": ", Describe(op),
                                                 " cannot complete: ", node.message()));
    }
  }
  return absl::OkStatus();
}

void UcxPendingExchange::CancelLocked() {
  UcxWorker* worker = transport_->worker_;
  for (UcxOp& op : ops_) {
    if (op.request != nullptr) ucp_request_cancel(worker->handle(), op.request);
  }
  // Cancellation completes through progress; bounded, since a rendezvous
  // send whose data the peer is fetching cannot always be cancelled.
  const absl::Time give_up = absl::Now() + absl::Milliseconds(200);
  while (outstanding_ > 0 && absl::Now() < give_up) {
    worker->ProgressLocked();
    PollLocked().IgnoreError();
  }
  for (UcxOp& op : ops_) {
    if (op.request == nullptr) continue;
    ucp_request_free(op.request);  // UCX releases it when it ends
    op.request = nullptr;
    --outstanding_;
  }
}

void UcxPendingExchange::Progress() {
  // A try: a rank thread between its kernel waves must not wait for
  // another's progress (that one is moving the same worker's data anyway).
  absl::Mutex& mu = transport_->worker_->mu();
  if (!mu.TryLock()) return;
  transport_->worker_->ProgressLocked();
  // Completed requests are settled (and counted) now; a failure waits for
  // Wait to report it.
  absl::Status failure = PollLocked();
  if (progress_failure_.ok()) progress_failure_ = std::move(failure);
  mu.Unlock();
}

absl::Status UcxPendingExchange::Wait(absl::Time deadline) {
  UcxWorker* worker = transport_->worker_;
  int idle_rounds = 0;
  while (true) {
    absl::Status failure;
    {
      absl::MutexLock lock(&worker->mu());
      const unsigned events = worker->ProgressLocked();
      failure = PollLocked();
      if (failure.ok()) failure = progress_failure_;
      if (failure.ok() && outstanding_ == 0) return absl::OkStatus();
      if (failure.ok()) failure = NodeFailuresLocked();
      if (failure.ok() && transport_->aborted_.load(std::memory_order_acquire)) {
        failure = transport_->abort_status();
      }
      if (failure.ok() && absl::Now() >= deadline) {
        failure = absl::DeadlineExceededError(
            absl::StrCat("rank ", transport_->rank(), ": exchange with tag ", tag_,
                         " passed its deadline; still owed: ", Owed()));
      }
      if (!failure.ok()) {
        CancelLocked();
        return failure;
      }
      idle_rounds = events > 0 ? 0 : idle_rounds + 1;
    }
    // Nothing happened: let the other rank threads (and the peer process on
    // this node's cores) run, then back off to short sleeps so an idle wait
    // for a slow peer does not burn a core.
    if (idle_rounds > 0) {
      if (idle_rounds < 64) {
        sched_yield();
      } else {
        absl::SleepFor(absl::Microseconds(idle_rounds < 1024 ? 10 : 100));
      }
    }
  }
}

UcxTransport::UcxTransport(UcxWorker* worker, UcxTransportOptions options)
    : worker_(worker),
      send_comm_of_node_(std::move(options.send_comm_of_node)),
      options_(std::move(options)) {}

absl::Status UcxTransport::ValidateSendComms(const UcxTransportOptions& options,
                                             const std::vector<uint32_t>& send_comm_of_node) {
  const int64_t nodes = static_cast<int64_t>(send_comm_of_node.size());
  for (int64_t n = 0; n < nodes; ++n) {
    if (send_comm_of_node[n] >= ucx_tag::kMaxComms) {
      return absl::InvalidArgumentError(absl::StrCat("send_comm_of_node[", n, "] = ",
                                                     send_comm_of_node[n], " must be < ",
                                                     ucx_tag::kMaxComms));
    }
  }
  for (size_t r = 0; r < options.node_of_rank.size(); ++r) {
    if (options.node_of_rank[r] >= nodes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "send_comm_of_node has ", nodes, " entries but rank ", r, " lives on node ",
          options.node_of_rank[r]));
    }
  }
  const int32_t self = options.node_of_rank[options.rank];
  if (send_comm_of_node[self] != options.recv_comm_id) {
    return absl::InvalidArgumentError(absl::StrCat(
        "send_comm_of_node[", self, "] = ", send_comm_of_node[self],
        " is this rank's own node, whose receives use recv_comm_id ", options.recv_comm_id));
  }
  return absl::OkStatus();
}

absl::Status UcxTransport::SetSendComms(std::vector<uint32_t> send_comm_of_node) {
  if (next_ordinal_ > 0 || !send_comm_of_node_.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", rank(), ": send comm ids must be set once, before the first exchange"));
  }
  HSAP_RETURN_IF_ERROR(ValidateSendComms(options_, send_comm_of_node));
  send_comm_of_node_ = std::move(send_comm_of_node);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<UcxTransport>> UcxTransport::Create(UcxWorker* worker,
                                                                   UcxTransportOptions options) {
  const int64_t size = static_cast<int64_t>(options.node_of_rank.size());
  if (worker == nullptr) return absl::InvalidArgumentError("UcxTransport needs a UcxWorker");
  if (options.recv_comm_id >= ucx_tag::kMaxComms) {
    return absl::InvalidArgumentError(absl::StrCat("recv_comm_id ", options.recv_comm_id,
                                                   " must be < ", ucx_tag::kMaxComms));
  }
  if (size < 1 || size > ucx_tag::kMaxRanks) {
    return absl::InvalidArgumentError(absl::StrCat("group size ", size, " must be in [1, ",
                                                   ucx_tag::kMaxRanks, "]"));
  }
  if (options.rank < 0 || options.rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", options.rank, " outside the group of ", size));
  }
  for (int64_t r = 0; r < size; ++r) {
    if (options.node_of_rank[r] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("node_of_rank[", r, "] = ", options.node_of_rank[r], " is negative"));
    }
  }
  if (!options.endpoint_of_node.empty()) {
    for (int64_t r = 0; r < size; ++r) {
      if (options.node_of_rank[r] >= static_cast<int64_t>(options.endpoint_of_node.size())) {
        return absl::InvalidArgumentError(absl::StrCat(
            "endpoint_of_node has ", options.endpoint_of_node.size(), " entries but rank ", r,
            " lives on node ", options.node_of_rank[r]));
      }
    }
  }
  if (!options.send_comm_of_node.empty()) {
    HSAP_RETURN_IF_ERROR(ValidateSendComms(options, options.send_comm_of_node));
  }
  return std::unique_ptr<UcxTransport>(new UcxTransport(worker, std::move(options)));
}

Tier UcxTransport::TierOf(int32_t peer) const {
  return NodeOf(peer) == NodeOf(options_.rank) ? Tier::kIntraNode : Tier::kInterNode;
}

void UcxTransport::Count(bool send, int32_t peer, int64_t bytes) {
  const int tier = static_cast<int>(TierOf(peer));
  (send ? sent_bytes_ : received_bytes_)[tier].fetch_add(bytes, std::memory_order_relaxed);
}

TransferCounters UcxTransport::counters() const {
  TransferCounters c;
  for (int t = 0; t < 2; ++t) {
    c.sent_bytes[t] = sent_bytes_[t].load(std::memory_order_relaxed);
    c.received_bytes[t] = received_bytes_[t].load(std::memory_order_relaxed);
  }
  return c;
}

void UcxTransport::Abort(const absl::Status& reason) {
  absl::MutexLock lock(&abort_mu_);
  if (aborted_.load()) return;
  abort_status_ = reason.ok() ? absl::AbortedError("transport aborted") : reason;
  aborted_.store(true, std::memory_order_release);
}

absl::Status UcxTransport::abort_status() const {
  absl::MutexLock lock(&abort_mu_);
  return abort_status_;
}

absl::StatusOr<std::unique_ptr<PendingExchange>> UcxTransport::Start(
    uint64_t tag, absl::Span<const SendOp> sends, absl::Span<const RecvOp> recvs) {
  const uint64_t ordinal = next_ordinal_++;
  if (aborted_.load(std::memory_order_acquire)) return abort_status();
  if (send_comm_of_node_.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", rank(), ": the send comm ids of the call are not set (SetSendComms)"));
  }
  const int32_t n = size();
  // k of each message: its index among the messages of its pair.
  absl::flat_hash_map<int32_t, int32_t> sends_to, recvs_from;
  auto check = [&](const char* what, size_t i, int32_t peer, const void* data, int64_t bytes,
                   absl::flat_hash_map<int32_t, int32_t>& count) -> absl::Status {
    if (peer < 0 || peer >= n) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, "[", i, "].peer = ", peer, " outside the group of ", n));
    }
    if (bytes < 0) {
      return absl::InvalidArgumentError(absl::StrCat(what, "[", i, "].bytes = ", bytes));
    }
    if (bytes > 0 && data == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, "[", i, "].data is null for ", bytes, " bytes"));
    }
    if (++count[peer] > ucx_tag::kMaxMessagesPerPair) {
      return absl::InvalidArgumentError(absl::StrCat("more than ", ucx_tag::kMaxMessagesPerPair,
                                                     " messages with peer ", peer,
                                                     " in one exchange"));
    }
    return absl::OkStatus();
  };
  for (size_t i = 0; i < sends.size(); ++i) {
    HSAP_RETURN_IF_ERROR(check("sends", i, sends[i].peer, sends[i].data, sends[i].bytes, sends_to));
  }
  for (size_t i = 0; i < recvs.size(); ++i) {
    HSAP_RETURN_IF_ERROR(check("recvs", i, recvs[i].peer, recvs[i].data, recvs[i].bytes, recvs_from));
  }

  auto pending = std::make_unique<UcxPendingExchange>(this, tag);
  absl::MutexLock lock(&worker_->mu());
  absl::Status posted;
  // Receives first, so that sends (to self especially) find them posted
  // rather than landing in UCX's unexpected queue.
  recvs_from.clear();
  for (const RecvOp& r : recvs) {
    const int32_t k = recvs_from[r.peer]++;
    posted = pending->PostLocked(false, r.peer, r.data, r.bytes,
                                 ucx_tag::Encode(options_.recv_comm_id, ordinal, tag, r.peer, rank(), k));
    if (!posted.ok()) break;
  }
  sends_to.clear();
  for (size_t i = 0; posted.ok() && i < sends.size(); ++i) {
    const SendOp& s = sends[i];
    const int32_t k = sends_to[s.peer]++;
    const uint32_t comm = send_comm_of_node_[NodeOf(s.peer)];  // the receiver's id
    posted = pending->PostLocked(true, s.peer, const_cast<void*>(s.data), s.bytes,
                                 ucx_tag::Encode(comm, ordinal, tag, rank(), s.peer, k));
  }
  if (!posted.ok()) {
    pending->CancelLocked();
    return posted;
  }
  return std::unique_ptr<PendingExchange>(std::move(pending));
}

}  // namespace hsap::transport
