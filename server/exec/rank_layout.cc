#include "server/exec/rank_layout.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/plan/wire_layout.h"

namespace hsap::exec {
namespace {

using plan::Payload;
using plan::RowSpace;
using plan::Stage;
using plan::Transfer;
using plan::WorkItem;

absl::Status CheckCall(const plan::Plan& plan, int32_t rank, const kernels::AttentionShape& shape) {
  const plan::PlanSpec& spec = plan.spec;
  const int32_t P = spec.topology.num_ranks();
  if (static_cast<int32_t>(plan.ranks.size()) != P || plan.dispatch.num_ranks() != P) {
    return absl::InternalError(absl::StrCat("plan has ", plan.ranks.size(), " rank plans and ",
                                            plan.dispatch.num_ranks(),
                                            " dispatch ranks for a topology of ", P));
  }
  if (rank < 0 || rank >= P) {
    return absl::InvalidArgumentError(absl::StrCat("rank (", rank, ") is not in [0, ", P, ")"));
  }
  const plan::HeadShape& hs = spec.shape;
  if (shape.num_heads_q != hs.num_heads_q || shape.num_heads_kv != hs.num_heads_kv ||
      shape.head_dim != hs.head_dim || shape.dtype != hs.dtype) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shape (Hq ", shape.num_heads_q, ", Hkv ", shape.num_heads_kv, ", D ", shape.head_dim,
        ", ", DTypeName(shape.dtype), ") does not match the plan's (Hq ", hs.num_heads_q,
        ", Hkv ", hs.num_heads_kv, ", D ", hs.head_dim, ", ", DTypeName(hs.dtype), ")"));
  }
  if (!(shape.softmax_scale >= 0.f) || !std::isfinite(shape.softmax_scale)) {
    return absl::InvalidArgumentError(
        absl::StrCat("softmax_scale (", shape.softmax_scale, ") must be finite and >= 0"));
  }
  return absl::OkStatus();
}

// The head slot, its kernel groups and the row counts.
absl::Status SlotAndRows(const plan::Plan& plan, RankLayout* l) {
  const plan::RankPlan& rp = *l->rank_plan;
  const int32_t P = l->num_ranks, U = l->head_group_size;
  const int32_t Hq = l->shape.num_heads_q, Hkv = l->shape.num_heads_kv, D = l->shape.head_dim;
  l->q_head_begin = rp.q_head_begin;
  l->q_head_end = rp.q_head_end;
  l->kv_head_begin = rp.kv_head_begin;
  l->kv_head_end = rp.kv_head_end;
  l->num_q_heads = rp.q_head_end - rp.q_head_begin;
  l->num_kv_heads = rp.kv_head_end - rp.kv_head_begin;
  const int32_t nq = l->num_q_heads, nkv = l->num_kv_heads;
  if (U < 1 || P % U != 0 || nq < 0 || nkv < 0 || rp.q_head_begin < 0 || rp.q_head_end > Hq ||
      rp.kv_head_begin < 0 || rp.kv_head_end > Hkv || (U == 1 && (nq != Hq || nkv != Hkv)) ||
      (U > 1 && l->stages->size() < 2)) {
    return absl::InternalError(absl::StrCat("rank ", l->rank, ": head group ", U, " and slot q [",
                                            rp.q_head_begin, ", ", rp.q_head_end, ") kv [",
                                            rp.kv_head_begin, ", ", rp.kv_head_end,
                                            ") do not fit the plan"));
  }
  if (rp.kv_row_bytes != plan::PayloadRowBytes(Payload::kKv, 0, nkv, D, l->shape.dtype)) {
    return absl::InternalError(absl::StrCat("rank ", l->rank, ": kv_row_bytes ", rp.kv_row_bytes,
                                            " for ", nkv, " kv heads"));
  }
  l->groups = HeadGroupsOf(rp.q_head_begin, rp.q_head_end, rp.kv_head_begin, rp.kv_head_end,
                           Hq / Hkv);
  for (const HeadGroup& g : l->groups) {
    l->q_widths.push_back(g.num_q);
    l->kv_widths.push_back(g.num_kv);
  }
  l->kv_row_elems = 2 * int64_t{nkv} * D;
  l->local_rows = plan.dispatch.TokensOf(l->rank);
  const int32_t g0 = l->rank / U * U;
  for (int32_t m = g0; m < g0 + U; ++m) {
    if (m == l->rank) l->own_home_row = l->home_rows;
    l->home_rows += plan.dispatch.TokensOf(m);
  }
  return absl::OkStatus();
}

absl::Status CheckBuffers(const RankLayout& l, const RankBuffers& b) {
  if (l.local_rows == 0) return absl::OkStatus();
  const bool missing = !b.q || !b.k || !b.v || !b.o || !b.lse ||
                       (l.backward() && (!b.d_o || !b.dq || !b.dk || !b.dv));
  if (!missing) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "rank ", l.rank, " holds ", l.local_rows, " tokens but a ",
      l.backward() ? "backward (q, k, v, o, lse, d_o, dq, dk, dv)" : "forward (q, k, v, o, lse)",
      " buffer is null"));
}

// The extents of the buffers every stage reuses.
absl::Status BufferExtents(RankLayout* l) {
  const int64_t kv_row_bytes = l->rank_plan->kv_row_bytes;
  for (const Stage& st : *l->stages) {
    int64_t send = 0, ret_send = 0, staged = 0;
    for (const Transfer& t : st.sends) send += t.bytes;
    for (const Transfer& t : st.return_sends) ret_send += t.bytes;
    for (const Transfer& t : st.recvs) {
      if (t.payload == Payload::kGradKv) {
        // Returns riding the stage's exchange (pipelined plans).
        l->return_bytes = std::max(l->return_bytes, t.buffer_offset + t.bytes);
        continue;
      }
      if (t.space != RowSpace::kRecv) {
        staged += t.bytes;
        continue;
      }
      if (kv_row_bytes <= 0 || t.buffer_offset % kv_row_bytes != 0 ||
          t.bytes % kv_row_bytes != 0) {
        return absl::InternalError(absl::StrCat("rank ", l->rank, ": receive from ", t.peer,
                                                " at buffer offset ", t.buffer_offset, " of ",
                                                t.bytes, " bytes is not in whole rows of ",
                                                kv_row_bytes));
      }
      l->recv_rows = std::max(l->recv_rows, (t.buffer_offset + t.bytes) / kv_row_bytes);
    }
    for (const Transfer& t : st.return_recvs) {
      l->return_bytes = std::max(l->return_bytes, t.buffer_offset + t.bytes);
    }
    l->send_staging_bytes = std::max({l->send_staging_bytes, send, ret_send});
    l->recv_staging_bytes = std::max(l->recv_staging_bytes, staged);
  }
  return absl::OkStatus();
}

int64_t SpaceRows(const RankLayout& l, RowSpace s) {
  return s == RowSpace::kLocal ? l.local_rows : s == RowSpace::kHome ? l.home_rows : l.recv_rows;
}

absl::Status CheckTransfer(const RankLayout& l, const Transfer& t, bool is_send, bool is_return,
                           size_t stage) {
  auto bad = [&](absl::string_view why) {
    return absl::InternalError(absl::StrCat(
        "rank ", l.rank, l.backward() ? " backward" : " forward", " stage ", stage, ": ",
        is_return ? "return " : "", is_send ? "send to " : "receive from ", t.peer, " (",
        plan::PayloadName(t.payload), "): ", why));
  };
  if (t.peer < 0 || t.peer >= l.num_ranks) return bad("peer out of range");
  const Payload p = t.payload;
  const bool fwd_ok = p == Payload::kKv || p == Payload::kQkvHeads || p == Payload::kOutLseHeads;
  // A backward exchange may carry returns beside K/V (pipelined plans).
  const bool bwd_ok = p == Payload::kKv || p == Payload::kBwdHeads ||
                      p == Payload::kGradQkvHeads || p == Payload::kGradKv;
  if (is_return ? p != Payload::kGradKv : (l.backward() ? !bwd_ok : !fwd_ok)) {
    return bad("payload not allowed here");
  }
  // Where each payload's rows live (the executor's pack and unpack rely on it).
  const RowSpace want =
      p == Payload::kKv ? (is_send ? RowSpace::kHome : RowSpace::kRecv)
      : p == Payload::kGradKv ? (is_send ? RowSpace::kRecv : RowSpace::kHome)
      : (p == Payload::kQkvHeads || p == Payload::kBwdHeads) == is_send ? RowSpace::kLocal
                                                                          : RowSpace::kHome;
  if (t.space != want) return bad("rows in an unexpected row space");
  const int32_t Hq = l.shape.num_heads_q, Hkv = l.shape.num_heads_kv;
  if (t.q_head_begin < 0 || t.q_head_end > Hq || t.q_head_begin > t.q_head_end ||
      t.kv_head_begin < 0 || t.kv_head_end > Hkv || t.kv_head_begin > t.kv_head_end) {
    return bad("heads out of range");
  }
  // Heads that must be this rank's slot: what is read from or written to
  // home rows or the receive buffer.
  const bool own_heads = p == Payload::kKv || p == Payload::kGradKv ||
                         (!is_send && (p == Payload::kQkvHeads || p == Payload::kBwdHeads)) ||
                         (is_send && (p == Payload::kOutLseHeads || p == Payload::kGradQkvHeads));
  if (own_heads && (t.q_head_begin != l.q_head_begin || t.q_head_end != l.q_head_end ||
                    t.kv_head_begin != l.kv_head_begin || t.kv_head_end != l.kv_head_end)) {
    return bad("heads are not the rank's slot");
  }
  const int64_t row_bytes =
      plan::PayloadRowBytes(p, t.q_head_end - t.q_head_begin, t.kv_head_end - t.kv_head_begin,
                            l.shape.head_dim, l.shape.dtype);
  if (t.bytes != t.rows() * row_bytes) {
    return bad(absl::StrCat(t.bytes, " bytes for ", t.rows(), " rows of ", row_bytes));
  }
  const int64_t limit = SpaceRows(l, t.space);
  int64_t next = t.buffer_offset / std::max<int64_t>(1, row_bytes);
  for (const plan::Segment& s : t.segments) {
    if (s.global_end < s.global_begin || s.row < 0 ||
        s.row + (s.global_end - s.global_begin) > limit) {
      return bad(absl::StrCat("rows [", s.row, ", ", s.row + s.global_end - s.global_begin,
                              ") outside the ", limit, " rows of its space"));
    }
    // Receives land in place in the receive buffer: rows must be the
    // buffer's rows in order.
    if (!is_send && t.space == RowSpace::kRecv && s.row != next) {
      return bad(absl::StrCat("segment at receive row ", s.row, ", expected ", next));
    }
    next = s.row + (s.global_end - s.global_begin);
  }
  return absl::OkStatus();
}

absl::Status CheckItem(const RankLayout& l, const WorkItem& w, size_t stage) {
  const int64_t kv_limit = w.kv_space == RowSpace::kRecv ? l.recv_rows : l.home_rows;
  if (w.num_q < 0 || w.num_k < 0 || w.q_row < 0 || w.q_row + w.num_q > l.home_rows ||
      w.kv_row < 0 || w.kv_row + w.num_k > kv_limit || w.kv_space == RowSpace::kLocal ||
      (w.num_q > 0 && l.groups.empty())) {
    return absl::InternalError(absl::StrCat(
        "rank ", l.rank, " stage ", stage, ": work item q rows [", w.q_row, ", ",
        w.q_row + w.num_q, ") of ", l.home_rows, ", kv rows [", w.kv_row, ", ",
        w.kv_row + w.num_k, ") of ", kv_limit, " in space ", static_cast<int>(w.kv_space)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<RankLayout> LayoutFor(const plan::Plan& plan, int32_t rank, Pass pass,
                                     const kernels::AttentionShape& shape,
                                     const RankBuffers& buffers) {
  HSAP_RETURN_IF_ERROR(CheckCall(plan, rank, shape));
  RankLayout l;
  l.pass = pass;
  l.rank = rank;
  l.num_ranks = plan.spec.topology.num_ranks();
  l.head_group_size = plan.head_group_size;
  l.shape = shape;
  if (l.shape.softmax_scale == 0.f) {
    l.shape.softmax_scale = 1.f / std::sqrt(static_cast<float>(shape.head_dim));
  }
  l.elem_bytes = DTypeSize(shape.dtype);
  l.rank_plan = &plan.ranks[rank];
  l.stages = pass == Pass::kForward ? &l.rank_plan->forward : &l.rank_plan->backward;
  if (l.stages->size() >= (size_t{1} << 22)) {
    return absl::InternalError(absl::StrCat("plan has ", l.stages->size(), " stages"));
  }
  HSAP_RETURN_IF_ERROR(SlotAndRows(plan, &l));
  HSAP_RETURN_IF_ERROR(CheckBuffers(l, buffers));
  HSAP_RETURN_IF_ERROR(BufferExtents(&l));
  for (size_t s = 0; s < l.stages->size(); ++s) {
    const Stage& st = (*l.stages)[s];
    for (const Transfer& t : st.sends) HSAP_RETURN_IF_ERROR(CheckTransfer(l, t, true, false, s));
    for (const Transfer& t : st.recvs) HSAP_RETURN_IF_ERROR(CheckTransfer(l, t, false, false, s));
    for (const Transfer& t : st.return_sends) {
      HSAP_RETURN_IF_ERROR(CheckTransfer(l, t, true, true, s));
    }
    for (const Transfer& t : st.return_recvs) {
      HSAP_RETURN_IF_ERROR(CheckTransfer(l, t, false, true, s));
    }
    for (const WorkItem& w : st.items) HSAP_RETURN_IF_ERROR(CheckItem(l, w, s));
    // Items that run while transfers are in flight read home rows only (a
    // receive may be writing the receive buffer meanwhile); items under the
    // returns exist only in the backward, which runs them.
    if (pass == Pass::kForward && !st.return_overlap_items.empty()) {
      return absl::InternalError(absl::StrCat("rank ", l.rank, " stage ", s, ": ",
                                              st.return_overlap_items.size(),
                                              " return_overlap_items in a forward stage"));
    }
    // Overlap items may read receive rows an earlier stage filled
    // (pipelined plans), never rows this stage's receives are writing.
    std::vector<std::pair<int64_t, int64_t>> landing;  // receive rows [begin, end), sorted
    const int64_t row_bytes = std::max<int64_t>(1, l.rank_plan->kv_row_bytes);
    for (const Transfer& t : st.recvs) {
      if (t.payload != Payload::kKv) continue;
      landing.push_back({t.buffer_offset / row_bytes, (t.buffer_offset + t.bytes) / row_bytes});
    }
    std::sort(landing.begin(), landing.end());
    for (const auto* list : {&st.overlap_items, &st.return_overlap_items}) {
      for (const WorkItem& w : *list) {
        HSAP_RETURN_IF_ERROR(CheckItem(l, w, s));
        if (w.kv_space == RowSpace::kHome) continue;
        // Returns are in flight under return_overlap_items: home rows only.
        if (list == &st.return_overlap_items) {
          return absl::InternalError(absl::StrCat(
              "rank ", l.rank, " stage ", s, ": an item run under the returns reads kv space ",
              static_cast<int>(w.kv_space), ", not home rows"));
        }
        if (w.num_k == 0) continue;
        auto next = std::upper_bound(landing.begin(), landing.end(),
                                     std::make_pair(w.kv_row, INT64_MAX));
        const bool lands_before = next != landing.begin() && std::prev(next)->second > w.kv_row;
        const bool lands_inside = next != landing.end() && next->first < w.kv_row + w.num_k;
        if (lands_before || lands_inside) {
          return absl::InternalError(absl::StrCat(
              "rank ", l.rank, " stage ", s, ": an item run during a transfer reads receive rows [",
              w.kv_row, ", ", w.kv_row + w.num_k, "), which this stage's receives are writing"));
        }
      }
    }
  }
  return l;
}

}  // namespace hsap::exec
