#include "server/cluster/peer_service.h"

#include "absl/time/time.h"
#include "server/cluster/cluster.h"
#include "server/grpc/status_util.h"

namespace hsap::cluster {
// Every handler authorizes its caller first (Cluster::AuthorizePeerCall);
// the Cluster then checks what the request claims against who sent it.
#define HSAP_AUTHORIZE_PEER(caller)                                        \
  absl::StatusOr<PeerCaller> caller = cluster_->AuthorizePeerCall(*context); \
  if (!caller.ok()) return ToGrpcStatus(caller.status())

grpc::Status PeerServiceImpl::Join(grpc::ServerContext* context, const v1::JoinRequest* request,
                                   v1::JoinResponse* response) {
  HSAP_AUTHORIZE_PEER(caller);
  return cluster_->OnJoin(*caller, *request, response);
}

grpc::Status PeerServiceImpl::Heartbeat(grpc::ServerContext* context,
                                        const v1::HeartbeatRequest* request,
                                        v1::HeartbeatResponse* response) {
  HSAP_AUTHORIZE_PEER(caller);
  return cluster_->OnHeartbeat(*caller, *request, response);
}

grpc::Status PeerServiceImpl::AgreePlan(grpc::ServerContext* context,
                                        const v1::AgreePlanRequest* request,
                                        v1::AgreePlanResponse* response) {
  HSAP_AUTHORIZE_PEER(caller);
  return cluster_->OnAgreePlan(*caller, *request, response);
}

grpc::Status PeerServiceImpl::AbortCall(grpc::ServerContext* context,
                                        const v1::AbortCallRequest* request,
                                        v1::AbortCallResponse*) {
  HSAP_AUTHORIZE_PEER(caller);
  return cluster_->OnAbortCall(*caller, *request);
}

grpc::Status PeerServiceImpl::JoinGroup(grpc::ServerContext* context,
                                        const v1::JoinGroupRequest* request,
                                        v1::JoinGroupResponse* response) {
  HSAP_AUTHORIZE_PEER(caller);
  return cluster_->OnJoinGroup(*caller, *request, response);
}

grpc::Status PeerServiceImpl::ConfirmMember(grpc::ServerContext* context,
                                            const v1::ConfirmMemberRequest* request,
                                            v1::ConfirmMemberResponse* response) {
  HSAP_AUTHORIZE_PEER(caller);
  return cluster_->OnConfirmMember(*caller, *request, response);
}

grpc::Status PeerServiceImpl::ProbeLink(grpc::ServerContext* context, const v1::ProbeLinkRequest*,
                                        v1::ProbeLinkResponse*) {
  // The payload is only timed (by the sender); the TCP listener's message
  // limit (4 MiB) and memory quota bound it.
  HSAP_AUTHORIZE_PEER(caller);
  return cluster_->OnProbeLink(*caller);
}

grpc::Status PeerServiceImpl::GroupProfile(grpc::ServerContext* context,
                                           const v1::GroupProfileRequest* request,
                                           v1::GroupProfileResponse* response) {
  HSAP_AUTHORIZE_PEER(caller);
  return cluster_->OnGroupProfile(*caller, *request, absl::FromChrono(context->deadline()),
                                  response);
}

#undef HSAP_AUTHORIZE_PEER

}  // namespace hsap::cluster
