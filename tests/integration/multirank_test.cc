// Multi-rank groups through one daemon (--devices=cpu:4): each rank is its
// own client session holding only its dispatch's tokens; forward and
// backward, reassembled in global order, equal the float64 reference on the
// whole problem, for every strategy and assignment that runs on 1 x 4. A
// rank that never submits ends the call for the others with
// DEADLINE_EXCEEDED; mismatched calls fail for all with INVALID_ARGUMENT.
#include <cmath>
#include <future>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/cpp/attention_buffers.h"
#include "client/cpp/hsap_client.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "hsap/v1/plans.grpc.pb.h"
#include "kernels/cpu/reference.h"
#include "tests/integration/test_daemon.h"

namespace hsap {
namespace {

using ::testing::HasSubstr;

constexpr int kRanks = 4;
constexpr int64_t kHq = 4, kHkv = 2, kD = 32;

double RelError(const std::vector<double>& a, const std::vector<double>& b) {
  double diff = 0, ref = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] == b[i]) continue;
    diff = std::max(diff, std::fabs(a[i] - b[i]));
    ref = std::max(ref, std::fabs(b[i]));
  }
  return diff / (ref > 1e-12 ? ref : 1.0);
}

struct Rank {
  std::unique_ptr<client::Client> client;
  std::unique_ptr<client::AttentionBuffers> buffers;
  std::vector<int64_t> tokens;  // global token of each local row
};

class MultiRankTest : public ::testing::Test {
 protected:
  void SetUp() override {
    DaemonOptions options;
    options.cpu_devices = kRanks;
    options.call_deadline = absl::Seconds(30);
    daemon_ = testing::StartInProcessDaemon(options);
    plans_ = hsap::v1::Plans::NewStub(
        grpc::CreateChannel("unix:" + daemon_->socket(), grpc::InsecureChannelCredentials()));
  }

  hsap::v1::PlanSpec Spec(const std::vector<int64_t>& cu, hsap::v1::Strategy s,
                          hsap::v1::AssignmentPolicy a) {
    hsap::v1::PlanSpec spec;
    for (int64_t x : cu) spec.add_cu_seqlens(x);
    spec.set_causal(true);
    spec.set_window(-1);
    spec.set_total_tokens(cu.back());
    spec.mutable_topology()->set_num_nodes(1);
    spec.mutable_topology()->set_devices_per_node(kRanks);
    spec.mutable_shape()->set_num_heads_q(kHq);
    spec.mutable_shape()->set_num_heads_kv(kHkv);
    spec.mutable_shape()->set_head_dim(kD);
    spec.mutable_shape()->set_dtype(hsap::v1::DTYPE_FLOAT32);
    spec.set_strategy(s);
    spec.set_assignment(a);
    spec.set_profile("cpu-loopback");
    return spec;
  }

  std::unique_ptr<testing::InProcessDaemon> daemon_;
  std::unique_ptr<hsap::v1::Plans::Stub> plans_;
};

TEST_F(MultiRankTest, EveryStrategyAndAssignmentEqualsTheReference) {
  const std::vector<int64_t> cu = {0, 7, 7, 130, 131, 200, 333};
  const int64_t total = cu.back();
  // The global problem, and its float64 reference.
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<float> uni(-1, 1);
  std::vector<float> gq(total * kHq * kD), gk(total * kHkv * kD), gv(gk.size()), gdo(gq.size());
  for (auto* v : {&gq, &gk, &gv, &gdo}) for (float& x : *v) x = uni(rng);
  kernels::cpu::AttentionShape shape{kHq, kHkv, kD, DType::kFloat32, 1.0f / std::sqrt(float(kD))};
  const auto slices = LowerDocuments(cu, true, -1);
  std::vector<double> ro, rlse, rdq, rdk, rdv;
  kernels::cpu::ReferenceForward(shape, gq.data(), gk.data(), gv.data(), total, total, slices, &ro, &rlse);
  kernels::cpu::ReferenceBackward(shape, gq.data(), gk.data(), gv.data(), gdo.data(), total, total,
                                  slices, &rdq, &rdk, &rdv);
  uint64_t group_id = 0;
  int combos = 0;
  for (auto strategy : {hsap::v1::STRATEGY_RING, hsap::v1::STRATEGY_ALLGATHER,
                        hsap::v1::STRATEGY_ULYSSES, hsap::v1::STRATEGY_USP, hsap::v1::STRATEGY_SAP,
                        hsap::v1::STRATEGY_HSAP, hsap::v1::STRATEGY_AUTO}) {
    for (auto assignment : {hsap::v1::ASSIGNMENT_CONTIGUOUS, hsap::v1::ASSIGNMENT_ZIGZAG,
                            hsap::v1::ASSIGNMENT_BALANCED}) {
      SCOPED_TRACE(absl::StrCat(hsap::v1::Strategy_Name(strategy), " ",
                                hsap::v1::AssignmentPolicy_Name(assignment)));
      grpc::ClientContext ctx;
      hsap::v1::DispatchRequest dreq;
      *dreq.mutable_spec() = Spec(cu, strategy, assignment);
      hsap::v1::DispatchResponse dresp;
      const grpc::Status dst = plans_->Dispatch(&ctx, dreq, &dresp);
      if (!dst.ok()) {
        // Strategies that cannot run on this shape say so precisely.
        EXPECT_EQ(dst.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << dst.error_message();
        continue;
      }
      ++combos;
      std::vector<Rank> ranks(kRanks);
      for (int r = 0; r < kRanks; ++r) {
        for (const auto& range : dresp.dispatch().ranks(r).ranges()) {
          for (int64_t t = range.begin(); t < range.end(); ++t) ranks[r].tokens.push_back(t);
        }
        auto c = client::Client::Connect(daemon_->socket());
        ASSERT_TRUE(c.ok());
        ranks[r].client = std::move(c).value();
        const int64_t n = static_cast<int64_t>(ranks[r].tokens.size());
        auto b = client::AttentionBuffers::Create(ranks[r].client.get(),
                                                  {n, kHq, kHkv, kD, DType::kFloat32}, "rank");
        ASSERT_TRUE(b.ok()) << b.status();
        ranks[r].buffers = std::move(b).value();
        auto& buf = *ranks[r].buffers;
        for (int64_t i = 0; i < n; ++i) {
          const int64_t g = ranks[r].tokens[i];
          std::copy_n(&gq[g * kHq * kD], kHq * kD, static_cast<float*>(buf.q()) + i * kHq * kD);
          std::copy_n(&gdo[g * kHq * kD], kHq * kD, static_cast<float*>(buf.d_o()) + i * kHq * kD);
          std::copy_n(&gk[g * kHkv * kD], kHkv * kD, static_cast<float*>(buf.k()) + i * kHkv * kD);
          std::copy_n(&gv[g * kHkv * kD], kHkv * kD, static_cast<float*>(buf.v()) + i * kHkv * kD);
        }
      }
      const std::string group = absl::StrCat("g", group_id++);
      hsap::v1::CallOptions options;
      options.set_strategy(strategy);
      options.set_assignment(assignment);
      const auto mask = client::DocumentMask(cu, true);
      std::vector<std::future<absl::Status>> calls;
      for (int r = 0; r < kRanks; ++r) {
        calls.push_back(std::async(std::launch::async, [&, r]() -> absl::Status {
          hsap::v1::CallId id;
          id.set_group(group);
          id.set_rank(r);
          id.set_group_size(kRanks);
          id.set_call_seq(1);
          auto f = ranks[r].client->Forward(ranks[r].buffers->ForwardRequest(id, mask, options));
          if (!f.ok()) return f.status();
          id.set_call_seq(2);
          auto b = ranks[r].client->Backward(ranks[r].buffers->BackwardRequest(id, mask, options));
          return b.ok() ? absl::OkStatus() : b.status();
        }));
      }
      for (auto& c : calls) ASSERT_TRUE(c.get().ok());
      // Reassemble in global order.
      std::vector<double> o(ro.size()), lse(rlse.size()), dq(rdq.size()), dk(rdk.size()), dv(rdv.size());
      for (int r = 0; r < kRanks; ++r) {
        auto& buf = *ranks[r].buffers;
        const int64_t n = static_cast<int64_t>(ranks[r].tokens.size());
        for (int64_t i = 0; i < n; ++i) {
          const int64_t g = ranks[r].tokens[i];
          for (int64_t e = 0; e < kHq * kD; ++e) {
            o[g * kHq * kD + e] = static_cast<float*>(buf.o())[i * kHq * kD + e];
            dq[g * kHq * kD + e] = static_cast<float*>(buf.dq())[i * kHq * kD + e];
          }
          for (int64_t e = 0; e < kHkv * kD; ++e) {
            dk[g * kHkv * kD + e] = static_cast<float*>(buf.dk())[i * kHkv * kD + e];
            dv[g * kHkv * kD + e] = static_cast<float*>(buf.dv())[i * kHkv * kD + e];
          }
          for (int64_t h = 0; h < kHq; ++h) lse[h * total + g] = buf.lse()[h * n + i];
        }
      }
      EXPECT_LE(RelError(o, ro), 1e-5);
      EXPECT_LE(RelError(lse, rlse), 1e-5);
      EXPECT_LE(RelError(dq, rdq), 1e-5);
      EXPECT_LE(RelError(dk, rdk), 1e-5);
      EXPECT_LE(RelError(dv, rdv), 1e-5);
    }
  }
  EXPECT_GE(combos, 15);  // most strategy x assignment pairs run on 1 x 4
}

TEST_F(MultiRankTest, MissingRankIsDeadlineExceededForAll) {
  const std::vector<int64_t> cu = {0, 64};
  std::vector<std::unique_ptr<client::Client>> clients;
  std::vector<std::unique_ptr<client::AttentionBuffers>> bufs;
  for (int r = 0; r < 3; ++r) {
    clients.push_back(std::move(client::Client::Connect(daemon_->socket())).value());
    bufs.push_back(std::move(client::AttentionBuffers::Create(
        clients.back().get(), {16, kHq, kHkv, kD, DType::kFloat32}, "r")).value());
  }
  hsap::v1::CallOptions options;
  options.set_strategy(hsap::v1::STRATEGY_SAP);
  options.set_assignment(hsap::v1::ASSIGNMENT_CONTIGUOUS);
  options.set_deadline_ms(400);
  const absl::Time start = absl::Now();
  std::vector<std::future<absl::Status>> calls;
  for (int r = 0; r < 3; ++r) {  // rank 3 never comes
    calls.push_back(std::async(std::launch::async, [&, r]() -> absl::Status {
      hsap::v1::CallId id;
      id.set_group("missing");
      id.set_rank(r);
      id.set_group_size(kRanks);
      id.set_call_seq(1);
      auto f = clients[r]->Forward(bufs[r]->ForwardRequest(id, client::DocumentMask(cu, true), options));
      return f.status();
    }));
  }
  for (auto& c : calls) {
    const absl::Status st = c.get();
    EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
    EXPECT_THAT(std::string(st.message()), HasSubstr("rank(s) 3 did not arrive"));
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(4));  // well within 2x the deadline + slack
}

}  // namespace
}  // namespace hsap
