// NcclComm: a move-only owner of an NCCL communicator created NON-BLOCKING
// (ncclConfig_t.blocking = 0), so that no NCCL call can hang the daemon:
// creation, splits and every grouped operation return at once, and the
// owner polls the communicator's state (ncclCommGetAsyncError) against a
// deadline; a communicator that fails or misses a deadline is aborted.
//
//   // rank 0 (node 0 of the cluster) makes the id; the peer protocol
//   // carries its bytes (JoinResponse.nccl_unique_id):
//   HSAP_ASSIGN_OR_RETURN(std::string id, NcclComm::NewUniqueId());
//   // every rank, collectively:
//   HSAP_ASSIGN_OR_RETURN(NcclComm world,
//                         NcclComm::InitRank(id, nranks, rank, device, deadline));
//   HSAP_ASSIGN_OR_RETURN(NcclHierarchy tiers,
//                         SplitIntraInterNode(world, node_of_rank, deadline));
//
// Destruction: a healthy communicator is finalized (ncclCommFinalize, polled
// for at most kFinalizeTimeout) and destroyed; one that failed, missed a
// deadline or did not finalize in time is aborted (ncclCommAbort), which
// never waits for peers.
//
// Thread-safety: none; one thread uses an NcclComm at a time (the transport
// adds the lock that lets Abort come from another thread).
#ifndef HSAP_SERVER_GPU_NCCL_COMM_H_
#define HSAP_SERVER_GPU_NCCL_COMM_H_

#include <nccl.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace hsap::gpu {

class NcclComm {
 public:
  // How long a destructor waits for ncclCommFinalize before it aborts.
  static constexpr absl::Duration kFinalizeTimeout = absl::Seconds(10);

  // A fresh ncclUniqueId as NCCL_UNIQUE_ID_BYTES (128) bytes. NCCL opens the
  // bootstrap listener here, so only the creating rank calls it.
  static absl::StatusOr<std::string> NewUniqueId();

  // Collective over `nranks` ranks that pass the same `unique_id`: this
  // rank's communicator on `device`, non-blocking, polled until ready.
  // INVALID_ARGUMENT for an id that is not 128 bytes, nranks < 1 or a rank
  // out of [0, nranks); FAILED_PRECONDITION / INVALID_ARGUMENT as CheckDevice;
  // DEADLINE_EXCEEDED when the other ranks did not all join by `deadline`;
  // NCCL's error otherwise (two ranks on one GPU: FAILED_PRECONDITION). The
  // half-made communicator is aborted on every error.
  static absl::StatusOr<NcclComm> InitRank(absl::string_view unique_id, int nranks, int rank,
                                           int device, absl::Time deadline);

  NcclComm() = default;  // empty
  NcclComm(NcclComm&& other) noexcept;
  NcclComm& operator=(NcclComm&& other) noexcept;
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;
  ~NcclComm();

  ncclComm_t get() const { return comm_; }
  bool valid() const { return comm_ != nullptr; }
  int device() const { return device_; }
  int rank() const { return rank_; }
  int size() const { return size_; }

  // One poll of the communicator's state: ncclSuccess (idle or all work
  // enqueued), ncclInProgress, or an asynchronous error.
  // REQUIRES: valid().
  ncclResult_t AsyncState() const;

  // Polls AsyncState until it leaves ncclInProgress: OK; NCCL's error (the
  // communicator is then marked failed); DEADLINE_EXCEEDED naming `what`.
  // The caller decides whether to abort.
  absl::Status WaitUntilReady(absl::Time deadline, absl::string_view what);

  // Marks the communicator unusable: the destructor will abort it.
  void MarkFailed() { failed_ = true; }
  bool failed() const { return failed_; }

  // ncclCommAbort now (frees the communicator, ends its kernels, never waits
  // for peers); valid() is false afterwards. No-op when empty.
  void Abort();

  // Releases ownership without freeing (the caller aborts or destroys it).
  ncclComm_t Release();

 private:
  NcclComm(ncclComm_t comm, int device, int rank, int size)
      : comm_(comm), device_(device), rank_(rank), size_(size) {}
  void Reset();

  ncclComm_t comm_ = nullptr;
  int device_ = -1;
  int rank_ = -1;
  int size_ = 0;
  bool failed_ = false;

  friend absl::StatusOr<NcclComm> SplitComm(NcclComm& parent, int color, int key,
                                            absl::Time deadline, absl::string_view what);
};

// Collective over `parent`'s ranks: ncclCommSplit with `color` and `key`
// (non-blocking config), polled until the parent and the new communicator
// are ready. An empty NcclComm for NCCL_SPLIT_NOCOLOR. On error or deadline
// the new communicator is aborted and the parent marked failed (a split that
// did not complete leaves it in an unknown state).
absl::StatusOr<NcclComm> SplitComm(NcclComm& parent, int color, int key, absl::Time deadline,
                                   absl::string_view what);

// The two tiers of the hierarchy (DESIGN.md §6): the ranks of this rank's
// node, and the ranks of every node that have this rank's local index.
struct NcclHierarchy {
  NcclComm intra_node;  // color = node, key = world rank
  NcclComm inter_node;  // color = local index on the node, key = world rank
  int32_t node = 0;
  int32_t local_index = 0;
};

// Collective over `world`: both splits, one after the other. node_of_rank[r]
// is world rank r's node; INVALID_ARGUMENT unless its size is world.size()
// and every node is >= 0. Errors as SplitComm.
absl::StatusOr<NcclHierarchy> SplitIntraInterNode(NcclComm& world,
                                                  absl::Span<const int32_t> node_of_rank,
                                                  absl::Time deadline);

// ncclConfig_t for a non-blocking communicator (NCCL defaults otherwise).
ncclConfig_t NonBlockingConfig();

}  // namespace hsap::gpu

#endif  // HSAP_SERVER_GPU_NCCL_COMM_H_
