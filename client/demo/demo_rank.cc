#include "client/demo/demo_rank.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "client/cpp/attention_buffers.h"
#include "client/cpp/hsap_client.h"
#include "grpcpp/create_channel.h"
#include "hsap/v1/plans.grpc.pb.h"

namespace hsap::demo {
namespace {

absl::Status FromGrpc(const grpc::Status& st, absl::string_view what) {
  if (st.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(st.error_code()),
                      absl::StrCat(what, ": ", st.error_message()));
}

// The global rows of `rank` for this pack and strategy (Plans.Dispatch with
// the spec the attention calls imply: causal documents, balanced).
absl::StatusOr<std::vector<int64_t>> DispatchRows(const DemoRun& run, int rank,
                                                  const std::vector<int64_t>& cu,
                                                  hsap::v1::Strategy strategy) {
  hsap::v1::DispatchRequest req;
  hsap::v1::PlanSpec* spec = req.mutable_spec();
  for (int64_t x : cu) spec->add_cu_seqlens(x);
  spec->set_causal(true);
  spec->set_window(-1);
  spec->set_total_tokens(cu.back());
  spec->mutable_topology()->set_num_nodes(static_cast<int32_t>(run.sockets.size()));
  spec->mutable_topology()->set_devices_per_node(run.devices_per_node);
  spec->mutable_shape()->set_num_heads_q(run.heads_q);
  spec->mutable_shape()->set_num_heads_kv(run.heads_kv);
  spec->mutable_shape()->set_head_dim(run.head_dim);
  spec->mutable_shape()->set_dtype(hsap::v1::DTYPE_FLOAT32);
  spec->set_strategy(strategy);
  spec->set_assignment(hsap::v1::ASSIGNMENT_BALANCED);
  spec->set_profile("cpu-loopback");
  const std::string& socket = run.sockets[rank / run.devices_per_node];
  auto plans = hsap::v1::Plans::NewStub(
      grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  hsap::v1::DispatchResponse resp;
  if (auto st = FromGrpc(plans->Dispatch(&ctx, req, &resp), "Plans.Dispatch"); !st.ok()) {
    return st;
  }
  std::vector<int64_t> rows;
  for (const auto& range : resp.dispatch().ranks(rank).ranges()) {
    for (int64_t t = range.begin(); t < range.end(); ++t) rows.push_back(t);
  }
  return rows;
}

// Forward + backward of one (pack, strategy) on this rank.
absl::Status RunOne(const DemoRun& run, int rank, client::Client* client, const DemoProblem& p,
                    int pack, const StrategyChoice& strategy) {
  auto rows = DispatchRows(run, rank, p.cu_seqlens, strategy.value);
  if (!rows.ok()) return rows.status();
  const int64_t n = static_cast<int64_t>(rows->size());
  const int64_t hq = run.heads_q, hkv = run.heads_kv, d = run.head_dim;
  auto buffers = client::AttentionBuffers::Create(
      client, {n, hq, hkv, d, DType::kFloat32}, absl::StrCat("demo-", strategy.name, "-", rank));
  if (!buffers.ok()) return buffers.status();
  auto& b = **buffers;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t g = (*rows)[i];
    std::copy_n(&p.q[g * hq * d], hq * d, static_cast<float*>(b.q()) + i * hq * d);
    std::copy_n(&p.d_o[g * hq * d], hq * d, static_cast<float*>(b.d_o()) + i * hq * d);
    std::copy_n(&p.k[g * hkv * d], hkv * d, static_cast<float*>(b.k()) + i * hkv * d);
    std::copy_n(&p.v[g * hkv * d], hkv * d, static_cast<float*>(b.v()) + i * hkv * d);
  }
  hsap::v1::CallId id;
  id.set_group(absl::StrCat("demo-", run.run_id, "-p", pack, "-", strategy.name));
  id.set_rank(rank);
  id.set_group_size(run.ranks());
  id.set_call_seq(1);
  hsap::v1::CallOptions options;
  options.set_strategy(strategy.value);
  options.set_assignment(hsap::v1::ASSIGNMENT_BALANCED);
  options.set_deadline_ms(120000);
  const auto mask = client::DocumentMask(p.cu_seqlens, /*causal=*/true);
  auto fwd = client->Forward(b.ForwardRequest(id, mask, options));
  if (!fwd.ok()) return fwd.status();
  id.set_call_seq(2);
  auto bwd = client->Backward(b.BackwardRequest(id, mask, options));
  if (!bwd.ok()) return bwd.status();

  RankResult r;
  r.heads_q = hq;
  r.heads_kv = hkv;
  r.head_dim = d;
  r.tokens = *rows;
  auto copy = [](const void* src, int64_t count) {
    const float* f = static_cast<const float*>(src);
    return std::vector<float>(f, f + count);
  };
  r.o = copy(b.o(), n * hq * d);
  r.lse = copy(b.lse(), hq * n);
  r.dq = copy(b.dq(), n * hq * d);
  r.dk = copy(b.dk(), n * hkv * d);
  r.dv = copy(b.dv(), n * hkv * d);
  r.forward = fwd->stats();
  r.backward = bwd->stats();
  if (auto st = client->Unregister(b.buffer().region_id()); !st.ok()) return st;
  return WriteRankResult(ResultPath(run, pack, strategy.name, rank), r);
}

}  // namespace

absl::Status RunRank(const DemoRun& run, int rank) {
  const std::string& socket = run.sockets[rank / run.devices_per_node];
  auto client = client::Client::Connect(socket);
  if (!client.ok()) return client.status();
  auto packs = MakePacks(run);
  if (!packs.ok()) return packs.status();
  for (int pack = 0; pack < static_cast<int>(packs->size()); ++pack) {
    const DemoProblem p = MakeProblem(run, (*packs)[pack], pack);
    for (const StrategyChoice& s : DemoStrategies()) {
      absl::Status st = RunOne(run, rank, client->get(), p, pack, s);
      if (!st.ok()) {
        return absl::Status(st.code(), absl::StrCat("rank ", rank, ", pack ", pack, ", ",
                                                    s.name, ": ", st.message()));
      }
      if (rank == 0) {
        std::printf("  pack %d: %-8s done\n", pack, s.name);
        std::fflush(stdout);
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace hsap::demo
