#include "tests/numerics/group_harness.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>

#include "absl/time/clock.h"
#include "kernels/cpu/reference.h"
#include "server/exec/executor.h"
#include "server/transport/inprocess_transport.h"

namespace hsap::testing {
namespace {

std::vector<int64_t> RowsOf(const plan::Plan& plan, int32_t r) {
  std::vector<int64_t> rows;
  for (const plan::TokenRange& t : plan.dispatch.ranges[r]) {
    for (int64_t x = t.begin; x < t.end; ++x) rows.push_back(x);
  }
  return rows;
}

// Rows `rows` of a [T, width] tensor of `es`-byte elements.
std::vector<char> GatherRows(const std::vector<char>& global, const std::vector<int64_t>& rows,
                             int64_t row_bytes) {
  std::vector<char> out(rows.size() * row_bytes);
  for (size_t i = 0; i < rows.size(); ++i) {
    std::memcpy(out.data() + i * row_bytes, global.data() + rows[i] * row_bytes, row_bytes);
  }
  return out;
}

std::vector<double> Widen(const std::vector<char>& storage, DType dtype) {
  const int64_t n = static_cast<int64_t>(storage.size()) / DTypeSize(dtype);
  std::vector<double> out(n);
  for (int64_t i = 0; i < n; ++i) out[i] = LoadAsFloat(storage.data(), dtype, i);
  return out;
}

kernels::cpu::AttentionShape CpuShape(const kernels::AttentionShape& s) { return s; }

}  // namespace

GroupProblem RandomProblem(std::mt19937_64& rng, int64_t T, int64_t max_doc, int hq, int hkv,
                           int d, DType dtype) {
  GroupProblem p;
  p.spec.cu_seqlens = {0};
  while (p.spec.cu_seqlens.back() < T) {
    const int64_t len = std::min<int64_t>(T - p.spec.cu_seqlens.back(), 1 + rng() % max_doc);
    p.spec.cu_seqlens.push_back(p.spec.cu_seqlens.back() + len);
  }
  p.spec.total_tokens = T;
  p.spec.shape = {hq, hkv, d, dtype};
  p.shape = {hq, hkv, d, dtype, 1.f / std::sqrt(static_cast<float>(d))};
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  auto fill = [&](int64_t n, std::vector<char>* out) {
    out->assign(n * DTypeSize(dtype), 0);
    for (int64_t i = 0; i < n; ++i) StoreFromFloat(out->data(), dtype, i, u(rng));
  };
  fill(T * hq * d, &p.q);
  fill(T * hkv * d, &p.k);
  fill(T * hkv * d, &p.v);
  fill(T * hq * d, &p.d_o);
  return p;
}

GroupOutputs RunGroup(const plan::Plan& plan, const GroupProblem& pr,
                      const BackendFactory& backends, const std::vector<int32_t>& arrival_order) {
  const int32_t P = plan.spec.topology.num_ranks();
  const int64_t T = pr.spec.total_tokens;
  const int Hq = pr.shape.num_heads_q, Hkv = pr.shape.num_heads_kv, D = pr.shape.head_dim;
  const int64_t es = DTypeSize(pr.shape.dtype);
  GroupOutputs out;
  auto fabric = transport::InProcessFabric::Create(P, plan.spec.topology.devices_per_node);
  if (!fabric.ok()) {
    out.status = fabric.status();
    return out;
  }
  struct Local {
    std::vector<int64_t> rows;
    std::vector<char> q, k, v, o, d_o, dq, dk, dv;
    std::vector<float> lse;
  };
  std::vector<Local> loc(P);
  for (int32_t r = 0; r < P; ++r) {
    Local& l = loc[r];
    l.rows = RowsOf(plan, r);
    const int64_t n = l.rows.size();
    l.q = GatherRows(pr.q, l.rows, Hq * D * es);
    l.k = GatherRows(pr.k, l.rows, Hkv * D * es);
    l.v = GatherRows(pr.v, l.rows, Hkv * D * es);
    l.d_o = GatherRows(pr.d_o, l.rows, Hq * D * es);
    l.o.assign(n * Hq * D * es, 0x7f);  // poison: every output must be written
    l.dq.assign(n * Hq * D * es, 0x7f);
    l.dk.assign(n * Hkv * D * es, 0x7f);
    l.dv.assign(n * Hkv * D * es, 0x7f);
    l.lse.assign(n * Hq, std::nanf(""));
  }
  std::vector<absl::Status> status(P);
  std::vector<int32_t> order = arrival_order;
  if (order.empty()) {
    for (int32_t r = 0; r < P; ++r) order.push_back(r);
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(300);
  std::vector<std::thread> threads;
  for (int32_t r : order) {
    threads.emplace_back([&, r] {
      Local& l = loc[r];
      std::unique_ptr<exec::ComputeBackend> backend = backends(r);
      exec::RankBuffers b{l.q.data(),   l.k.data(),  l.v.data(),  l.o.data(), l.lse.data(),
                          l.d_o.data(), l.dq.data(), l.dk.data(), l.dv.data()};
      transport::Transport* t = (*fabric)->endpoint(r);
      status[r] = exec::RunForward(plan, r, pr.shape, b, t, backend.get(), deadline, 1, nullptr);
      if (!status[r].ok()) {
        (*fabric)->AbortAll(status[r]);
        return;
      }
      status[r] = exec::RunBackward(plan, r, pr.shape, b, t, backend.get(), deadline, 1, nullptr);
      if (!status[r].ok()) (*fabric)->AbortAll(status[r]);
    });
  }
  for (auto& th : threads) th.join();
  for (const absl::Status& s : status) {
    if (!s.ok() && out.status.ok()) out.status = s;
  }
  out.o_storage.assign(T * Hq * D * es, 0);
  std::vector<char> dq(T * Hq * D * es), dk(T * Hkv * D * es), dv(T * Hkv * D * es);
  out.lse.assign(Hq * T, 0);
  for (int32_t r = 0; r < P; ++r) {
    const Local& l = loc[r];
    const int64_t n = l.rows.size();
    for (int64_t i = 0; i < n; ++i) {
      const int64_t g = l.rows[i];
      std::memcpy(&out.o_storage[g * Hq * D * es], &l.o[i * Hq * D * es], Hq * D * es);
      std::memcpy(&dq[g * Hq * D * es], &l.dq[i * Hq * D * es], Hq * D * es);
      std::memcpy(&dk[g * Hkv * D * es], &l.dk[i * Hkv * D * es], Hkv * D * es);
      std::memcpy(&dv[g * Hkv * D * es], &l.dv[i * Hkv * D * es], Hkv * D * es);
      for (int h = 0; h < Hq; ++h) out.lse[h * T + g] = l.lse[h * n + i];
    }
  }
  out.o = Widen(out.o_storage, pr.shape.dtype);
  out.dq = Widen(dq, pr.shape.dtype);
  out.dk = Widen(dk, pr.shape.dtype);
  out.dv = Widen(dv, pr.shape.dtype);
  return out;
}

GroupOutputs Reference(const GroupProblem& pr, const std::vector<char>& o_storage) {
  GroupOutputs ref;
  const std::vector<MaskSlice> slices = plan::ResolveSlices(pr.spec);
  const int64_t T = pr.spec.total_tokens;
  const kernels::cpu::AttentionShape s = CpuShape(pr.shape);
  kernels::cpu::ReferenceForward(s, pr.q.data(), pr.k.data(), pr.v.data(), T, T, slices, &ref.o,
                                 &ref.lse);
  if (o_storage.empty()) {
    kernels::cpu::ReferenceBackward(s, pr.q.data(), pr.k.data(), pr.v.data(), pr.d_o.data(), T, T,
                                    slices, &ref.dq, &ref.dk, &ref.dv);
  } else {
    kernels::cpu::ReferenceBackwardFromOutput(s, pr.q.data(), pr.k.data(), pr.v.data(),
                                              o_storage.data(), pr.d_o.data(), T, T, slices,
                                              &ref.dq, &ref.dk, &ref.dv);
  }
  return ref;
}

double RelativeError(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return std::numeric_limits<double>::infinity();
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(b[i])) {
      if (!std::isnan(a[i])) return std::numeric_limits<double>::infinity();
      continue;
    }
    if (std::isnan(a[i])) return std::numeric_limits<double>::infinity();
    if (std::isinf(b[i]) || std::isinf(a[i])) {
      if (a[i] != b[i]) return std::numeric_limits<double>::infinity();
      continue;
    }
    diff = std::max(diff, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return scale > 0 ? diff / scale : diff;
}

double RoundingError(const std::vector<double>& ref, DType dtype) {
  std::vector<double> rounded(ref.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    rounded[i] = std::isfinite(ref[i]) ? RoundThrough(dtype, static_cast<float>(ref[i])) : ref[i];
  }
  return std::max(RelativeError(rounded, ref), 1e-7);
}

}  // namespace hsap::testing
