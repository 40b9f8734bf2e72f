#include "server/exec/call_matcher.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"

namespace hsap {

void CallMatcher::SetLimits(CallMatcherLimits limits) { limits_ = std::move(limits); }

bool CallMatcher::AnyoneWaiting(const GroupState& g) {
  for (const auto& [seq, call] : g.calls) {
    if (call.waiting > 0) return true;
  }
  return false;
}

void CallMatcher::MaybeRelease(const std::string& name, bool idle) {
  auto it = groups_.find(name);
  if (it == groups_.end()) return;
  const GroupState& g = it->second;
  const bool unowned = g.sessions.empty() && !g.anonymous;
  if ((!unowned && !idle) || AnyoneWaiting(g)) return;
  for (uint64_t session : g.sessions) {
    auto s = groups_of_session_.find(session);
    if (s == groups_of_session_.end()) continue;
    s->second.erase(name);
    if (s->second.empty()) groups_of_session_.erase(s);
  }
  const std::string released = name;  // `name` may be the erased key
  groups_.erase(it);
  if (limits_.on_release) limits_.on_release(released);
}

void CallMatcher::SweepIdle(bool force) {
  const absl::Time now = absl::Now();
  if (!force && now - last_sweep_ < absl::Seconds(1)) return;
  last_sweep_ = now;
  std::vector<std::string> idle;
  for (const auto& [name, g] : groups_) {
    if (now - g.last_used >= limits_.idle_timeout) idle.push_back(name);
  }
  for (const std::string& name : idle) MaybeRelease(name, /*idle=*/true);
}

absl::StatusOr<CallMatcher::GroupState*> CallMatcher::FindOrAddGroup(const CallArrival& a) {
  SweepIdle(/*force=*/false);
  auto it = groups_.find(a.group);
  if (it == groups_.end()) {
    if (static_cast<int>(groups_.size()) >= limits_.max_groups) SweepIdle(/*force=*/true);
    if (static_cast<int>(groups_.size()) >= limits_.max_groups) {
      if (limits_.on_refusal) limits_.on_refusal("max_call_groups");
      return absl::ResourceExhaustedError(absl::StrCat(
          "the daemon already tracks ", groups_.size(), " call groups, the limit "
          "(--max_call_groups); group '", a.group, "' cannot start until a group is released "
          "(every session of it closed, or idle for ",
          absl::FormatDuration(limits_.idle_timeout), ")"));
    }
    it = groups_.try_emplace(a.group).first;
  }
  GroupState& g = it->second;
  g.last_used = absl::Now();
  return &g;
}

void CallMatcher::OnSessionClosed(uint64_t session) {
  absl::MutexLock lock(&mu_);
  auto s = groups_of_session_.find(session);
  if (s == groups_of_session_.end()) return;
  const absl::flat_hash_set<std::string> names = std::move(s->second);
  groups_of_session_.erase(s);
  for (const std::string& name : names) {
    auto it = groups_.find(name);
    if (it == groups_.end()) continue;
    GroupState& g = it->second;
    g.sessions.erase(session);
    // The ranks it submitted start afresh for whoever submits them next.
    for (auto r = g.ranks.begin(); r != g.ranks.end();) {
      if (r->second.session == session) {
        g.ranks.erase(r++);
      } else {
        ++r;
      }
    }
    MaybeRelease(name, /*idle=*/false);
  }
}

absl::StatusOr<std::shared_ptr<const MatchedCall>> CallMatcher::Arrive(const CallArrival& a,
                                                                      absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  if (!aborted_.ok()) return aborted_;
  absl::StatusOr<GroupState*> found = FindOrAddGroup(a);
  if (!found.ok()) return found.status();
  GroupState& g = **found;
  if (g.group_size == 0 || (g.ranks.empty() && g.calls.empty())) g.group_size = a.group_size;
  if (g.group_size != a.group_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "call.group_size is ", a.group_size, " but group '", a.group, "' has size ", g.group_size,
        " (it is in use by ", g.sessions.size(), " live session(s); a group name is released "
        "when every session that used it has closed)"));
  }
  auto last = g.ranks.find(a.rank);
  if (last != g.ranks.end()) {
    const uint64_t prev = last->second.last_seq;
    if (prev == std::numeric_limits<uint64_t>::max()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "call.call_seq is ", a.call_seq, " but rank ", a.rank, " of group '", a.group,
          "' already submitted call_seq 18446744073709551615, the last one there is; "
          "use a new group name to go on"));
    }
    if (a.call_seq != prev + 1) {
      return absl::FailedPreconditionError(absl::StrCat(
          "call.call_seq is ", a.call_seq, " but rank ", a.rank, " of group '", a.group,
          "' last submitted ", prev, a.call_seq <= prev ? " (a replay)" : " (a skip)",
          "; the next must be ", prev + 1));
    }
  }
  g.ranks[a.rank] = RankState{a.call_seq, a.session};
  if (a.session != 0) {
    if (g.sessions.insert(a.session).second) groups_of_session_[a.session].insert(a.group);
  } else {
    g.anonymous = true;
  }

  PendingCall& call = g.calls[a.call_seq];
  if (call.expected == 0) {
    call.expected = static_cast<int32_t>(a.local_ranks.size());
    call.agreement_key = a.agreement_key;
    call.members = a.members;
    call.first_rank = a.rank;
  }
  if (call.failure.ok() && call.members != a.members) {
    auto list = [](const std::vector<std::string>& m) {
      return absl::StrCat("[", absl::StrJoin(m, ", "), "]");
    };
    call.failure = absl::InvalidArgumentError(absl::StrCat(
        "ranks of group '", a.group, "' disagree on call.nodes of call ", a.call_seq, ": rank ",
        call.first_rank, " declared ", list(call.members), ", rank ", a.rank, " ",
        list(a.members), " (every rank names the same nodes in the same order)"));
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
    if (factory_) m->resources = factory_(a);
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
  g.last_used = absl::Now();
  // Its sessions may have closed while this rank waited.
  MaybeRelease(a.group, /*idle=*/false);
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
