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

absl::Status PlanAgreement::SetLocal(const CallKey& call, const std::string& key,
                                     uint32_t recv_comm) {
  absl::MutexLock lock(&mu_);
  Entry& entry = FindOrAdd(call);
  entry.local = key;
  entry.local_comm = recv_comm;
  entry.ended = false;
  for (const auto& [node, statement] : entry.seen) {
    const std::string& theirs = statement.key;
    if (theirs != key) {
      return absl::FailedPreconditionError(
          absl::StrCat("plan mismatch for group '", call.group, "' call_seq ", call.call_seq,
                       call.backward ? " (backward)" : " (forward)", ": this node runs plan ", key,
                       ", node ", node, " runs ", theirs));
    }
  }
  return absl::OkStatus();
}

void PlanAgreement::EndLocal(const std::string& group, uint64_t call_seq) {
  absl::MutexLock lock(&mu_);
  for (bool backward : {false, true}) {
    auto it = calls_.find(CallKey{group, call_seq, backward});
    if (it != calls_.end()) it->second.ended = true;
  }
}

std::string PlanAgreement::OnRemote(const CallKey& call, int32_t node, const std::string& key,
                                    uint32_t recv_comm, uint32_t* local_comm) {
  absl::MutexLock lock(&mu_);
  Entry& entry = FindOrAdd(call);
  auto before = entry.seen.find(node);
  if (entry.ended && before != entry.seen.end() && before->second.recv_comm != recv_comm) {
    // The peer runs a new call under the same name (its old group was
    // released): this entry, ours included, belongs to the old one.
    entry = Entry{.order = entry.order};
  }
  entry.seen[node] = Statement{key, recv_comm};
  if (local_comm != nullptr && !entry.local.empty()) *local_comm = entry.local_comm;
  return entry.local;
}

bool PlanAgreement::HasLocal(const std::string& group, uint64_t call_seq) {
  absl::MutexLock lock(&mu_);
  for (bool backward : {false, true}) {
    auto it = calls_.find(CallKey{group, call_seq, backward});
    if (it != calls_.end() && !it->second.local.empty() && !it->second.ended) return true;
  }
  return false;
}

}  // namespace hsap::cluster
