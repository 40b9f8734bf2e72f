#include "server/transport/nccl_ops.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace hsap::transport {

namespace {

absl::Status CheckOp(const char* kind, size_t index, int32_t peer, const void* data,
                     int64_t bytes, int32_t nranks) {
  if (peer < 0 || peer >= nranks) {
    return absl::InvalidArgumentError(
        absl::StrCat(kind, "[", index, "].peer = ", peer, " is outside [0, ", nranks, ")"));
  }
  if (bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(kind, "[", index, "].bytes = ", bytes, " < 0"));
  }
  if (bytes > 0 && data == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(kind, "[", index, "].data is null with ", bytes, " bytes"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<NcclOp>> OrderNcclOps(int32_t rank, int32_t nranks,
                                                 absl::Span<const SendOp> sends,
                                                 absl::Span<const RecvOp> recvs) {
  for (size_t i = 0; i < sends.size(); ++i) {
    absl::Status s = CheckOp("sends", i, sends[i].peer, sends[i].data, sends[i].bytes, nranks);
    if (!s.ok()) return s;
  }
  for (size_t i = 0; i < recvs.size(); ++i) {
    absl::Status s = CheckOp("recvs", i, recvs[i].peer, recvs[i].data, recvs[i].bytes, nranks);
    if (!s.ok()) return s;
  }
  std::vector<int64_t> self_sends, self_recvs;
  for (const SendOp& s : sends) if (s.peer == rank) self_sends.push_back(s.bytes);
  for (const RecvOp& r : recvs) if (r.peer == rank) self_recvs.push_back(r.bytes);
  if (self_sends != self_recvs) {
    return absl::InternalError(absl::StrCat(
        "rank ", rank, ": sends to self (bytes [", absl::StrJoin(self_sends, ", "),
        "]) do not pair with receives from self (bytes [", absl::StrJoin(self_recvs, ", "), "])"));
  }

  std::vector<NcclOp> ops;
  ops.reserve(sends.size() + recvs.size());
  for (const RecvOp& r : recvs) {
    if (r.bytes > 0) ops.push_back({false, r.peer, r.data, r.bytes});
  }
  for (const SendOp& s : sends) {
    if (s.bytes > 0) ops.push_back({true, s.peer, const_cast<void*>(s.data), s.bytes});
  }
  // Stable: equal keys (same peer and direction) keep the caller's order.
  std::stable_sort(ops.begin(), ops.end(), [](const NcclOp& a, const NcclOp& b) {
    if (a.peer != b.peer) return a.peer < b.peer;
    return !a.send && b.send;
  });
  return ops;
}

std::string DescribePeers(absl::Span<const NcclOp> ops) {
  std::vector<int32_t> from, to;
  for (const NcclOp& op : ops) {
    std::vector<int32_t>& list = op.send ? to : from;
    if (list.empty() || list.back() != op.peer) list.push_back(op.peer);
  }
  return absl::StrCat("receives from [", absl::StrJoin(from, ", "), "], sends to [",
                      absl::StrJoin(to, ", "), "]");
}

}  // namespace hsap::transport
