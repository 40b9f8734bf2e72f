#include "server/plan/cost_model.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "absl/base/macros.h"
#include "absl/strings/numbers.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

#include "server/plan/plan.h"

namespace hsap::plan {
namespace {

// Sources (orientation, not promises):
//  * H100/H200 SXM: NVLink 4 = 900 GB/s bidirectional per GPU, ~360 GB/s
//    achieved one way by NCCL point-to-point; one 400 Gb/s NDR InfiniBand NIC
//    per GPU, ~45 GB/s achieved; FlashAttention-3 bf16 forward reaches
//    500-700 TFLOP/s on H100, ~400 TFLOP/s averaged over causal and short
//    documents; H200 has the same links and ~10% more attention throughput
//    from its faster HBM.
//  * cpu-loopback: this project's 2-core CI machine (BUILD_NOTES.md): UCX
//    posix shared memory ~6 GB/s between processes of one host, UCX tcp over
//    loopback ~2.7 GB/s, fp32 attention ~50 GFLOP/s per rank.
const std::vector<HardwareProfile>& Profiles() {
  static const auto* profiles = new std::vector<HardwareProfile>{
      {"h100", "H100 SXM cluster: NVLink inside a node, 400G InfiniBand per GPU, bf16",
       360e9, 45e9, 8e-6, 15e-6, 400e12, 2.5},
      {"h200", "H200 SXM cluster: NVLink inside a node, 400G InfiniBand per GPU, bf16",
       360e9, 45e9, 8e-6, 15e-6, 440e12, 2.5},
      {"cpu-loopback", "2-core CPU host: shared memory inside a node, TCP loopback across",
       6e9, 2.7e9, 20e-6, 50e-6, 50e9, 2.5},
  };
  return *profiles;
}

// A stage's item lists, as the model reads them.
enum class ItemList { kOverlap, kItems, kReturnOverlap };

struct TierBytes {
  std::array<int64_t, kNumTiers> send{};
  std::array<int64_t, kNumTiers> recv{};
};

void Add(const TransferList& ts, bool recv, TierBytes* b) {
  for (const Transfer& t : ts) {
    (recv ? b->recv : b->send)[static_cast<int>(t.tier)] += t.bytes;
  }
}

// Each tier's bandwidth in the model: a rank's, and for inter-node links
// shared by k ranks the link's (k times a rank's; the bytes are then the
// link's: LinkBytes).
std::array<double, kNumTiers> TierBandwidths(const HardwareProfile& p) {
  return {p.intra_bytes_per_s, p.inter_bytes_per_s * std::max(1.0, p.inter_link_ranks)};
}

// Seconds to move `b`: tiers in parallel; each tier limited by the larger of
// what the rank (for a shared inter-node link: the link) sends and receives
// on it.
double TransferSeconds(const HardwareProfile& p, const TierBytes& b,
                       std::array<double, kNumTiers>* per_tier) {
  double worst = 0;
  const std::array<double, kNumTiers> bw = TierBandwidths(p);
  const double lat[kNumTiers] = {p.intra_latency_s, p.inter_latency_s};
  for (int t = 0; t < kNumTiers; ++t) {
    const int64_t bytes = std::max(b.send[t], b.recv[t]);
    const double s = bytes > 0 ? lat[t] + static_cast<double>(bytes) / bw[t] : 0.0;
    if (per_tier != nullptr) (*per_tier)[t] += s;
    worst = std::max(worst, s);
  }
  return worst;
}

}  // namespace

int64_t ItemArea(const WorkItem& w) {
  MaskSlice s;
  s.q_end = w.num_q;
  s.k_end = w.num_k;
  s.type = w.type;
  s.offset = w.offset;
  s.window = w.window;
  return SliceArea(s);
}

int64_t ItemsArea(const SharedList<WorkItem>& items) {
  int64_t area = 0;
  for (const WorkItem& w : items) area += ItemArea(w);
  return area;
}

namespace {

double ComputeSeconds(const HardwareProfile& p, int64_t area, int64_t heads, int64_t kv_heads,
                      int64_t head_dim, bool backward) {
  const double flops = 4.0 * static_cast<double>(area) * heads * head_dim *
                       (backward ? p.backward_factor : 1.0);
  const double interleave =
      kv_heads > 1 && p.kv_interleave_factor < 1
          ? std::pow(p.kv_interleave_factor, std::log2(static_cast<double>(kv_heads)))
          : 1.0;
  return flops / (p.attention_flops * interleave);
}

// The bytes of one stage's lists.
StageBytes ListBytes(const Stage& st) {
  TierBytes b, r;
  Add(st.sends, false, &b);
  Add(st.recvs, true, &b);
  Add(st.return_sends, false, &r);
  Add(st.return_recvs, true, &r);
  return {b.send, b.recv, r.send, r.recv};
}

// area(stage index, backward?, list) -> area of that stage's items of `rp`
// in `list`; bytes(stage index, backward?) -> its StageBytes.
template <typename AreaFn, typename BytesFn>
RankModel ModelRankWith(const HardwareProfile& profile, int64_t D, AreaFn&& area,
                        BytesFn&& bytes, RankPlan* rp) {
  RankModel m;
  m.fwd_s.assign(rp->forward.size(), 0.0);
  m.bwd_s.assign(rp->backward.size(), 0.0);
  RankStats& rs = rp->stats;
  const int64_t heads = rp->q_head_end - rp->q_head_begin;
  const int64_t kv_heads = rp->kv_head_end - rp->kv_head_begin;
  rs.fwd_compute_us = rs.bwd_compute_us = rs.fwd_us = rs.bwd_us = 0;
  rs.fwd_transfer_us = {};
  rs.bwd_transfer_us = {};
  TierBytes fwd_total, bwd_total;
  for (size_t s = 0; s < rp->forward.size(); ++s) {
    const StageBytes sb = bytes(s, false);
    TierBytes b;
    b.send = sb.send;
    b.recv = sb.recv;
    for (int t = 0; t < kNumTiers; ++t) {
      fwd_total.send[t] += b.send[t];
      fwd_total.recv[t] += b.recv[t];
    }
    const double xfer = TransferSeconds(profile, b, &rs.fwd_transfer_us);
    const double overlap =
        ComputeSeconds(profile, area(s, false, ItemList::kOverlap), heads, kv_heads, D, false);
    const double after =
        ComputeSeconds(profile, area(s, false, ItemList::kItems), heads, kv_heads, D, false);
    const double t = std::max(xfer, overlap) + after;
    rs.fwd_compute_us += (overlap + after) * 1e6;
    rs.fwd_us += t * 1e6;
    m.fwd_s[s] = t;
  }
  for (size_t s = 0; s < rp->backward.size(); ++s) {
    const StageBytes sb = bytes(s, true);
    TierBytes b, r;
    b.send = sb.send;
    b.recv = sb.recv;
    r.send = sb.return_send;
    r.recv = sb.return_recv;
    for (const TierBytes* x : {&b, &r}) {
      for (int t = 0; t < kNumTiers; ++t) {
        bwd_total.send[t] += x->send[t];
        bwd_total.recv[t] += x->recv[t];
      }
    }
    const double xfer = TransferSeconds(profile, b, &rs.bwd_transfer_us);
    const double ret = TransferSeconds(profile, r, &rs.bwd_transfer_us);
    const double overlap =
        ComputeSeconds(profile, area(s, true, ItemList::kOverlap), heads, kv_heads, D, true);
    const double after =
        ComputeSeconds(profile, area(s, true, ItemList::kItems), heads, kv_heads, D, true);
    const double under_returns =
        ComputeSeconds(profile, area(s, true, ItemList::kReturnOverlap), heads, kv_heads, D, true);
    const double t = std::max(xfer, overlap) + after + std::max(ret, under_returns);
    rs.bwd_compute_us += (overlap + after + under_returns) * 1e6;
    rs.bwd_us += t * 1e6;
    m.bwd_s[s] = t;
  }
  for (int t = 0; t < kNumTiers; ++t) {
    rs.fwd_transfer_us[t] *= 1e6;
    rs.bwd_transfer_us[t] *= 1e6;
  }
  const std::array<double, kNumTiers> bw = TierBandwidths(profile);
  double fwd_bytes_s = 0, bwd_bytes_s = 0;
  for (int t = 0; t < kNumTiers; ++t) {
    fwd_bytes_s = std::max(fwd_bytes_s, std::max(fwd_total.send[t], fwd_total.recv[t]) / bw[t]);
    bwd_bytes_s = std::max(bwd_bytes_s, std::max(bwd_total.send[t], bwd_total.recv[t]) / bw[t]);
  }
  m.lb_fwd_s = std::max(rs.fwd_compute_us * 1e-6, fwd_bytes_s);
  m.lb_bwd_s = std::max(rs.bwd_compute_us * 1e-6, bwd_bytes_s);
  return m;
}

}  // namespace

std::vector<std::string> HardwareProfileNames() {
  std::vector<std::string> names;
  for (const HardwareProfile& p : Profiles()) names.push_back(p.name);
  return names;
}

namespace {

// One field of a parametric profile: where it goes, its unit (value in the
// string / divisor = the member's value; a division by an exact power of
// ten rounds as the literal "15e-6" does), its range, whether the string
// must give it.
struct CustomField {
  absl::string_view name;
  double HardwareProfile::*member;
  double divisor;
  double min, max;
  bool min_exclusive;
  bool required;
};

constexpr CustomField kCustomFields[] = {
    {"flops", &HardwareProfile::attention_flops, 1.0, 1.0, 1e21, false, true},
    {"inter_bytes_per_s", &HardwareProfile::inter_bytes_per_s, 1.0, 1.0, 1e15, false, true},
    {"intra_bytes_per_s", &HardwareProfile::intra_bytes_per_s, 1.0, 1.0, 1e15, false, true},
    {"inter_latency_us", &HardwareProfile::inter_latency_s, 1e6, 0.0, 1e9, false, false},
    {"intra_latency_us", &HardwareProfile::intra_latency_s, 1e6, 0.0, 1e9, false, false},
    {"backward_factor", &HardwareProfile::backward_factor, 1.0, 0.0, 100.0, true, false},
    {"kv_interleave_factor", &HardwareProfile::kv_interleave_factor, 1.0, 0.0, 1.0, true, false},
    {"inter_link_ranks", &HardwareProfile::inter_link_ranks, 1.0, 1.0, 1024.0, false, false},
};

// The optional fields whose default (1) the canonical string leaves out, so
// the strings of profiles without them stay as they were.
bool OmittedWhenOne(double HardwareProfile::*member) {
  return member == &HardwareProfile::kv_interleave_factor ||
         member == &HardwareProfile::inter_link_ranks;
}

std::string CustomFieldNames() {
  std::string out;
  for (const CustomField& f : kCustomFields) {
    absl::StrAppend(&out, out.empty() ? "" : ", ", f.name, f.required ? "" : " (optional)");
  }
  return out;
}

absl::StatusOr<HardwareProfile> ParseCustomProfile(absl::string_view name) {
  HardwareProfile p;
  p.name = std::string(name);
  p.description = "parametric profile";
  p.backward_factor = 2.5;
  const absl::string_view body = name.substr(kCustomProfilePrefix.size());
  auto error = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("profile \"", name, "\": ", what));
  };
  bool seen[ABSL_ARRAYSIZE(kCustomFields)] = {};
  for (absl::string_view item : absl::StrSplit(body, ',')) {
    const size_t eq = item.find('=');
    if (eq == absl::string_view::npos) {
      return error(absl::StrCat("item \"", item, "\" is not field=value; fields: ",
                                CustomFieldNames()));
    }
    const absl::string_view field = item.substr(0, eq), text = item.substr(eq + 1);
    size_t i = 0;
    while (i < ABSL_ARRAYSIZE(kCustomFields) && kCustomFields[i].name != field) ++i;
    if (i == ABSL_ARRAYSIZE(kCustomFields)) {
      return error(absl::StrCat("unknown field \"", field, "\"; fields: ", CustomFieldNames()));
    }
    const CustomField& f = kCustomFields[i];
    if (seen[i]) return error(absl::StrCat("field ", field, " is given twice"));
    seen[i] = true;
    double v = 0;
    if (!absl::SimpleAtod(text, &v) || !std::isfinite(v)) {
      return error(absl::StrCat("field ", field, " is \"", text, "\", not a finite number"));
    }
    if (v > f.max || v < f.min || (f.min_exclusive && v == f.min)) {
      return error(absl::StrCat("field ", field, " is ", text, "; it must be in ",
                                f.min_exclusive ? "(" : "[", f.min, ", ", f.max, "]"));
    }
    if (f.member == &HardwareProfile::inter_link_ranks && v != std::floor(v)) {
      return error(absl::StrCat("field ", field, " is ", text, "; it must be an integer"));
    }
    p.*f.member = v / f.divisor;
  }
  for (size_t i = 0; i < ABSL_ARRAYSIZE(kCustomFields); ++i) {
    if (kCustomFields[i].required && !seen[i]) {
      return error(absl::StrCat("field ", kCustomFields[i].name, " is missing; fields: ",
                                CustomFieldNames()));
    }
  }
  return p;
}

// The shortest %g form of value * divisor that the parser reads back as
// `value` (it divides by `divisor`); the closest form if none does.
std::string RoundTrip(double value, double divisor) {
  for (int precision = 1; precision <= 17; ++precision) {
    std::string s = absl::StrFormat("%.*g", precision, value * divisor);
    double back = 0;
    if (absl::SimpleAtod(s, &back) && back / divisor == value) return s;
  }
  return absl::StrFormat("%.17g", value * divisor);
}

}  // namespace

absl::StatusOr<HardwareProfile> ParseHardwareProfile(absl::string_view name) {
  for (const HardwareProfile& p : Profiles()) {
    if (p.name == name) return p;
  }
  if (absl::StartsWith(name, kCustomProfilePrefix)) return ParseCustomProfile(name);
  return absl::InvalidArgumentError(absl::StrCat(
      "profile \"", name, "\" is unknown; known: ", absl::StrJoin(HardwareProfileNames(), ", "),
      ", or ", kCustomProfilePrefix, "field=value,... (fields: ", CustomFieldNames(), ")"));
}

std::string CustomProfileString(const HardwareProfile& p) {
  std::string out(kCustomProfilePrefix);
  for (size_t i = 0; i < ABSL_ARRAYSIZE(kCustomFields); ++i) {
    const CustomField& f = kCustomFields[i];
    if (OmittedWhenOne(f.member) && p.*f.member == 1.0) continue;
    absl::StrAppend(&out, i == 0 ? "" : ",", f.name, "=", RoundTrip(p.*f.member, f.divisor));
  }
  return out;
}

bool IsKnownProfile(absl::string_view name) { return ParseHardwareProfile(name).ok(); }

double RoundToThreeDigits(double x) {
  if (!(x > 0) || !std::isfinite(x)) return x;
  // The double nearest the three-digit decimal (printed and read back):
  // round(x / scale) * scale gave 0.9530000000000001, which profile strings
  // then printed in full.
  double out = x;
  return absl::SimpleAtod(absl::StrFormat("%.3g", x), &out) ? out : x;
}

HardwareProfile GetHardwareProfile(absl::string_view name) {
  absl::StatusOr<HardwareProfile> p = ParseHardwareProfile(name);
  return p.ok() ? *std::move(p) : Profiles().front();
}

double StageTransferSeconds(const HardwareProfile& profile,
                            const std::array<int64_t, kNumTiers>& send_bytes,
                            const std::array<int64_t, kNumTiers>& recv_bytes) {
  TierBytes b;
  b.send = send_bytes;
  b.recv = recv_bytes;
  return TransferSeconds(profile, b, nullptr);
}

RankModel ModelRank(const HardwareProfile& profile, int64_t head_dim,
                    const std::vector<std::array<int64_t, 2>>& stage_area,
                    const std::vector<int64_t>& bwd_return_overlap_area,
                    const std::vector<StageBytes>& fwd_bytes,
                    const std::vector<StageBytes>& bwd_bytes, RankPlan* rp) {
  return ModelRankWith(
      profile, head_dim,
      [&](size_t s, bool backward, ItemList list) -> int64_t {
        const int64_t moved = backward && s < bwd_return_overlap_area.size()
                                  ? bwd_return_overlap_area[s]
                                  : 0;
        switch (list) {
          case ItemList::kOverlap: return stage_area[s][0] - moved;
          case ItemList::kItems: return stage_area[s][1];
          case ItemList::kReturnOverlap: return moved;
        }
        return 0;
      },
      [&](size_t s, bool backward) { return (backward ? bwd_bytes : fwd_bytes)[s]; }, rp);
}

RankModel ModelRankAreas(const HardwareProfile& profile, int64_t head_dim,
                         const std::vector<std::array<int64_t, 3>>& fwd_area,
                         const std::vector<std::array<int64_t, 3>>& bwd_area,
                         const std::vector<StageBytes>& fwd_bytes,
                         const std::vector<StageBytes>& bwd_bytes, RankPlan* rp) {
  return ModelRankWith(
      profile, head_dim,
      [&](size_t s, bool backward, ItemList list) -> int64_t {
        return (backward ? bwd_area : fwd_area)[s][static_cast<int>(list)];
      },
      [&](size_t s, bool backward) { return (backward ? bwd_bytes : fwd_bytes)[s]; }, rp);
}

double AreaSeconds(const HardwareProfile& profile, int64_t head_dim, int64_t heads,
                   int64_t kv_heads, bool backward) {
  return ComputeSeconds(profile, 1, heads, kv_heads, head_dim, backward);
}

size_t ItemsCovering(const HardwareProfile& profile, int64_t head_dim, int64_t heads,
                     int64_t kv_heads, bool backward, double seconds,
                     const WorkItemList& items) {
  if (!(seconds > 0)) return 0;
  // The area that takes `seconds`, compared in area (exact integers) item
  // by item.
  const double per_area = ComputeSeconds(profile, 1, heads, kv_heads, head_dim, backward);
  if (!(per_area > 0)) return items.size();
  const double target = seconds / per_area;
  int64_t area = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    if (static_cast<double>(area) >= target) return i;
    area += ItemArea(items[i]);
  }
  return items.size();
}

void FinishModel(const std::vector<RankModel>& models, PlanStats* stats) {
  size_t fwd_stages = 0, bwd_stages = 0;
  for (const RankModel& m : models) {
    fwd_stages = std::max(fwd_stages, m.fwd_s.size());
    bwd_stages = std::max(bwd_stages, m.bwd_s.size());
  }
  std::vector<double> fwd_max(fwd_stages, 0.0), bwd_max(bwd_stages, 0.0);
  double lb_fwd = 0, lb_bwd = 0;
  for (const RankModel& m : models) {
    for (size_t s = 0; s < m.fwd_s.size(); ++s) fwd_max[s] = std::max(fwd_max[s], m.fwd_s[s]);
    for (size_t s = 0; s < m.bwd_s.size(); ++s) bwd_max[s] = std::max(bwd_max[s], m.bwd_s[s]);
    lb_fwd = std::max(lb_fwd, m.lb_fwd_s);
    lb_bwd = std::max(lb_bwd, m.lb_bwd_s);
  }
  stats->fwd_us = stats->bwd_us = 0;
  for (double t : fwd_max) stats->fwd_us += t * 1e6;
  for (double t : bwd_max) stats->bwd_us += t * 1e6;
  stats->modeled_us = stats->fwd_us + stats->bwd_us;
  stats->lower_bound_us = (lb_fwd + lb_bwd) * 1e6;
}

namespace {

// For inter_link_ranks k > 1: each stage's StageBytes of every rank with its
// inter-node bytes replaced by those of its link (the sums over the link's
// ranks: a node's ranks in rank order, k to a link).
std::vector<std::vector<StageBytes>> LinkBytes(const Plan& plan, bool backward, int32_t k) {
  const size_t P = plan.ranks.size();
  std::vector<std::vector<StageBytes>> own(P), link_of(P);
  std::map<int32_t, int32_t> seen_on_node;
  std::vector<int64_t> link(P);  // (node, index of the link on it) packed
  for (size_t r = 0; r < P; ++r) {
    const RankPlan& rp = plan.ranks[r];
    for (const Stage& st : backward ? rp.backward : rp.forward) own[r].push_back(ListBytes(st));
    const int32_t index = seen_on_node[rp.node]++;
    link[r] = (static_cast<int64_t>(rp.node) << 32) | (index / k);
  }
  std::map<int64_t, std::vector<StageBytes>> sums;
  constexpr int kInter = static_cast<int>(LinkTier::kInterNode);
  for (size_t r = 0; r < P; ++r) {
    std::vector<StageBytes>& sum = sums[link[r]];
    if (sum.size() < own[r].size()) sum.resize(own[r].size());
    for (size_t s = 0; s < own[r].size(); ++s) {
      sum[s].send[kInter] += own[r][s].send[kInter];
      sum[s].recv[kInter] += own[r][s].recv[kInter];
      sum[s].return_send[kInter] += own[r][s].return_send[kInter];
      sum[s].return_recv[kInter] += own[r][s].return_recv[kInter];
    }
  }
  for (size_t r = 0; r < P; ++r) {
    const std::vector<StageBytes>& sum = sums[link[r]];
    for (size_t s = 0; s < own[r].size(); ++s) {
      own[r][s].send[kInter] = sum[s].send[kInter];
      own[r][s].recv[kInter] = sum[s].recv[kInter];
      own[r][s].return_send[kInter] = sum[s].return_send[kInter];
      own[r][s].return_recv[kInter] = sum[s].return_recv[kInter];
    }
  }
  return own;
}

}  // namespace

void ModelPlanTime(const HardwareProfile& profile, Plan* plan) {
  const int32_t k = static_cast<int32_t>(std::max(1.0, profile.inter_link_ranks));
  std::vector<std::vector<StageBytes>> link_fwd, link_bwd;
  if (k > 1) {
    link_fwd = LinkBytes(*plan, false, k);
    link_bwd = LinkBytes(*plan, true, k);
  }
  std::vector<RankModel> models;
  for (size_t r = 0; r < plan->ranks.size(); ++r) {
    RankPlan& rp = plan->ranks[r];
    models.push_back(ModelRankWith(
        profile, plan->spec.shape.head_dim,
        [&rp](size_t s, bool backward, ItemList list) {
          const Stage& st = (backward ? rp.backward : rp.forward)[s];
          return ItemsArea(list == ItemList::kOverlap ? st.overlap_items
                           : list == ItemList::kItems ? st.items
                                                      : st.return_overlap_items);
        },
        [&, r](size_t s, bool backward) {
          if (k > 1) return (backward ? link_bwd : link_fwd)[r][s];
          return ListBytes((backward ? rp.backward : rp.forward)[s]);
        },
        &rp));
  }
  FinishModel(models, &plan->stats);
}

}  // namespace hsap::plan
