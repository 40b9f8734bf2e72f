// Region registration over gRPC (the fds themselves come over the session
// socket; see proto/hsap/v1/regions.proto).
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "server/grpc/services.h"
#include "server/grpc/session_auth.h"
#include "server/grpc/status_util.h"
#include "server/grpc/tcp_auth.h"
#include "server/shm/region.h"

namespace hsap {
namespace {

hsap::v1::RegionInfo ToProto(const shm::RegionSummary& r) {
  hsap::v1::RegionInfo info;
  info.set_region_id(r.id);
  info.set_name(r.name);
  info.set_kind(r.kind == shm::RegionKind::kShm ? hsap::v1::REGION_KIND_SHM
                                                : hsap::v1::REGION_KIND_MEMFD);
  info.set_size_bytes(r.size_bytes);
  info.set_session_id(r.session);
  info.set_pin_count(r.pins);
  info.set_device(-1);
  return info;
}

absl::StatusOr<std::unique_ptr<shm::MappedRegion>> MapSource(
    const RegionsDeps& deps, uint64_t session, const hsap::v1::RegisterRegionRequest& r) {
  switch (r.source_case()) {
    case hsap::v1::RegisterRegionRequest::kMemfd: {
      absl::StatusOr<UniqueFd> fd = deps.sessions->TakePendingFd(session, r.memfd().transfer_id());
      if (!fd.ok()) return fd.status();
      return shm::MappedRegion::FromFd(fd->get(), r.size_bytes(), shm::RegionKind::kMemfd);
    }
    case hsap::v1::RegisterRegionRequest::kShm:
      return shm::MappedRegion::FromShmName(r.shm().name(), r.size_bytes());
    case hsap::v1::RegisterRegionRequest::kCudaIpc:
      return absl::FailedPreconditionError(
          "cuda_ipc regions need a GPU device slot; this daemon serves CPU devices only");
    default:
      return absl::InvalidArgumentError("source is not set: give memfd, shm or cuda_ipc");
  }
}

}  // namespace

grpc::Status RegionsService::RegisterRegion(grpc::ServerContext* context,
                                            const hsap::v1::RegisterRegionRequest* request,
                                            hsap::v1::RegisterRegionResponse* response) {
  absl::StatusOr<Caller> caller = AuthorizeCall(*context, deps_.tcp_token);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  absl::StatusOr<uint64_t> session = SessionOf(*context, *deps_.sessions);
  if (!session.ok()) return ToGrpcStatus(session.status());
  if (request->name().size() > 128) {
    return ToGrpcStatus(absl::InvalidArgumentError(
        absl::StrCat("name has ", request->name().size(), " bytes; at most 128")));
  }
  if (request->size_bytes() == 0) {
    return ToGrpcStatus(absl::InvalidArgumentError("size_bytes is 0: a region needs at least 1 byte"));
  }
  auto mapping = MapSource(deps_, *session, *request);
  if (!mapping.ok()) return ToGrpcStatus(mapping.status());
  auto id = deps_.regions->Register(*session, request->name(), std::move(mapping).value());
  if (!id.ok()) return ToGrpcStatus(id.status());
  response->set_region_id(*id);
  deps_.refresh_gauges();
  return grpc::Status::OK;
}

grpc::Status RegionsService::UnregisterRegion(grpc::ServerContext* context,
                                              const hsap::v1::UnregisterRegionRequest* request,
                                              hsap::v1::UnregisterRegionResponse*) {
  absl::StatusOr<Caller> caller = AuthorizeCall(*context, deps_.tcp_token);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  absl::StatusOr<uint64_t> session = SessionOf(*context, *deps_.sessions);
  if (!session.ok()) return ToGrpcStatus(session.status());
  const absl::Status st = deps_.regions->Unregister(*session, request->region_id());
  deps_.refresh_gauges();
  return ToGrpcStatus(st);
}

grpc::Status RegionsService::GetRegion(grpc::ServerContext* context,
                                       const hsap::v1::GetRegionRequest* request,
                                       hsap::v1::GetRegionResponse* response) {
  absl::StatusOr<Caller> caller = AuthorizeCall(*context, deps_.tcp_token);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  absl::StatusOr<uint64_t> session = SessionOf(*context, *deps_.sessions);
  if (!session.ok()) return ToGrpcStatus(session.status());
  auto r = deps_.regions->Get(*session, request->region_id());
  if (!r.ok()) return ToGrpcStatus(r.status());
  *response->mutable_region() = ToProto(*r);
  return grpc::Status::OK;
}

grpc::Status RegionsService::ListRegions(grpc::ServerContext* context,
                                         const hsap::v1::ListRegionsRequest*,
                                         hsap::v1::ListRegionsResponse* response) {
  absl::StatusOr<Caller> caller = AuthorizeCall(*context, deps_.tcp_token);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  response->set_sessions(deps_.sessions->num_sessions());
  if (*caller == Caller::kTcpAuthorized) {
    // An operator (TCP with the token) sees every session's regions.
    for (const auto& r : deps_.regions->List()) {
      *response->add_regions() = ToProto(r);
      response->set_total_bytes(response->total_bytes() + r.size_bytes);
    }
    return grpc::Status::OK;
  }
  absl::StatusOr<uint64_t> session = SessionOf(*context, *deps_.sessions);
  if (!session.ok()) return ToGrpcStatus(session.status());
  for (const auto& r : deps_.regions->List(*session)) {
    *response->add_regions() = ToProto(r);
    response->set_total_bytes(response->total_bytes() + r.size_bytes);
  }
  return grpc::Status::OK;
}

}  // namespace hsap
