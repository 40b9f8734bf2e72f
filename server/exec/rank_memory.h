// The memory of one rank's run: every buffer its layout (rank_layout.h)
// calls for, allocated from the compute backend, and the views the stage
// loop reads and writes through. Internal to the executor.
//
// Local views are the rank's own tensors in memory the backend's kernels can
// address: the client's buffers themselves when the backend addresses host
// memory (the CPU), else backend copies that Upload() fills from the client
// and Download() copies back (kCopy row copies only).
#ifndef HSAP_SERVER_EXEC_RANK_MEMORY_H_
#define HSAP_SERVER_EXEC_RANK_MEMORY_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "server/exec/compute_backend.h"
#include "server/exec/pack.h"
#include "server/exec/rank_layout.h"

namespace hsap::exec {

// Rows of dtype elements; head 0 of the view is the first head it holds.
struct RowsView {
  char* base = nullptr;
  int64_t stride = 0;  // elements per row
};

// K and V rows sharing one row stride (separate tensors, or interleaved
// rows: K heads then V heads).
struct KvView {
  RowsView k, v;
};

// The rank's own tensors (RankBuffers), in backend-addressable memory.
struct LocalViews {
  char* q = nullptr;
  char* k = nullptr;
  char* v = nullptr;
  char* o = nullptr;
  float* lse = nullptr;  // [Hq, local_rows]
  char* d_o = nullptr;
  char* dq = nullptr;
  char* dk = nullptr;
  char* dv = nullptr;
};

class RankMemory {
 public:
  // Allocates what `layout` needs on `backend`. RESOURCE_EXHAUSTED from the
  // backend when memory is short.
  static absl::StatusOr<RankMemory> Allocate(const RankLayout& layout, const RankBuffers& client,
                                             ComputeBackend* backend);
  // The bytes Allocate takes for `layout`, without allocating (admission
  // control, memory_budget.h). `staged`: the backend cannot address host
  // memory, so the rank's own tensors are copied in.
  static int64_t BytesFor(const RankLayout& layout, bool staged);
  RankMemory(RankMemory&&) = default;
  RankMemory& operator=(RankMemory&&) = default;

  // Client inputs into the local views (forward: q, k, v; backward: q, k,
  // v, o, lse, d_o); nothing when the local views are the client's buffers.
  absl::Status Upload(ComputeBackend* backend) const;
  // Local outputs back to the client (forward: o, lse; backward: dq, dk, dv).
  absl::Status Download(ComputeBackend* backend) const;

  LocalViews local;
  // Home rows (views onto the local ones when U == 1).
  RowsView q_home, o_home, do_home;
  KvView kv_home;
  float* lse_home = nullptr;  // [nq, lse_stride]
  int64_t lse_stride = 0;
  float* delta = nullptr;     // backward: [nq, lse_stride]
  // Receive side and staging.
  KvView kv_recv;
  char* return_buf = nullptr;
  char* send_staging = nullptr;
  char* recv_staging = nullptr;
  int64_t recv_buffer_bytes = 0;  // K/V receive buffer + returned dK/dV buffer
  // fp32 accumulators.
  GroupedAcc o_acc, dq_acc, dk_home, dv_home, dk_recv, dv_recv;
  float* local_dk = nullptr;  // U > 1, backward: [T_local, Hkv, D] fp32
  float* local_dv = nullptr;

 private:
  RankMemory() = default;
  // Allocates `bytes` and keeps the buffer for the run.
  absl::StatusOr<char*> Take(ComputeBackend* backend, int64_t bytes);

  const RankLayout* layout_ = nullptr;
  RankBuffers client_;
  bool staged_ = false;  // local views are backend copies
  std::vector<BackendBuffer> owned_;
  int64_t taken_ = 0;  // bytes allocated (equals BytesFor: tested)

 public:
  int64_t bytes_taken() const { return taken_; }
};

}  // namespace hsap::exec

#endif  // HSAP_SERVER_EXEC_RANK_MEMORY_H_
