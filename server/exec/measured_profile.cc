#include "server/exec/measured_profile.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "kernels/attention_params.h"

namespace hsap::exec {
namespace {

using plan::RoundToThreeDigits;

// Tokens of the measurement's one head: about 32 MFLOP per forward
// (2 * D * n^2), under a millisecond on a core. The measurement runs on a
// call's path, so it stays small (its deadline ends it, but then the call
// fails): a 256 MFLOP version (8x the work) held first calls 13-25 s under
// AddressSanitizer, past their deadlines.
int64_t MeasureTokens(int32_t head_dim) {
  const double n = std::sqrt(16e6 / std::max(1, head_dim));
  return std::clamp<int64_t>(static_cast<int64_t>(n / 64) * 64, 64, 2048);
}

struct SlotTimes {
  absl::Status status;
  double fwd_s = 0, bwd_s = 0;  // means over the timed window
};

// `items` causal items of n keys, each in buffers of its own, of `heads`
// heads interleaved in each row (row stride heads * D, as a rank's buffers
// hold them), their last `num_q` rows as queries, on `backend`; Forward()
// and Backward() run all items in one call and return its seconds.
class ItemRun {
 public:
  ItemRun(ComputeBackend* backend, DType dtype, int32_t head_dim, int heads, int items, int64_t n,
          int64_t num_q, const StopCheck* stop)
      : backend_(backend), stop_(stop) {
    const int64_t item_elems = n * heads * head_dim, item_lse = n * heads;
    const int64_t elems = item_elems * items;
    lse_elems_ = item_lse * items;
    const int64_t elem = DTypeSize(dtype);
    char* q = Alloc(elems * elem);
    char* k = Alloc(elems * elem);
    char* v = Alloc(elems * elem);
    char* dout = Alloc(elems * elem);
    auto* o = reinterpret_cast<float*>(Alloc(elems * 4));
    lse_ = reinterpret_cast<float*>(Alloc(lse_elems_ * 4));
    auto* delta = reinterpret_cast<float*>(Alloc(lse_elems_ * 4));
    auto* dq = reinterpret_cast<float*>(Alloc(elems * 4));
    auto* dk = reinterpret_cast<float*>(Alloc(elems * 4));
    auto* dv = reinterpret_cast<float*>(Alloc(elems * 4));
    if (!status_.ok()) return;
    // Finite inputs: fresh memory may hold anything, and an item with a
    // non-finite or huge input runs on the kernels' exact float64 tiles (the
    // first version left them unset and read backward/forward between 3.3
    // and 10.7 from run to run). Delta = 0 stands in for rowsum(dO * O).
    status_.Update(backend->Fill(dk, elems, 0.25f));
    for (char* t : {q, k, v, dout}) status_.Update(backend->CastFromFloat(dk, elems, dtype, t));
    status_.Update(backend->Fill(delta, lse_elems_, 0.f));
    for (float* acc : {o, dq, dk, dv}) status_.Update(backend->Fill(acc, elems, 0.f));
    shape_.num_heads_q = heads;
    shape_.num_heads_kv = heads;
    shape_.head_dim = head_dim;
    shape_.dtype = dtype;
    shape_.softmax_scale = 1.f / std::sqrt(static_cast<float>(head_dim));
    fwd_.resize(items);
    bwd_.resize(items);
    for (int i = 0; i < items; ++i) {
      const int64_t e = i * item_elems * elem, e4 = i * item_elems, l = i * item_lse;
      kernels::FwdWorkItem& f = fwd_[i];
      f.q = q + e;
      f.k = k + e;
      f.v = v + e;
      f.num_q = num_q;
      f.num_k = n;
      f.type = MaskType::kCausal;
      f.offset = n - num_q;
      f.o_acc = o + e4;
      f.lse_acc = lse_ + l;
      f.lse_stride = num_q;
      kernels::BwdWorkItem& b = bwd_[i];
      b.q = f.q;
      b.k = f.k;
      b.v = f.v;
      b.dout = dout + e;
      b.lse = lse_ + l;
      b.delta = delta + l;
      b.lse_stride = num_q;
      b.num_q = num_q;
      b.num_k = n;
      b.type = MaskType::kCausal;
      b.offset = n - num_q;
      b.dq_acc = dq + e4;
      b.dk_acc = dk + e4;
      b.dv_acc = dv + e4;
    }
  }

  const absl::Status& status() const { return status_; }

  absl::StatusOr<double> Forward() {
    HSAP_RETURN_IF_ERROR(status_);
    HSAP_RETURN_IF_ERROR(
        backend_->Fill(lse_, lse_elems_, -std::numeric_limits<float>::infinity()));
    const absl::Time t0 = absl::Now();
    HSAP_RETURN_IF_ERROR(backend_->Forward(shape_, fwd_, stop_));
    HSAP_RETURN_IF_ERROR(backend_->Synchronize());
    return absl::ToDoubleSeconds(absl::Now() - t0);
  }
  absl::StatusOr<double> Backward() {
    HSAP_RETURN_IF_ERROR(status_);
    const absl::Time t0 = absl::Now();
    HSAP_RETURN_IF_ERROR(backend_->Backward(shape_, bwd_, stop_));
    HSAP_RETURN_IF_ERROR(backend_->Synchronize());
    return absl::ToDoubleSeconds(absl::Now() - t0);
  }

 private:
  char* Alloc(int64_t bytes) {
    if (!status_.ok()) return nullptr;
    auto b = backend_->Allocate(bytes);
    if (!b.ok()) {
      status_ = b.status();
      return nullptr;
    }
    bufs_.push_back(std::move(b).value());
    return bufs_.back().data();
  }

  ComputeBackend* const backend_;
  const StopCheck* const stop_;  // may be null
  absl::Status status_;
  std::vector<BackendBuffer> bufs_;
  kernels::AttentionShape shape_;
  std::vector<kernels::FwdWorkItem> fwd_;
  std::vector<kernels::BwdWorkItem> bwd_;
  float* lse_ = nullptr;
  int64_t lse_elems_ = 0;
};

// What one slot measures: the rate run (one head of n tokens; one warm-up
// each, then forward-backward pairs over a kRateWindowS window, the means),
// and the interleave pair — kInterleavedHeads heads, the last n/8 rows
// against all n keys, as separate one-head items (each its own buffers)
// and interleaved in one item's rows, the same work and memory:
// kInterleaveRounds rounds of one forward of each (the rate run warmed the
// code, the fills touched the memory), the ratio of a round's two times,
// the mean over rounds (alternating, so a slow spell hits both). About
// 0.6 GFLOP in all at D 64.
constexpr double kRateWindowS = 0.04;
constexpr size_t kMaxRateRuns = 64;
constexpr int kInterleavedHeads = 8;
constexpr int kInterleaveRounds = 2;
struct SlotRuns {
  SlotTimes rate;
  absl::Status interleave_status;
  double interleave_ratio = 1;  // rate interleaved / rate separate
};

SlotRuns TimeSlot(ComputeBackend* backend, DType dtype, int32_t head_dim, int64_t n,
                  const StopCheck* stop) {
  SlotRuns r;
  auto run = [](const absl::StatusOr<double>& t, std::vector<double>* times, absl::Status* st) {
    if (!t.ok()) {
      st->Update(t.status());
    } else if (times != nullptr) {
      times->push_back(*t);
    }
  };
  {
    ItemRun rate(backend, dtype, head_dim, 1, 1, n, n, stop);
    // One warm-up of each, then forward-backward pairs until kRateWindowS
    // of both together have passed (at least 2 pairs, at most
    // kMaxRateRuns), the means: a window longer than the scheduler's
    // slices, so slots sharing cores read the share they get, where the
    // median of single sub-millisecond runs read whichever run had a core
    // to itself (cluster_bench's two daemons measuring at once read
    // backward / forward 8.35 that way; alone 2.1-3.3). The pairs
    // alternate so that a slow spell falls on both directions alike: a
    // forward window followed by a backward one read backward / forward
    // 0.51 when other processes left the second window less of the cores
    // (CI, four tests at once on two cores).
    auto timed = [&](auto&& one) {
      absl::StatusOr<double> t = one();
      if (!t.ok()) r.rate.status.Update(t.status());
      return t.ok() ? *t : 0.0;
    };
    timed([&] { return rate.Forward(); });
    timed([&] { return rate.Backward(); });
    double fwd_sum = 0, bwd_sum = 0;
    size_t pairs = 0;
    while (r.rate.status.ok() && pairs < kMaxRateRuns &&
           (pairs < 2 || fwd_sum + bwd_sum < kRateWindowS)) {
      const double f = timed([&] { return rate.Forward(); });
      const double b = timed([&] { return rate.Backward(); });
      fwd_sum += f;
      bwd_sum += b;
      ++pairs;
    }
    if (!r.rate.status.ok()) return r;
    r.rate.fwd_s = fwd_sum / static_cast<double>(pairs);
    r.rate.bwd_s = bwd_sum / static_cast<double>(pairs);
  }
  const int64_t rows = std::min<int64_t>(n, std::max<int64_t>(64, n / 8));
  ItemRun separate(backend, dtype, head_dim, 1, kInterleavedHeads, n, rows, stop);
  ItemRun interleaved(backend, dtype, head_dim, kInterleavedHeads, 1, n, rows, stop);
  std::vector<double> a, b;
  absl::Status& st = r.interleave_status;
  for (int i = 0; i < kInterleaveRounds && st.ok(); ++i) {
    run(separate.Forward(), &a, &st);
    run(interleaved.Forward(), &b, &st);
  }
  if (!st.ok()) return r;
  double sum = 0;
  for (size_t i = 0; i < a.size(); ++i) sum += std::max(a[i], 1e-9) / std::max(b[i], 1e-9);
  r.interleave_ratio = sum / static_cast<double>(a.size());
  return r;
}

}  // namespace

plan::HardwareProfile MeasuredHardwareProfile(const ComputeRate& rate, const IntraTier& intra,
                                              double inter_bytes_per_s, double inter_latency_s) {
  plan::HardwareProfile p;
  p.attention_flops = rate.forward_flops;
  p.backward_factor = rate.backward_factor;
  p.kv_interleave_factor = rate.kv_interleave_factor;
  p.intra_bytes_per_s = intra.bytes_per_s;
  p.intra_latency_s = intra.latency_s;
  p.inter_bytes_per_s = inter_bytes_per_s;
  p.inter_latency_s = inter_latency_s;
  return p;
}

absl::StatusOr<ComputeRate> MeasuredProfiles::Compute(DType dtype, int32_t head_dim,
                                                      const StopCheck* stop) {
  const std::pair<int, int32_t> key{static_cast<int>(dtype), head_dim};
  auto nearest = [&]() -> const ComputeRate* {
    mu_.AssertHeld();
    auto it = rates_.find(key);
    if (it != rates_.end()) return &it->second;
    int count = 0;
    const ComputeRate* best = nullptr;
    for (const auto& [k, r] : rates_) {
      if (k.first != key.first) continue;
      ++count;
      if (best == nullptr || std::abs(k.second - head_dim) < std::abs(best->head_dim - head_dim)) {
        best = &r;
      }
    }
    return count >= kMaxEntries ? best : nullptr;
  };
  {
    absl::MutexLock lock(&mu_);
    // Another caller's measurement: wait for it in slices, so that this
    // caller's deadline or cancellation ends the wait.
    const absl::Condition idle(
        +[](bool* computing) { return !*computing; }, &computing_);
    while (true) {
      if (const ComputeRate* r = nearest()) return *r;  // measured while we waited
      if (!computing_) break;
      if (stop != nullptr) {
        if (absl::Status s = stop->Check(); !s.ok()) return s;
      }
      mu_.AwaitWithTimeout(idle, absl::Milliseconds(10));
    }
    computing_ = true;
  }
  absl::StatusOr<ComputeRate> rate;
  {
    absl::MutexLock measuring(&measure_mu_);  // Intra() is short
    rate = Measure(dtype, head_dim, stop);
  }
  absl::MutexLock lock(&mu_);
  computing_ = false;
  if (rate.ok()) rates_[key] = *rate;  // not kept when it failed or was stopped
  return rate;
}

absl::StatusOr<ComputeRate> MeasuredProfiles::Measure(DType dtype, int32_t head_dim,
                                                      const StopCheck* stop) {
  const int64_t n = MeasureTokens(head_dim);
  const int slots = slots_->size();
  std::vector<SlotRuns> times(slots);
  {
    std::vector<DeviceSlots::Lease> leases;
    for (int s = 0; s < slots; ++s) leases.push_back(slots_->Acquire(s, slots));
    absl::Notification go;
    std::vector<std::thread> threads;
    for (int s = 0; s < slots; ++s) {
      threads.emplace_back([&, s] {
        go.WaitForNotification();
        times[s] = TimeSlot(leases[s].backend(), dtype, head_dim, n, stop);
      });
    }
    go.Notify();
    for (std::thread& t : threads) t.join();
  }
  const double flops = 4.0 * head_dim * (static_cast<double>(n) * (n + 1) / 2);
  double rate_sum = 0, factor_sum = 0, interleave_sum = 0;
  int interleave_slots = 0;
  for (const SlotRuns& t : times) {
    HSAP_RETURN_IF_ERROR(t.rate.status);
    const double fwd = std::max(t.rate.fwd_s, 1e-9);
    rate_sum += flops / fwd;
    factor_sum += std::max(t.rate.bwd_s, 1e-9) / fwd;
    // The rate of eight interleaved heads over eight separate ones, the
    // same work; a factor per doubling (8 = 2^3). A slot whose budget had
    // no room for the pair (RESOURCE_EXHAUSTED) does not count.
    if (t.interleave_status.ok()) {
      interleave_sum += std::cbrt(std::clamp(t.interleave_ratio, 0.125, 1.0));
      ++interleave_slots;
    } else if (!absl::IsResourceExhausted(t.interleave_status)) {
      return t.interleave_status;
    }
  }
  ComputeRate rate;
  rate.dtype = dtype;
  rate.head_dim = head_dim;
  // Inside the profile parser's ranges (flops in [1, 1e21], factor in
  // (0, 100], interleave in [0.5, 1]).
  rate.forward_flops = std::clamp(RoundToThreeDigits(rate_sum / slots), 1.0, 1e21);
  rate.backward_factor = std::clamp(RoundToThreeDigits(factor_sum / slots), 0.01, 100.0);
  rate.kv_interleave_factor =
      interleave_slots == 0
          ? 1.0
          : std::clamp(RoundToThreeDigits(interleave_sum / interleave_slots), 0.5, 1.0);
  return rate;
}

IntraTier MeasuredProfiles::Intra() {
  {
    absl::MutexLock lock(&mu_);
    if (intra_done_) return intra_;
  }
  absl::MutexLock measuring(&measure_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (intra_done_) return intra_;
  }
  // Bandwidth: an 8 MiB copy, best of five (the first touches the pages).
  constexpr size_t kBytes = size_t{8} << 20;
  std::vector<char> src(kBytes, 1), dst(kBytes, 0);
  double best = std::numeric_limits<double>::infinity();
  for (int i = 0; i < 6; ++i) {
    const absl::Time t0 = absl::Now();
    std::memcpy(dst.data(), src.data(), kBytes);
    const double s = absl::ToDoubleSeconds(absl::Now() - t0);
    if (i > 0) best = std::min(best, s);
  }
  // Latency: 200 round trips to another thread through a mutex and its
  // condition, the way ranks on one node hand each other buffers.
  absl::Mutex mu;
  int turn = 0;  // even: ours; odd: the other thread's
  constexpr int kTrips = 200;
  std::vector<double> trips;
  std::thread other([&] {
    for (int i = 0; i < kTrips; ++i) {
      absl::MutexLock lock(&mu);
      mu.Await(absl::Condition(+[](int* t) { return *t % 2 == 1; }, &turn));
      ++turn;
    }
  });
  for (int i = 0; i < kTrips; ++i) {
    const absl::Time t0 = absl::Now();
    absl::MutexLock lock(&mu);
    ++turn;
    mu.Await(absl::Condition(+[](int* t) { return *t % 2 == 0; }, &turn));
    trips.push_back(absl::ToDoubleSeconds(absl::Now() - t0));
  }
  other.join();
  std::nth_element(trips.begin(), trips.begin() + kTrips / 2, trips.end());
  IntraTier t;
  t.bytes_per_s = std::clamp(RoundToThreeDigits(kBytes / std::max(best, 1e-9)), 1.0, 1e15);
  t.latency_s = std::clamp(RoundToThreeDigits(trips[kTrips / 2] / 2), 0.0, 1e3);
  absl::MutexLock lock(&mu_);
  intra_ = t;
  intra_done_ = true;
  return t;
}

absl::StatusOr<std::string> MeasuredProfiles::LocalProfile(DType dtype, int32_t head_dim,
                                                           const StopCheck* stop) {
  HSAP_ASSIGN_OR_RETURN(ComputeRate rate, Compute(dtype, head_dim, stop));
  const IntraTier intra = Intra();
  return plan::CustomProfileString(
      MeasuredHardwareProfile(rate, intra, intra.bytes_per_s, intra.latency_s));
}

std::vector<ComputeRate> MeasuredProfiles::Measured() const {
  absl::MutexLock lock(&mu_);
  std::vector<ComputeRate> out;
  for (const auto& [key, rate] : rates_) out.push_back(rate);
  return out;
}

bool MeasuredProfiles::intra_measured() const {
  absl::MutexLock lock(&mu_);
  return intra_done_;
}

IntraTier MeasuredProfiles::intra_if_measured() const {
  absl::MutexLock lock(&mu_);
  return intra_;
}

}  // namespace hsap::exec
