// Fuzzes how a group formed at run time comes UP (server/cluster/
// cluster_formation.cc): Peer.JoinGroup at the group's root, Peer.
// ConfirmMember at a member, and a member's FormGroup against a root's
// answer. The Cluster under test is started (no static peers, a UCX worker
// on transport "self", --insecure_peers) and its handlers are called as the
// gRPC server would call them; the other nodes of its groups are FakePeers
// (fake_peer.h) on loopback, which the Cluster calls back over real gRPC
// and whose answers the input scripts.
//
// First byte (mod 4):
//  0, 1  root: a group [this node, 1 or 2 fake members]; a sequence of
//        JoinGroups claiming to be a member (honest, or with the nonce of
//        another member, a guessed one, none, another incarnation, UCX
//        address, member list, index, a refusal, ...) while the members'
//        own accounts (what ConfirmMember answers) change: honest, a
//        restart, not joining, another list, a refusal, an RPC error;
//  2     member: this node is node 1 (or 2) of a group whose root is a
//        fake; fuzzed ConfirmMembers (other roots, groups, nonces), then
//        FormGroup, whose JoinGroup to the root is answered with a fuzzed
//        formed answer or a refusal;
//  3     raw wire bytes as a JoinGroupRequest to the root of a live group,
//        and as a ConfirmMemberRequest to a member.
//
// Properties (docs/reliability.md, "Fuzzing"): every answer equals a model
// of the protocol's contract (the code, whether the member was called back,
// whether the group failed); a JoinGroup is answered `formed` only when it
// returns the nonce the root delivered to the address it claims and every
// member's own account agrees; a formed answer lists the members with the
// incarnations and UCX addresses their own accounts gave, and one 16-byte
// key per group; the root draws one nonce per member slot; a ConfirmMember
// names this node's own account, and plants a nonce only when it comes
// from the group's root (nodes[0]): the next JoinGroup to the root carries
// that nonce and no other; a root's garbage formed answer is
// INVALID_ARGUMENT and fails the group; no crash, leak or sanitizer report.
#include <grpcpp/server_context.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "google/protobuf/stubs/logging.h"
#include "hsap/v1/peer.pb.h"
#include "server/cluster/cluster.h"
#include "server/cluster/peer_service.h"
#include "server/transport/ucx_worker.h"
#include "tests/fuzz/fake_peer.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/fuzz/peer_model.h"

namespace hsap::cluster {
namespace {

using fuzz::FakePeer;
using Code = grpc::StatusCode;

// The Cluster under test is named by this address; it serves no port (its
// handlers are called directly) and nobody dials it.
constexpr char kSelf[] = "127.0.0.1:7";

struct Fixture {
  std::unique_ptr<transport::UcxWorker> worker;  // outlives the Cluster
  std::unique_ptr<FakePeer> fakes[2];
  Cluster cluster;
  std::atomic<uint64_t> groups{0};
  Fixture() {
    auto w = transport::UcxWorker::Create({.transports = "self"});
    FUZZ_CHECK(w.ok());
    worker = std::move(w).value();
    for (auto& f : fakes) f = FakePeer::Start();
    ClusterOptions o;
    o.advertise_address = kSelf;
    o.insecure_peers = true;
    o.version = "fuzz";
    o.rpc_timeout = absl::Milliseconds(500);
    // Nothing times out while a run lasts: the answers depend on the input
    // only (the fakes never answer heartbeats).
    o.suspect_after = absl::Hours(10000);
    o.down_after = absl::Hours(20000);
    o.peer_linger = absl::Hours(20000);
    FUZZ_CHECK(cluster.Start(o, worker.get()).ok());
  }
  PeerServiceImpl* service() { return static_cast<PeerServiceImpl*>(cluster.service()); }
  std::string own_ucx() const { return worker->Address(); }
};

Fixture& F() {
  static Fixture* f = new Fixture;  // never destroyed: its threads outlive inputs
  return *f;
}

// A 10 ms wait at most once per 64 inputs (fuzz_util.h).
fuzz::Budget& Slow() {
  static fuzz::Budget* b = new fuzz::Budget(64);
  return *b;
}

std::string Bytes(FuzzedDataProvider& in, size_t max) { return in.ConsumeRandomLengthString(max); }

// Text for proto3 string fields that cross the wire (a fake's answers):
// ASCII, so always valid UTF-8. (Invalid UTF-8 in a string field fails
// the RPC in protobuf's parser before any hsapd code sees it.)
std::string Ascii(FuzzedDataProvider& in, size_t max) {
  std::string s = in.ConsumeRandomLengthString(max);
  for (char& c : s) c = static_cast<char>(c & 0x7f);
  return s;
}

// A UCX address: this worker's own (what every fake "has"), or garbage.
std::string SomeUcx(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange<int>(0, 3)) {
    case 0: return "";
    case 1: return Bytes(in, 40);
    default: return F().own_ucx();
  }
}

// The other addresses a mutated list may hold.
std::string SomeAddress(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange<int>(0, 5)) {
    case 0: return kSelf;
    case 1: return F().fakes[0]->address();
    case 2: return F().fakes[1]->address();
    case 3: return "127.0.0.1:9";
    case 4: return Ascii(in, 24);
    default: return "10.0.0.1:7070";
  }
}

// (Edits may apply one after another: the list may shrink to nothing.)
void MutateNodes(FuzzedDataProvider& in, std::vector<std::string>* nodes) {
  const int edit = in.ConsumeIntegralInRange<int>(0, 4);
  if (edit == 3 || nodes->empty()) {
    nodes->push_back(SomeAddress(in));
    return;
  }
  switch (edit) {
    case 0:
      if (nodes->size() > 1) std::swap((*nodes)[1], nodes->back());
      if (nodes->size() > 2) std::swap((*nodes)[0], (*nodes)[1]);
      break;
    case 1: (*nodes)[in.ConsumeIntegralInRange<size_t>(0, nodes->size() - 1)] = SomeAddress(in); break;
    case 2: nodes->pop_back(); break;
    default:
      if (nodes->size() > 1) std::swap((*nodes)[0], (*nodes)[1]);
      break;
  }
}

// ---------------------------------------------------------------------------
// The root's side.

struct MemberModel {
  bool joined = false;
  uint64_t incarnation = 0;
  std::string ucx;
  std::string nonce;  // the one the root delivered (drawn once per slot)
};

struct RootModel {
  std::vector<std::string> nodes;
  std::vector<MemberModel> members;  // [0] is this node
  bool failed = false;
  std::string key;  // of the first formed answer
  uint64_t uid = 0;
  bool up() const {
    for (size_t i = 1; i < members.size(); ++i) {
      if (!members[i].joined) return false;
    }
    return true;
  }
};

v1::ConfirmMemberResponse HonestAccount(const std::vector<std::string>& nodes, int index,
                                        uint64_t incarnation) {
  v1::ConfirmMemberResponse a;
  a.set_joining(true);
  a.set_incarnation(incarnation);
  a.set_ucx_worker_address(F().own_ucx());
  for (const std::string& n : nodes) a.add_nodes(n);
  a.set_node_index(index);
  return a;
}

// A member's account: honest, or changed by the input.
FakePeer::Answer<v1::ConfirmMemberResponse> SomeAccount(FuzzedDataProvider& in,
                                                        const std::vector<std::string>& nodes,
                                                        int index, uint64_t incarnation) {
  FakePeer::Answer<v1::ConfirmMemberResponse> a;
  a.response = HonestAccount(nodes, index, incarnation);
  switch (in.ConsumeIntegralInRange<int>(0, 9)) {
    case 0: {
      static constexpr Code kCodes[] = {Code::UNAVAILABLE, Code::PERMISSION_DENIED,
                                        Code::INTERNAL, Code::UNIMPLEMENTED};
      a.code = kCodes[in.ConsumeIntegralInRange<int>(0, 3)];
      break;
    }
    case 1: a.response.set_joining(false); break;
    case 2: {
      std::vector<std::string> other = nodes;
      MutateNodes(in, &other);
      a.response.clear_nodes();
      for (const std::string& n : other) a.response.add_nodes(n);
      break;
    }
    case 3: a.response.set_node_index(in.ConsumeIntegralInRange<int32_t>(-1, 3)); break;
    case 4:
      a.response.set_refused_code(in.ConsumeIntegralInRange<int32_t>(1, 16));
      a.response.set_refused_message(Ascii(in, 64));
      break;
    case 5: a.response.set_ucx_worker_address(SomeUcx(in)); break;
    case 6: a.response.set_incarnation(in.ConsumeIntegralInRange<uint64_t>(1, 4)); break;
    default: break;  // honest
  }
  return a;
}

bool SameNodes(const v1::JoinGroupRequest& r, const std::vector<std::string>& nodes) {
  if (r.nodes_size() != static_cast<int>(nodes.size())) return false;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (r.nodes(static_cast<int>(i)) != nodes[i]) return false;
  }
  return true;
}
bool SameNodes(const v1::ConfirmMemberResponse& r, const std::vector<std::string>& nodes) {
  if (r.nodes_size() != static_cast<int>(nodes.size())) return false;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (r.nodes(static_cast<int>(i)) != nodes[i]) return false;
  }
  return true;
}

int IndexIn(const std::vector<std::string>& nodes, const std::string& address) {
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (nodes[i] == address) return static_cast<int>(i);
  }
  return -1;
}

// One JoinGroup to the root, its answer against the model.
void RootStep(RootModel& m, const std::string& group, const v1::JoinGroupRequest& r,
              const std::vector<FakePeer::Answer<v1::ConfirmMemberResponse>>& accounts) {
  std::vector<int> confirms_before;
  for (auto& f : F().fakes) confirms_before.push_back(f->confirms());
  v1::JoinGroupResponse resp;
  grpc::ServerContext context;
  const grpc::Status st = F().service()->JoinGroup(&context, &r, &resp);
  // Which member (if any) the root called back.
  int called = -1;
  for (int i = 0; i < 2; ++i) {
    const int delta = F().fakes[i]->confirms() - confirms_before[i];
    FUZZ_CHECK(delta == 0 || delta == 1);
    if (delta == 1) {
      FUZZ_CHECK(called == -1);
      called = i + 1;
    }
  }
  auto expect = [&](Code code, bool callback) {
    if (st.error_code() != code || (called != -1) != callback) {
      std::fprintf(stderr, "JoinGroup %s: got code %d (%s), called back %d; expected %d, %s\n",
                   r.ShortDebugString().c_str(), st.error_code(), st.error_message().c_str(),
                   called, code, callback ? "a call back" : "none");
    }
    FUZZ_CHECK(st.error_code() == code);
    FUZZ_CHECK((called != -1) == callback);
  };
  if (!fuzz::ValidJoinGroupRequest(r, *F().worker)) return expect(Code::INVALID_ARGUMENT, false);
  if (r.group() != group) {
    // No group of that name here: "ask again" when it names this node as
    // the root, else FAILED_PRECONDITION naming the root.
    expect(r.nodes(0) == kSelf ? Code::OK : Code::FAILED_PRECONDITION, false);
    FUZZ_CHECK(!resp.formed());
    return;
  }
  const int index = IndexIn(m.nodes, r.address());
  if (index <= 0) {
    expect(Code::PERMISSION_DENIED, false);
    FUZZ_CHECK(st.error_message().find("is not a member of the group") != std::string::npos);
    return;
  }
  if (m.failed) return expect(Code::FAILED_PRECONDITION, false);
  MemberModel& mm = m.members[index];
  const bool asked_same = SameNodes(r, m.nodes);
  const bool fast = mm.joined && !mm.nonce.empty() && r.nonce() == mm.nonce && asked_same &&
                    r.node_index() == index && r.refused_code() == 0 &&
                    r.incarnation() == mm.incarnation && r.ucx_worker_address() == mm.ucx;
  bool formed_expected = false;
  if (fast) {
    expect(Code::OK, false);
    formed_expected = m.up();
  } else {
    // Called back: the slot's nonce is drawn (once) and delivered.
    FUZZ_CHECK(called == index);
    const std::vector<std::string> nonces = F().fakes[index - 1]->Nonces();
    FUZZ_CHECK(!nonces.empty() && nonces.back().size() == kGroupKeyBytes);
    if (mm.nonce.empty()) mm.nonce = nonces.back();
    FUZZ_CHECK(nonces.back() == mm.nonce);
    const auto& account = accounts[index - 1];
    const v1::ConfirmMemberResponse& view = account.response;
    if (account.code != Code::OK) return expect(Code::ABORTED, true);
    if (!view.joining()) {
      expect(Code::PERMISSION_DENIED, true);
      FUZZ_CHECK(st.error_message().find("is not joining the group") != std::string::npos);
      return;
    }
    if (view.refused_code() != 0 || !SameNodes(view, m.nodes) || view.node_index() != index) {
      m.failed = true;
      return expect(Code::FAILED_PRECONDITION, true);
    }
    if (view.incarnation() != r.incarnation() ||
        view.ucx_worker_address() != r.ucx_worker_address() || !asked_same ||
        r.node_index() != index || r.refused_code() != 0) {
      expect(Code::PERMISSION_DENIED, true);
      FUZZ_CHECK(st.error_message().find("was not sent by it") != std::string::npos);
      return;
    }
    if (mm.joined && mm.incarnation != view.incarnation()) {  // it restarted
      m.failed = true;
      return expect(Code::FAILED_PRECONDITION, true);
    }
    expect(Code::OK, true);
    if (!mm.joined) {
      mm.joined = true;
      mm.incarnation = view.incarnation();
      mm.ucx = view.ucx_worker_address();
    }
    formed_expected = r.nonce() == mm.nonce && m.up();
  }
  FUZZ_CHECK(resp.formed() == formed_expected);
  if (!resp.formed()) {
    FUZZ_CHECK(resp.members_size() == 0 && resp.group_key().empty());
    return;
  }
  // Membership only with the nonce that went to the member's address.
  FUZZ_CHECK(r.nonce() == mm.nonce && !mm.nonce.empty());
  FUZZ_CHECK(resp.members_size() == static_cast<int>(m.nodes.size()));
  for (int i = 0; i < resp.members_size(); ++i) {
    const v1::GroupMember& out = resp.members(i);
    FUZZ_CHECK(out.address() == m.nodes[i]);
    FUZZ_CHECK(out.ucx_worker_address() == F().own_ucx());
    FUZZ_CHECK(out.incarnation() ==
               (i == 0 ? F().cluster.incarnation() : m.members[i].incarnation));
  }
  FUZZ_CHECK(resp.group_key().size() == kGroupKeyBytes && resp.group_uid() != 0);
  if (m.key.empty()) {
    m.key = resp.group_key();
    m.uid = resp.group_uid();
  }
  FUZZ_CHECK(resp.group_key() == m.key && resp.group_uid() == m.uid);
}

void FuzzRoot(FuzzedDataProvider& in) {
  const int n = in.ConsumeBool() ? 3 : 2;
  const std::string group = absl::StrCat("j", F().groups++);
  RootModel m;
  m.nodes = {kSelf, F().fakes[0]->address()};
  if (n == 3) m.nodes.push_back(F().fakes[1]->address());
  m.members.resize(n);
  for (auto& f : F().fakes) f->Reset();
  // The members' incarnations: a small set, so that runs see restarts.
  std::vector<uint64_t> incarnation(n);
  std::vector<FakePeer::Answer<v1::ConfirmMemberResponse>> accounts(2);
  for (int k = 1; k < n; ++k) {
    incarnation[k] = in.ConsumeIntegralInRange<uint64_t>(1, 4);
    accounts[k - 1].response = HonestAccount(m.nodes, k, incarnation[k]);
    F().fakes[k - 1]->SetAccount(accounts[k - 1]);
  }
  absl::StatusOr<std::vector<int32_t>> ids = F().cluster.AcquireGroup(group, m.nodes, 0, 1);
  FUZZ_CHECK(ids.ok());
  const int steps = in.ConsumeIntegralInRange<int>(1, 4);
  for (int step = 0; step < steps && in.remaining_bytes() > 0; ++step) {
    if (in.ConsumeIntegralInRange<int>(0, 3) == 0) {  // a member's account changes
      const int k = in.ConsumeIntegralInRange<int>(1, n - 1);
      if (in.ConsumeBool()) incarnation[k] = in.ConsumeIntegralInRange<uint64_t>(1, 4);
      accounts[k - 1] = SomeAccount(in, m.nodes, k, incarnation[k]);
      F().fakes[k - 1]->SetAccount(accounts[k - 1]);
    }
    // What member k sends, honestly, then edited.
    const int k = in.ConsumeIntegralInRange<int>(1, n - 1);
    v1::JoinGroupRequest r;
    r.set_group(group);
    std::vector<std::string> nodes = m.nodes;
    r.set_node_index(k);
    r.set_incarnation(incarnation[k]);
    r.set_ucx_worker_address(F().own_ucx());
    r.set_version("fuzz");
    switch (in.ConsumeIntegralInRange<int>(0, 4)) {
      case 0: break;  // no nonce (a first JoinGroup)
      case 1: {       // another member's nonce, or a stale one
        const std::vector<std::string> theirs = F().fakes[in.ConsumeBool() ? 0 : 1]->Nonces();
        if (!theirs.empty()) r.set_nonce(theirs[in.ConsumeIntegralInRange<size_t>(0, theirs.size() - 1)]);
        break;
      }
      case 2: r.set_nonce(Bytes(in, 70)); break;
      default: {  // its own: what the root delivered to its address
        const std::vector<std::string> mine = F().fakes[k - 1]->Nonces();
        if (!mine.empty()) r.set_nonce(mine.back());
        break;
      }
    }
    const int edits = in.ConsumeIntegralInRange<int>(0, 3) == 0 ? in.ConsumeIntegralInRange<int>(1, 3) : 0;
    bool address_set = false;
    for (int e = 0; e < edits; ++e) {
      switch (in.ConsumeIntegralInRange<int>(0, 8)) {
        case 0: r.set_incarnation(in.ConsumeIntegralInRange<uint64_t>(0, 4)); break;
        case 1: r.set_ucx_worker_address(SomeUcx(in)); break;
        case 2: MutateNodes(in, &nodes); break;
        case 3: r.set_node_index(in.ConsumeIntegralInRange<int32_t>(-1, 3)); break;
        case 4:
          r.set_refused_code(in.ConsumeIntegralInRange<int32_t>(-1, 17));
          r.set_refused_message(Bytes(in, 32));
          break;
        case 5: r.set_version(Bytes(in, 8)); break;
        case 6: r.set_group(absl::StrCat("x", group)); break;
        case 7: r.set_address(SomeAddress(in)); address_set = true; break;
        default:  // empty, too long, or a name never used here
          r.set_group(in.ConsumeBool() ? "" : absl::StrCat("y", Bytes(in, 140)));
          break;
      }
    }
    for (const std::string& a : nodes) r.add_nodes(a);
    if (!address_set) {
      const int i = r.node_index();
      r.set_address(i >= 0 && i < r.nodes_size() ? r.nodes(i) : "");
    }
    RootStep(m, group, r, accounts);
  }
  F().cluster.ReleaseCallPeers(*ids);
  F().cluster.ReleaseGroup(group);
}

// ---------------------------------------------------------------------------
// A member's side.

v1::JoinGroupResponse HonestFormed(const std::vector<std::string>& nodes, int self,
                                   const std::vector<uint64_t>& incarnation) {
  v1::JoinGroupResponse r;
  r.set_formed(true);
  r.set_group_uid(77);
  r.set_group_key(std::string(kGroupKeyBytes, 'k'));
  for (size_t i = 0; i < nodes.size(); ++i) {
    v1::GroupMember* m = r.add_members();
    m->set_address(nodes[i]);
    m->set_incarnation(static_cast<int>(i) == self ? F().cluster.incarnation() : incarnation[i]);
    m->set_ucx_worker_address(F().own_ucx());
  }
  return r;
}

// ValidateJoinGroupResponse's contract.
bool ValidFormed(const v1::JoinGroupResponse& r, const std::vector<std::string>& nodes) {
  if (r.members_size() != static_cast<int>(nodes.size())) return false;
  for (int i = 0; i < r.members_size(); ++i) {
    const v1::GroupMember& m = r.members(i);
    if (m.address() != nodes[i] || m.incarnation() == 0 ||
        !fuzz::ValidUcx(*F().worker, m.ucx_worker_address())) {
      return false;
    }
  }
  return r.group_uid() != 0 && r.group_key().size() == kGroupKeyBytes;
}

void FuzzMember(FuzzedDataProvider& in) {
  const int n = in.ConsumeBool() ? 3 : 2;
  const int self = n == 3 && in.ConsumeBool() ? 2 : 1;
  const std::string group = absl::StrCat("m", F().groups++);
  FakePeer& root = *F().fakes[0];
  std::vector<std::string> nodes = {root.address()};
  if (n == 3) nodes.push_back(F().fakes[1]->address());
  nodes.insert(nodes.begin() + self, kSelf);
  for (auto& f : F().fakes) f->Reset();
  absl::StatusOr<std::vector<int32_t>> ids = F().cluster.AcquireGroup(group, nodes, self, 1);
  FUZZ_CHECK(ids.ok());

  // ConfirmMembers: only the root's plants the nonce of the next JoinGroup.
  std::string planted;
  const int confirms = in.ConsumeIntegralInRange<int>(0, 3);
  for (int c = 0; c < confirms; ++c) {
    v1::ConfirmMemberRequest r;
    switch (in.ConsumeIntegralInRange<int>(0, 5)) {
      case 0: r.set_group(absl::StrCat("x", group)); break;
      case 1: r.set_group(absl::StrCat("y", Bytes(in, 140))); break;  // unknown, or too long
      case 2: r.set_group(""); break;
      default: r.set_group(group); break;
    }
    r.set_root(in.ConsumeIntegralInRange<int>(0, 2) != 0 ? root.address() : SomeAddress(in));
    r.set_root_incarnation(in.ConsumeIntegral<uint64_t>());
    r.set_nonce(in.ConsumeBool() ? std::string(kGroupKeyBytes, static_cast<char>('a' + c))
                                 : Bytes(in, 70));
    v1::ConfirmMemberResponse resp;
    grpc::ServerContext context;
    const grpc::Status st = F().service()->ConfirmMember(&context, &r, &resp);
    const bool valid = fuzz::ValidGroupName(r.group()) && fuzz::ValidAddress(r.root()) &&
                       !r.nonce().empty() && r.nonce().size() <= 64;
    if (!valid) {
      FUZZ_CHECK(st.error_code() == Code::INVALID_ARGUMENT);
      continue;
    }
    FUZZ_CHECK(st.ok());
    if (r.group() != group) {  // this node sent no JoinGroup for it
      FUZZ_CHECK(!resp.joining() && resp.nodes_size() == 0 && resp.incarnation() == 0);
      continue;
    }
    // This node's own account, whoever asks.
    FUZZ_CHECK(resp.joining() && resp.incarnation() == F().cluster.incarnation());
    FUZZ_CHECK(resp.ucx_worker_address() == F().own_ucx());
    FUZZ_CHECK(SameNodes(resp, nodes) && resp.node_index() == self && resp.refused_code() == 0);
    if (r.root() == root.address()) planted = r.nonce();
  }

  // FormGroup: one JoinGroup to the root, answered by the input.
  std::vector<uint64_t> incarnation(n);
  for (int i = 0; i < n; ++i) incarnation[i] = in.ConsumeIntegralInRange<uint64_t>(1, 4);
  FakePeer::Answer<v1::JoinGroupResponse> answer;
  answer.response = HonestFormed(nodes, self, incarnation);
  switch (in.ConsumeIntegralInRange<int>(0, 11)) {
    case 0: {
      static constexpr Code kCodes[] = {Code::FAILED_PRECONDITION, Code::INVALID_ARGUMENT,
                                        Code::UNAUTHENTICATED, Code::RESOURCE_EXHAUSTED,
                                        Code::PERMISSION_DENIED};
      answer.code = kCodes[in.ConsumeIntegralInRange<int>(0, 4)];
      break;
    }
    case 1: answer.response.mutable_members()->RemoveLast(); break;
    case 2: answer.response.add_members()->set_address(SomeAddress(in)); break;
    case 3:
      answer.response.mutable_members(in.ConsumeIntegralInRange<int>(0, n - 1))
          ->set_address(SomeAddress(in));
      break;
    case 4:
      answer.response.mutable_members(in.ConsumeIntegralInRange<int>(0, n - 1))
          ->set_incarnation(in.ConsumeIntegralInRange<uint64_t>(0, 2));
      break;
    case 5:
      answer.response.mutable_members(in.ConsumeIntegralInRange<int>(0, n - 1))
          ->set_ucx_worker_address(SomeUcx(in));
      break;
    case 6: answer.response.set_group_uid(in.ConsumeIntegralInRange<uint64_t>(0, 1)); break;
    case 7: answer.response.set_group_key(Bytes(in, 20)); break;
    default: break;  // honest
  }
  std::vector<FakePeer::Answer<v1::JoinGroupResponse>> answers;
  // (Rare paths take the largest value: an input that ran out of bytes
  // reads zeros.)
  if (in.ConsumeIntegralInRange<int>(0, 31) == 31 && Slow().Take()) {
    // OK, not formed yet: the member asks again (after 10 ms, so rarely).
    answers.push_back({});
  }
  answers.push_back(answer);
  root.SetJoinAnswers(answers);
  const absl::Status formed = F().cluster.FormGroup(group, absl::Now() + absl::Seconds(10));
  const std::vector<v1::JoinGroupRequest> sent = root.Joins();
  FUZZ_CHECK(sent.size() == answers.size());
  for (const v1::JoinGroupRequest& j : sent) {
    // The member's claim, and the nonce the root (and only it) delivered.
    FUZZ_CHECK(j.group() == group && SameNodes(j, nodes) && j.node_index() == self);
    FUZZ_CHECK(j.address() == kSelf && j.incarnation() == F().cluster.incarnation());
    FUZZ_CHECK(j.ucx_worker_address() == F().own_ucx() && j.refused_code() == 0);
    FUZZ_CHECK(j.nonce() == planted);
  }
  Code expected = Code::OK;
  if (answer.code != Code::OK) {
    expected = answer.code;
  } else if (!ValidFormed(answer.response, nodes)) {
    expected = Code::INVALID_ARGUMENT;
  }
  if (static_cast<Code>(formed.code()) != expected) {
    std::fprintf(stderr, "FormGroup: %s; expected code %d for %s\n", formed.ToString().c_str(),
                 expected, answer.response.ShortDebugString().c_str());
  }
  FUZZ_CHECK(static_cast<Code>(formed.code()) == expected);
  // UP, or FAILED: either way settled, without another JoinGroup.
  const absl::Status again = F().cluster.FormGroup(group, absl::Now() + absl::Seconds(10));
  FUZZ_CHECK(root.Joins().size() == sent.size());
  FUZZ_CHECK(formed.ok() ? again.ok() : again.code() == absl::StatusCode::kFailedPrecondition);
  F().cluster.ReleaseCallPeers(*ids);
  F().cluster.ReleaseGroup(group);
}

// ---------------------------------------------------------------------------
// Raw bytes.

void FuzzRaw(const uint8_t* data, size_t size) {
  // A live root group whose members answer honestly, and a member group.
  const std::string group = absl::StrCat("r", F().groups++);
  const std::vector<std::string> nodes = {kSelf, F().fakes[0]->address(),
                                          F().fakes[1]->address()};
  for (int k = 1; k <= 2; ++k) {
    F().fakes[k - 1]->Reset();
    FakePeer::Answer<v1::ConfirmMemberResponse> a;
    a.response = HonestAccount(nodes, k, 1);
    F().fakes[k - 1]->SetAccount(a);
  }
  absl::StatusOr<std::vector<int32_t>> ids = F().cluster.AcquireGroup(group, nodes, 0, 1);
  FUZZ_CHECK(ids.ok());
  v1::JoinGroupRequest r;
  if (r.ParseFromArray(data, static_cast<int>(size))) {
    if (r.group() == "r") r.set_group(group);  // a seed's way to name the live group
    v1::JoinGroupResponse resp;
    grpc::ServerContext context;
    const grpc::Status st = F().service()->JoinGroup(&context, &r, &resp);
    const Code c = st.error_code();
    FUZZ_CHECK(c == Code::OK || c == Code::INVALID_ARGUMENT || c == Code::PERMISSION_DENIED ||
               c == Code::FAILED_PRECONDITION || c == Code::ABORTED);
    // No nonce was ever delivered to the sender of these bytes.
    FUZZ_CHECK(!resp.formed());
    if (!fuzz::ValidJoinGroupRequest(r, *F().worker)) FUZZ_CHECK(c == Code::INVALID_ARGUMENT);
  }
  F().cluster.ReleaseCallPeers(*ids);
  F().cluster.ReleaseGroup(group);

  v1::ConfirmMemberRequest confirm;
  if (confirm.ParseFromArray(data, static_cast<int>(size))) {
    v1::ConfirmMemberResponse resp;
    grpc::ServerContext context;
    const grpc::Status st = F().service()->ConfirmMember(&context, &confirm, &resp);
    FUZZ_CHECK(st.ok() || st.error_code() == Code::INVALID_ARGUMENT);
    // This node holds no group of that name (all released): not joining.
    if (st.ok()) FUZZ_CHECK(!resp.joining() || confirm.group().rfind("j", 0) == 0 ||
                            confirm.group().rfind("m", 0) == 0 || confirm.group().rfind("r", 0) == 0);
  }
}

}  // namespace
}  // namespace hsap::cluster

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  setenv("GRPC_VERBOSITY", "NONE", 1);
  hsap::cluster::F();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static hsap::fuzz::ModeCounts& counts =
      *new hsap::fuzz::ModeCounts("group_join_fuzzer", {"root", "member", "raw"});
  if (size == 0) return 0;
  hsap::cluster::Slow().Tick();
  FuzzedDataProvider in(data + 1, size - 1);
  switch (data[0] & 3) {
    case 0:
    case 1: counts.Add(0), hsap::cluster::FuzzRoot(in); break;
    case 2: counts.Add(1), hsap::cluster::FuzzMember(in); break;
    default: counts.Add(2), hsap::cluster::FuzzRaw(data + 1, size - 1); break;
  }
  return 0;
}
