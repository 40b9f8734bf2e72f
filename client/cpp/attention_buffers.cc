#include "client/cpp/attention_buffers.h"

#include <random>

namespace hsap::client {
namespace {

uint64_t AlignUp(uint64_t x) { return (x + 63) & ~uint64_t{63}; }

}  // namespace

hsap::v1::DType ToProtoDType(DType t) {
  switch (t) {
    case DType::kFloat32: return hsap::v1::DTYPE_FLOAT32;
    case DType::kBFloat16: return hsap::v1::DTYPE_BFLOAT16;
    case DType::kFloat16: return hsap::v1::DTYPE_FLOAT16;
  }
  return hsap::v1::DTYPE_UNSPECIFIED;
}

absl::StatusOr<std::unique_ptr<AttentionBuffers>> AttentionBuffers::Create(
    Client* client, const AttentionDims& d, const std::string& name) {
  std::unique_ptr<AttentionBuffers> b(new AttentionBuffers(d));
  const uint64_t es = DTypeSize(d.dtype);
  const uint64_t qbytes = AlignUp(d.tokens * d.heads_q * d.head_dim * es);
  const uint64_t kbytes = AlignUp(d.tokens * d.heads_kv * d.head_dim * es);
  const uint64_t lbytes = AlignUp(d.heads_q * d.tokens * 4);
  uint64_t at = 0;
  for (auto [field, bytes] : {std::pair{&b->q_, qbytes}, {&b->k_, kbytes}, {&b->v_, kbytes},
                              {&b->o_, qbytes}, {&b->lse_, lbytes}, {&b->do_, qbytes},
                              {&b->dq_, qbytes}, {&b->dk_, kbytes}, {&b->dv_, kbytes}}) {
    *field = at;
    at += bytes;
  }
  auto buffer = client->CreateBuffer(std::max<uint64_t>(at, 64), name);
  if (!buffer.ok()) return buffer.status();
  b->buffer_ = std::move(buffer).value();
  return b;
}

void AttentionBuffers::FillInputs(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uni(-1.f, 1.f);
  const int64_t nq = dims_.tokens * dims_.heads_q * dims_.head_dim;
  const int64_t nk = dims_.tokens * dims_.heads_kv * dims_.head_dim;
  for (auto [ptr, n] : {std::pair{q(), nq}, {k(), nk}, {v(), nk}, {d_o(), nq}}) {
    for (int64_t i = 0; i < n; ++i) StoreFromFloat(ptr, dims_.dtype, i, uni(rng));
  }
}

hsap::v1::TensorRef AttentionBuffers::Ref(uint64_t offset, std::vector<int64_t> shape) const {
  return buffer_->Ref(offset, shape, ToProtoDType(dims_.dtype));
}

hsap::v1::AttentionForwardRequest AttentionBuffers::ForwardRequest(
    const hsap::v1::CallId& call, const hsap::v1::MaskSpec& mask,
    const hsap::v1::CallOptions& options) const {
  const auto& d = dims_;
  hsap::v1::AttentionForwardRequest r;
  *r.mutable_call() = call;
  *r.mutable_mask() = mask;
  *r.mutable_options() = options;
  *r.mutable_q() = Ref(q_, {d.tokens, d.heads_q, d.head_dim});
  *r.mutable_k() = Ref(k_, {d.tokens, d.heads_kv, d.head_dim});
  *r.mutable_v() = Ref(v_, {d.tokens, d.heads_kv, d.head_dim});
  *r.mutable_o() = Ref(o_, {d.tokens, d.heads_q, d.head_dim});
  *r.mutable_lse() = buffer_->Ref(lse_, {d.heads_q, d.tokens}, hsap::v1::DTYPE_FLOAT32);
  return r;
}

hsap::v1::AttentionBackwardRequest AttentionBuffers::BackwardRequest(
    const hsap::v1::CallId& call, const hsap::v1::MaskSpec& mask,
    const hsap::v1::CallOptions& options) const {
  const auto& d = dims_;
  const auto fwd = ForwardRequest(call, mask, options);
  hsap::v1::AttentionBackwardRequest r;
  *r.mutable_call() = call;
  *r.mutable_mask() = mask;
  *r.mutable_options() = options;
  *r.mutable_q() = fwd.q();
  *r.mutable_k() = fwd.k();
  *r.mutable_v() = fwd.v();
  *r.mutable_o() = fwd.o();
  *r.mutable_lse() = fwd.lse();
  *r.mutable_d_o() = Ref(do_, {d.tokens, d.heads_q, d.head_dim});
  *r.mutable_dq() = Ref(dq_, {d.tokens, d.heads_q, d.head_dim});
  *r.mutable_dk() = Ref(dk_, {d.tokens, d.heads_kv, d.head_dim});
  *r.mutable_dv() = Ref(dv_, {d.tokens, d.heads_kv, d.head_dim});
  return r;
}

std::vector<double> AttentionBuffers::ToDouble(const void* tensor, int64_t numel) const {
  std::vector<double> out(numel);
  for (int64_t i = 0; i < numel; ++i) out[i] = LoadAsFloat(tensor, dims_.dtype, i);
  return out;
}

hsap::v1::MaskSpec DocumentMask(const std::vector<int64_t>& cu_seqlens, bool causal,
                                int64_t window_left) {
  hsap::v1::MaskSpec m;
  for (int64_t x : cu_seqlens) m.mutable_cu_seqlens()->mutable_inline_values()->add_values(x);
  m.set_causal(causal);
  if (window_left >= 0) m.set_window_left(window_left);
  return m;
}

}  // namespace hsap::client
