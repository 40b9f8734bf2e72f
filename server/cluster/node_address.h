// The address a daemon is named by in CallId.nodes and on the peer
// service: its advertised TCP address (hsapd --advertise_address). Pure
// functions, no I/O.
#ifndef HSAP_SERVER_CLUSTER_NODE_ADDRESS_H_
#define HSAP_SERVER_CLUSTER_NODE_ADDRESS_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace hsap::cluster {

inline constexpr size_t kMaxNodeAddressBytes = 255;
// Member nodes of one group at most (CallId.nodes, JoinGroupRequest.nodes).
inline constexpr int32_t kMaxGroupNodes = 4096;

// "<host>:<port>": 3 to kMaxNodeAddressBytes printable characters without
// spaces, a non-empty host ("[v6]" allowed) and a port in 1..65535.
// INVALID_ARGUMENT naming `field` and the (bounded) value otherwise.
// Addresses are compared byte for byte: "localhost:7000" and
// "127.0.0.1:7000" are different nodes.
absl::Status ValidateNodeAddress(absl::string_view field, absl::string_view address);

}  // namespace hsap::cluster

#endif  // HSAP_SERVER_CLUSTER_NODE_ADDRESS_H_
