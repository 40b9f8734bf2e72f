// Link measurement for the cost model's measured profile (docs/planner.md,
// "Measured profiles"): a group's root times Peer.ProbeLink round trips to
// a member over the peer connection (gRPC over TCP, the control plane's
// path; UCX's TCP transport crosses the same links).
//
//   latency   = half the median of 7 empty round trips
//   bandwidth = payload / (median of 3 round trips - the empty one), the
//               payload grown from 64 KiB by 4x until one transfer takes
//               at least 20 ms or reaches 3 MiB (under gRPC's
//               default 4 MiB message limit)
//
// both rounded to three significant digits. Bounded: about 20 RPCs, each
// with a deadline of at most the caller's.
#ifndef HSAP_SERVER_CLUSTER_LINK_PROBE_H_
#define HSAP_SERVER_CLUSTER_LINK_PROBE_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace hsap::cluster {

struct LinkFigures {
  uint64_t incarnation = 0;  // of the peer when measured; 0: not measured
  double bytes_per_s = 0;    // one direction's goodput
  double latency_s = 0;      // half the round trip
};

// One probe: sends `payload_bytes` and waits for the answer, by `deadline`.
using ProbeCall = std::function<absl::Status(int64_t payload_bytes, absl::Time deadline)>;

// The schedule above over `call`. UNAVAILABLE naming `peer` when a probe
// fails, DEADLINE_EXCEEDED when `deadline` passes first.
absl::StatusOr<LinkFigures> MeasureLink(const ProbeCall& call, const std::string& peer,
                                        absl::Time deadline);

}  // namespace hsap::cluster

#endif  // HSAP_SERVER_CLUSTER_LINK_PROBE_H_
