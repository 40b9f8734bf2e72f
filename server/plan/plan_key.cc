#include "server/plan/plan_key.h"

#include <utility>

#include "absl/strings/str_format.h"
#include "server/plan/plan_spec.h"

namespace hsap::plan {
namespace {

// A streaming 64-bit hash over 64-bit words: one multiply-rotate step per
// word with a per-stream multiplier and rotation (cheap: the cache-hit path hashes every request) and the
// murmur3/splitmix finalizer at the end. Stable by construction (no
// per-process seed).
class StableHasher {
 public:
  StableHasher(uint64_t seed, uint64_t multiplier, int rotation)
      : state_(seed), multiplier_(multiplier), rotation_(rotation) {}
  void Add(uint64_t word) {
    state_ = Rotl(state_ ^ (word * 0x9e3779b97f4a7c15ull), rotation_) * multiplier_ +
             0x165667b19e3779f9ull;
    ++count_;
  }
  uint64_t Finish() const { return Mix(state_ ^ count_); }

 private:
  static uint64_t Rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
  static uint64_t Mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  uint64_t state_;
  const uint64_t multiplier_;
  const int rotation_;
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
  StableHasher a(0x243f6a8885a308d3ull, 0xff51afd7ed558ccdull, 27);
  StableHasher b(0x13198a2e03707344ull, 0xc4ceb9fe1a85ec53ull, 31);
  Encode(spec, format_version, [&](uint64_t w) {
    a.Add(w);
    b.Add(w);
  });
  return PlanKey{a.Finish(), b.Finish()};
}

}  // namespace hsap::plan
