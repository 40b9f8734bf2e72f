// Brute-force checks of a compiled plan against the invariants of DESIGN.md
// §5, for tests and debugging (cost grows with T^2 * Hq: small cases only).
//
//  * CheckCoverage:   every allowed (head, q, k) pair is computed exactly once
//                     by the forward items and exactly once by the backward
//                     items, and no other pair; every item reads rows that
//                     exist (home rows, or rows received in its own stage).
//  * CheckTransfers:  every send has an identical receive on the peer in the
//                     same stage (payload, global ranges, bytes), and back;
//                     per stage, at most one transfer per (peer, payload).
//  * CheckBudget:     every stage's K/V receive rows fit spec.recv_buffer_bytes
//                     and its returned dK/dV rows (fp32) ReturnBytesRatio
//                     times it.
//  * ExactNeedBruteForce: per rank, keys its queries see that it does not
//                     hold, counted token by token.
#ifndef HSAP_SERVER_PLAN_PLAN_CHECKER_H_
#define HSAP_SERVER_PLAN_PLAN_CHECKER_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "server/plan/plan.h"

namespace hsap::plan {

absl::Status CheckCoverage(const Plan& plan);
absl::Status CheckTransfers(const Plan& plan);
absl::Status CheckBudget(const Plan& plan);

// Number of tokens rank r needs but does not hold, for every rank, computed
// from the dispatch and the mask one (q, k) pair at a time.
std::vector<int64_t> ExactNeedBruteForce(const Plan& plan);

}  // namespace hsap::plan

#endif  // HSAP_SERVER_PLAN_PLAN_CHECKER_H_
