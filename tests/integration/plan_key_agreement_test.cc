// Plans.Dispatch and Plans.CompilePlan, given the same inputs as an
// Attention call — a cu_seqlens mask or slices, every optional field left
// unset — return the key of the plan that call runs: one conversion of
// request fields (server/plan/plan_proto.h) and one cost profile (the
// daemon's --profile) serve both services.
#include <cstring>
#include <string>
#include <vector>

#include "client/cpp/hsap_client.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "hsap/v1/plans.grpc.pb.h"
#include "tests/integration/test_daemon.h"

namespace hsap {
namespace {

constexpr int64_t kHq = 4, kHkv = 2, kD = 32;

struct Mask {
  std::string name;
  std::vector<int64_t> cu_seqlens;             // or
  std::vector<hsap::v1::MaskSlice> slices;     // with total_tokens
  int64_t total_tokens = 0;
  bool causal = true;
  int64_t window = -1;                         // -1: leave unset
};

hsap::v1::MaskSlice Slice(int64_t qb, int64_t qe, int64_t kb, int64_t ke, bool causal) {
  hsap::v1::MaskSlice s;
  s.set_q_begin(qb);
  s.set_q_end(qe);
  s.set_k_begin(kb);
  s.set_k_end(ke);
  s.set_type(causal ? hsap::v1::MASK_TYPE_CAUSAL : hsap::v1::MASK_TYPE_FULL);
  return s;  // window left unset
}

std::vector<Mask> Masks() {
  Mask docs{"cu_seqlens", {0, 50, 51, 130, 200}, {}, 200};
  Mask bidir{"cu_seqlens bidirectional", {0, 90, 200}, {}, 200};
  bidir.causal = false;
  Mask window{"cu_seqlens window", {0, 120, 200}, {}, 200};
  window.window = 16;
  Mask slices{"slices", {}, {Slice(0, 40, 0, 40, false), Slice(40, 200, 0, 40, false),
                             Slice(40, 200, 40, 200, true)}, 200};
  return {docs, bidir, window, slices};
}

// The Attention call's plan key (one rank; defaults everywhere).
std::string AttentionPlanKey(client::Client* c, const Mask& m) {
  const int64_t T = m.total_tokens;
  const uint64_t q_bytes = T * kHq * kD * 4, kv_bytes = T * kHkv * kD * 4, lse_bytes = T * kHq * 4;
  auto buf = c->CreateBuffer(2 * q_bytes + 2 * kv_bytes + lse_bytes, m.name);
  EXPECT_TRUE(buf.ok()) << buf.status();
  if (!buf.ok()) return "";
  std::memset((*buf)->data(), 0, (*buf)->size());
  hsap::v1::AttentionForwardRequest req;
  req.mutable_call()->set_group(m.name);
  req.mutable_call()->set_group_size(1);
  req.mutable_call()->set_call_seq(1);
  if (!m.cu_seqlens.empty()) {
    for (int64_t x : m.cu_seqlens) req.mutable_mask()->mutable_cu_seqlens()->mutable_inline_values()->add_values(x);
  } else {
    for (const auto& s : m.slices) *req.mutable_mask()->mutable_slices()->add_slices() = s;
    req.mutable_mask()->mutable_slices()->set_total_tokens(T);
  }
  req.mutable_mask()->set_causal(m.causal);
  if (m.window >= 0) req.mutable_mask()->set_window_left(m.window);
  const auto f32 = hsap::v1::DTYPE_FLOAT32;
  uint64_t at = 0;
  *req.mutable_q() = (*buf)->Ref(at, {T, kHq, kD}, f32);
  *req.mutable_k() = (*buf)->Ref(at += q_bytes, {T, kHkv, kD}, f32);
  *req.mutable_v() = (*buf)->Ref(at += kv_bytes, {T, kHkv, kD}, f32);
  *req.mutable_o() = (*buf)->Ref(at += kv_bytes, {T, kHq, kD}, f32);
  *req.mutable_lse() = (*buf)->Ref(at += q_bytes, {kHq, T}, hsap::v1::DTYPE_FLOAT32);
  auto resp = c->Forward(req);
  EXPECT_TRUE(resp.ok()) << m.name << ": " << resp.status();
  return resp.ok() ? resp->stats().plan_key() : "";
}

// The same inputs as a PlanSpec, optional fields unset.
hsap::v1::PlanSpec SpecOf(const Mask& m) {
  hsap::v1::PlanSpec s;
  for (int64_t x : m.cu_seqlens) s.add_cu_seqlens(x);
  for (const auto& sl : m.slices) *s.add_slices() = sl;
  s.set_causal(m.causal);
  if (m.window >= 0) s.set_window(m.window);
  s.set_total_tokens(m.total_tokens);
  s.mutable_topology()->set_num_nodes(1);
  s.mutable_topology()->set_devices_per_node(1);
  s.mutable_shape()->set_num_heads_q(kHq);
  s.mutable_shape()->set_num_heads_kv(kHkv);
  s.mutable_shape()->set_head_dim(kD);
  s.mutable_shape()->set_dtype(hsap::v1::DTYPE_FLOAT32);
  return s;
}

TEST(PlanKeyAgreementTest, PlansReturnTheKeyTheAttentionCallRuns) {
  auto daemon = testing::StartInProcessDaemon();
  auto c = client::Client::Connect(daemon->socket());
  ASSERT_TRUE(c.ok()) << c.status();
  auto plans = hsap::v1::Plans::NewStub(
      grpc::CreateChannel("unix:" + daemon->socket(), grpc::InsecureChannelCredentials()));
  std::vector<std::string> keys;
  for (const Mask& m : Masks()) {
    const std::string ran = AttentionPlanKey(c->get(), m);
    keys.push_back(ran);
    ASSERT_EQ(ran.size(), 32u) << m.name;
    {
      grpc::ClientContext ctx;
      hsap::v1::DispatchRequest req;
      *req.mutable_spec() = SpecOf(m);
      hsap::v1::DispatchResponse resp;
      const grpc::Status st = plans->Dispatch(&ctx, req, &resp);
      ASSERT_TRUE(st.ok()) << m.name << ": " << st.error_message();
      EXPECT_EQ(resp.plan_key(), ran) << m.name;
    }
    {
      grpc::ClientContext ctx;
      hsap::v1::CompilePlanRequest req;
      *req.mutable_spec() = SpecOf(m);
      hsap::v1::CompilePlanResponse resp;
      const grpc::Status st = plans->CompilePlan(&ctx, req, &resp);
      ASSERT_TRUE(st.ok()) << m.name << ": " << st.error_message();
      EXPECT_EQ(resp.plan_key(), ran) << m.name;
      EXPECT_TRUE(resp.cache_hit()) << m.name << ": the Attention call compiled it";
    }
  }
  // A spec that differs from the call (another profile) gets another key,
  // so the equality above is not vacuous.
  grpc::ClientContext ctx;
  hsap::v1::DispatchRequest req;
  *req.mutable_spec() = SpecOf(Masks()[0]);
  req.mutable_spec()->set_profile("h100");
  hsap::v1::DispatchResponse resp;
  ASSERT_TRUE(plans->Dispatch(&ctx, req, &resp).ok());
  EXPECT_NE(resp.plan_key(), keys[0]);
  // And the masks' keys differ from each other.
  for (size_t i = 0; i < keys.size(); ++i) {
    for (size_t j = i + 1; j < keys.size(); ++j) EXPECT_NE(keys[i], keys[j]) << i << " " << j;
  }
}

TEST(PlanKeyAgreementTest, UnsetDTypeIsRefusedByBoth) {
  auto daemon = testing::StartInProcessDaemon();
  auto plans = hsap::v1::Plans::NewStub(
      grpc::CreateChannel("unix:" + daemon->socket(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  hsap::v1::DispatchRequest req;
  *req.mutable_spec() = SpecOf(Masks()[0]);
  req.mutable_spec()->mutable_shape()->set_dtype(hsap::v1::DTYPE_UNSPECIFIED);
  hsap::v1::DispatchResponse resp;
  const grpc::Status st = plans->Dispatch(&ctx, req, &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(st.error_message().find("shape.dtype is DTYPE_UNSPECIFIED"), std::string::npos)
      << st.error_message();
}

}  // namespace
}  // namespace hsap
