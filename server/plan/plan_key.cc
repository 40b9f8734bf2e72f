#include "server/plan/plan_key.h"

#include <utility>

#include "absl/strings/str_format.h"
#include "server/plan/plan_spec.h"

namespace hsap::plan {
namespace {

// A streaming 64-bit hash over 64-bit words: each word is mixed with the
// murmur3/splitmix finalizer and folded into the state. Stable by
// construction (no per-process seed).
class StableHasher {
 public:
  explicit StableHasher(uint64_t seed) : state_(seed) {}
  void Add(uint64_t word) {
    state_ ^= Mix(word + 0x9e3779b97f4a7c15ull + (state_ << 6) + (state_ >> 2));
    state_ *= 0xff51afd7ed558ccdull;
    ++count_;
  }
  uint64_t Finish() const { return Mix(state_ ^ count_); }

 private:
  static uint64_t Mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  uint64_t state_;
  uint64_t count_ = 0;
};

template <typename F>
void Encode(const PlanSpec& spec, uint32_t version, F&& add) {
  add(0x48534150504c414eull);  // "HSAPPLAN"
  add(version);
  add(spec.total_tokens);
  add(spec.cu_seqlens.size());
  for (int64_t c : spec.cu_seqlens) add(static_cast<uint64_t>(c));
  add(spec.causal ? 1 : 0);
  add(static_cast<uint64_t>(spec.window));
  add(spec.slices.size());
  for (const MaskSlice& s : spec.slices) {
    add(s.q_begin);
    add(s.q_end);
    add(s.k_begin);
    add(s.k_end);
    add(static_cast<uint64_t>(s.type));
    add(static_cast<uint64_t>(s.offset));
    add(static_cast<uint64_t>(s.window));
  }
  add(spec.topology.num_nodes);
  add(spec.topology.devices_per_node);
  add(spec.shape.num_heads_q);
  add(spec.shape.num_heads_kv);
  add(spec.shape.head_dim);
  add(static_cast<uint64_t>(spec.shape.dtype));
  add(static_cast<uint64_t>(spec.strategy));
  add(static_cast<uint64_t>(spec.assignment));
  add(spec.profile.size());
  for (char c : spec.profile) add(static_cast<unsigned char>(c));
  add(static_cast<uint64_t>(spec.recv_buffer_bytes));
}

}  // namespace

std::string PlanKey::ToHex() const { return absl::StrFormat("%016x%016x", hi, lo); }

bool PlanKey::FromHex(absl::string_view hex, PlanKey* out) {
  if (hex.size() != 32) return false;
  uint64_t parts[2] = {0, 0};
  for (int i = 0; i < 32; ++i) {
    const char c = hex[i];
    int v;
    if (c >= '0' && c <= '9') {
      v = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      v = c - 'a' + 10;
    } else {
      return false;
    }
    parts[i / 16] = parts[i / 16] << 4 | static_cast<uint64_t>(v);
  }
  out->hi = parts[0];
  out->lo = parts[1];
  return true;
}

PlanKey ComputePlanKey(const PlanSpec& spec, uint32_t format_version) {
  StableHasher a(0x243f6a8885a308d3ull), b(0x13198a2e03707344ull);
  Encode(spec, format_version, [&](uint64_t w) {
    a.Add(w);
    b.Add(~w);
  });
  return PlanKey{a.Finish(), b.Finish()};
}

}  // namespace hsap::plan
