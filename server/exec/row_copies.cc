#include "server/exec/row_copies.h"

#include "server/plan/wire_layout.h"

namespace hsap::exec {
namespace {

using plan::Payload;
using plan::WireTensor;

// Where one field's rows live in the rank's memory.
struct Spot {
  enum Kind { kNone, kRows, kAccHeads, kLseColumns } kind = kNone;
  // kRows: the field's first head in row 0, and the row stride in bytes.
  char* base = nullptr;
  int64_t row_stride = 0;
  // kAccHeads: heads [head0, head0 + heads) of an accumulator.
  const GroupedAcc* acc = nullptr;
  // kLseColumns: lse + head * lse_stride + row, heads from head0.
  float* lse = nullptr;
  int64_t lse_stride = 0;
  int32_t head0 = 0;
  // Storage rows copied as they are, fp32 rows added (unpack only).
  bool add_fp32 = false;
};

Spot Rows(char* base, int64_t row_stride) {
  Spot s;
  s.kind = Spot::kRows;
  s.base = base;
  s.row_stride = row_stride;
  return s;
}
Spot Acc(const GroupedAcc& acc, int32_t head0) {
  Spot s;
  s.kind = Spot::kAccHeads;
  s.acc = &acc;
  s.head0 = head0;
  return s;
}
Spot Lse(float* lse, int64_t stride, int32_t head0) {
  Spot s;
  s.kind = Spot::kLseColumns;
  s.lse = lse;
  s.lse_stride = stride;
  s.head0 = head0;
  return s;
}

// The sender's side of a field.
Spot PackSpot(const RankLayout& l, const RankMemory& m, const plan::Transfer& t, WireTensor f) {
  const int64_t es = l.elem_bytes, D = l.shape.head_dim;
  const int64_t Hq = l.shape.num_heads_q, Hkv = l.shape.num_heads_kv;
  const int64_t qb = t.q_head_begin, kb = t.kv_head_begin;
  const int32_t qs = t.q_head_begin - l.q_head_begin, ks = t.kv_head_begin - l.kv_head_begin;
  auto local = [&](char* base, int64_t heads, int64_t first) {
    return Rows(base + first * D * es, heads * D * es);
  };
  switch (t.payload) {
    case Payload::kKv:
      return f == WireTensor::kK ? Rows(m.kv_home.k.base, m.kv_home.k.stride * es)
                                 : Rows(m.kv_home.v.base, m.kv_home.v.stride * es);
    case Payload::kQkvHeads:
      if (f == WireTensor::kQ) return local(m.local.q, Hq, qb);
      return local(f == WireTensor::kK ? m.local.k : m.local.v, Hkv, kb);
    case Payload::kOutLseHeads:
      return f == WireTensor::kO ? Acc(m.o_acc, qs) : Lse(m.lse_home, m.lse_stride, qs);
    case Payload::kBwdHeads:
      switch (f) {
        case WireTensor::kQ: return local(m.local.q, Hq, qb);
        case WireTensor::kO: return local(m.local.o, Hq, qb);
        case WireTensor::kDo: return local(m.local.d_o, Hq, qb);
        case WireTensor::kK: return local(m.local.k, Hkv, kb);
        case WireTensor::kV: return local(m.local.v, Hkv, kb);
        default: return Lse(m.local.lse, l.local_rows, static_cast<int32_t>(qb));
      }
    case Payload::kGradQkvHeads:
      if (f == WireTensor::kDq) return Acc(m.dq_acc, qs);
      return Acc(f == WireTensor::kDk ? m.dk_home : m.dv_home, ks);
    case Payload::kGradKv:
      return Acc(f == WireTensor::kDk ? m.dk_recv : m.dv_recv, 0);
  }
  return {};
}

// The receiver's side of a field.
Spot UnpackSpot(const RankLayout& l, const RankMemory& m, const plan::Transfer& t, WireTensor f) {
  const int64_t es = l.elem_bytes, D = l.shape.head_dim;
  const int64_t Hq = l.shape.num_heads_q, Hkv = l.shape.num_heads_kv;
  const int64_t qb = t.q_head_begin, kb = t.kv_head_begin;
  auto home = [&](const RowsView& v) { return Rows(v.base, v.stride * es); };
  switch (t.payload) {
    case Payload::kKv:
      return {};  // landed in place
    case Payload::kQkvHeads:
      return f == WireTensor::kQ   ? home(m.q_home)
             : f == WireTensor::kK ? home(m.kv_home.k)
                                   : home(m.kv_home.v);
    case Payload::kOutLseHeads:
      if (f == WireTensor::kO) return Rows(m.local.o + qb * D * es, Hq * D * es);
      return Lse(m.local.lse, l.local_rows, static_cast<int32_t>(qb));
    case Payload::kBwdHeads:
      switch (f) {
        case WireTensor::kQ: return home(m.q_home);
        case WireTensor::kO: return home(m.o_home);
        case WireTensor::kDo: return home(m.do_home);
        case WireTensor::kK: return home(m.kv_home.k);
        case WireTensor::kV: return home(m.kv_home.v);
        default: return Lse(m.lse_home, m.lse_stride, 0);
      }
    case Payload::kGradQkvHeads: {
      if (f == WireTensor::kDq) return Rows(m.local.dq + qb * D * es, Hq * D * es);
      float* dst = f == WireTensor::kDk ? m.local_dk : m.local_dv;
      Spot s = Rows(reinterpret_cast<char*>(dst + kb * D), Hkv * D * 4);
      s.add_fp32 = true;
      return s;
    }
    case Payload::kGradKv: {
      Spot s = Acc(f == WireTensor::kDk ? m.dk_home : m.dv_home, 0);
      s.add_fp32 = true;
      return s;
    }
  }
  return {};
}

}  // namespace

void AppendTransferCopies(const RankLayout& l, const RankMemory& m, const plan::Transfer& t,
                          bool pack, char* wire, std::vector<RowCopy>* out) {
  const int32_t D = l.shape.head_dim;
  const DType dtype = l.shape.dtype;
  const plan::RowLayout row =
      plan::PayloadRowLayout(t.payload, t.q_head_end - t.q_head_begin,
                             t.kv_head_end - t.kv_head_begin, D, dtype);
  const int64_t rb = row.row_bytes();
  for (const plan::RowField& f : row.fields()) {
    const Spot s = pack ? PackSpot(l, m, t, f.tensor) : UnpackSpot(l, m, t, f.tensor);
    if (s.kind == Spot::kNone || f.heads == 0) continue;
    const int64_t head_bytes = f.bytes / f.heads;
    // The element type on the wire: fp32 fields (LSE, dK/dV partials) move
    // accumulator floats as they are and are added as floats.
    const DType wire_type = f.type == plan::WireType::kFloat32 ? DType::kFloat32 : dtype;
    int64_t offset = 0;  // of the segment's first row in the wire data
    for (const plan::Segment& seg : t.segments) {
      const int64_t rows = seg.global_end - seg.global_begin;
      char* w = wire + offset + f.offset;
      offset += rows * rb;
      if (rows == 0) continue;
      auto emit = [&](char* mem, int64_t mem_stride, int64_t bytes, CopyOp op, int64_t elems) {
        RowCopy c;
        c.rows = rows;
        c.op = op;
        c.dtype = wire_type;
        c.elems = elems;
        if (pack) {
          c.src = mem;
          c.src_stride = mem_stride;
          c.dst = w;
          c.dst_stride = rb;
        } else {
          c.src = w;
          c.src_stride = rb;
          c.dst = mem;
          c.dst_stride = mem_stride;
        }
        out->push_back(c);
        w += bytes;
      };
      switch (s.kind) {
        case Spot::kRows: {
          char* mem = s.base + seg.row * s.row_stride;
          if (s.add_fp32) {
            emit(mem, s.row_stride, f.bytes, CopyOp::kAddLoaded, f.heads * f.elems_per_head);
          } else {
            emit(mem, s.row_stride, f.bytes, CopyOp::kCopy, f.bytes);
          }
          break;
        }
        case Spot::kAccHeads:
          for (int32_t j = 0; j < f.heads; ++j) {
            const int32_t h = s.head0 + j;
            char* mem = reinterpret_cast<char*>(s.acc->Head(seg.row, h));
            const CopyOp op = pack ? CopyOp::kStoreFloat : CopyOp::kAddLoaded;
            emit(mem, s.acc->HeadRowStride(h) * 4, head_bytes, op, D);
          }
          break;
        case Spot::kLseColumns:
          for (int32_t j = 0; j < f.heads; ++j) {
            char* mem = reinterpret_cast<char*>(s.lse + (s.head0 + j) * s.lse_stride + seg.row);
            emit(mem, 4, 4, CopyOp::kCopy, 4);
          }
          break;
        case Spot::kNone:
          break;
      }
    }
  }
}

}  // namespace hsap::exec
