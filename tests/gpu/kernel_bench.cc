// Times the CUDA attention kernels on one packed sequence of real document
// lengths and reports useful TFLOP/s, for comparison with PyTorch's varlen
// flash-attention on the very same cu_seqlens (tests/gpu/torch_flash_bench.py).
//
//   kernel_bench [--workload=FILE] [--tokens=16384] [--heads=16] [--head_dim=128]
//                [--dtype=bf16] [--reps=20] [--seed=2026] [--cu_seqlens_out=FILE]
//                [--dump_dir=DIR]
//
// Workload: document lengths (one per line) packed the pretraining way
// (common/workload.h PackDocuments, first pack), causal per document, one
// work item per document (what a single-rank plan executes).
// FLOPs count only allowed (q, k) pairs (SliceArea): forward 4·area·Hq·D,
// backward 10·area·Hq·D (2.5x forward, the flash-attention convention).
// Each rate is the median of --reps timed runs (CUDA events) after warm-up.
// Two timings per direction:
//   call:   everything a caller of the varlen API gets, like torch's op:
//           forward = init accumulators + Forward + cast O; backward =
//           zero accumulators + ComputeDelta + Backward + cast dQ/dK/dV;
//   kernel: Forward (resp. Backward) alone.
// --dump_dir also runs a small problem (the first documents, 2048 tokens)
// and writes its inputs and outputs there for torch_flash_bench.py, which
// measures our error and PyTorch's against float64 on identical inputs.
// Output lines "BENCH kernel=... dtype=... D=... T=... tflops_call=...
// tflops_kernel=... ms_call=..." are parsed by device_check.sh.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "common/dtype.h"
#include "common/mask.h"
#include "common/workload.h"
#include "kernels/cuda/attention.h"
#include "tests/gpu/device_buffer.h"

ABSL_FLAG(std::string, workload, "", "document lengths, one per line (default: FindWorkload())");
ABSL_FLAG(int64_t, tokens, 16384, "tokens in the packed sequence");
ABSL_FLAG(int, heads, 16, "query heads (= kv heads)");
ABSL_FLAG(int, head_dim, 128, "head dimension: 64, 128 or 256");
ABSL_FLAG(std::string, dtype, "bf16", "bf16 or fp16");
ABSL_FLAG(int, reps, 20, "timed runs per measurement (median)");
ABSL_FLAG(uint64_t, seed, 2026, "shuffle and data seed");
ABSL_FLAG(std::string, cu_seqlens_out, "", "write the pack's cu_seqlens here");
ABSL_FLAG(std::string, dump_dir, "", "write a small problem's inputs and outputs here");

namespace hsap {
namespace {

namespace gpu = kernels::cuda;
using gpu_test::CudaOrDie;
using gpu_test::DeviceBuffer;

struct Options {
  std::string workload;
  int64_t tokens = 16384;
  int heads = 16;
  int head_dim = 128;
  DType dtype = DType::kBFloat16;
  int reps = 20;
  uint64_t seed = 2026;
  std::string cu_seqlens_out;
  std::string dump_dir;
};

Options ParseOptions(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  Options o;
  o.workload = absl::GetFlag(FLAGS_workload);
  o.tokens = absl::GetFlag(FLAGS_tokens);
  o.heads = absl::GetFlag(FLAGS_heads);
  o.head_dim = absl::GetFlag(FLAGS_head_dim);
  o.reps = absl::GetFlag(FLAGS_reps);
  o.seed = absl::GetFlag(FLAGS_seed);
  o.cu_seqlens_out = absl::GetFlag(FLAGS_cu_seqlens_out);
  o.dump_dir = absl::GetFlag(FLAGS_dump_dir);
  const std::string dtype = absl::GetFlag(FLAGS_dtype);
  if (!ParseDType(dtype, &o.dtype)) {
    std::fprintf(stderr, "unknown --dtype=%s\n", dtype.c_str());
    std::exit(2);
  }
  if (o.workload.empty()) o.workload = FindWorkload();
  return o;
}

// Median milliseconds of `reps` runs of `body` on the legacy stream.
double MedianMs(int reps, const std::function<void()>& body) {
  for (int i = 0; i < 3; ++i) body();  // warm-up
  CudaOrDie(cudaDeviceSynchronize(), "warm-up");
  cudaEvent_t start, stop;
  CudaOrDie(cudaEventCreate(&start), "event");
  CudaOrDie(cudaEventCreate(&stop), "event");
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    CudaOrDie(cudaEventRecord(start, nullptr), "record");
    body();
    CudaOrDie(cudaEventRecord(stop, nullptr), "record");
    CudaOrDie(cudaEventSynchronize(stop), "sync");
    float t = 0;
    CudaOrDie(cudaEventElapsedTime(&t, start, stop), "elapsed");
    ms.push_back(t);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

void Check(const absl::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, s.ToString().c_str());
    std::exit(1);
  }
}

// One packed problem on the GPU: random inputs, accumulators, outputs and
// the work items of its causal documents.
class Problem {
 public:
  Problem(const std::vector<int64_t>& cu, int heads, int head_dim, DType dtype, uint64_t seed)
      : T_(cu.back()),
        H_(heads),
        D_(head_dim),
        n_(T_ * H_ * D_),
        esz_(DTypeSize(dtype)),
        shape_{heads, heads, head_dim, dtype, 1.f / std::sqrt(static_cast<float>(head_dim))},
        slices_(LowerDocuments(cu, /*causal=*/true, /*window=*/-1)) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    auto random_typed = [&]() {
      std::vector<uint8_t> bytes(n_ * esz_);
      for (int64_t i = 0; i < n_; ++i) StoreFromFloat(bytes.data(), dtype, i, u(rng));
      return DeviceBuffer::FromVector(bytes);
    };
    q_ = random_typed();
    k_ = random_typed();
    v_ = random_typed();
    dout_ = random_typed();
    o_ = DeviceBuffer(n_ * esz_);
    dq_ = DeviceBuffer(n_ * esz_);
    dk_ = DeviceBuffer(n_ * esz_);
    dv_ = DeviceBuffer(n_ * esz_);
    o_acc_ = DeviceBuffer(n_ * 4);
    dq_acc_ = DeviceBuffer(n_ * 4);
    dk_acc_ = DeviceBuffer(n_ * 4);
    dv_acc_ = DeviceBuffer(n_ * 4);
    lse_ = DeviceBuffer(H_ * T_ * 4);
    delta_ = DeviceBuffer(H_ * T_ * 4);
    minus_inf_ = DeviceBuffer::FromVector(std::vector<float>(H_ * T_, -INFINITY));
    const int64_t row = static_cast<int64_t>(H_) * D_;
    for (const MaskSlice& s : slices_) {
      gpu::FwdWorkItem f;
      f.q = q_.as<uint8_t>() + s.q_begin * row * esz_;
      f.k = k_.as<uint8_t>() + s.k_begin * row * esz_;
      f.v = v_.as<uint8_t>() + s.k_begin * row * esz_;
      f.num_q = s.num_q();
      f.num_k = s.num_k();
      f.type = s.type;
      f.offset = s.offset;
      f.window = s.window;
      f.o_acc = o_acc_.as<float>() + s.q_begin * row;
      f.lse_acc = lse_.as<float>() + s.q_begin;
      f.lse_stride = T_;
      fwd_.push_back(f);
      gpu::BwdWorkItem b;
      b.q = f.q;
      b.k = f.k;
      b.v = f.v;
      b.dout = dout_.as<uint8_t>() + s.q_begin * row * esz_;
      b.lse = f.lse_acc;
      b.delta = delta_.as<float>() + s.q_begin;
      b.lse_stride = T_;
      b.num_q = f.num_q;
      b.num_k = f.num_k;
      b.type = s.type;
      b.offset = s.offset;
      b.window = s.window;
      b.dq_acc = dq_acc_.as<float>() + s.q_begin * row;
      b.dk_acc = dk_acc_.as<float>() + s.k_begin * row;
      b.dv_acc = dv_acc_.as<float>() + s.k_begin * row;
      bwd_.push_back(b);
    }
  }

  int64_t Area() const {
    int64_t area = 0;
    for (const MaskSlice& s : slices_) area += SliceArea(s);
    return area;
  }
  int64_t Longest() const {
    int64_t longest = 0;
    for (const MaskSlice& s : slices_) longest = std::max(longest, s.num_q());
    return longest;
  }
  size_t NumDocuments() const { return slices_.size(); }

  // Everything a varlen forward call does: O (dtype) and LSE from scratch.
  void ForwardCall() {
    CudaOrDie(cudaMemsetAsync(o_acc_.get(), 0, o_acc_.bytes(), nullptr), "memset");
    CudaOrDie(cudaMemcpyAsync(lse_.get(), minus_inf_.get(), lse_.bytes(),
                              cudaMemcpyDeviceToDevice, nullptr),
              "lse init");
    ForwardKernel();
    Check(gpu::CastFromFloat(o_acc_.as<float>(), n_, shape_.dtype, o_.get(), nullptr), "cast");
  }
  void ForwardKernel() { Check(gpu::Forward(shape_, fwd_, nullptr), "Forward"); }

  // Everything a varlen backward call does: dQ, dK, dV (dtype) from O, LSE, dO.
  void BackwardCall() {
    for (DeviceBuffer* b : {&dq_acc_, &dk_acc_, &dv_acc_}) {
      CudaOrDie(cudaMemsetAsync(b->get(), 0, b->bytes(), nullptr), "memset");
    }
    Check(gpu::ComputeDelta(shape_, o_.get(), dout_.get(), T_, delta_.as<float>(), T_, nullptr),
          "ComputeDelta");
    BackwardKernel();
    Check(gpu::CastFromFloat(dq_acc_.as<float>(), n_, shape_.dtype, dq_.get(), nullptr), "cast");
    Check(gpu::CastFromFloat(dk_acc_.as<float>(), n_, shape_.dtype, dk_.get(), nullptr), "cast");
    Check(gpu::CastFromFloat(dv_acc_.as<float>(), n_, shape_.dtype, dv_.get(), nullptr), "cast");
  }
  void BackwardKernel() { Check(gpu::Backward(shape_, bwd_, nullptr), "Backward"); }

  // Writes inputs and outputs as raw little-endian files under `dir`
  // (q, k, v, dout, o, dq, dk, dv: [T, H, D] dtype; lse: [H, T] fp32).
  void Dump(const std::string& dir) const {
    auto write = [&](const char* name, const DeviceBuffer& b) {
      const std::vector<uint8_t> bytes = b.ToHost<uint8_t>();
      std::ofstream out(dir + "/" + name, std::ios::binary);
      out.write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    };
    write("q.bin", q_);
    write("k.bin", k_);
    write("v.bin", v_);
    write("dout.bin", dout_);
    write("o.bin", o_);
    write("lse.bin", lse_);
    write("dq.bin", dq_);
    write("dk.bin", dk_);
    write("dv.bin", dv_);
  }

 private:
  int64_t T_;
  int H_, D_;
  int64_t n_;
  size_t esz_;
  gpu::AttentionShape shape_;
  std::vector<MaskSlice> slices_;
  DeviceBuffer q_, k_, v_, dout_, o_, dq_, dk_, dv_;
  DeviceBuffer o_acc_, dq_acc_, dk_acc_, dv_acc_, lse_, delta_, minus_inf_;
  std::vector<gpu::FwdWorkItem> fwd_;
  std::vector<gpu::BwdWorkItem> bwd_;
};

void WriteCuSeqlens(const std::string& path, const std::vector<int64_t>& cu) {
  std::ofstream out(path);
  for (size_t i = 0; i < cu.size(); ++i) out << cu[i] << (i + 1 < cu.size() ? "," : "\n");
}

int Main(int argc, char** argv) {
  const Options opt = ParseOptions(argc, argv);
  auto lengths = LoadDocumentLengths(opt.workload);
  if (!lengths.ok()) {
    std::fprintf(stderr, "%s\n", lengths.status().ToString().c_str());
    return 1;
  }
  const std::vector<int64_t> cu = PackDocuments(*lengths, opt.tokens, 1, opt.seed)[0];
  if (!opt.cu_seqlens_out.empty()) WriteCuSeqlens(opt.cu_seqlens_out, cu);
  const std::string why = gpu_test::NoGpuReason();
  if (!why.empty()) {
    std::fprintf(stderr, "kernel_bench: %s\n", why.c_str());
    return 3;
  }
  cudaDeviceProp prop;
  CudaOrDie(cudaGetDeviceProperties(&prop, 0), "properties");

  if (!opt.dump_dir.empty()) {
    // A small problem (the first documents up to 2048 tokens) whose inputs
    // and outputs torch_flash_bench.py compares with float64 and with torch.
    std::vector<int64_t> small = {0};
    for (size_t i = 1; i < cu.size() && small.back() < 2048; ++i) {
      small.push_back(std::min<int64_t>(cu[i], 2048));
    }
    Problem p(small, opt.heads, opt.head_dim, opt.dtype, opt.seed + 1);
    p.ForwardCall();
    p.BackwardCall();
    CudaOrDie(cudaDeviceSynchronize(), "small case");
    p.Dump(opt.dump_dir);
    WriteCuSeqlens(opt.dump_dir + "/cu_seqlens.txt", small);
  }

  Problem p(cu, opt.heads, opt.head_dim, opt.dtype, opt.seed);
  const double fwd_call_ms = MedianMs(opt.reps, [&]() { p.ForwardCall(); });
  // Kernel-only forwards merge into accumulators whose LSE keeps growing;
  // the work per launch is the same.
  const double fwd_kernel_ms = MedianMs(opt.reps, [&]() { p.ForwardKernel(); });
  p.ForwardCall();  // a clean O and LSE for the backward
  const double bwd_call_ms = MedianMs(opt.reps, [&]() { p.BackwardCall(); });
  const double bwd_kernel_ms = MedianMs(opt.reps, [&]() { p.BackwardKernel(); });
  CudaOrDie(cudaDeviceSynchronize(), "final");

  const int H = opt.heads, D = opt.head_dim;
  const double area = static_cast<double>(p.Area());
  const double fwd_flops = 4.0 * area * H * D, bwd_flops = 10.0 * area * H * D;
  std::printf("kernel_bench: %s (sm_%d%d), median of %d reps\n", prop.name, prop.major,
              prop.minor, opt.reps);
  std::printf("pack: T=%lld tokens, %zu causal documents (longest %lld), area %.0f pairs, "
              "workload %s\n",
              static_cast<long long>(opt.tokens), p.NumDocuments(),
              static_cast<long long>(p.Longest()), area, opt.workload.c_str());
  const char* dtype = opt.dtype == DType::kBFloat16 ? "bf16" : "fp16";
  const long long T = opt.tokens;
  std::printf("BENCH kernel=fwd dtype=%s D=%d H=%d T=%lld tflops_call=%.1f tflops_kernel=%.1f "
              "ms_call=%.3f ms_kernel=%.3f\n",
              dtype, D, H, T, fwd_flops / fwd_call_ms / 1e9, fwd_flops / fwd_kernel_ms / 1e9,
              fwd_call_ms, fwd_kernel_ms);
  std::printf("BENCH kernel=bwd dtype=%s D=%d H=%d T=%lld tflops_call=%.1f tflops_kernel=%.1f "
              "ms_call=%.3f ms_kernel=%.3f\n",
              dtype, D, H, T, bwd_flops / bwd_call_ms / 1e9, bwd_flops / bwd_kernel_ms / 1e9,
              bwd_call_ms, bwd_kernel_ms);
  return 0;
}

}  // namespace
}  // namespace hsap

int main(int argc, char** argv) { return hsap::Main(argc, argv); }
