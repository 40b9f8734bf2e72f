// The gRPC services of hsapd, one class per kind of call. Each converts
// proto <-> domain, authenticates the caller, and maps absl::Status to
// grpc::Status in one place (status_util.h). They hold no state of their own:
// each is given the narrow set of the daemon's parts it uses (the *Deps
// structs; the pointers outlive the service), wired by Daemon (daemon.h).
#ifndef HSAP_SERVER_GRPC_SERVICES_H_
#define HSAP_SERVER_GRPC_SERVICES_H_

#include <functional>
#include <string>

#include "hsap/v1/attention.grpc.pb.h"
#include "hsap/v1/cluster.grpc.pb.h"
#include "hsap/v1/regions.grpc.pb.h"
#include "server/cluster/cluster.h"
#include "server/exec/attention_call.h"
#include "server/exec/call_gate.h"
#include "server/exec/call_runner.h"
#include "server/exec/device_slots.h"
#include "server/exec/measured_profile.h"
#include "server/metrics/hsap_metrics.h"
#include "server/shm/region_registry.h"
#include "server/shm/session_manager.h"

namespace hsap {

struct AttentionDeps {
  CallGate* gate = nullptr;                   // admission and drain
  shm::SessionManager* sessions = nullptr;    // caller -> session
  shm::RegionRegistry* regions = nullptr;     // tensors
  const ValidationLimits* limits = nullptr;
  CallRunner* runner = nullptr;               // plan, arrival, execution
  metrics::HsapMetrics* metrics = nullptr;
  std::function<void()> refresh_gauges;       // after each call
  std::string tcp_token;                      // what TCP calls must carry; empty: open
};

class AttentionService final : public hsap::v1::Attention::Service {
 public:
  explicit AttentionService(AttentionDeps deps) : deps_(std::move(deps)) {}
  grpc::Status Forward(grpc::ServerContext* context, const hsap::v1::AttentionForwardRequest* request,
                       hsap::v1::AttentionForwardResponse* response) override;
  grpc::Status Backward(grpc::ServerContext* context,
                        const hsap::v1::AttentionBackwardRequest* request,
                        hsap::v1::AttentionBackwardResponse* response) override;

 private:
  const AttentionDeps deps_;
};

struct RegionsDeps {
  shm::SessionManager* sessions = nullptr;
  shm::RegionRegistry* regions = nullptr;
  std::function<void()> refresh_gauges;  // after each change
  std::string tcp_token;
};

class RegionsService final : public hsap::v1::Regions::Service {
 public:
  explicit RegionsService(RegionsDeps deps) : deps_(std::move(deps)) {}
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
  const RegionsDeps deps_;
};

struct ClusterDeps {
  const CallGate* gate = nullptr;
  const shm::SessionManager* sessions = nullptr;
  cluster::Cluster* cluster = nullptr;  // null on a single node
  const exec::DeviceSlots* slots = nullptr;
  std::string tcp_token;
  std::string profile;                           // hsapd --profile
  const exec::MeasuredProfiles* measured = nullptr;  // what it measured so far
};

class ClusterService final : public hsap::v1::Cluster::Service {
 public:
  explicit ClusterService(ClusterDeps deps) : deps_(std::move(deps)) {}
  grpc::Status GetClusterStatus(grpc::ServerContext* context,
                                const hsap::v1::GetClusterStatusRequest* request,
                                hsap::v1::GetClusterStatusResponse* response) override;

 private:
  const ClusterDeps deps_;
};

}  // namespace hsap

#endif  // HSAP_SERVER_GRPC_SERVICES_H_
