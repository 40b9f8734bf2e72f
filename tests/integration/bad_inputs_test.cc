// Malformed input of every kind, sent over the real sockets of a real hsapd
// process: bad attention and region requests over the Unix gRPC socket,
// replayed and skipped call_seq, bad session-socket messages (wrong types,
// several fds, none, truncated, oversized), raw garbage on the Unix gRPC
// socket and the TCP port, an oversized request, and clients that go away in
// the middle of a collective call (a cancelled channel, a killed process).
//
// Table-driven: each case is (name, action, expected code, substring of the
// message). After all of them the daemon must still be SERVING, run a good
// call, and — once every client is gone — hold no more fds than when it
// started and no memfd mapping at all.
//
// Cases on raw byte streams have no gRPC status; they report the test's
// reading of what the daemon did: UNAVAILABLE "closed the connection" when
// it hung up (with the HTTP/2 GOAWAY error code, if it sent one),
// DEADLINE_EXCEEDED when it still held the connection open after 5 s.
// Session-socket messages report the SessionFdAck's code, or, when the
// daemon closed the session, the status of a gRPC call made afterwards with
// that session's credentials (UNAUTHENTICATED: the session is gone).
//
// The binary doubles as a helper process: `bad_inputs_test --rank0_helper
// <socket> <tokens>` connects, registers buffers, prints "ready" and blocks
// in a 2-rank forward call whose rank 1 never comes; the test kills it.
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <future>
#include <limits>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/cpp/attention_buffers.h"
#include "client/cpp/hsap_client.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/byte_buffer.h"
#include "gtest/gtest.h"
#include "hsap/v1/cluster.grpc.pb.h"
#include "hsap/v1/plans.grpc.pb.h"
#include "hsap/v1/regions.pb.h"
#include "tests/integration/local_cluster.h"
#include "tests/integration/raw_daemon_io.h"
#include "tests/integration/test_daemon.h"

namespace hsap {
namespace {

using Code = absl::StatusCode;

constexpr int64_t kTokens = 64;
constexpr int64_t kHq = 4, kHkv = 2, kD = 32;
const std::vector<int64_t> kCu = {0, 10, 10, 40, kTokens};

absl::Status FromGrpc(const grpc::Status& st) {
  return absl::Status(static_cast<Code>(st.error_code()), st.error_message());
}

using namespace ::hsap::testing;  // raw_daemon_io.h

// ---------------------------------------------------------------------------
// The environment every case runs against.

struct Env {
  std::unique_ptr<testing::DaemonProcess> daemon;
  int port = 0;
  std::unique_ptr<client::Client> client;
  std::unique_ptr<client::AttentionBuffers> buf;
  std::unique_ptr<client::Client> other;  // a second session
  std::unique_ptr<client::AttentionBuffers> other_buf;
  int64_t rank0_tokens = 0, rank1_tokens = 0;  // the 2-rank dispatch of kCu

  hsap::v1::CallId Call(const std::string& group = "bad", uint64_t seq = 1) const {
    hsap::v1::CallId id;
    id.set_group(group);
    id.set_group_size(1);
    id.set_call_seq(seq);
    return id;
  }
  hsap::v1::AttentionForwardRequest Good() const {
    return buf->ForwardRequest(Call(), client::DocumentMask(kCu, true), {});
  }
  hsap::v1::AttentionBackwardRequest GoodBackward() const {
    return buf->BackwardRequest(Call(), client::DocumentMask(kCu, true), {});
  }
  absl::Status Forward(const hsap::v1::AttentionForwardRequest& r) const {
    return client->Forward(r).status();
  }
  absl::Status Backward(const hsap::v1::AttentionBackwardRequest& r) const {
    return client->Backward(r).status();
  }
  // Waits up to 10 s until no memfd named `name` is mapped in the daemon.
  absl::Status WaitUnmapped(const std::string& name) const {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (CountMemfdMappings(daemon->Maps(), name) > 0) {
      if (absl::Now() > deadline) {
        return absl::InternalError(absl::StrCat("memfd '", name, "' is still mapped in the daemon"));
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
    return absl::OkStatus();
  }
};

// Rank `rank` of a 2-rank group on this daemon (tokens from the dispatch).
absl::StatusOr<std::unique_ptr<client::AttentionBuffers>> RankBuffers(client::Client* c,
                                                                      int64_t tokens,
                                                                      const std::string& name) {
  auto b = client::AttentionBuffers::Create(c, {tokens, kHq, kHkv, kD, DType::kFloat32}, name);
  if (b.ok()) (*b)->FillInputs(7);
  return b;
}

hsap::v1::CallId TwoRankCall(const std::string& group, int rank, uint64_t seq) {
  hsap::v1::CallId id;
  id.set_group(group);
  id.set_group_size(2);
  id.set_rank(rank);
  id.set_call_seq(seq);
  return id;
}

hsap::v1::CallOptions Deadline(uint32_t ms) {
  hsap::v1::CallOptions o;
  o.set_deadline_ms(ms);
  return o;
}

// The helper process (see the file comment).
int Rank0Helper(const std::string& socket, int64_t tokens) {
  auto c = client::Client::Connect(socket);
  if (!c.ok()) return 2;
  auto b = RankBuffers(c->get(), tokens, "killed-rank0");
  if (!b.ok()) return 3;
  const auto req = (*b)->ForwardRequest(TwoRankCall("killed", 0, 1), client::DocumentMask(kCu, true),
                                        Deadline(1500));
  std::printf("ready\n");
  std::fflush(stdout);
  (void)(*c)->Forward(req);  // blocks until killed (or the deadline)
  return 4;
}

// Starts the helper, waits for "ready", lets it enter the call, kills it.
absl::Status RunAndKillHelper(const Env& env) {
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) return absl::InternalError("pipe failed");
  const std::string self = "/proc/self/exe";
  const std::string tokens = std::to_string(env.rank0_tokens);
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    dup2(out[1], 1);
    execl(self.c_str(), self.c_str(), "--rank0_helper", env.daemon->socket().c_str(),
          tokens.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  close(out[1]);
  UniqueFd read_end(out[0]);
  pollfd p = {read_end.get(), POLLIN, 0};
  char buf[16] = {};
  const bool ready = poll(&p, 1, 20000) == 1 && read(read_end.get(), buf, sizeof(buf) - 1) > 0;
  absl::SleepFor(absl::Milliseconds(500));  // inside Forward, waiting for rank 1
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!ready) return absl::InternalError("the helper did not get ready within 20 s");
  if (!WIFSIGNALED(status)) {
    return absl::InternalError(absl::StrCat("the helper left the call before the kill, status ",
                                            status));
  }
  return absl::OkStatus();
}

struct Case {
  std::string name;
  std::function<absl::Status(Env&)> run;
  Code code;
  std::string text;
};

template <typename Edit>
std::function<absl::Status(Env&)> EditForward(Edit edit) {
  return [edit](Env& e) {
    auto r = e.Good();
    edit(e, r);
    return e.Forward(r);
  };
}

template <typename Edit>
std::function<absl::Status(Env&)> EditBackward(Edit edit) {
  return [edit](Env& e) {
    auto r = e.GoodBackward();
    edit(e, r);
    return e.Backward(r);
  };
}

using Fwd = hsap::v1::AttentionForwardRequest;
using Bwd = hsap::v1::AttentionBackwardRequest;

absl::Status Register(Env& e, const hsap::v1::RegisterRegionRequest& r) {
  return e.client->RegisterRegion(r).status();
}

// A raw gRPC call: `bytes` as the serialized request of `method`.
absl::Status RawCall(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
                     const std::string& bytes, const client::Client* session = nullptr) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  if (session != nullptr) session->Authorize(&ctx);
  grpc::Slice slice(bytes);
  grpc::ByteBuffer request(&slice, 1), response;
  std::promise<grpc::Status> done;
  stub.UnaryCall(&ctx, method, grpc::StubOptions(), &request, &response,
                 [&done](grpc::Status st) { done.set_value(st); });
  return FromGrpc(done.get_future().get());
}

std::shared_ptr<grpc::Channel> TcpChannel(int port) {
  return grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials());
}

std::vector<Case> Cases() {
  const uint64_t u64max = std::numeric_limits<uint64_t>::max();
  std::vector<Case> c;
  // --- Tensor references: regions, offsets, sizes.
  c.push_back({"q_unknown_region", EditForward([](Env&, Fwd& r) { r.mutable_q()->set_region_id(999); }),
               Code::kNotFound, "q.region_id 999"});
  c.push_back({"k_offset_overflows", EditForward([=](Env&, Fwd& r) { r.mutable_k()->set_offset(u64max - 8); }),
               Code::kInvalidArgument, "k spans bytes [18446744073709551607"});
  c.push_back({"v_past_region_end", EditForward([](Env& e, Fwd& r) {
                 r.mutable_v()->set_offset(e.buf->buffer().size() - 16); }),
               Code::kInvalidArgument, "past the end of its region"});
  c.push_back({"q_numel_overflows", EditForward([](Env&, Fwd& r) {
                 r.mutable_q()->set_shape(0, int64_t{1} << 40);
                 r.mutable_q()->set_shape(1, int64_t{1} << 40); }),
               Code::kInvalidArgument, "overflows"});
  c.push_back({"o_negative_dim", EditForward([](Env&, Fwd& r) { r.mutable_o()->set_shape(2, -32); }),
               Code::kInvalidArgument, "o.shape[2] is -32"});
  c.push_back({"q_absurd_tokens", EditForward([](Env&, Fwd& r) {
                 for (auto* t : {r.mutable_q(), r.mutable_k(), r.mutable_v(), r.mutable_o()})
                   t->set_shape(0, int64_t{1} << 50); }),
               Code::kInvalidArgument, "q spans bytes"});
  c.push_back({"all_zero_tokens", EditForward([](Env&, Fwd& r) {
                 for (auto* t : {r.mutable_q(), r.mutable_k(), r.mutable_v(), r.mutable_o()})
                   t->set_shape(0, 0);
                 r.mutable_lse()->set_shape(1, 0); }),
               Code::kInvalidArgument, "q.shape[0] is 0"});
  c.push_back({"k_region_of_other_session", EditForward([](Env& e, Fwd& r) {
                 r.mutable_k()->set_region_id(e.other_buf->buffer().region_id()); }),
               Code::kNotFound, "k.region_id"});
  c.push_back({"o_region_of_other_session", EditForward([](Env& e, Fwd& r) {
                 r.mutable_o()->set_region_id(e.other_buf->buffer().region_id()); }),
               Code::kNotFound, "o.region_id"});
  c.push_back({"stale_region_after_unregister", [](Env& e) {
                 auto b = e.client->CreateBuffer(1 << 16, "stale");
                 if (!b.ok()) return b.status();
                 const uint64_t id = (*b)->region_id();
                 absl::Status st = e.client->Unregister(id);
                 if (!st.ok()) return st;
                 auto r = e.Good();
                 r.mutable_v()->set_region_id(id);
                 r.mutable_v()->set_offset(0);
                 return e.Forward(r);
               }, Code::kNotFound, "v.region_id"});
  // --- Shapes.
  c.push_back({"v_tokens_mismatch", EditForward([](Env&, Fwd& r) { r.mutable_v()->set_shape(0, kTokens - 1); }),
               Code::kInvalidArgument, "v.shape is [63, 2, 32] but k.shape needs [64, 2, 32]"});
  c.push_back({"o_heads_mismatch", EditForward([](Env&, Fwd& r) { r.mutable_o()->set_shape(1, 2); }),
               Code::kInvalidArgument, "o.shape is [64, 2, 32]"});
  c.push_back({"lse_shape_mismatch", EditForward([](Env&, Fwd& r) { r.mutable_lse()->set_shape(1, 3); }),
               Code::kInvalidArgument, "lse.shape is [4, 3]"});
  c.push_back({"q_four_dims", EditForward([](Env&, Fwd& r) { r.mutable_q()->add_shape(1); }),
               Code::kInvalidArgument, "it must have 3 dimensions"});
  c.push_back({"q_two_dims", EditForward([](Env&, Fwd& r) { r.mutable_q()->mutable_shape()->RemoveLast(); }),
               Code::kInvalidArgument, "it must have 3 dimensions"});
  c.push_back({"hkv_not_dividing_hq", EditForward([](Env&, Fwd& r) {
                 r.mutable_k()->set_shape(1, 3);
                 r.mutable_v()->set_shape(1, 3); }),
               Code::kInvalidArgument, "k.shape[1] (Hkv) is 3 but Hq = 4"});
  c.push_back({"hkv_zero", EditForward([](Env&, Fwd& r) {
                 r.mutable_k()->set_shape(1, 0);
                 r.mutable_v()->set_shape(1, 0); }),
               Code::kInvalidArgument, "k.shape[1] (Hkv) is 0"});
  c.push_back({"head_dim_20", EditForward([](Env&, Fwd& r) {
                 for (auto* t : {r.mutable_q(), r.mutable_k(), r.mutable_v(), r.mutable_o()}) t->set_shape(2, 20); }),
               Code::kInvalidArgument, "q.shape[2] (head_dim) is 20"});
  c.push_back({"head_dim_264", [](Env& e) {
                 auto b = client::AttentionBuffers::Create(e.client.get(), {kTokens, kHq, kHkv, 264, DType::kFloat32}, "hd264");
                 if (!b.ok()) return b.status();
                 return e.Forward((*b)->ForwardRequest(e.Call(), client::DocumentMask(kCu, true), {}));
               }, Code::kInvalidArgument, "q.shape[2] (head_dim) is 264"});
  c.push_back({"head_dim_36_not_multiple_of_8", EditForward([](Env&, Fwd& r) {
                 for (auto* t : {r.mutable_q(), r.mutable_k(), r.mutable_v(), r.mutable_o()}) t->set_shape(2, 36); }),
               Code::kInvalidArgument, "q.shape[2] (head_dim) is 36"});
  // --- Dtypes.
  c.push_back({"k_dtype_bf16_vs_fp32", EditForward([](Env&, Fwd& r) { r.mutable_k()->set_dtype(hsap::v1::DTYPE_BFLOAT16); }),
               Code::kInvalidArgument, "k.dtype is DTYPE_BFLOAT16 but q.dtype is DTYPE_FLOAT32"});
  c.push_back({"q_dtype_int32", EditForward([](Env&, Fwd& r) { r.mutable_q()->set_dtype(hsap::v1::DTYPE_INT32); }),
               Code::kInvalidArgument, "q.dtype is DTYPE_INT32"});
  c.push_back({"lse_dtype_fp16", EditForward([](Env&, Fwd& r) { r.mutable_lse()->set_dtype(hsap::v1::DTYPE_FLOAT16); }),
               Code::kInvalidArgument, "lse.dtype is DTYPE_FLOAT16"});
  c.push_back({"all_dtypes_unspecified", EditForward([](Env&, Fwd& r) {
                 for (auto* t : {r.mutable_q(), r.mutable_k(), r.mutable_v(), r.mutable_o(), r.mutable_lse()})
                   t->set_dtype(hsap::v1::DTYPE_UNSPECIFIED); }),
               Code::kInvalidArgument, "q.dtype is DTYPE_UNSPECIFIED"});
  c.push_back({"q_dtype_enum_99", EditForward([](Env&, Fwd& r) { r.mutable_q()->set_dtype(static_cast<hsap::v1::DType>(99)); }),
               Code::kInvalidArgument, "q.dtype"});
  // --- Masks.
  c.push_back({"cu_seqlens_not_from_zero", EditForward([](Env&, Fwd& r) {
                 r.mutable_mask()->mutable_cu_seqlens()->mutable_inline_values()->set_values(0, 1); }),
               Code::kInvalidArgument, "mask.cu_seqlens[0] is 1"});
  c.push_back({"cu_seqlens_decreasing", EditForward([](Env&, Fwd& r) {
                 r.mutable_mask()->mutable_cu_seqlens()->mutable_inline_values()->set_values(2, 5); }),
               Code::kInvalidArgument, "mask.cu_seqlens decreases at index 2: 10 then 5"});
  c.push_back({"cu_seqlens_negative", EditForward([](Env&, Fwd& r) {
                 r.mutable_mask()->mutable_cu_seqlens()->mutable_inline_values()->set_values(1, -5); }),
               Code::kInvalidArgument, "mask.cu_seqlens decreases at index 1"});
  c.push_back({"cu_seqlens_short_of_tokens", EditForward([](Env&, Fwd& r) {
                 r.mutable_mask()->mutable_cu_seqlens()->mutable_inline_values()->set_values(4, kTokens - 1); }),
               Code::kInvalidArgument, "the mask covers 63 tokens"});
  c.push_back({"cu_seqlens_empty", EditForward([](Env&, Fwd& r) {
                 r.mutable_mask()->mutable_cu_seqlens()->mutable_inline_values()->clear_values(); }),
               Code::kInvalidArgument, "mask.cu_seqlens is empty"});
  c.push_back({"cu_seqlens_tensor_float32", EditForward([](Env& e, Fwd& r) {
                 *r.mutable_mask()->mutable_cu_seqlens()->mutable_tensor() =
                     e.buf->buffer().Ref(0, {5}, hsap::v1::DTYPE_FLOAT32); }),
               Code::kInvalidArgument, "mask.cu_seqlens.tensor.dtype is DTYPE_FLOAT32"});
  c.push_back({"cu_seqlens_tensor_unknown_region", EditForward([](Env&, Fwd& r) {
                 auto* t = r.mutable_mask()->mutable_cu_seqlens()->mutable_tensor();
                 t->set_region_id(4242);
                 t->add_shape(5);
                 t->set_dtype(hsap::v1::DTYPE_INT32); }),
               Code::kNotFound, "4242"});
  c.push_back({"cu_seqlens_tensor_offset_overflows", EditForward([=](Env& e, Fwd& r) {
                 *r.mutable_mask()->mutable_cu_seqlens()->mutable_tensor() =
                     e.buf->buffer().Ref(u64max - 3, {5}, hsap::v1::DTYPE_INT64); }),
               Code::kInvalidArgument, "mask.cu_seqlens.tensor spans bytes"});
  c.push_back({"cu_seqlens_tensor_2d", EditForward([](Env& e, Fwd& r) {
                 *r.mutable_mask()->mutable_cu_seqlens()->mutable_tensor() =
                     e.buf->buffer().Ref(0, {5, 2}, hsap::v1::DTYPE_INT32); }),
               Code::kInvalidArgument, "mask.cu_seqlens.tensor.shape"});
  c.push_back({"mask_unset", EditForward([](Env&, Fwd& r) { r.clear_mask(); }),
               Code::kInvalidArgument, "mask has neither cu_seqlens nor slices"});
  c.push_back({"window_without_causal", EditForward([](Env&, Fwd& r) {
                 r.mutable_mask()->set_causal(false);
                 r.mutable_mask()->set_window_left(4); }),
               Code::kInvalidArgument, "mask.window_left is 4 but mask.causal is false"});
  c.push_back({"window_minus_7", EditForward([](Env&, Fwd& r) { r.mutable_mask()->set_window_left(-7); }),
               Code::kInvalidArgument, "mask.window_left is -7"});
  c.push_back({"window_int64_max", EditForward([](Env&, Fwd& r) {
                 r.mutable_mask()->set_window_left(std::numeric_limits<int64_t>::max()); }),
               Code::kInvalidArgument, "mask.window_left is 9223372036854775807; it must be at most 2^"});
  c.push_back({"slice_query_range_past_end", EditForward([](Env&, Fwd& r) {
                 auto* s = r.mutable_mask()->mutable_slices();
                 s->set_total_tokens(kTokens);
                 auto* slice = s->add_slices();
                 slice->set_q_end(kTokens + 1);
                 slice->set_k_end(4); }),
               Code::kInvalidArgument, "mask.slices[0] query range [0, 65)"});
  c.push_back({"slices_total_tokens_absurd", EditForward([](Env&, Fwd& r) {
                 auto* s = r.mutable_mask()->mutable_slices();
                 s->set_total_tokens(int64_t{1} << 62);
                 auto* slice = s->add_slices();
                 slice->set_q_end(4);
                 slice->set_k_end(4); }),
               Code::kInvalidArgument, "mask.slices.total_tokens is"});
  c.push_back({"slice_negative_begin", EditForward([](Env&, Fwd& r) {
                 auto* s = r.mutable_mask()->mutable_slices();
                 s->set_total_tokens(kTokens);
                 auto* slice = s->add_slices();
                 slice->set_q_begin(-3);
                 slice->set_q_end(4);
                 slice->set_k_end(4); }),
               Code::kInvalidArgument, "mask.slices[0] query range [-3, 4)"});
  // --- Call identity and options.
  c.push_back({"rank_out_of_group", EditForward([](Env&, Fwd& r) { r.mutable_call()->set_rank(1); }),
               Code::kInvalidArgument, "call.rank is 1"});
  c.push_back({"rank_negative", EditForward([](Env&, Fwd& r) { r.mutable_call()->set_rank(-1); }),
               Code::kInvalidArgument, "call.rank is -1"});
  c.push_back({"group_empty", EditForward([](Env&, Fwd& r) { r.mutable_call()->set_group(""); }),
               Code::kInvalidArgument, "call.group has 0 bytes"});
  c.push_back({"group_name_1MiB", EditForward([](Env&, Fwd& r) { r.mutable_call()->set_group(std::string(1 << 20, 'g')); }),
               Code::kInvalidArgument, "call.group has 1048576 bytes"});
  c.push_back({"call_seq_zero", EditForward([](Env&, Fwd& r) { r.mutable_call()->set_call_seq(0); }),
               Code::kInvalidArgument, "call.call_seq is 0"});
  c.push_back({"group_size_zero", EditForward([](Env&, Fwd& r) { r.mutable_call()->set_group_size(0); }),
               Code::kInvalidArgument, "call.group_size is 0"});
  c.push_back({"group_size_3_on_2_slots", EditForward([](Env&, Fwd& r) { r.mutable_call()->set_group_size(3); }),
               Code::kUnimplemented, "call.group_size is 3"});
  c.push_back({"softmax_scale_negative", EditForward([](Env&, Fwd& r) { r.mutable_options()->set_softmax_scale(-1.f); }),
               Code::kInvalidArgument, "options.softmax_scale is -1"});
  c.push_back({"softmax_scale_nan", EditForward([](Env&, Fwd& r) {
                 r.mutable_options()->set_softmax_scale(std::numeric_limits<float>::quiet_NaN()); }),
               Code::kInvalidArgument, "options.softmax_scale is nan"});
  c.push_back({"softmax_scale_inf", EditForward([](Env&, Fwd& r) {
                 r.mutable_options()->set_softmax_scale(std::numeric_limits<float>::infinity()); }),
               Code::kInvalidArgument, "options.softmax_scale is inf"});
  c.push_back({"strategy_enum_99", EditForward([](Env&, Fwd& r) {
                 r.mutable_options()->set_strategy(static_cast<hsap::v1::Strategy>(99)); }),
               Code::kInvalidArgument, "options.strategy 99 is unknown"});
  c.push_back({"assignment_enum_77", EditForward([](Env&, Fwd& r) {
                 r.mutable_options()->set_assignment(static_cast<hsap::v1::AssignmentPolicy>(77)); }),
               Code::kInvalidArgument, "options.assignment 77 is unknown"});
  c.push_back({"o_overlaps_q", EditForward([](Env&, Fwd& r) { r.mutable_o()->set_offset(r.q().offset() + 64); }),
               Code::kInvalidArgument, "overlaps q"});
  c.push_back({"lse_overlaps_o", EditForward([](Env&, Fwd& r) { r.mutable_lse()->set_offset(r.o().offset()); }),
               Code::kInvalidArgument, "overlaps"});
  // --- Backward.
  c.push_back({"bwd_dk_heads_mismatch", EditBackward([](Env&, Bwd& r) { r.mutable_dk()->set_shape(1, 4); }),
               Code::kInvalidArgument, "dk.shape is [64, 4, 32]"});
  c.push_back({"bwd_d_o_unknown_region", EditBackward([](Env&, Bwd& r) { r.mutable_d_o()->set_region_id(12345); }),
               Code::kNotFound, "d_o.region_id 12345"});
  c.push_back({"bwd_dq_overlaps_dk", EditBackward([](Env&, Bwd& r) { r.mutable_dq()->set_offset(r.dk().offset()); }),
               Code::kInvalidArgument, "overlaps"});
  c.push_back({"bwd_dv_dtype_bf16", EditBackward([](Env&, Bwd& r) { r.mutable_dv()->set_dtype(hsap::v1::DTYPE_BFLOAT16); }),
               Code::kInvalidArgument, "dv.dtype is DTYPE_BFLOAT16"});
  // --- Sessions on gRPC.
  c.push_back({"no_session_metadata", [](Env& e) {
                 auto stub = hsap::v1::Attention::NewStub(e.client->channel());
                 grpc::ClientContext ctx;
                 hsap::v1::AttentionForwardResponse resp;
                 return FromGrpc(stub->Forward(&ctx, e.Good(), &resp));
               }, Code::kUnauthenticated, "carries no hsap-session-id"});
  c.push_back({"wrong_session_token", [](Env& e) {
                 auto stub = hsap::v1::Attention::NewStub(e.client->channel());
                 grpc::ClientContext ctx;
                 ctx.AddMetadata("hsap-session-id", std::to_string(e.client->session_id()));
                 ctx.AddMetadata("hsap-session-token", std::string(32, '0'));
                 hsap::v1::AttentionForwardResponse resp;
                 return FromGrpc(stub->Forward(&ctx, e.Good(), &resp));
               }, Code::kUnauthenticated, "is not a live session"});
  c.push_back({"session_id_not_a_number", [](Env& e) {
                 auto stub = hsap::v1::Attention::NewStub(e.client->channel());
                 grpc::ClientContext ctx;
                 ctx.AddMetadata("hsap-session-id", "12abc");
                 ctx.AddMetadata("hsap-session-token", e.client->session_token());
                 hsap::v1::AttentionForwardResponse resp;
                 return FromGrpc(stub->Forward(&ctx, e.Good(), &resp));
               }, Code::kUnauthenticated, "'12abc' is not a number"});
  c.push_back({"credentials_of_closed_session", [](Env& e) {
                 auto gone = client::Client::Connect(e.daemon->socket());
                 if (!gone.ok()) return gone.status();
                 const std::string id = std::to_string((*gone)->session_id());
                 const std::string token = (*gone)->session_token();
                 gone->reset();
                 const absl::Time deadline = absl::Now() + absl::Seconds(5);
                 while (true) {  // the daemon ends the session when it sees the hang-up
                   auto stub = hsap::v1::Attention::NewStub(e.client->channel());
                   grpc::ClientContext ctx;
                   ctx.AddMetadata("hsap-session-id", id);
                   ctx.AddMetadata("hsap-session-token", token);
                   hsap::v1::AttentionForwardResponse resp;
                   absl::Status st = FromGrpc(stub->Forward(&ctx, e.Good(), &resp));
                   if (st.code() == Code::kUnauthenticated || absl::Now() > deadline) return st;
                   absl::SleepFor(absl::Milliseconds(20));
                 }
               }, Code::kUnauthenticated, "is not a live session"});
  // --- call_seq: each rank's calls of a group are numbered k, k+1, ...
  c.push_back({"call_seq_replayed", [](Env& e) {
                 auto r = e.Good();
                 *r.mutable_call() = e.Call("seq", 1);
                 absl::Status first = e.Forward(r);
                 if (!first.ok()) return first;
                 return e.Forward(r);
               }, Code::kFailedPrecondition, "call.call_seq is 1 but rank 0 of group 'seq' last submitted 1 (a replay)"});
  c.push_back({"call_seq_skipped", [](Env& e) {
                 auto r = e.Good();
                 *r.mutable_call() = e.Call("seq", 3);
                 return e.Forward(r);
               }, Code::kFailedPrecondition, "last submitted 1 (a skip); the next must be 2"});
  c.push_back({"group_size_changed_midway", [](Env& e) {
                 auto b = RankBuffers(e.client.get(), e.rank0_tokens, "resize");
                 if (!b.ok()) return b.status();
                 return e.Forward((*b)->ForwardRequest(TwoRankCall("seq", 0, 2),
                                                       client::DocumentMask(kCu, true), Deadline(2000)));
               }, Code::kInvalidArgument, "call.group_size is 2 but group 'seq' has size 1"});
  c.push_back({"tokens_not_as_dispatched", EditForward([](Env&, Fwd& r) {
                 *r.mutable_call() = TwoRankCall("layout", 0, 1); }),
               Code::kInvalidArgument, "but the plan's dispatch gives rank 0 of 2"});
  c.push_back({"missing_rank_deadline", [](Env& e) {
                 auto b = RankBuffers(e.client.get(), e.rank0_tokens, "lonely");
                 if (!b.ok()) return b.status();
                 return e.Forward((*b)->ForwardRequest(TwoRankCall("lonely", 0, 1),
                                                       client::DocumentMask(kCu, true), Deadline(300)));
               }, Code::kDeadlineExceeded, "rank(s) 1 did not arrive before the deadline"});
  // --- Clients that go away inside a collective call.
  c.push_back({"cancelled_while_waiting_for_rank1", [](Env& e) {
                 auto c2 = client::Client::Connect(e.daemon->socket());
                 if (!c2.ok()) return c2.status();
                 auto b = RankBuffers(c2->get(), e.rank0_tokens, "cancelled-rank0");
                 if (!b.ok()) return b.status();
                 // A 60 s call deadline: the regions must be released because
                 // the client cancelled (the daemon polls for it while the rank
                 // waits for its group), not because the deadline passed
                 // (WaitUnmapped gives up after 10 s).
                 const auto req = (*b)->ForwardRequest(TwoRankCall("cancelled", 0, 1),
                                                       client::DocumentMask(kCu, true), Deadline(60000));
                 auto stub = hsap::v1::Attention::NewStub((*c2)->channel());
                 grpc::ClientContext ctx;
                 (*c2)->Authorize(&ctx);
                 ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
                 std::thread canceller([&ctx] {
                   absl::SleepFor(absl::Milliseconds(400));
                   ctx.TryCancel();
                 });
                 hsap::v1::AttentionForwardResponse resp;
                 const absl::Status st = FromGrpc(stub->Forward(&ctx, req, &resp));
                 canceller.join();
                 b->reset();
                 c2->reset();  // the session ends
                 absl::Status freed = e.WaitUnmapped("cancelled-rank0");
                 return freed.ok() ? st : freed;
               }, Code::kCancelled, "CANCELLED"});
  c.push_back({"client_killed_while_waiting_then_late_rank1", [](Env& e) {
                 absl::Status killed = RunAndKillHelper(e);
                 if (!killed.ok()) return killed;
                 // Rank 0's client died while it waited: its call failed at once
                 // (CANCELLED), and the late rank 1 gets the same failure.
                 absl::SleepFor(absl::Milliseconds(1500));
                 auto b = RankBuffers(e.client.get(), e.rank1_tokens, "late-rank1");
                 if (!b.ok()) return b.status();
                 auto req = (*b)->ForwardRequest(TwoRankCall("killed", 1, 1),
                                                 client::DocumentMask(kCu, true), Deadline(1500));
                 const absl::Status st = e.Forward(req);
                 absl::Status freed = e.WaitUnmapped("killed-rank0");
                 return freed.ok() ? st : freed;
               }, Code::kCancelled,
              "call 1 of group 'killed': the client of rank 0 cancelled the call or went away"});
  // --- Regions.
  c.push_back({"register_unknown_transfer", [](Env& e) {
                 hsap::v1::RegisterRegionRequest r;
                 r.set_size_bytes(64);
                 r.mutable_memfd()->set_transfer_id(777);
                 return Register(e, r);
               }, Code::kNotFound, "memfd.transfer_id 777"});
  c.push_back({"register_transfer_of_other_session", [](Env& e) {
                 UniqueFd fd = NewMemfd("other-transfer", 4096);
                 absl::Status st = e.other->PassFd(fd.get(), 31337);
                 if (!st.ok()) return st;
                 hsap::v1::RegisterRegionRequest r;
                 r.set_size_bytes(4096);
                 r.mutable_memfd()->set_transfer_id(31337);
                 return Register(e, r);
               }, Code::kNotFound, "memfd.transfer_id 31337"});
  c.push_back({"register_size_zero", [](Env& e) {
                 hsap::v1::RegisterRegionRequest r;
                 r.mutable_shm()->set_name("/x");
                 return Register(e, r);
               }, Code::kInvalidArgument, "size_bytes is 0"});
  c.push_back({"register_memfd_smaller_than_size", [](Env& e) {
                 UniqueFd fd = NewMemfd("small", 100);
                 absl::Status st = e.client->PassFd(fd.get(), 5);
                 if (!st.ok()) return st;
                 hsap::v1::RegisterRegionRequest r;
                 r.mutable_memfd()->set_transfer_id(5);
                 r.set_size_bytes(4096);
                 return Register(e, r);
               }, Code::kInvalidArgument, "size_bytes is 4096"});
  c.push_back({"register_absurd_size", [](Env& e) {
                 UniqueFd fd = NewMemfd("absurd", 4096);
                 absl::Status st = e.client->PassFd(fd.get(), 6);
                 if (!st.ok()) return st;
                 hsap::v1::RegisterRegionRequest r;
                 r.mutable_memfd()->set_transfer_id(6);
                 r.set_size_bytes(uint64_t{1} << 63);
                 return Register(e, r);
               }, Code::kInvalidArgument, "size_bytes is 9223372036854775808"});
  c.push_back({"register_pipe_not_memfd", [](Env& e) {
                 int p[2];
                 if (pipe2(p, O_CLOEXEC) != 0) return absl::InternalError("pipe");
                 UniqueFd r0(p[0]), r1(p[1]);
                 absl::Status st = e.client->PassFd(p[0], 7);
                 if (!st.ok()) return st;
                 hsap::v1::RegisterRegionRequest r;
                 r.mutable_memfd()->set_transfer_id(7);
                 r.set_size_bytes(64);
                 return Register(e, r);
               }, Code::kInvalidArgument, "not a memfd or shared-memory object"});
  c.push_back({"register_shm_path_traversal", [](Env& e) {
                 hsap::v1::RegisterRegionRequest r;
                 r.set_size_bytes(64);
                 r.mutable_shm()->set_name("/../etc/passwd");
                 return Register(e, r);
               }, Code::kInvalidArgument, "shm.name"});
  c.push_back({"register_shm_missing", [](Env& e) {
                 hsap::v1::RegisterRegionRequest r;
                 r.set_size_bytes(64);
                 r.mutable_shm()->set_name("/hsap-bad-inputs-no-such-object");
                 return Register(e, r);
               }, Code::kNotFound, "does not exist"});
  c.push_back({"register_no_source", [](Env& e) {
                 hsap::v1::RegisterRegionRequest r;
                 r.set_size_bytes(64);
                 return Register(e, r);
               }, Code::kInvalidArgument, "source is not set"});
  c.push_back({"register_cuda_ipc_on_cpu", [](Env& e) {
                 hsap::v1::RegisterRegionRequest r;
                 r.set_size_bytes(64);
                 r.mutable_cuda_ipc()->set_handle(std::string(64, 'h'));
                 return Register(e, r);
               }, Code::kFailedPrecondition, ""});
  c.push_back({"unregister_unknown", [](Env& e) { return e.client->Unregister(987654); },
               Code::kNotFound, "region_id 987654"});
  c.push_back({"unregister_other_sessions_region", [](Env& e) {
                 return e.client->Unregister(e.other_buf->buffer().region_id()); },
               Code::kNotFound, "is not registered by this session"});
  c.push_back({"unregister_twice", [](Env& e) {
                 auto b = e.client->CreateBuffer(4096, "twice");
                 if (!b.ok()) return b.status();
                 absl::Status st = e.client->Unregister((*b)->region_id());
                 if (!st.ok()) return st;
                 return e.client->Unregister((*b)->region_id());
               }, Code::kNotFound, "is not registered by this session"});
  // --- The session socket.
  auto session_case = [](std::function<absl::Status(RawSession&)> send) {
    return [send](Env& e) {
      RawSession s;
      absl::Status st = s.Open(e.daemon->socket());
      if (!st.ok()) return st;
      st = send(s);
      if (!st.ok()) return st;
      return s.Outcome(e.daemon->socket());
    };
  };
  auto sent = [](bool ok) { return ok ? absl::OkStatus() : absl::InternalError("sendmsg failed"); };
  c.push_back({"session_transfer_without_fd", session_case([=](RawSession& s) {
                 return sent(s.Send(TransferMessage(1), {})); }),
               Code::kInvalidArgument, "carries 0 file descriptors; it needs exactly 1"});
  c.push_back({"session_transfer_with_two_fds", session_case([=](RawSession& s) {
                 UniqueFd a = NewMemfd("two-a", 4096), b = NewMemfd("two-b", 4096);
                 return sent(s.Send(TransferMessage(2), {a.get(), b.get()})); }),
               Code::kInvalidArgument, "carries 2 file descriptors"});
  c.push_back({"session_transfer_with_eight_fds", session_case([=](RawSession& s) {
                 std::vector<UniqueFd> fds;
                 std::vector<int> raw;
                 for (int i = 0; i < 8; ++i) {
                   fds.push_back(NewMemfd("eight", 4096));
                   raw.push_back(fds.back().get());
                 }
                 return sent(s.Send(TransferMessage(3), raw)); }),
               Code::kUnauthenticated, "session closed by the daemon"});
  c.push_back({"session_wrong_type_hello_echoed", session_case([=](RawSession& s) {
                 return sent(s.Send(s.hello().SerializeAsString(), {})); }),
               Code::kInvalidArgument, "carries 0 file descriptors"});
  c.push_back({"session_wrong_type_register_request", session_case([=](RawSession& s) {
                 hsap::v1::RegisterRegionRequest r;
                 r.set_name("not-a-transfer");
                 r.set_size_bytes(64);
                 UniqueFd fd = NewMemfd("wrongtype", 4096);
                 return sent(s.Send(r.SerializeAsString(), {fd.get()})); }),
               Code::kInvalidArgument, "SessionFdTransfer.transfer_id is 0 (unset)"});
  // transfer_id 0 serializes to 0 bytes: an empty message, read as a hang-up.
  c.push_back({"session_empty_message_with_fd", session_case([=](RawSession& s) {
                 UniqueFd fd = NewMemfd("zero", 4096);
                 return sent(s.Send(TransferMessage(0), {fd.get()})); }),
               Code::kUnauthenticated, "session closed by the daemon"});
  c.push_back({"session_random_garbage", session_case([=](RawSession& s) {
                 return sent(s.Send(RandomBytes(200, 1), {})); }),
               Code::kUnauthenticated, "session closed by the daemon"});
  c.push_back({"session_truncated_varint", session_case([=](RawSession& s) {
                 return sent(s.Send(std::string("\x08\xff\xff", 3), {})); }),
               Code::kUnauthenticated, "session closed by the daemon"});
  c.push_back({"session_oversized_64KiB", session_case([=](RawSession& s) {
                 return sent(s.Send(std::string(64 << 10, '\x08'), {})); }),
               Code::kUnauthenticated, "session closed by the daemon"});
  c.push_back({"session_empty_message", session_case([=](RawSession& s) {
                 return sent(s.Send(std::string(), {})); }),
               Code::kUnauthenticated, "session closed by the daemon"});
  c.push_back({"session_duplicate_transfer_id", [](Env& e) {
                 RawSession s;
                 absl::Status st = s.Open(e.daemon->socket());
                 if (!st.ok()) return st;
                 UniqueFd a = NewMemfd("dup-a", 4096), b = NewMemfd("dup-b", 4096);
                 s.Send(TransferMessage(9), {a.get()});
                 st = s.Outcome(e.daemon->socket());
                 if (!st.ok()) return absl::InternalError(absl::StrCat("first transfer: ", st.ToString()));
                 s.Send(TransferMessage(9), {b.get()});
                 return s.Outcome(e.daemon->socket());
               }, Code::kAlreadyExists, "transfer_id 9 already holds an fd in this session"});
  c.push_back({"session_65_pending_fds", [](Env& e) {
                 RawSession s;
                 absl::Status st = s.Open(e.daemon->socket());
                 if (!st.ok()) return st;
                 UniqueFd fd = NewMemfd("pending", 4096);
                 for (int i = 1; i <= 64; ++i) {
                   s.Send(TransferMessage(100 + i), {fd.get()});
                   st = s.Outcome(e.daemon->socket());
                   if (!st.ok()) return absl::InternalError(absl::StrCat("transfer ", i, ": ", st.ToString()));
                 }
                 s.Send(TransferMessage(165), {fd.get()});
                 return s.Outcome(e.daemon->socket());
               }, Code::kResourceExhausted, "fds waiting for RegisterRegion, the limit"});
  // --- Raw bytes and raw gRPC on the Unix socket.
  c.push_back({"unix_grpc_random_bytes", [](Env& e) {
                 return GarbageOnUnix(e.daemon->socket(), RandomBytes(4096, 2)); },
               Code::kUnavailable, "closed the connection"});
  c.push_back({"unix_grpc_http1_request", [](Env& e) {
                 return GarbageOnUnix(e.daemon->socket(), "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); },
               Code::kUnavailable, "closed the connection"});
  c.push_back({"unix_grpc_h2_frame_of_16MiB", [](Env& e) {
                 return GarbageOnUnix(e.daemon->socket(), PrefaceThenFrame(0x0, 1, 0xffffff, RandomBytes(300, 3))); },
               Code::kUnavailable, "closed the connection"});
  c.push_back({"unix_grpc_undecodable_request", [](Env& e) {
                 return RawCall(e.client->channel(), "/hsap.v1.Attention/Forward",
                                std::string("\x0a\xff\xff\xff\xff\x0f", 6), e.client.get()); },
               Code::kInternal, ""});
  c.push_back({"unix_grpc_unknown_method", [](Env& e) {
                 return RawCall(e.client->channel(), "/hsap.v1.Attention/Sideways", "", e.client.get()); },
               Code::kUnimplemented, ""});
  c.push_back({"unix_grpc_request_65MiB", EditForward([](Env&, Fwd& r) {
                 r.mutable_call()->set_group(std::string(65 << 20, 'x')); }),
               Code::kResourceExhausted, "larger than max"});
  // --- The TCP port.
  c.push_back({"tcp_random_bytes", [](Env& e) { return GarbageOnTcp(e.port, RandomBytes(4096, 4)); },
               Code::kUnavailable, "closed the connection"});
  c.push_back({"tcp_http1_request", [](Env& e) {
                 return GarbageOnTcp(e.port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"); },
               Code::kUnavailable, "closed the connection"});
  c.push_back({"tcp_h2_settings_of_5_bytes", [](Env& e) {
                 return GarbageOnTcp(e.port, PrefaceThenFrame(0x4, 0, 5, "xxxxx")); },
               Code::kUnavailable, "closed the connection"});
  c.push_back({"tcp_forward_without_session", [](Env& e) {
                 auto stub = hsap::v1::Attention::NewStub(TcpChannel(e.port));
                 grpc::ClientContext ctx;
                 ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
                 hsap::v1::AttentionForwardResponse resp;
                 return FromGrpc(stub->Forward(&ctx, e.Good(), &resp));
               }, Code::kUnauthenticated, "carries no hsap-session-id"});
  c.push_back({"tcp_undecodable_request", [](Env& e) {
                 return RawCall(TcpChannel(e.port), "/hsap.v1.Regions/RegisterRegion",
                                std::string("\x2a\x10garbage", 9)); },
               Code::kInternal, ""});
  c.push_back({"tcp_plans_dispatch_zero_nodes", [](Env& e) {
                 auto stub = hsap::v1::Plans::NewStub(TcpChannel(e.port));
                 grpc::ClientContext ctx;
                 ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
                 hsap::v1::DispatchRequest req;
                 req.mutable_spec()->add_cu_seqlens(0);
                 req.mutable_spec()->add_cu_seqlens(16);
                 req.mutable_spec()->set_total_tokens(16);
                 hsap::v1::DispatchResponse resp;
                 return FromGrpc(stub->Dispatch(&ctx, req, &resp));
               }, Code::kInvalidArgument, "topology"});
  return c;
}

absl::StatusOr<std::pair<int64_t, int64_t>> TwoRankDispatch(const std::string& socket) {
  auto plans = hsap::v1::Plans::NewStub(
      grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials()));
  hsap::v1::DispatchRequest req;
  auto* spec = req.mutable_spec();
  for (int64_t x : kCu) spec->add_cu_seqlens(x);
  spec->set_causal(true);
  spec->set_window(-1);
  spec->set_total_tokens(kTokens);
  spec->mutable_topology()->set_num_nodes(1);
  spec->mutable_topology()->set_devices_per_node(2);
  spec->mutable_shape()->set_num_heads_q(kHq);
  spec->mutable_shape()->set_num_heads_kv(kHkv);
  spec->mutable_shape()->set_head_dim(kD);
  spec->mutable_shape()->set_dtype(hsap::v1::DTYPE_FLOAT32);
  spec->set_profile("cpu-loopback");
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  hsap::v1::DispatchResponse resp;
  const grpc::Status st = plans->Dispatch(&ctx, req, &resp);
  if (!st.ok()) return FromGrpc(st);
  int64_t n[2] = {0, 0};
  for (int r = 0; r < 2; ++r) {
    for (const auto& range : resp.dispatch().ranks(r).ranges()) n[r] += range.end() - range.begin();
  }
  return std::make_pair(n[0], n[1]);
}

grpc::health::v1::HealthCheckResponse::ServingStatus Health(const std::string& socket) {
  auto stub = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::health::v1::HealthCheckRequest req;
  grpc::health::v1::HealthCheckResponse resp;
  return stub->Check(&ctx, req, &resp).ok() ? resp.status()
                                            : grpc::health::v1::HealthCheckResponse::UNKNOWN;
}

TEST(BadInputsTest, EveryMalformedInputGetsItsCodeAndTheDaemonStaysHealthy) {
  Env e;
  e.port = testing::FreePort();
  auto d = testing::DaemonProcess::Start(
      testing::Runfile("server/hsapd"),
      {"--devices=cpu:2", "--cpu_threads=1", absl::StrCat("--port=", e.port)});
  ASSERT_TRUE(d.ok()) << d.status();
  e.daemon = std::move(d).value();
  ASSERT_EQ(Health(e.daemon->socket()), grpc::health::v1::HealthCheckResponse::SERVING);
  const int fds_at_start = CountFds(e.daemon->pid());
  const std::string fd_list_at_start = FdList(e.daemon->pid());
  ASSERT_GT(fds_at_start, 0);
  ASSERT_EQ(CountMemfdMappings(e.daemon->Maps()), 0);

  auto dispatch = TwoRankDispatch(e.daemon->socket());
  ASSERT_TRUE(dispatch.ok()) << dispatch.status();
  std::tie(e.rank0_tokens, e.rank1_tokens) = *dispatch;
  ASSERT_NE(e.rank0_tokens, kTokens);  // else tokens_not_as_dispatched could not fail
  {
    auto c = client::Client::Connect(e.daemon->socket());
    ASSERT_TRUE(c.ok()) << c.status();
    e.client = std::move(c).value();
    auto b = client::AttentionBuffers::Create(e.client.get(), {kTokens, kHq, kHkv, kD, DType::kFloat32}, "main");
    ASSERT_TRUE(b.ok()) << b.status();
    e.buf = std::move(b).value();
    e.buf->FillInputs(3);
    auto o = client::Client::Connect(e.daemon->socket());
    ASSERT_TRUE(o.ok()) << o.status();
    e.other = std::move(o).value();
    auto ob = client::AttentionBuffers::Create(e.other.get(), {kTokens, kHq, kHkv, kD, DType::kFloat32}, "other");
    ASSERT_TRUE(ob.ok()) << ob.status();
    e.other_buf = std::move(ob).value();
  }

  const std::vector<Case> cases = Cases();
  std::vector<absl::Status> got;
  for (const Case& k : cases) {
    const absl::Time start = absl::Now();
    got.push_back(k.run(e));
    SCOPED_TRACE(k.name);
    EXPECT_EQ(got.back().code(), k.code) << got.back();
    EXPECT_THAT(std::string(got.back().message()), ::testing::HasSubstr(k.text));
    EXPECT_LT(absl::Now() - start, absl::Seconds(15));
    // The daemon is still up after every case.
    ASSERT_EQ(waitpid(e.daemon->pid(), nullptr, WNOHANG), 0) << "hsapd died at " << k.name;
  }

  std::printf("\n%-46s %-20s %-20s %s\n", "case", "expected", "received", "message");
  for (size_t i = 0; i < cases.size(); ++i) {
    std::string msg(got[i].message().substr(0, 110));
    std::printf("%-46s %-20s %-20s %s\n", cases[i].name.c_str(),
                absl::StatusCodeToString(cases[i].code).c_str(),
                absl::StatusCodeToString(got[i].code()).c_str(), msg.c_str());
  }
  std::printf("%zu cases\n\n", cases.size());
  EXPECT_GE(cases.size(), 50u);

  // Healthy: SERVING, and a good call from a fresh client runs.
  EXPECT_EQ(Health(e.daemon->socket()), grpc::health::v1::HealthCheckResponse::SERVING);
  {
    auto c = client::Client::Connect(e.daemon->socket());
    ASSERT_TRUE(c.ok()) << c.status();
    auto b = client::AttentionBuffers::Create(c->get(), {kTokens, kHq, kHkv, kD, DType::kFloat32}, "final");
    ASSERT_TRUE(b.ok()) << b.status();
    (*b)->FillInputs(11);
    auto resp = (*c)->Forward((*b)->ForwardRequest(e.Call("final", 1), client::DocumentMask(kCu, true), {}));
    ASSERT_TRUE(resp.ok()) << resp.status();
    EXPECT_EQ(resp->stats().area(), 10 * 11 / 2 + 30 * 31 / 2 + 24 * 25 / 2);
  }
  // Every client gone: no memfd mapped, no more fds than at the start.
  e.buf.reset();
  e.client.reset();
  e.other_buf.reset();
  e.other.reset();
  const absl::Time deadline = absl::Now() + absl::Seconds(15);
  int fds = 0, memfds = 0;
  while (true) {
    fds = CountFds(e.daemon->pid());
    memfds = CountMemfdMappings(e.daemon->Maps());
    if ((fds <= fds_at_start && memfds == 0) || absl::Now() > deadline) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  std::printf("daemon fds: %d at start, %d at the end; memfd mappings at the end: %d\n",
              fds_at_start, fds, memfds);
  EXPECT_LE(fds, fds_at_start) << FdList(e.daemon->pid()) << "\nat the start:\n" << fd_list_at_start;
  EXPECT_EQ(memfds, 0) << e.daemon->Maps();
  EXPECT_EQ(Health(e.daemon->socket()), grpc::health::v1::HealthCheckResponse::SERVING);
}

}  // namespace
}  // namespace hsap

int main(int argc, char** argv) {
  if (argc == 4 && std::string(argv[1]) == "--rank0_helper") {
    return hsap::Rank0Helper(argv[2], std::stoll(argv[3]));
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
