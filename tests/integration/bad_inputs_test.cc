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
#include "tests/integration/bad_inputs_env.h"

namespace hsap::bad_inputs {
namespace {

// The cases on attention requests, sessions, call identity and clients that
// go away mid-call; then TransportCases().
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
  c.push_back({"head_dim_0", EditForward([](Env&, Fwd& r) {
                 for (auto* t : {r.mutable_q(), r.mutable_k(), r.mutable_v(), r.mutable_o()}) t->set_shape(2, 0); }),
               Code::kInvalidArgument, "q.shape[2] (head_dim) is 0; it must be in [1, 256]"});
  c.push_back({"head_dim_264", [](Env& e) {
                 auto b = client::AttentionBuffers::Create(e.client.get(), {kTokens, kHq, kHkv, 264, DType::kFloat32}, "hd264");
                 if (!b.ok()) return b.status();
                 return e.Forward((*b)->ForwardRequest(e.Call(), client::DocumentMask(kCu, true), {}));
               }, Code::kInvalidArgument, "q.shape[2] (head_dim) is 264"});
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
               Code::kInvalidArgument, "call.group_size is 3"});
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
               Code::kInvalidArgument, "options.strategy (99) is not a known strategy"});
  c.push_back({"assignment_enum_77", EditForward([](Env&, Fwd& r) {
                 r.mutable_options()->set_assignment(static_cast<hsap::v1::AssignmentPolicy>(77)); }),
               Code::kInvalidArgument, "options.assignment (77) is not a known policy"});
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
  c.push_back({"call_seq_after_the_last_one", [](Env& e) {
                 auto r = e.Good();
                 *r.mutable_call() = e.Call("last-seq", std::numeric_limits<uint64_t>::max());
                 absl::Status first = e.Forward(r);
                 if (!first.ok()) return first;
                 *r.mutable_call() = e.Call("last-seq", 1);
                 return e.Forward(r);
               }, Code::kFailedPrecondition, "already submitted call_seq 18446744073709551615, the last one there is"});
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
                 // (CANCELLED), and its session's close released the group
                 // (call_matcher.h: group state belongs to sessions). The late
                 // rank 1 starts the call afresh and waits for a rank 0 that
                 // never comes: its deadline, naming rank 0.
                 absl::SleepFor(absl::Milliseconds(1500));
                 auto b = RankBuffers(e.client.get(), e.rank1_tokens, "late-rank1");
                 if (!b.ok()) return b.status();
                 auto req = (*b)->ForwardRequest(TwoRankCall("killed", 1, 1),
                                                 client::DocumentMask(kCu, true), Deadline(1500));
                 const absl::Status st = e.Forward(req);
                 absl::Status freed = e.WaitUnmapped("killed-rank0");
                 return freed.ok() ? st : freed;
               }, Code::kDeadlineExceeded,
              "call 1 of group 'killed': rank(s) 0 did not arrive before the deadline"});
  std::vector<Case> transport = TransportCases();
  c.insert(c.end(), transport.begin(), transport.end());
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
      {"--devices=cpu:2", "--cpu_threads=1", absl::StrCat("--port=", e.port), "--insecure_peers"});
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
}  // namespace hsap::bad_inputs

int main(int argc, char** argv) {
  if (argc == 4 && std::string(argv[1]) == "--rank0_helper") {
    return hsap::bad_inputs::Rank0Helper(argv[2], std::stoll(argv[3]));
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
