// Fuzzes the entry-point validation of attention requests
// (server/grpc/attention_validation.h) against a real RegionRegistry that
// holds memfd regions, as the Attention service calls it.
//
// Input: first byte 0/1 -> the rest is a serialized AttentionForwardRequest /
// AttentionBackwardRequest (what arrives over gRPC); otherwise a request is
// built field by field with FuzzedDataProvider so that deep, valid requests
// are common. Properties:
//  * errors are INVALID_ARGUMENT, NOT_FOUND or UNIMPLEMENTED (never a crash,
//    never INTERNAL: a bad request is the caller's mistake);
//  * an accepted call is total: every tensor lies inside its region with
//    bytes == numel * dtype size, its first and last bytes are readable, the
//    outputs overlap no other tensor, the mask slices are valid, and the
//    head shape is in range;
//  * when the call is gone no region stays pinned.
#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "google/protobuf/stubs/logging.h"
#include "hsap/v1/attention.pb.h"
#include "server/grpc/attention_validation.h"
#include "server/shm/region.h"
#include "server/shm/region_registry.h"
#include "tests/fuzz/fuzz_util.h"

namespace hsap {
namespace {

using fuzz::Value;
using v1::TensorRef;

constexpr uint64_t kSession = 1;
constexpr uint64_t kSlot = uint64_t{1} << 20;  // tensor slots in the big region

struct Fixture {
  shm::RegionRegistry registry;
  std::vector<uint64_t> ids;  // region ids of kSession, then one of session 2
  std::vector<uint64_t> sizes;

  Fixture() {
    // 16 MiB for tensors, 4 KiB of int32 0..1023, 4 KiB of int64 0,7,14...,
    // 3 bytes, and a region of another session.
    Add(kSession, 16 * kSlot, 0);
    Add(kSession, 4096, 4);
    Add(kSession, 4096, 8);
    Add(kSession, 3, 0);
    Add(2, 4096, 0);
  }
  void Add(uint64_t session, uint64_t size, int pattern) {
    const int fd = memfd_create("fuzz", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    FUZZ_CHECK(fd >= 0 && ftruncate(fd, static_cast<off_t>(size)) == 0);
    auto mapping = shm::MappedRegion::FromFd(fd, size, shm::RegionKind::kMemfd);
    close(fd);
    FUZZ_CHECK(mapping.ok());
    uint8_t* p = (*mapping)->data();
    for (uint64_t i = 0; pattern != 0 && i < size / pattern; ++i) {
      if (pattern == 4) {
        const int32_t x = static_cast<int32_t>(i);
        std::memcpy(p + 4 * i, &x, 4);
      } else {
        const int64_t x = static_cast<int64_t>(7 * i);
        std::memcpy(p + 8 * i, &x, 8);
      }
    }
    auto id = registry.Register(session, "r", std::move(*mapping));
    FUZZ_CHECK(id.ok());
    ids.push_back(*id);
    sizes.push_back(size);
  }
};

Fixture& F() {
  static Fixture* f = new Fixture;
  return *f;
}

v1::DType DTypeOf(FuzzedDataProvider& in, v1::DType usual) {
  if (in.ConsumeIntegralInRange<int>(0, 7) != 0) return usual;
  return static_cast<v1::DType>(in.ConsumeIntegralInRange<int>(-1, 7));
}

// Shapes: right most of the time, one dimension off otherwise.
void SetShape(FuzzedDataProvider& in, std::vector<int64_t> shape, TensorRef* ref) {
  switch (in.ConsumeIntegralInRange<int>(0, 9)) {
    case 0: shape.push_back(1); break;
    case 1: if (!shape.empty()) shape.pop_back(); break;
    case 2: if (!shape.empty()) shape[in.ConsumeIntegralInRange<size_t>(0, shape.size() - 1)] =
                Value(in, 70, int64_t{1} << 62);
            break;
    default: break;
  }
  for (int64_t d : shape) ref->add_shape(d);
}

void SetTensor(FuzzedDataProvider& in, int slot, std::vector<int64_t> shape, v1::DType dtype,
               TensorRef* ref) {
  const int which = in.ConsumeIntegralInRange<int>(0, 15);
  ref->set_region_id(which < 12 ? F().ids[0] : which == 12 ? 0 : which == 13 ? F().ids[4]
                     : in.ConsumeIntegral<uint64_t>());
  uint64_t offset = static_cast<uint64_t>(slot) * kSlot;
  switch (in.ConsumeIntegralInRange<int>(0, 11)) {
    case 0: offset = in.ConsumeIntegral<uint64_t>(); break;
    case 1: offset = F().sizes[0] - in.ConsumeIntegralInRange<uint64_t>(0, 64); break;
    case 2: offset = in.ConsumeIntegralInRange<uint64_t>(0, 16 * kSlot); break;
    case 3: offset = kSlot * in.ConsumeIntegralInRange<uint64_t>(0, 15); break;  // maybe shared
    default: break;
  }
  ref->set_offset(offset);
  ref->set_dtype(DTypeOf(in, dtype));
  SetShape(in, std::move(shape), ref);
}

template <typename Request>
void BuildCommon(FuzzedDataProvider& in, Request* r) {
  auto* call = r->mutable_call();
  switch (in.ConsumeIntegralInRange<int>(0, 5)) {
    case 0: call->set_group(""); break;
    case 1: call->set_group(std::string(in.ConsumeIntegralInRange<size_t>(120, 140), 'g')); break;
    case 2: call->set_group(in.ConsumeRandomLengthString(16)); break;
    default: call->set_group("train"); break;
  }
  call->set_group_size(in.ConsumeBool() ? 1 : static_cast<int32_t>(Value(in, 5, INT32_MAX)));
  call->set_rank(in.ConsumeBool() ? 0 : static_cast<int32_t>(Value(in, 5, INT32_MAX)));
  call->set_call_seq(in.ConsumeIntegralInRange<int>(0, 9) == 0 ? 0 : 1 + in.ConsumeIntegral<uint32_t>());
  if (in.ConsumeBool()) {  // declared member nodes (some not in --peers, repeated)
    static const char* const kAddresses[] = {"h:1", "h:2", "h:3", "other:9"};
    const int n = in.ConsumeIntegralInRange<int>(0, 4);
    for (int i = 0; i < n; ++i) call->add_nodes(kAddresses[in.ConsumeIntegralInRange<int>(0, 3)]);
    call->set_node_index(in.ConsumeIntegralInRange<int32_t>(-1, 4));
  }

  auto* o = r->mutable_options();
  switch (in.ConsumeIntegralInRange<int>(0, 7)) {
    case 0: o->set_softmax_scale(std::numeric_limits<float>::quiet_NaN()); break;
    case 1: o->set_softmax_scale(std::numeric_limits<float>::infinity()); break;
    case 2: o->set_softmax_scale(-1.0f); break;
    case 3: o->set_softmax_scale(in.ConsumeFloatingPoint<float>()); break;
    case 4: o->set_softmax_scale(0.125f); break;
    default: break;
  }
  o->set_strategy(static_cast<v1::Strategy>(in.ConsumeIntegralInRange<int>(-1, 9)));
  o->set_assignment(static_cast<v1::AssignmentPolicy>(in.ConsumeIntegralInRange<int>(-1, 5)));
  o->set_deadline_ms(in.ConsumeIntegral<uint32_t>());

  // Head shape and tokens, usually consistent.
  const int64_t t = in.ConsumeIntegralInRange<int64_t>(0, 40);
  const int64_t hkv = in.ConsumeIntegralInRange<int64_t>(1, 4);
  const int64_t hq = in.ConsumeBool() ? hkv * in.ConsumeIntegralInRange<int64_t>(1, 3)
                                      : Value(in, 9, 2000);
  const int64_t d = in.ConsumeBool() ? 32 : Value(in, 264, int64_t{1} << 40);

  auto* mask = r->mutable_mask();
  mask->set_causal(in.ConsumeBool());
  if (in.ConsumeIntegralInRange<int>(0, 3) == 0) mask->set_window_left(Value(in, 10, INT64_MAX));
  switch (in.ConsumeIntegralInRange<int>(0, 5)) {
    case 0: break;  // no structure
    case 1: {  // cu_seqlens from a region
      auto* ref = mask->mutable_cu_seqlens()->mutable_tensor();
      const bool i32 = in.ConsumeBool();
      ref->set_region_id(F().ids[i32 ? 1 : 2]);
      if (in.ConsumeIntegralInRange<int>(0, 5) == 0) ref->set_region_id(F().ids[in.ConsumeIntegralInRange<size_t>(0, 4)]);
      ref->set_dtype(DTypeOf(in, i32 ? v1::DTYPE_INT32 : v1::DTYPE_INT64));
      ref->set_offset(in.ConsumeBool() ? 0 : Value(in, 4100, INT64_MAX));
      SetShape(in, {in.ConsumeIntegralInRange<int64_t>(0, 600)}, ref);
      break;
    }
    case 2: case 3: {  // inline cu_seqlens ending at t
      auto* values = mask->mutable_cu_seqlens()->mutable_inline_values();
      int64_t x = 0;
      values->add_values(in.ConsumeIntegralInRange<int>(0, 9) == 0 ? Value(in, 4, INT64_MAX) : 0);
      const int n = in.ConsumeIntegralInRange<int>(0, 5);
      for (int i = 0; i < n && x < t; ++i) {
        x = in.ConsumeBool() ? std::min(t, x + in.ConsumeIntegralInRange<int64_t>(0, 12))
                             : Value(in, 40, INT64_MAX);
        values->add_values(x);
      }
      if (in.ConsumeBool()) values->add_values(t);
      break;
    }
    default: {  // slices over t tokens
      auto* s = mask->mutable_slices();
      s->set_total_tokens(in.ConsumeBool() ? t : Value(in, 40, INT64_MAX));
      const int n = in.ConsumeIntegralInRange<int>(0, 4);
      for (int i = 0; i < n; ++i) {
        auto* p = s->add_slices();
        const int64_t qb = in.ConsumeIntegralInRange<int64_t>(0, t);
        const int64_t kb = in.ConsumeIntegralInRange<int64_t>(0, t);
        p->set_q_begin(in.ConsumeIntegralInRange<int>(0, 9) == 0 ? Value(in, 40, INT64_MAX) : qb);
        p->set_q_end(in.ConsumeIntegralInRange<int64_t>(qb, t));
        p->set_k_begin(kb);
        p->set_k_end(in.ConsumeIntegralInRange<int>(0, 9) == 0 ? Value(in, 40, INT64_MAX)
                                                               : in.ConsumeIntegralInRange<int64_t>(kb, t));
        p->set_type(static_cast<v1::MaskType>(in.ConsumeIntegralInRange<int>(0, 9) == 0
                                                  ? in.ConsumeIntegralInRange<int>(-1, 3)
                                                  : in.ConsumeIntegralInRange<int>(0, 1)));
        if (in.ConsumeBool()) p->set_offset(Value(in, 40, int64_t{1} << 50));
        if (in.ConsumeBool()) p->set_window(Value(in, 40, int64_t{1} << 50));
      }
      break;
    }
  }
  const v1::DType dt = static_cast<v1::DType>(in.ConsumeIntegralInRange<int>(0, 9) == 0
                                                  ? in.ConsumeIntegralInRange<int>(-1, 7)
                                                  : in.ConsumeIntegralInRange<int>(1, 3));
  SetTensor(in, 0, {t, hq, d}, dt, r->mutable_q());
  SetTensor(in, 1, {t, hkv, d}, dt, r->mutable_k());
  SetTensor(in, 2, {t, hkv, d}, dt, r->mutable_v());
  SetTensor(in, 3, {t, hq, d}, dt, r->mutable_o());
  SetTensor(in, 4, {hq, t}, v1::DTYPE_FLOAT32, r->mutable_lse());
  if constexpr (std::is_same_v<Request, v1::AttentionBackwardRequest>) {
    SetTensor(in, 5, {t, hq, d}, dt, r->mutable_d_o());
    SetTensor(in, 6, {t, hq, d}, dt, r->mutable_dq());
    SetTensor(in, 7, {t, hkv, d}, dt, r->mutable_dk());
    SetTensor(in, 8, {t, hkv, d}, dt, r->mutable_dv());
  }
}

uint64_t RegionSize(uint64_t id) {
  for (size_t i = 0; i < F().ids.size(); ++i) {
    if (F().ids[i] == id) return F().sizes[i];
  }
  FUZZ_CHECK(false);
  return 0;
}

void CheckTensor(const BoundTensor& t, int elem_size, size_t rank) {
  FUZZ_CHECK(t.shape.size() == rank);
  unsigned __int128 numel = 1;
  for (int64_t d : t.shape) {
    FUZZ_CHECK(d >= 0);
    numel *= static_cast<uint64_t>(d);
  }
  FUZZ_CHECK(numel * elem_size == t.bytes);
  FUZZ_CHECK(t.pin.region() != nullptr && t.pin.id() == t.region_id);
  const uint64_t size = RegionSize(t.region_id);
  FUZZ_CHECK(t.pin.region()->size() == size);
  FUZZ_CHECK(t.offset <= size && t.bytes <= size - t.offset);
  FUZZ_CHECK(t.data == t.pin.region()->data() + t.offset);
  if (t.bytes > 0) {
    volatile uint8_t first = t.data[0], last = t.data[t.bytes - 1];
    (void)first;
    (void)last;
  }
}

bool Overlap(const BoundTensor& a, const BoundTensor& b) {
  return a.region_id == b.region_id && a.bytes > 0 && b.bytes > 0 &&
         a.offset < b.offset + b.bytes && b.offset < a.offset + a.bytes;
}

void CheckCall(const AttentionCall& call, const ValidationLimits& limits) {
  const int e = DTypeSize(call.shape.dtype);
  FUZZ_CHECK(e == 2 || e == 4);
  std::vector<const BoundTensor*> all = {&call.q, &call.k, &call.v, &call.o, &call.lse};
  std::vector<const BoundTensor*> outputs = {&call.o, &call.lse};
  CheckTensor(call.q, e, 3);
  CheckTensor(call.k, e, 3);
  CheckTensor(call.v, e, 3);
  CheckTensor(call.o, e, 3);
  CheckTensor(call.lse, 4, 2);
  if (call.backward) {
    for (const BoundTensor* t : {&call.d_o, &call.dq, &call.dk, &call.dv}) CheckTensor(*t, e, 3);
    for (const BoundTensor* t : {&call.d_o, &call.dq, &call.dk, &call.dv}) all.push_back(t);
    outputs = {&call.dq, &call.dk, &call.dv};
  }
  for (const BoundTensor* o : outputs) {
    for (const BoundTensor* t : all) FUZZ_CHECK(t == o || !Overlap(*o, *t));
  }
  const int64_t t = call.q.shape[0];
  FUZZ_CHECK(call.local_tokens == t);
  FUZZ_CHECK(call.shape.num_heads_q >= 1 && call.shape.num_heads_q <= limits.max_heads);
  FUZZ_CHECK(call.shape.num_heads_kv >= 1 && call.shape.num_heads_q % call.shape.num_heads_kv == 0);
  FUZZ_CHECK(call.shape.head_dim >= 1 && call.shape.head_dim <= 256);  // q.shape[2]'s rule
  FUZZ_CHECK(std::isfinite(call.shape.softmax_scale) && call.shape.softmax_scale > 0);
  FUZZ_CHECK(call.total_tokens >= 0 && call.total_tokens <= limits.max_tokens);
  const absl::Status slices = ValidateSlices(call.slices, call.total_tokens, call.total_tokens);
  if (!slices.ok()) std::fprintf(stderr, "%s\n", slices.ToString().c_str());
  FUZZ_CHECK(slices.ok());
  if (!call.cu_seqlens.empty()) FUZZ_CHECK(ValidateCuSeqlens(call.cu_seqlens, call.total_tokens).ok());
  FUZZ_CHECK(call.group_size >= 1 && call.group_size <= limits.max_group_size);
  FUZZ_CHECK(call.rank >= 0 && call.rank < call.group_size && call.call_seq > 0);
  FUZZ_CHECK(!call.group.empty() && call.group.size() <= 128);
  if (!call.member_addresses.empty()) {
    const int32_t n = static_cast<int32_t>(call.member_addresses.size());
    FUZZ_CHECK(call.group_size % n == 0);
    const int32_t rpn = call.group_size / n;
    FUZZ_CHECK(rpn <= limits.device_slots && call.node_index >= 0 && call.node_index < n);
    FUZZ_CHECK(call.member_addresses[call.node_index] == limits.self_address);
    FUZZ_CHECK(call.rank / rpn == call.node_index);
    for (int32_t i = 0; i < n; ++i) {
      for (int32_t j = 0; j < i; ++j) FUZZ_CHECK(call.member_addresses[i] != call.member_addresses[j]);
    }
  }
  for (const MaskSlice& s : call.slices) FUZZ_CHECK(SliceArea(s) >= 0);
}

void CheckStatus(const absl::Status& st) {
  FUZZ_CHECK(st.code() == absl::StatusCode::kInvalidArgument ||
             st.code() == absl::StatusCode::kNotFound ||
             // call.nodes names a daemon outside --peers (call_nodes.h).
             st.code() == absl::StatusCode::kFailedPrecondition ||
             st.code() == absl::StatusCode::kUnimplemented);
  FUZZ_CHECK(!st.message().empty());
}

template <typename Request>
void Run(const Request& r, const ValidationLimits& limits) {
  if (std::getenv("HSAP_FUZZ_DEBUG") != nullptr) std::fprintf(stderr, "%s\n", r.DebugString().c_str());
  absl::StatusOr<AttentionCall> call;
  if constexpr (std::is_same_v<Request, v1::AttentionBackwardRequest>) {
    call = ValidateBackward(r, kSession, &F().registry, limits);
  } else {
    call = ValidateForward(r, kSession, &F().registry, limits);
  }
  if (call.ok()) {
    constexpr bool kBackward = std::is_same_v<Request, v1::AttentionBackwardRequest>;
    FUZZ_CHECK(call->backward == kBackward);
    CheckCall(*call, limits);
  } else {
    CheckStatus(call.status());
  }
  call = absl::UnknownError("released");
  for (const shm::RegionSummary& s : F().registry.List()) FUZZ_CHECK(s.pins == 0);
}

}  // namespace
}  // namespace hsap

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);  // invalid UTF-8 in strings is expected
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hsap;
  if (size == 0) return 0;
  ValidationLimits limits;
  if (data[0] <= 1) {  // the wire form
    if (data[0] == 0) {
      v1::AttentionForwardRequest r;
      if (r.ParseFromArray(data + 1, static_cast<int>(size - 1))) Run(r, limits);
    } else {
      v1::AttentionBackwardRequest r;
      if (r.ParseFromArray(data + 1, static_cast<int>(size - 1))) Run(r, limits);
    }
    return 0;
  }
  FuzzedDataProvider in(data + 1, size - 1);
  limits.max_group_size = in.ConsumeIntegralInRange<int32_t>(1, 4);
  if (in.ConsumeBool()) {  // node node_rank of a 3-node static cluster
    limits.peers = {"h:1", "h:2", "h:3"};
    limits.node_rank = in.ConsumeIntegralInRange<int32_t>(0, 2);
    limits.self_address = limits.peers[limits.node_rank];
    limits.device_slots = in.ConsumeIntegralInRange<int32_t>(1, 4);
  }
  if (in.ConsumeIntegralInRange<int>(0, 3) == 0) {
    limits.max_tokens = in.ConsumeIntegralInRange<int64_t>(0, 64);
    limits.max_slices = in.ConsumeIntegralInRange<int64_t>(0, 8);
    limits.max_heads = in.ConsumeIntegralInRange<int>(1, 16);
  }
  if (data[0] & 1) {
    v1::AttentionBackwardRequest r;
    BuildCommon(in, &r);
    Run(r, limits);
  } else {
    v1::AttentionForwardRequest r;
    BuildCommon(in, &r);
    Run(r, limits);
  }
  return 0;
}
