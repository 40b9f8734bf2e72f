// Fuzzes the peer protocol (hsap.v1.Peer, server/cluster/): arbitrary
// JoinRequest / HeartbeatRequest / AgreePlanRequest / AbortCallRequest /
// JoinGroupRequest (first byte 12) bytes go to the handlers of a started 3-node Cluster (node 0; nodes 1 and
// 2 are unreachable addresses, so its heartbeat thread keeps timing them out
// concurrently) and of a Cluster never started, through the PeerServiceImpl
// the gRPC server would call. A first byte >= 13 instead runs a sequence of
// SetLocal / OnRemote on a PlanAgreement against a reference model.
//
// Properties: no crash or sanitizer report; a Join is accepted iff it names
// another node of this cluster with the same shape; status codes are the
// documented ones; a started cluster (--insecure_peers) answers AgreePlan
// and AbortCall iff they carry valid fields (INVALID_ARGUMENT otherwise)
// and come from another node of its static cluster, by node_rank or
// --peers address (PERMISSION_DENIED otherwise: it holds no run-time
// group); an unstarted one is UNAVAILABLE;
// PlanAgreement matches the model (keys, mismatch errors, eviction order).
//
// UCX worker addresses (issue 14: 8 bytes of 0xff aborted the daemon inside
// UCX): the started cluster has a real UCX worker (transport "self", so
// nothing leaves the process), so every Join's ucx_worker_address goes
// through the validator and, when accepted, to ucp_ep_create. First bytes
// 8-9 run Joins whose address is this worker's own with fuzzed bytes
// spliced in (structure-aware: the layout is mostly intact, so the
// validator's deeper rules are reached); 10-11 validate raw bytes against
// the layouts of real tcp and shared-memory workers: OK only for addresses
// that re-parse to a layout sharing a transport, and never a crash.
#include <deque>
#include <map>
#include <memory>
#include <string>

#include <grpcpp/server_context.h>

#include "google/protobuf/stubs/logging.h"
#include "hsap/v1/peer.pb.h"
#include "server/cluster/cluster.h"
#include "server/cluster/peer_service.h"
#include "server/cluster/peer_validation.h"
#include "server/cluster/plan_agreement.h"
#include "server/transport/ucx_address.h"
#include "server/transport/ucx_worker.h"
#include "tests/fuzz/fuzz_util.h"

namespace hsap::cluster {
namespace {

struct Fixture {
  std::unique_ptr<transport::UcxWorker> worker;  // before the clusters: outlives them
  std::vector<transport::UcxAddressLayout> layouts;  // of tcp and shm workers
  Cluster started;
  Cluster idle;
  Fixture() {
    auto w = transport::UcxWorker::Create({.transports = "self"});
    FUZZ_CHECK(w.ok());
    worker = std::move(w).value();
    for (const char* tls : {"tcp", "posix,sysv,cma,self"}) {
      auto other = transport::UcxWorker::Create({.transports = tls});
      FUZZ_CHECK(other.ok());
      auto layout = transport::ParseOwnUcxAddress((*other)->Address());
      FUZZ_CHECK(layout.ok());
      layouts.push_back(*layout);
    }
    ClusterOptions options;
    options.peers = {"127.0.0.1:9", "127.0.0.1:1", "127.0.0.1:2"};
    options.node_rank = 0;
    options.join_timeout = absl::Milliseconds(1);
    options.rpc_timeout = absl::Milliseconds(50);
    // No TLS, no token: the handlers are reached only with --insecure_peers
    // (UNAUTHENTICATED otherwise, which the TLS fuzzer covers).
    options.insecure_peers = true;
    // Not formed in 1 ms: DEADLINE_EXCEEDED, but started (it keeps trying).
    const absl::Status st = started.Start(options, worker.get());
    FUZZ_CHECK(st.code() == absl::StatusCode::kDeadlineExceeded);
    started.AddCallAbortCallback([](const std::string&, uint64_t, const absl::Status& reason) {
      FUZZ_CHECK(!reason.ok());
    });
  }
  PeerServiceImpl* Service(bool use_started) {
    return static_cast<PeerServiceImpl*>((use_started ? started : idle).service());
  }
};

Fixture& F() {
  static Fixture* f = new Fixture;  // never destroyed: its threads outlive inputs
  return *f;
}

template <typename Request>
bool Parse(const uint8_t* data, size_t size, Request* r) {
  return r->ParseFromArray(data, static_cast<int>(size));
}

bool Printable(const std::string& s) {
  for (char c : s) {
    if (c < 0x20 || c > 0x7e) return false;
  }
  return true;
}

// node_address.h's rule, modelled: <host>:<port>, no space, port 1..65535.
bool ValidAddress(const std::string& a) {
  if (a.size() < 3 || a.size() > 255) return false;
  for (char c : a) {
    if (c <= 0x20 || c > 0x7e) return false;
  }
  const size_t colon = a.rfind(':');
  if (colon == std::string::npos || colon == 0) return false;
  const std::string port = a.substr(colon + 1);
  if (port.empty() || port.size() > 5) return false;
  int value = 0;
  for (char c : port) {
    if (c < '0' || c > '9') return false;
    value = value * 10 + (c - '0');
  }
  return value >= 1 && value <= 65535;
}


// A per-call request's sender (Cluster::SenderPeer): an address that is a
// valid <host>:<port>, or without one a static node_rank other than this
// node's (0); anything else is INVALID_ARGUMENT.
bool SenderSyntaxOk(int32_t node_rank, const std::string& address) {
  return address.empty() ? node_rank >= 1 && node_rank <= 2 : ValidAddress(address);
}

// Who may send AgreePlan / AbortCall for a group this node does not hold:
// the static cluster's other nodes, by node_rank or by their --peers
// address (issue 33: membership bound to the member; an unknown address,
// this node's own, is PERMISSION_DENIED).
bool StaticMember(int32_t node_rank, const std::string& address) {
  return address.empty() ? node_rank >= 1 && node_rank <= 2
                         : address == "127.0.0.1:1" || address == "127.0.0.1:2";
}


// A JoinGroup: the started node knows no group, so a valid one is "not
// formed yet"; an invalid one is INVALID_ARGUMENT; an unstarted node
// validates, then is UNAVAILABLE.
void FuzzJoinGroup(bool use_started, const uint8_t* data, size_t size) {
  v1::JoinGroupRequest r;
  v1::JoinGroupResponse resp;
  if (!Parse(data, size, &r)) return;
  grpc::ServerContext context;
  const grpc::Status st = F().Service(use_started)->JoinGroup(&context, &r, &resp);
  const int n = r.nodes_size();
  bool valid = !r.group().empty() && r.group().size() <= kMaxPeerGroupBytes && n >= 2 &&
               n <= 4096 && r.node_index() >= 1 && r.node_index() < n &&
               r.address() == r.nodes(r.node_index()) && r.incarnation() != 0 &&
               r.version().size() <= kMaxPeerVersionBytes && Printable(r.version()) &&
               !r.ucx_worker_address().empty() &&
               F().worker->ValidatePeerAddress(r.ucx_worker_address()).ok();
  for (int i = 0; valid && i < n; ++i) {
    valid = ValidAddress(r.nodes(i));
    for (int j = 0; valid && j < i; ++j) valid = r.nodes(i) != r.nodes(j);
  }
  if (!valid) {
    FUZZ_CHECK(st.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    return;
  }
  if (!use_started) {
    FUZZ_CHECK(st.error_code() == grpc::StatusCode::UNAVAILABLE);
    return;
  }
  FUZZ_CHECK(st.ok() && !resp.formed() && resp.members_size() == 0);
}

// A Join's answer against the model of peer_validation.h.
void CheckJoin(const v1::JoinRequest& r, const grpc::Status& st, const v1::JoinResponse& resp) {
  const bool fields_ok =
      r.num_nodes() >= 1 && r.num_nodes() <= kMaxPeerNodes && r.node_rank() >= 0 &&
      r.node_rank() < r.num_nodes() && r.devices_per_node() >= 1 &&
      r.devices_per_node() <= kMaxPeerDevicesPerNode && r.incarnation() != 0 &&
      r.version().size() <= kMaxPeerVersionBytes && Printable(r.version()) &&
      !r.ucx_worker_address().empty() &&
      F().worker->ValidatePeerAddress(r.ucx_worker_address()).ok();
  const bool shape_ok = r.num_nodes() == 3 && r.node_rank() >= 1 && r.node_rank() <= 2 &&
                        r.devices_per_node() == 1;
  FUZZ_CHECK(st.ok() == (fields_ok && shape_ok));
  if (st.ok()) {
    FUZZ_CHECK(resp.node_rank() == 0 && resp.incarnation() == F().started.incarnation());
  } else {
    FUZZ_CHECK(st.error_code() == (fields_ok ? grpc::StatusCode::FAILED_PRECONDITION
                                             : grpc::StatusCode::INVALID_ARGUMENT));
  }
}

// A Join from node 1 or 2 whose UCX address is this worker's own with
// fuzzed bytes written over it (and maybe truncated or extended).
void FuzzSplicedJoin(FuzzedDataProvider& in) {
  std::string address = F().worker->Address();
  const int edits = in.ConsumeIntegralInRange<int>(0, 4);
  for (int i = 0; i < edits && !address.empty(); ++i) {
    const size_t at = in.ConsumeIntegralInRange<size_t>(0, address.size() - 1);
    const std::string bytes = in.ConsumeRandomLengthString(8);
    address.replace(at, std::min(bytes.size(), address.size() - at), bytes);
  }
  switch (in.ConsumeIntegralInRange<int>(0, 3)) {
    case 0: address.resize(in.ConsumeIntegralInRange<size_t>(0, address.size())); break;
    case 1: address += in.ConsumeRandomLengthString(16); break;
    default: break;
  }
  v1::JoinRequest r;
  r.set_node_rank(in.ConsumeIntegralInRange<int32_t>(1, 2));
  r.set_num_nodes(3);
  r.set_devices_per_node(1);
  r.set_incarnation(in.ConsumeIntegralInRange<uint64_t>(0, 3));
  r.set_version("fuzz");
  r.set_ucx_worker_address(address);
  v1::JoinResponse resp;
  grpc::ServerContext context;
  const grpc::Status st = F().Service(true)->Join(&context, &r, &resp);
  CheckJoin(r, st, resp);
}

// Raw bytes against the layouts of real workers.
void FuzzRawAddress(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  for (const transport::UcxAddressLayout& own : F().layouts) {
    const absl::Status st = transport::ValidatePeerUcxAddress(bytes, own);
    if (!st.ok()) {
      FUZZ_CHECK(st.code() == absl::StatusCode::kInvalidArgument);
      FUZZ_CHECK(st.message().find("ucx_worker_address") != absl::string_view::npos);
      continue;
    }
    auto layout = transport::ParseUcxAddress(bytes, own.attribute_bytes);
    FUZZ_CHECK(layout.ok());
    FUZZ_CHECK(layout->version == own.version && layout->header_flags == own.header_flags);
    FUZZ_CHECK(!layout->interfaces.empty() &&
               static_cast<int>(layout->interfaces.size()) <= transport::kMaxUcxInterfaces);
    FUZZ_CHECK(size >= transport::kMinUcxAddressBytes && size <= transport::kMaxUcxAddressBytes);
  }
}

void FuzzHandler(int kind, bool use_started, const uint8_t* data, size_t size) {
  PeerServiceImpl* service = F().Service(use_started);
  grpc::ServerContext context;  // no peer token configured: not read
  grpc::Status st;
  switch (kind) {
    case 0: {
      v1::JoinRequest r;
      v1::JoinResponse resp;
      if (!Parse(data, size, &r)) return;
      st = service->Join(&context, &r, &resp);
      if (!use_started) {
        FUZZ_CHECK(st.error_code() == grpc::StatusCode::UNAVAILABLE);
        return;
      }
      CheckJoin(r, st, resp);
      return;
    }
    case 1: {
      v1::HeartbeatRequest r;
      v1::HeartbeatResponse resp;
      if (!Parse(data, size, &r)) return;
      st = service->Heartbeat(&context, &r, &resp);
      if (!use_started) {
        FUZZ_CHECK(st.error_code() == grpc::StatusCode::UNAVAILABLE);
        return;
      }
      if (!r.address().empty()) {  // a run-time peer: always answered
        FUZZ_CHECK(st.ok() == (r.address().size() <= 256));
        if (st.ok()) FUZZ_CHECK(resp.incarnation() == F().started.incarnation());
        return;
      }
      const bool bad_node = r.node_rank() < 1 || r.node_rank() > 2;
      FUZZ_CHECK(bad_node == (st.error_code() == grpc::StatusCode::INVALID_ARGUMENT));
      FUZZ_CHECK(st.ok() || st.error_code() == grpc::StatusCode::INVALID_ARGUMENT ||
                 st.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
      if (st.ok()) FUZZ_CHECK(resp.node_rank() == 0);
      return;
    }
    case 2: {
      v1::AgreePlanRequest r;
      v1::AgreePlanResponse resp;
      if (!Parse(data, size, &r)) return;
      st = service->AgreePlan(&context, &r, &resp);
      if (!use_started) {
        FUZZ_CHECK(st.error_code() == grpc::StatusCode::UNAVAILABLE);
        return;
      }
      const bool valid = SenderSyntaxOk(r.node_rank(), r.address()) && !r.group().empty() &&
                         r.group().size() <= kMaxPeerGroupBytes && !r.plan_key().empty() &&
                         r.plan_key().size() <= kMaxPeerPlanKeyBytes && Printable(r.plan_key()) &&
                         r.recv_comm_id() < kMaxPeerCommIds;
      if (!valid) {
        FUZZ_CHECK(st.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
        return;
      }
      // This node holds no group: only the static cluster's nodes speak.
      if (!StaticMember(r.node_rank(), r.address())) {
        FUZZ_CHECK(st.error_code() == grpc::StatusCode::PERMISSION_DENIED);
        return;
      }
      FUZZ_CHECK(st.ok());
      // This node never states a key here: the peer's key is kept, mine is "".
      FUZZ_CHECK(!resp.agreed() && resp.plan_key().empty());
      return;
    }
    default: {
      v1::AbortCallRequest r;
      v1::AbortCallResponse resp;
      if (!Parse(data, size, &r)) return;
      st = service->AbortCall(&context, &r, &resp);
      if (!use_started) {
        FUZZ_CHECK(st.error_code() == grpc::StatusCode::UNAVAILABLE);
        return;
      }
      const bool valid = SenderSyntaxOk(r.node_rank(), r.address()) && !r.group().empty() &&
                         r.group().size() <= kMaxPeerGroupBytes && r.code() >= 0 &&
                         r.code() <= 16 && r.message().size() <= kMaxPeerMessageBytes;
      if (!valid) {
        FUZZ_CHECK(st.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
        return;
      }
      FUZZ_CHECK(st.ok() == StaticMember(r.node_rank(), r.address()));
      FUZZ_CHECK(st.ok() || st.error_code() == grpc::StatusCode::PERMISSION_DENIED);
      return;
    }
  }
}

// PlanAgreement against a model of its contract (plan_agreement.h).
void FuzzAgreement(FuzzedDataProvider& in) {
  const size_t max_calls = in.ConsumeIntegralInRange<size_t>(1, 6);
  PlanAgreement agreement(max_calls);
  struct Entry {
    std::string local;
    std::map<int32_t, std::string> seen;
  };
  std::map<CallKey, Entry> model;
  std::deque<CallKey> order;  // insertion order, oldest first
  auto find_or_add = [&](const CallKey& call) -> Entry& {
    auto [it, inserted] = model.try_emplace(call);
    if (inserted) {
      order.push_back(call);
      if (model.size() > max_calls) {
        model.erase(order.front());
        order.pop_front();
      }
    }
    return model.at(call);
  };
  const char* const kKeys[] = {"", "k1", "k2", "k1\0x"};
  while (in.remaining_bytes() > 0) {
    CallKey call;
    call.group = in.ConsumeBool() ? "g" : in.ConsumeRandomLengthString(4);
    call.call_seq = in.ConsumeIntegralInRange<uint64_t>(0, 3);
    call.backward = in.ConsumeBool();
    const std::string key = in.ConsumeBool() ? kKeys[in.ConsumeIntegralInRange<int>(0, 3)]
                                             : in.ConsumeRandomLengthString(4);
    if (in.ConsumeBool()) {
      const absl::Status st = agreement.SetLocal(call, key);
      Entry& e = find_or_add(call);
      e.local = key;
      bool mismatch = false;
      for (const auto& [node, theirs] : e.seen) mismatch = mismatch || theirs != key;
      FUZZ_CHECK(st.ok() == !mismatch);
      if (!st.ok()) FUZZ_CHECK(st.code() == absl::StatusCode::kFailedPrecondition);
    } else {
      const int32_t node = in.ConsumeIntegralInRange<int32_t>(-1, 3);
      const std::string mine = agreement.OnRemote(call, node, key);
      Entry& e = find_or_add(call);
      e.seen[node] = key;
      FUZZ_CHECK(mine == e.local);
    }
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
  if (size == 0) return 0;
  if (data[0] < 8) {
    hsap::cluster::FuzzHandler(data[0] & 3, (data[0] & 4) == 0, data + 1, size - 1);
  } else if (data[0] < 10) {
    FuzzedDataProvider in(data + 1, size - 1);
    hsap::cluster::FuzzSplicedJoin(in);
  } else if (data[0] < 12) {
    hsap::cluster::FuzzRawAddress(data + 1, size - 1);
  } else if (data[0] == 12) {
    hsap::cluster::FuzzJoinGroup(size % 2 == 0, data + 1, size - 1);
  } else {
    FuzzedDataProvider in(data + 1, size - 1);
    hsap::cluster::FuzzAgreement(in);
  }
  return 0;
}
