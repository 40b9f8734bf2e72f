#include "server/plan/compiler.h"

#include <algorithm>
#include <array>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "server/plan/cost_model.h"
#include "server/plan/demand.h"
#include "server/plan/build_plan.h"
#include "server/plan/inner_level.h"
#include "server/plan/parallel.h"
#include "server/plan/pipelined_level.h"

namespace hsap::plan {
namespace internal {

// Per-row bytes of the head all-to-all payloads for a slot.
int64_t HeadRowBytes(Payload p, const HeadShape& shape, const HeadSlot& slot) {
  return PayloadRowBytes(p, slot.num_q(), slot.num_kv(), shape.head_dim, shape.dtype);
}

namespace {
thread_local const std::function<bool()>* tl_compile_stop = nullptr;
}  // namespace

const std::function<bool()>* SetCompileStop(const std::function<bool()>* stop) {
  const std::function<bool()>* old = tl_compile_stop;
  tl_compile_stop = stop;
  return old;
}

const std::function<bool()>* CurrentCompileStop() { return tl_compile_stop; }

absl::Status CheckCompileStop() {
  if (tl_compile_stop != nullptr && *tl_compile_stop && (*tl_compile_stop)()) {
    return absl::CancelledError("the plan compile's caller gave up (deadline or cancellation)");
  }
  return absl::OkStatus();
}

std::vector<int32_t> RankNodes(const Topology& t) {
  std::vector<int32_t> nodes(t.num_ranks());
  for (int32_t r = 0; r < t.num_ranks(); ++r) nodes[r] = t.NodeOf(r);
  return nodes;
}

}  // namespace internal

namespace {

using internal::ForEachIndex;
using internal::HeadRowBytes;
using internal::InnerKind;
using internal::InnerRank;

void SetHeads(const HeadSlot& s, Transfer* t) {
  t->q_head_begin = s.q_begin;
  t->q_head_end = s.q_end;
  t->kv_head_begin = s.kv_begin;
  t->kv_head_end = s.kv_end;
}

std::vector<Segment> Shifted(const std::vector<OwnerSegment>& segs, int64_t shift) {
  std::vector<Segment> out;
  out.reserve(segs.size());
  for (const OwnerSegment& s : segs) out.push_back({s.begin, s.end, s.local_row + shift});
  return out;
}

// The rows the head all-to-alls of rank d move: its own at its local rows
// and each group member's at its home rows in the group, built once per
// rank and shared by the rank's transfers that carry them (copies of one
// rank's lists stay on the thread that builds the rank).
struct HeadRows {
  SharedList<Segment> local;               // rank d's rows
  std::vector<SharedList<Segment>> home;   // member g0 + i's rows at their home rows
  std::vector<int64_t> rows;               // member g0 + i's row count
};

HeadRows MakeHeadRows(int32_t d, int32_t g0, int32_t U,
                      const std::vector<std::vector<OwnerSegment>>& local,
                      const std::vector<int64_t>& home_offset) {
  HeadRows h;
  h.local = Shifted(local[d], 0);
  h.home.resize(U);
  h.rows.assign(U, 0);
  for (int32_t i = 0; i < U; ++i) {
    const int32_t m = g0 + i;
    if (m != d) h.home[i] = Shifted(local[m], home_offset[m]);
    for (const OwnerSegment& s : local[m]) h.rows[i] += s.end - s.begin;
  }
  return h;
}

// The head all-to-all of rank `d` in its group (ranks [g0, g0 + U)).
// `to_home`: forward scatter / backward scatter (local rows of the sender to
// home rows of the receiver, receiver's heads) or the gathers (home rows of
// the sender to local rows of the receiver, sender's heads).
Stage HeadStage(Payload payload, bool to_home, int32_t d, int32_t g0, int32_t U,
                const HeadRows& rows, const std::vector<HeadSlot>& slots,
                const std::vector<int32_t>& node_of, const PlanSpec& spec) {
  Stage st;
  const HeadSlot& mine = slots[d - g0];
  const int64_t nd = rows.rows[d - g0];
  std::vector<Transfer> sends, recvs;
  sends.reserve(U - 1);
  recvs.reserve(U - 1);
  for (int32_t m = g0; m < g0 + U; ++m) {
    if (m == d) continue;
    const HeadSlot& theirs = slots[m - g0];
    const int64_t nm = rows.rows[m - g0];
    const LinkTier tier = node_of[d] == node_of[m] ? LinkTier::kIntraNode : LinkTier::kInterNode;
    // Send: to_home: my local rows, their heads; else: their rows at my home, my heads.
    const HeadSlot& send_heads = to_home ? theirs : mine;
    const int64_t send_rows = to_home ? nd : nm;
    if (send_heads.num_q() > 0 && send_rows > 0) {
      Transfer& t = sends.emplace_back();
      t.peer = m;
      t.payload = payload;
      t.tier = tier;
      t.space = to_home ? RowSpace::kLocal : RowSpace::kHome;
      SetHeads(send_heads, &t);
      t.segments = to_home ? rows.local : rows.home[m - g0];
      t.bytes = send_rows * HeadRowBytes(payload, spec.shape, send_heads);
    }
    const HeadSlot& recv_heads = to_home ? mine : theirs;
    const int64_t recv_rows = to_home ? nm : nd;
    if (recv_heads.num_q() > 0 && recv_rows > 0) {
      Transfer& t = recvs.emplace_back();
      t.peer = m;
      t.payload = payload;
      t.tier = tier;
      t.space = to_home ? RowSpace::kHome : RowSpace::kLocal;
      SetHeads(recv_heads, &t);
      t.segments = to_home ? rows.home[m - g0] : rows.local;
      t.bytes = recv_rows * HeadRowBytes(payload, spec.shape, recv_heads);
    }
  }
  st.sends = std::move(sends);
  st.recvs = std::move(recvs);
  return st;
}

// Appends the forward stages of rank d = v * U + u: the inner level's
// stages (rows, virtual peers) scaled to bytes and peers. Segment lists and
// work items are shared with `in` (shared_list.h). Without head groups
// (U = 1) the virtual rank is rank d alone: its transfer arrays are scaled
// in place and its lists moved; with head groups each rank of the group
// scales a copy into arrays of its own (one for sends, one for receives).
void AppendForward(InnerRank& in, int32_t d, int32_t U, int32_t u, int64_t kappa,
                   const HeadSlot& slot, const std::vector<int32_t>& node_of,
                   std::vector<Stage>* fwd) {
  auto scale = [&](const Transfer& t, bool is_recv, Transfer* o) {
    o->peer = t.peer * U + u;
    o->payload = t.payload;
    o->tier = node_of[d] == node_of[o->peer] ? LinkTier::kIntraNode : LinkTier::kInterNode;
    o->space = t.space;
    SetHeads(slot, o);
    if (o != &t) o->segments = t.segments;
    o->bytes = t.bytes * kappa;
    o->buffer_offset = is_recv ? t.buffer_offset * kappa : 0;
  };
  if (U == 1) {
    if (in.send_pool) {
      for (Transfer& t : *in.send_pool) scale(t, false, &t);
    }
    if (in.recv_pool) {
      for (Transfer& t : *in.recv_pool) scale(t, true, &t);
    }
    for (Stage& st : in.stages) fwd->push_back(std::move(st));
    return;
  }
  std::shared_ptr<std::vector<Transfer>> pools[2];
  for (bool is_recv : {false, true}) {
    const auto& inner_pool = is_recv ? in.recv_pool : in.send_pool;
    if (!inner_pool) continue;
    auto p = std::make_shared<std::vector<Transfer>>(inner_pool->size());
    for (size_t i = 0; i < p->size(); ++i) scale((*inner_pool)[i], is_recv, &(*p)[i]);
    pools[is_recv] = std::move(p);
  }
  for (const Stage& in_st : in.stages) {
    Stage st;
    if (!in_st.sends.empty()) {
      st.sends = TransferList::View(pools[0], in_st.sends.offset(), in_st.sends.size());
    }
    if (!in_st.recvs.empty()) {
      st.recvs = TransferList::View(pools[1], in_st.recvs.offset(), in_st.recvs.size());
    }
    st.overlap_items = in_st.overlap_items;
    st.items = in_st.items;
    fwd->push_back(std::move(st));
  }
}

// The backward stages of forward stages [first, end) of `fwd`: the same
// transfers and items (shared), then the dK/dV returns mirroring the
// transfers (fp32 partials: `ratio` times the bytes of the K/V they return
// for, ReturnBytesRatio), each kind in one array for all the stages.
void AppendBackward(const std::vector<Stage>& fwd, size_t first, size_t end, int64_t ratio,
                    std::vector<Stage>* bwd) {
  size_t num[2] = {0, 0};  // returned sends (mirror recvs), returned recvs (mirror sends)
  for (size_t s = first; s < end; ++s) {
    num[0] += fwd[s].recvs.size();
    num[1] += fwd[s].sends.size();
  }
  std::shared_ptr<std::vector<Transfer>> pools[2];
  for (int k = 0; k < 2; ++k) {
    if (num[k] > 0) {
      pools[k] = std::make_shared<std::vector<Transfer>>();
      pools[k]->reserve(num[k]);
    }
  }
  auto mirror = [ratio](const TransferList& ts, RowSpace space, bool buffered,
                        std::vector<Transfer>* pool) {
    const size_t at = pool->size();
    int64_t offset = 0;
    for (const Transfer& t : ts) {
      pool->push_back(t);
      Transfer& r = pool->back();
      r.payload = Payload::kGradKv;
      r.space = space;
      r.bytes = t.bytes * ratio;  // fp32 partials (wire_layout.h)
      r.buffer_offset = buffered ? offset : 0;
      offset += r.bytes;
    }
    return at;
  };
  for (size_t s = first; s < end; ++s) {
    const Stage& f = fwd[s];
    Stage st = f;
    if (!f.recvs.empty()) {
      const size_t at = mirror(f.recvs, RowSpace::kRecv, false, pools[0].get());
      st.return_sends = TransferList::View(pools[0], at, f.recvs.size());
    }
    if (!f.sends.empty()) {
      const size_t at = mirror(f.sends, RowSpace::kHome, true, pools[1].get());
      st.return_recvs = TransferList::View(pools[1], at, f.sends.size());
    }
    bwd->push_back(std::move(st));
  }
}

using internal::RankBytes;

// A rank's bytes per stage with each list read once. A forward stage's
// are its sends' and receives'. A backward stage in [first_inner,
// end_inner) repeats its forward stage's transfers and returns mirrors of
// them (AppendBackward: a return send per receive, a return receive per
// send, same tier, `ratio` times the bytes), so its sums follow from the
// forward stage's; the other backward stages (head all-to-alls, and every
// stage of a pipelined level, whose exchanges carry returns) are read.
RankBytes SumRankBytes(const RankPlan& rp, size_t first_inner, size_t end_inner,
                       int64_t ratio) {
  RankBytes rb;
  rb.fwd.resize(rp.forward.size());
  rb.bwd.resize(rp.backward.size());
  rb.fwd_buffer.assign(rp.forward.size(), 0);
  rb.bwd_return_buffer.assign(rp.backward.size(), 0);
  auto add = [](const TransferList& ts, std::array<int64_t, kNumTiers>* out) {
    for (const Transfer& t : ts) (*out)[static_cast<int>(t.tier)] += t.bytes;
  };
  for (size_t s = 0; s < rp.forward.size(); ++s) {
    const Stage& st = rp.forward[s];
    add(st.sends, &rb.fwd[s].send);
    for (const Transfer& t : st.recvs) {
      rb.fwd[s].recv[static_cast<int>(t.tier)] += t.bytes;
      if (t.space == RowSpace::kRecv) {
        rb.fwd_buffer[s] = std::max(rb.fwd_buffer[s], t.buffer_offset + t.bytes);
      }
    }
  }
  for (size_t s = 0; s < rp.backward.size(); ++s) {
    StageBytes& b = rb.bwd[s];
    if (s >= first_inner && s < end_inner) {
      b.send = rb.fwd[s].send;
      b.recv = rb.fwd[s].recv;
      for (int t = 0; t < kNumTiers; ++t) {
        b.return_recv[t] = b.send[t] * ratio;
        b.return_send[t] = b.recv[t] * ratio;
        rb.bwd_return_buffer[s] += b.return_recv[t];
      }
      continue;
    }
    const Stage& st = rp.backward[s];
    add(st.sends, &b.send);
    add(st.recvs, &b.recv);
    add(st.return_sends, &b.return_send);
    add(st.return_recvs, &b.return_recv);
    int64_t in_exchange = 0, in_returns = 0;
    for (const Transfer& t : st.recvs) in_exchange += t.payload == Payload::kGradKv ? t.bytes : 0;
    for (const Transfer& t : st.return_recvs) in_returns += t.bytes;
    rb.bwd_return_buffer[s] = std::max(in_exchange, in_returns);
  }
  return rb;
}

// Moves the tail of each inner backward stage's home items (overlap_items)
// that has returns to its return_overlap_items: the items kept are the
// fewest whose modeled compute covers the stage's K/V transfer
// (ItemsCovering), the rest compute while the dK/dV returns fly. Returns,
// per backward stage, the area moved. With inter-node links shared by k
// ranks the transfer is estimated as k times the rank's own inter-node
// bytes over the link (the ranks of a node move about as much each).
std::vector<int64_t> HoldBackForReturns(const HardwareProfile& profile, int64_t head_dim,
                                        const RankBytes& rb, size_t first_inner,
                                        size_t end_inner, RankPlan* rp) {
  std::vector<int64_t> moved(rp->backward.size(), 0);
  const int64_t heads = rp->q_head_end - rp->q_head_begin;
  const int64_t kv_heads = rp->kv_head_end - rp->kv_head_begin;
  for (size_t s = first_inner; s < end_inner && s < rp->backward.size(); ++s) {
    Stage& st = rp->backward[s];
    if (st.overlap_items.empty() || (st.return_sends.empty() && st.return_recvs.empty())) {
      continue;
    }
    const double xfer = internal::EstimatedTransferSeconds(profile, rb.bwd[s].send, rb.bwd[s].recv);
    const size_t n = st.overlap_items.size();
    const size_t keep = ItemsCovering(profile, head_dim, heads, kv_heads, /*backward=*/true,
                                      xfer, st.overlap_items);
    if (keep == n) continue;
    st.return_overlap_items = st.overlap_items.Sub(keep, n - keep);
    st.overlap_items = st.overlap_items.Sub(0, keep);
    moved[s] = ItemsArea(st.return_overlap_items);
  }
  return moved;
}

// A rank's byte statistics, from its stages' sums.
void FillRankStats(const RankBytes& rb, RankStats* rs) {
  for (size_t s = 0; s < rb.fwd.size(); ++s) {
    for (int t = 0; t < kNumTiers; ++t) {
      rs->fwd_recv_bytes[t] += rb.fwd[s].recv[t];
      rs->fwd_send_bytes[t] += rb.fwd[s].send[t];
    }
    rs->peak_recv_buffer_bytes = std::max(rs->peak_recv_buffer_bytes, rb.fwd_buffer[s]);
  }
  for (size_t s = 0; s < rb.bwd.size(); ++s) {
    const StageBytes& b = rb.bwd[s];
    for (int t = 0; t < kNumTiers; ++t) {
      rs->bwd_recv_bytes[t] += b.recv[t] + b.return_recv[t];
      rs->bwd_send_bytes[t] += b.send[t] + b.return_send[t];
    }
    rs->peak_recv_buffer_bytes = std::max(rs->peak_recv_buffer_bytes, rb.bwd_return_buffer[s]);
  }
}

// The plan's statistics from its ranks' (FillRankStats done), and the
// layout's inter-node exact need: per node, the keys its rows see that no
// rank of the node holds.
void FinishStats(const std::vector<MaskSlice>& slices, const SliceIndex& index,
                 const PlanSpec& spec, const Dispatch& dispatch, Plan* plan) {
  PlanStats& ps = plan->stats;
  const Topology& topo = spec.topology;
  const int64_t kappa = KvRowBytes(spec.shape, spec.shape.num_heads_kv);
  for (int64_t tokens : NodeInterNeedTokens(index, dispatch, topo)) {
    ps.inter_node_need_bytes += tokens * kappa;
    ps.max_node_inter_need_bytes = std::max(ps.max_node_inter_need_bytes, tokens * kappa);
  }
  ps.total_area = 0;
  for (const MaskSlice& s : slices) ps.total_area += SliceArea(s);
  int64_t head_area_sum = 0, head_area_max = 0;
  for (const RankPlan& rp : plan->ranks) {
    const RankStats& rs = rp.stats;
    head_area_sum += rs.head_area;
    head_area_max = std::max(head_area_max, rs.head_area);
    ps.max_fwd_recv_bytes = std::max(ps.max_fwd_recv_bytes, rs.FwdRecvBytes());
    ps.total_fwd_bytes += rs.FwdRecvBytes();
    ps.total_bwd_bytes += rs.BwdRecvBytes();
    for (int t = 0; t < kNumTiers; ++t) ps.total_fwd_bytes_by_tier[t] += rs.fwd_recv_bytes[t];
    ps.max_fwd_inter_recv_bytes =
        std::max(ps.max_fwd_inter_recv_bytes,
                 rs.fwd_recv_bytes[static_cast<int>(LinkTier::kInterNode)]);
  }
  const double mean = static_cast<double>(head_area_sum) / std::max<size_t>(1, plan->ranks.size());
  ps.imbalance = mean > 0 ? static_cast<double>(head_area_max) / mean : 1.0;
  ps.num_fwd_stages = plan->ranks.empty() ? 0 : static_cast<int32_t>(plan->ranks[0].forward.size());
  ps.num_bwd_stages = plan->ranks.empty() ? 0 : static_cast<int32_t>(plan->ranks[0].backward.size());
}

}  // namespace

namespace internal {

LevelInputs MakeLevelInputs(const PlanSpec& spec, const Dispatch& dispatch, Strategy strategy) {
  LevelInputs in;
  const Topology& topo = spec.topology;
  const int32_t P = topo.num_ranks();
  const int32_t U = HeadGroupSize(strategy, topo);
  const int32_t V = P / U;
  in.U = U;
  in.V = V;
  std::vector<std::vector<OwnerSegment>>& local = in.local;
  local.resize(P);
  for (int32_t r = 0; r < P; ++r) {
    int64_t row = 0;
    for (const TokenRange& t : dispatch.ranges[r]) {
      local[r].push_back({t.begin, t.end, r, row});
      row += t.size();
    }
  }
  std::vector<std::vector<OwnerSegment>>& home = in.home;
  home.resize(V);
  std::vector<int64_t>& home_offset = in.home_offset;
  home_offset.assign(P, 0);
  std::vector<OwnerSegment>& owners = in.owners;
  for (int32_t v = 0; v < V; ++v) {
    int64_t offset = 0;
    for (int32_t m = v * U; m < (v + 1) * U; ++m) {
      home_offset[m] = offset;
      for (const OwnerSegment& s : local[m]) {
        home[v].push_back({s.begin, s.end, v, offset + s.local_row});
      }
      for (const OwnerSegment& s : local[m]) offset += s.end - s.begin;
    }
    owners.insert(owners.end(), home[v].begin(), home[v].end());
  }
  std::sort(owners.begin(), owners.end(),
            [](const OwnerSegment& a, const OwnerSegment& b) { return a.begin < b.begin; });
  in.slots.resize(U);
  int64_t kappa_max = 0;
  for (int32_t u = 0; u < U; ++u) {
    in.slots[u] = HeadSlotOf(spec.shape, U, u);
    kappa_max = std::max(kappa_max, KvRowBytes(spec.shape, in.slots[u].num_kv()));
  }
  in.budget_rows = std::max<int64_t>(1, spec.recv_buffer_bytes / kappa_max);
  if (strategy == Strategy::kRing || strategy == Strategy::kUsp) in.kind = InnerKind::kRing;
  if (strategy == Strategy::kAllGather) in.kind = InnerKind::kAllGather;
  // hsap over several nodes pipelines its inter-node stage (docs/planner.md,
  // "The pipelined inter-node stage").
  if (strategy == Strategy::kHsap && U > 1 && V > 1) in.pipeline_stages = kHsapPipelineStages;
  return in;
}

namespace {

// BuildPlan of the level `in` as it is (pipelined or not). `packed`, when
// given, is PackInnerLevel's result for `in` (auto computed it for a
// bound). `one_stage_bound_us` (may be null): for a pipelined level, a
// lower bound of the modeled time of the same level's one-stage plan.
absl::StatusOr<Plan> BuildPlanOf(const PlanSpec& spec, const std::vector<MaskSlice>& slices,
                                 const SliceIndex& index, const Dispatch& dispatch,
                                 Strategy strategy, const HardwareProfile& profile,
                                 ThreadPool* pool, PackedLevel* packed, LevelInputs in,
                                 double* one_stage_bound_us);

}  // namespace

absl::StatusOr<Plan> BuildPlan(const PlanSpec& spec, const std::vector<MaskSlice>& slices,
                               const SliceIndex& index, const Dispatch& dispatch,
                               Strategy strategy, const HardwareProfile& profile,
                               ThreadPool* pool, PackedLevel* packed) {
  LevelInputs in = packed != nullptr ? std::move(packed->inputs)
                                     : MakeLevelInputs(spec, dispatch, strategy);
  if (in.pipeline_stages <= 1) {
    return BuildPlanOf(spec, slices, index, dispatch, strategy, profile, pool, packed,
                       std::move(in), nullptr);
  }
  // Pipelining is not always faster (stages count their slowest rank; a
  // level whose home work covers its transfers loses by it): the faster
  // plan in the model is kept, the one-stage plan on ties. That one is
  // built only when the pipelined plan is not below its lower bound.
  LevelInputs one_stage = in;
  one_stage.pipeline_stages = 1;
  double bound_us = -1;  // stays negative where the level did not fit one stage
  HSAP_ASSIGN_OR_RETURN(Plan pipelined,
                        BuildPlanOf(spec, slices, index, dispatch, strategy, profile, pool,
                                    packed, std::move(in), &bound_us));
  if (bound_us < 0 || pipelined.stats.modeled_us < bound_us) return pipelined;
  HSAP_RETURN_IF_ERROR(CheckCompileStop());
  absl::StatusOr<Plan> plain = BuildPlanOf(spec, slices, index, dispatch, strategy, profile,
                                           pool, nullptr, std::move(one_stage), nullptr);
  if (plain.ok() && plain->stats.modeled_us <= pipelined.stats.modeled_us) return plain;
  return pipelined;
}

namespace {

absl::StatusOr<Plan> BuildPlanOf(const PlanSpec& spec, const std::vector<MaskSlice>& slices,
                                 const SliceIndex& index, const Dispatch& dispatch,
                                 Strategy strategy, const HardwareProfile& profile,
                                 ThreadPool* pool, PackedLevel* packed, LevelInputs in,
                                 double* one_stage_bound_us) {
  const Topology& topo = spec.topology;
  const int32_t P = topo.num_ranks();
  const int32_t U = in.U;
  const std::vector<std::vector<OwnerSegment>>& local = in.local;
  const std::vector<std::vector<OwnerSegment>>& home = in.home;
  const std::vector<int64_t>& home_offset = in.home_offset;
  const std::vector<HeadSlot>& slots = in.slots;
  std::vector<InnerRank> inner;
  if (packed != nullptr) {
    inner = internal::BuildInnerLevel(index, in.owners, std::move(packed->packing), pool);
  } else {
    HSAP_ASSIGN_OR_RETURN(inner, internal::BuildInnerLevel(index, home, in.owners, in.kind,
                                                           in.budget_rows, pool,
                                                           in.pipeline_stages));
  }
  HSAP_RETURN_IF_ERROR(internal::CheckCompileStop());
  const size_t inner_stages = inner[0].stages.size();
  const bool pipelined = inner[0].pipelined;
  const int64_t kappa_full = KvRowBytes(spec.shape, spec.shape.num_heads_kv);
  std::vector<RankModel> models(P);
  std::vector<PipelineNeeds> needs(pipelined ? P : 0);
  std::vector<RankBytes> rank_bytes(pipelined ? P : 0);
  const std::vector<int32_t> node_of = internal::RankNodes(topo);

  Plan plan;
  plan.spec = spec;
  plan.strategy = strategy;
  plan.head_group_size = U;
  plan.dispatch = dispatch;
  plan.ranks.resize(P);
  // Ranks are independent: with U = 1 rank d alone moves inner[d]'s lists;
  // with head groups the ranks of a group copy (share) them.
  ForEachIndex(pool, P, [&](int64_t rank) {
    const int32_t d = static_cast<int32_t>(rank);
    const int32_t v = d / U, u = d % U, g0 = v * U;
    const HeadSlot& slot = slots[u];
    RankPlan& rp = plan.ranks[d];
    rp.rank = d;
    rp.node = topo.NodeOf(d);
    rp.q_head_begin = slot.q_begin;
    rp.q_head_end = slot.q_end;
    rp.kv_head_begin = slot.kv_begin;
    rp.kv_head_end = slot.kv_end;
    const int64_t kappa = KvRowBytes(spec.shape, slot.num_kv());
    rp.kv_row_bytes = kappa;
    std::vector<Stage> fwd, bwd;
    const HeadRows head_rows = U > 1 ? MakeHeadRows(d, g0, U, local, home_offset) : HeadRows{};
    if (U > 1) {
      fwd.push_back(HeadStage(Payload::kQkvHeads, true, d, g0, U, head_rows, slots, node_of, spec));
      bwd.push_back(HeadStage(Payload::kBwdHeads, true, d, g0, U, head_rows, slots, node_of, spec));
    }
    if (slot.num_q() == 0) {
      fwd.resize(fwd.size() + inner_stages);
      bwd.resize(bwd.size() + inner_stages);
    } else {
      const size_t first = fwd.size();
      AppendForward(inner[v], d, U, u, kappa, slot, node_of, &fwd);
      if (pipelined) {
        AppendBackwardPipelined(fwd, first, fwd.size(), ReturnBytesRatio(spec.shape.dtype), &bwd);
      } else {
        AppendBackward(fwd, first, fwd.size(), ReturnBytesRatio(spec.shape.dtype), &bwd);
      }
    }
    if (U > 1) {
      fwd.push_back(
          HeadStage(Payload::kOutLseHeads, false, d, g0, U, head_rows, slots, node_of, spec));
      bwd.push_back(
          HeadStage(Payload::kGradQkvHeads, false, d, g0, U, head_rows, slots, node_of, spec));
    }
    rp.forward = std::move(fwd);
    rp.backward = std::move(bwd);
    std::vector<std::array<int64_t, 2>> area;
    area.reserve(rp.forward.size());
    if (U > 1) area.push_back({0, 0});
    for (size_t s = 0; s < inner_stages; ++s) {
      area.push_back(slot.num_q() == 0 ? std::array<int64_t, 2>{0, 0} : inner[v].stage_area[s]);
    }
    if (U > 1) area.push_back({0, 0});
    RankStats& rs = rp.stats;
    rs.tokens = dispatch.TokensOf(d);
    for (const OwnerSegment& s : home[v]) rs.home_tokens += s.end - s.begin;
    rs.area = slot.num_q() > 0 ? inner[v].area : 0;
    rs.head_area = rs.area * slot.num_q();
    if (U == 1) {
      rs.exact_need_bytes = inner[v].exact_need_rows * kappa_full;
      rs.lower_bound_recv_bytes = rs.exact_need_bytes;
    } else {
      const std::vector<Demand> own = ComputeDemands(index, local[d]);
      rs.exact_need_bytes = TotalTokens(ExactNeed(own, local[d])) * kappa_full;
      int64_t head_bytes = 0;
      for (const Transfer& t : rp.forward.front().recvs) head_bytes += t.bytes;
      for (const Transfer& t : rp.forward.back().recvs) head_bytes += t.bytes;
      rs.lower_bound_recv_bytes =
          head_bytes + (slot.num_q() > 0 ? inner[v].exact_need_rows * kappa : 0);
    }
    // Statistics and model while the rank's lists are in cache.
    const size_t first_inner = U > 1 ? 1 : 0;
    const size_t end_inner = first_inner + inner_stages;
    // A pipelined backward's bytes are not its forward's mirrored: read.
    RankBytes rb =
        SumRankBytes(rp, first_inner, pipelined ? first_inner : end_inner,
                     ReturnBytesRatio(spec.shape.dtype));
    FillRankStats(rb, &rs);
    if (pipelined) {
      // The home items are scheduled once every rank's needs are known.
      needs[d] = NeedsOf(profile, spec.shape.head_dim, rb, first_inner, end_inner,
                         inner[v].stage_area, rp);
      rank_bytes[d] = std::move(rb);
    } else {
      const std::vector<int64_t> moved = HoldBackForReturns(
          profile, spec.shape.head_dim, rb, first_inner, end_inner, &rp);
      models[d] = ModelRank(profile, spec.shape.head_dim, area, moved, rb.fwd, rb.bwd, &rp);
    }
  });
  if (pipelined) {
    // Every stage's slowest rank: the level the home items fill up to.
    const size_t first_inner = U > 1 ? 1 : 0, end_inner = first_inner + inner_stages;
    PipelineNeeds level;
    for (int b = 0; b < 2; ++b) level.stage_s[b].assign(inner_stages, 0.0);
    for (const PipelineNeeds& n : needs) {
      for (int b = 0; b < 2; ++b) {
        for (size_t s = 0; s < inner_stages; ++s) {
          level.stage_s[b][s] = std::max(level.stage_s[b][s], n.stage_s[b][s]);
        }
      }
      level.return_s = std::max(level.return_s, n.return_s);
    }
    // Per virtual rank: the ranks of a group whose slots have the same head
    // counts have the same bytes and items, so one schedule serves them
    // (their lists are shared).
    ForEachIndex(pool, P / U, [&](int64_t v) {
      const int32_t g0 = static_cast<int32_t>(v) * U;
      std::array<std::vector<std::array<int64_t, 3>>, 2> areas;
      int32_t scheduled = -1;  // the group's rank whose schedule `areas` is
      for (int32_t d = g0; d < g0 + U; ++d) {
        RankPlan& rp = plan.ranks[d];
        const HeadSlot& slot = slots[d - g0];
        if (slot.num_q() == 0) {
          std::vector<std::array<int64_t, 3>> none(rp.forward.size(), {0, 0, 0});
          models[d] = ModelRankAreas(profile, spec.shape.head_dim, none, none,
                                     rank_bytes[d].fwd, rank_bytes[d].bwd, &rp);
          continue;
        }
        const HeadSlot* done = scheduled < 0 ? nullptr : &slots[scheduled - g0];
        if (done != nullptr && done->num_q() == slot.num_q() && done->num_kv() == slot.num_kv()) {
          const RankPlan& from = plan.ranks[scheduled];
          for (size_t s = first_inner; s < end_inner; ++s) {
            rp.forward[s].overlap_items = from.forward[s].overlap_items;
            rp.backward[s].overlap_items = from.backward[s].overlap_items;
            rp.backward[s].return_overlap_items = from.backward[s].return_overlap_items;
          }
        } else {
          areas = ScheduleHomeItems(profile, spec.shape.head_dim, level, first_inner, end_inner,
                                    inner[v].stage_area, &rp);
          scheduled = d;
        }
        models[d] = ModelRankAreas(profile, spec.shape.head_dim, areas[0], areas[1],
                                   rank_bytes[d].fwd, rank_bytes[d].bwd, &rp);
      }
    });
  }
  if (pipelined && one_stage_bound_us != nullptr) {
    // The stages outside the level (head all-to-alls) are the same in both
    // plans; the level is one stage there, its slowest rank's.
    const size_t first_inner = U > 1 ? 1 : 0, end_inner = first_inner + inner_stages;
    double bound = 0;
    for (int backward = 0; backward < 2; ++backward) {
      double level = 0;
      for (const PipelineNeeds& n : needs) level = std::max(level, n.one_stage_s[backward]);
      bound += level;
      const size_t stages = backward ? plan.ranks[0].backward.size() : plan.ranks[0].forward.size();
      for (size_t s = 0; s < stages; ++s) {
        if (s >= first_inner && s < end_inner) continue;
        double slowest = 0;
        for (const RankModel& m : models) slowest = std::max(slowest, (backward ? m.bwd_s : m.fwd_s)[s]);
        bound += slowest;
      }
    }
    *one_stage_bound_us = bound * 1e6;
  }
  FinishStats(slices, index, spec, dispatch, &plan);
  if (profile.inter_link_ranks > 1) {
    // A shared link's term needs all its ranks' bytes: modeled again, whole.
    ModelPlanTime(profile, &plan);
  } else {
    FinishModel(models, &plan.stats);
  }
  return plan;
}

}  // namespace

}  // namespace internal

namespace {

// ResolveSlices(spec), polling the compile's caller every 65,536
// documents: lowering millions of documents touches tens of MB of fresh
// memory (up to 0.4 s for 2^20 on the 2-core test VM).
absl::StatusOr<std::vector<MaskSlice>> ResolveSlicesPolled(const PlanSpec& spec) {
  if (spec.cu_seqlens.empty()) return ResolveSlices(spec);
  constexpr size_t kChunk = size_t{1} << 16;
  const absl::Span<const int64_t> cu(spec.cu_seqlens);
  std::vector<MaskSlice> out;
  out.reserve(cu.size() - 1);
  for (size_t d = 0; d + 1 < cu.size(); d += kChunk) {
    const std::vector<MaskSlice> part = LowerDocuments(
        cu.subspan(d, std::min(kChunk, cu.size() - 1 - d) + 1), spec.causal,
        spec.causal ? spec.window : -1);
    out.insert(out.end(), part.begin(), part.end());
    HSAP_RETURN_IF_ERROR(internal::CheckCompileStop());
  }
  // Documents come in order, as ResolveSlices sorts them.
  return out;
}

absl::StatusOr<Plan> Compile(const PlanSpec& spec, const Dispatch* given,
                             const CompileOptions& options) {
  // CheckCompileStop() answers from options.stop on this thread meanwhile.
  // Polled between the steps that precede the dispatch too: each is linear
  // in the documents, a few hundred ms at millions of them.
  struct StopScope {
    const std::function<bool()>* saved;
    explicit StopScope(const std::function<bool()>* stop) : saved(internal::SetCompileStop(stop)) {}
    ~StopScope() { internal::SetCompileStop(saved); }
  } stop_scope(options.stop);
  HSAP_RETURN_IF_ERROR(ValidatePlanSpec(spec));
  HSAP_RETURN_IF_ERROR(internal::CheckCompileStop());
  const absl::Time start = absl::Now();
  HSAP_ASSIGN_OR_RETURN(const std::vector<MaskSlice> slices, ResolveSlicesPolled(spec));
  const SliceIndex index(slices);
  const int32_t P = spec.topology.num_ranks();
  ThreadPool* const pool = P >= internal::kParallelMinRanks ? options.pool : nullptr;
  Dispatch dispatch;
  if (given != nullptr) {
    if (given->num_ranks() != P || given->total_tokens != spec.total_tokens) {
      return absl::InvalidArgumentError(
          absl::StrCat("dispatch has ", given->num_ranks(), " ranks and ", given->total_tokens,
                       " tokens; the spec has ", P, " ranks and ", spec.total_tokens));
    }
    HSAP_RETURN_IF_ERROR(ValidateDispatch(*given));
    dispatch = *given;
  } else {
    HSAP_RETURN_IF_ERROR(internal::CheckCompileStop());
    dispatch = ComputeDispatch(spec.assignment, slices, spec.total_tokens, spec.topology, pool);
  }
  HSAP_RETURN_IF_ERROR(internal::CheckCompileStop());
  const HardwareProfile& profile = GetHardwareProfile(spec.profile);
  Plan plan;
  if (spec.strategy == Strategy::kAuto) {
    HSAP_ASSIGN_OR_RETURN(plan,
                          internal::CompileAuto(spec, slices, index, dispatch, profile, pool));
  } else {
    HSAP_ASSIGN_OR_RETURN(
        plan, internal::BuildPlan(spec, slices, index, dispatch, spec.strategy, profile, pool));
  }
  plan.spec = spec;
  plan.format_version = kPlanFormatVersion;
  plan.key = ComputePlanKey(spec, kPlanFormatVersion);
  plan.stats.compile_us = absl::ToInt64Microseconds(absl::Now() - start);
  return plan;
}

}  // namespace

HeadSlot HeadSlotOf(const HeadShape& shape, int32_t group_size, int32_t u) {
  HeadSlot s;
  const int64_t hq = shape.num_heads_q;
  s.q_begin = static_cast<int32_t>(hq * u / group_size);
  s.q_end = static_cast<int32_t>(hq * (u + 1) / group_size);
  const int32_t g = shape.num_heads_q / shape.num_heads_kv;
  if (s.q_end > s.q_begin) {
    s.kv_begin = s.q_begin / g;
    s.kv_end = (s.q_end + g - 1) / g;
  } else {
    s.kv_begin = s.kv_end = s.q_begin / g;
  }
  return s;
}

int32_t HeadGroupSize(Strategy strategy, const Topology& topology) {
  switch (strategy) {
    case Strategy::kUlysses: return topology.num_ranks();
    case Strategy::kUsp:
    case Strategy::kHsap: return topology.devices_per_node;
    default: return 1;
  }
}

absl::StatusOr<Plan> CompilePlan(const PlanSpec& spec, const CompileOptions& options) {
  return Compile(spec, nullptr, options);
}

absl::StatusOr<Plan> CompilePlanForDispatch(const PlanSpec& spec, const Dispatch& dispatch,
                                            const CompileOptions& options) {
  return Compile(spec, &dispatch, options);
}

}  // namespace hsap::plan
