#include "server/cluster/plan_agreement.h"

#include "absl/strings/str_cat.h"

namespace hsap::cluster {

PlanAgreement::Entry& PlanAgreement::FindOrAdd(const CallKey& call) {
  auto [it, inserted] = calls_.try_emplace(call);
  if (inserted) {
    it->second.order = next_order_++;
    if (calls_.size() > max_calls_) {
      auto oldest = calls_.begin();
      for (auto c = calls_.begin(); c != calls_.end(); ++c) {
        if (c->second.order < oldest->second.order) oldest = c;
      }
      if (oldest != it) calls_.erase(oldest);
    }
  }
  return it->second;
}

absl::Status PlanAgreement::SetLocal(const CallKey& call, const std::string& key) {
  absl::MutexLock lock(&mu_);
  Entry& entry = FindOrAdd(call);
  entry.local = key;
  for (const auto& [node, theirs] : entry.seen) {
    if (theirs != key) {
      return absl::FailedPreconditionError(
          absl::StrCat("plan mismatch for group '", call.group, "' call_seq ", call.call_seq,
                       call.backward ? " (backward)" : " (forward)", ": this node runs plan ", key,
                       ", node ", node, " runs ", theirs));
    }
  }
  return absl::OkStatus();
}

std::string PlanAgreement::OnRemote(const CallKey& call, int32_t node, const std::string& key) {
  absl::MutexLock lock(&mu_);
  Entry& entry = FindOrAdd(call);
  entry.seen[node] = key;
  return entry.local;
}

}  // namespace hsap::cluster
