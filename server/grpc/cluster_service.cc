// Cluster status for operators. A single node until the cluster layer
// (server/cluster) joins peers.
#include "common/version.h"
#include "server/grpc/services.h"

namespace hsap {

grpc::Status ClusterService::GetClusterStatus(grpc::ServerContext*,
                                              const hsap::v1::GetClusterStatusRequest*,
                                              hsap::v1::GetClusterStatusResponse* response) {
  response->set_self_node_rank(0);
  response->set_formed(true);
  response->set_epoch(1);
  response->set_active_calls(state_->gate.in_flight());
  response->set_sessions(state_->sessions.num_sessions());
  auto* node = response->add_nodes();
  node->set_node_rank(0);
  node->set_state(state_->gate.closed() ? hsap::v1::NODE_STATE_DRAINING : hsap::v1::NODE_STATE_UP);
  node->set_version(kVersion);
  for (const std::string& name : state_->device_names) {
    auto* d = node->add_devices();
    d->set_name(name);
  }
  if (!state_->device_names.empty()) {
    node->mutable_devices(0)->set_busy_seconds_total(state_->busy_micros.load() / 1e6);
  }
  return grpc::Status::OK;
}

}  // namespace hsap
