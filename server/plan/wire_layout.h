// The wire layout of plan transfers, defined once: what each row of each
// payload kind carries, in which order and element type. The compiler counts
// bytes with it (plan statistics, receive buffers, the cost model) and the
// executor packs and unpacks rows with it, so the two cannot disagree.
//
// A row is a sequence of fields; each field holds `heads` heads of one
// tensor, each head `elems_per_head` elements (D, or 1 for LSE) of `type`
// (the call's storage dtype, or fp32). Fields follow each other without
// padding.
//
//   payload          fields (q: the transfer's q heads, kv: its kv heads)
//   kKv              K(kv), V(kv)                      storage
//   kGradKv          dK(kv), dV(kv)                    fp32 (partials the owner adds)
//   kQkvHeads        Q(q), K(kv), V(kv)                storage
//   kOutLseHeads     O(q) storage, LSE(q) fp32
//   kBwdHeads        Q(q), O(q), dO(q), K(kv), V(kv) storage, LSE(q) fp32
//   kGradQkvHeads    dQ(q) storage; dK(kv), dV(kv) fp32 (a kv head shared by
//                    two slots gets partials from both, which the owner adds)
//
// Partial results that are summed across ranks or head slots travel in fp32
// and are rounded once, by their owner, to the storage dtype: the sum is
// what one device would give.
//
// Example:
//   const RowLayout row = PayloadRowLayout(Payload::kKv, 0, kv_heads, D, dtype);
//   for (const RowField& f : row.fields()) { ... f.offset, f.bytes ... }
#ifndef HSAP_SERVER_PLAN_WIRE_LAYOUT_H_
#define HSAP_SERVER_PLAN_WIRE_LAYOUT_H_

#include <array>
#include <cstdint>

#include "absl/types/span.h"
#include "common/dtype.h"

namespace hsap::plan {

// What each row of a transfer carries (layouts above).
enum class Payload : uint8_t {
  kKv = 0,             // K and V of the slot's kv heads
  kGradKv = 1,         // dK and dV partials (fp32), to be added by the owner
  kQkvHeads = 2,       // forward head scatter: Q, K, V of the receiver's heads
  kOutLseHeads = 3,    // forward head gather: O and LSE (fp32) of the sender's heads
  kBwdHeads = 4,       // backward head scatter: Q, K, V, O, dO, LSE of the receiver's heads
  kGradQkvHeads = 5,   // backward head gather: dQ, dK, dV of the sender's heads
};

// The tensors a field can hold.
enum class WireTensor : uint8_t { kQ, kK, kV, kO, kDo, kLse, kDq, kDk, kDv };

enum class WireType : uint8_t {
  kStorage,  // the call's dtype (fp32, bf16 or fp16)
  kFloat32,
};

struct RowField {
  WireTensor tensor = WireTensor::kQ;
  WireType type = WireType::kStorage;
  bool q_heads = false;        // q heads of the transfer (else its kv heads)
  int64_t heads = 0;
  int64_t elems_per_head = 0;  // D, or 1 for LSE
  int64_t offset = 0;          // bytes from the row's start
  int64_t bytes = 0;           // heads * elems_per_head * element size
};

class RowLayout {
 public:
  absl::Span<const RowField> fields() const { return {fields_.data(), num_fields_}; }
  int64_t row_bytes() const { return row_bytes_; }
  // The field holding `tensor`; REQUIRES: the payload carries it.
  const RowField& field(WireTensor tensor) const;

 private:
  friend RowLayout PayloadRowLayout(Payload, int64_t, int64_t, int32_t, DType);
  void Add(WireTensor tensor, WireType type, bool q_heads, int64_t heads, int64_t elems,
           DType dtype);
  std::array<RowField, 6> fields_{};
  size_t num_fields_ = 0;
  int64_t row_bytes_ = 0;
};

// The layout of one row of `payload` carrying `q_heads` q heads and
// `kv_heads` kv heads of dimension `head_dim`, storage `dtype`.
RowLayout PayloadRowLayout(Payload payload, int64_t q_heads, int64_t kv_heads, int32_t head_dim,
                           DType dtype);

// Bytes of a kGradKv row over bytes of the kKv row it returns for: 4 /
// size of `dtype` (1 for fp32, 2 for bf16 and fp16).
int64_t ReturnBytesRatio(DType dtype);

// PayloadRowLayout(...).row_bytes().
int64_t PayloadRowBytes(Payload payload, int64_t q_heads, int64_t kv_heads, int32_t head_dim,
                        DType dtype);

}  // namespace hsap::plan

#endif  // HSAP_SERVER_PLAN_WIRE_LAYOUT_H_
