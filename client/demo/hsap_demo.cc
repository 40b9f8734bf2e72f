// hsap_demo: packs real documents, runs forward and backward attention
// through a running hsapd, checks both against the float64 reference, and
// prints a short report. Exit status 0 only when every check passes.
//
//   hsap_demo --socket=/run/hsap/hsapd.sock --tokens=4096
#include <cmath>
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "client/cpp/attention_buffers.h"
#include "client/cpp/hsap_client.h"
#include "common/mask.h"
#include "common/workload.h"
#include "kernels/cpu/reference.h"

ABSL_FLAG(std::string, socket, "/run/hsap/hsapd.sock", "hsapd's gRPC Unix socket");
ABSL_FLAG(std::string, workload, "", "document lengths, one per line (default: "
                                     "workloads/python-stdlib.tokens of the repository)");
ABSL_FLAG(int64_t, tokens, 4096, "tokens in the packed sequence");
ABSL_FLAG(int, heads, 8, "query heads");
ABSL_FLAG(int, kv_heads, 2, "key/value heads (GQA)");
ABSL_FLAG(int, head_dim, 64, "head dimension");
ABSL_FLAG(std::string, dtype, "float32", "float32, bfloat16 or float16");
ABSL_FLAG(bool, causal, true, "causal documents");
ABSL_FLAG(uint64_t, seed, 1, "packing and data seed");

namespace {

using hsap::kernels::cpu::MaxRelativeError;

int Fail(const absl::Status& st, const char* what) {
  std::fprintf(stderr, "hsap_demo: %s: %s\n", what, st.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  hsap::DType dtype;
  if (!hsap::ParseDType(absl::GetFlag(FLAGS_dtype), &dtype)) {
    std::fprintf(stderr, "hsap_demo: --dtype=%s is not float32, bfloat16 or float16\n",
                 absl::GetFlag(FLAGS_dtype).c_str());
    return 2;
  }
  std::string path = absl::GetFlag(FLAGS_workload);
  if (path.empty()) path = hsap::FindWorkload();
  auto lengths = hsap::LoadDocumentLengths(path);
  if (!lengths.ok()) return Fail(lengths.status(), "workload");
  const int64_t tokens = absl::GetFlag(FLAGS_tokens);
  const auto cu = hsap::PackDocuments(*lengths, tokens, 1, absl::GetFlag(FLAGS_seed))[0];

  auto client = hsap::client::Client::Connect(absl::GetFlag(FLAGS_socket));
  if (!client.ok()) return Fail(client.status(), "connect");
  hsap::client::AttentionDims dims{tokens, absl::GetFlag(FLAGS_heads),
                                   absl::GetFlag(FLAGS_kv_heads), absl::GetFlag(FLAGS_head_dim),
                                   dtype};
  auto buffers = hsap::client::AttentionBuffers::Create(client->get(), dims, "demo");
  if (!buffers.ok()) return Fail(buffers.status(), "register region");
  auto& b = **buffers;
  b.FillInputs(absl::GetFlag(FLAGS_seed));

  hsap::v1::CallId call;
  call.set_group("demo");
  call.set_rank(0);
  call.set_group_size(1);
  call.set_call_seq(1);
  const bool causal = absl::GetFlag(FLAGS_causal);
  const auto mask = hsap::client::DocumentMask(cu, causal);
  hsap::v1::CallOptions options;

  const absl::Time t0 = absl::Now();
  auto fwd = (*client)->Forward(b.ForwardRequest(call, mask, options));
  if (!fwd.ok()) return Fail(fwd.status(), "forward");
  const absl::Time t1 = absl::Now();
  call.set_call_seq(2);
  auto bwd = (*client)->Backward(b.BackwardRequest(call, mask, options));
  if (!bwd.ok()) return Fail(bwd.status(), "backward");
  const absl::Time t2 = absl::Now();

  // The float64 reference on the very same (rounded) inputs.
  hsap::kernels::cpu::AttentionShape shape{dims.heads_q > 0 ? static_cast<int>(dims.heads_q) : 0,
                                           static_cast<int>(dims.heads_kv),
                                           static_cast<int>(dims.head_dim), dtype,
                                           1.0f / std::sqrt(static_cast<float>(dims.head_dim))};
  const auto slices = hsap::LowerDocuments(cu, causal, -1);
  std::vector<double> ro, rlse, rdq, rdk, rdv;
  hsap::kernels::cpu::ReferenceForward(shape, b.q(), b.k(), b.v(), tokens, tokens, slices, &ro, &rlse);
  hsap::kernels::cpu::ReferenceBackward(shape, b.q(), b.k(), b.v(), b.d_o(), tokens, tokens, slices,
                                        &rdq, &rdk, &rdv);
  const int64_t nq = tokens * dims.heads_q * dims.head_dim;
  const int64_t nk = tokens * dims.heads_kv * dims.head_dim;
  std::vector<double> lse(b.lse(), b.lse() + dims.heads_q * tokens);
  const double err_o = MaxRelativeError(b.ToDouble(b.o(), nq), ro);
  const double err_lse = MaxRelativeError(lse, rlse);
  const double err_dq = MaxRelativeError(b.ToDouble(b.dq(), nq), rdq);
  const double err_dk = MaxRelativeError(b.ToDouble(b.dk(), nk), rdk);
  const double err_dv = MaxRelativeError(b.ToDouble(b.dv(), nk), rdv);
  // fp32 must match to 1e-5; bf16/fp16 outputs carry their storage rounding.
  const double tol = dtype == hsap::DType::kFloat32 ? 1e-5 : dtype == hsap::DType::kBFloat16 ? 1e-2 : 2e-3;
  const double worst = std::max({err_o, err_lse, err_dq, err_dk, err_dv});
  int64_t docs = 0;
  for (size_t i = 1; i < cu.size(); ++i) docs += cu[i] > cu[i - 1];

  std::printf("HSAP demo: %lld tokens in %lld documents from %s\n", static_cast<long long>(tokens),
              static_cast<long long>(docs), path.c_str());
  std::printf("  shape: Hq=%lld Hkv=%lld D=%lld %s, %s documents\n",
              static_cast<long long>(dims.heads_q), static_cast<long long>(dims.heads_kv),
              static_cast<long long>(dims.head_dim), std::string(hsap::DTypeName(dtype)).c_str(),
              causal ? "causal" : "bidirectional");
  std::printf("  forward:  %8.1f ms through hsapd (%llu allowed pairs)\n",
              absl::ToDoubleMilliseconds(t1 - t0),
              static_cast<unsigned long long>(fwd->stats().area()));
  std::printf("  backward: %8.1f ms through hsapd\n", absl::ToDoubleMilliseconds(t2 - t1));
  std::printf("  max relative error vs float64 reference: O %.2e  LSE %.2e  dQ %.2e  dK %.2e  dV %.2e\n",
              err_o, err_lse, err_dq, err_dk, err_dv);
  const bool ok = worst <= tol;
  std::printf("CHECK %s: worst error %.2e %s tolerance %.0e\n", ok ? "PASSED" : "FAILED", worst,
              ok ? "<=" : ">", tol);
  return ok ? 0 : 1;
}
