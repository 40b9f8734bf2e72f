// One shared buffer laid out for an attention call of one rank — Q, K, V, O,
// LSE, dO, dQ, dK, dV back to back, 64-byte aligned — and the requests that
// reference it. Used by the demo, the integration tests and the benchmarks.
#ifndef HSAP_CLIENT_CPP_ATTENTION_BUFFERS_H_
#define HSAP_CLIENT_CPP_ATTENTION_BUFFERS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "client/cpp/hsap_client.h"
#include "common/dtype.h"

namespace hsap::client {

struct AttentionDims {
  int64_t tokens = 0;  // this rank's tokens
  int64_t heads_q = 0;
  int64_t heads_kv = 0;
  int64_t head_dim = 0;
  DType dtype = DType::kFloat32;
};

hsap::v1::DType ToProtoDType(DType t);

class AttentionBuffers {
 public:
  static absl::StatusOr<std::unique_ptr<AttentionBuffers>> Create(Client* client,
                                                                  const AttentionDims& dims,
                                                                  const std::string& name);

  const AttentionDims& dims() const { return dims_; }
  SharedBuffer& buffer() { return *buffer_; }

  // Typed views (storage dtype for tensors, float for lse).
  void* q() { return At(q_); }
  void* k() { return At(k_); }
  void* v() { return At(v_); }
  void* o() { return At(o_); }
  float* lse() { return static_cast<float*>(At(lse_)); }
  void* d_o() { return At(do_); }
  void* dq() { return At(dq_); }
  void* dk() { return At(dk_); }
  void* dv() { return At(dv_); }

  // Fills Q, K, V and dO with uniform values in [-1, 1) (rounded to dtype).
  void FillInputs(uint64_t seed);

  // Requests for one call; `mask` is copied in, `call` names the collective.
  hsap::v1::AttentionForwardRequest ForwardRequest(const hsap::v1::CallId& call,
                                                   const hsap::v1::MaskSpec& mask,
                                                   const hsap::v1::CallOptions& options) const;
  hsap::v1::AttentionBackwardRequest BackwardRequest(const hsap::v1::CallId& call,
                                                     const hsap::v1::MaskSpec& mask,
                                                     const hsap::v1::CallOptions& options) const;

  // Converts a tensor of this call to double, e.g. for comparisons.
  std::vector<double> ToDouble(const void* tensor, int64_t numel) const;

 private:
  AttentionBuffers(AttentionDims dims) : dims_(dims) {}
  void* At(uint64_t offset) { return buffer_->data() + offset; }
  hsap::v1::TensorRef Ref(uint64_t offset, std::vector<int64_t> shape) const;

  AttentionDims dims_;
  std::unique_ptr<SharedBuffer> buffer_;
  uint64_t q_ = 0, k_ = 0, v_ = 0, o_ = 0, lse_ = 0, do_ = 0, dq_ = 0, dk_ = 0, dv_ = 0;
};

// A MaskSpec of packed documents with cu_seqlens inline.
hsap::v1::MaskSpec DocumentMask(const std::vector<int64_t>& cu_seqlens, bool causal,
                                int64_t window_left = -1);

}  // namespace hsap::client

#endif  // HSAP_CLIENT_CPP_ATTENTION_BUFFERS_H_
