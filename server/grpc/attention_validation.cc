#include "server/grpc/attention_validation.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "server/grpc/call_nodes.h"
#include "server/plan/plan_proto.h"
#include "server/plan/plan_spec.h"

namespace hsap {
namespace {

using hsap::v1::TensorRef;

std::string ShapeString(const google::protobuf::RepeatedField<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::StatusOr<DType> FloatDType(hsap::v1::DType t, absl::string_view field) {
  return plan::DTypeFromProto(t, absl::StrCat(field, ".dtype"));
}

int ElementSize(hsap::v1::DType t) {
  switch (t) {
    case hsap::v1::DTYPE_FLOAT32: case hsap::v1::DTYPE_INT32: return 4;
    case hsap::v1::DTYPE_BFLOAT16: case hsap::v1::DTYPE_FLOAT16: return 2;
    case hsap::v1::DTYPE_INT64: return 8;
    default: return 0;
  }
}

// Pins the region, checks the shape's rank, that no dimension is negative,
// and that offset + numel * size fits the region, without overflow.
absl::StatusOr<BoundTensor> Bind(const TensorRef& ref, absl::string_view field, int rank,
                                 uint64_t session, shm::RegionRegistry* regions) {
  if (ref.shape_size() != rank) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".shape is ", ShapeString(ref.shape()),
                                                   ": it must have ", rank, " dimensions"));
  }
  uint64_t numel = 1;
  for (int i = 0; i < rank; ++i) {
    const int64_t d = ref.shape(i);
    if (d < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".shape[", i, "] is ", d, ": dimensions must be >= 0"));
    }
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel)) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".shape ", ShapeString(ref.shape()), " overflows 64 bits"));
    }
  }
  const int size = ElementSize(ref.dtype());
  if (size == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".dtype is ", hsap::v1::DType_Name(ref.dtype())));
  }
  uint64_t bytes;
  if (__builtin_mul_overflow(numel, static_cast<uint64_t>(size), &bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".shape ", ShapeString(ref.shape()),
                                                   " times ", size, " bytes overflows 64 bits"));
  }
  BoundTensor t;
  HSAP_ASSIGN_OR_RETURN(t.pin, regions->Pin(session, ref.region_id(), absl::StrCat(field, ".region_id")));
  HSAP_RETURN_IF_ERROR(t.pin.region()->CheckRange(ref.offset(), bytes, field));
  t.data = t.pin.region()->data() + ref.offset();
  t.region_id = ref.region_id();
  t.offset = ref.offset();
  t.bytes = bytes;
  t.shape.assign(ref.shape().begin(), ref.shape().end());
  return t;
}

// Ranks of a group that names its nodes at most: the UCX tag's rank bits
// (transport/ucx_tag.h kMaxRanks).
constexpr int64_t kMaxDeclaredGroupRanks = 4096;

absl::Status CheckCallId(const hsap::v1::CallId& id, const ValidationLimits& limits) {
  if (id.group().empty() || id.group().size() > 128) {
    return absl::InvalidArgumentError(absl::StrCat("call.group has ", id.group().size(),
                                                   " bytes; it must have 1 to 128"));
  }
  if (id.group_size() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("call.group_size is ", id.group_size(), "; it must be >= 1"));
  }
  if (id.rank() < 0 || id.rank() >= id.group_size()) {
    return absl::InvalidArgumentError(absl::StrCat("call.rank is ", id.rank(),
                                                   "; it must be in [0, call.group_size = ",
                                                   id.group_size(), ")"));
  }
  if (id.call_seq() == 0) {
    return absl::InvalidArgumentError("call.call_seq is 0; sequences start at 1");
  }
  // A group that names its nodes is bounded by its nodes x this daemon's
  // slots (ResolveCallNodes) and the data plane's rank bits.
  const int64_t max_size = id.nodes().empty() ? limits.max_group_size : kMaxDeclaredGroupRanks;
  if (id.group_size() > max_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "call.group_size is ", id.group_size(), " but this daemon serves groups of at most ",
        max_size, id.nodes().empty() ? " rank(s) (its cluster's nodes x device slots)"
                                     : " rank(s) (a group declared by call.nodes)"));
  }
  return absl::OkStatus();
}

absl::Status CheckOptions(const hsap::v1::CallOptions& o, AttentionCall* call) {
  if (!std::isfinite(o.softmax_scale()) || o.softmax_scale() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("options.softmax_scale is ", o.softmax_scale(),
                                                   "; it must be finite and >= 0 (0 = 1/sqrt(D))"));
  }
  // The same conversions as Plans requests (plan_proto.h).
  HSAP_ASSIGN_OR_RETURN(call->strategy, plan::StrategyFromProto(o.strategy(), "options.strategy"));
  HSAP_ASSIGN_OR_RETURN(call->assignment,
                        plan::AssignmentFromProto(o.assignment(), "options.assignment"));
  call->deadline_ms = o.deadline_ms();
  return absl::OkStatus();
}

// Reads cu_seqlens (inline or from a region; copied once so the client cannot
// change it under the call) or the slices, and lowers the mask.
absl::Status ResolveMask(const hsap::v1::MaskSpec& mask, uint64_t session,
                         shm::RegionRegistry* regions, const ValidationLimits& limits,
                         AttentionCall* call) {
  const int64_t window = mask.has_window_left() ? mask.window_left() : -1;
  if (window < -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("mask.window_left is ", mask.window_left(), "; it must be >= -1 (-1 = none)"));
  }
  // Lowered slices carry the window into SliceArea and the kernels
  // (r + offset - window) and into the plan spec: the planner's bound.
  if (window > plan::kMaxTotalTokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "mask.window_left is ", window, "; it must be at most 2^40 (-1 = none)"));
  }
  if (window >= 0 && !mask.causal() &&
      mask.structure_case() == hsap::v1::MaskSpec::kCuSeqlens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "mask.window_left is ", mask.window_left(), " but mask.causal is false: sliding windows "
        "apply to causal documents only"));
  }
  call->causal = mask.causal();
  call->window = window;
  switch (mask.structure_case()) {
    case hsap::v1::MaskSpec::kCuSeqlens: {
      const auto& cu = mask.cu_seqlens();
      if (cu.source_case() == hsap::v1::CuSeqlens::kInlineValues) {
        call->cu_seqlens.assign(cu.inline_values().values().begin(),
                                cu.inline_values().values().end());
      } else if (cu.source_case() == hsap::v1::CuSeqlens::kTensor) {
        const TensorRef& ref = cu.tensor();
        if (ref.dtype() != hsap::v1::DTYPE_INT32 && ref.dtype() != hsap::v1::DTYPE_INT64) {
          return absl::InvalidArgumentError(
              absl::StrCat("mask.cu_seqlens.tensor.dtype is ", hsap::v1::DType_Name(ref.dtype()),
                           "; it must be DTYPE_INT32 or DTYPE_INT64"));
        }
        HSAP_ASSIGN_OR_RETURN(BoundTensor t,
                              Bind(ref, "mask.cu_seqlens.tensor", 1, session, regions));
        const int64_t n = t.shape[0];
        if (n > limits.max_slices + 1) {
          return absl::InvalidArgumentError(absl::StrCat("mask.cu_seqlens.tensor.shape[0] is ", n,
                                                         "; at most ", limits.max_slices + 1));
        }
        call->cu_seqlens.resize(n);
        for (int64_t i = 0; i < n; ++i) {
          if (ref.dtype() == hsap::v1::DTYPE_INT32) {
            int32_t x;
            std::memcpy(&x, t.data + 4 * i, 4);
            call->cu_seqlens[i] = x;
          } else {
            std::memcpy(&call->cu_seqlens[i], t.data + 8 * i, 8);
          }
        }
      } else {
        return absl::InvalidArgumentError("mask.cu_seqlens has neither inline_values nor tensor");
      }
      if (call->cu_seqlens.size() > static_cast<size_t>(limits.max_slices) + 1) {
        return absl::InvalidArgumentError(absl::StrCat("mask.cu_seqlens has ", call->cu_seqlens.size(),
                                                       " entries; at most ", limits.max_slices + 1));
      }
      if (call->cu_seqlens.empty()) {
        return absl::InvalidArgumentError(
            "mask.cu_seqlens is empty: it needs at least [0, total_tokens]");
      }
      call->total_tokens = call->cu_seqlens.back();
      if (call->total_tokens < 0 || call->total_tokens > limits.max_tokens) {
        return absl::InvalidArgumentError(absl::StrCat("mask.cu_seqlens ends at ",
                                                       call->total_tokens, "; at most ",
                                                       limits.max_tokens, " tokens"));
      }
      HSAP_RETURN_IF_ERROR(ValidateCuSeqlens(call->cu_seqlens, call->total_tokens, "mask.cu_seqlens"));
      call->slices = LowerDocuments(call->cu_seqlens, call->causal, call->window);
      return absl::OkStatus();
    }
    case hsap::v1::MaskSpec::kSlices: {
      const auto& s = mask.slices();
      if (s.total_tokens() < 0 || s.total_tokens() > limits.max_tokens) {
        return absl::InvalidArgumentError(absl::StrCat("mask.slices.total_tokens is ",
                                                       s.total_tokens(), "; it must be in [0, ",
                                                       limits.max_tokens, "]"));
      }
      if (s.slices_size() > limits.max_slices) {
        return absl::InvalidArgumentError(absl::StrCat("mask.slices has ", s.slices_size(),
                                                       " slices; at most ", limits.max_slices));
      }
      call->total_tokens = s.total_tokens();
      for (int i = 0; i < s.slices_size(); ++i) {
        HSAP_ASSIGN_OR_RETURN(MaskSlice m, plan::MaskSliceFromProto(
                                               s.slices(i), absl::StrCat("mask.slices[", i, "]")));
        call->slices.push_back(m);
      }
      return ValidateSlices(call->slices, call->total_tokens, call->total_tokens, "mask.slices");
    }
    default:
      return absl::InvalidArgumentError("mask has neither cu_seqlens nor slices");
  }
}

absl::Status ExpectShape(const BoundTensor& t, const TensorRef& ref, absl::string_view field,
                         const std::vector<int64_t>& expect, absl::string_view meaning) {
  if (t.shape != expect) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".shape is ", ShapeString(ref.shape()),
                                                   " but ", meaning, " needs [",
                                                   absl::StrJoin(expect, ", "), "]"));
  }
  return absl::OkStatus();
}

absl::Status ExpectDType(const TensorRef& ref, absl::string_view field, hsap::v1::DType want,
                         absl::string_view like) {
  if (ref.dtype() != want) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".dtype is ",
                                                   hsap::v1::DType_Name(ref.dtype()), " but ", like,
                                                   " is ", hsap::v1::DType_Name(want)));
  }
  return absl::OkStatus();
}

// Outputs must not overlap any other tensor of the call.
absl::Status CheckNoOverlap(const std::vector<std::pair<const char*, const BoundTensor*>>& outputs,
                            const std::vector<std::pair<const char*, const BoundTensor*>>& all) {
  for (const auto& [oname, out] : outputs) {
    for (const auto& [name, t] : all) {
      if (t == out || t->region_id != out->region_id || t->bytes == 0 || out->bytes == 0) continue;
      const bool disjoint = out->offset >= t->offset + t->bytes || t->offset >= out->offset + out->bytes;
      if (!disjoint) {
        return absl::InvalidArgumentError(absl::StrCat(
            oname, " (bytes [", out->offset, ", ", out->offset + out->bytes, ")) overlaps ", name,
            " (bytes [", t->offset, ", ", t->offset + t->bytes, ")) in region ", out->region_id));
      }
    }
  }
  return absl::OkStatus();
}

// Shared part of forward and backward: call id, options, mask, q/k/v/o/lse.
template <typename Request>
absl::StatusOr<AttentionCall> ValidateCommon(const Request& r, uint64_t session,
                                             shm::RegionRegistry* regions,
                                             const ValidationLimits& limits) {
  AttentionCall call;
  HSAP_RETURN_IF_ERROR(CheckCallId(r.call(), limits));
  call.group = r.call().group();
  call.rank = r.call().rank();
  call.group_size = r.call().group_size();
  call.call_seq = r.call().call_seq();
  HSAP_RETURN_IF_ERROR(ResolveCallNodes(r.call(), limits, &call));
  HSAP_RETURN_IF_ERROR(CheckOptions(r.options(), &call));
  HSAP_RETURN_IF_ERROR(ResolveMask(r.mask(), session, regions, limits, &call));

  HSAP_ASSIGN_OR_RETURN(call.shape.dtype, FloatDType(r.q().dtype(), "q"));
  HSAP_RETURN_IF_ERROR(ExpectDType(r.k(), "k", r.q().dtype(), "q.dtype"));
  HSAP_RETURN_IF_ERROR(ExpectDType(r.v(), "v", r.q().dtype(), "q.dtype"));
  HSAP_RETURN_IF_ERROR(ExpectDType(r.o(), "o", r.q().dtype(), "q.dtype"));
  HSAP_RETURN_IF_ERROR(ExpectDType(r.lse(), "lse", hsap::v1::DTYPE_FLOAT32, "the LSE type"));
  HSAP_ASSIGN_OR_RETURN(call.q, Bind(r.q(), "q", 3, session, regions));
  HSAP_ASSIGN_OR_RETURN(call.k, Bind(r.k(), "k", 3, session, regions));
  HSAP_ASSIGN_OR_RETURN(call.v, Bind(r.v(), "v", 3, session, regions));
  HSAP_ASSIGN_OR_RETURN(call.o, Bind(r.o(), "o", 3, session, regions));
  HSAP_ASSIGN_OR_RETURN(call.lse, Bind(r.lse(), "lse", 2, session, regions));

  const int64_t t = call.q.shape[0], hq = call.q.shape[1], d = call.q.shape[2];
  const int64_t hkv = call.k.shape[1];
  if (hq < 1 || hq > limits.max_heads) {
    return absl::InvalidArgumentError(
        absl::StrCat("q.shape[1] (Hq) is ", hq, "; it must be in [1, ", limits.max_heads, "]"));
  }
  if (d < 1 || d > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("q.shape[2] (head_dim) is ", d, "; it must be in [1, 256]"));
  }
  if (hkv < 1 || hq % hkv != 0) {
    return absl::InvalidArgumentError(absl::StrCat("k.shape[1] (Hkv) is ", hkv, " but Hq = ", hq,
                                                   " is not a multiple of it (GQA needs Hq % Hkv == 0)"));
  }
  HSAP_RETURN_IF_ERROR(ExpectShape(call.k, r.k(), "k", {t, hkv, d}, "q.shape [T, Hq, D]"));
  HSAP_RETURN_IF_ERROR(ExpectShape(call.v, r.v(), "v", {t, hkv, d}, "k.shape"));
  HSAP_RETURN_IF_ERROR(ExpectShape(call.o, r.o(), "o", {t, hq, d}, "q.shape"));
  HSAP_RETURN_IF_ERROR(ExpectShape(call.lse, r.lse(), "lse", {hq, t}, "[Hq, T] for q.shape"));
  if (call.group_size == 1 && t != call.total_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "q.shape[0] is ", t, " but the mask covers ", call.total_tokens,
        " tokens (a group of one rank holds them all)"));
  }
  call.local_tokens = t;
  call.shape.num_heads_q = static_cast<int>(hq);
  call.shape.num_heads_kv = static_cast<int>(hkv);
  call.shape.head_dim = static_cast<int>(d);
  const float scale = r.options().softmax_scale();
  call.shape.softmax_scale = scale > 0 ? scale : 1.0f / std::sqrt(static_cast<float>(d));
  return call;
}

}  // namespace

absl::StatusOr<AttentionCall> ValidateForward(const hsap::v1::AttentionForwardRequest& r,
                                              uint64_t session, shm::RegionRegistry* regions,
                                              const ValidationLimits& limits) {
  HSAP_ASSIGN_OR_RETURN(AttentionCall call, ValidateCommon(r, session, regions, limits));
  HSAP_RETURN_IF_ERROR(CheckNoOverlap(
      {{"o", &call.o}, {"lse", &call.lse}},
      {{"q", &call.q}, {"k", &call.k}, {"v", &call.v}, {"o", &call.o}, {"lse", &call.lse}}));
  return call;
}

absl::StatusOr<AttentionCall> ValidateBackward(const hsap::v1::AttentionBackwardRequest& r,
                                               uint64_t session, shm::RegionRegistry* regions,
                                               const ValidationLimits& limits) {
  HSAP_ASSIGN_OR_RETURN(AttentionCall call, ValidateCommon(r, session, regions, limits));
  call.backward = true;
  HSAP_RETURN_IF_ERROR(ExpectDType(r.d_o(), "d_o", r.q().dtype(), "q.dtype"));
  HSAP_RETURN_IF_ERROR(ExpectDType(r.dq(), "dq", r.q().dtype(), "q.dtype"));
  HSAP_RETURN_IF_ERROR(ExpectDType(r.dk(), "dk", r.q().dtype(), "q.dtype"));
  HSAP_RETURN_IF_ERROR(ExpectDType(r.dv(), "dv", r.q().dtype(), "q.dtype"));
  HSAP_ASSIGN_OR_RETURN(call.d_o, Bind(r.d_o(), "d_o", 3, session, regions));
  HSAP_ASSIGN_OR_RETURN(call.dq, Bind(r.dq(), "dq", 3, session, regions));
  HSAP_ASSIGN_OR_RETURN(call.dk, Bind(r.dk(), "dk", 3, session, regions));
  HSAP_ASSIGN_OR_RETURN(call.dv, Bind(r.dv(), "dv", 3, session, regions));
  HSAP_RETURN_IF_ERROR(ExpectShape(call.d_o, r.d_o(), "d_o", call.q.shape, "q.shape"));
  HSAP_RETURN_IF_ERROR(ExpectShape(call.dq, r.dq(), "dq", call.q.shape, "q.shape"));
  HSAP_RETURN_IF_ERROR(ExpectShape(call.dk, r.dk(), "dk", call.k.shape, "k.shape"));
  HSAP_RETURN_IF_ERROR(ExpectShape(call.dv, r.dv(), "dv", call.k.shape, "k.shape"));
  HSAP_RETURN_IF_ERROR(CheckNoOverlap(
      {{"dq", &call.dq}, {"dk", &call.dk}, {"dv", &call.dv}},
      {{"q", &call.q}, {"k", &call.k}, {"v", &call.v}, {"o", &call.o}, {"lse", &call.lse},
       {"d_o", &call.d_o}, {"dq", &call.dq}, {"dk", &call.dk}, {"dv", &call.dv}}));
  return call;
}

}  // namespace hsap
