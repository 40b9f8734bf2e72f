#include "server/exec/executor.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/mask.h"
#include "common/status_macros.h"
#include "server/exec/pack.h"

namespace hsap::exec {
namespace {

namespace kc = kernels::cpu;
using plan::Payload;
using plan::RowSpace;
using plan::Stage;
using plan::Transfer;
using plan::SharedList;
using plan::WorkItem;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int kForwardPass = 0;
constexpr int kBackwardPass = 1;

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

class RankRun {
 public:
  RankRun(const plan::Plan& plan, int32_t rank, const kc::AttentionShape& shape,
          const RankBuffers& buffers, transport::Transport* transport, kc::ThreadPool* pool,
          absl::Time deadline, uint64_t call_tag, int pass)
      : plan_(plan),
        rank_(rank),
        shape_(shape),
        buf_(buffers),
        transport_(transport),
        pool_(pool),
        deadline_(deadline),
        call_tag_(call_tag),
        pass_(pass) {}

  absl::Status Run(ExecStats* stats);

 private:
  const std::vector<Stage>& stages() const {
    return pass_ == kForwardPass ? rp_->forward : rp_->backward;
  }
  bool backward() const { return pass_ == kBackwardPass; }
  int64_t ElemBytes() const { return DTypeSize(shape_.dtype); }
  char* Row(const RowsView& v, int64_t row, int64_t head) const {
    return v.base + (row * v.stride + head * D_) * es_;
  }
  char* Local(const void* tensor, int64_t row, int64_t head, int64_t heads) const {
    return static_cast<char*>(const_cast<void*>(tensor)) + ((row * heads + head) * D_) * es_;
  }
  kc::AttentionShape GroupShape(const HeadGroup& g) const {
    kc::AttentionShape s = shape_;
    s.num_heads_q = g.num_q;
    s.num_heads_kv = g.num_kv;
    return s;
  }

  absl::Status Validate();
  absl::Status CheckTransfer(const Transfer& t, bool is_send, bool is_return, size_t stage);
  absl::Status CheckItem(const WorkItem& w, size_t stage);
  int64_t SpaceRows(RowSpace s) const {
    return s == RowSpace::kLocal ? local_rows_ : s == RowSpace::kHome ? home_rows_ : recv_rows_;
  }
  void Allocate();

  // One grouped exchange: packs `sends`, posts them with `recvs`, runs
  // `overlap`, waits, lands what did not arrive in place.
  absl::Status Exchange(uint64_t tag, const plan::TransferList& sends,
                        const plan::TransferList& recvs, const std::function<void()>& overlap);
  void Pack(const Transfer& t, char* dst);
  void Unpack(const Transfer& t, const char* src);
  // A rank's own rows in a head all-to-all: pack as if sent, unpack as if
  // received (to_home: local rows -> home rows, else home -> local).
  void SelfCopy(Payload payload, bool to_home);

  void RunForwardItems(const SharedList<WorkItem>& items);
  void RunBackwardItems(const SharedList<WorkItem>& items);
  void FinishForward();
  void FinishBackward();

  const plan::Plan& plan_;
  const int32_t rank_;
  kc::AttentionShape shape_;
  const RankBuffers buf_;
  transport::Transport* const transport_;
  kc::ThreadPool* const pool_;
  const absl::Time deadline_;
  const uint64_t call_tag_;
  const int pass_;

  const plan::RankPlan* rp_ = nullptr;
  int32_t U_ = 1, Hq_ = 0, Hkv_ = 0, D_ = 0, nq_ = 0, nkv_ = 0;
  int64_t es_ = 0;
  int64_t local_rows_ = 0, home_rows_ = 0, own_home_row_ = 0, recv_rows_ = 0;
  int64_t return_bytes_ = 0, send_staging_bytes_ = 0, recv_staging_bytes_ = 0;
  std::vector<HeadGroup> groups_;
  ExecStats stats_;

  // Home inputs (views onto the bound tensors when U == 1).
  std::vector<char> home_q_, home_kv_, home_o_, home_do_;
  RowsView q_home_, o_home_, do_home_;
  KvView kv_home_;
  float* lse_home_ = nullptr;  // [nq, lse_stride_]
  int64_t lse_stride_ = 0;
  std::vector<float> home_lse_, delta_;
  // Receive side.
  std::vector<char> recv_kv_, return_buf_, send_staging_, recv_staging_;
  KvView kv_recv_;
  // fp32 accumulators.
  GroupedAcc o_acc_, dq_acc_, dk_home_, dv_home_, dk_recv_, dv_recv_;
  std::vector<float> local_dk_, local_dv_;  // U > 1: [T_local, Hkv, D]
};

absl::Status RankRun::Validate() {
  const plan::PlanSpec& spec = plan_.spec;
  const int32_t P = spec.topology.num_ranks();
  if (static_cast<int32_t>(plan_.ranks.size()) != P || plan_.dispatch.num_ranks() != P) {
    return absl::InternalError(absl::StrCat("plan has ", plan_.ranks.size(), " rank plans and ",
                                            plan_.dispatch.num_ranks(),
                                            " dispatch ranks for a topology of ", P));
  }
  if (rank_ < 0 || rank_ >= P) {
    return absl::InvalidArgumentError(absl::StrCat("rank (", rank_, ") is not in [0, ", P, ")"));
  }
  if (transport_ == nullptr || transport_->size() != P || transport_->rank() != rank_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "transport endpoint is rank ", transport_ ? transport_->rank() : -1, " of ",
        transport_ ? transport_->size() : 0, "; the call is rank ", rank_, " of ", P));
  }
  const plan::HeadShape& hs = spec.shape;
  if (shape_.num_heads_q != hs.num_heads_q || shape_.num_heads_kv != hs.num_heads_kv ||
      shape_.head_dim != hs.head_dim || shape_.dtype != hs.dtype) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shape (Hq ", shape_.num_heads_q, ", Hkv ", shape_.num_heads_kv, ", D ", shape_.head_dim,
        ", ", DTypeName(shape_.dtype), ") does not match the plan's (Hq ", hs.num_heads_q,
        ", Hkv ", hs.num_heads_kv, ", D ", hs.head_dim, ", ", DTypeName(hs.dtype), ")"));
  }
  if (!(shape_.softmax_scale >= 0.f) || !std::isfinite(shape_.softmax_scale)) {
    return absl::InvalidArgumentError(
        absl::StrCat("softmax_scale (", shape_.softmax_scale, ") must be finite and >= 0"));
  }
  if (shape_.softmax_scale == 0.f) {
    shape_.softmax_scale = 1.f / std::sqrt(static_cast<float>(shape_.head_dim));
  }
  if (call_tag_ >= (uint64_t{1} << 40)) {
    return absl::InvalidArgumentError(absl::StrCat("call_tag (", call_tag_, ") must be < 2^40"));
  }
  rp_ = &plan_.ranks[rank_];
  if (stages().size() >= (size_t{1} << 22)) {
    return absl::InternalError(absl::StrCat("plan has ", stages().size(), " stages"));
  }
  U_ = plan_.head_group_size;
  Hq_ = hs.num_heads_q;
  Hkv_ = hs.num_heads_kv;
  D_ = hs.head_dim;
  es_ = ElemBytes();
  nq_ = rp_->q_head_end - rp_->q_head_begin;
  nkv_ = rp_->kv_head_end - rp_->kv_head_begin;
  if (U_ < 1 || P % U_ != 0 || nq_ < 0 || nkv_ < 0 || rp_->q_head_begin < 0 ||
      rp_->q_head_end > Hq_ || rp_->kv_head_begin < 0 || rp_->kv_head_end > Hkv_ ||
      (U_ == 1 && (nq_ != Hq_ || nkv_ != Hkv_)) || (U_ > 1 && stages().size() < 2)) {
    return absl::InternalError(absl::StrCat("rank ", rank_, ": head group ", U_, " and slot q [",
                                            rp_->q_head_begin, ", ", rp_->q_head_end, ") kv [",
                                            rp_->kv_head_begin, ", ", rp_->kv_head_end,
                                            ") do not fit the plan"));
  }
  if (rp_->kv_row_bytes != PayloadRowBytes(Payload::kKv, 0, nkv_, D_, shape_.dtype)) {
    return absl::InternalError(absl::StrCat("rank ", rank_, ": kv_row_bytes ", rp_->kv_row_bytes,
                                            " for ", nkv_, " kv heads"));
  }
  groups_ = HeadGroupsOf(rp_->q_head_begin, rp_->q_head_end, rp_->kv_head_begin,
                         rp_->kv_head_end, Hq_ / Hkv_);
  local_rows_ = plan_.dispatch.TokensOf(rank_);
  const int32_t g0 = rank_ / U_ * U_;
  home_rows_ = 0;
  for (int32_t m = g0; m < g0 + U_; ++m) {
    if (m == rank_) own_home_row_ = home_rows_;
    home_rows_ += plan_.dispatch.TokensOf(m);
  }
  if (local_rows_ > 0) {
    const bool missing =
        !buf_.q || !buf_.k || !buf_.v || !buf_.o || !buf_.lse ||
        (backward() && (!buf_.d_o || !buf_.dq || !buf_.dk || !buf_.dv));
    if (missing) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", rank_, " holds ", local_rows_, " tokens but a ",
          backward() ? "backward (q, k, v, o, lse, d_o, dq, dk, dv)"
                     : "forward (q, k, v, o, lse)",
          " buffer is null"));
    }
  }
  // Buffer extents, then every transfer and item against them.
  recv_rows_ = 0;
  for (const Stage& st : stages()) {
    int64_t send = 0, ret_send = 0, staged = 0;
    for (const Transfer& t : st.sends) send += t.bytes;
    for (const Transfer& t : st.return_sends) ret_send += t.bytes;
    for (const Transfer& t : st.recvs) {
      if (t.space == RowSpace::kRecv) {
        if (rp_->kv_row_bytes <= 0 || t.buffer_offset % rp_->kv_row_bytes != 0 ||
            t.bytes % rp_->kv_row_bytes != 0) {
          return absl::InternalError(absl::StrCat("rank ", rank_, ": receive from ", t.peer,
                                                  " at buffer offset ", t.buffer_offset, " of ",
                                                  t.bytes, " bytes is not in whole rows of ",
                                                  rp_->kv_row_bytes));
        }
        recv_rows_ = std::max(recv_rows_, (t.buffer_offset + t.bytes) / rp_->kv_row_bytes);
      } else {
        staged += t.bytes;
      }
    }
    for (const Transfer& t : st.return_recvs) {
      return_bytes_ = std::max(return_bytes_, t.buffer_offset + t.bytes);
    }
    send_staging_bytes_ = std::max({send_staging_bytes_, send, ret_send});
    recv_staging_bytes_ = std::max(recv_staging_bytes_, staged);
  }
  for (size_t s = 0; s < stages().size(); ++s) {
    const Stage& st = stages()[s];
    for (const Transfer& t : st.sends) HSAP_RETURN_IF_ERROR(CheckTransfer(t, true, false, s));
    for (const Transfer& t : st.recvs) HSAP_RETURN_IF_ERROR(CheckTransfer(t, false, false, s));
    for (const Transfer& t : st.return_sends) {
      HSAP_RETURN_IF_ERROR(CheckTransfer(t, true, true, s));
    }
    for (const Transfer& t : st.return_recvs) {
      HSAP_RETURN_IF_ERROR(CheckTransfer(t, false, true, s));
    }
    for (const WorkItem& w : st.overlap_items) HSAP_RETURN_IF_ERROR(CheckItem(w, s));
    for (const WorkItem& w : st.items) HSAP_RETURN_IF_ERROR(CheckItem(w, s));
  }
  return absl::OkStatus();
}

absl::Status RankRun::CheckTransfer(const Transfer& t, bool is_send, bool is_return,
                                    size_t stage) {
  auto bad = [&](absl::string_view why) {
    return absl::InternalError(absl::StrCat(
        "rank ", rank_, backward() ? " backward" : " forward", " stage ", stage, ": ",
        is_return ? "return " : "", is_send ? "send to " : "receive from ", t.peer, " (",
        plan::PayloadName(t.payload), "): ", why));
  };
  if (t.peer < 0 || t.peer >= transport_->size()) return bad("peer out of range");
  const Payload p = t.payload;
  const bool fwd_ok = p == Payload::kKv || p == Payload::kQkvHeads || p == Payload::kOutLseHeads;
  const bool bwd_ok = p == Payload::kKv || p == Payload::kBwdHeads || p == Payload::kGradQkvHeads;
  if (is_return ? p != Payload::kGradKv : (backward() ? !bwd_ok : !fwd_ok)) {
    return bad("payload not allowed here");
  }
  // Where each payload's rows live (Exchange and Pack rely on it).
  const RowSpace want =
      p == Payload::kKv ? (is_send ? RowSpace::kHome : RowSpace::kRecv)
      : p == Payload::kGradKv ? (is_send ? RowSpace::kRecv : RowSpace::kHome)
      : (p == Payload::kQkvHeads || p == Payload::kBwdHeads) == is_send ? RowSpace::kLocal
                                                                          : RowSpace::kHome;
  if (t.space != want) return bad("rows in an unexpected row space");
  if (t.q_head_begin < 0 || t.q_head_end > Hq_ || t.q_head_begin > t.q_head_end ||
      t.kv_head_begin < 0 || t.kv_head_end > Hkv_ || t.kv_head_begin > t.kv_head_end) {
    return bad("heads out of range");
  }
  // Heads that must be this rank's slot: what is read from or written to
  // home rows or the receive buffer.
  const bool own_heads = p == Payload::kKv || p == Payload::kGradKv ||
                         (!is_send && (p == Payload::kQkvHeads || p == Payload::kBwdHeads)) ||
                         (is_send && (p == Payload::kOutLseHeads || p == Payload::kGradQkvHeads));
  if (own_heads && (t.q_head_begin != rp_->q_head_begin || t.q_head_end != rp_->q_head_end ||
                    t.kv_head_begin != rp_->kv_head_begin || t.kv_head_end != rp_->kv_head_end)) {
    return bad("heads are not the rank's slot");
  }
  const int64_t row_bytes =
      PayloadRowBytes(p, t.q_head_end - t.q_head_begin, t.kv_head_end - t.kv_head_begin, D_,
                      shape_.dtype);
  if (t.bytes != t.rows() * row_bytes) {
    return bad(absl::StrCat(t.bytes, " bytes for ", t.rows(), " rows of ", row_bytes));
  }
  const int64_t limit = SpaceRows(t.space);
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

absl::Status RankRun::CheckItem(const WorkItem& w, size_t stage) {
  const int64_t kv_limit = w.kv_space == RowSpace::kRecv ? recv_rows_ : home_rows_;
  if (w.num_q < 0 || w.num_k < 0 || w.q_row < 0 || w.q_row + w.num_q > home_rows_ ||
      w.kv_row < 0 || w.kv_row + w.num_k > kv_limit || w.kv_space == RowSpace::kLocal ||
      (w.num_q > 0 && groups_.empty())) {
    return absl::InternalError(absl::StrCat(
        "rank ", rank_, " stage ", stage, ": work item q rows [", w.q_row, ", ",
        w.q_row + w.num_q, ") of ", home_rows_, ", kv rows [", w.kv_row, ", ",
        w.kv_row + w.num_k, ") of ", kv_limit, " in space ", static_cast<int>(w.kv_space)));
  }
  return absl::OkStatus();
}

void RankRun::Allocate() {
  std::vector<int32_t> q_widths, kv_widths;
  for (const HeadGroup& g : groups_) {
    q_widths.push_back(g.num_q);
    kv_widths.push_back(g.num_kv);
  }
  const int64_t kv_row = 2 * int64_t{nkv_} * D_;  // elements of an interleaved K/V row
  if (U_ == 1) {
    q_home_ = {static_cast<char*>(const_cast<void*>(buf_.q)), int64_t{Hq_} * D_};
    kv_home_ = {{static_cast<char*>(const_cast<void*>(buf_.k)), int64_t{Hkv_} * D_},
                {static_cast<char*>(const_cast<void*>(buf_.v)), int64_t{Hkv_} * D_}};
    o_home_ = {static_cast<char*>(buf_.o), int64_t{Hq_} * D_};
    do_home_ = {static_cast<char*>(const_cast<void*>(buf_.d_o)), int64_t{Hq_} * D_};
    lse_home_ = buf_.lse;
    lse_stride_ = local_rows_;
  } else {
    home_q_.assign(home_rows_ * nq_ * D_ * es_, 0);
    home_kv_.assign(home_rows_ * kv_row * es_, 0);
    q_home_ = {home_q_.data(), int64_t{nq_} * D_};
    kv_home_ = {{home_kv_.data(), kv_row}, {home_kv_.data() + nkv_ * D_ * es_, kv_row}};
    home_lse_.assign(nq_ * home_rows_, kNegInf);
    lse_home_ = home_lse_.data();
    lse_stride_ = home_rows_;
    if (backward()) {
      home_o_.assign(home_rows_ * nq_ * D_ * es_, 0);
      home_do_.assign(home_rows_ * nq_ * D_ * es_, 0);
      o_home_ = {home_o_.data(), int64_t{nq_} * D_};
      do_home_ = {home_do_.data(), int64_t{nq_} * D_};
      local_dk_.assign(local_rows_ * Hkv_ * D_, 0.f);
      local_dv_.assign(local_rows_ * Hkv_ * D_, 0.f);
    }
  }
  recv_kv_.assign(recv_rows_ * kv_row * es_, 0);
  kv_recv_ = {{recv_kv_.data(), kv_row}, {recv_kv_.data() + nkv_ * D_ * es_, kv_row}};
  return_buf_.assign(return_bytes_, 0);
  send_staging_.assign(send_staging_bytes_, 0);
  recv_staging_.assign(recv_staging_bytes_, 0);
  stats_.recv_buffer_bytes = static_cast<int64_t>(recv_kv_.size() + return_buf_.size());
  if (!backward()) {
    o_acc_ = GroupedAcc(q_widths, home_rows_, D_);
    if (U_ == 1 && lse_home_ != nullptr) std::fill_n(lse_home_, nq_ * local_rows_, kNegInf);
  } else {
    dq_acc_ = GroupedAcc(q_widths, home_rows_, D_);
    dk_home_ = GroupedAcc(kv_widths, home_rows_, D_);
    dv_home_ = GroupedAcc(kv_widths, home_rows_, D_);
    dk_recv_ = GroupedAcc(kv_widths, recv_rows_, D_);
    dv_recv_ = GroupedAcc(kv_widths, recv_rows_, D_);
    delta_.assign(nq_ * lse_stride_, 0.f);
  }
}

void RankRun::Pack(const Transfer& t, char* dst) {
  const int64_t qn = t.q_head_end - t.q_head_begin, kvn = t.kv_head_end - t.kv_head_begin;
  const int64_t qb = t.q_head_begin, kb = t.kv_head_begin;
  const int64_t qs = qb - rp_->q_head_begin, ks = kb - rp_->kv_head_begin;  // slot offsets
  const int64_t qbytes = qn * D_ * es_, kvbytes = kvn * D_ * es_, e = D_ * es_;
  const int64_t rb = PayloadRowBytes(t.payload, qn, kvn, D_, shape_.dtype);
  auto put_lse = [&](char* out, const float* lse, int64_t stride, int64_t head0, int64_t row) {
    for (int64_t j = 0; j < qn; ++j) std::memcpy(out + 4 * j, lse + (head0 + j) * stride + row, 4);
  };
  ForEachRow(t, rb, [&](int64_t row, int64_t off) {
    char* out = dst + off;
    switch (t.payload) {
      case Payload::kKv:
        std::memcpy(out, Row(kv_home_.k, row, 0), kvbytes);
        std::memcpy(out + kvbytes, Row(kv_home_.v, row, 0), kvbytes);
        break;
      case Payload::kQkvHeads:
        std::memcpy(out, Local(buf_.q, row, qb, Hq_), qbytes);
        std::memcpy(out + qbytes, Local(buf_.k, row, kb, Hkv_), kvbytes);
        std::memcpy(out + qbytes + kvbytes, Local(buf_.v, row, kb, Hkv_), kvbytes);
        break;
      case Payload::kOutLseHeads:
        for (int64_t j = 0; j < qn; ++j) {
          StoreFloats(o_acc_.Head(row, qs + j), D_, shape_.dtype, out + j * e);
        }
        put_lse(out + qbytes, lse_home_, lse_stride_, qs, row);
        break;
      case Payload::kBwdHeads:
        std::memcpy(out, Local(buf_.q, row, qb, Hq_), qbytes);
        std::memcpy(out + qbytes, Local(buf_.o, row, qb, Hq_), qbytes);
        std::memcpy(out + 2 * qbytes, Local(buf_.d_o, row, qb, Hq_), qbytes);
        std::memcpy(out + 3 * qbytes, Local(buf_.k, row, kb, Hkv_), kvbytes);
        std::memcpy(out + 3 * qbytes + kvbytes, Local(buf_.v, row, kb, Hkv_), kvbytes);
        put_lse(out + 3 * qbytes + 2 * kvbytes, buf_.lse, local_rows_, qb, row);
        break;
      case Payload::kGradQkvHeads:
        for (int64_t j = 0; j < qn; ++j) {
          StoreFloats(dq_acc_.Head(row, qs + j), D_, shape_.dtype, out + j * e);
        }
        for (int64_t j = 0; j < kvn; ++j) {
          StoreFloats(dk_home_.Head(row, ks + j), D_, shape_.dtype, out + qbytes + j * e);
          StoreFloats(dv_home_.Head(row, ks + j), D_, shape_.dtype,
                      out + qbytes + kvbytes + j * e);
        }
        break;
      case Payload::kGradKv:
        for (int64_t j = 0; j < kvn; ++j) {
          StoreFloats(dk_recv_.Head(row, j), D_, shape_.dtype, out + j * e);
          StoreFloats(dv_recv_.Head(row, j), D_, shape_.dtype, out + kvbytes + j * e);
        }
        break;
    }
  });
}

void RankRun::Unpack(const Transfer& t, const char* src) {
  const int64_t qn = t.q_head_end - t.q_head_begin, kvn = t.kv_head_end - t.kv_head_begin;
  const int64_t qb = t.q_head_begin, kb = t.kv_head_begin;
  const int64_t qbytes = qn * D_ * es_, kvbytes = kvn * D_ * es_, e = D_ * es_;
  const int64_t rb = PayloadRowBytes(t.payload, qn, kvn, D_, shape_.dtype);
  auto get_lse = [&](const char* in, float* lse, int64_t stride, int64_t head0, int64_t row) {
    for (int64_t j = 0; j < qn; ++j) std::memcpy(lse + (head0 + j) * stride + row, in + 4 * j, 4);
  };
  ForEachRow(t, rb, [&](int64_t row, int64_t off) {
    const char* in = src + off;
    switch (t.payload) {
      case Payload::kKv:  // lands in place (kRecv)
        break;
      case Payload::kQkvHeads:
        std::memcpy(Row(q_home_, row, 0), in, qbytes);
        std::memcpy(Row(kv_home_.k, row, 0), in + qbytes, kvbytes);
        std::memcpy(Row(kv_home_.v, row, 0), in + qbytes + kvbytes, kvbytes);
        break;
      case Payload::kOutLseHeads:
        std::memcpy(Local(buf_.o, row, qb, Hq_), in, qbytes);
        get_lse(in + qbytes, buf_.lse, local_rows_, qb, row);
        break;
      case Payload::kBwdHeads:
        std::memcpy(Row(q_home_, row, 0), in, qbytes);
        std::memcpy(Row(o_home_, row, 0), in + qbytes, qbytes);
        std::memcpy(Row(do_home_, row, 0), in + 2 * qbytes, qbytes);
        std::memcpy(Row(kv_home_.k, row, 0), in + 3 * qbytes, kvbytes);
        std::memcpy(Row(kv_home_.v, row, 0), in + 3 * qbytes + kvbytes, kvbytes);
        get_lse(in + 3 * qbytes + 2 * kvbytes, lse_home_, lse_stride_, 0, row);
        break;
      case Payload::kGradQkvHeads: {
        std::memcpy(Local(buf_.dq, row, qb, Hq_), in, qbytes);
        const int64_t first = (row * Hkv_ + kb) * D_;
        AddAsFloats(in + qbytes, kvn * D_, shape_.dtype, local_dk_.data() + first);
        AddAsFloats(in + qbytes + kvbytes, kvn * D_, shape_.dtype, local_dv_.data() + first);
        break;
      }
      case Payload::kGradKv:
        for (int64_t j = 0; j < kvn; ++j) {
          AddAsFloats(in + j * e, D_, shape_.dtype, dk_home_.Head(row, j));
          AddAsFloats(in + kvbytes + j * e, D_, shape_.dtype, dv_home_.Head(row, j));
        }
        break;
    }
  });
}

void RankRun::SelfCopy(Payload payload, bool to_home) {
  if (nq_ == 0 || local_rows_ == 0) return;
  Transfer from, to;
  from.payload = to.payload = payload;
  for (Transfer* t : {&from, &to}) {
    t->q_head_begin = rp_->q_head_begin;
    t->q_head_end = rp_->q_head_end;
    t->kv_head_begin = rp_->kv_head_begin;
    t->kv_head_end = rp_->kv_head_end;
  }
  from.segments.push_back({0, local_rows_, to_home ? 0 : own_home_row_});
  to.segments.push_back({0, local_rows_, to_home ? own_home_row_ : 0});
  std::vector<char> tmp(local_rows_ * PayloadRowBytes(payload, nq_, nkv_, D_, shape_.dtype));
  Pack(from, tmp.data());
  Unpack(to, tmp.data());
}

absl::Status RankRun::Exchange(uint64_t tag, const plan::TransferList& sends,
                               const plan::TransferList& recvs,
                               const std::function<void()>& overlap) {
  std::vector<transport::SendOp> send_ops;
  std::vector<transport::RecvOp> recv_ops;
  std::vector<std::pair<const Transfer*, const char*>> landed;
  int64_t offset = 0;
  for (const Transfer& t : sends) {
    char* dst = send_staging_.data() + offset;
    Pack(t, dst);
    send_ops.push_back({t.peer, dst, t.bytes});
    offset += t.bytes;
  }
  offset = 0;
  for (const Transfer& t : recvs) {
    char* dst;
    if (t.payload == Payload::kKv) {
      dst = recv_kv_.data() + t.buffer_offset;
    } else if (t.payload == Payload::kGradKv) {
      dst = return_buf_.data() + t.buffer_offset;
      landed.push_back({&t, dst});
    } else {
      dst = recv_staging_.data() + offset;
      offset += t.bytes;
      landed.push_back({&t, dst});
    }
    recv_ops.push_back({t.peer, dst, t.bytes});
  }
  // Every rank calls Start for every (stage, phase), even with nothing to
  // move: transports that number exchanges (UCX) stay aligned that way.
  HSAP_ASSIGN_OR_RETURN(std::unique_ptr<transport::PendingExchange> pending,
                        transport_->Start(tag, send_ops, recv_ops));
  overlap();
  const absl::Time wait_start = absl::Now();
  const absl::Status status = pending->Wait(deadline_);
  stats_.wait_seconds += absl::ToDoubleSeconds(absl::Now() - wait_start);
  HSAP_RETURN_IF_ERROR(status);
  for (const auto& [t, src] : landed) Unpack(*t, src);
  return absl::OkStatus();
}

void RankRun::RunForwardItems(const SharedList<WorkItem>& items) {
  if (items.empty()) return;
  const absl::Time start = absl::Now();
  for (const WorkItem& w : items) {
    stats_.area += SliceArea({0, w.num_q, 0, w.num_k, w.type, w.offset, w.window});
  }
  std::vector<kc::FwdWorkItem> list;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const HeadGroup& g = groups_[gi];
    list.clear();
    for (const WorkItem& w : items) {
      const KvView& kv = w.kv_space == RowSpace::kRecv ? kv_recv_ : kv_home_;
      kc::FwdWorkItem it;
      it.q = Row(q_home_, w.q_row, g.q_off);
      it.k = Row(kv.k, w.kv_row, g.kv_off);
      it.v = Row(kv.v, w.kv_row, g.kv_off);
      it.num_q = w.num_q;
      it.num_k = w.num_k;
      it.q_row_stride = q_home_.stride;
      it.kv_row_stride = kv.k.stride;
      it.type = w.type;
      it.offset = w.offset;
      it.window = w.window;
      it.o_acc = o_acc_.At(static_cast<int>(gi), w.q_row);
      it.lse_acc = lse_home_ + g.q_off * lse_stride_ + w.q_row;
      it.lse_stride = lse_stride_;
      list.push_back(it);
    }
    kc::Forward(GroupShape(g), list, pool_);
  }
  stats_.compute_seconds += absl::ToDoubleSeconds(absl::Now() - start);
}

void RankRun::RunBackwardItems(const SharedList<WorkItem>& items) {
  if (items.empty()) return;
  const absl::Time start = absl::Now();
  for (const WorkItem& w : items) {
    stats_.area += SliceArea({0, w.num_q, 0, w.num_k, w.type, w.offset, w.window});
  }
  std::vector<kc::BwdWorkItem> list;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const HeadGroup& g = groups_[gi];
    const int gint = static_cast<int>(gi);
    list.clear();
    for (const WorkItem& w : items) {
      const bool in_recv = w.kv_space == RowSpace::kRecv;
      const KvView& kv = in_recv ? kv_recv_ : kv_home_;
      kc::BwdWorkItem it;
      it.q = Row(q_home_, w.q_row, g.q_off);
      it.dout = Row(do_home_, w.q_row, g.q_off);
      it.k = Row(kv.k, w.kv_row, g.kv_off);
      it.v = Row(kv.v, w.kv_row, g.kv_off);
      it.lse = lse_home_ + g.q_off * lse_stride_ + w.q_row;
      it.delta = delta_.data() + g.q_off * lse_stride_ + w.q_row;
      it.lse_stride = lse_stride_;
      it.num_q = w.num_q;
      it.num_k = w.num_k;
      it.q_row_stride = q_home_.stride;
      it.kv_row_stride = kv.k.stride;
      it.type = w.type;
      it.offset = w.offset;
      it.window = w.window;
      it.dq_acc = dq_acc_.At(gint, w.q_row);
      it.dk_acc = (in_recv ? dk_recv_ : dk_home_).At(gint, w.kv_row);
      it.dv_acc = (in_recv ? dv_recv_ : dv_home_).At(gint, w.kv_row);
      list.push_back(it);
    }
    kc::Backward(GroupShape(g), list, pool_);
  }
  stats_.compute_seconds += absl::ToDoubleSeconds(absl::Now() - start);
}

void RankRun::FinishForward() {
  if (U_ > 1) {
    SelfCopy(Payload::kOutLseHeads, /*to_home=*/false);
    return;
  }
  // U == 1: one head group in the layout of o; LSE was accumulated in place.
  if (local_rows_ > 0) {
    kc::CastFromFloat(o_acc_.At(0, 0), local_rows_ * Hq_ * D_, shape_.dtype, buf_.o, pool_);
  }
}

void RankRun::FinishBackward() {
  if (local_rows_ == 0) return;
  if (U_ > 1) {
    SelfCopy(Payload::kGradQkvHeads, /*to_home=*/false);
    kc::CastFromFloat(local_dk_.data(), local_rows_ * Hkv_ * D_, shape_.dtype, buf_.dk, pool_);
    kc::CastFromFloat(local_dv_.data(), local_rows_ * Hkv_ * D_, shape_.dtype, buf_.dv, pool_);
    return;
  }
  kc::CastFromFloat(dq_acc_.At(0, 0), local_rows_ * Hq_ * D_, shape_.dtype, buf_.dq, pool_);
  kc::CastFromFloat(dk_home_.At(0, 0), local_rows_ * Hkv_ * D_, shape_.dtype, buf_.dk, pool_);
  kc::CastFromFloat(dv_home_.At(0, 0), local_rows_ * Hkv_ * D_, shape_.dtype, buf_.dv, pool_);
}

absl::Status RankRun::Run(ExecStats* stats) {
  const absl::Time start = absl::Now();
  HSAP_RETURN_IF_ERROR(Validate());
  const transport::TransferCounters before = transport_->counters();
  Allocate();
  auto compute_delta = [&] {
    if (nq_ == 0 || home_rows_ == 0) return;
    kc::AttentionShape s = shape_;
    s.num_heads_q = nq_;
    s.num_heads_kv = std::max(1, nkv_);
    kc::ComputeDelta(s, o_home_.base, do_home_.base, home_rows_, delta_.data(), lse_stride_,
                     pool_);
  };
  if (U_ > 1) {
    SelfCopy(backward() ? Payload::kBwdHeads : Payload::kQkvHeads, /*to_home=*/true);
  } else if (backward()) {
    compute_delta();
  }
  absl::Status status;
  for (size_t s = 0; s < stages().size() && status.ok(); ++s) {
    const Stage& st = stages()[s];
    const int32_t si = static_cast<int32_t>(s);
    if (!backward()) {
      status = Exchange(ExchangeTag(call_tag_, pass_, si, 0), st.sends, st.recvs,
                        [&] { RunForwardItems(st.overlap_items); });
      if (status.ok()) RunForwardItems(st.items);
      continue;
    }
    status = Exchange(ExchangeTag(call_tag_, pass_, si, 0), st.sends, st.recvs,
                      [&] { RunBackwardItems(st.overlap_items); });
    if (!status.ok()) break;
    if (U_ > 1 && s == 0) compute_delta();  // home O, dO complete after the head scatter
    if (!st.items.empty() || !st.return_sends.empty()) {
      // Received rows no item reads still return (zero) partials.
      dk_recv_.ZeroRows(recv_rows_);
      dv_recv_.ZeroRows(recv_rows_);
      RunBackwardItems(st.items);
    }
    status = Exchange(ExchangeTag(call_tag_, pass_, si, 1), st.return_sends, st.return_recvs,
                      [] {});
  }
  if (status.ok()) {
    const absl::Time finish = absl::Now();
    backward() ? FinishBackward() : FinishForward();
    stats_.compute_seconds += absl::ToDoubleSeconds(absl::Now() - finish);
  }
  const transport::TransferCounters after = transport_->counters();
  for (int t = 0; t < 2; ++t) {
    stats_.sent_bytes[t] = after.sent_bytes[t] - before.sent_bytes[t];
    stats_.received_bytes[t] = after.received_bytes[t] - before.received_bytes[t];
  }
  stats_.head_area = stats_.area * nq_;
  stats_.stages = static_cast<int32_t>(stages().size());
  stats_.total_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  if (stats != nullptr) *stats = stats_;
  return status;
}

}  // namespace

uint64_t ExchangeTag(uint64_t call_tag, int pass, int32_t stage, int phase) {
  return call_tag << 24 | static_cast<uint64_t>(pass & 1) << 23 |
         static_cast<uint64_t>(stage) << 1 | static_cast<uint64_t>(phase & 1);
}

absl::Status RunForward(const plan::Plan& plan, int32_t rank,
                        const kernels::cpu::AttentionShape& shape, const RankBuffers& buffers,
                        transport::Transport* transport, kernels::cpu::ThreadPool* pool,
                        absl::Time deadline, uint64_t call_tag, ExecStats* stats) {
  RankRun run(plan, rank, shape, buffers, transport, pool, deadline, call_tag, kForwardPass);
  return run.Run(stats);
}

absl::Status RunBackward(const plan::Plan& plan, int32_t rank,
                         const kernels::cpu::AttentionShape& shape, const RankBuffers& buffers,
                         transport::Transport* transport, kernels::cpu::ThreadPool* pool,
                         absl::Time deadline, uint64_t call_tag, ExecStats* stats) {
  RankRun run(plan, rank, shape, buffers, transport, pool, deadline, call_tag, kBackwardPass);
  return run.Run(stats);
}

}  // namespace hsap::exec
