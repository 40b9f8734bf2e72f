// The hsap.v1.Peer gRPC service of one daemon: a thin adapter that forwards
// each RPC to its Cluster (cluster.h), which owns the state.
#ifndef HSAP_SERVER_CLUSTER_PEER_SERVICE_H_
#define HSAP_SERVER_CLUSTER_PEER_SERVICE_H_

#include "hsap/v1/peer.grpc.pb.h"

namespace hsap::cluster {

class Cluster;

class PeerServiceImpl final : public v1::Peer::Service {
 public:
  // REQUIRES: `cluster` outlives the service.
  explicit PeerServiceImpl(Cluster* cluster) : cluster_(cluster) {}

  grpc::Status Join(grpc::ServerContext*, const v1::JoinRequest* request,
                    v1::JoinResponse* response) override;
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest* request,
                         v1::HeartbeatResponse* response) override;
  grpc::Status AgreePlan(grpc::ServerContext*, const v1::AgreePlanRequest* request,
                         v1::AgreePlanResponse* response) override;
  grpc::Status AbortCall(grpc::ServerContext*, const v1::AbortCallRequest* request,
                         v1::AbortCallResponse* response) override;
  grpc::Status JoinGroup(grpc::ServerContext*, const v1::JoinGroupRequest* request,
                         v1::JoinGroupResponse* response) override;
  grpc::Status ConfirmMember(grpc::ServerContext*, const v1::ConfirmMemberRequest* request,
                             v1::ConfirmMemberResponse* response) override;
  grpc::Status ProbeLink(grpc::ServerContext*, const v1::ProbeLinkRequest* request,
                         v1::ProbeLinkResponse* response) override;
  grpc::Status GroupProfile(grpc::ServerContext*, const v1::GroupProfileRequest* request,
                            v1::GroupProfileResponse* response) override;

 private:
  Cluster* const cluster_;
};

}  // namespace hsap::cluster

#endif  // HSAP_SERVER_CLUSTER_PEER_SERVICE_H_
