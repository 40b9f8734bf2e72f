// Models of the peer protocol's field rules (server/cluster/
// peer_validation.h, node_address.h), written from their contracts, for the
// fuzz targets that compare the Cluster's answers against them.
#ifndef HSAP_TESTS_FUZZ_PEER_MODEL_H_
#define HSAP_TESTS_FUZZ_PEER_MODEL_H_

#include <string>

#include "hsap/v1/peer.pb.h"
#include "server/cluster/node_address.h"
#include "server/cluster/peer_validation.h"
#include "server/transport/ucx_address.h"
#include "server/transport/ucx_worker.h"

namespace hsap::fuzz {

inline bool Printable(const std::string& s) {
  for (char c : s) {
    if (c < 0x20 || c > 0x7e) return false;
  }
  return true;
}

// <host>:<port>: 3 to 255 printable characters without spaces, a non-empty
// host, a port in 1..65535.
inline bool ValidAddress(const std::string& a) {
  if (a.size() < 3 || a.size() > cluster::kMaxNodeAddressBytes) return false;
  for (char c : a) {
    if (c <= 0x20 || c > 0x7e) return false;
  }
  const size_t colon = a.rfind(':');
  if (colon == std::string::npos || colon == 0) return false;
  const std::string port = a.substr(colon + 1);
  if (port.empty() || port.size() > 5) return false;
  int value = 0;
  for (char c : port) {
    if (c < '0' || c > '9') return false;
    value = value * 10 + (c - '0');
  }
  return value >= 1 && value <= 65535;
}

inline bool ValidGroupName(const std::string& g) {
  return !g.empty() && g.size() <= cluster::kMaxPeerGroupBytes;
}

// A UCX worker address a node with `worker` accepts from a peer.
inline bool ValidUcx(const transport::UcxWorker& worker, const std::string& ucx) {
  return !ucx.empty() && ucx.size() <= transport::kMaxUcxAddressBytes &&
         worker.ValidatePeerAddress(ucx).ok();
}

// ValidateJoinGroupRequest's contract.
inline bool ValidJoinGroupRequest(const v1::JoinGroupRequest& r,
                                  const transport::UcxWorker& worker) {
  const int n = r.nodes_size();
  bool valid = ValidGroupName(r.group()) && n >= 2 && n <= cluster::kMaxGroupNodes &&
               r.node_index() >= 1 && r.node_index() < n && r.address() == r.nodes(r.node_index()) &&
               r.incarnation() != 0 && r.version().size() <= cluster::kMaxPeerVersionBytes &&
               Printable(r.version()) && r.nonce().size() <= cluster::kMaxPeerNonceBytes &&
               r.refused_code() >= 0 && r.refused_code() <= 16 &&
               r.refused_message().size() <= cluster::kMaxPeerMessageBytes &&
               ValidUcx(worker, r.ucx_worker_address());
  for (int i = 0; valid && i < n; ++i) {
    valid = ValidAddress(r.nodes(i));
    for (int j = 0; valid && j < i; ++j) valid = r.nodes(i) != r.nodes(j);
  }
  return valid;
}

}  // namespace hsap::fuzz

#endif  // HSAP_TESTS_FUZZ_PEER_MODEL_H_
