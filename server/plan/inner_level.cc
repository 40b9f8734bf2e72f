#include "server/plan/inner_level.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "server/plan/parallel.h"

namespace hsap::plan::internal {
namespace {

// Cuts [begin, end) of `owners` (sorted, partition) into owner runs and calls
// f(owner_segment, sub_begin, sub_end).
template <typename F>
void ForEachOwnerPiece(const std::vector<OwnerSegment>& owners, int64_t begin, int64_t end,
                       F&& f) {
  auto it = std::upper_bound(owners.begin(), owners.end(), begin,
                             [](int64_t x, const OwnerSegment& s) { return x < s.begin; });
  if (it != owners.begin()) --it;
  for (; it != owners.end() && it->begin < end; ++it) {
    const int64_t a = std::max(begin, it->begin), b = std::min(end, it->end);
    if (a < b) f(*it, a, b);
  }
}

// Greedy stage packing for allgather and exact need: each receiver's arrivals
// in order go to the earliest stage (from the receiver's current one) where
// both the receiver's receive rows and the sender's returned rows (backward
// dK/dV) stay within the budget; runs are split where a stage fills.
// Returns false (packing abandoned) when a run would go to stage kMaxStages
// or later.
bool PackGreedy(std::vector<std::vector<Arrival>>* arrivals, int64_t budget_rows) {
  const size_t n = arrivals->size();
  // Rows each sender returns per stage, stage-major (a receiver's arrivals
  // of one stage touch one row of n entries), grown a stage at a time.
  std::vector<int64_t> ret_load;
  auto ret = [&](int32_t src, int32_t s) -> int64_t& {
    const size_t at = static_cast<size_t>(s) * n + static_cast<size_t>(src);
    if (at >= ret_load.size()) ret_load.resize((static_cast<size_t>(s) + 1) * n, 0);
    return ret_load[at];
  };
  auto room_ret = [&](int32_t src, int32_t s) { return budget_rows - ret(src, s); };
  // Pieces of one receiver go to scratch, then back over its arrivals
  // (their array is reused: it usually has room).
  std::vector<Arrival> out;
  for (size_t v = 0; v < n; ++v) {
    out.clear();
    int32_t stage = 0;
    int64_t recv_load = 0;
    for (Arrival a : (*arrivals)[v]) {
      while (a.begin < a.end) {
        const int64_t room = std::min(budget_rows - recv_load, room_ret(a.src, stage));
        if (room <= 0) {
          if (budget_rows - recv_load <= 0) {
            if (++stage >= kMaxStages) return false;
            recv_load = 0;
          } else {
            // The sender's returns are full in this stage: look further
            // without closing the receiver's stage for other senders.
            int32_t s = stage + 1;
            while (s < kMaxStages && room_ret(a.src, s) <= 0) ++s;
            if (s >= kMaxStages) return false;
            // Place this run in stage s (the receiver's load there is 0 or
            // tracked below), keeping receiver order per stage irrelevant.
            const int64_t take = std::min({a.end - a.begin, room_ret(a.src, s), budget_rows});
            Arrival piece = a;
            piece.end = a.begin + take;
            piece.stage = s;
            ret(a.src, s) += take;
            out.push_back(piece);
            a.src_row += take;
            a.begin += take;
            // The receiver's later stage s now holds this piece only (all
            // earlier pieces are in stages <= the old one): move on to it.
            stage = s;
            recv_load = take;
          }
          continue;
        }
        const int64_t take = std::min(room, a.end - a.begin);
        Arrival piece = a;
        piece.end = a.begin + take;
        piece.stage = stage;
        ret(a.src, stage) += take;
        recv_load += take;
        out.push_back(piece);
        a.src_row += take;
        a.begin += take;
      }
    }
    (*arrivals)[v].assign(out.begin(), out.end());
  }
  return true;
}

// Cuts each receiver's arrivals (all in stage 0) into `chunks` stages so
// that every stage moves about 1/chunks of the receiver's rows: the rows
// from each sender are cut (in the arrivals' order) into near-equal parts of
// at least min(kMinPartRows, half a stage's share of the receiver's rows)
// (at most `chunks` parts), spread evenly over the
// stages from stage (sender + receiver) mod chunks, so that the senders'
// parts interleave and small senders do not multiply the transfers.
// Rows of one part at most need (a sender of fewer sends them in one stage).
constexpr int64_t kMinPartRows = 1024;

void CutIntoChunks(std::vector<std::vector<Arrival>>* arrivals, int32_t chunks,
                   ThreadPool* pool) {
  const size_t n = arrivals->size();
  ForEachIndex(pool, static_cast<int64_t>(n), [&](int64_t v) {
    std::vector<Arrival>& av = (*arrivals)[v];
    std::vector<int64_t> total(n, 0), done(n, 0);
    int64_t rows = 0;
    for (const Arrival& a : av) {
      total[a.src] += a.end - a.begin;
      rows += a.end - a.begin;
    }
    // Parts of kMinPartRows, smaller where the receiver's whole need is
    // (half a stage's share: small needs are cut too).
    const int64_t min_part =
        std::clamp<int64_t>(rows / (2 * int64_t{chunks}), 1, kMinPartRows);
    std::vector<Arrival> out;
    out.reserve(av.size() + static_cast<size_t>(chunks) * static_cast<size_t>(chunks));
    for (Arrival a : av) {
      const int64_t t = total[a.src];
      // The sender's rows in `parts` near-equal parts, part j in stage
      // (sender + receiver + j * chunks / parts) mod chunks.
      const int64_t parts = std::clamp<int64_t>(t / min_part, 1, chunks);
      while (a.begin < a.end) {
        int64_t j = done[a.src] * parts / t;
        while (t * (j + 1) / parts <= done[a.src]) ++j;
        const int64_t part_end = t * (j + 1) / parts;
        const int64_t take = std::min(a.end - a.begin, part_end - done[a.src]);
        Arrival piece = a;
        piece.end = a.begin + take;
        piece.stage = static_cast<int32_t>((a.src + v + j * chunks / parts) % chunks);
        out.push_back(piece);
        a.begin += take;
        a.src_row += take;
        done[a.src] += take;
      }
    }
    av = std::move(out);
  });
}

// Work items a thread keeps in its scratch between virtual ranks (3.5 MB).
constexpr size_t kKeptScratchItems = size_t{1} << 16;

}  // namespace

absl::StatusOr<InnerPacking> PackInnerLevel(const SliceIndex& index,
                                            const std::vector<std::vector<OwnerSegment>>& home,
                                            const std::vector<OwnerSegment>& owners,
                                            InnerKind kind, int64_t budget_rows,
                                            ThreadPool* pool, int32_t pipeline_stages) {
  auto too_many_stages = [&](int64_t stages) {
    return absl::InvalidArgumentError(absl::StrCat(
        "recv_buffer_bytes: a receive budget of ", budget_rows, " token rows needs ",
        stages >= kMaxStages ? absl::StrCat("at least ", stages) : absl::StrCat(stages),
        " stages for this structure, more than ", kMaxStages,
        "; raise recv_buffer_bytes"));
  };
  const int32_t V = static_cast<int32_t>(home.size());
  InnerPacking pk;
  pk.demands.resize(V);
  pk.arrivals.resize(V);
  pk.exact_need_rows.assign(V, 0);
  std::vector<std::vector<Demand>>& demands = pk.demands;
  std::vector<std::vector<Arrival>>& arrivals = pk.arrivals;
  ForEachIndex(pool, V, [&](int64_t v) {
    demands[v] = ComputeDemands(index, home[v]);
    const std::vector<TokenRange> need = ExactNeed(demands[v], home[v]);
    pk.exact_need_rows[v] = TotalTokens(need);
    if (kind == InnerKind::kExactNeed) {
      for (const TokenRange& t : need) {
        ForEachOwnerPiece(owners, t.begin, t.end, [&](const OwnerSegment& o, int64_t a, int64_t b) {
          arrivals[v].push_back({o.rank, 0, a, b, o.local_row + (a - o.begin), 0});
        });
      }
    } else if (kind == InnerKind::kAllGather) {
      for (const OwnerSegment& o : owners) {
        if (o.rank != v) arrivals[v].push_back({o.rank, 0, o.begin, o.end, o.local_row, 0});
      }
    }
  });
  int32_t num_stages = 1;
  if (kind == InnerKind::kRing) {
    int64_t max_rows = 0;
    for (const auto& h : home) {
      int64_t n = 0;
      for (const OwnerSegment& s : h) n += s.end - s.begin;
      max_rows = std::max(max_rows, n);
    }
    const int64_t chunks = std::max<int64_t>(1, (max_rows + budget_rows - 1) / budget_rows);
    if (V - 1 > kMaxStages) {
      return absl::InvalidArgumentError(absl::StrCat(
          "strategy: a ring over ", V, " groups takes ", V - 1, " stages, more than ",
          kMaxStages));
    }
    if ((V - 1) * chunks > kMaxStages) return too_many_stages((V - 1) * chunks);
    for (int32_t v = 0; v < V; ++v) {
      for (int32_t k = 1; k < V; ++k) {
        const int32_t src = (v - k + V) % V;
        // Home rows of src cut at multiples of budget_rows: chunk j is stage
        // (k - 1) * chunks + j.
        for (const OwnerSegment& s : home[src]) {
          int64_t a = s.begin;
          while (a < s.end) {
            const int64_t row = s.local_row + (a - s.begin);
            const int64_t j = row / budget_rows;
            const int64_t b = std::min(s.end, a + (j + 1) * budget_rows - row);
            arrivals[v].push_back(
                {src, static_cast<int32_t>((k - 1) * chunks + j), a, b, row, 0});
            a = b;
          }
        }
      }
    }
    num_stages = std::max<int64_t>(1, (V - 1) * chunks);
  } else if (!PackGreedy(&arrivals, budget_rows)) {
    return too_many_stages(kMaxStages);
  }
  for (const auto& av : arrivals) {
    for (const Arrival& a : av) num_stages = std::max(num_stages, a.stage + 1);
  }
  if (kind == InnerKind::kExactNeed && num_stages == 1 && pipeline_stages > 1 &&
      pipeline_stages < kMaxStages) {
    CutIntoChunks(&arrivals, pipeline_stages, pool);
    num_stages = pipeline_stages;
    pk.pipelined = true;
  }
  pk.num_stages = num_stages;
  return pk;
}

std::vector<InnerRank> BuildInnerLevel(const SliceIndex& index,
                                       const std::vector<OwnerSegment>& owners,
                                       InnerPacking packing, ThreadPool* pool) {
  const int32_t V = static_cast<int32_t>(packing.arrivals.size());
  const auto slices = index.slices();
  const int32_t num_stages = packing.num_stages;
  const bool pipelined = packing.pipelined;
  // A pipelined level's last stage moves nothing: it computes the last chunk.
  const int32_t built_stages = num_stages + (pipelined ? 1 : 0);
  std::vector<std::vector<Demand>>& demands = packing.demands;
  std::vector<std::vector<Arrival>>& arrivals = packing.arrivals;
  std::vector<InnerRank> out(V);
  for (int32_t v = 0; v < V; ++v) {
    out[v].exact_need_rows = packing.exact_need_rows[v];
    out[v].stages.assign(built_stages, Stage{});
    out[v].pipelined = pipelined;
  }

  // Receive rows: per stage, in (src, global) order from row 0. Each
  // receiver's segments live in a pool of its own (shared_list.h): entry i
  // of its receive pool is arrival i (a run of one sender's home rows: an
  // arrival never crosses an owner segment) at its receive rows, entry i of
  // its send pool the same run at the sender's home rows.
  std::vector<std::shared_ptr<std::vector<Segment>>> send_pools(V);
  // Arrivals end in global order (the work items look keys up there); the
  // receive order (stage, src, global) is a stable counting sort of their
  // indices by src, then by stage.
  ForEachIndex(pool, V, [&](int64_t v) {
    auto& av = arrivals[v];
    auto by_begin = [](const Arrival& a, const Arrival& b) { return a.begin < b.begin; };
    if (!std::is_sorted(av.begin(), av.end(), by_begin)) std::sort(av.begin(), av.end(), by_begin);
    std::vector<uint32_t> by_src(av.size()), order(av.size());
    {
      std::vector<uint32_t> first(static_cast<size_t>(V) + 1, 0);
      for (const Arrival& a : av) ++first[a.src + 1];
      for (int32_t w = 0; w < V; ++w) first[w + 1] += first[w];
      for (size_t i = 0; i < av.size(); ++i) by_src[first[av[i].src]++] = static_cast<uint32_t>(i);
    }
    {
      std::vector<uint32_t> first(static_cast<size_t>(num_stages) + 1, 0);
      for (const Arrival& a : av) ++first[a.stage + 1];
      for (int32_t s = 0; s < num_stages; ++s) first[s + 1] += first[s];
      for (uint32_t i : by_src) order[first[av[i].stage]++] = i;
    }
    // One receive per (stage, sender) run of `order`, all of them in one
    // array (out[v].recv_pool, stage by stage); a stage's list is a view.
    size_t num_recvs = 0;
    for (size_t i = 0; i < order.size(); ++i) {
      num_recvs += i == 0 || av[order[i - 1]].stage != av[order[i]].stage ||
                   av[order[i - 1]].src != av[order[i]].src;
    }
    auto recvs = std::make_shared<std::vector<Transfer>>();
    recvs->reserve(num_recvs);
    std::vector<uint32_t> seg_begin;  // per receive: its first entry in the pools
    seg_begin.reserve(num_recvs + 1);
    std::vector<uint32_t> stage_first(static_cast<size_t>(num_stages) + 1, 0);
    auto recv_pool = std::make_shared<std::vector<Segment>>();
    auto send_pool = std::make_shared<std::vector<Segment>>();
    recv_pool->reserve(av.size());
    send_pool->reserve(av.size());
    int64_t row = 0;
    for (size_t i = 0; i < order.size(); ++i) {
      Arrival& a = av[order[i]];
      const bool new_stage = i == 0 || av[order[i - 1]].stage != a.stage;
      // Pipelined chunks live in the buffer together: rows go on.
      if (new_stage && !pipelined) row = 0;
      a.recv_row = row;
      row += a.end - a.begin;
      if (new_stage || recvs->back().peer != a.src) {
        Transfer t;
        t.peer = a.src;
        t.payload = Payload::kKv;
        t.space = RowSpace::kRecv;
        t.buffer_offset = a.recv_row;
        recvs->push_back(t);
        seg_begin.push_back(static_cast<uint32_t>(recv_pool->size()));
        ++stage_first[a.stage + 1];
      }
      recv_pool->push_back({a.begin, a.end, a.recv_row});
      send_pool->push_back({a.begin, a.end, a.src_row});
      recvs->back().bytes += a.end - a.begin;
    }
    seg_begin.push_back(static_cast<uint32_t>(recv_pool->size()));
    // Each receive's segments are a view of its run, set once the pool is
    // complete.
    for (size_t k = 0; k < recvs->size(); ++k) {
      (*recvs)[k].segments =
          SharedList<Segment>::View(recv_pool, seg_begin[k], seg_begin[k + 1] - seg_begin[k]);
    }
    for (int32_t st = 0; st < num_stages; ++st) stage_first[st + 1] += stage_first[st];
    for (int32_t st = 0; st < num_stages; ++st) {
      out[v].stages[st].recvs =
          TransferList::View(recvs, stage_first[st], stage_first[st + 1] - stage_first[st]);
    }
    out[v].recv_pool = std::move(recvs);
    send_pools[v] = std::move(send_pool);
  });
  // Sends mirror receives: sender u's sends of stage s are the receives from
  // u in stage s, receivers ascending (so sorted by peer). Receivers are cut
  // into C chunks; each chunk counts its receives per (sender, stage), the
  // counts give every chunk its slots in each list, and each chunk then
  // fills its slots, all over the pool. C does not depend on the pool, and
  // the slots are those of a sequential pass in receiver order.
  const int64_t cells = int64_t{V} * num_stages;  // (sender, stage)
  const int64_t C = std::clamp<int64_t>((int64_t{1} << 22) / std::max<int64_t>(1, cells), 1,
                                        std::min<int64_t>(8, V));
  auto chunk_begin = [&](int64_t c) { return static_cast<int32_t>(V * c / C); };
  std::vector<std::vector<uint32_t>> slot(C, std::vector<uint32_t>(cells, 0));
  ForEachIndex(pool, C, [&](int64_t c) {
    for (int32_t v = chunk_begin(c); v < chunk_begin(c + 1); ++v) {
      for (int32_t s = 0; s < num_stages; ++s) {
        for (const Transfer& r : out[v].stages[s].recvs) ++slot[c][r.peer * num_stages + s];
      }
    }
  });
  std::vector<uint32_t> total(cells, 0);
  for (int64_t x = 0; x < cells; ++x) {
    for (int64_t c = 0; c < C; ++c) {  // counts become first slots
      const uint32_t n = slot[c][x];
      slot[c][x] = total[x];
      total[x] += n;
    }
  }
  // Each sender's sends in one array (out[u].send_pool, stage by stage).
  std::vector<Transfer*> sends_of(cells, nullptr);
  ForEachIndex(pool, V, [&](int64_t u) {
    size_t n = 0;
    for (int32_t s = 0; s < num_stages; ++s) n += total[u * num_stages + s];
    if (n == 0) return;
    auto sends = std::make_shared<std::vector<Transfer>>(n);
    size_t at = 0;
    for (int32_t s = 0; s < num_stages; ++s) {
      const uint32_t k = total[u * num_stages + s];
      out[u].stages[s].sends = TransferList::View(sends, at, k);
      sends_of[u * num_stages + s] = sends->data() + at;
      at += k;
    }
    out[u].send_pool = std::move(sends);
  });
  ForEachIndex(pool, C, [&](int64_t c) {
    for (int32_t v = chunk_begin(c); v < chunk_begin(c + 1); ++v) {
      for (int32_t s = 0; s < num_stages; ++s) {
        for (const Transfer& r : out[v].stages[s].recvs) {
          const int64_t cell = int64_t{r.peer} * num_stages + s;
          Transfer& t = sends_of[cell][slot[c][cell]++];
          t.peer = v;
          t.payload = Payload::kKv;
          t.space = RowSpace::kHome;
          t.bytes = r.bytes;
          // The sender's rows of the same arrivals, at the same pool indices.
          t.segments =
              SharedList<Segment>::View(send_pools[v], r.segments.offset(), r.segments.size());
        }
      }
    }
  });

  // Work items. Emitted per demand into scratch (reused across virtual
  // ranks on a thread) with their list (stage, overlap or not), then laid
  // out list by list in one pool per virtual rank, emission order kept
  // within a list; each stage's lists are views of it.
  ForEachIndex(pool, V, [&](int64_t v) {
    const std::vector<Arrival>& by_global = arrivals[v];
    thread_local std::vector<WorkItem> emitted;
    thread_local std::vector<uint32_t> list_of;
    emitted.clear();
    list_of.clear();
    int64_t area = 0;
    std::vector<std::array<int64_t, 2>>& stage_area = out[v].stage_area;
    stage_area.assign(built_stages, {0, 0});
    // Demands come by key start, so the last arrival starting at or before
    // a demand's first key only moves forward; within a demand, its pieces
    // ascend.
    const size_t num_arrivals = by_global.size();
    size_t base = 0;
    for (const Demand& d : demands[v]) {
      while (base + 1 < num_arrivals && by_global[base + 1].begin <= d.k_begin) ++base;
      size_t cur = base;
      const MaskSlice& s = slices[d.slice];
      // The demand's rows of the slice, once per demand.
      const MaskSlice rows_slice = SubSlice(s, d.q_begin, d.q_end, s.k_begin, s.k_end);
      auto emit = [&](int64_t x, int64_t y, RowSpace space, int64_t kv_row, int32_t stage) {
        const TokenRange rows = RowsSeeing(rows_slice, x, y);
        if (rows.empty()) return;
        const MaskSlice piece = SubSlice(s, rows.begin, rows.end, x, y);
        const int64_t a = SliceArea(piece);
        if (a == 0) return;
        area += a;
        // The list: home items overlap stage 0's transfers; items on a
        // received chunk run after its stage, or, pipelined, overlap the
        // next stage's.
        const bool home_list = space == RowSpace::kHome;
        const int32_t list_stage = !home_list && pipelined ? stage + 1 : stage;
        const int list = home_list || pipelined ? 0 : 1;
        stage_area[list_stage][list] += a;
        WorkItem w;
        w.q_row = d.q_row + (rows.begin - d.q_begin);
        w.num_q = rows.size();
        w.kv_space = space;
        w.kv_row = kv_row;
        w.num_k = y - x;
        w.type = piece.type;
        w.offset = piece.type == MaskType::kCausal ? piece.offset : 0;
        w.window = piece.type == MaskType::kCausal ? piece.window : -1;
        emitted.push_back(w);
        list_of.push_back(static_cast<uint32_t>(list_stage) * 2 + list);
      };
      ForEachOwnerPiece(owners, d.k_begin, d.k_end,
                        [&](const OwnerSegment& o, int64_t a, int64_t b) {
                          if (o.rank == v) {
                            emit(a, b, RowSpace::kHome, o.local_row + (a - o.begin), 0);
                            return;
                          }
                          while (cur + 1 < num_arrivals && by_global[cur + 1].begin <= a) ++cur;
                          while (a < b) {
                            HSAP_CHECK(cur < num_arrivals && by_global[cur].begin <= a &&
                                       a < by_global[cur].end)
                                << "key " << a << " never arrives";
                            const Arrival& r = by_global[cur];
                            const int64_t e = std::min(b, r.end);
                            emit(a, e, RowSpace::kRecv, r.recv_row + (a - r.begin), r.stage);
                            a = e;
                            if (a < b) ++cur;
                          }
                        });
    }
    out[v].area = area;
    if (emitted.empty()) return;
    const size_t lists = static_cast<size_t>(built_stages) * 2;
    std::vector<uint32_t> first(lists + 1, 0);
    for (uint32_t l : list_of) ++first[l + 1];
    for (size_t l = 0; l < lists; ++l) first[l + 1] += first[l];
    std::vector<uint32_t> order(emitted.size());
    {
      std::vector<uint32_t> next(first.begin(), first.end() - 1);
      for (size_t i = 0; i < emitted.size(); ++i) order[next[list_of[i]]++] = static_cast<uint32_t>(i);
    }
    auto items = std::make_shared<std::vector<WorkItem>>();
    items->reserve(emitted.size());
    for (uint32_t i : order) items->push_back(emitted[i]);
    for (int32_t st = 0; st < built_stages; ++st) {
      Stage& stage = out[v].stages[st];
      const size_t o = static_cast<size_t>(st) * 2;
      stage.overlap_items = SharedList<WorkItem>::View(items, first[o], first[o + 1] - first[o]);
      stage.items = SharedList<WorkItem>::View(items, first[o + 1], first[o + 2] - first[o + 1]);
    }
    // The scratch outlives the compilation (pool threads live on): a large
    // one (one virtual rank holds every item under ulysses) is released.
    if (emitted.capacity() > kKeptScratchItems) {
      std::vector<WorkItem>().swap(emitted);
      std::vector<uint32_t>().swap(list_of);
    }
  });
  return out;
}

absl::StatusOr<std::vector<InnerRank>> BuildInnerLevel(
    const SliceIndex& index, const std::vector<std::vector<OwnerSegment>>& home,
    const std::vector<OwnerSegment>& owners, InnerKind kind, int64_t budget_rows,
    ThreadPool* pool, int32_t pipeline_stages) {
  HSAP_ASSIGN_OR_RETURN(InnerPacking packing, PackInnerLevel(index, home, owners, kind,
                                                             budget_rows, pool, pipeline_stages));
  return BuildInnerLevel(index, owners, std::move(packing), pool);
}

}  // namespace hsap::plan::internal
