// Cluster status for operators: this node, and on a cluster every node as
// the membership layer (server/cluster) sees it.
#include "common/version.h"
#include "server/plan/plan_proto.h"
#include "server/grpc/services.h"
#include "server/grpc/status_util.h"
#include "server/grpc/tcp_auth.h"

namespace hsap {
namespace {

hsap::v1::NodeState ToProto(cluster::NodeState s) {
  switch (s) {
    case cluster::NodeState::kJoining: return hsap::v1::NODE_STATE_JOINING;
    case cluster::NodeState::kUp: return hsap::v1::NODE_STATE_UP;
    case cluster::NodeState::kSuspect: return hsap::v1::NODE_STATE_SUSPECT;
    case cluster::NodeState::kDown: return hsap::v1::NODE_STATE_DOWN;
  }
  return hsap::v1::NODE_STATE_UNSPECIFIED;
}

}  // namespace

grpc::Status ClusterService::GetClusterStatus(grpc::ServerContext* context,
                                              const hsap::v1::GetClusterStatusRequest*,
                                              hsap::v1::GetClusterStatusResponse* response) {
  if (auto caller = AuthorizeCall(*context, deps_.tcp_token); !caller.ok()) {
    return ToGrpcStatus(caller.status());
  }
  const bool draining = deps_.gate->closed();
  cluster::Cluster* c = deps_.cluster;
  const int32_t self = c != nullptr ? c->node_rank() : 0;
  response->set_self_node_rank(self);
  response->set_formed(c == nullptr || c->formed());
  response->set_epoch(c != nullptr ? c->epoch() : 1);
  response->set_active_calls(deps_.gate->in_flight());
  response->set_sessions(deps_.sessions->num_sessions());
  response->set_profile(deps_.profile);
  if (deps_.measured != nullptr) {
    for (const exec::ComputeRate& r : deps_.measured->Measured()) {
      auto* m = response->add_measured_compute();
      m->set_dtype(plan::DTypeToProto(r.dtype));
      m->set_head_dim(r.head_dim);
      m->set_forward_flops(r.forward_flops);
      m->set_backward_factor(r.backward_factor);
      m->set_kv_interleave_factor(r.kv_interleave_factor);
    }
    if (deps_.measured->intra_measured()) {
      const exec::IntraTier intra = deps_.measured->intra_if_measured();
      response->set_intra_bytes_per_s(intra.bytes_per_s);
      response->set_intra_latency_us(intra.latency_s * 1e6);
    }
  }
  auto fill_self = [&](hsap::v1::NodeInfo* node) {
    node->set_version(kVersion);
    const std::vector<double> busy = deps_.slots->busy_seconds();
    for (int i = 0; i < deps_.slots->size(); ++i) {
      auto* device = node->add_devices();
      device->set_name(deps_.slots->names()[i]);
      device->set_busy_seconds_total(busy[i]);
    }
    if (draining) node->set_state(hsap::v1::NODE_STATE_DRAINING);
  };
  if (c == nullptr) {
    auto* node = response->add_nodes();
    node->set_node_rank(0);
    node->set_state(hsap::v1::NODE_STATE_UP);
    fill_self(node);
    return grpc::Status::OK;
  }
  response->set_self_address(c->self_address());
  for (const cluster::NodeStatus& s : c->NodeStates()) {
    auto* node = response->add_nodes();
    node->set_node_rank(s.node_rank);
    node->set_address(s.address);
    node->set_state(ToProto(s.state));
    node->set_heartbeat_age_seconds(absl::ToDoubleSeconds(s.heartbeat_age));
    node->set_references(s.references);
    node->set_pinned(s.pinned);
    node->set_incarnation(s.incarnation);
    node->set_link_bytes_per_s(s.link_bytes_per_s);
    node->set_link_latency_us(s.link_latency_s * 1e6);
    if (s.node_rank == self) fill_self(node);
  }
  for (const cluster::GroupStatus& g : c->GroupStates()) {
    auto* group = response->add_groups();
    group->set_name(g.name);
    group->set_state(cluster::GroupStateName(g.state));
    group->set_uid(g.uid);
    group->set_ranks_per_node(g.ranks_per_node);
    group->set_calls(g.calls);
    for (const std::string& n : g.nodes) group->add_nodes(n);
    for (const std::string& p : g.profiles) group->add_profiles(p);
  }
  for (const std::string& p : c->StaticProfiles()) response->add_static_profiles(p);
  return grpc::Status::OK;
}

}  // namespace hsap
