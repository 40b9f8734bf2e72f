#include "kernels/cpu/test_util.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace hsap::kernels::cpu::testing {

void TypedBuffer::FillRandom(std::mt19937_64* rng, float amplitude) {
  std::uniform_real_distribution<float> dist(-amplitude, amplitude);
  for (int64_t i = 0; i < n_; ++i) StoreFromFloat(data(), dtype_, i, dist(*rng));
}

std::vector<double> TypedBuffer::ToDouble() const {
  std::vector<double> out(static_cast<size_t>(n_));
  for (int64_t i = 0; i < n_; ++i) out[i] = LoadAsFloat(data(), dtype_, i);
  return out;
}

std::vector<double> RoundedThrough(const std::vector<double>& values, DType dtype) {
  std::vector<double> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    out[i] = RoundThrough(dtype, static_cast<float>(values[i]));
  }
  return out;
}

std::string RandomCase::Describe() const {
  std::string s = absl::StrCat(DTypeName(shape.dtype), " Hq=", shape.num_heads_q,
                               " Hkv=", shape.num_heads_kv, " D=", shape.head_dim,
                               " scale=", shape.softmax_scale, " nq=", num_q, " nk=", num_k, ":");
  for (const MaskSlice& sl : slices) absl::StrAppend(&s, " {", SliceDebugString(sl), "}");
  return s;
}

namespace {

int64_t Uniform(std::mt19937_64* rng, int64_t lo, int64_t hi) {  // inclusive
  return std::uniform_int_distribution<int64_t>(lo, hi)(*rng);
}

// A random window: none half of the time, else 0..span.
int64_t DrawWindow(std::mt19937_64* rng, int64_t span) {
  return Uniform(rng, 0, 1) == 0 ? -1 : Uniform(rng, 0, std::max<int64_t>(span, 0));
}

}  // namespace

RandomCase DrawCase(std::mt19937_64* rng, const std::vector<DType>& dtypes, int64_t max_tokens) {
  RandomCase c;
  static const int kDims[] = {32, 40, 48, 64, 64, 72, 96, 128, 128, 136, 192, 256, 36};
  c.shape.head_dim = kDims[Uniform(rng, 0, std::size(kDims) - 1)];
  c.shape.num_heads_kv = static_cast<int>(Uniform(rng, 1, 2));
  c.shape.num_heads_q = c.shape.num_heads_kv * static_cast<int>(Uniform(rng, 1, 3));
  c.shape.dtype = dtypes[Uniform(rng, 0, dtypes.size() - 1)];
  c.shape.softmax_scale = 1.f / std::sqrt(static_cast<float>(c.shape.head_dim));
  if (Uniform(rng, 0, 4) == 0) c.shape.softmax_scale *= 4.f;  // peaky softmax
  const int64_t budget = max_tokens * 128 / std::max(c.shape.head_dim, 64);  // keep big D small

  switch (Uniform(rng, 0, 3)) {
    case 0: {  // packed documents, causal or bidirectional, maybe windowed
      const int64_t total = Uniform(rng, 0, budget);
      std::vector<int64_t> cu = {0};
      while (cu.back() < total) {
        const int64_t len = Uniform(rng, 0, 3) == 0 ? 0 : Uniform(rng, 1, std::max<int64_t>(total / 2, 1));
        cu.push_back(std::min(total, cu.back() + len));
      }
      const bool causal = Uniform(rng, 0, 3) != 0;
      c.slices = LowerDocuments(cu, causal, causal ? DrawWindow(rng, total / 3) : -1);
      c.num_q = c.num_k = total;
      break;
    }
    case 1: {  // one rectangle: any offset, bottom-right, windows
      c.num_q = Uniform(rng, 0, budget);
      c.num_k = Uniform(rng, 0, budget);
      MaskSlice s;
      s.q_end = c.num_q;
      s.k_end = c.num_k;
      s.type = Uniform(rng, 0, 3) == 0 ? MaskType::kFull : MaskType::kCausal;
      if (s.type == MaskType::kCausal) {
        switch (Uniform(rng, 0, 3)) {
          case 0: s.offset = 0; break;
          case 1: s.offset = c.num_k - c.num_q; break;  // bottom-right
          case 2: s.offset = -Uniform(rng, 1, c.num_q + 3); break;  // rows that see nothing
          default: s.offset = Uniform(rng, -c.num_q, c.num_k + 3); break;
        }
        s.window = DrawWindow(rng, c.num_k);
      }
      c.slices.push_back(s);
      break;
    }
    default: {  // several slices over disjoint query ranges, any key ranges
      c.num_q = Uniform(rng, 0, budget);
      c.num_k = Uniform(rng, 0, budget);
      int64_t q = 0;
      while (q < c.num_q) {
        MaskSlice s;
        s.q_begin = q;
        s.q_end = q = std::min(c.num_q, q + Uniform(rng, 0, 70));
        s.k_begin = Uniform(rng, 0, c.num_k);
        s.k_end = Uniform(rng, s.k_begin, c.num_k);
        if (Uniform(rng, 0, 2) == 0) {
          s.type = MaskType::kFull;
        } else {
          s.type = MaskType::kCausal;
          s.offset = Uniform(rng, -s.num_q(), s.num_k() + 2);
          s.window = DrawWindow(rng, s.num_k());
        }
        c.slices.push_back(s);
      }
      break;
    }
  }
  return c;
}

}  // namespace hsap::kernels::cpu::testing
