#include "server/plan/plan_spec.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "server/plan/cost_model.h"

namespace hsap::plan {
namespace {

constexpr std::pair<Strategy, absl::string_view> kStrategyNames[] = {
    {Strategy::kRing, "ring"}, {Strategy::kAllGather, "allgather"},
    {Strategy::kUlysses, "ulysses"}, {Strategy::kUsp, "usp"},
    {Strategy::kSap, "sap"}, {Strategy::kHsap, "hsap"},
    {Strategy::kAuto, "auto"},
};
constexpr std::pair<AssignmentPolicy, absl::string_view> kAssignmentNames[] = {
    {AssignmentPolicy::kContiguous, "contiguous"},
    {AssignmentPolicy::kZigzag, "zigzag"},
    {AssignmentPolicy::kBalanced, "balanced"},
};

// Rectangles of non-empty slices must not overlap, or a pair would be
// computed twice. Sweep over q: the active slices' key ranges must stay
// pairwise disjoint. O(n log n).
absl::Status CheckNoOverlap(const std::vector<MaskSlice>& slices) {
  struct Event {
    int64_t q;
    int kind;  // 0 = remove (sorted first at equal q), 1 = insert
    size_t index;
  };
  std::vector<Event> events;
  for (size_t i = 0; i < slices.size(); ++i) {
    const MaskSlice& s = slices[i];
    if (s.num_q() == 0 || s.num_k() == 0) continue;
    events.push_back({s.q_begin, 1, i});
    events.push_back({s.q_end, 0, i});
  }
  std::sort(events.begin(), events.end(), [](const Event& a, const Event& b) {
    return std::tie(a.q, a.kind, a.index) < std::tie(b.q, b.kind, b.index);
  });
  std::set<std::pair<int64_t, size_t>> active;  // (k_begin, index)
  for (const Event& e : events) {
    const MaskSlice& s = slices[e.index];
    if (e.kind == 0) {
      active.erase({s.k_begin, e.index});
      continue;
    }
    auto it = active.lower_bound({s.k_begin, 0});
    if (it != active.end() && slices[it->second].k_begin < s.k_end) {
      return absl::InvalidArgumentError(absl::StrCat(
          "slices[", e.index, "] (", SliceDebugString(s), ") overlaps slices[", it->second,
          "] (", SliceDebugString(slices[it->second]), ")"));
    }
    if (it != active.begin()) {
      auto prev = std::prev(it);
      if (slices[prev->second].k_end > s.k_begin) {
        return absl::InvalidArgumentError(absl::StrCat(
            "slices[", e.index, "] (", SliceDebugString(s), ") overlaps slices[", prev->second,
            "] (", SliceDebugString(slices[prev->second]), ")"));
      }
    }
    active.insert({s.k_begin, e.index});
  }
  return absl::OkStatus();
}

}  // namespace

absl::string_view StrategyName(Strategy s) {
  for (const auto& [v, n] : kStrategyNames) {
    if (v == s) return n;
  }
  return "unknown";
}

bool ParseStrategy(absl::string_view name, Strategy* out) {
  for (const auto& [v, n] : kStrategyNames) {
    if (n == name) {
      *out = v;
      return true;
    }
  }
  return false;
}

absl::string_view AssignmentName(AssignmentPolicy a) {
  for (const auto& [v, n] : kAssignmentNames) {
    if (v == a) return n;
  }
  return "unknown";
}

bool ParseAssignment(absl::string_view name, AssignmentPolicy* out) {
  for (const auto& [v, n] : kAssignmentNames) {
    if (n == name) {
      *out = v;
      return true;
    }
  }
  return false;
}

namespace {

// Token count, topology, head shape and the byte counts they imply.
absl::Status ValidateSizes(const PlanSpec& spec) {
  using absl::InvalidArgumentError;
  using absl::StrCat;
  if (spec.total_tokens < 0 || spec.total_tokens > kMaxTotalTokens) {
    return InvalidArgumentError(StrCat("total_tokens (", spec.total_tokens,
                                       ") must be in [0, 2^40]"));
  }
  const Topology& t = spec.topology;
  if (t.num_nodes < 1 || t.num_nodes > kMaxRanks) {
    return InvalidArgumentError(
        StrCat("topology.num_nodes (", t.num_nodes, ") must be in [1, ", kMaxRanks, "]"));
  }
  if (t.devices_per_node < 1 || t.devices_per_node > kMaxRanks) {
    return InvalidArgumentError(StrCat("topology.devices_per_node (", t.devices_per_node,
                                       ") must be in [1, ", kMaxRanks, "]"));
  }
  if (int64_t{t.num_nodes} * t.devices_per_node > kMaxRanks) {
    return InvalidArgumentError(StrCat("topology has ", int64_t{t.num_nodes} * t.devices_per_node,
                                       " ranks (num_nodes ", t.num_nodes, " x devices_per_node ",
                                       t.devices_per_node, "); at most ", kMaxRanks));
  }
  const HeadShape& h = spec.shape;
  if (h.num_heads_q < 1 || h.num_heads_q > kMaxHeads) {
    return InvalidArgumentError(
        StrCat("shape.num_heads_q (", h.num_heads_q, ") must be in [1, ", kMaxHeads, "]"));
  }
  if (h.num_heads_kv < 1 || h.num_heads_kv > h.num_heads_q) {
    return InvalidArgumentError(StrCat("shape.num_heads_kv (", h.num_heads_kv,
                                       ") must be in [1, num_heads_q = ", h.num_heads_q, "]"));
  }
  if (h.num_heads_q % h.num_heads_kv != 0) {
    return InvalidArgumentError(StrCat("shape.num_heads_q (", h.num_heads_q,
                                       ") is not a multiple of shape.num_heads_kv (",
                                       h.num_heads_kv, ")"));
  }
  if (h.head_dim < 1 || h.head_dim > kMaxHeadDim) {
    return InvalidArgumentError(
        StrCat("shape.head_dim (", h.head_dim, ") must be in [1, ", kMaxHeadDim, "]"));
  }
  if (h.dtype != DType::kFloat32 && h.dtype != DType::kBFloat16 && h.dtype != DType::kFloat16) {
    return InvalidArgumentError(
        StrCat("shape.dtype (", static_cast<int>(h.dtype), ") is not fp32, bf16 or fp16"));
  }
  // Largest byte count the plan forms: total_tokens rows of Q, K, V, O with
  // all heads in fp32 plus LSE: (2 Hq + 2 Hkv) * D * 4 + 4 Hq bytes per token
  // <= 2^12 * 2^12 * 20 < 2^29, times 2^40 tokens < 2^69: check explicitly.
  const int64_t row_bytes =
      (2 * int64_t{h.num_heads_q} + 2 * h.num_heads_kv) * h.head_dim * 4 + 4 * h.num_heads_q;
  // Plan statistics sum bytes over all ranks: bound ranks x that too.
  const int64_t ranks = int64_t{t.num_nodes} * t.devices_per_node;
  if (spec.total_tokens > 0 && row_bytes > (int64_t{1} << 62) / spec.total_tokens / ranks) {
    return InvalidArgumentError(StrCat("total_tokens (", spec.total_tokens, ") x ", row_bytes,
                                       " bytes per token row (shape) x ", ranks,
                                       " ranks overflows 2^62 bytes"));
  }
  return absl::OkStatus();
}

// The mask (cu_seqlens or slices, window) and its area bound.
absl::Status ValidateMask(const PlanSpec& spec) {
  using absl::InvalidArgumentError;
  using absl::StrCat;
  const HeadShape& h = spec.shape;
  const bool has_cu = !spec.cu_seqlens.empty();
  const bool has_slices = !spec.slices.empty();
  if (has_cu && has_slices) {
    return InvalidArgumentError(StrCat("mask: both cu_seqlens (", spec.cu_seqlens.size(),
                                       " entries) and slices (", spec.slices.size(),
                                       " entries) are set; give exactly one"));
  }
  if (!has_cu && !has_slices && spec.total_tokens > 0) {
    return InvalidArgumentError(StrCat("mask: neither cu_seqlens nor slices is set for ",
                                       spec.total_tokens, " tokens"));
  }
  if (has_cu) {
    HSAP_RETURN_IF_ERROR(ValidateCuSeqlens(spec.cu_seqlens, spec.total_tokens, "cu_seqlens"));
    if (spec.window >= 0 && !spec.causal) {
      return InvalidArgumentError(StrCat("window (", spec.window,
                                         ") is set but causal is false: only causal "
                                         "documents take a sliding window"));
    }
    if (spec.window > kMaxTotalTokens) {
      return InvalidArgumentError(StrCat("window (", spec.window, ") exceeds 2^40"));
    }
  } else {
    if (spec.window >= 0) {
      return InvalidArgumentError(StrCat("window (", spec.window,
                                         ") applies to cu_seqlens only; slices carry their own"));
    }
    HSAP_RETURN_IF_ERROR(
        ValidateSlices(spec.slices, spec.total_tokens, spec.total_tokens, "slices"));
    for (size_t i = 0; i < spec.slices.size(); ++i) {
      const MaskSlice& s = spec.slices[i];
      if (s.type != MaskType::kFull && s.type != MaskType::kCausal) {
        return InvalidArgumentError(
            StrCat("slices[", i, "].type (", static_cast<int>(s.type), ") is not FULL or CAUSAL"));
      }
    }
    HSAP_RETURN_IF_ERROR(CheckNoOverlap(spec.slices));
  }
  // The planner sums mask areas ((q, k) pairs) times q heads in int64
  // (RankStats::head_area). Non-overlapping slices have area <= sum of
  // num_q * num_k <= total_tokens^2, which 2^40 tokens would take to 2^80:
  // bound that sum by 2^62 / num_heads_q (one 2^31-token document with one
  // head fits; beyond, the documents must be short enough).
  {
    const int64_t kMaxAreaBound = (int64_t{1} << 62) / h.num_heads_q;
    int64_t bound = 0;
    auto add = [&](const MaskSlice& s) {
      if (s.num_k() > (kMaxAreaBound - bound) / s.num_q()) {
        return InvalidArgumentError(StrCat("mask: the slices up to ", SliceDebugString(s),
                                           " span more than 2^62 / num_heads_q (",
                                           kMaxAreaBound, ") (query, key) pairs"));
      }
      bound += s.num_q() * s.num_k();
      return absl::OkStatus();
    };
    if (has_cu) {
      // A document is its own slice, in order: lowering all of them here
      // too would double the time a compile of millions of documents runs
      // before it first polls its caller (compiler.cc).
      const std::vector<int64_t>& cu = spec.cu_seqlens;
      for (size_t d = 0; d + 1 < cu.size(); ++d) {
        const int64_t n = cu[d + 1] - cu[d];
        if (n > 0 && n > (kMaxAreaBound - bound) / n) {
          const int64_t document[2] = {cu[d], cu[d + 1]};
          return add(LowerDocuments(document, spec.causal, spec.causal ? spec.window : -1)[0]);
        }
        bound += n * n;
      }
    } else {
      for (const MaskSlice& s : ResolveSlices(spec)) HSAP_RETURN_IF_ERROR(add(s));
    }
  }
  return absl::OkStatus();
}

// Profile, strategy, assignment and the receive budget.
absl::Status ValidateChoices(const PlanSpec& spec) {
  using absl::InvalidArgumentError;
  using absl::StrCat;
  const HeadShape& h = spec.shape;
  if (absl::StatusOr<HardwareProfile> profile = ParseHardwareProfile(spec.profile);
      !profile.ok()) {
    return profile.status();
  }
  bool strategy_ok = false;
  for (const auto& [v, n] : kStrategyNames) strategy_ok |= v == spec.strategy;
  if (!strategy_ok) {
    return InvalidArgumentError(
        StrCat("strategy (", static_cast<int>(spec.strategy), ") is not a known strategy"));
  }
  bool assignment_ok = false;
  for (const auto& [v, n] : kAssignmentNames) assignment_ok |= v == spec.assignment;
  if (!assignment_ok) {
    return InvalidArgumentError(
        StrCat("assignment (", static_cast<int>(spec.assignment), ") is not a known policy"));
  }
  const int64_t kv_row = KvRowBytes(h, h.num_heads_kv);
  if (spec.recv_buffer_bytes < kv_row) {
    return InvalidArgumentError(StrCat("recv_buffer_bytes (", spec.recv_buffer_bytes,
                                       ") is smaller than one token's K and V rows (", kv_row,
                                       " bytes)"));
  }
  // A rank may need every other token's K and V (one document over all
  // ranks): the budget must hold them in kMaxStages stages.
  const int64_t budget_rows = spec.recv_buffer_bytes / kv_row;
  const int64_t stages = spec.total_tokens / budget_rows + (spec.total_tokens % budget_rows != 0);
  if (stages > kMaxStages) {
    const int64_t needed =
        (spec.total_tokens / kMaxStages + (spec.total_tokens % kMaxStages != 0)) * kv_row;
    return InvalidArgumentError(StrCat(
        "recv_buffer_bytes (", spec.recv_buffer_bytes, ") holds ", budget_rows,
        " token rows of K and V (", kv_row, " bytes each): ", spec.total_tokens,
        " tokens could need ", stages, " stages, more than ", kMaxStages,
        "; raise recv_buffer_bytes to at least ", needed));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidatePlanSpec(const PlanSpec& spec) {
  HSAP_RETURN_IF_ERROR(ValidateSizes(spec));
  HSAP_RETURN_IF_ERROR(ValidateMask(spec));
  return ValidateChoices(spec);
}

std::vector<MaskSlice> ResolveSlices(const PlanSpec& spec) {
  std::vector<MaskSlice> out;
  if (!spec.cu_seqlens.empty()) {
    out = LowerDocuments(spec.cu_seqlens, spec.causal, spec.causal ? spec.window : -1);
  } else {
    for (const MaskSlice& s : spec.slices) {
      if (s.num_q() > 0 && s.num_k() > 0) out.push_back(s);
    }
  }
  std::sort(out.begin(), out.end(), [](const MaskSlice& a, const MaskSlice& b) {
    return std::tie(a.q_begin, a.k_begin) < std::tie(b.q_begin, b.k_begin);
  });
  return out;
}

}  // namespace hsap::plan
