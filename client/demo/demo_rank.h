// One trainer rank of the demo, as its own process: for every pack and
// strategy it asks Plans.Dispatch which tokens it holds, registers a shared
// buffer with its node's hsapd, runs the collective forward and backward
// calls of the 4-rank group with only those tokens, and writes its outputs
// and the daemon's statistics to ResultPath (demo_run.h).
#ifndef HSAP_CLIENT_DEMO_DEMO_RANK_H_
#define HSAP_CLIENT_DEMO_DEMO_RANK_H_

#include "absl/status/status.h"
#include "client/demo/demo_run.h"

namespace hsap::demo {

// REQUIRES: 0 <= rank < run.ranks(); the cluster of run.sockets formed.
// Rank 0 prints one progress line per (pack, strategy).
absl::Status RunRank(const DemoRun& run, int rank);

}  // namespace hsap::demo

#endif  // HSAP_CLIENT_DEMO_DEMO_RANK_H_
