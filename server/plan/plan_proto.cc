#include "server/plan/plan_proto.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/plan/cost_model.h"

namespace hsap::plan {

namespace pb = ::hsap::v1;

pb::DType DTypeToProto(DType t) {
  switch (t) {
    case DType::kFloat32: return pb::DTYPE_FLOAT32;
    case DType::kBFloat16: return pb::DTYPE_BFLOAT16;
    case DType::kFloat16: return pb::DTYPE_FLOAT16;
  }
  return pb::DTYPE_UNSPECIFIED;
}

namespace {

void SliceToProto(const MaskSlice& s, pb::MaskSlice* p) {
  p->set_q_begin(s.q_begin);
  p->set_q_end(s.q_end);
  p->set_k_begin(s.k_begin);
  p->set_k_end(s.k_end);
  p->set_type(s.type == MaskType::kCausal ? pb::MASK_TYPE_CAUSAL : pb::MASK_TYPE_FULL);
  p->set_offset(s.offset);
  if (s.window >= 0) p->set_window(s.window);
}

void TransferToProto(const Transfer& t, pb::Transfer* p) {
  p->set_peer(t.peer);
  p->set_payload(static_cast<pb::Payload>(t.payload));
  p->set_tier(static_cast<pb::LinkTier>(t.tier));
  p->set_space(static_cast<pb::RowSpace>(t.space));
  p->set_q_head_begin(t.q_head_begin);
  p->set_q_head_end(t.q_head_end);
  p->set_kv_head_begin(t.kv_head_begin);
  p->set_kv_head_end(t.kv_head_end);
  p->mutable_segments()->Reserve(static_cast<int>(t.segments.size()));
  for (const Segment& s : t.segments) {
    pb::Segment* ps = p->add_segments();
    ps->set_global_begin(s.global_begin);
    ps->set_global_end(s.global_end);
    ps->set_row(s.row);
  }
  p->set_buffer_offset(t.buffer_offset);
  p->set_bytes(t.bytes);
}

Transfer TransferFromProto(const pb::Transfer& p) {
  Transfer t;
  t.peer = p.peer();
  t.payload = static_cast<Payload>(p.payload());
  t.tier = static_cast<LinkTier>(p.tier());
  t.space = static_cast<RowSpace>(p.space());
  t.q_head_begin = p.q_head_begin();
  t.q_head_end = p.q_head_end();
  t.kv_head_begin = p.kv_head_begin();
  t.kv_head_end = p.kv_head_end();
  t.segments.reserve(p.segments_size());
  for (const pb::Segment& s : p.segments()) {
    t.segments.push_back({s.global_begin(), s.global_end(), s.row()});
  }
  t.buffer_offset = p.buffer_offset();
  t.bytes = p.bytes();
  return t;
}

void ItemToProto(const WorkItem& w, pb::WorkItem* p) {
  p->set_q_row(w.q_row);
  p->set_num_q(w.num_q);
  p->set_kv_space(static_cast<pb::RowSpace>(w.kv_space));
  p->set_kv_row(w.kv_row);
  p->set_num_k(w.num_k);
  p->set_type(w.type == MaskType::kCausal ? pb::MASK_TYPE_CAUSAL : pb::MASK_TYPE_FULL);
  p->set_offset(w.offset);
  p->set_window(w.window);
}

WorkItem ItemFromProto(const pb::WorkItem& p) {
  WorkItem w;
  w.q_row = p.q_row();
  w.num_q = p.num_q();
  w.kv_space = static_cast<RowSpace>(p.kv_space());
  w.kv_row = p.kv_row();
  w.num_k = p.num_k();
  w.type = p.type() == pb::MASK_TYPE_CAUSAL ? MaskType::kCausal : MaskType::kFull;
  w.offset = p.offset();
  w.window = p.window();
  return w;
}

template <typename Src, typename Dst, typename F>
void Each(const Src& src, Dst* dst, F&& f) {
  dst->Reserve(static_cast<int>(src.size()));
  for (const auto& x : src) f(x, dst->Add());
}

void StageToProto(const Stage& st, pb::Stage* p) {
  Each(st.sends, p->mutable_sends(), TransferToProto);
  Each(st.recvs, p->mutable_recvs(), TransferToProto);
  Each(st.overlap_items, p->mutable_overlap_items(), ItemToProto);
  Each(st.items, p->mutable_items(), ItemToProto);
  Each(st.return_sends, p->mutable_return_sends(), TransferToProto);
  Each(st.return_recvs, p->mutable_return_recvs(), TransferToProto);
  Each(st.return_overlap_items, p->mutable_return_overlap_items(), ItemToProto);
}

template <typename T, typename P, typename F>
std::vector<T> Collect(const P& repeated, F&& f) {
  std::vector<T> out;
  out.reserve(repeated.size());
  for (const auto& x : repeated) out.push_back(f(x));
  return out;
}

Stage StageFromProto(const pb::Stage& p) {
  Stage st;
  st.sends = Collect<Transfer>(p.sends(), TransferFromProto);
  st.recvs = Collect<Transfer>(p.recvs(), TransferFromProto);
  st.overlap_items = Collect<WorkItem>(p.overlap_items(), ItemFromProto);
  st.items = Collect<WorkItem>(p.items(), ItemFromProto);
  st.return_sends = Collect<Transfer>(p.return_sends(), TransferFromProto);
  st.return_recvs = Collect<Transfer>(p.return_recvs(), TransferFromProto);
  st.return_overlap_items = Collect<WorkItem>(p.return_overlap_items(), ItemFromProto);
  return st;
}

template <typename T, size_t N, typename R>
void ArrayFrom(const R& repeated, std::array<T, N>* out) {
  for (size_t i = 0; i < N; ++i) {
    (*out)[i] = static_cast<int>(i) < repeated.size() ? repeated.Get(static_cast<int>(i)) : T{};
  }
}

RankStats RankStatsFromProto(const pb::RankStats& p) {
  RankStats s;
  s.tokens = p.tokens();
  s.home_tokens = p.home_tokens();
  s.area = p.area();
  s.head_area = p.head_area();
  ArrayFrom(p.fwd_recv_bytes(), &s.fwd_recv_bytes);
  ArrayFrom(p.fwd_send_bytes(), &s.fwd_send_bytes);
  ArrayFrom(p.bwd_recv_bytes(), &s.bwd_recv_bytes);
  ArrayFrom(p.bwd_send_bytes(), &s.bwd_send_bytes);
  s.lower_bound_recv_bytes = p.lower_bound_recv_bytes();
  s.exact_need_bytes = p.exact_need_bytes();
  s.peak_recv_buffer_bytes = p.peak_recv_buffer_bytes();
  s.fwd_compute_us = p.fwd_compute_us();
  s.bwd_compute_us = p.bwd_compute_us();
  ArrayFrom(p.fwd_transfer_us(), &s.fwd_transfer_us);
  ArrayFrom(p.bwd_transfer_us(), &s.bwd_transfer_us);
  s.fwd_us = p.fwd_us();
  s.bwd_us = p.bwd_us();
  return s;
}

bool KnownPayload(const Transfer& t) {
  return static_cast<int>(t.payload) <= static_cast<int>(Payload::kGradQkvHeads) &&
         static_cast<int>(t.space) <= static_cast<int>(RowSpace::kRecv) &&
         static_cast<int>(t.tier) < kNumTiers;
}

}  // namespace

pb::PlanSpec PlanSpecToProto(const PlanSpec& spec) {
  pb::PlanSpec p;
  for (int64_t c : spec.cu_seqlens) p.add_cu_seqlens(c);
  p.set_causal(spec.causal);
  if (spec.window >= 0) p.set_window(spec.window);
  for (const MaskSlice& s : spec.slices) SliceToProto(s, p.add_slices());
  p.set_total_tokens(spec.total_tokens);
  p.mutable_topology()->set_num_nodes(spec.topology.num_nodes);
  p.mutable_topology()->set_devices_per_node(spec.topology.devices_per_node);
  p.mutable_shape()->set_num_heads_q(spec.shape.num_heads_q);
  p.mutable_shape()->set_num_heads_kv(spec.shape.num_heads_kv);
  p.mutable_shape()->set_head_dim(spec.shape.head_dim);
  p.mutable_shape()->set_dtype(DTypeToProto(spec.shape.dtype));
  p.set_strategy(static_cast<pb::Strategy>(spec.strategy));
  p.set_assignment(static_cast<pb::AssignmentPolicy>(spec.assignment));
  p.set_profile(spec.profile);
  p.set_recv_buffer_bytes(spec.recv_buffer_bytes);
  return p;
}

absl::StatusOr<DType> DTypeFromProto(pb::DType t, absl::string_view field) {
  switch (t) {
    case pb::DTYPE_FLOAT32: return DType::kFloat32;
    case pb::DTYPE_BFLOAT16: return DType::kBFloat16;
    case pb::DTYPE_FLOAT16: return DType::kFloat16;
    default:
    {
      const std::string name = pb::DType_Name(t);  // empty for a value the proto lacks
      return absl::InvalidArgumentError(
          absl::StrCat(field, " is ", name.empty() ? absl::StrCat(static_cast<int>(t)) : name,
                       "; it must be DTYPE_FLOAT32, DTYPE_BFLOAT16 or DTYPE_FLOAT16"));
    }
  }
}

absl::StatusOr<Strategy> StrategyFromProto(pb::Strategy s, absl::string_view field) {
  if (s == pb::STRATEGY_UNSPECIFIED) return Strategy::kAuto;
  if (s >= pb::STRATEGY_RING && s <= pb::STRATEGY_AUTO) return static_cast<Strategy>(s);
  return absl::InvalidArgumentError(
      absl::StrCat(field, " (", static_cast<int>(s), ") is not a known strategy"));
}

absl::StatusOr<AssignmentPolicy> AssignmentFromProto(pb::AssignmentPolicy a,
                                                     absl::string_view field) {
  if (a == pb::ASSIGNMENT_UNSPECIFIED) return AssignmentPolicy::kBalanced;
  if (a >= pb::ASSIGNMENT_CONTIGUOUS && a <= pb::ASSIGNMENT_BALANCED) {
    return static_cast<AssignmentPolicy>(a);
  }
  return absl::InvalidArgumentError(
      absl::StrCat(field, " (", static_cast<int>(a), ") is not a known policy"));
}

absl::StatusOr<MaskSlice> MaskSliceFromProto(const pb::MaskSlice& p, absl::string_view field) {
  if (!pb::MaskType_IsValid(p.type())) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".type ", static_cast<int>(p.type()), " is unknown"));
  }
  MaskSlice s;
  s.q_begin = p.q_begin();
  s.q_end = p.q_end();
  s.k_begin = p.k_begin();
  s.k_end = p.k_end();
  s.type = p.type() == pb::MASK_TYPE_CAUSAL ? MaskType::kCausal : MaskType::kFull;
  s.offset = p.offset();
  s.window = p.has_window() && p.window() >= 0 ? p.window() : -1;
  return s;
}

std::string ProfileOrDefault(const std::string& profile, const SpecDefaults& defaults) {
  return profile.empty() ? defaults.profile : profile;
}

absl::StatusOr<PlanSpec> PlanSpecFromProto(const pb::PlanSpec& p, const SpecDefaults& defaults) {
  PlanSpec spec;
  spec.cu_seqlens.assign(p.cu_seqlens().begin(), p.cu_seqlens().end());
  spec.causal = p.causal();
  spec.window = p.has_window() ? p.window() : -1;
  for (int i = 0; i < p.slices_size(); ++i) {
    HSAP_ASSIGN_OR_RETURN(MaskSlice s,
                          MaskSliceFromProto(p.slices(i), absl::StrCat("slices[", i, "]")));
    spec.slices.push_back(s);
  }
  spec.total_tokens = p.total_tokens();
  spec.topology.num_nodes = p.topology().num_nodes();
  spec.topology.devices_per_node = p.topology().devices_per_node();
  spec.shape.num_heads_q = p.shape().num_heads_q();
  spec.shape.num_heads_kv = p.shape().num_heads_kv();
  spec.shape.head_dim = p.shape().head_dim();
  HSAP_ASSIGN_OR_RETURN(spec.shape.dtype, DTypeFromProto(p.shape().dtype(), "shape.dtype"));
  HSAP_ASSIGN_OR_RETURN(spec.strategy, StrategyFromProto(p.strategy(), "strategy"));
  HSAP_ASSIGN_OR_RETURN(spec.assignment, AssignmentFromProto(p.assignment(), "assignment"));
  spec.profile = ProfileOrDefault(p.profile(), defaults);
  // A head dim out of range stays unresolved: ValidatePlanSpec refuses the
  // spec for it (or an earlier field) before it looks at the profile.
  if (spec.profile == kMeasuredProfile && spec.shape.head_dim >= 1 &&
      spec.shape.head_dim <= kMaxHeadDim) {
    if (!defaults.measured) {
      return absl::InvalidArgumentError(
          "profile 'measured' is a daemon's own measurement; name a profile (h100, h200, "
          "cpu-loopback or custom:...)");
    }
    if (int64_t{spec.topology.num_nodes} * spec.topology.devices_per_node == 1) {
      spec.profile = std::string(kOneRankProfile);  // as the call path (call_runner.cc)
    } else {
      HSAP_ASSIGN_OR_RETURN(spec.profile,
                            defaults.measured(spec.shape.dtype, spec.shape.head_dim));
    }
  }
  spec.recv_buffer_bytes =
      p.recv_buffer_bytes() == 0 ? kDefaultRecvBufferBytes : p.recv_buffer_bytes();
  return spec;
}

pb::Dispatch DispatchToProto(const Dispatch& d) {
  pb::Dispatch p;
  p.set_total_tokens(d.total_tokens);
  for (const auto& ranges : d.ranges) {
    pb::RankTokens* rt = p.add_ranks();
    for (const TokenRange& t : ranges) {
      pb::TokenRange* pt = rt->add_ranges();
      pt->set_begin(t.begin);
      pt->set_end(t.end);
    }
  }
  return p;
}

Dispatch DispatchFromProto(const pb::Dispatch& p) {
  Dispatch d;
  d.total_tokens = p.total_tokens();
  for (const pb::RankTokens& rt : p.ranks()) {
    d.ranges.emplace_back();
    for (const pb::TokenRange& t : rt.ranges()) d.ranges.back().push_back({t.begin(), t.end()});
  }
  return d;
}

pb::RankStats RankStatsToProto(const RankStats& s) {
  pb::RankStats p;
  p.set_tokens(s.tokens);
  p.set_home_tokens(s.home_tokens);
  p.set_area(s.area);
  p.set_head_area(s.head_area);
  for (int t = 0; t < kNumTiers; ++t) {
    p.add_fwd_recv_bytes(s.fwd_recv_bytes[t]);
    p.add_fwd_send_bytes(s.fwd_send_bytes[t]);
    p.add_bwd_recv_bytes(s.bwd_recv_bytes[t]);
    p.add_bwd_send_bytes(s.bwd_send_bytes[t]);
    p.add_fwd_transfer_us(s.fwd_transfer_us[t]);
    p.add_bwd_transfer_us(s.bwd_transfer_us[t]);
  }
  p.set_lower_bound_recv_bytes(s.lower_bound_recv_bytes);
  p.set_exact_need_bytes(s.exact_need_bytes);
  p.set_peak_recv_buffer_bytes(s.peak_recv_buffer_bytes);
  p.set_fwd_compute_us(s.fwd_compute_us);
  p.set_bwd_compute_us(s.bwd_compute_us);
  p.set_fwd_us(s.fwd_us);
  p.set_bwd_us(s.bwd_us);
  return p;
}

pb::PlanStats PlanStatsToProto(const PlanStats& s) {
  pb::PlanStats p;
  p.set_total_area(s.total_area);
  p.set_imbalance(s.imbalance);
  p.set_max_fwd_recv_bytes(s.max_fwd_recv_bytes);
  p.set_total_fwd_bytes(s.total_fwd_bytes);
  p.set_total_bwd_bytes(s.total_bwd_bytes);
  for (int t = 0; t < kNumTiers; ++t) p.add_total_fwd_bytes_by_tier(s.total_fwd_bytes_by_tier[t]);
  p.set_max_fwd_inter_recv_bytes(s.max_fwd_inter_recv_bytes);
  p.set_inter_node_need_bytes(s.inter_node_need_bytes);
  p.set_max_node_inter_need_bytes(s.max_node_inter_need_bytes);
  p.set_fwd_us(s.fwd_us);
  p.set_bwd_us(s.bwd_us);
  p.set_modeled_us(s.modeled_us);
  p.set_lower_bound_us(s.lower_bound_us);
  p.set_compile_us(s.compile_us);
  p.set_num_fwd_stages(s.num_fwd_stages);
  p.set_num_bwd_stages(s.num_bwd_stages);
  for (const StrategyCost& c : s.candidates) {
    pb::StrategyCost* pc = p.add_candidates();
    pc->set_strategy(static_cast<pb::Strategy>(c.strategy));
    pc->set_modeled_us(c.modeled_us);
  }
  return p;
}

pb::Plan PlanToProto(const Plan& plan) {
  pb::Plan p;
  p.set_format_version(plan.format_version);
  p.set_plan_key(plan.key.ToHex());
  *p.mutable_spec() = PlanSpecToProto(plan.spec);
  p.set_strategy(static_cast<pb::Strategy>(plan.strategy));
  p.set_head_group_size(plan.head_group_size);
  *p.mutable_dispatch() = DispatchToProto(plan.dispatch);
  for (const RankPlan& rp : plan.ranks) {
    pb::RankPlan* pr = p.add_ranks();
    pr->set_rank(rp.rank);
    pr->set_node(rp.node);
    pr->set_q_head_begin(rp.q_head_begin);
    pr->set_q_head_end(rp.q_head_end);
    pr->set_kv_head_begin(rp.kv_head_begin);
    pr->set_kv_head_end(rp.kv_head_end);
    pr->set_kv_row_bytes(rp.kv_row_bytes);
    Each(rp.forward, pr->mutable_forward(), StageToProto);
    Each(rp.backward, pr->mutable_backward(), StageToProto);
    *pr->mutable_stats() = RankStatsToProto(rp.stats);
  }
  *p.mutable_stats() = PlanStatsToProto(plan.stats);
  return p;
}

absl::StatusOr<Plan> PlanFromProto(const pb::Plan& p) {
  Plan plan;
  plan.format_version = p.format_version();
  HSAP_ASSIGN_OR_RETURN(plan.spec, PlanSpecFromProto(p.spec()));
  HSAP_RETURN_IF_ERROR(ValidatePlanSpec(plan.spec));
  if (!PlanKey::FromHex(p.plan_key(), &plan.key)) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan_key \"", p.plan_key(), "\" is not 32 lowercase hex digits"));
  }
  const PlanKey expected = ComputePlanKey(plan.spec, plan.format_version);
  if (expected != plan.key) {
    return absl::InvalidArgumentError(absl::StrCat("plan_key ", p.plan_key(),
                                                   " is not the key of its spec (",
                                                   expected.ToHex(), ")"));
  }
  if (p.strategy() < pb::STRATEGY_RING || p.strategy() >= pb::STRATEGY_AUTO) {
    return absl::InvalidArgumentError(
        absl::StrCat("strategy (", static_cast<int>(p.strategy()), ") is not a runnable strategy"));
  }
  plan.strategy = static_cast<Strategy>(p.strategy());
  plan.head_group_size = p.head_group_size();
  plan.dispatch = DispatchFromProto(p.dispatch());
  plan.ranks.reserve(p.ranks_size());
  for (const pb::RankPlan& pr : p.ranks()) {
    RankPlan rp;
    rp.rank = pr.rank();
    rp.node = pr.node();
    rp.q_head_begin = pr.q_head_begin();
    rp.q_head_end = pr.q_head_end();
    rp.kv_head_begin = pr.kv_head_begin();
    rp.kv_head_end = pr.kv_head_end();
    rp.kv_row_bytes = pr.kv_row_bytes();
    rp.forward = Collect<Stage>(pr.forward(), StageFromProto);
    rp.backward = Collect<Stage>(pr.backward(), StageFromProto);
    for (const auto* stages : {&rp.forward, &rp.backward}) {
      for (const Stage& st : *stages) {
        for (const auto* ts : {&st.sends, &st.recvs, &st.return_sends, &st.return_recvs}) {
          for (const Transfer& t : *ts) {
            if (!KnownPayload(t)) {
              return absl::InvalidArgumentError(absl::StrCat(
                  "ranks[", rp.rank, "]: a transfer has an unknown payload, space or tier"));
            }
          }
        }
      }
    }
    rp.stats = RankStatsFromProto(pr.stats());
    plan.ranks.push_back(std::move(rp));
  }
  const pb::PlanStats& ps = p.stats();
  PlanStats& s = plan.stats;
  s.total_area = ps.total_area();
  s.imbalance = ps.imbalance();
  s.max_fwd_recv_bytes = ps.max_fwd_recv_bytes();
  s.total_fwd_bytes = ps.total_fwd_bytes();
  s.total_bwd_bytes = ps.total_bwd_bytes();
  ArrayFrom(ps.total_fwd_bytes_by_tier(), &s.total_fwd_bytes_by_tier);
  s.max_fwd_inter_recv_bytes = ps.max_fwd_inter_recv_bytes();
  s.inter_node_need_bytes = ps.inter_node_need_bytes();
  s.max_node_inter_need_bytes = ps.max_node_inter_need_bytes();
  s.fwd_us = ps.fwd_us();
  s.bwd_us = ps.bwd_us();
  s.modeled_us = ps.modeled_us();
  s.lower_bound_us = ps.lower_bound_us();
  s.compile_us = ps.compile_us();
  s.num_fwd_stages = ps.num_fwd_stages();
  s.num_bwd_stages = ps.num_bwd_stages();
  for (const pb::StrategyCost& c : ps.candidates()) {
    s.candidates.push_back({static_cast<Strategy>(c.strategy()), c.modeled_us()});
  }
  return plan;
}

}  // namespace hsap::plan
