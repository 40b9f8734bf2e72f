#include "server/plan/pipelined_level.h"

#include <algorithm>
#include <iterator>
#include <utility>

namespace hsap::plan::internal {

double EstimatedTransferSeconds(const HardwareProfile& profile,
                                std::array<int64_t, kNumTiers> send,
                                std::array<int64_t, kNumTiers> recv) {
  const int64_t k = static_cast<int64_t>(std::max(1.0, profile.inter_link_ranks));
  constexpr int kInter = static_cast<int>(LinkTier::kInterNode);
  send[kInter] *= k;
  recv[kInter] *= k;
  return StageTransferSeconds(profile, send, recv);
}

void AppendBackwardPipelined(const std::vector<Stage>& fwd, size_t first, size_t end,
                             int64_t ratio, std::vector<Stage>* bwd) {
  const size_t n = end - first;  // K + 1 stages
  // Per stage: returned sends (mirror the receives of stage s - 2), returned
  // receives (mirror its sends), landing at running offsets of the return
  // buffer within each exchange.
  std::vector<std::vector<Transfer>> ret_send(n + 1), ret_recv(n + 1);
  auto mirror = [ratio](const Transfer& t, RowSpace space) {
    Transfer r = t;
    r.payload = Payload::kGradKv;
    r.space = space;
    r.bytes = t.bytes * ratio;  // fp32 partials (wire_layout.h)
    r.buffer_offset = 0;
    return r;
  };
  for (size_t c = 0; c + 1 < n; ++c) {
    // The stage whose exchange carries chunk c's returns; n: the last
    // stage's return phase.
    const size_t at = c + 2 < n ? c + 2 : n;
    ret_send[at].reserve(fwd[first + c].recvs.size());
    ret_recv[at].reserve(fwd[first + c].sends.size());
    for (const Transfer& t : fwd[first + c].recvs) ret_send[at].push_back(mirror(t, RowSpace::kRecv));
    for (const Transfer& t : fwd[first + c].sends) ret_recv[at].push_back(mirror(t, RowSpace::kHome));
  }
  // Each list mirrors one forward stage's list: sorted by peer already.
  auto by_peer = [](const Transfer& a, const Transfer& b) {
    return std::make_pair(a.peer, a.payload) < std::make_pair(b.peer, b.payload);
  };
  for (size_t k = 0; k <= n; ++k) {
    int64_t offset = 0;
    for (Transfer& r : ret_recv[k]) {
      r.buffer_offset = offset;
      offset += r.bytes;
    }
  }
  auto merged = [&](const TransferList& kv, const std::vector<Transfer>& ret) -> TransferList {
    if (ret.empty()) return kv;
    std::vector<Transfer> out;
    out.reserve(kv.size() + ret.size());
    std::merge(kv.begin(), kv.end(), ret.begin(), ret.end(), std::back_inserter(out), by_peer);
    return out;
  };
  for (size_t k = 0; k < n; ++k) {
    Stage st = fwd[first + k];
    st.sends = merged(st.sends, ret_send[k]);
    st.recvs = merged(st.recvs, ret_recv[k]);
    if (k + 1 == n) {
      if (!ret_send[n].empty()) st.return_sends = std::move(ret_send[n]);
      if (!ret_recv[n].empty()) st.return_recvs = std::move(ret_recv[n]);
    }
    bwd->push_back(std::move(st));
  }
}

PipelineNeeds NeedsOf(const HardwareProfile& profile, int64_t head_dim, const RankBytes& rb,
                      size_t first, size_t end,
                      const std::vector<std::array<int64_t, 2>>& inner_area,
                      const RankPlan& rp) {
  const int64_t heads = rp.q_head_end - rp.q_head_begin;
  const int64_t kv_heads = rp.kv_head_end - rp.kv_head_begin;
  auto seconds = [&](const std::array<int64_t, kNumTiers>& send,
                     const std::array<int64_t, kNumTiers>& recv) {
    return EstimatedTransferSeconds(profile, send, recv);
  };
  PipelineNeeds n;
  for (int backward = 0; backward < 2; ++backward) {
    const std::vector<StageBytes>& bytes = backward ? rb.bwd : rb.fwd;
    const double per_area =
        heads > 0 ? AreaSeconds(profile, head_dim, heads, kv_heads, backward) : 0.0;
    for (size_t s = first; s < end; ++s) {
      // Stage `first`'s overlap list is the home items: not a need.
      const double items = s == first ? 0.0 : static_cast<double>(inner_area[s - first][0]) * per_area;
      n.stage_s[backward].push_back(std::max(seconds(bytes[s].send, bytes[s].recv), items));
    }
  }
  n.return_s = seconds(rb.bwd[end - 1].return_send, rb.bwd[end - 1].return_recv);
  if (heads > 0) {
    int64_t home = inner_area[0][0], received = 0;
    for (size_t s = first + 1; s < end; ++s) received += inner_area[s - first][0];
    std::array<int64_t, kNumTiers> send{}, recv{}, ret_send{}, ret_recv{};
    for (size_t s = first; s < end; ++s) {
      for (int t = 0; t < kNumTiers; ++t) {
        send[t] += rb.fwd[s].send[t];
        recv[t] += rb.fwd[s].recv[t];
        ret_send[t] += rb.bwd[s].return_send[t];
        ret_recv[t] += rb.bwd[s].return_recv[t];
      }
    }
    // The returns riding K/V exchanges count in the backward's send/recv.
    for (size_t s = first; s < end; ++s) {
      for (int t = 0; t < kNumTiers; ++t) {
        ret_send[t] += rb.bwd[s].send[t] - rb.fwd[s].send[t];
        ret_recv[t] += rb.bwd[s].recv[t] - rb.fwd[s].recv[t];
      }
    }
    const double x = StageTransferSeconds(profile, send, recv);
    const double ret = StageTransferSeconds(profile, ret_send, ret_recv);
    for (int backward = 0; backward < 2; ++backward) {
      const double pa = AreaSeconds(profile, head_dim, heads, kv_heads, backward);
      const double h = static_cast<double>(home) * pa, r = static_cast<double>(received) * pa;
      n.one_stage_s[backward] = backward ? r + std::max(x + ret, h) : std::max(x, h) + r;
    }
  }
  return n;
}

std::array<std::vector<std::array<int64_t, 3>>, 2> ScheduleHomeItems(
    const HardwareProfile& profile, int64_t head_dim, const PipelineNeeds& level, size_t first,
    size_t end, const std::vector<std::array<int64_t, 2>>& inner_area, RankPlan* rp) {
  const int64_t heads = rp->q_head_end - rp->q_head_begin;
  const int64_t kv_heads = rp->kv_head_end - rp->kv_head_begin;
  std::array<std::vector<std::array<int64_t, 3>>, 2> areas;
  for (int backward = 0; backward < 2; ++backward) {
    std::vector<Stage>& stages = backward ? rp->backward : rp->forward;
    std::vector<std::array<int64_t, 3>>& area = areas[backward];
    area.assign(stages.size(), {0, 0, 0});
    for (size_t s = first; s < end; ++s) {
      area[s] = {inner_area[s - first][0], inner_area[s - first][1], 0};
    }
    const WorkItemList home = stages[first].overlap_items;
    const double per_area = AreaSeconds(profile, head_dim, heads, kv_heads, backward);
    if (home.empty() || !(per_area > 0)) continue;
    std::vector<int64_t> prefix(home.size() + 1, 0);
    for (size_t i = 0; i < home.size(); ++i) prefix[i + 1] = prefix[i] + ItemArea(home[i]);
    size_t lo = 0, hi = home.size();  // the home items not placed yet
    auto take_front = [&](double need) {
      const size_t a = lo;
      while (lo < hi && static_cast<double>(prefix[lo + 1] - prefix[a]) * per_area <= need) ++lo;
      return std::make_pair(a, lo);
    };
    auto take_back = [&](double need) {
      const size_t b = hi;
      while (hi > lo && static_cast<double>(prefix[b] - prefix[hi - 1]) * per_area <= need) --hi;
      return std::make_pair(hi, b);
    };
    const std::vector<double>& lv = level.stage_s[backward];
    std::vector<std::pair<size_t, size_t>> run(end - first, {0, 0});
    run[0] = take_front(lv[0]);
    std::pair<size_t, size_t> under_returns{0, 0};
    if (backward) under_returns = take_back(level.return_s);
    for (size_t s = first + 1; s < end; ++s) {
      const double room =
          lv[s - first] - static_cast<double>(inner_area[s - first][0]) * per_area;
      if (room > 0) run[s - first] = backward ? take_front(room) : take_back(room);
    }
    if (backward) {
      under_returns.first = lo;  // the rest, next to the return phase's run
    } else {
      run[0].second = hi;  // the rest, next to the first stage's run
    }
    for (size_t s = first; s < end; ++s) {
      const auto [a, b] = run[s - first];
      Stage& st = stages[s];
      if (s == first) {
        st.overlap_items = home.Sub(a, b - a);
        area[s][0] = prefix[b] - prefix[a];
      } else if (b > a) {
        std::vector<WorkItem> items = st.overlap_items.ToVector();
        items.insert(items.end(), home.begin() + a, home.begin() + b);
        st.overlap_items = std::move(items);
        area[s][0] += prefix[b] - prefix[a];
      }
    }
    if (under_returns.second > under_returns.first) {
      const auto [a, b] = under_returns;
      stages[end - 1].return_overlap_items = home.Sub(a, b - a);
      area[end - 1][2] = prefix[b] - prefix[a];
    }
  }
  return areas;
}

}  // namespace hsap::plan::internal
