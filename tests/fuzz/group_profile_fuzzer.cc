// Fuzzes Peer.GroupProfile (server/cluster/cluster_profiles.cc): the
// measured cost profile a group's root settles and its members ask for. The
// Cluster under test is started (no static peers, a UCX worker on transport
// "self", --insecure_peers, a fixed local profile) and its handler is
// called as the gRPC server would call it; the other nodes are FakePeers
// (fake_peer.h) on loopback: they answer the root's ConfirmMember (so
// groups form through the real JoinGroup path), its link probes
// (Peer.ProbeLink, failing when the input says), and, as a root, this
// node's GroupProfile with what the input says.
//
// First byte (mod 4):
//  0, 1  root: a group [this node, 1 or 2 fakes], formed (or left forming;
//        one group serves up to 512 inputs, or until 48 profiles settled in
//        it or an input asks for a new one, whose members may restart);
//        up to 4 GroupProfile requests naming the group or another, any
//        dtype and head dim, from a member, a non-member, this node or a
//        bad address, with the right incarnation and key or not, while
//        link probes fail at a chosen call; or 65 (dtype, head dim) pairs
//        from a member, past the per-group bound;
//  2     member: this node is node 1 of a group whose root is a fake that
//        answers GroupProfile with a valid profile string, a mutated one,
//        ASCII garbage, 1 KiB+, a refusal, or "not ready" first;
//  3     raw wire bytes as a GroupProfileRequest to the root of the live
//        group, and as a profile string (ParseHardwareProfile).
// A new group, a failing probe (the link is then measured again: 13 MiB of
// probes), the 65-pair runs and a root's "not ready" are taken at most once
// per 64 inputs (fuzz_util.h, Budget).
//
// Properties (docs/reliability.md, "Fuzzing"): codes against a model of
// the contract: INVALID_ARGUMENT for a head dim outside [1, 4096], a dtype
// that is not fp32/bf16/fp16, a bad group or address; PERMISSION_DENIED
// unless the sender is a member with the group's key (and incarnation);
// ready=false while the group is unknown here or forming; FAILED_PRECONDITION
// for an undeclared group without a static cluster or a failed local
// profile; UNAVAILABLE naming the member when a link probe fails, and no
// profile settled then; RESOURCE_EXHAUSTED past 64 profiles per group.
// A profile, once answered, is the answer for that (dtype, head dim) for
// the group's life; it parses, carries the local compute figures, and a
// link is probed once per member incarnation (no ProbeLink otherwise). A
// member accepts a root's answer iff it is a parametric profile of at most
// 1,024 bytes that parses (else INVALID_ARGUMENT naming the root), keeps
// it, and asks no more; a root's refusal comes back with its code. Any
// string that parses re-prints (CustomProfileString) to one that parses to
// the same figures. No crash, leak or sanitizer report.
#include <grpcpp/server_context.h>

#include <cmath>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "google/protobuf/stubs/logging.h"
#include "hsap/v1/peer.pb.h"
#include "server/cluster/cluster.h"
#include "server/cluster/peer_service.h"
#include "server/plan/cost_model.h"
#include "server/plan/plan_proto.h"
#include "server/transport/ucx_worker.h"
#include "tests/fuzz/fake_peer.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/fuzz/peer_model.h"

namespace hsap::cluster {
namespace {

using fuzz::FakePeer;
using Code = grpc::StatusCode;

constexpr char kSelf[] = "127.0.0.1:7";
// The local profile fails for these head dims (a measurement that failed).
bool LocalFails(int32_t head_dim) { return head_dim % 61 == 0; }

plan::HardwareProfile LocalProfile() {
  plan::HardwareProfile p;
  p.attention_flops = 6.25e9;
  p.intra_bytes_per_s = 2e9;
  p.intra_latency_s = 3e-5;
  p.inter_bytes_per_s = 1e6;  // replaced by the probed links
  p.backward_factor = 2.5;
  return p;
}

struct Fixture {
  std::unique_ptr<transport::UcxWorker> worker;
  std::unique_ptr<FakePeer> fakes[2];
  uint64_t incarnation[2] = {1, 1};  // each fake's current one
  // What the Cluster knows of each fake across inputs: the incarnation it
  // last learned (0: none), and the one whose link it measured (0: none).
  uint64_t learned[2] = {0, 0};
  uint64_t measured[2] = {0, 0};
  Cluster cluster;
  uint64_t groups = 0;
  Fixture() {
    auto w = transport::UcxWorker::Create({.transports = "self"});
    FUZZ_CHECK(w.ok());
    worker = std::move(w).value();
    for (auto& f : fakes) f = FakePeer::Start();
    cluster.SetLocalProfile([](DType, int32_t head_dim) -> absl::StatusOr<plan::HardwareProfile> {
      if (LocalFails(head_dim)) return absl::FailedPreconditionError("fuzz: no local rate");
      return LocalProfile();
    });
    ClusterOptions o;
    o.advertise_address = kSelf;
    o.insecure_peers = true;
    o.version = "fuzz";
    o.rpc_timeout = absl::Milliseconds(500);
    o.suspect_after = absl::Hours(10000);
    o.down_after = absl::Hours(20000);
    o.peer_linger = absl::Hours(20000);
    FUZZ_CHECK(cluster.Start(o, worker.get()).ok());
  }
  PeerServiceImpl* service() { return static_cast<PeerServiceImpl*>(cluster.service()); }
};

Fixture& F() {
  static Fixture* f = new Fixture;
  return *f;
}

// Expensive paths (a new group, a re-measured link, 65 calls, a 10 ms
// wait): at most one per 64 inputs (fuzz_util.h).
fuzz::Budget& Slow() {
  static fuzz::Budget* b = new fuzz::Budget(64);
  return *b;
}

std::string Ascii(FuzzedDataProvider& in, size_t max) {
  std::string s = in.ConsumeRandomLengthString(max);
  for (char& c : s) c = static_cast<char>(c & 0x7f);
  return s;
}

grpc::Status JoinGroup(const v1::JoinGroupRequest& r, v1::JoinGroupResponse* resp) {
  grpc::ServerContext context;
  return F().service()->JoinGroup(&context, &r, resp);
}

// A group at this node (the root) with fakes 0 (and 1) as members; when
// `form`, both join honestly (called back, then with the delivered nonce)
// and the group's key is returned; else it stays FORMING ("").
std::string RootGroup(const std::string& group, const std::vector<std::string>& nodes, bool form,
                      std::vector<int32_t>* ids) {
  const int n = static_cast<int>(nodes.size());
  for (int k = 1; k < n; ++k) {
    FakePeer& f = *F().fakes[k - 1];
    f.Reset();
    FakePeer::Answer<v1::ConfirmMemberResponse> a;
    a.response.set_joining(true);
    a.response.set_incarnation(F().incarnation[k - 1]);
    a.response.set_ucx_worker_address(F().worker->Address());
    for (const std::string& node : nodes) a.response.add_nodes(node);
    a.response.set_node_index(k);
    f.SetAccount(a);
  }
  absl::StatusOr<std::vector<int32_t>> acquired = F().cluster.AcquireGroup(group, nodes, 0, 1);
  FUZZ_CHECK(acquired.ok());
  *ids = *acquired;
  if (!form) return "";
  std::string key;
  for (int k = 1; k < n; ++k) {
    v1::JoinGroupRequest r;
    r.set_group(group);
    for (const std::string& node : nodes) r.add_nodes(node);
    r.set_node_index(k);
    r.set_address(nodes[k]);
    r.set_incarnation(F().incarnation[k - 1]);
    r.set_ucx_worker_address(F().worker->Address());
    r.set_version("fuzz");
    v1::JoinGroupResponse resp;
    FUZZ_CHECK(JoinGroup(r, &resp).ok());  // called back: joined
    F().learned[k - 1] = F().incarnation[k - 1];
    r.set_nonce(F().fakes[k - 1]->Nonces().back());
    resp.Clear();
    FUZZ_CHECK(JoinGroup(r, &resp).ok());
    FUZZ_CHECK(resp.formed() == (k == n - 1));
    if (resp.formed()) key = resp.group_key();
  }
  FUZZ_CHECK(key.size() == kGroupKeyBytes);
  return key;
}

// The fields a valid parametric profile from this root carries.
void CheckSettled(const std::string& profile) {
  FUZZ_CHECK(absl::StartsWith(profile, plan::kCustomProfilePrefix) && profile.size() <= 1024);
  const absl::StatusOr<plan::HardwareProfile> p = plan::ParseHardwareProfile(profile);
  FUZZ_CHECK(p.ok());
  const plan::HardwareProfile local = LocalProfile();
  FUZZ_CHECK(p->attention_flops == local.attention_flops);
  FUZZ_CHECK(p->intra_bytes_per_s == local.intra_bytes_per_s);
  FUZZ_CHECK(p->backward_factor == local.backward_factor);
  FUZZ_CHECK(p->inter_bytes_per_s >= 1 && p->inter_bytes_per_s <= 1e15);
  FUZZ_CHECK(p->inter_latency_s >= 0 && p->inter_latency_s <= 1e3);
}

v1::DType SomeDType(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange<int>(0, 5)) {
    case 0: return v1::DTYPE_FLOAT32;
    case 1: return v1::DTYPE_FLOAT16;
    case 2: return static_cast<v1::DType>(in.ConsumeIntegralInRange<int>(-2, 9));
    default: return v1::DTYPE_BFLOAT16;
  }
}

int32_t SomeHeadDim(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange<int>(0, 5)) {
    case 0: return in.ConsumeIntegral<int32_t>();
    case 1: return 61 * in.ConsumeIntegralInRange<int32_t>(1, 3);  // the local profile fails
    case 2: return in.ConsumeBool() ? 4096 : 4097;
    default: return 64 << in.ConsumeIntegralInRange<int>(0, 2);
  }
}

// Who the root knows at an address (Cluster::SenderPeer), for the model.
enum class Sender { kMember0, kMember1, kNone };

// The root's group the root-side inputs ask about. Forming one takes the
// root's call backs to its members (a millisecond each under ASan), so a
// group serves many inputs: a new one when an input asks for it (or its
// members restart), after 512 inputs, or once 48 profiles settled in it.
struct LiveGroup {
  std::string group;
  int n = 0;
  bool form = false;
  std::string key;
  std::vector<int32_t> ids;
  std::vector<std::string> nodes;
  std::map<std::pair<int, int32_t>, std::string> settled;  // its answers so far
  int inputs = 0;
};

LiveGroup& Live() {
  static LiveGroup* g = new LiveGroup;
  return *g;
}

void ReleaseLive() {
  LiveGroup& g = Live();
  if (g.group.empty()) return;
  F().cluster.ReleaseCallPeers(g.ids);
  F().cluster.ReleaseGroup(g.group);
  g = LiveGroup{};
}

// (Rare, slow paths take an integer's largest value: an input that ran
// out reads zeros.)
void FuzzRoot(FuzzedDataProvider& in) {
  LiveGroup& live = Live();
  const bool renew = in.ConsumeIntegralInRange<int>(0, 63) == 63 && Slow().Take();
  if (live.group.empty() || renew || live.inputs >= 512 || live.settled.size() >= 48) {
    ReleaseLive();
    live.n = in.ConsumeBool() ? 3 : 2;
    // A member that restarted since the last group: it is probed again.
    for (int k = 1; k < live.n; ++k) {
      if (renew && in.ConsumeBool()) ++F().incarnation[k - 1];
    }
    live.form = in.ConsumeIntegralInRange<int>(0, 7) != 7;
    live.group = absl::StrCat("p", F().groups++);
    live.nodes = {kSelf, F().fakes[0]->address()};
    if (live.n == 3) live.nodes.push_back(F().fakes[1]->address());
    live.key = RootGroup(live.group, live.nodes, live.form, &live.ids);
  }
  ++live.inputs;
  const int n = live.n;
  const bool form = live.form;
  const std::string& group = live.group;
  const std::vector<std::string>& nodes = live.nodes;
  const std::string& key = live.key;
  std::map<std::pair<int, int32_t>, std::string>& settled = live.settled;
  auto member_request = [&](int k, v1::DType dtype, int32_t head_dim) {
    v1::GroupProfileRequest r;
    r.set_group(group);
    r.set_declared(true);
    r.set_dtype(dtype);
    r.set_head_dim(head_dim);
    r.set_address(nodes[k]);
    r.set_incarnation(F().incarnation[k - 1]);
    r.set_group_key(key);
    return r;
  };
  // One request and its answer against the model.
  auto step = [&](const v1::GroupProfileRequest& r, std::vector<int> fail_at) {
    for (int i = 0; i < 2; ++i) {
      std::vector<grpc::StatusCode> codes;
      if (fail_at[i] >= 0) {
        codes.assign(static_cast<size_t>(fail_at[i]), Code::OK);
        static constexpr Code kFail[] = {Code::INTERNAL, Code::PERMISSION_DENIED,
                                         Code::RESOURCE_EXHAUSTED, Code::UNIMPLEMENTED};
        codes.push_back(kFail[fail_at[i] % 4]);
      }
      F().fakes[i]->SetProbeCodes(codes);
    }
    const int probes_before[2] = {F().fakes[0]->probes(), F().fakes[1]->probes()};
    v1::GroupProfileResponse resp;
    grpc::ServerContext context;
    const grpc::Status st = F().service()->GroupProfile(&context, &r, &resp);
    int probed[2];
    for (int i = 0; i < 2; ++i) probed[i] = F().fakes[i]->probes() - probes_before[i];
    auto expect = [&](Code code) {
      if (st.error_code() != code) {
        std::fprintf(stderr, "GroupProfile %s: got %d (%s); expected %d\n",
                     r.ShortDebugString().c_str(), st.error_code(), st.error_message().c_str(),
                     code);
      }
      FUZZ_CHECK(st.error_code() == code);
      if (code != Code::OK || !resp.ready()) FUZZ_CHECK(!resp.ready() && resp.profile().empty());
    };
    auto no_probes = [&] { FUZZ_CHECK(probed[0] == 0 && probed[1] == 0); };
    if (r.head_dim() < 1 || r.head_dim() > 4096) return expect(Code::INVALID_ARGUMENT), no_probes();
    if (r.dtype() != v1::DTYPE_FLOAT32 && r.dtype() != v1::DTYPE_BFLOAT16 &&
        r.dtype() != v1::DTYPE_FLOAT16) {
      return expect(Code::INVALID_ARGUMENT), no_probes();
    }
    if (!fuzz::ValidGroupName(r.group())) return expect(Code::INVALID_ARGUMENT), no_probes();
    Sender sender = Sender::kNone;
    if (!r.address().empty()) {
      if (!fuzz::ValidAddress(r.address())) return expect(Code::INVALID_ARGUMENT), no_probes();
      for (int i = 0; i < 2; ++i) {
        if (r.address() == F().fakes[i]->address() &&
            (F().learned[i] == 0 || F().learned[i] == r.incarnation())) {
          sender = i == 0 ? Sender::kMember0 : Sender::kMember1;
        }
      }
    } else {
      return expect(Code::INVALID_ARGUMENT), no_probes();  // no static cluster: no node_rank
    }
    if (!r.declared()) return expect(Code::FAILED_PRECONDITION), no_probes();
    if (r.group() != group) return expect(Code::OK), no_probes();  // not here yet: ask again
    const bool member = sender == Sender::kMember0 || (sender == Sender::kMember1 && n == 3);
    if (!member) return expect(Code::PERMISSION_DENIED), no_probes();
    if (!form) return expect(Code::OK), no_probes();  // forming here: not yet
    if (r.group_key() != key) return expect(Code::PERMISSION_DENIED), no_probes();
    const std::pair<int, int32_t> pair{r.dtype(), r.head_dim()};
    auto known = settled.find(pair);
    if (known != settled.end()) {
      expect(Code::OK);
      no_probes();
      FUZZ_CHECK(resp.ready() && resp.profile() == known->second);
      return;
    }
    if (settled.size() >= static_cast<size_t>(Cluster::kMaxGroupProfiles)) {
      return expect(Code::RESOURCE_EXHAUSTED), no_probes();
    }
    if (LocalFails(r.head_dim())) return expect(Code::FAILED_PRECONDITION), no_probes();
    // The members' links, in group order, each measured once per incarnation.
    for (int k = 1; k < n; ++k) {
      const int i = k - 1;
      if (F().measured[i] == F().learned[i]) {
        FUZZ_CHECK(probed[i] == 0);
        continue;
      }
      if (fail_at[i] >= 0) {
        // The probe fails: UNAVAILABLE naming the member; nothing settles.
        FUZZ_CHECK(probed[i] == fail_at[i] + 1);
        expect(Code::UNAVAILABLE);
        FUZZ_CHECK(st.error_message().find(F().fakes[i]->address()) != std::string::npos);
        for (int j = k + 1; j < n; ++j) FUZZ_CHECK(probed[j - 1] == 0);
        return;
      }
      // 7 empty round trips, 1 to 4 growing payloads, 3 at the last size.
      FUZZ_CHECK(probed[i] >= 11 && probed[i] <= 14);
      F().measured[i] = F().learned[i];
    }
    expect(Code::OK);
    FUZZ_CHECK(resp.ready());
    CheckSettled(resp.profile());
    settled[pair] = resp.profile();
  };

  if (in.ConsumeIntegralInRange<int>(0, 15) == 15 && form && Slow().Take()) {
    // Past the bound: 65 distinct pairs from a member (the group is
    // replaced at the next input).
    for (int32_t d = 1; d <= Cluster::kMaxGroupProfiles + 1; ++d) {
      step(member_request(1, v1::DTYPE_FLOAT16, d == 61 ? 4000 : 4000 + d), {-1, -1});
    }
    FUZZ_CHECK(settled.size() == static_cast<size_t>(Cluster::kMaxGroupProfiles));
  }
  const int requests = in.ConsumeIntegralInRange<int>(1, 4);
  for (int q = 0; q < requests && in.remaining_bytes() > 0; ++q) {
    const int k = in.ConsumeIntegralInRange<int>(1, n - 1);
    v1::GroupProfileRequest r = member_request(k, SomeDType(in), SomeHeadDim(in));
    const int edits = in.ConsumeIntegralInRange<int>(0, 2) == 0 ? in.ConsumeIntegralInRange<int>(1, 3) : 0;
    for (int e = 0; e < edits; ++e) {
      switch (in.ConsumeIntegralInRange<int>(0, 8)) {
        case 0: r.set_group(absl::StrCat("x", group)); break;
        case 1: r.set_group(in.ConsumeBool() ? "" : std::string(129, 'g')); break;
        case 2: r.set_declared(false); break;
        case 3: r.set_group_key(in.ConsumeRandomLengthString(20)); break;
        case 4: r.set_incarnation(in.ConsumeIntegralInRange<uint64_t>(0, 3)); break;
        case 5: r.set_address(kSelf); break;
        case 6: r.set_address(in.ConsumeBool() ? "10.0.0.9:7070" : Ascii(in, 12)); break;
        case 7: r.set_address(F().fakes[in.ConsumeBool() ? 0 : 1]->address()); break;
        default: r.set_node_rank(in.ConsumeIntegral<int32_t>()); r.clear_address(); break;
      }
    }
    // A failed probe leaves the link to be measured again (13 MiB of
    // probes): an expensive path.
    std::vector<int> fail_at = {-1, -1};
    const bool fail = in.ConsumeIntegralInRange<int>(0, 7) == 7;
    const int who = in.ConsumeIntegralInRange<int>(0, 1);
    const int at = in.ConsumeIntegralInRange<int>(0, 10);
    if (fail && Slow().Take()) fail_at[who] = at;
    step(r, fail_at);
  }
}

// ---------------------------------------------------------------------------
// A member asking a root.

std::string SomeRootAnswer(FuzzedDataProvider& in) {
  plan::HardwareProfile p;
  p.attention_flops = std::ldexp(1.0, in.ConsumeIntegralInRange<int>(0, 70));
  p.intra_bytes_per_s = std::ldexp(1.0, in.ConsumeIntegralInRange<int>(0, 49));
  p.inter_bytes_per_s = in.ConsumeFloatingPointInRange<double>(1, 1e15);
  p.inter_latency_s = in.ConsumeFloatingPointInRange<double>(0, 1e3);
  p.intra_latency_s = in.ConsumeProbability<double>();
  p.backward_factor = in.ConsumeFloatingPointInRange<double>(1e-3, 100);
  p.kv_interleave_factor = in.ConsumeBool() ? 1.0 : in.ConsumeFloatingPointInRange<double>(1e-3, 1);
  p.inter_link_ranks = in.ConsumeIntegralInRange<int>(1, 1024);
  std::string s = plan::CustomProfileString(p);
  switch (in.ConsumeIntegralInRange<int>(0, 7)) {
    case 0: return Ascii(in, 80);
    case 1: return s + std::string(1024, '0');
    case 2: {  // an edit
      const size_t at = in.ConsumeIntegralInRange<size_t>(0, s.size());
      s.replace(at, in.ConsumeIntegralInRange<size_t>(0, 4), Ascii(in, 6));
      return s;
    }
    case 3: return absl::StrCat(s, ",", Ascii(in, 12));
    default: return s;
  }
}

void FuzzMember(FuzzedDataProvider& in) {
  FakePeer& root = *F().fakes[0];
  root.Reset();
  const std::string group = absl::StrCat("q", F().groups++);
  const std::vector<std::string> nodes = {root.address(), kSelf};
  absl::StatusOr<std::vector<int32_t>> ids = F().cluster.AcquireGroup(group, nodes, 1, 1);
  FUZZ_CHECK(ids.ok());
  const bool bulk = in.ConsumeIntegralInRange<int>(0, 15) == 15 && Slow().Take();
  const int asks = bulk ? Cluster::kMaxGroupProfiles + 1 : in.ConsumeIntegralInRange<int>(1, 3);
  int accepted = 0;
  std::map<std::pair<int, int32_t>, std::string> kept;
  for (int a = 0; a < asks && in.remaining_bytes() > 0; ++a) {
    const DType dtype = in.ConsumeBool() ? DType::kBFloat16 : DType::kFloat32;
    const int32_t head_dim = bulk ? a + 1 : in.ConsumeIntegralInRange<int32_t>(1, 256);
    FakePeer::Answer<v1::GroupProfileResponse> answer;
    answer.response.set_ready(true);
    answer.response.set_profile(SomeRootAnswer(in));
    if (in.ConsumeIntegralInRange<int>(0, 7) == 7) {
      static constexpr Code kCodes[] = {Code::FAILED_PRECONDITION, Code::PERMISSION_DENIED,
                                        Code::INVALID_ARGUMENT, Code::INTERNAL,
                                        Code::RESOURCE_EXHAUSTED};
      answer.code = kCodes[in.ConsumeIntegralInRange<int>(0, 4)];
    }
    std::vector<FakePeer::Answer<v1::GroupProfileResponse>> answers;
    if (in.ConsumeIntegralInRange<int>(0, 31) == 31 && Slow().Take()) {
      answers.push_back({});  // not ready, once: 10 ms
    }
    answers.push_back(answer);
    root.SetProfileAnswers(answers);
    const size_t asked_before = root.ProfileRequests().size();
    const absl::StatusOr<std::string> got = F().cluster.GroupProfile(
        group, true, dtype, head_dim, absl::Now() + absl::Seconds(10));
    const std::vector<v1::GroupProfileRequest> sent = root.ProfileRequests();
    const auto pair = std::make_pair(static_cast<int>(dtype), head_dim);
    auto was = kept.find(pair);
    if (was != kept.end()) {  // settled before: no RPC, the same answer
      FUZZ_CHECK(sent.size() == asked_before && got.ok() && *got == was->second);
      continue;
    }
    FUZZ_CHECK(sent.size() == asked_before + answers.size());
    for (size_t i = asked_before; i < sent.size(); ++i) {
      const v1::GroupProfileRequest& r = sent[i];
      FUZZ_CHECK(r.group() == group && r.declared() && r.head_dim() == head_dim);
      FUZZ_CHECK(r.dtype() == plan::DTypeToProto(dtype) && r.address() == kSelf);
      FUZZ_CHECK(r.incarnation() == F().cluster.incarnation() && r.group_key().empty());
    }
    const std::string& profile = answer.response.profile();
    Code expected = Code::OK;
    if (answer.code != Code::OK) {
      expected = answer.code;
    } else if (profile.size() > 1024 || !absl::StartsWith(profile, plan::kCustomProfilePrefix) ||
               !plan::ParseHardwareProfile(profile).ok()) {
      expected = Code::INVALID_ARGUMENT;
    } else if (accepted >= Cluster::kMaxGroupProfiles) {
      expected = Code::RESOURCE_EXHAUSTED;
    }
    if (static_cast<Code>(got.status().code()) != expected) {
      std::fprintf(stderr, "GroupProfile answer '%s' (code %d): got %s; expected %d\n",
                   profile.substr(0, 200).c_str(), answer.code, got.status().ToString().c_str(),
                   expected);
    }
    FUZZ_CHECK(static_cast<Code>(got.status().code()) == expected);
    if (expected == Code::INVALID_ARGUMENT) {
      FUZZ_CHECK(got.status().message().find(root.address()) != std::string::npos);
    }
    if (got.ok()) {
      FUZZ_CHECK(*got == profile);
      ++accepted;
      kept[pair] = profile;
      const std::optional<std::string> known =
          F().cluster.KnownGroupProfile(group, true, dtype, head_dim);
      FUZZ_CHECK(known.has_value() && *known == profile);
    } else {
      FUZZ_CHECK(!F().cluster.KnownGroupProfile(group, true, dtype, head_dim).has_value());
    }
  }
  F().cluster.ReleaseCallPeers(*ids);
  F().cluster.ReleaseGroup(group);
}

// ---------------------------------------------------------------------------
// Raw bytes.

void CheckRoundTrip(const std::string& text) {
  const absl::StatusOr<plan::HardwareProfile> p = plan::ParseHardwareProfile(text);
  if (!p.ok()) {
    FUZZ_CHECK(p.status().code() == absl::StatusCode::kInvalidArgument);
    return;
  }
  if (!absl::StartsWith(text, plan::kCustomProfilePrefix)) return;  // a named profile
  const std::string again = plan::CustomProfileString(*p);
  const absl::StatusOr<plan::HardwareProfile> q = plan::ParseHardwareProfile(again);
  if (!q.ok()) std::fprintf(stderr, "'%s' -> '%s': %s\n", text.c_str(), again.c_str(),
                            q.status().ToString().c_str());
  FUZZ_CHECK(q.ok());
  FUZZ_CHECK(q->attention_flops == p->attention_flops);
  FUZZ_CHECK(q->inter_bytes_per_s == p->inter_bytes_per_s);
  FUZZ_CHECK(q->intra_bytes_per_s == p->intra_bytes_per_s);
  FUZZ_CHECK(q->inter_latency_s == p->inter_latency_s);
  FUZZ_CHECK(q->intra_latency_s == p->intra_latency_s);
  FUZZ_CHECK(q->backward_factor == p->backward_factor);
  FUZZ_CHECK(q->kv_interleave_factor == p->kv_interleave_factor);
  FUZZ_CHECK(q->inter_link_ranks == p->inter_link_ranks);
  FUZZ_CHECK(plan::CustomProfileString(*q) == again);
}

void FuzzRaw(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  CheckRoundTrip(text);
  CheckRoundTrip(absl::StrCat(plan::kCustomProfilePrefix, text));
  v1::GroupProfileRequest r;
  if (!r.ParseFromArray(data, static_cast<int>(size))) return;
  LiveGroup& live = Live();
  if (live.group.empty()) {  // a formed one, for the root-side inputs too
    live.n = 2;
    live.form = true;
    live.group = absl::StrCat("p", F().groups++);
    live.nodes = {kSelf, F().fakes[0]->address()};
    live.key = RootGroup(live.group, live.nodes, true, &live.ids);
  }
  const std::string& key = live.key;
  if (r.group() == "p") r.set_group(live.group);  // a seed's way to name the live group
  F().fakes[0]->SetProbeCodes({});
  v1::GroupProfileResponse resp;
  grpc::ServerContext context;
  const grpc::Status st = F().service()->GroupProfile(&context, &r, &resp);
  const Code c = st.error_code();
  FUZZ_CHECK(c == Code::OK || c == Code::INVALID_ARGUMENT || c == Code::PERMISSION_DENIED ||
             c == Code::FAILED_PRECONDITION);
  // The group's key was never in these bytes.
  FUZZ_CHECK(!resp.ready() || r.group_key() == key);
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
      *new hsap::fuzz::ModeCounts("group_profile_fuzzer", {"root", "member", "raw"});
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
