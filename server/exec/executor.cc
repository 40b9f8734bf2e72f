#include "server/exec/executor.h"

#include <algorithm>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/mask.h"
#include "common/status_macros.h"
#include "server/exec/rank_memory.h"
#include "server/exec/row_copies.h"
#include "server/plan/wire_layout.h"

namespace hsap::exec {
namespace {

using plan::Payload;
using plan::RowSpace;
using plan::SharedList;
using plan::Stage;
using plan::Transfer;
using plan::WorkItem;

// One rank's run of one pass: the stage loop over a validated layout.
class RankRun {
 public:
  RankRun(const RankLayout& layout, RankMemory memory, transport::Transport* transport,
          ComputeBackend* backend, absl::Time deadline, uint64_t call_tag,
          std::function<bool()> cancelled)
      : l_(layout),
        m_(std::move(memory)),
        transport_(transport),
        backend_(backend),
        deadline_(deadline),
        call_tag_(call_tag),
        stop_{deadline, std::move(cancelled)} {}

  absl::Status Run(ExecStats* stats);

 private:
  char* Row(const RowsView& v, int64_t row, int64_t head) const {
    return v.base + (row * v.stride + head * l_.shape.head_dim) * l_.elem_bytes;
  }
  // One grouped exchange: packs `sends`, posts them with `recvs`, runs
  // `overlap`, waits, lands what did not arrive in place.
  absl::Status Exchange(uint64_t tag, const plan::TransferList& sends,
                        const plan::TransferList& recvs,
                        const std::function<absl::Status()>& overlap);
  // A rank's own rows in a head all-to-all: pack as if sent, unpack as if
  // received (to_home: local rows -> home rows, else home -> local).
  absl::Status SelfCopy(Payload payload, bool to_home);
  absl::Status RunForwardItems(const SharedList<WorkItem>& items);
  absl::Status RunBackwardItems(const SharedList<WorkItem>& items);
  absl::Status ComputeDelta();
  absl::Status ZeroReceivedGradients(const plan::TransferList& recvs);
  absl::Status RunStages();
  absl::Status FinishForward();
  absl::Status FinishBackward();

  const RankLayout& l_;
  RankMemory m_;
  transport::Transport* const transport_;
  ComputeBackend* const backend_;
  const absl::Time deadline_;
  const uint64_t call_tag_;
  StopCheck stop_;  // the kernels give up on it between blocks
  ExecStats stats_;
  std::vector<RowCopy> copies_;  // scratch
};

absl::Status RankRun::SelfCopy(Payload payload, bool to_home) {
  if (l_.num_q_heads == 0 || l_.local_rows == 0) return absl::OkStatus();
  Transfer from, to;
  from.payload = to.payload = payload;
  for (Transfer* t : {&from, &to}) {
    t->q_head_begin = l_.q_head_begin;
    t->q_head_end = l_.q_head_end;
    t->kv_head_begin = l_.kv_head_begin;
    t->kv_head_end = l_.kv_head_end;
  }
  from.segments.push_back({0, l_.local_rows, to_home ? 0 : l_.own_home_row});
  to.segments.push_back({0, l_.local_rows, to_home ? l_.own_home_row : 0});
  const int64_t row_bytes = plan::PayloadRowBytes(payload, l_.num_q_heads, l_.num_kv_heads,
                                                  l_.shape.head_dim, l_.shape.dtype);
  HSAP_ASSIGN_OR_RETURN(BackendBuffer tmp, backend_->Allocate(l_.local_rows * row_bytes));
  copies_.clear();
  AppendTransferCopies(l_, m_, from, /*pack=*/true, tmp.data(), &copies_);
  HSAP_RETURN_IF_ERROR(backend_->Copy(copies_));
  copies_.clear();
  AppendTransferCopies(l_, m_, to, /*pack=*/false, tmp.data(), &copies_);
  HSAP_RETURN_IF_ERROR(backend_->Copy(copies_));
  // tmp is released when this returns: queued copies must be done first.
  return backend_->Synchronize();
}

absl::Status RankRun::Exchange(uint64_t tag, const plan::TransferList& sends,
                               const plan::TransferList& recvs,
                               const std::function<absl::Status()>& overlap) {
  std::vector<transport::SendOp> send_ops;
  std::vector<transport::RecvOp> recv_ops;
  std::vector<std::pair<const Transfer*, char*>> landed;
  int64_t offset = 0;
  copies_.clear();
  for (const Transfer& t : sends) {
    char* dst = m_.send_staging + offset;
    AppendTransferCopies(l_, m_, t, /*pack=*/true, dst, &copies_);
    send_ops.push_back({t.peer, dst, t.bytes});
    offset += t.bytes;
  }
  HSAP_RETURN_IF_ERROR(backend_->Copy(copies_));
  // The transport reads the staging buffer from the host side.
  if (!sends.empty()) HSAP_RETURN_IF_ERROR(backend_->Synchronize());
  offset = 0;
  for (const Transfer& t : recvs) {
    char* dst;
    if (t.payload == Payload::kKv) {
      dst = m_.kv_recv.k.base + t.buffer_offset;
    } else if (t.payload == Payload::kGradKv) {
      dst = m_.return_buf + t.buffer_offset;
      landed.push_back({&t, dst});
    } else {
      dst = m_.recv_staging + offset;
      offset += t.bytes;
      landed.push_back({&t, dst});
    }
    recv_ops.push_back({t.peer, dst, t.bytes});
  }
  // Every rank calls Start for every (stage, phase), even with nothing to
  // move: transports that number exchanges (UCX) stay aligned that way.
  HSAP_ASSIGN_OR_RETURN(std::unique_ptr<transport::PendingExchange> pending,
                        transport_->Start(tag, send_ops, recv_ops));
  // The kernels advance the transfers between their waves (UCX moves data
  // only while driven), so the overlap items compute while they fly.
  stop_.between_waves = [p = pending.get()] { p->Progress(); };
  absl::Status overlapped = overlap();
  stop_.between_waves = nullptr;
  const absl::Time wait_start = absl::Now();
  const absl::Status status = pending->Wait(deadline_);
  stats_.wait_seconds += absl::ToDoubleSeconds(absl::Now() - wait_start);
  HSAP_RETURN_IF_ERROR(status);
  HSAP_RETURN_IF_ERROR(overlapped);
  // One Copy per transfer: two transfers may add into the same rows, and
  // the sum must follow the plan's order.
  for (const auto& [t, src] : landed) {
    copies_.clear();
    AppendTransferCopies(l_, m_, *t, /*pack=*/false, src, &copies_);
    HSAP_RETURN_IF_ERROR(backend_->Copy(copies_));
  }
  return absl::OkStatus();
}

absl::Status RankRun::RunForwardItems(const SharedList<WorkItem>& items) {
  if (items.empty()) return absl::OkStatus();
  const absl::Time start = absl::Now();
  for (const WorkItem& w : items) {
    stats_.area += SliceArea({0, w.num_q, 0, w.num_k, w.type, w.offset, w.window});
  }
  std::vector<kernels::FwdWorkItem> list;
  for (size_t gi = 0; gi < l_.groups.size(); ++gi) {
    const HeadGroup& g = l_.groups[gi];
    list.clear();
    for (const WorkItem& w : items) {
      const KvView& kv = w.kv_space == RowSpace::kRecv ? m_.kv_recv : m_.kv_home;
      kernels::FwdWorkItem it;
      it.q = Row(m_.q_home, w.q_row, g.q_off);
      it.k = Row(kv.k, w.kv_row, g.kv_off);
      it.v = Row(kv.v, w.kv_row, g.kv_off);
      it.num_q = w.num_q;
      it.num_k = w.num_k;
      it.q_row_stride = m_.q_home.stride;
      it.kv_row_stride = kv.k.stride;
      it.type = w.type;
      it.offset = w.offset;
      it.window = w.window;
      it.o_acc = m_.o_acc.At(static_cast<int>(gi), w.q_row);
      it.lse_acc = m_.lse_home + g.q_off * m_.lse_stride + w.q_row;
      it.lse_stride = m_.lse_stride;
      list.push_back(it);
    }
    HSAP_RETURN_IF_ERROR(backend_->Forward(l_.GroupShape(g), list, &stop_));
  }
  stats_.compute_seconds += absl::ToDoubleSeconds(absl::Now() - start);
  return absl::OkStatus();
}

absl::Status RankRun::RunBackwardItems(const SharedList<WorkItem>& items) {
  if (items.empty()) return absl::OkStatus();
  const absl::Time start = absl::Now();
  for (const WorkItem& w : items) {
    stats_.area += SliceArea({0, w.num_q, 0, w.num_k, w.type, w.offset, w.window});
  }
  std::vector<kernels::BwdWorkItem> list;
  for (size_t gi = 0; gi < l_.groups.size(); ++gi) {
    const HeadGroup& g = l_.groups[gi];
    const int gint = static_cast<int>(gi);
    list.clear();
    for (const WorkItem& w : items) {
      const bool in_recv = w.kv_space == RowSpace::kRecv;
      const KvView& kv = in_recv ? m_.kv_recv : m_.kv_home;
      kernels::BwdWorkItem it;
      it.q = Row(m_.q_home, w.q_row, g.q_off);
      it.dout = Row(m_.do_home, w.q_row, g.q_off);
      it.k = Row(kv.k, w.kv_row, g.kv_off);
      it.v = Row(kv.v, w.kv_row, g.kv_off);
      it.lse = m_.lse_home + g.q_off * m_.lse_stride + w.q_row;
      it.delta = m_.delta + g.q_off * m_.lse_stride + w.q_row;
      it.lse_stride = m_.lse_stride;
      it.num_q = w.num_q;
      it.num_k = w.num_k;
      it.q_row_stride = m_.q_home.stride;
      it.kv_row_stride = kv.k.stride;
      it.type = w.type;
      it.offset = w.offset;
      it.window = w.window;
      it.dq_acc = m_.dq_acc.At(gint, w.q_row);
      it.dk_acc = (in_recv ? m_.dk_recv : m_.dk_home).At(gint, w.kv_row);
      it.dv_acc = (in_recv ? m_.dv_recv : m_.dv_home).At(gint, w.kv_row);
      list.push_back(it);
    }
    HSAP_RETURN_IF_ERROR(backend_->Backward(l_.GroupShape(g), list, &stop_));
  }
  stats_.compute_seconds += absl::ToDoubleSeconds(absl::Now() - start);
  return absl::OkStatus();
}

absl::Status RankRun::ComputeDelta() {
  if (l_.num_q_heads == 0 || l_.home_rows == 0) return absl::OkStatus();
  kernels::AttentionShape s = l_.shape;
  s.num_heads_q = l_.num_q_heads;
  s.num_heads_kv = std::max(1, l_.num_kv_heads);
  return backend_->ComputeDelta(s, m_.o_home.base, m_.do_home.base, l_.home_rows, m_.delta,
                                m_.lse_stride);
}

// The gradient rows of the K/V a stage receives start at zero (rows no item
// reads still return zero partials). Zeroed before the stage's exchange:
// the rows' previous partials (an earlier stage's, at the same rows) have
// been returned by then, and a pipelined plan's chunks of rows, which its
// later stages compute and return, are rows no other stage receives into.
absl::Status RankRun::ZeroReceivedGradients(const plan::TransferList& recvs) {
  const int64_t row_bytes = l_.rank_plan->kv_row_bytes;
  for (const Transfer& t : recvs) {
    if (t.payload != Payload::kKv || row_bytes <= 0) continue;
    const int64_t row = t.buffer_offset / row_bytes, rows = t.bytes / row_bytes;
    for (const GroupedAcc* acc : {&m_.dk_recv, &m_.dv_recv}) {
      for (int g = 0; g < acc->num_groups(); ++g) {
        HSAP_RETURN_IF_ERROR(backend_->Fill(acc->At(g, row), rows * acc->RowStride(g), 0.f));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status RankRun::RunStages() {
  const int pass = static_cast<int>(l_.pass);
  const std::vector<Stage>& stages = *l_.stages;
  for (size_t s = 0; s < stages.size(); ++s) {
    const Stage& st = stages[s];
    const int32_t si = static_cast<int32_t>(s);
    if (!l_.backward()) {
      HSAP_RETURN_IF_ERROR(Exchange(ExchangeTag(call_tag_, pass, si, 0), st.sends, st.recvs,
                                    [&] { return RunForwardItems(st.overlap_items); }));
      HSAP_RETURN_IF_ERROR(RunForwardItems(st.items));
      continue;
    }
    HSAP_RETURN_IF_ERROR(ZeroReceivedGradients(st.recvs));
    // A pipelined plan's exchange also carries returns (of rows computed in
    // earlier stages), added to the home dK/dV when it completes.
    HSAP_RETURN_IF_ERROR(Exchange(ExchangeTag(call_tag_, pass, si, 0), st.sends, st.recvs,
                                  [&] { return RunBackwardItems(st.overlap_items); }));
    // Home O and dO are complete after the head scatter.
    if (l_.head_group_size > 1 && s == 0) HSAP_RETURN_IF_ERROR(ComputeDelta());
    HSAP_RETURN_IF_ERROR(RunBackwardItems(st.items));
    // Home items held back for it compute while the returns fly; the
    // returns are added to the home dK/dV after them (Exchange).
    HSAP_RETURN_IF_ERROR(Exchange(ExchangeTag(call_tag_, pass, si, 1), st.return_sends,
                                  st.return_recvs,
                                  [&] { return RunBackwardItems(st.return_overlap_items); }));
  }
  return absl::OkStatus();
}

absl::Status RankRun::FinishForward() {
  if (l_.head_group_size > 1) return SelfCopy(Payload::kOutLseHeads, /*to_home=*/false);
  // U == 1: one head group in the layout of o; LSE was accumulated in place.
  if (l_.local_rows == 0) return absl::OkStatus();
  return backend_->CastFromFloat(m_.o_acc.At(0, 0),
                                 l_.local_rows * l_.shape.num_heads_q * l_.shape.head_dim,
                                 l_.shape.dtype, m_.local.o);
}

absl::Status RankRun::FinishBackward() {
  if (l_.local_rows == 0) return absl::OkStatus();
  const int64_t q_elems = l_.local_rows * l_.shape.num_heads_q * l_.shape.head_dim;
  const int64_t kv_elems = l_.local_rows * l_.shape.num_heads_kv * l_.shape.head_dim;
  const DType dtype = l_.shape.dtype;
  if (l_.head_group_size > 1) {
    HSAP_RETURN_IF_ERROR(SelfCopy(Payload::kGradQkvHeads, /*to_home=*/false));
    HSAP_RETURN_IF_ERROR(backend_->CastFromFloat(m_.local_dk, kv_elems, dtype, m_.local.dk));
    return backend_->CastFromFloat(m_.local_dv, kv_elems, dtype, m_.local.dv);
  }
  HSAP_RETURN_IF_ERROR(backend_->CastFromFloat(m_.dq_acc.At(0, 0), q_elems, dtype, m_.local.dq));
  HSAP_RETURN_IF_ERROR(backend_->CastFromFloat(m_.dk_home.At(0, 0), kv_elems, dtype, m_.local.dk));
  return backend_->CastFromFloat(m_.dv_home.At(0, 0), kv_elems, dtype, m_.local.dv);
}

absl::Status RankRun::Run(ExecStats* stats) {
  const absl::Time start = absl::Now();
  const transport::TransferCounters before = transport_->counters();
  absl::Status status = m_.Upload(backend_);
  if (status.ok()) {
    if (l_.head_group_size > 1) {
      status = SelfCopy(l_.backward() ? Payload::kBwdHeads : Payload::kQkvHeads, /*to_home=*/true);
    } else if (l_.backward()) {
      status = ComputeDelta();
    }
  }
  if (status.ok()) status = RunStages();
  if (status.ok()) {
    const absl::Time finish = absl::Now();
    status = l_.backward() ? FinishBackward() : FinishForward();
    if (status.ok()) status = m_.Download(backend_);
    if (status.ok()) status = backend_->Synchronize();
    stats_.compute_seconds += absl::ToDoubleSeconds(absl::Now() - finish);
  }
  const transport::TransferCounters after = transport_->counters();
  for (int t = 0; t < 2; ++t) {
    stats_.sent_bytes[t] = after.sent_bytes[t] - before.sent_bytes[t];
    stats_.received_bytes[t] = after.received_bytes[t] - before.received_bytes[t];
  }
  stats_.head_area = stats_.area * l_.num_q_heads;
  stats_.stages = static_cast<int32_t>(l_.stages->size());
  stats_.recv_buffer_bytes = m_.recv_buffer_bytes;
  stats_.total_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  if (stats != nullptr) *stats = stats_;
  return status;
}

absl::Status RunPass(const plan::Plan& plan, int32_t rank, Pass pass,
                     const kernels::AttentionShape& shape, const RankBuffers& buffers,
                     transport::Transport* transport, ComputeBackend* backend,
                     absl::Time deadline, uint64_t call_tag, ExecStats* stats,
                     std::function<bool()> cancelled) {
  const int32_t P = plan.spec.topology.num_ranks();
  if (transport == nullptr || transport->size() != P || transport->rank() != rank) {
    return absl::InvalidArgumentError(absl::StrCat(
        "transport endpoint is rank ", transport ? transport->rank() : -1, " of ",
        transport ? transport->size() : 0, "; the call is rank ", rank, " of ", P));
  }
  if (backend == nullptr) return absl::InvalidArgumentError("no compute backend");
  if (!backend->memory_host_visible() && !transport->moves_device_memory()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the ", backend->name(), " backend's memory is not visible to the host, and the "
        "transport moves host memory only"));
  }
  if (call_tag >= (uint64_t{1} << 40)) {
    return absl::InvalidArgumentError(absl::StrCat("call_tag (", call_tag, ") must be < 2^40"));
  }
  HSAP_ASSIGN_OR_RETURN(RankLayout layout, LayoutFor(plan, rank, pass, shape, buffers));
  // Admission: the run's memory is reserved before any of it is allocated.
  MemoryBudget::Reservation reserved;
  if (MemoryBudget* budget = backend->memory_budget()) {
    const int64_t need = RankMemory::BytesFor(layout, !backend->addresses_host_memory());
    HSAP_ASSIGN_OR_RETURN(
        reserved, budget->Reserve(need, absl::StrCat("rank ", rank, "'s ",
                                                     pass == Pass::kForward ? "forward" : "backward")));
  }
  HSAP_ASSIGN_OR_RETURN(RankMemory memory, RankMemory::Allocate(layout, buffers, backend));
  RankRun run(layout, std::move(memory), transport, backend, deadline, call_tag,
              std::move(cancelled));
  return run.Run(stats);
}

}  // namespace

uint64_t ExchangeTag(uint64_t call_tag, int pass, int32_t stage, int phase) {
  return call_tag << 24 | static_cast<uint64_t>(pass & 1) << 23 |
         static_cast<uint64_t>(stage) << 1 | static_cast<uint64_t>(phase & 1);
}

absl::Status RunForward(const plan::Plan& plan, int32_t rank,
                        const kernels::AttentionShape& shape, const RankBuffers& buffers,
                        transport::Transport* transport, ComputeBackend* backend,
                        absl::Time deadline, uint64_t call_tag, ExecStats* stats,
                        std::function<bool()> cancelled) {
  return RunPass(plan, rank, Pass::kForward, shape, buffers, transport, backend, deadline,
                 call_tag, stats, std::move(cancelled));
}

absl::Status RunBackward(const plan::Plan& plan, int32_t rank,
                         const kernels::AttentionShape& shape, const RankBuffers& buffers,
                         transport::Transport* transport, ComputeBackend* backend,
                         absl::Time deadline, uint64_t call_tag, ExecStats* stats,
                         std::function<bool()> cancelled) {
  return RunPass(plan, rank, Pass::kBackward, shape, buffers, transport, backend, deadline,
                 call_tag, stats, std::move(cancelled));
}

}  // namespace hsap::exec
