// Test harness: K hsapd processes on loopback forming one cluster (free TCP
// ports chosen at run time), each with N CPU device slots. Every process is
// killed and reaped when the harness goes away, whatever the test did.
#ifndef HSAP_TESTS_INTEGRATION_LOCAL_CLUSTER_H_
#define HSAP_TESTS_INTEGRATION_LOCAL_CLUSTER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "hsap/v1/cluster.pb.h"
#include "tests/integration/test_daemon.h"

namespace hsap::testing {

// A TCP port on 127.0.0.1 that was free a moment ago.
int FreePort();

class LocalCluster {
 public:
  // Starts `nodes` daemons with --devices=cpu:<devices> plus `flags`.
  static absl::StatusOr<std::unique_ptr<LocalCluster>> Start(int nodes, int devices,
                                                             std::vector<std::string> flags);
  // The same, plus `node_flags[i]` for node i only (e.g. its own
  // --token_file); node_flags may be shorter than `nodes`.
  static absl::StatusOr<std::unique_ptr<LocalCluster>> Start(
      int nodes, int devices, std::vector<std::string> flags,
      std::vector<std::vector<std::string>> node_flags);
  // `nodes` daemons with --port only, no --peers: groups form at run time
  // between the daemons their calls name (advertised as 127.0.0.1:<port>).
  // node_flags[i]: node i's own extra flags (may be shorter than `nodes`).
  static absl::StatusOr<std::unique_ptr<LocalCluster>> StartWithoutPeers(
      int nodes, int devices, std::vector<std::string> flags,
      std::vector<std::vector<std::string>> node_flags = {});
  // OK once every daemon reports the cluster formed.
  absl::Status WaitFormed(absl::Duration timeout);
  // Node i's GetClusterStatus over its Unix socket (a 2 s deadline);
  // UNAVAILABLE with gRPC's message when it does not answer.
  absl::StatusOr<hsap::v1::GetClusterStatusResponse> Status(int i) const;

  int nodes() const { return static_cast<int>(ports_.size()); }
  // Node i's TCP port (peers and operators).
  int port(int i) const { return ports_[i]; }
  // Node i's advertised address, "127.0.0.1:<port>".
  std::string address(int i) const;
  std::vector<std::string> sockets() const;
  DaemonProcess* node(int i) { return procs_[i].get(); }
  // SIGKILL, then reap.
  void Kill(int i);
  // Starts node i again (same port and flags, new socket).
  absl::Status Restart(int i);
  // Replaces node i's own flags for its next Restart.
  void SetNodeFlags(int i, std::vector<std::string> flags);

 private:
  absl::StatusOr<std::unique_ptr<DaemonProcess>> StartNode(int i);

  int devices_ = 1;
  bool static_peers_ = true;
  std::vector<std::string> flags_;
  std::vector<std::vector<std::string>> node_flags_;  // per node, after flags_
  std::vector<int> ports_;
  std::vector<std::unique_ptr<DaemonProcess>> procs_;
};

}  // namespace hsap::testing

#endif  // HSAP_TESTS_INTEGRATION_LOCAL_CLUSTER_H_
