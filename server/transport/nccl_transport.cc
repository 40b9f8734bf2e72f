// NcclTransport over one non-blocking NCCL world communicator (see the
// header for the contract; docs/nccl_transport.md for the reasoning).
#include "server/transport/nccl_transport.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/optional.h"
#include "server/gpu/cuda_device.h"
#include "server/gpu/cuda_event.h"
#include "server/gpu/cuda_stream.h"
#include "server/gpu/gpu_status.h"
#include "server/gpu/nccl_comm.h"
#include "server/gpu/poll_backoff.h"
#include "server/transport/nccl_ops.h"

static_assert(sizeof(ncclUniqueId) == 128, "nccl_options.cc assumes 128-byte unique ids");
static_assert(std::is_same_v<cudaStream_t, CUstream_st*>, "nccl_transport.h's stream type");

namespace hsap::transport {

bool NcclTransportBuilt() { return true; }

absl::StatusOr<std::string> NewNcclUniqueId() { return gpu::NcclComm::NewUniqueId(); }

namespace {

// After an abort, how long Wait still waits for the exchange's kernels to
// leave the caller's buffers (ncclCommAbort stops them; this only bounds the
// wait for that to show on the stream).
constexpr absl::Duration kDrainAfterAbort = absl::Seconds(5);

class NcclTransportImpl;

class NcclPendingExchange final : public PendingExchange {
 public:
  NcclPendingExchange(NcclTransportImpl* transport, uint64_t tag, std::string peers,
                      gpu::CudaEvent done, bool needs_enqueue, bool empty,
                      const TransferCounters& bytes)
      : transport_(transport),
        tag_(tag),
        peers_(std::move(peers)),
        done_(std::move(done)),
        recorded_(!needs_enqueue),
        empty_(empty),
        bytes_(bytes) {}

  absl::Status Wait(absl::Time deadline) override;

 private:
  // One poll under the transport's lock: the exchange's outcome, or nullopt
  // while it is still running.
  absl::optional<absl::Status> PollOnce(absl::Time deadline);
  absl::Status Finish(absl::Status status);

  NcclTransportImpl* const transport_;
  const uint64_t tag_;
  const std::string peers_;  // "receives from [..], sends to [..]" for messages
  gpu::CudaEvent done_;
  bool recorded_;  // the event captures the group (it is fully enqueued)
  const bool empty_;
  const TransferCounters bytes_;  // what this exchange moves, by tier
  bool finished_ = false;
  absl::Status result_;
};

class NcclTransportImpl final : public NcclTransport {
 public:
  NcclTransportImpl(NcclTransportOptions options, gpu::CudaStream stream, gpu::NcclComm comm)
      : options_(std::move(options)), stream_(std::move(stream)), comm_(std::move(comm)) {}

  int32_t rank() const override { return options_.rank; }
  int32_t size() const override { return options_.nranks; }
  Tier TierOf(int32_t peer) const override {
    if (options_.node_of_rank.empty() || peer < 0 || peer >= options_.nranks) return Tier::kIntraNode;
    return options_.node_of_rank[peer] == options_.node_of_rank[options_.rank] ? Tier::kIntraNode
                                                                                : Tier::kInterNode;
  }
  CUstream_st* stream() const override { return stream_.get(); }
  int32_t device() const override { return options_.device; }

  absl::StatusOr<std::unique_ptr<PendingExchange>> Start(uint64_t tag,
                                                         absl::Span<const SendOp> sends,
                                                         absl::Span<const RecvOp> recvs) override;

  void Abort(const absl::Status& reason) override {
    absl::MutexLock lock(&comm_mu_);
    AbortLocked(reason.ok() ? absl::AbortedError("Abort() was called with an OK status") : reason);
  }

  absl::Status abort_status() const override {
    absl::MutexLock lock(&comm_mu_);
    return abort_status_;
  }

  TransferCounters counters() const override {
    TransferCounters c;
    for (int t = 0; t < 2; ++t) {
      c.sent_bytes[t] = sent_bytes_[t].load(std::memory_order_relaxed);
      c.received_bytes[t] = received_bytes_[t].load(std::memory_order_relaxed);
    }
    return c;
  }

 private:
  friend class NcclPendingExchange;

  // The first reason wins; ncclCommAbort ends the communicator's kernels and
  // frees it (it never waits for peers).
  void AbortLocked(const absl::Status& reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(comm_mu_) {
    if (!abort_status_.ok()) return;
    abort_status_ = reason;
    comm_.Abort();
  }

  // Aborts after a failure of this endpoint's own making (deadline, NCCL or
  // CUDA error): later Starts get ABORTED naming the cause.
  void AbortForLocked(const absl::Status& cause) ABSL_EXCLUSIVE_LOCKS_REQUIRED(comm_mu_) {
    AbortLocked(absl::AbortedError(absl::StrCat("NCCL communicator of rank ", options_.rank,
                                                " was aborted: ", cause.message())));
  }

  void Count(const TransferCounters& bytes) {
    for (int t = 0; t < 2; ++t) {
      sent_bytes_[t].fetch_add(bytes.sent_bytes[t], std::memory_order_relaxed);
      received_bytes_[t].fetch_add(bytes.received_bytes[t], std::memory_order_relaxed);
    }
  }

  std::string Where(uint64_t tag) const {
    return absl::StrCat("exchange tag ", tag, " on rank ", options_.rank, " of ", options_.nranks,
                        " (device ", options_.device, ")");
  }

  const NcclTransportOptions options_;
  // Declared before comm_: the communicator is finalized (or aborted) while
  // the stream its work ran on still exists.
  gpu::CudaStream stream_;

  mutable absl::Mutex comm_mu_;
  gpu::NcclComm comm_ ABSL_GUARDED_BY(comm_mu_);
  absl::Status abort_status_ ABSL_GUARDED_BY(comm_mu_);

  std::atomic<int64_t> sent_bytes_[2] = {0, 0};
  std::atomic<int64_t> received_bytes_[2] = {0, 0};
};

absl::StatusOr<std::unique_ptr<PendingExchange>> NcclTransportImpl::Start(
    uint64_t tag, absl::Span<const SendOp> sends, absl::Span<const RecvOp> recvs) {
  // Validation and the deterministic order (nccl_ops.h); nothing is posted
  // unless all of it passes.
  absl::StatusOr<std::vector<NcclOp>> ordered = OrderNcclOps(options_.rank, options_.nranks, sends, recvs);
  if (!ordered.ok()) {
    return absl::Status(ordered.status().code(),
                        absl::StrCat(Where(tag), ": ", ordered.status().message()));
  }
  const std::vector<NcclOp>& ops = *ordered;
  TransferCounters bytes;
  for (const NcclOp& op : ops) {
    const int tier = static_cast<int>(TierOf(op.peer));
    (op.send ? bytes.sent_bytes[tier] : bytes.received_bytes[tier]) += op.bytes;
  }
  std::string peers = DescribePeers(ops);

  absl::StatusOr<gpu::ScopedDevice> on = gpu::ScopedDevice::Enter(options_.device);
  if (!on.ok()) return on.status();
  absl::StatusOr<gpu::CudaEvent> done = gpu::CudaEvent::Create(options_.device);
  if (!done.ok()) return done.status();

  absl::MutexLock lock(&comm_mu_);
  if (!abort_status_.ok()) return abort_status_;
  const ncclResult_t state = comm_.AsyncState();
  if (state == ncclInProgress) {
    return absl::FailedPreconditionError(absl::StrCat(
        Where(tag), ": the previous exchange is still being enqueued by NCCL; Wait() for it "
                    "before starting another"));
  }
  if (state != ncclSuccess) {
    absl::Status error = HSAP_NCCL_STATUS(state, absl::StrCat(Where(tag), ": communicator"));
    AbortForLocked(error);
    return abort_status_;
  }
  if (ops.empty()) {
    return std::make_unique<NcclPendingExchange>(this, tag, std::move(peers), std::move(*done),
                                                 /*needs_enqueue=*/false, /*empty=*/true, bytes);
  }

  // --- One group for the whole exchange. ---
  absl::Status posted = HSAP_NCCL_STATUS(ncclGroupStart(), "ncclGroupStart");
  if (posted.ok()) {
    for (const NcclOp& op : ops) {
      const size_t count = static_cast<size_t>(op.bytes);
      const ncclResult_t result =
          op.send ? ncclSend(op.data, count, ncclChar, op.peer, comm_.get(), stream_.get())
                  : ncclRecv(op.data, count, ncclChar, op.peer, comm_.get(), stream_.get());
      if (result != ncclSuccess && result != ncclInProgress) {
        posted = HSAP_NCCL_STATUS(result, absl::StrCat(op.send ? "ncclSend to " : "ncclRecv from ",
                                                       op.peer, ", ", op.bytes, " bytes"));
        break;
      }
    }
    // The group is closed whatever happened inside it (NCCL's rule); with an
    // error inside, NCCL drops the group and reports the error here too.
    const ncclResult_t ended = ncclGroupEnd();
    if (posted.ok() && ended != ncclSuccess && ended != ncclInProgress) {
      posted = HSAP_NCCL_STATUS(ended, "ncclGroupEnd");
    }
    if (posted.ok() && ended == ncclSuccess) {
      // Enqueued already: capture it now. Otherwise Wait records the event
      // once the communicator leaves ncclInProgress (the group's kernels are
      // on the stream only then).
      posted = done->Record(stream_.get());
      if (posted.ok()) {
        return std::make_unique<NcclPendingExchange>(this, tag, std::move(peers),
                                                     std::move(*done), /*needs_enqueue=*/false,
                                                     /*empty=*/false, bytes);
      }
    } else if (posted.ok()) {
      return std::make_unique<NcclPendingExchange>(this, tag, std::move(peers), std::move(*done),
                                                   /*needs_enqueue=*/true, /*empty=*/false, bytes);
    }
  }
  // A group that failed half-posted may have reached some peers: the
  // communicator cannot be trusted any more.
  absl::Status failed = absl::Status(posted.code(), absl::StrCat(Where(tag), ": ", posted.message()));
  AbortForLocked(failed);
  return failed;
}

absl::Status NcclPendingExchange::Finish(absl::Status status) {
  finished_ = true;
  result_ = status;
  if (!status.ok() && recorded_) {
    // The communicator is aborted by now, which stops its kernels; wait
    // (bounded) for the stream to show it, so the caller's buffers are free
    // when Wait returns.
    gpu::PollBackoff backoff;
    const absl::Time until = absl::Now() + kDrainAfterAbort;
    while (true) {
      absl::StatusOr<bool> complete = done_.Query();
      if (!complete.ok() || *complete || absl::Now() >= until) break;
      backoff.Sleep(until);
    }
  }
  if (status.ok()) transport_->Count(bytes_);
  return status;
}

absl::Status NcclPendingExchange::Wait(absl::Time deadline) {
  if (finished_) return result_;
  absl::StatusOr<gpu::ScopedDevice> on = gpu::ScopedDevice::Enter(transport_->options_.device);
  if (!on.ok()) return Finish(on.status());
  gpu::PollBackoff backoff;
  while (true) {
    // Each poll holds the lock only for non-blocking calls, so Abort() from
    // another thread gets in between two polls; Finish (which may wait for
    // the stream after an abort) runs outside it.
    absl::optional<absl::Status> outcome = PollOnce(deadline);
    if (outcome.has_value()) return Finish(*std::move(outcome));
    backoff.Sleep(deadline);
  }
}

absl::optional<absl::Status> NcclPendingExchange::PollOnce(absl::Time deadline) {
  NcclTransportImpl* t = transport_;
  absl::MutexLock lock(&t->comm_mu_);
  if (!t->abort_status_.ok()) return t->abort_status_;
  if (empty_) return absl::OkStatus();
  const ncclResult_t state = t->comm_.AsyncState();
  if (state != ncclSuccess && state != ncclInProgress) {
    const absl::Status error = HSAP_NCCL_STATUS(state, t->Where(tag_));
    // A failed peer or network is the peer's unavailability; any other NCCL
    // failure ends the exchange as ABORTED. Either way the communicator goes
    // (NCCL: nothing can be assumed about it after an error).
    const absl::Status reported =
        error.code() == absl::StatusCode::kUnavailable
            ? absl::UnavailableError(absl::StrCat(error.message(), "; ", peers_))
            : absl::AbortedError(absl::StrCat(error.message(), "; ", peers_));
    t->AbortForLocked(reported);
    return reported;
  }
  if (!recorded_ && state == ncclSuccess) {
    const absl::Status record = done_.Record(t->stream_.get());
    if (!record.ok()) {
      const absl::Status error =
          absl::Status(record.code(), absl::StrCat(t->Where(tag_), ": ", record.message()));
      t->AbortForLocked(error);
      return error;
    }
    recorded_ = true;
  }
  if (recorded_) {
    const absl::StatusOr<bool> complete = done_.Query();
    if (!complete.ok()) {
      const absl::Status error = absl::Status(
          complete.status().code(), absl::StrCat(t->Where(tag_), ": ", complete.status().message()));
      t->AbortForLocked(error);
      return error;
    }
    if (*complete) return absl::OkStatus();
  }
  if (absl::Now() >= deadline) {
    const absl::Status late = absl::DeadlineExceededError(absl::StrCat(
        t->Where(tag_), " not complete by the deadline (",
        recorded_ ? "its kernels are still running" : "NCCL is still connecting its peers", "); ",
        peers_, "; the communicator is aborted"));
    t->AbortForLocked(late);
    return late;
  }
  return absl::nullopt;
}

}  // namespace

absl::StatusOr<std::unique_ptr<NcclTransport>> NcclTransport::Create(NcclTransportOptions options) {
  absl::Status valid = ValidateNcclTransportOptions(options);
  if (!valid.ok()) return valid;
  absl::Status device = gpu::CheckDevice(options.device);
  if (!device.ok()) return device;
  absl::StatusOr<gpu::CudaStream> stream = gpu::CudaStream::Create(options.device);
  if (!stream.ok()) return stream.status();
  absl::StatusOr<gpu::NcclComm> comm =
      gpu::NcclComm::InitRank(options.unique_id, options.nranks, options.rank, options.device,
                              options.init_deadline);
  if (!comm.ok()) return comm.status();
  return std::unique_ptr<NcclTransport>(
      new NcclTransportImpl(std::move(options), std::move(*stream), std::move(*comm)));
}

}  // namespace hsap::transport
