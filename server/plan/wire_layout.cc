#include "server/plan/wire_layout.h"

#include "common/logging.h"

namespace hsap::plan {

void RowLayout::Add(WireTensor tensor, WireType type, bool q_heads, int64_t heads, int64_t elems,
                    DType dtype) {
  RowField& f = fields_[num_fields_++];
  f.tensor = tensor;
  f.type = type;
  f.q_heads = q_heads;
  f.heads = heads;
  f.elems_per_head = elems;
  f.offset = row_bytes_;
  f.bytes = heads * elems * (type == WireType::kFloat32 ? 4 : DTypeSize(dtype));
  row_bytes_ += f.bytes;
}

const RowField& RowLayout::field(WireTensor tensor) const {
  for (size_t i = 0; i < num_fields_; ++i) {
    if (fields_[i].tensor == tensor) return fields_[i];
  }
  HSAP_CHECK(false) << "the payload carries no such tensor";
  return fields_[0];
}

RowLayout PayloadRowLayout(Payload payload, int64_t q_heads, int64_t kv_heads, int32_t head_dim,
                           DType dtype) {
  using T = WireTensor;
  constexpr WireType kS = WireType::kStorage, kF = WireType::kFloat32;
  const int64_t d = head_dim;
  RowLayout row;
  switch (payload) {
    case Payload::kKv:
      row.Add(T::kK, kS, false, kv_heads, d, dtype);
      row.Add(T::kV, kS, false, kv_heads, d, dtype);
      break;
    case Payload::kGradKv:
      row.Add(T::kDk, kF, false, kv_heads, d, dtype);
      row.Add(T::kDv, kF, false, kv_heads, d, dtype);
      break;
    case Payload::kQkvHeads:
      row.Add(T::kQ, kS, true, q_heads, d, dtype);
      row.Add(T::kK, kS, false, kv_heads, d, dtype);
      row.Add(T::kV, kS, false, kv_heads, d, dtype);
      break;
    case Payload::kOutLseHeads:
      row.Add(T::kO, kS, true, q_heads, d, dtype);
      row.Add(T::kLse, kF, true, q_heads, 1, dtype);
      break;
    case Payload::kBwdHeads:
      row.Add(T::kQ, kS, true, q_heads, d, dtype);
      row.Add(T::kO, kS, true, q_heads, d, dtype);
      row.Add(T::kDo, kS, true, q_heads, d, dtype);
      row.Add(T::kK, kS, false, kv_heads, d, dtype);
      row.Add(T::kV, kS, false, kv_heads, d, dtype);
      row.Add(T::kLse, kF, true, q_heads, 1, dtype);
      break;
    case Payload::kGradQkvHeads:
      row.Add(T::kDq, kS, true, q_heads, d, dtype);
      row.Add(T::kDk, kF, false, kv_heads, d, dtype);
      row.Add(T::kDv, kF, false, kv_heads, d, dtype);
      break;
  }
  return row;
}

int64_t ReturnBytesRatio(DType dtype) {
  return PayloadRowBytes(Payload::kGradKv, 0, 1, 1, dtype) /
         PayloadRowBytes(Payload::kKv, 0, 1, 1, dtype);
}

int64_t PayloadRowBytes(Payload payload, int64_t q_heads, int64_t kv_heads, int32_t head_dim,
                        DType dtype) {
  return PayloadRowLayout(payload, q_heads, kv_heads, head_dim, dtype).row_bytes();
}

}  // namespace hsap::plan
