#include "server/exec/measured_profile.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "kernels/attention_params.h"

namespace hsap::exec {
namespace {

using plan::RoundToThreeDigits;

// Tokens of the measurement's one head: about 256 MFLOP per forward
// (2 * D * n^2), some milliseconds on a core — long enough that the kernel
// runs at the rate of a real call's items (at 32 MFLOP the rate read 30 %
// low and backward/forward ranged 2.4-10.7 between runs on one machine).
int64_t MeasureTokens(int32_t head_dim) {
  const double n = std::sqrt(128e6 / std::max(1, head_dim));
  return std::clamp<int64_t>(static_cast<int64_t>(n / 64) * 64, 64, 4096);
}

double MedianOf(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct SlotTimes {
  absl::Status status;
  double fwd_s = 0, bwd_s = 0;  // medians of the timed runs
};

// Forward six times and backward four times on `backend`; the first of
// each is a warm-up, the median of the others counts.
SlotTimes TimeSlot(ComputeBackend* backend, DType dtype, int32_t head_dim, int64_t n) {
  SlotTimes out;
  const int64_t elems = n * head_dim;
  const int64_t in_bytes = elems * DTypeSize(dtype);
  std::vector<BackendBuffer> bufs;
  auto alloc = [&](int64_t bytes) -> char* {
    if (!out.status.ok()) return nullptr;
    auto b = backend->Allocate(bytes);
    if (!b.ok()) {
      out.status = b.status();
      return nullptr;
    }
    bufs.push_back(std::move(b).value());
    return bufs.back().data();
  };
  char* q = alloc(in_bytes);
  char* k = alloc(in_bytes);
  char* v = alloc(in_bytes);
  char* dout = alloc(in_bytes);
  auto* o = reinterpret_cast<float*>(alloc(elems * 4));
  auto* lse = reinterpret_cast<float*>(alloc(n * 4));
  auto* delta = reinterpret_cast<float*>(alloc(n * 4));
  auto* dq = reinterpret_cast<float*>(alloc(elems * 4));
  auto* dk = reinterpret_cast<float*>(alloc(elems * 4));
  auto* dv = reinterpret_cast<float*>(alloc(elems * 4));
  if (!out.status.ok()) return out;
  // Finite inputs: fresh memory may hold anything, and an item with a
  // non-finite or huge input runs on the kernels' exact float64 tiles (the
  // first version left them unset and read backward/forward between 3.3
  // and 10.7 from run to run). Delta = 0 stands in for rowsum(dO * O).
  for (char* t : {q, k, v, dout}) {
    out.status.Update(backend->Fill(dq, elems, 0.25f));
    out.status.Update(backend->CastFromFloat(dq, elems, dtype, t));
  }
  out.status.Update(backend->Fill(delta, n, 0.f));
  for (float* acc : {o, dq, dk, dv}) out.status.Update(backend->Fill(acc, elems, 0.f));
  if (!out.status.ok()) return out;
  kernels::AttentionShape shape;
  shape.num_heads_q = 1;
  shape.num_heads_kv = 1;
  shape.head_dim = head_dim;
  shape.dtype = dtype;
  shape.softmax_scale = 1.f / std::sqrt(static_cast<float>(head_dim));
  kernels::FwdWorkItem f;
  f.q = q;
  f.k = k;
  f.v = v;
  f.num_q = n;
  f.num_k = n;
  f.type = MaskType::kCausal;
  f.o_acc = o;
  f.lse_acc = lse;
  f.lse_stride = n;
  kernels::BwdWorkItem b;
  b.q = q;
  b.k = k;
  b.v = v;
  b.dout = dout;
  b.lse = lse;
  b.delta = delta;
  b.lse_stride = n;
  b.num_q = n;
  b.num_k = n;
  b.type = MaskType::kCausal;
  b.dq_acc = dq;
  b.dk_acc = dk;
  b.dv_acc = dv;
  std::vector<double> fwd_times, bwd_times;
  for (int i = 0; i < 6 && out.status.ok(); ++i) {
    out.status = backend->Fill(lse, n, -std::numeric_limits<float>::infinity());
    if (!out.status.ok()) break;
    const absl::Time t0 = absl::Now();
    out.status = backend->Forward(shape, {&f, 1});
    if (out.status.ok()) out.status = backend->Synchronize();
    if (i > 0) fwd_times.push_back(absl::ToDoubleSeconds(absl::Now() - t0));
  }
  for (int i = 0; i < 4 && out.status.ok(); ++i) {
    const absl::Time t0 = absl::Now();
    out.status = backend->Backward(shape, {&b, 1});
    if (out.status.ok()) out.status = backend->Synchronize();
    if (i > 0) bwd_times.push_back(absl::ToDoubleSeconds(absl::Now() - t0));
  }
  if (out.status.ok()) {
    out.fwd_s = MedianOf(fwd_times);
    out.bwd_s = MedianOf(bwd_times);
  }
  return out;
}

}  // namespace

plan::HardwareProfile MeasuredHardwareProfile(const ComputeRate& rate, const IntraTier& intra,
                                              double inter_bytes_per_s, double inter_latency_s) {
  plan::HardwareProfile p;
  p.attention_flops = rate.forward_flops;
  p.backward_factor = rate.backward_factor;
  p.intra_bytes_per_s = intra.bytes_per_s;
  p.intra_latency_s = intra.latency_s;
  p.inter_bytes_per_s = inter_bytes_per_s;
  p.inter_latency_s = inter_latency_s;
  return p;
}

absl::StatusOr<ComputeRate> MeasuredProfiles::Compute(DType dtype, int32_t head_dim) {
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
    if (const ComputeRate* r = nearest()) return *r;
  }
  absl::MutexLock measuring(&measure_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (const ComputeRate* r = nearest()) return *r;  // measured while we waited
  }
  HSAP_ASSIGN_OR_RETURN(ComputeRate rate, Measure(dtype, head_dim));
  absl::MutexLock lock(&mu_);
  rates_[key] = rate;
  return rate;
}

absl::StatusOr<ComputeRate> MeasuredProfiles::Measure(DType dtype, int32_t head_dim) {
  const int64_t n = MeasureTokens(head_dim);
  const int slots = slots_->size();
  std::vector<SlotTimes> times(slots);
  {
    std::vector<DeviceSlots::Lease> leases;
    for (int s = 0; s < slots; ++s) leases.push_back(slots_->Acquire(s, slots));
    absl::Notification go;
    std::vector<std::thread> threads;
    for (int s = 0; s < slots; ++s) {
      threads.emplace_back([&, s] {
        go.WaitForNotification();
        times[s] = TimeSlot(leases[s].backend(), dtype, head_dim, n);
      });
    }
    go.Notify();
    for (std::thread& t : threads) t.join();
  }
  const double flops = 4.0 * head_dim * (static_cast<double>(n) * (n + 1) / 2);
  double rate_sum = 0, factor_sum = 0;
  for (const SlotTimes& t : times) {
    HSAP_RETURN_IF_ERROR(t.status);
    const double fwd = std::max(t.fwd_s, 1e-9);
    rate_sum += flops / fwd;
    factor_sum += std::max(t.bwd_s, 1e-9) / fwd;
  }
  ComputeRate rate;
  rate.dtype = dtype;
  rate.head_dim = head_dim;
  // Inside the profile parser's ranges (flops in [1, 1e21], factor in (0, 100]).
  rate.forward_flops = std::clamp(RoundToThreeDigits(rate_sum / slots), 1.0, 1e21);
  rate.backward_factor = std::clamp(RoundToThreeDigits(factor_sum / slots), 0.01, 100.0);
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

absl::StatusOr<std::string> MeasuredProfiles::LocalProfile(DType dtype, int32_t head_dim) {
  HSAP_ASSIGN_OR_RETURN(ComputeRate rate, Compute(dtype, head_dim));
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
