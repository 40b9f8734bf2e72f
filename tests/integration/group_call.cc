#include "tests/integration/group_call.h"

#include <cmath>
#include <future>
#include <random>

#include "absl/strings/str_cat.h"
#include "client/cpp/attention_buffers.h"
#include "client/cpp/hsap_client.h"
#include "common/mask.h"
#include "grpcpp/create_channel.h"
#include "hsap/v1/plans.grpc.pb.h"
#include "kernels/cpu/reference.h"

namespace hsap::testing {

double RelError(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return INFINITY;
  double diff = 0, ref = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] == b[i]) continue;
    const double d = std::fabs(a[i] - b[i]);
    if (!(d < INFINITY)) return INFINITY;
    diff = std::max(diff, d);
    ref = std::max(ref, std::fabs(b[i]));
  }
  return diff / (ref > 1e-12 ? ref : 1.0);
}

GlobalProblem MakeProblem(std::vector<int64_t> cu, bool causal, uint64_t seed,
                          bool with_reference, int64_t heads_q, int64_t heads_kv,
                          int64_t head_dim) {
  GlobalProblem p;
  p.heads_q = heads_q;
  p.heads_kv = heads_kv;
  p.head_dim = head_dim;
  p.cu_seqlens = std::move(cu);
  p.causal = causal;
  const int64_t t = p.tokens();
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uni(-1, 1);
  p.q.resize(t * p.heads_q * p.head_dim);
  p.d_o.resize(p.q.size());
  p.k.resize(t * p.heads_kv * p.head_dim);
  p.v.resize(p.k.size());
  for (auto* v : {&p.q, &p.k, &p.v, &p.d_o}) for (float& x : *v) x = uni(rng);
  kernels::cpu::AttentionShape shape{static_cast<int>(p.heads_q), static_cast<int>(p.heads_kv),
                                     static_cast<int>(p.head_dim), DType::kFloat32,
                                     1.0f / std::sqrt(static_cast<float>(p.head_dim))};
  if (!with_reference) return p;
  const auto slices = LowerDocuments(p.cu_seqlens, causal, -1);
  kernels::cpu::ReferenceForward(shape, p.q.data(), p.k.data(), p.v.data(), t, t, slices, &p.o,
                                 &p.lse);
  kernels::cpu::ReferenceBackward(shape, p.q.data(), p.k.data(), p.v.data(), p.d_o.data(), t, t,
                                  slices, &p.dq, &p.dk, &p.dv);
  return p;
}

absl::StatusOr<GroupResult> RunGroup(const GlobalProblem& p, const GroupSpec& spec) {
  const int32_t ranks = spec.nodes * spec.devices_per_node;
  const int64_t hq = p.heads_q, hkv = p.heads_kv, d = p.head_dim, total = p.tokens();
  // The layout, from node 0's planner.
  hsap::v1::PlanSpec plan_spec;
  for (int64_t x : p.cu_seqlens) plan_spec.add_cu_seqlens(x);
  plan_spec.set_causal(p.causal);
  plan_spec.set_window(-1);
  plan_spec.set_total_tokens(total);
  plan_spec.mutable_topology()->set_num_nodes(spec.nodes);
  plan_spec.mutable_topology()->set_devices_per_node(spec.devices_per_node);
  plan_spec.mutable_shape()->set_num_heads_q(hq);
  plan_spec.mutable_shape()->set_num_heads_kv(hkv);
  plan_spec.mutable_shape()->set_head_dim(d);
  plan_spec.mutable_shape()->set_dtype(hsap::v1::DTYPE_FLOAT32);
  plan_spec.set_strategy(spec.strategy);
  plan_spec.set_assignment(spec.assignment);
  plan_spec.set_profile("cpu-loopback");
  auto plans = hsap::v1::Plans::NewStub(
      grpc::CreateChannel("unix:" + spec.sockets[0], grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  hsap::v1::DispatchRequest dreq;
  *dreq.mutable_spec() = plan_spec;
  hsap::v1::DispatchResponse dresp;
  const grpc::Status dst = plans->Dispatch(&ctx, dreq, &dresp);
  if (!dst.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(dst.error_code()), dst.error_message());
  }
  struct Rank {
    std::unique_ptr<client::Client> client;
    std::unique_ptr<client::AttentionBuffers> buf;
    std::vector<int64_t> tokens;
    hsap::v1::AttentionForwardResponse fwd;
    hsap::v1::AttentionBackwardResponse bwd;
    absl::Time fwd_start, fwd_end, bwd_start, bwd_end;
  };
  std::vector<Rank> rs(ranks);
  for (int32_t r = 0; r < ranks; ++r) {
    for (const auto& range : dresp.dispatch().ranks(r).ranges()) {
      for (int64_t t = range.begin(); t < range.end(); ++t) rs[r].tokens.push_back(t);
    }
    auto c = client::Client::Connect(spec.sockets[r / spec.devices_per_node]);
    if (!c.ok()) return c.status();
    rs[r].client = std::move(c).value();
    const int64_t n = static_cast<int64_t>(rs[r].tokens.size());
    auto b = client::AttentionBuffers::Create(rs[r].client.get(), {n, hq, hkv, d, DType::kFloat32},
                                              absl::StrCat(spec.group, "-", r));
    if (!b.ok()) return b.status();
    rs[r].buf = std::move(b).value();
    auto& buf = *rs[r].buf;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t g = rs[r].tokens[i];
      std::copy_n(&p.q[g * hq * d], hq * d, static_cast<float*>(buf.q()) + i * hq * d);
      std::copy_n(&p.d_o[g * hq * d], hq * d, static_cast<float*>(buf.d_o()) + i * hq * d);
      std::copy_n(&p.k[g * hkv * d], hkv * d, static_cast<float*>(buf.k()) + i * hkv * d);
      std::copy_n(&p.v[g * hkv * d], hkv * d, static_cast<float*>(buf.v()) + i * hkv * d);
    }
  }
  hsap::v1::CallOptions options;
  options.set_strategy(spec.strategy);
  options.set_assignment(spec.assignment);
  options.set_deadline_ms(spec.deadline_ms);
  hsap::v1::MaskSpec mask;
  for (int64_t x : p.cu_seqlens) mask.mutable_cu_seqlens()->mutable_inline_values()->add_values(x);
  mask.set_causal(p.causal);
  std::vector<std::future<absl::Status>> calls;
  for (int32_t r = 0; r < ranks; ++r) {
    if (r == spec.missing_rank) continue;
    calls.push_back(std::async(std::launch::async, [&, r]() -> absl::Status {
      hsap::v1::CallId id;
      id.set_group(spec.group);
      id.set_rank(r);
      id.set_group_size(ranks);
      id.set_call_seq(spec.first_call_seq);
      for (const std::string& a : spec.member_addresses) id.add_nodes(a);
      if (!spec.member_addresses.empty()) id.set_node_index(r / spec.devices_per_node);
      if (spec.edit_call_id) spec.edit_call_id(r, &id);
      const auto fwd_request = rs[r].buf->ForwardRequest(id, mask, options);
      rs[r].fwd_start = absl::Now();
      auto f = rs[r].client->Forward(fwd_request);
      rs[r].fwd_end = absl::Now();
      rs[r].bwd_end = rs[r].fwd_end;
      if (!f.ok()) return f.status();
      rs[r].fwd = *f;
      id.set_call_seq(spec.first_call_seq + 1);
      const auto bwd_request = rs[r].buf->BackwardRequest(id, mask, options);
      rs[r].bwd_start = absl::Now();
      auto b = rs[r].client->Backward(bwd_request);
      rs[r].bwd_end = absl::Now();
      if (!b.ok()) return b.status();
      rs[r].bwd = *b;
      return absl::OkStatus();
    }));
  }
  absl::Status first_error;
  if (spec.durations != nullptr) {
    for (auto& c : calls) c.wait();
    for (int32_t r = 0; r < ranks; ++r) {
      if (r != spec.missing_rank) spec.durations->push_back(rs[r].bwd_end - rs[r].fwd_start);
    }
  }
  for (auto& c : calls) {
    absl::Status st = c.get();
    if (spec.statuses != nullptr) spec.statuses->push_back(st);
    if (!st.ok() && first_error.ok()) first_error = st;
  }
  if (!first_error.ok()) return first_error;
  if (spec.while_open) spec.while_open();
  GroupResult out;
  // Sized from the shapes: the problem may carry no reference.
  out.o.resize(total * hq * d);
  out.lse.resize(hq * total);
  out.dq.resize(total * hq * d);
  out.dk.resize(total * hkv * d);
  out.dv.resize(total * hkv * d);
  absl::Time f0 = absl::InfiniteFuture(), f1 = absl::InfinitePast();
  absl::Time b0 = absl::InfiniteFuture(), b1 = absl::InfinitePast();
  for (const Rank& r : rs) {
    f0 = std::min(f0, r.fwd_start);
    f1 = std::max(f1, r.fwd_end);
    b0 = std::min(b0, r.bwd_start);
    b1 = std::max(b1, r.bwd_end);
  }
  out.forward_seconds = absl::ToDoubleSeconds(f1 - f0);
  out.backward_seconds = absl::ToDoubleSeconds(b1 - b0);
  out.calls_begin = f0;
  out.calls_end = b1;
  out.plan_key = rs[0].fwd.stats().plan_key();
  for (int32_t r = 0; r < ranks; ++r) {
    auto& buf = *rs[r].buf;
    out.strategies_run.push_back(rs[r].fwd.stats().strategy());
    out.bytes_sent.push_back(rs[r].fwd.stats().bytes_sent());
    out.bytes_received.push_back(rs[r].fwd.stats().bytes_received());
    out.bwd_bytes_received.push_back(rs[r].bwd.stats().bytes_received());
    const int64_t n = static_cast<int64_t>(rs[r].tokens.size());
    for (int64_t i = 0; i < n; ++i) {
      const int64_t g = rs[r].tokens[i];
      for (int64_t e = 0; e < hq * d; ++e) {
        out.o[g * hq * d + e] = static_cast<float*>(buf.o())[i * hq * d + e];
        out.dq[g * hq * d + e] = static_cast<float*>(buf.dq())[i * hq * d + e];
      }
      for (int64_t e = 0; e < hkv * d; ++e) {
        out.dk[g * hkv * d + e] = static_cast<float*>(buf.dk())[i * hkv * d + e];
        out.dv[g * hkv * d + e] = static_cast<float*>(buf.dv())[i * hkv * d + e];
      }
      for (int64_t h = 0; h < hq; ++h) out.lse[h * total + g] = buf.lse()[h * n + i];
    }
  }
  out.max_error = p.o.empty() ? INFINITY : std::max({RelError(out.o, p.o), RelError(out.lse, p.lse), RelError(out.dq, p.dq),
                            RelError(out.dk, p.dk), RelError(out.dv, p.dv)});
  return out;
}

}  // namespace hsap::testing
