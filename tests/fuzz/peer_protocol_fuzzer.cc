// Fuzzes the peer protocol (hsap.v1.Peer, server/cluster/): arbitrary
// JoinRequest / HeartbeatRequest / AgreePlanRequest / AbortCallRequest
// bytes go to the handlers of a started 3-node Cluster (node 0; nodes 1 and
// 2 are unreachable addresses, so its heartbeat thread keeps timing them out
// concurrently) and of a Cluster never started, through the PeerServiceImpl
// the gRPC server would call. A first byte >= 4 instead runs a sequence of
// SetLocal / OnRemote on a PlanAgreement against a reference model.
//
// Properties: no crash or sanitizer report; a Join is accepted iff it names
// another node of this cluster with the same shape; status codes are the
// documented ones; a started cluster answers AgreePlan and AbortCall iff
// they name another member and a group (and, AgreePlan, a plan key), and
// refuses the others with INVALID_ARGUMENT; an unstarted one is UNAVAILABLE;
// PlanAgreement matches the model (keys, mismatch errors, eviction order).
#include <deque>
#include <map>
#include <memory>
#include <string>

#include <grpcpp/server_context.h>

#include "google/protobuf/stubs/logging.h"
#include "hsap/v1/peer.pb.h"
#include "server/cluster/cluster.h"
#include "server/cluster/peer_service.h"
#include "server/cluster/plan_agreement.h"
#include "tests/fuzz/fuzz_util.h"

namespace hsap::cluster {
namespace {

struct Fixture {
  Cluster started;
  Cluster idle;
  Fixture() {
    ClusterOptions options;
    options.peers = {"127.0.0.1:9", "127.0.0.1:1", "127.0.0.1:2"};
    options.node_rank = 0;
    options.join_timeout = absl::Milliseconds(1);
    options.rpc_timeout = absl::Milliseconds(50);
    // Not formed in 1 ms: DEADLINE_EXCEEDED, but started (it keeps trying).
    const absl::Status st = started.Start(options, nullptr);
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
      const bool acceptable = r.num_nodes() == 3 && r.node_rank() >= 1 && r.node_rank() <= 2 &&
                              r.devices_per_node() == 1;
      FUZZ_CHECK(st.ok() == acceptable);
      if (st.ok()) {
        FUZZ_CHECK(resp.node_rank() == 0 && resp.incarnation() == F().started.incarnation());
      } else {
        FUZZ_CHECK(st.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
      }
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
      const bool valid = r.node_rank() >= 1 && r.node_rank() <= 2 && !r.group().empty() &&
                         !r.plan_key().empty();
      FUZZ_CHECK(st.ok() == valid);
      if (!st.ok()) {
        FUZZ_CHECK(st.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
        return;
      }
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
      FUZZ_CHECK(st.ok() == (r.node_rank() >= 1 && r.node_rank() <= 2 && !r.group().empty()));
      FUZZ_CHECK(st.ok() || st.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
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
  } else {
    FuzzedDataProvider in(data + 1, size - 1);
    hsap::cluster::FuzzAgreement(in);
  }
  return 0;
}
