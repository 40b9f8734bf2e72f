#include "server/cluster/group_table.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace hsap::cluster {

const char* GroupStateName(GroupState state) {
  switch (state) {
    case GroupState::kForming: return "FORMING";
    case GroupState::kUp: return "UP";
    case GroupState::kFailed: return "FAILED";
  }
  return "?";
}

std::vector<int32_t> GroupEntry::peers() const {
  std::vector<int32_t> out;
  for (const GroupMember& m : members) out.push_back(m.peer);
  return out;
}

bool GroupEntry::HasPeer(int32_t peer) const {
  for (size_t i = 0; i < members.size(); ++i) {
    if (static_cast<int32_t>(i) != node_index && members[i].peer == peer) return true;
  }
  return false;
}

const GroupMember* GroupEntry::MemberOfPeer(int32_t peer) const {
  for (size_t i = 0; i < members.size(); ++i) {
    if (static_cast<int32_t>(i) != node_index && members[i].peer == peer) return &members[i];
  }
  return nullptr;
}

int32_t GroupEntry::IndexOf(const std::string& address) const {
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i].address == address) return static_cast<int32_t>(i);
  }
  return -1;
}

std::vector<std::string> GroupEntry::addresses() const {
  std::vector<std::string> out;
  for (const GroupMember& m : members) out.push_back(m.address);
  return out;
}

std::vector<std::string> GroupEntry::Missing() const {
  std::vector<std::string> out;
  for (size_t i = 0; i < members.size(); ++i) {
    if (static_cast<int32_t>(i) != node_index && !members[i].joined) {
      out.push_back(absl::StrCat(i, " (", members[i].address,
                                 members[i].last_error.empty()
                                     ? ""
                                     : absl::StrCat("; last: ", members[i].last_error),
                                 ")"));
    }
  }
  return out;
}

absl::StatusOr<std::shared_ptr<GroupEntry>> GroupTable::FindOrAdd(
    const std::string& name, const std::vector<std::string>& addresses, int32_t node_index,
    bool* added) {
  *added = false;
  auto it = groups_.find(name);
  if (it != groups_.end()) {
    GroupEntry& g = *it->second;
    std::vector<std::string> known;
    for (const GroupMember& m : g.members) known.push_back(m.address);
    if (known != addresses || g.node_index != node_index) {
      return absl::InvalidArgumentError(absl::StrCat(
          "group '", name, "' was formed on this daemon with call.nodes [",
          absl::StrJoin(known, ", "), "] and node_index ", g.node_index, "; this call names [",
          absl::StrJoin(addresses, ", "), "] and node_index ", node_index,
          " (one group name, one member list)"));
    }
    if (g.state == GroupState::kFailed) {
      return absl::FailedPreconditionError(absl::StrCat(
          "group '", name, "' failed (", g.failure.message(),
          "); form the group again under a new group name"));
    }
    return it->second;
  }
  if (static_cast<int>(groups_.size()) >= max_groups_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the daemon already has ", groups_.size(), " multi-node groups, the limit "
        "(--max_call_groups); group '", name, "' cannot form until a group is released"));
  }
  auto g = std::make_shared<GroupEntry>();
  g->name = name;
  g->node_index = node_index;
  for (const std::string& a : addresses) g->members.push_back(GroupMember{a});
  groups_[name] = g;
  *added = true;
  return g;
}

std::shared_ptr<GroupEntry> GroupTable::Find(const std::string& name) const {
  auto it = groups_.find(name);
  return it == groups_.end() ? nullptr : it->second;
}

std::shared_ptr<GroupEntry> GroupTable::Remove(const std::string& name) {
  auto it = groups_.find(name);
  if (it == groups_.end()) return nullptr;
  std::shared_ptr<GroupEntry> g = std::move(it->second);
  groups_.erase(it);
  return g;
}

int GroupTable::FailWithPeer(int32_t peer, uint64_t incarnation, const absl::Status& reason) {
  int failed = 0;
  for (auto& [name, g] : groups_) {
    if (g->state == GroupState::kFailed) continue;
    for (size_t i = 0; i < g->members.size(); ++i) {
      const GroupMember& m = g->members[i];
      if (static_cast<int32_t>(i) == g->node_index || m.peer != peer) continue;
      if (incarnation != 0 && m.incarnation != incarnation) continue;
      g->state = GroupState::kFailed;
      g->failure = reason;
      ++failed;
      break;
    }
  }
  return failed;
}

std::array<int, 3> GroupTable::CountByState() const {
  std::array<int, 3> counts{};
  for (const auto& [name, g] : groups_) ++counts[static_cast<int>(g->state)];
  return counts;
}

std::vector<std::shared_ptr<GroupEntry>> GroupTable::All() const {
  std::vector<std::shared_ptr<GroupEntry>> out;
  for (const auto& [name, g] : groups_) out.push_back(g);
  return out;
}

}  // namespace hsap::cluster
