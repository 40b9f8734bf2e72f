#include "server/cluster/peer_service.h"

#include "server/cluster/cluster.h"

namespace hsap::cluster {

grpc::Status PeerServiceImpl::Join(grpc::ServerContext*, const v1::JoinRequest* request,
                                   v1::JoinResponse* response) {
  return cluster_->OnJoin(*request, response);
}

grpc::Status PeerServiceImpl::Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest* request,
                                        v1::HeartbeatResponse* response) {
  return cluster_->OnHeartbeat(*request, response);
}

grpc::Status PeerServiceImpl::AgreePlan(grpc::ServerContext*, const v1::AgreePlanRequest* request,
                                        v1::AgreePlanResponse* response) {
  return cluster_->OnAgreePlan(*request, response);
}

grpc::Status PeerServiceImpl::AbortCall(grpc::ServerContext*, const v1::AbortCallRequest* request,
                                        v1::AbortCallResponse*) {
  return cluster_->OnAbortCall(*request);
}

}  // namespace hsap::cluster
