#include "server/exec/rank_memory.h"

#include <limits>

#include "common/status_macros.h"

namespace hsap::exec {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

}  // namespace

absl::StatusOr<char*> RankMemory::Take(ComputeBackend* backend, int64_t bytes) {
  HSAP_ASSIGN_OR_RETURN(BackendBuffer b, backend->Allocate(bytes));
  taken_ += bytes;
  char* data = b.data();
  owned_.push_back(std::move(b));
  return data;
}

absl::StatusOr<RankMemory> RankMemory::Allocate(const RankLayout& l, const RankBuffers& client,
                                                ComputeBackend* backend) {
  RankMemory m;
  m.layout_ = &l;
  m.client_ = client;
  const int64_t es = l.elem_bytes, D = l.shape.head_dim;
  const int64_t Hq = l.shape.num_heads_q, Hkv = l.shape.num_heads_kv;
  const int64_t nq = l.num_q_heads, nkv = l.num_kv_heads, n = l.local_rows;
  const bool bwd = l.backward();
  // The rank's own tensors.
  m.staged_ = !backend->addresses_host_memory();
  if (!m.staged_) {
    m.local = {static_cast<char*>(const_cast<void*>(client.q)),
               static_cast<char*>(const_cast<void*>(client.k)),
               static_cast<char*>(const_cast<void*>(client.v)),
               static_cast<char*>(client.o),
               client.lse,
               static_cast<char*>(const_cast<void*>(client.d_o)),
               static_cast<char*>(client.dq),
               static_cast<char*>(client.dk),
               static_cast<char*>(client.dv)};
  } else {
    HSAP_ASSIGN_OR_RETURN(m.local.q, m.Take(backend, n * Hq * D * es));
    HSAP_ASSIGN_OR_RETURN(m.local.k, m.Take(backend, n * Hkv * D * es));
    HSAP_ASSIGN_OR_RETURN(m.local.v, m.Take(backend, n * Hkv * D * es));
    HSAP_ASSIGN_OR_RETURN(m.local.o, m.Take(backend, n * Hq * D * es));
    HSAP_ASSIGN_OR_RETURN(char* lse, m.Take(backend, n * Hq * 4));
    m.local.lse = reinterpret_cast<float*>(lse);
    if (bwd) {
      HSAP_ASSIGN_OR_RETURN(m.local.d_o, m.Take(backend, n * Hq * D * es));
      HSAP_ASSIGN_OR_RETURN(m.local.dq, m.Take(backend, n * Hq * D * es));
      HSAP_ASSIGN_OR_RETURN(m.local.dk, m.Take(backend, n * Hkv * D * es));
      HSAP_ASSIGN_OR_RETURN(m.local.dv, m.Take(backend, n * Hkv * D * es));
    }
  }
  const int64_t kv_row = l.kv_row_elems;  // elements of an interleaved K/V row
  if (l.head_group_size == 1) {
    m.q_home = {m.local.q, Hq * D};
    m.kv_home = {{m.local.k, Hkv * D}, {m.local.v, Hkv * D}};
    m.o_home = {m.local.o, Hq * D};
    m.do_home = {m.local.d_o, Hq * D};
    m.lse_home = m.local.lse;
    m.lse_stride = n;
  } else {
    const int64_t home = l.home_rows;
    HSAP_ASSIGN_OR_RETURN(char* q, m.Take(backend, home * nq * D * es));
    HSAP_ASSIGN_OR_RETURN(char* kv, m.Take(backend, home * kv_row * es));
    m.q_home = {q, nq * D};
    m.kv_home = {{kv, kv_row}, {kv + nkv * D * es, kv_row}};
    HSAP_ASSIGN_OR_RETURN(char* lse, m.Take(backend, nq * home * 4));
    m.lse_home = reinterpret_cast<float*>(lse);
    m.lse_stride = home;
    HSAP_RETURN_IF_ERROR(backend->Fill(m.lse_home, nq * home, kNegInf));
    if (bwd) {
      HSAP_ASSIGN_OR_RETURN(char* o, m.Take(backend, home * nq * D * es));
      HSAP_ASSIGN_OR_RETURN(char* d_o, m.Take(backend, home * nq * D * es));
      m.o_home = {o, nq * D};
      m.do_home = {d_o, nq * D};
      HSAP_ASSIGN_OR_RETURN(char* dk, m.Take(backend, n * Hkv * D * 4));
      HSAP_ASSIGN_OR_RETURN(char* dv, m.Take(backend, n * Hkv * D * 4));
      m.local_dk = reinterpret_cast<float*>(dk);
      m.local_dv = reinterpret_cast<float*>(dv);
    }
  }
  HSAP_ASSIGN_OR_RETURN(char* recv, m.Take(backend, l.recv_rows * kv_row * es));
  m.kv_recv = {{recv, kv_row}, {recv + nkv * D * es, kv_row}};
  HSAP_ASSIGN_OR_RETURN(m.return_buf, m.Take(backend, l.return_bytes));
  HSAP_ASSIGN_OR_RETURN(m.send_staging, m.Take(backend, l.send_staging_bytes));
  HSAP_ASSIGN_OR_RETURN(m.recv_staging, m.Take(backend, l.recv_staging_bytes));
  m.recv_buffer_bytes = l.recv_rows * kv_row * es + l.return_bytes;
  auto acc = [&](const std::vector<int32_t>& widths, int64_t rows,
                 GroupedAcc* out) -> absl::Status {
    *out = GroupedAcc(widths, rows, static_cast<int32_t>(D));
    HSAP_ASSIGN_OR_RETURN(char* data, m.Take(backend, out->floats() * 4));
    out->Bind(reinterpret_cast<float*>(data));
    return absl::OkStatus();
  };
  if (!bwd) {
    HSAP_RETURN_IF_ERROR(acc(l.q_widths, l.home_rows, &m.o_acc));
    if (l.head_group_size == 1 && m.lse_home != nullptr) {
      HSAP_RETURN_IF_ERROR(backend->Fill(m.lse_home, nq * n, kNegInf));
    }
  } else {
    HSAP_RETURN_IF_ERROR(acc(l.q_widths, l.home_rows, &m.dq_acc));
    HSAP_RETURN_IF_ERROR(acc(l.kv_widths, l.home_rows, &m.dk_home));
    HSAP_RETURN_IF_ERROR(acc(l.kv_widths, l.home_rows, &m.dv_home));
    HSAP_RETURN_IF_ERROR(acc(l.kv_widths, l.recv_rows, &m.dk_recv));
    HSAP_RETURN_IF_ERROR(acc(l.kv_widths, l.recv_rows, &m.dv_recv));
    HSAP_ASSIGN_OR_RETURN(char* delta, m.Take(backend, nq * m.lse_stride * 4));
    m.delta = reinterpret_cast<float*>(delta);
  }
  return m;
}

int64_t RankMemory::BytesFor(const RankLayout& l, bool staged) {
  const int64_t es = l.elem_bytes, D = l.shape.head_dim;
  const int64_t Hq = l.shape.num_heads_q, Hkv = l.shape.num_heads_kv;
  const int64_t nq = l.num_q_heads, n = l.local_rows;
  const bool bwd = l.backward();
  int64_t bytes = 0;
  if (staged) {
    bytes += n * Hq * D * es * 2 + n * Hkv * D * es * 2 + n * Hq * 4;  // q, o; k, v; lse
    if (bwd) bytes += n * Hq * D * es * 2 + n * Hkv * D * es * 2;       // d_o, dq; dk, dv
  }
  if (l.head_group_size > 1) {
    const int64_t home = l.home_rows;
    bytes += home * nq * D * es + home * l.kv_row_elems * es + nq * home * 4;
    if (bwd) bytes += 2 * home * nq * D * es + 2 * n * Hkv * D * 4;
  }
  bytes += l.recv_rows * l.kv_row_elems * es + l.return_bytes + l.send_staging_bytes +
           l.recv_staging_bytes;
  int64_t q_width = 0, kv_width = 0;
  for (int32_t w : l.q_widths) q_width += w;
  for (int32_t w : l.kv_widths) kv_width += w;
  if (!bwd) {
    bytes += l.home_rows * q_width * D * 4;
  } else {
    const int64_t lse_stride = l.head_group_size == 1 ? n : l.home_rows;
    bytes += (l.home_rows * q_width + 2 * l.home_rows * kv_width + 2 * l.recv_rows * kv_width) *
                 D * 4 +
             nq * lse_stride * 4;
  }
  return bytes;
}

absl::Status RankMemory::Upload(ComputeBackend* backend) const {
  const RankLayout& l = *layout_;
  if (!staged_ || l.local_rows == 0) return absl::OkStatus();
  const int64_t n = l.local_rows, e = l.shape.head_dim * l.elem_bytes;
  const int64_t q = n * l.shape.num_heads_q * e, kv = n * l.shape.num_heads_kv * e;
  std::vector<RowCopy> c = {{client_.q, local.q, 1, 0, 0, q}, {client_.k, local.k, 1, 0, 0, kv},
                            {client_.v, local.v, 1, 0, 0, kv}};
  if (l.backward()) {
    c.push_back({client_.o, local.o, 1, 0, 0, q});
    c.push_back({client_.lse, local.lse, 1, 0, 0, n * l.shape.num_heads_q * 4});
    c.push_back({client_.d_o, local.d_o, 1, 0, 0, q});
  }
  return backend->Copy(c);
}

absl::Status RankMemory::Download(ComputeBackend* backend) const {
  const RankLayout& l = *layout_;
  if (!staged_ || l.local_rows == 0) return absl::OkStatus();
  const int64_t n = l.local_rows, e = l.shape.head_dim * l.elem_bytes;
  const int64_t q = n * l.shape.num_heads_q * e, kv = n * l.shape.num_heads_kv * e;
  std::vector<RowCopy> c;
  if (!l.backward()) {
    c = {{local.o, client_.o, 1, 0, 0, q},
         {local.lse, client_.lse, 1, 0, 0, n * l.shape.num_heads_q * 4}};
  } else {
    c = {{local.dq, client_.dq, 1, 0, 0, q}, {local.dk, client_.dk, 1, 0, 0, kv},
         {local.dv, client_.dv, 1, 0, 0, kv}};
  }
  HSAP_RETURN_IF_ERROR(backend->Copy(c));
  return backend->Synchronize();
}

}  // namespace hsap::exec
