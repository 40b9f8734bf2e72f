#include "server/plan/plan_checker.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "server/plan/plan_spec.h"

namespace hsap::plan {
namespace {

// Global token of each home row of `rank`.
std::vector<int64_t> HomeTokens(const Plan& plan, int32_t rank) {
  const int32_t U = plan.head_group_size;
  const int32_t g0 = rank / U * U;
  std::vector<int64_t> out;
  for (int32_t m = g0; m < g0 + U; ++m) {
    for (const TokenRange& t : plan.dispatch.ranges[m]) {
      for (int64_t x = t.begin; x < t.end; ++x) out.push_back(x);
    }
  }
  return out;
}

std::vector<std::vector<uint8_t>> AllowedMatrix(const Plan& plan) {
  const int64_t T = plan.spec.total_tokens;
  std::vector<std::vector<uint8_t>> allowed(T, std::vector<uint8_t>(T, 0));
  for (const MaskSlice& s : ResolveSlices(plan.spec)) {
    for (int64_t q = s.q_begin; q < s.q_end; ++q) {
      for (int64_t k = s.k_begin; k < s.k_end; ++k) {
        if (SliceAllows(s.type, s.offset, s.window, q - s.q_begin, k - s.k_begin)) {
          allowed[q][k] = 1;
        }
      }
    }
  }
  return allowed;
}

absl::Status CheckItems(const Plan& plan, bool backward, const std::vector<std::vector<uint8_t>>& allowed) {
  const int64_t T = plan.spec.total_tokens;
  const int32_t H = plan.spec.shape.num_heads_q;
  std::vector<uint8_t> count(static_cast<size_t>(T) * T * H, 0);
  for (const RankPlan& rp : plan.ranks) {
    const std::vector<int64_t> home = HomeTokens(plan, rp.rank);
    const auto& stages = backward ? rp.backward : rp.forward;
    // The token in each receive-buffer row: rows keep what a stage received
    // until a later stage receives into them (a pipelined plan's items read
    // rows of earlier stages).
    std::map<int64_t, int64_t> recv_row_token;
    for (size_t s = 0; s < stages.size(); ++s) {
      const Stage& st = stages[s];
      std::map<int64_t, int64_t> landing;  // what this stage's receives write
      for (const Transfer& t : st.recvs) {
        if (t.space != RowSpace::kRecv) continue;
        for (const Segment& seg : t.segments) {
          for (int64_t x = seg.global_begin; x < seg.global_end; ++x) {
            landing[seg.row + (x - seg.global_begin)] = x;
          }
        }
      }
      if (!backward && !st.return_overlap_items.empty()) {
        return absl::InternalError(absl::StrCat("rank ", rp.rank, " stage ", s,
                                                ": return_overlap_items in a forward stage"));
      }
      // Lists: overlap_items, items, return_overlap_items; the first and
      // the last run during transfers and read home rows only.
      // Lists: overlap_items (while this stage's receives write: rows of
      // earlier stages only), items (after them), return_overlap_items
      // (while the returns fly: home rows only).
      for (int pass = 0; pass < 3; ++pass) {
        const WorkItemList& list =
            pass == 0 ? st.overlap_items : pass == 1 ? st.items : st.return_overlap_items;
        if (pass == 1) {
          for (const auto& [row, token] : landing) recv_row_token[row] = token;
        }
        for (const WorkItem& w : list) {
          if (pass == 2 && w.kv_space != RowSpace::kHome) {
            return absl::InternalError(absl::StrCat("rank ", rp.rank, " stage ", s,
                                                    ": item under the returns reads the receive buffer"));
          }
          if (w.q_row < 0 || w.q_row + w.num_q > static_cast<int64_t>(home.size())) {
            return absl::InternalError(absl::StrCat("rank ", rp.rank, " stage ", s,
                                                    ": q rows out of home range"));
          }
          for (int64_t i = 0; i < w.num_q; ++i) {
            const int64_t q = home[w.q_row + i];
            for (int64_t j = 0; j < w.num_k; ++j) {
              if (!SliceAllows(w.type, w.offset, w.window, i, j)) continue;
              int64_t k;
              if (w.kv_space == RowSpace::kHome) {
                if (w.kv_row + j >= static_cast<int64_t>(home.size())) {
                  return absl::InternalError(absl::StrCat("rank ", rp.rank, " stage ", s,
                                                          ": kv home row out of range"));
                }
                k = home[w.kv_row + j];
              } else {
                if (pass == 0 && landing.count(w.kv_row + j) > 0) {
                  return absl::InternalError(absl::StrCat(
                      "rank ", rp.rank, " stage ", s, ": overlap item reads receive row ",
                      w.kv_row + j, " while this stage receives into it"));
                }
                auto it = recv_row_token.find(w.kv_row + j);
                if (it == recv_row_token.end()) {
                  return absl::InternalError(absl::StrCat("rank ", rp.rank, " stage ", s,
                                                          ": item reads receive row ",
                                                          w.kv_row + j,
                                                          " that no stage has filled"));
                }
                k = it->second;
              }
              if (!allowed[q][k]) {
                return absl::InternalError(absl::StrCat("rank ", rp.rank, " stage ", s,
                                                        ": computes masked pair (", q, ", ", k,
                                                        ")"));
              }
              for (int32_t h = rp.q_head_begin; h < rp.q_head_end; ++h) {
                ++count[(static_cast<size_t>(h) * T + q) * T + k];
              }
            }
          }
        }
      }
    }
  }
  for (int32_t h = 0; h < H; ++h) {
    for (int64_t q = 0; q < T; ++q) {
      for (int64_t k = 0; k < T; ++k) {
        const int c = count[(static_cast<size_t>(h) * T + q) * T + k];
        if (c != allowed[q][k]) {
          return absl::InternalError(absl::StrCat(backward ? "backward" : "forward", ": pair (h ",
                                                  h, ", q ", q, ", k ", k, ") computed ", c,
                                                  " times, allowed ", int{allowed[q][k]}));
        }
      }
    }
  }
  return absl::OkStatus();
}

std::vector<std::pair<int64_t, int64_t>> Ranges(const Transfer& t) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const Segment& s : t.segments) out.push_back({s.global_begin, s.global_end});
  return out;
}

absl::Status MatchLists(const Plan& plan, bool backward, bool returns) {
  for (const RankPlan& rp : plan.ranks) {
    const auto& stages = backward ? rp.backward : rp.forward;
    for (size_t s = 0; s < stages.size(); ++s) {
      for (int dir = 0; dir < 2; ++dir) {
        const auto& mine = dir == 0 ? (returns ? stages[s].return_sends : stages[s].sends)
                                    : (returns ? stages[s].return_recvs : stages[s].recvs);
        for (size_t i = 0; i < mine.size(); ++i) {
          const Transfer& t = mine[i];
          if (i > 0 && std::make_tuple(mine[i - 1].peer, mine[i - 1].payload) >=
                           std::make_tuple(t.peer, t.payload)) {
            return absl::InternalError(absl::StrCat("rank ", rp.rank, " stage ", s,
                                                    ": transfers not sorted by peer"));
          }
          if (t.peer == rp.rank || t.peer < 0 || t.peer >= static_cast<int32_t>(plan.ranks.size())) {
            return absl::InternalError(absl::StrCat("rank ", rp.rank, " stage ", s, ": bad peer ",
                                                    t.peer));
          }
          const RankPlan& peer = plan.ranks[t.peer];
          const auto& pstages = backward ? peer.backward : peer.forward;
          if (s >= pstages.size()) return absl::InternalError("stage counts differ");
          const auto& theirs = dir == 0 ? (returns ? pstages[s].return_recvs : pstages[s].recvs)
                                        : (returns ? pstages[s].return_sends : pstages[s].sends);
          int found = 0;
          for (const Transfer& o : theirs) {
            if (o.peer != rp.rank || o.payload != t.payload) continue;
            ++found;
            if (Ranges(o) != Ranges(t) || o.bytes != t.bytes || o.tier != t.tier) {
              return absl::InternalError(absl::StrCat("rank ", rp.rank, " stage ", s,
                                                      ": transfer with ", t.peer,
                                                      " differs from its counterpart"));
            }
          }
          if (found != 1) {
            return absl::InternalError(absl::StrCat("rank ", rp.rank, " stage ", s, " ",
                                                    dir == 0 ? "send to " : "recv from ", t.peer,
                                                    " has ", found, " counterparts"));
          }
          if (t.bytes <= 0) return absl::InternalError("empty transfer");
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckCoverage(const Plan& plan) {
  const auto allowed = AllowedMatrix(plan);
  absl::Status s = CheckItems(plan, false, allowed);
  if (!s.ok()) return s;
  return CheckItems(plan, true, allowed);
}

absl::Status CheckTransfers(const Plan& plan) {
  for (bool bwd : {false, true}) {
    absl::Status s = MatchLists(plan, bwd, false);
    if (!s.ok()) return s;
  }
  return MatchLists(plan, true, true);
}

absl::Status CheckBudget(const Plan& plan) {
  const int64_t budget = plan.spec.recv_buffer_bytes;
  for (const RankPlan& rp : plan.ranks) {
    for (const auto* stages : {&rp.forward, &rp.backward}) {
      for (size_t s = 0; s < stages->size(); ++s) {
        // The receive buffer's extent (a pipelined plan's stages fill it
        // together); the returns of one exchange (the stage's own, or, in a
        // pipelined plan, those riding its K/V exchange).
        int64_t kv = 0, ret = 0, ret_in_exchange = 0;
        for (const Transfer& t : (*stages)[s].recvs) {
          if (t.space == RowSpace::kRecv) kv = std::max(kv, t.buffer_offset + t.bytes);
          if (t.payload == Payload::kGradKv) ret_in_exchange += t.bytes;
        }
        for (const Transfer& t : (*stages)[s].return_recvs) ret += t.bytes;
        ret = std::max(ret, ret_in_exchange);
        // Returned partials are fp32: up to ReturnBytesRatio times the K/V bytes.
        if (kv > budget || ret > budget * ReturnBytesRatio(plan.spec.shape.dtype)) {
          return absl::InternalError(absl::StrCat("rank ", rp.rank, " stage ", s, ": receives ",
                                                  kv, " K/V bytes and ", ret,
                                                  " dK/dV bytes; budget ", budget));
        }
      }
    }
  }
  return absl::OkStatus();
}

std::vector<int64_t> ExactNeedBruteForce(const Plan& plan) {
  const int64_t T = plan.spec.total_tokens;
  const auto allowed = AllowedMatrix(plan);
  std::vector<int32_t> owner(T, -1);
  for (int32_t r = 0; r < plan.dispatch.num_ranks(); ++r) {
    for (const TokenRange& t : plan.dispatch.ranges[r]) {
      for (int64_t x = t.begin; x < t.end; ++x) owner[x] = r;
    }
  }
  std::vector<int64_t> need(plan.dispatch.num_ranks(), 0);
  for (int32_t r = 0; r < plan.dispatch.num_ranks(); ++r) {
    for (int64_t k = 0; k < T; ++k) {
      if (owner[k] == r) continue;
      for (int64_t q = 0; q < T; ++q) {
        if (owner[q] == r && allowed[q][k]) {
          ++need[r];
          break;
        }
      }
    }
  }
  return need;
}

}  // namespace hsap::plan
