// The gRPC services of hsapd, one class per kind of call. Each converts
// proto <-> domain, authenticates the session, and maps absl::Status to
// grpc::Status in one place (status_util.h). They hold no state of their own:
// everything lives in the DaemonState they point to.
#ifndef HSAP_SERVER_GRPC_SERVICES_H_
#define HSAP_SERVER_GRPC_SERVICES_H_

#include "hsap/v1/attention.grpc.pb.h"
#include "hsap/v1/cluster.grpc.pb.h"
#include "hsap/v1/regions.grpc.pb.h"
#include "server/daemon_state.h"

namespace hsap {

class AttentionService final : public hsap::v1::Attention::Service {
 public:
  explicit AttentionService(DaemonState* state) : state_(state) {}
  grpc::Status Forward(grpc::ServerContext* context, const hsap::v1::AttentionForwardRequest* request,
                       hsap::v1::AttentionForwardResponse* response) override;
  grpc::Status Backward(grpc::ServerContext* context,
                        const hsap::v1::AttentionBackwardRequest* request,
                        hsap::v1::AttentionBackwardResponse* response) override;

 private:
  DaemonState* const state_;
};

class RegionsService final : public hsap::v1::Regions::Service {
 public:
  explicit RegionsService(DaemonState* state) : state_(state) {}
  grpc::Status RegisterRegion(grpc::ServerContext* context,
                              const hsap::v1::RegisterRegionRequest* request,
                              hsap::v1::RegisterRegionResponse* response) override;
  grpc::Status UnregisterRegion(grpc::ServerContext* context,
                                const hsap::v1::UnregisterRegionRequest* request,
                                hsap::v1::UnregisterRegionResponse* response) override;
  grpc::Status GetRegion(grpc::ServerContext* context, const hsap::v1::GetRegionRequest* request,
                         hsap::v1::GetRegionResponse* response) override;
  grpc::Status ListRegions(grpc::ServerContext* context, const hsap::v1::ListRegionsRequest* request,
                           hsap::v1::ListRegionsResponse* response) override;

 private:
  DaemonState* const state_;
};

class ClusterService final : public hsap::v1::Cluster::Service {
 public:
  explicit ClusterService(DaemonState* state) : state_(state) {}
  grpc::Status GetClusterStatus(grpc::ServerContext* context,
                                const hsap::v1::GetClusterStatusRequest* request,
                                hsap::v1::GetClusterStatusResponse* response) override;

 private:
  DaemonState* const state_;
};

}  // namespace hsap

#endif  // HSAP_SERVER_GRPC_SERVICES_H_
