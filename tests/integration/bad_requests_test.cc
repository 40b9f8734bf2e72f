// Every malformed attention or region request gets its exact status code,
// and the message names the field and the values. Through a real daemon and
// the real client over the Unix socket.
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <limits>

#include "client/cpp/attention_buffers.h"
#include "client/cpp/hsap_client.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "tests/integration/test_daemon.h"

namespace hsap {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kTokens = 64;

class BadRequestsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    daemon_ = testing::StartInProcessDaemon();
    auto c = client::Client::Connect(daemon_->socket());
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = std::move(c).value();
    auto b = client::AttentionBuffers::Create(client_.get(), {kTokens, 4, 2, 32, DType::kFloat32}, "t");
    ASSERT_TRUE(b.ok()) << b.status();
    buffers_ = std::move(b).value();
    buffers_->FillInputs(3);
    call_.set_group("g");
    call_.set_group_size(1);
    call_.set_call_seq(1);
    cu_ = {0, 10, 10, 40, kTokens};
  }

  hsap::v1::AttentionForwardRequest Good() const {
    return buffers_->ForwardRequest(call_, client::DocumentMask(cu_, true), {});
  }

  void ExpectError(const hsap::v1::AttentionForwardRequest& r, absl::StatusCode code,
                   const std::string& text) {
    auto resp = client_->Forward(r);
    ASSERT_FALSE(resp.ok()) << "expected " << code << " with '" << text << "'";
    EXPECT_EQ(resp.status().code(), code) << resp.status();
    EXPECT_THAT(std::string(resp.status().message()), HasSubstr(text));
  }

  std::unique_ptr<testing::InProcessDaemon> daemon_;
  std::unique_ptr<client::Client> client_;
  std::unique_ptr<client::AttentionBuffers> buffers_;
  hsap::v1::CallId call_;
  std::vector<int64_t> cu_;
};

TEST_F(BadRequestsTest, GoodRequestRuns) {
  auto resp = client_->Forward(Good());
  ASSERT_TRUE(resp.ok()) << resp.status();
  EXPECT_EQ(resp->stats().area(), 10 * 11 / 2 + 30 * 31 / 2 + 24 * 25 / 2);
}

TEST_F(BadRequestsTest, UnknownRegion) {
  auto r = Good();
  r.mutable_q()->set_region_id(999);
  ExpectError(r, absl::StatusCode::kNotFound, "q.region_id 999");
}

TEST_F(BadRequestsTest, OffsetPlusSizeOverflows) {
  auto r = Good();
  r.mutable_k()->set_offset(std::numeric_limits<uint64_t>::max() - 8);
  ExpectError(r, absl::StatusCode::kInvalidArgument, "k spans bytes [18446744073709551607");
}

TEST_F(BadRequestsTest, ShapeTimesSizeOverflows) {
  auto r = Good();
  r.mutable_q()->set_shape(0, int64_t{1} << 40);
  r.mutable_q()->set_shape(1, int64_t{1} << 40);
  ExpectError(r, absl::StatusCode::kInvalidArgument, "q.shape [1099511627776, 1099511627776, 32] overflows");
}

TEST_F(BadRequestsTest, ReferencePastTheEndOfTheRegion) {
  auto r = Good();
  r.mutable_v()->set_offset(buffers_->buffer().size() - 16);
  ExpectError(r, absl::StatusCode::kInvalidArgument, "past the end of its region");
  ExpectError(r, absl::StatusCode::kInvalidArgument, "v spans bytes");
}

TEST_F(BadRequestsTest, NegativeDimension) {
  auto r = Good();
  r.mutable_o()->set_shape(2, -32);
  ExpectError(r, absl::StatusCode::kInvalidArgument, "o.shape[2] is -32");
}

TEST_F(BadRequestsTest, DTypeMismatch) {
  auto r = Good();
  r.mutable_k()->set_dtype(hsap::v1::DTYPE_BFLOAT16);
  ExpectError(r, absl::StatusCode::kInvalidArgument, "k.dtype is DTYPE_BFLOAT16 but q.dtype is DTYPE_FLOAT32");
  r = Good();
  r.mutable_lse()->set_dtype(hsap::v1::DTYPE_FLOAT16);
  ExpectError(r, absl::StatusCode::kInvalidArgument, "lse.dtype is DTYPE_FLOAT16");
  r = Good();
  r.mutable_q()->set_dtype(hsap::v1::DTYPE_INT32);
  ExpectError(r, absl::StatusCode::kInvalidArgument, "q.dtype is DTYPE_INT32");
}

TEST_F(BadRequestsTest, ShapeMismatch) {
  auto r = Good();
  r.mutable_v()->set_shape(0, kTokens - 1);
  ExpectError(r, absl::StatusCode::kInvalidArgument, "v.shape is [63, 2, 32] but k.shape needs [64, 2, 32]");
  r = Good();
  r.mutable_o()->set_shape(1, 2);
  ExpectError(r, absl::StatusCode::kInvalidArgument, "o.shape is [64, 2, 32]");
  r = Good();
  r.mutable_lse()->set_shape(1, 3);
  ExpectError(r, absl::StatusCode::kInvalidArgument, "lse.shape is [4, 3]");
  r = Good();
  r.mutable_q()->add_shape(1);
  ExpectError(r, absl::StatusCode::kInvalidArgument, "q.shape is [64, 4, 32, 1]: it must have 3 dimensions");
}

TEST_F(BadRequestsTest, HeadsNotDivisible) {
  auto r = Good();
  r.mutable_k()->set_shape(1, 3);
  r.mutable_v()->set_shape(1, 3);
  ExpectError(r, absl::StatusCode::kInvalidArgument, "k.shape[1] (Hkv) is 3 but Hq = 4");
}

TEST_F(BadRequestsTest, HeadDimOutOfRange) {
  auto r = Good();
  for (auto* t : {r.mutable_q(), r.mutable_k(), r.mutable_v(), r.mutable_o()}) t->set_shape(2, 0);
  ExpectError(r, absl::StatusCode::kInvalidArgument,
              "q.shape[2] (head_dim) is 0; it must be in [1, 256]");
}

TEST_F(BadRequestsTest, CuSeqlensNotStartingAtZero) {
  auto r = Good();
  r.mutable_mask()->mutable_cu_seqlens()->mutable_inline_values()->set_values(0, 1);
  ExpectError(r, absl::StatusCode::kInvalidArgument, "mask.cu_seqlens[0] is 1");
}

TEST_F(BadRequestsTest, CuSeqlensDecreasing) {
  auto r = Good();
  r.mutable_mask()->mutable_cu_seqlens()->mutable_inline_values()->set_values(2, 5);
  ExpectError(r, absl::StatusCode::kInvalidArgument, "mask.cu_seqlens decreases at index 2: 10 then 5");
}

TEST_F(BadRequestsTest, CuSeqlensNotEndingAtTokenCount) {
  auto r = Good();
  r.mutable_mask()->mutable_cu_seqlens()->mutable_inline_values()->set_values(4, kTokens - 1);
  ExpectError(r, absl::StatusCode::kInvalidArgument, "q.shape[0] is 64 but the mask covers 63 tokens");
}

TEST_F(BadRequestsTest, CuSeqlensEmpty) {
  auto r = Good();
  r.mutable_mask()->mutable_cu_seqlens()->mutable_inline_values()->clear_values();
  ExpectError(r, absl::StatusCode::kInvalidArgument, "mask.cu_seqlens is empty");
}

TEST_F(BadRequestsTest, CuSeqlensWrongDType) {
  auto r = Good();
  auto* t = r.mutable_mask()->mutable_cu_seqlens()->mutable_tensor();
  *t = buffers_->buffer().Ref(0, {5}, hsap::v1::DTYPE_FLOAT32);
  ExpectError(r, absl::StatusCode::kInvalidArgument,
              "mask.cu_seqlens.tensor.dtype is DTYPE_FLOAT32; it must be DTYPE_INT32 or DTYPE_INT64");
}

TEST_F(BadRequestsTest, CuSeqlensFromRegionMatchesInline) {
  auto inline_resp = client_->Forward(Good());
  ASSERT_TRUE(inline_resp.ok());
  std::vector<float> o_inline(static_cast<float*>(buffers_->o()),
                              static_cast<float*>(buffers_->o()) + kTokens * 4 * 32);
  auto cu_buf = client_->CreateBuffer(64, "cu");
  ASSERT_TRUE(cu_buf.ok());
  for (size_t i = 0; i < cu_.size(); ++i) {
    const int32_t x = static_cast<int32_t>(cu_[i]);
    std::memcpy((*cu_buf)->data() + 4 * i, &x, 4);
  }
  auto r = Good();
  *r.mutable_mask()->mutable_cu_seqlens()->mutable_tensor() =
      (*cu_buf)->Ref(0, {static_cast<int64_t>(cu_.size())}, hsap::v1::DTYPE_INT32);
  std::memset(buffers_->o(), 0, kTokens * 4 * 32 * 4);
  r.mutable_call()->set_call_seq(2);
  ASSERT_TRUE(client_->Forward(r).ok());
  EXPECT_EQ(0, std::memcmp(o_inline.data(), buffers_->o(), o_inline.size() * 4));
}

TEST_F(BadRequestsTest, WindowNeedsCausal) {
  auto r = Good();
  r.mutable_mask()->set_causal(false);
  r.mutable_mask()->set_window_left(4);
  ExpectError(r, absl::StatusCode::kInvalidArgument, "mask.window_left is 4 but mask.causal is false");
  r.mutable_mask()->set_window_left(-7);
  ExpectError(r, absl::StatusCode::kInvalidArgument, "mask.window_left is -7");
}

// Found by tests/fuzz/attention_validation_fuzzer: a huge window on a
// cu_seqlens mask passed validation, and the lowered slices then overflowed
// r + offset - window in SliceArea.
TEST_F(BadRequestsTest, WindowBeyond2To40) {
  auto r = Good();
  r.mutable_mask()->set_causal(true);
  r.mutable_mask()->set_window_left(std::numeric_limits<int64_t>::max());
  ExpectError(r, absl::StatusCode::kInvalidArgument,
              "mask.window_left is 9223372036854775807; it must be at most 2^40");
  r.mutable_mask()->set_window_left(int64_t{1} << 40);
  EXPECT_TRUE(client_->Forward(r).ok());
}

TEST_F(BadRequestsTest, BadSlices) {
  auto r = Good();
  auto* s = r.mutable_mask()->mutable_slices();
  s->set_total_tokens(kTokens);
  auto* slice = s->add_slices();
  slice->set_q_begin(0);
  slice->set_q_end(kTokens + 1);
  slice->set_k_end(4);
  ExpectError(r, absl::StatusCode::kInvalidArgument, "mask.slices[0] query range [0, 65)");
}

TEST_F(BadRequestsTest, CallIdentity) {
  auto r = Good();
  r.mutable_call()->set_rank(1);
  ExpectError(r, absl::StatusCode::kInvalidArgument, "call.rank is 1");
  r = Good();
  r.mutable_call()->set_group("");
  ExpectError(r, absl::StatusCode::kInvalidArgument, "call.group has 0 bytes");
  r = Good();
  r.mutable_call()->set_call_seq(0);
  ExpectError(r, absl::StatusCode::kInvalidArgument, "call.call_seq is 0");
  r = Good();
  r.mutable_call()->set_group_size(2);
  ExpectError(r, absl::StatusCode::kInvalidArgument, "call.group_size is 2");
}

TEST_F(BadRequestsTest, SoftmaxScale) {
  auto r = Good();
  r.mutable_options()->set_softmax_scale(-1.f);
  ExpectError(r, absl::StatusCode::kInvalidArgument, "options.softmax_scale is -1");
  r.mutable_options()->set_softmax_scale(std::numeric_limits<float>::quiet_NaN());
  ExpectError(r, absl::StatusCode::kInvalidArgument, "options.softmax_scale is nan");
}

TEST_F(BadRequestsTest, OutputOverlapsInput) {
  auto r = Good();
  r.mutable_o()->set_offset(r.q().offset() + 64);
  ExpectError(r, absl::StatusCode::kInvalidArgument, "overlaps q");
}

TEST_F(BadRequestsTest, BackwardChecksItsTensors) {
  auto r = buffers_->BackwardRequest(call_, client::DocumentMask(cu_, true), {});
  r.mutable_dk()->set_shape(1, 4);
  auto resp = client_->Backward(r);
  EXPECT_EQ(resp.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(resp.status().message()), HasSubstr("dk.shape is [64, 4, 32]"));
  r = buffers_->BackwardRequest(call_, client::DocumentMask(cu_, true), {});
  r.mutable_d_o()->set_region_id(12345);
  EXPECT_EQ(client_->Backward(r).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(BadRequestsTest, UnregisterRegionInUse) {
  const uint64_t id = buffers_->buffer().region_id();
  auto pin = daemon_->daemon->state()->regions.Pin(client_->session_id(), id, "test");
  ASSERT_TRUE(pin.ok());  // as a running call holds it
  auto st = client_->Unregister(id);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("region_id " + std::to_string(id) + " is in use"));
  pin->Release();
  EXPECT_TRUE(client_->Unregister(id).ok());
  ExpectError(Good(), absl::StatusCode::kNotFound, "q.region_id");  // stale region
}

TEST_F(BadRequestsTest, AnotherSessionsRegionIsNotFound) {
  auto other = client::Client::Connect(daemon_->socket());
  ASSERT_TRUE(other.ok());
  auto resp = (*other)->Forward(Good());
  EXPECT_EQ(resp.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ((*other)->Unregister(buffers_->buffer().region_id()).code(), absl::StatusCode::kNotFound);
}

TEST_F(BadRequestsTest, CallsWithoutSessionAreUnauthenticated) {
  auto stub = hsap::v1::Attention::NewStub(client_->channel());
  grpc::ClientContext ctx;
  hsap::v1::AttentionForwardResponse resp;
  auto st = stub->Forward(&ctx, Good(), &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  grpc::ClientContext ctx2;
  ctx2.AddMetadata("hsap-session-id", std::to_string(client_->session_id()));
  ctx2.AddMetadata("hsap-session-token", "00000000000000000000000000000000");
  EXPECT_EQ(stub->Forward(&ctx2, Good(), &resp).error_code(), grpc::StatusCode::UNAUTHENTICATED);
}

TEST_F(BadRequestsTest, RegionRegistrationErrors) {
  hsap::v1::RegisterRegionRequest r;
  r.set_size_bytes(64);
  r.mutable_memfd()->set_transfer_id(777);
  auto resp = client_->RegisterRegion(r);
  EXPECT_EQ(resp.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(resp.status().message()), HasSubstr("memfd.transfer_id 777"));
  r.mutable_shm()->set_name("/../etc/passwd");
  resp = client_->RegisterRegion(r);
  EXPECT_EQ(resp.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(resp.status().message()), HasSubstr("shm.name"));
  r.set_size_bytes(0);
  EXPECT_EQ(client_->RegisterRegion(r).status().code(), absl::StatusCode::kInvalidArgument);
  // A memfd smaller than the size asked for.
  const int fd = memfd_create("small", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_EQ(ftruncate(fd, 100), 0);
  ASSERT_TRUE(client_->PassFd(fd, 5).ok());
  close(fd);
  r.mutable_memfd()->set_transfer_id(5);
  r.set_size_bytes(4096);
  resp = client_->RegisterRegion(r);
  EXPECT_EQ(resp.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(resp.status().message()), HasSubstr("size_bytes is 4096"));
}

}  // namespace
}  // namespace hsap
