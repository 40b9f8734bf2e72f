#include "server/plan/plan.h"

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace hsap::plan {

bool Transfer::operator==(const Transfer& o) const {
  return peer == o.peer && payload == o.payload && tier == o.tier && space == o.space &&
         q_head_begin == o.q_head_begin && q_head_end == o.q_head_end &&
         kv_head_begin == o.kv_head_begin && kv_head_end == o.kv_head_end &&
         segments == o.segments && buffer_offset == o.buffer_offset && bytes == o.bytes;
}

bool WorkItem::operator==(const WorkItem& o) const {
  return q_row == o.q_row && num_q == o.num_q && kv_space == o.kv_space && kv_row == o.kv_row &&
         num_k == o.num_k && type == o.type && offset == o.offset && window == o.window;
}

bool Stage::operator==(const Stage& o) const {
  return sends == o.sends && recvs == o.recvs && overlap_items == o.overlap_items &&
         items == o.items && return_sends == o.return_sends && return_recvs == o.return_recvs &&
         return_overlap_items == o.return_overlap_items;
}

bool RankStats::operator==(const RankStats& o) const {
  return tokens == o.tokens && home_tokens == o.home_tokens && area == o.area &&
         head_area == o.head_area && fwd_recv_bytes == o.fwd_recv_bytes &&
         fwd_send_bytes == o.fwd_send_bytes && bwd_recv_bytes == o.bwd_recv_bytes &&
         bwd_send_bytes == o.bwd_send_bytes && lower_bound_recv_bytes == o.lower_bound_recv_bytes &&
         exact_need_bytes == o.exact_need_bytes &&
         peak_recv_buffer_bytes == o.peak_recv_buffer_bytes &&
         fwd_compute_us == o.fwd_compute_us && bwd_compute_us == o.bwd_compute_us &&
         fwd_transfer_us == o.fwd_transfer_us && bwd_transfer_us == o.bwd_transfer_us &&
         fwd_us == o.fwd_us && bwd_us == o.bwd_us;
}

bool RankPlan::operator==(const RankPlan& o) const {
  return rank == o.rank && node == o.node && q_head_begin == o.q_head_begin &&
         q_head_end == o.q_head_end && kv_head_begin == o.kv_head_begin &&
         kv_head_end == o.kv_head_end && kv_row_bytes == o.kv_row_bytes && forward == o.forward &&
         backward == o.backward && stats == o.stats;
}

bool PlanStats::operator==(const PlanStats& o) const {
  return total_area == o.total_area && imbalance == o.imbalance &&
         max_fwd_recv_bytes == o.max_fwd_recv_bytes && total_fwd_bytes == o.total_fwd_bytes &&
         total_bwd_bytes == o.total_bwd_bytes &&
         total_fwd_bytes_by_tier == o.total_fwd_bytes_by_tier &&
         max_fwd_inter_recv_bytes == o.max_fwd_inter_recv_bytes &&
         inter_node_need_bytes == o.inter_node_need_bytes &&
         max_node_inter_need_bytes == o.max_node_inter_need_bytes && fwd_us == o.fwd_us &&
         bwd_us == o.bwd_us && modeled_us == o.modeled_us && lower_bound_us == o.lower_bound_us &&
         compile_us == o.compile_us && num_fwd_stages == o.num_fwd_stages &&
         num_bwd_stages == o.num_bwd_stages && candidates == o.candidates;
}

bool Plan::operator==(const Plan& o) const {
  return format_version == o.format_version && key == o.key && spec == o.spec &&
         strategy == o.strategy && head_group_size == o.head_group_size &&
         dispatch == o.dispatch && ranks == o.ranks && stats == o.stats;
}

namespace {
// Counts each shared list once (shared_list.h).
class ByteCounter {
 public:
  template <typename T>
  void Add(const SharedList<T>& list) {
    if (list.empty() || !seen_.insert(list.Identity()).second) return;
    bytes_ += static_cast<int64_t>(list.ArrayBytes()) + 32;
  }
  void Add(const TransferList& ts) {
    if (ts.empty() || !seen_.insert(&ts.front()).second) return;
    bytes_ += static_cast<int64_t>(ts.size() * sizeof(Transfer)) + 32;
    for (const Transfer& t : ts) Add(t.segments);
  }
  int64_t bytes() const { return bytes_; }

 private:
  absl::flat_hash_set<const void*> seen_;
  int64_t bytes_ = 0;
};
}  // namespace

int64_t Plan::ApproxBytes() const {
  int64_t b = sizeof(Plan);
  b += static_cast<int64_t>(spec.cu_seqlens.capacity() * sizeof(int64_t) +
                            spec.slices.capacity() * sizeof(MaskSlice) + spec.profile.capacity());
  for (const auto& r : dispatch.ranges) b += static_cast<int64_t>(r.capacity() * sizeof(TokenRange));
  ByteCounter lists;
  for (const RankPlan& rp : ranks) {
    b += sizeof(RankPlan);
    for (const auto* stages : {&rp.forward, &rp.backward}) {
      b += static_cast<int64_t>(stages->capacity() * sizeof(Stage));
      for (const Stage& st : *stages) {
        lists.Add(st.sends);
        lists.Add(st.recvs);
        lists.Add(st.return_sends);
        lists.Add(st.return_recvs);
        lists.Add(st.overlap_items);
        lists.Add(st.items);
        lists.Add(st.return_overlap_items);
      }
    }
  }
  b += lists.bytes();
  b += static_cast<int64_t>(stats.candidates.capacity() * sizeof(StrategyCost));
  return b;
}

absl::string_view PayloadName(Payload p) {
  switch (p) {
    case Payload::kKv: return "kv";
    case Payload::kGradKv: return "grad_kv";
    case Payload::kQkvHeads: return "qkv_heads";
    case Payload::kOutLseHeads: return "out_lse_heads";
    case Payload::kBwdHeads: return "bwd_heads";
    case Payload::kGradQkvHeads: return "grad_qkv_heads";
  }
  return "unknown";
}

std::string PlanSummaryText(const Plan& plan) {
  std::string out = absl::StrFormat(
      "plan %s  strategy %s (requested %s)  assignment %s  profile %s\n"
      "ranks %d (%d nodes x %d)  head group %d  tokens %d  area %d\n"
      "stages fwd %d bwd %d  imbalance %.4f  busiest fwd recv %d B  total fwd %d B  bwd %d B\n"
      "inter-node fwd recv: busiest rank %d B  total %d B  (layout's inter-node need: %d B, "
      "busiest node %d B)\n"
      "modeled fwd %.1f us  bwd %.1f us  total %.1f us  (lower bound %.1f us)  compile %d us\n",
      plan.key.ToHex(), StrategyName(plan.strategy), StrategyName(plan.spec.strategy),
      AssignmentName(plan.spec.assignment), plan.spec.profile, plan.spec.topology.num_ranks(),
      plan.spec.topology.num_nodes, plan.spec.topology.devices_per_node, plan.head_group_size,
      plan.spec.total_tokens, plan.stats.total_area, plan.stats.num_fwd_stages,
      plan.stats.num_bwd_stages, plan.stats.imbalance, plan.stats.max_fwd_recv_bytes,
      plan.stats.total_fwd_bytes, plan.stats.total_bwd_bytes, plan.stats.max_fwd_inter_recv_bytes,
      plan.stats.total_fwd_bytes_by_tier[static_cast<int>(LinkTier::kInterNode)],
      plan.stats.inter_node_need_bytes, plan.stats.max_node_inter_need_bytes, plan.stats.fwd_us,
      plan.stats.bwd_us, plan.stats.modeled_us, plan.stats.lower_bound_us,
      plan.stats.compile_us);
  for (const StrategyCost& c : plan.stats.candidates) {
    absl::StrAppendFormat(&out, "  candidate %-9s %.1f us\n", StrategyName(c.strategy),
                          c.modeled_us);
  }
  absl::StrAppend(&out,
                  "rank node heads   tokens      area  fwd_recv_B   inter_B  fwd_send_B  "
                  "lower_bound_B  bwd_recv_B  peak_buf_B  fwd_us  bwd_us  ranges\n");
  for (const RankPlan& rp : plan.ranks) {
    const RankStats& s = rp.stats;
    std::string ranges;
    const auto& rs = plan.dispatch.ranges[rp.rank];
    for (size_t i = 0; i < rs.size() && i < 4; ++i) {
      absl::StrAppend(&ranges, i ? " " : "", "[", rs[i].begin, ",", rs[i].end, ")");
    }
    if (rs.size() > 4) absl::StrAppend(&ranges, " +", rs.size() - 4);
    absl::StrAppendFormat(&out,
                          "%4d %4d %2d-%-3d %8d %9d %11d %9d %11d %14d %11d %11d %7.1f %7.1f  %s\n",
                          rp.rank, rp.node, rp.q_head_begin, rp.q_head_end, s.tokens, s.area,
                          s.FwdRecvBytes(), s.fwd_recv_bytes[static_cast<int>(LinkTier::kInterNode)],
                          s.FwdSendBytes(), s.lower_bound_recv_bytes,
                          s.BwdRecvBytes(), s.peak_recv_buffer_bytes, s.fwd_us, s.bwd_us, ranges);
  }
  return out;
}

}  // namespace hsap::plan
