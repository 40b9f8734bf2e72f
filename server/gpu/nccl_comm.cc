#include "server/gpu/nccl_comm.h"

#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/gpu/cuda_device.h"
#include "server/gpu/gpu_status.h"
#include "server/gpu/poll_backoff.h"

namespace hsap::gpu {

ncclConfig_t NonBlockingConfig() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  return config;
}

absl::StatusOr<std::string> NcclComm::NewUniqueId() {
  ncclUniqueId id;
  HSAP_NCCL_RETURN_IF_ERROR(ncclGetUniqueId(&id));
  return std::string(id.internal, sizeof(id.internal));
}

absl::StatusOr<NcclComm> NcclComm::InitRank(absl::string_view unique_id, int nranks, int rank,
                                            int device, absl::Time deadline) {
  if (unique_id.size() != sizeof(ncclUniqueId)) {
    return absl::InvalidArgumentError(absl::StrCat("nccl unique id is ", unique_id.size(),
                                                   " bytes, expected ", sizeof(ncclUniqueId)));
  }
  if (nranks < 1) return absl::InvalidArgumentError(absl::StrCat("nranks = ", nranks, " < 1"));
  if (rank < 0 || rank >= nranks) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " is outside [0, ", nranks, ")"));
  }
  absl::StatusOr<ScopedDevice> on = ScopedDevice::Enter(device);
  if (!on.ok()) return on.status();

  ncclUniqueId id;
  std::memcpy(id.internal, unique_id.data(), sizeof(id.internal));
  ncclConfig_t config = NonBlockingConfig();
  ncclComm_t raw = nullptr;
  const ncclResult_t started = ncclCommInitRankConfig(&raw, nranks, id, rank, &config);
  // From here the (possibly half-made) communicator is owned: any return
  // below that is not OK aborts it.
  NcclComm comm(raw, device, rank, nranks);
  if (started != ncclSuccess && started != ncclInProgress) {
    comm.MarkFailed();
    return HSAP_NCCL_STATUS(started, absl::StrCat("ncclCommInitRankConfig(rank ", rank, " of ",
                                                  nranks, ", device ", device, ")"));
  }
  if (raw == nullptr) return absl::InternalError("ncclCommInitRankConfig returned no communicator");
  absl::Status ready = comm.WaitUntilReady(
      deadline, absl::StrCat("NCCL communicator init (rank ", rank, " of ", nranks, ", device ",
                             device, "; are all ranks joining with the same id?)"));
  if (!ready.ok()) {
    comm.MarkFailed();
    return ready;
  }
  return comm;
}

NcclComm::NcclComm(NcclComm&& other) noexcept
    : comm_(std::exchange(other.comm_, nullptr)),
      device_(std::exchange(other.device_, -1)),
      rank_(std::exchange(other.rank_, -1)),
      size_(std::exchange(other.size_, 0)),
      failed_(std::exchange(other.failed_, false)) {}

NcclComm& NcclComm::operator=(NcclComm&& other) noexcept {
  if (this != &other) {
    Reset();
    comm_ = std::exchange(other.comm_, nullptr);
    device_ = std::exchange(other.device_, -1);
    rank_ = std::exchange(other.rank_, -1);
    size_ = std::exchange(other.size_, 0);
    failed_ = std::exchange(other.failed_, false);
  }
  return *this;
}

NcclComm::~NcclComm() { Reset(); }

ncclResult_t NcclComm::AsyncState() const {
  ncclResult_t state = ncclSuccess;
  const ncclResult_t polled = ncclCommGetAsyncError(comm_, &state);
  return polled != ncclSuccess ? polled : state;
}

absl::Status NcclComm::WaitUntilReady(absl::Time deadline, absl::string_view what) {
  if (comm_ == nullptr) return absl::FailedPreconditionError(absl::StrCat(what, ": no communicator"));
  PollBackoff backoff;
  while (true) {
    const ncclResult_t state = AsyncState();
    if (state == ncclSuccess) return absl::OkStatus();
    if (state != ncclInProgress) {
      failed_ = true;
      return HSAP_NCCL_STATUS(state, what);
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(what, ": not complete by the deadline"));
    }
    backoff.Sleep(deadline);
  }
}

void NcclComm::Abort() {
  if (comm_ == nullptr) return;
  absl::StatusOr<ScopedDevice> on = ScopedDevice::Enter(device_);
  ncclCommAbort(comm_);  // frees it whatever it answers; nothing to do with an error here
  comm_ = nullptr;
}

ncclComm_t NcclComm::Release() { return std::exchange(comm_, nullptr); }

void NcclComm::Reset() {
  if (comm_ == nullptr) return;
  if (!failed_) {
    absl::StatusOr<ScopedDevice> on = ScopedDevice::Enter(device_);
    // Finalize flushes what was issued and waits (in NCCL's background, since
    // the communicator is non-blocking) until peers are quiescent; a peer
    // that is gone would make that wait forever, hence the timeout and the
    // abort below.
    const ncclResult_t finalized = ncclCommFinalize(comm_);
    if (finalized == ncclSuccess || finalized == ncclInProgress) {
      const absl::Status ready =
          WaitUntilReady(absl::Now() + kFinalizeTimeout, "ncclCommFinalize");
      if (ready.ok() && ncclCommDestroy(comm_) == ncclSuccess) {
        comm_ = nullptr;
        return;
      }
    }
  }
  Abort();
}

absl::StatusOr<NcclComm> SplitComm(NcclComm& parent, int color, int key, absl::Time deadline,
                                   absl::string_view what) {
  if (!parent.valid()) return absl::FailedPreconditionError(absl::StrCat(what, ": no parent communicator"));
  if (parent.failed()) {
    return absl::FailedPreconditionError(absl::StrCat(what, ": the parent communicator failed"));
  }
  absl::StatusOr<ScopedDevice> on = ScopedDevice::Enter(parent.device());
  if (!on.ok()) return on.status();
  ncclConfig_t config = NonBlockingConfig();
  ncclComm_t raw = nullptr;
  const ncclResult_t started = ncclCommSplit(parent.get(), color, key, &raw, &config);
  NcclComm child(raw, parent.device(), -1, 0);
  if (started != ncclSuccess && started != ncclInProgress) {
    child.MarkFailed();
    parent.MarkFailed();
    return HSAP_NCCL_STATUS(started, absl::StrCat("ncclCommSplit(", what, ", color ", color, ")"));
  }
  // Both sides of a non-blocking split must leave ncclInProgress before
  // either is used again.
  absl::Status ready = parent.WaitUntilReady(deadline, absl::StrCat(what, ": split (parent)"));
  if (ready.ok() && child.valid()) {
    ready = child.WaitUntilReady(deadline, absl::StrCat(what, ": split (new communicator)"));
  }
  if (!ready.ok()) {
    child.MarkFailed();
    parent.MarkFailed();
    return ready;
  }
  if (child.valid()) {
    int rank = -1, size = 0;
    HSAP_NCCL_RETURN_IF_ERROR(ncclCommUserRank(child.get(), &rank));
    HSAP_NCCL_RETURN_IF_ERROR(ncclCommCount(child.get(), &size));
    child.rank_ = rank;
    child.size_ = size;
  }
  return child;
}

absl::StatusOr<NcclHierarchy> SplitIntraInterNode(NcclComm& world,
                                                  absl::Span<const int32_t> node_of_rank,
                                                  absl::Time deadline) {
  if (!world.valid()) return absl::FailedPreconditionError("SplitIntraInterNode: no world communicator");
  if (static_cast<int>(node_of_rank.size()) != world.size()) {
    return absl::InvalidArgumentError(absl::StrCat("node_of_rank has ", node_of_rank.size(),
                                                   " entries, the world communicator ",
                                                   world.size(), " ranks"));
  }
  for (size_t r = 0; r < node_of_rank.size(); ++r) {
    if (node_of_rank[r] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("node_of_rank[", r, "] = ", node_of_rank[r], " < 0"));
    }
  }
  NcclHierarchy tiers;
  const int rank = world.rank();
  tiers.node = node_of_rank[rank];
  for (int r = 0; r < rank; ++r) tiers.local_index += node_of_rank[r] == tiers.node ? 1 : 0;

  absl::StatusOr<NcclComm> intra = SplitComm(world, tiers.node, rank, deadline, "intra-node");
  if (!intra.ok()) return intra.status();
  tiers.intra_node = std::move(*intra);
  absl::StatusOr<NcclComm> inter =
      SplitComm(world, tiers.local_index, rank, deadline, "inter-node");
  if (!inter.ok()) return inter.status();
  tiers.inter_node = std::move(*inter);
  return tiers;
}

}  // namespace hsap::gpu
