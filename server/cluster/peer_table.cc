#include "server/cluster/peer_table.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace hsap::cluster {

std::string PeerName(const PeerRecord& peer) {
  return peer.incarnation == 0 ? peer.address : absl::StrCat(peer.address, "#", peer.incarnation);
}

const char* NodeStateName(NodeState state) {
  switch (state) {
    case NodeState::kJoining: return "JOINING";
    case NodeState::kUp: return "UP";
    case NodeState::kSuspect: return "SUSPECT";
    case NodeState::kDown: return "DOWN";
  }
  return "?";
}

PeerRecord* PeerTable::Add(const std::string& address, int32_t id) {
  auto record = std::make_unique<PeerRecord>();
  record->id = id >= 0 ? id : next_id_++;
  record->address = address;
  PeerRecord* p = record.get();
  by_address_[address] = p->id;
  by_id_[p->id] = std::move(record);
  return p;
}

PeerRecord* PeerTable::AddPinned(const std::string& address, bool self) {
  PeerRecord* p = Add(address);
  p->pinned = true;
  p->self = self;
  return p;
}

absl::StatusOr<PeerRecord*> PeerTable::Reference(
    const std::string& address,
    const std::function<std::shared_ptr<v1::Peer::Stub>(const std::string&)>& make_stub) {
  PeerRecord* p = FindAddress(address);
  if (p == nullptr) {
    if (runtime_peers_ >= max_peers_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "this daemon already references ", runtime_peers_, " run-time peers, the limit "
          "(--max_peers); '", address.substr(0, 256), "' cannot be added until a group ends"));
    }
    auto parked = parked_.find(address);
    if (parked != parked_.end()) {
      // Back within the parking: its old id and endpoint (the incarnation
      // is learnt again at formation; a new one reconnects).
      p = Add(address, parked->second.id);
      p->connected_incarnation = parked->second.connected_incarnation;
      p->ucx_address = parked->second.ucx_address;
      p->link = parked->second.link;
      parked_.erase(parked);
    } else {
      p = Add(address);
    }
    ++runtime_peers_;
    if (make_stub) p->stub = make_stub(address);
  }
  if (!p->pinned) ++p->references;
  return p;
}

void PeerTable::Unreference(int32_t id, absl::Time now) {
  PeerRecord* p = Find(id);
  if (p == nullptr || p->pinned || p->references <= 0) return;
  if (--p->references == 0) p->unreferenced_since = now;
}

std::vector<std::unique_ptr<PeerRecord>> PeerTable::TakeExpired(absl::Time now,
                                                                absl::Duration linger,
                                                                std::vector<int32_t>* close) {
  std::vector<std::unique_ptr<PeerRecord>> out;
  for (auto it = by_id_.begin(); it != by_id_.end();) {
    PeerRecord& p = *it->second;
    if (p.pinned || p.references > 0 || now - p.unreferenced_since < linger) {
      ++it;
      continue;
    }
    by_address_.erase(p.address);
    --runtime_peers_;
    parked_[p.address] = Parked{p.id, p.connected_incarnation, p.ucx_address, now, p.link};
    out.push_back(std::move(it->second));
    it = by_id_.erase(it);
  }
  while (static_cast<int32_t>(parked_.size()) > max_peers_) {
    auto oldest = parked_.begin();
    for (auto it = parked_.begin(); it != parked_.end(); ++it) {
      if (it->second.since < oldest->second.since) oldest = it;
    }
    if (close != nullptr) close->push_back(oldest->second.id);
    parked_.erase(oldest);
  }
  return out;
}

PeerRecord* PeerTable::Find(int32_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : it->second.get();
}

PeerRecord* PeerTable::FindAddress(absl::string_view address) const {
  auto it = by_address_.find(address);
  return it == by_address_.end() ? nullptr : Find(it->second);
}

std::vector<PeerRecord*> PeerTable::All() const {
  std::vector<PeerRecord*> out;
  for (const auto& [id, p] : by_id_) out.push_back(p.get());
  return out;
}

}  // namespace hsap::cluster
