#include "client/hsapctl/plan_format.h"

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/util/json_util.h"
#include "server/plan/plan_proto.h"

namespace hsap::hsapctl {

using plan::Plan;
using plan::RankPlan;

absl::StatusOr<std::vector<int64_t>> ParseIntList(absl::string_view text,
                                                  absl::string_view what) {
  std::vector<int64_t> out;
  for (absl::string_view piece : absl::StrSplit(text, absl::ByAnyChar(", \t\r\n"),
                                                absl::SkipEmpty())) {
    int64_t v;
    if (!absl::SimpleAtoi(piece, &v)) {
      return absl::InvalidArgumentError(absl::StrCat(what, "[", out.size(), "] \"", piece,
                                                     "\" is not an integer"));
    }
    out.push_back(v);
  }
  if (out.empty()) return absl::InvalidArgumentError(absl::StrCat(what, " is empty"));
  return out;
}

absl::StatusOr<std::vector<int64_t>> LengthsToCuSeqlens(const std::vector<int64_t>& lengths) {
  std::vector<int64_t> cu = {0};
  for (size_t i = 0; i < lengths.size(); ++i) {
    if (lengths[i] < 0 || lengths[i] > (int64_t{1} << 40)) {
      return absl::InvalidArgumentError(
          absl::StrCat("document length [", i, "] is ", lengths[i], ": must be in [0, 2^40]"));
    }
    if (cu.back() > (int64_t{1} << 40)) {
      return absl::InvalidArgumentError(
          absl::StrCat("document lengths sum past 2^40 tokens at index ", i));
    }
    cu.push_back(cu.back() + lengths[i]);
  }
  return cu;
}

std::string PlanToJson(const Plan& p, bool include_plan) {
  std::string out = "{\n";
  absl::StrAppendFormat(&out, "  \"plan_key\": \"%s\",\n", p.key.ToHex());
  absl::StrAppendFormat(&out, "  \"strategy\": \"%s\",\n", plan::StrategyName(p.strategy));
  absl::StrAppendFormat(&out, "  \"requested_strategy\": \"%s\",\n",
                        plan::StrategyName(p.spec.strategy));
  absl::StrAppendFormat(&out, "  \"assignment\": \"%s\",\n", plan::AssignmentName(p.spec.assignment));
  absl::StrAppendFormat(&out, "  \"profile\": \"%s\",\n", p.spec.profile);
  absl::StrAppendFormat(&out, "  \"ranks\": %d,\n  \"nodes\": %d,\n", p.spec.topology.num_ranks(),
                        p.spec.topology.num_nodes);
  absl::StrAppendFormat(&out, "  \"total_tokens\": %d,\n  \"total_area\": %d,\n",
                        p.spec.total_tokens, p.stats.total_area);
  absl::StrAppendFormat(&out, "  \"imbalance\": %.6f,\n", p.stats.imbalance);
  absl::StrAppendFormat(&out, "  \"modeled_time_us\": %.3f,\n", p.stats.modeled_us);
  absl::StrAppendFormat(&out, "  \"modeled_fwd_us\": %.3f,\n  \"modeled_bwd_us\": %.3f,\n",
                        p.stats.fwd_us, p.stats.bwd_us);
  absl::StrAppendFormat(&out, "  \"lower_bound_us\": %.3f,\n", p.stats.lower_bound_us);
  absl::StrAppendFormat(&out, "  \"compile_us\": %d,\n", p.stats.compile_us);
  absl::StrAppendFormat(&out, "  \"max_recv_bytes\": %d,\n  \"total_fwd_bytes\": %d,\n",
                        p.stats.max_fwd_recv_bytes, p.stats.total_fwd_bytes);
  absl::StrAppendFormat(&out,
                        "  \"max_inter_recv_bytes\": %d,\n  \"total_inter_fwd_bytes\": %d,\n"
                        "  \"inter_node_need_bytes\": %d,\n  \"max_node_inter_need_bytes\": %d,\n",
                        p.stats.max_fwd_inter_recv_bytes,
                        p.stats.total_fwd_bytes_by_tier[static_cast<int>(plan::LinkTier::kInterNode)],
                        p.stats.inter_node_need_bytes, p.stats.max_node_inter_need_bytes);
  absl::StrAppendFormat(&out, "  \"fwd_stages\": %d,\n  \"bwd_stages\": %d,\n",
                        p.stats.num_fwd_stages, p.stats.num_bwd_stages);
  out += "  \"candidates\": [";
  for (size_t i = 0; i < p.stats.candidates.size(); ++i) {
    absl::StrAppendFormat(&out, "%s{\"strategy\": \"%s\", \"modeled_us\": %.3f}", i ? ", " : "",
                          plan::StrategyName(p.stats.candidates[i].strategy),
                          p.stats.candidates[i].modeled_us);
  }
  out += "],\n  \"per_rank\": [\n";
  for (size_t i = 0; i < p.ranks.size(); ++i) {
    const RankPlan& rp = p.ranks[i];
    const plan::RankStats& s = rp.stats;
    std::string ranges;
    for (const plan::TokenRange& t : p.dispatch.ranges[rp.rank]) {
      absl::StrAppend(&ranges, ranges.empty() ? "" : ", ", "[", t.begin, ", ", t.end, "]");
    }
    absl::StrAppendFormat(
        &out,
        "    {\"rank\": %d, \"node\": %d, \"q_heads\": [%d, %d], \"tokens\": %d, "
        "\"token_ranges\": [%s], \"recv_bytes\": %d, \"inter_recv_bytes\": %d, "
        "\"send_bytes\": %d, "
        "\"bwd_recv_bytes\": %d, \"bwd_send_bytes\": %d, \"area\": %d, "
        "\"lower_bound_recv_bytes\": %d, \"exact_need_bytes\": %d, "
        "\"peak_recv_buffer_bytes\": %d, \"modeled_fwd_us\": %.3f, \"modeled_bwd_us\": %.3f}%s\n",
        rp.rank, rp.node, rp.q_head_begin, rp.q_head_end, s.tokens, ranges, s.FwdRecvBytes(),
        s.fwd_recv_bytes[static_cast<int>(plan::LinkTier::kInterNode)], s.FwdSendBytes(), s.BwdRecvBytes(), s.BwdSendBytes(), s.area, s.lower_bound_recv_bytes,
        s.exact_need_bytes, s.peak_recv_buffer_bytes, s.fwd_us, s.bwd_us,
        i + 1 < p.ranks.size() ? "," : "");
  }
  out += "  ]";
  if (include_plan) {
    std::string json;
    google::protobuf::util::JsonPrintOptions options;
    options.preserve_proto_field_names = true;
    const auto status =
        google::protobuf::util::MessageToJsonString(plan::PlanToProto(p), &json, options);
    if (status.ok()) {
      absl::StrAppend(&out, ",\n  \"plan\": ", json);
    } else {
      absl::StrAppend(&out, ",\n  \"plan_error\": \"", std::string(status.message()), "\"");
    }
  }
  out += "\n}\n";
  return out;
}

std::string PlanToText(const Plan& p, bool include_stages) {
  std::string out = plan::PlanSummaryText(p);
  if (!include_stages) return out;
  for (const RankPlan& rp : p.ranks) {
    absl::StrAppendFormat(&out, "rank %d forward:\n", rp.rank);
    for (size_t s = 0; s < rp.forward.size(); ++s) {
      const plan::Stage& st = rp.forward[s];
      absl::StrAppendFormat(&out, "  stage %d: %d sends, %d recvs, %d overlap items, %d items\n",
                            s, st.sends.size(), st.recvs.size(), st.overlap_items.size(),
                            st.items.size());
      for (const auto* list : {&st.sends, &st.recvs}) {
        for (const plan::Transfer& t : *list) {
          std::string segs;
          for (const plan::Segment& g : t.segments) {
            absl::StrAppend(&segs, " [", g.global_begin, ",", g.global_end, ")@", g.row);
          }
          absl::StrAppendFormat(&out, "    %s %s peer %d %s %d B off %d:%s\n",
                                list == &st.sends ? "send" : "recv",
                                plan::PayloadName(t.payload), t.peer,
                                t.tier == plan::LinkTier::kIntraNode ? "intra" : "inter", t.bytes,
                                t.buffer_offset, segs);
        }
      }
    }
  }
  return out;
}

}  // namespace hsap::hsapctl
