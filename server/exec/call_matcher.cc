#include "server/exec/call_matcher.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace hsap {

absl::StatusOr<std::shared_ptr<const MatchedCall>> CallMatcher::Arrive(const CallArrival& a,
                                                                      absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  if (!aborted_.ok()) return aborted_;
  GroupState& g = groups_[a.group];
  if (g.group_size == 0) g.group_size = a.group_size;
  if (g.group_size != a.group_size) {
    return absl::InvalidArgumentError(absl::StrCat("call.group_size is ", a.group_size,
                                                   " but group '", a.group, "' has size ",
                                                   g.group_size));
  }
  auto last = g.last_seq.find(a.rank);
  if (last != g.last_seq.end() && a.call_seq != last->second + 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "call.call_seq is ", a.call_seq, " but rank ", a.rank, " of group '", a.group,
        "' last submitted ", last->second, a.call_seq <= last->second ? " (a replay)" : " (a skip)",
        "; the next must be ", last->second + 1));
  }
  g.last_seq[a.rank] = a.call_seq;

  PendingCall& call = g.calls[a.call_seq];
  if (call.expected == 0) {
    call.expected = static_cast<int32_t>(a.local_ranks.size());
    call.agreement_key = a.agreement_key;
    call.first_rank = a.rank;
  }
  if (call.failure.ok() && call.agreement_key != a.agreement_key) {
    call.failure = absl::InvalidArgumentError(absl::StrCat(
        "ranks of group '", a.group, "' disagree on call ", a.call_seq, ": rank ", call.first_rank,
        " would run plan ", call.agreement_key, ", rank ", a.rank, " plan ", a.agreement_key,
        " (mask, shapes and options must be the same on every rank)"));
  }
  call.arrived.push_back(a.rank);
  ++call.waiting;
  if (call.failure.ok() && static_cast<int32_t>(call.arrived.size()) == call.expected) {
    auto m = std::make_shared<MatchedCall>();
    m->group = a.group;
    m->call_seq = a.call_seq;
    if (factory_) m->resources = factory_(a.group, a.group_size, a.call_seq);
    call.matched = std::move(m);
  }
  auto done = [&call, this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return call.matched != nullptr || !call.failure.ok() || !aborted_.ok();
  };
  bool in_time = false;
  if (!a.cancelled) {
    in_time = mu_.AwaitWithDeadline(absl::Condition(&done), deadline);
  } else {
    while (!(in_time = mu_.AwaitWithDeadline(absl::Condition(&done),
                                             std::min(deadline, absl::Now() + kCancelPoll)))) {
      if (absl::Now() >= deadline) break;
      if (a.cancelled()) {
        call.failure = absl::CancelledError(absl::StrCat(
            "call ", a.call_seq, " of group '", a.group, "': the client of rank ", a.rank,
            " cancelled the call or went away"));
        in_time = true;
        break;
      }
    }
  }
  if (!in_time && call.failure.ok() && call.matched == nullptr) {
    std::vector<int32_t> missing;
    for (int32_t r : a.local_ranks) {
      if (std::find(call.arrived.begin(), call.arrived.end(), r) == call.arrived.end()) {
        missing.push_back(r);
      }
    }
    call.failure = absl::DeadlineExceededError(absl::StrCat(
        "call ", a.call_seq, " of group '", a.group, "': rank(s) ", absl::StrJoin(missing, ", "),
        " did not arrive before the deadline"));
  }
  absl::StatusOr<std::shared_ptr<const MatchedCall>> result =
      !call.failure.ok() ? absl::StatusOr<std::shared_ptr<const MatchedCall>>(call.failure)
      : call.matched != nullptr ? absl::StatusOr<std::shared_ptr<const MatchedCall>>(call.matched)
                                : absl::StatusOr<std::shared_ptr<const MatchedCall>>(aborted_);
  // The last rank to leave a finished call removes it, unless it failed with
  // ranks still to come (they must see the same failure): failed calls stay
  // until all expected ranks have passed through.
  --call.waiting;
  const bool all_passed = static_cast<int32_t>(call.arrived.size()) >= call.expected;
  const uint64_t seq = a.call_seq;
  if (call.waiting == 0 && all_passed) g.calls.erase(seq);
  // A failed call whose missing rank never comes would stay forever: drop
  // calls far behind the newest one.
  constexpr uint64_t kKeepBehind = 64;
  if (seq > kKeepBehind) {
    for (auto it = g.calls.begin(); it != g.calls.end();) {
      if (it->first + kKeepBehind < seq && it->second.waiting == 0) {
        g.calls.erase(it++);
      } else {
        ++it;
      }
    }
  }
  return result;
}

void CallMatcher::Abort(const absl::Status& reason) {
  absl::MutexLock lock(&mu_);
  aborted_ = reason;
}

int CallMatcher::num_groups() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(groups_.size());
}

}  // namespace hsap
