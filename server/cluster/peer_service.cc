#include "server/cluster/peer_service.h"

#include "absl/time/time.h"
#include "server/cluster/cluster.h"

namespace hsap::cluster {

grpc::Status PeerServiceImpl::Join(grpc::ServerContext* context, const v1::JoinRequest* request,
                                   v1::JoinResponse* response) {
  if (grpc::Status auth = cluster_->CheckPeerToken(*context); !auth.ok()) return auth;
  return cluster_->OnJoin(*request, response);
}

grpc::Status PeerServiceImpl::Heartbeat(grpc::ServerContext* context, const v1::HeartbeatRequest* request,
                                        v1::HeartbeatResponse* response) {
  if (grpc::Status auth = cluster_->CheckPeerToken(*context); !auth.ok()) return auth;
  return cluster_->OnHeartbeat(*request, response);
}

grpc::Status PeerServiceImpl::AgreePlan(grpc::ServerContext* context, const v1::AgreePlanRequest* request,
                                        v1::AgreePlanResponse* response) {
  if (grpc::Status auth = cluster_->CheckPeerToken(*context); !auth.ok()) return auth;
  return cluster_->OnAgreePlan(*request, response);
}

grpc::Status PeerServiceImpl::AbortCall(grpc::ServerContext* context, const v1::AbortCallRequest* request,
                                        v1::AbortCallResponse*) {
  if (grpc::Status auth = cluster_->CheckPeerToken(*context); !auth.ok()) return auth;
  return cluster_->OnAbortCall(*request);
}

grpc::Status PeerServiceImpl::JoinGroup(grpc::ServerContext* context,
                                        const v1::JoinGroupRequest* request,
                                        v1::JoinGroupResponse* response) {
  if (grpc::Status auth = cluster_->CheckPeerToken(*context); !auth.ok()) return auth;
  return cluster_->OnJoinGroup(*request, response);
}

grpc::Status PeerServiceImpl::ProbeLink(grpc::ServerContext* context, const v1::ProbeLinkRequest*,
                                        v1::ProbeLinkResponse*) {
  // The payload is only timed (by the sender); gRPC's message limit bounds it.
  return cluster_->CheckPeerToken(*context);
}

grpc::Status PeerServiceImpl::GroupProfile(grpc::ServerContext* context,
                                           const v1::GroupProfileRequest* request,
                                           v1::GroupProfileResponse* response) {
  if (grpc::Status auth = cluster_->CheckPeerToken(*context); !auth.ok()) return auth;
  return cluster_->OnGroupProfile(*request, absl::FromChrono(context->deadline()), response);
}

}  // namespace hsap::cluster
