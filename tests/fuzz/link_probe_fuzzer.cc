// Fuzzes Peer.ProbeLink, both ends (server/cluster/link_probe.h,
// peer_service.cc):
//
// First byte (mod 4; modes 2 and 3 in at most one input of 4, the run's
// counts per mode printed at its end):
//  0, 1  the prober: MeasureLink over a scripted probe call that answers
//        OK, fails with a code, takes 25 ms, or outlives the deadline at
//        the call the input names (deadline: none, past, or 3 ms away);
//  2     the answering side: ProbeLink calls to a Peer service served as
//        the daemon's TCP listener is (kMaxTcpMessageBytes, the
//        kTcpMemoryQuotaBytes ResourceQuota, no BDP probing, --token_file,
//        no TLS), with
//        fuzzed `authorization` metadata (0 to 2 headers) and payload sizes
//        up to 4 MiB + 1; and to the service of a Cluster not started yet;
//  3     raw bytes as the ProbeLink request message (a generic call), with
//        or without the token.
//
// Properties (docs/reliability.md, "Fuzzing"): the probe schedule (7 empty
// round trips, then 64 KiB growing 4x to at most 3 MiB until one takes
// 20 ms, then 3 at that size; a probe that took 25 ms ends the growth);
// the first failed probe ends the measurement UNAVAILABLE naming the peer
// and the payload, with no later probe; a passed deadline is
// DEADLINE_EXCEEDED before the next probe; figures within [1, 1e15] B/s and
// [0, 1e3] s, three significant digits. The answering side: OK iff the
// first authorization header is exactly "Bearer <token>" (UNAUTHENTICATED
// otherwise, whatever the payload), RESOURCE_EXHAUSTED for a message over
// 4 MiB, INTERNAL for bytes that are not a ProbeLinkRequest; UNAVAILABLE
// before the Cluster started (cluster.h: "Before Start() it answers
// UNAVAILABLE"); the listener keeps serving. No crash, leak or sanitizer
// report.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/resource_quota.h>

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "google/protobuf/stubs/logging.h"
#include "hsap/v1/peer.grpc.pb.h"
#include "server/cluster/cluster.h"
#include "server/cluster/link_probe.h"
#include "server/daemon.h"
#include "server/plan/cost_model.h"
#include "tests/fuzz/fuzz_util.h"

namespace hsap::cluster {
namespace {

using Code = grpc::StatusCode;

constexpr char kToken[] = "fuzz-token-0123456789abcdef";

// ---------------------------------------------------------------------------
// The prober.

fuzz::Budget& Slow() {
  static fuzz::Budget* b = new fuzz::Budget(64);
  return *b;
}

void FuzzMeasure(FuzzedDataProvider& in) {
  enum Action { kOk, kFail, kSlow, kExpire };
  struct Step {
    Action action = kOk;
    Code code = Code::OK;
  };
  // The script: OK unless the input names a call (at most one slow or
  // expiring one: they sleep).
  std::vector<Step> script(16);
  bool slept = false;
  const int events = in.ConsumeIntegralInRange<int>(0, 2);
  for (int e = 0; e < events; ++e) {
    const int at = in.ConsumeIntegralInRange<int>(0, 15);
    // Sleeping probes are rare (the largest values: an input that ran out
    // reads zeros).
    int kind = std::max(0, in.ConsumeIntegralInRange<int>(0, 31) - 29);
    if (kind != 0 && !Slow().Take()) kind = 0;  // at most one sleep per 64 inputs
    switch (kind) {
      case 0: {
        static constexpr Code kCodes[] = {Code::UNAVAILABLE, Code::DEADLINE_EXCEEDED,
                                          Code::PERMISSION_DENIED, Code::RESOURCE_EXHAUSTED,
                                          Code::INTERNAL, Code::CANCELLED};
        script[at] = {kFail, kCodes[in.ConsumeIntegralInRange<int>(0, 5)]};
        break;
      }
      case 1:
        if (!slept) script[at] = {kSlow, Code::OK}, slept = true;
        break;
      default:
        if (!slept) script[at] = {kExpire, Code::OK}, slept = true;
        break;
    }
  }
  absl::Time deadline = absl::InfiniteFuture();
  switch (in.ConsumeIntegralInRange<int>(0, 7)) {
    case 7: deadline = absl::InfinitePast(); break;
    case 6: deadline = absl::Now() + absl::Milliseconds(3); break;
    default: break;
  }
  const bool expiring = deadline != absl::InfiniteFuture() && deadline != absl::InfinitePast();
  std::vector<int64_t> sizes;
  std::vector<bool> slow;  // the probe took at least 25 ms (scripted)
  ProbeCall call = [&](int64_t bytes, absl::Time until) -> absl::Status {
    FUZZ_CHECK(until == deadline);
    const size_t i = sizes.size();
    sizes.push_back(bytes);
    const Step step = i < script.size() ? script[i] : Step{};
    slow.push_back(step.action == kSlow);
    switch (step.action) {
      case kFail:
        return absl::Status(static_cast<absl::StatusCode>(step.code), "scripted probe failure");
      case kSlow: absl::SleepFor(absl::Milliseconds(25)); break;
      case kExpire:
        if (expiring) absl::SleepFor(deadline - absl::Now() + absl::Milliseconds(1));
        break;
      default: break;
    }
    return absl::OkStatus();
  };
  const absl::StatusOr<LinkFigures> link = MeasureLink(call, "peer-under-test", deadline);
  const bool late = absl::Now() >= deadline;

  // The schedule the calls followed.
  constexpr int64_t kFirst = int64_t{64} << 10, kLast = int64_t{3} << 20;
  size_t i = 0;
  for (; i < sizes.size() && i < 7; ++i) FUZZ_CHECK(sizes[i] == 0);
  int64_t expected = kFirst;
  size_t growth_end = sizes.size();
  for (; i < sizes.size(); ++i) {
    FUZZ_CHECK(sizes[i] == expected);
    if (slow[i] || expected == kLast) {  // growth must end here
      growth_end = i + 1;
      break;
    }
    if (i + 1 < sizes.size() && sizes[i + 1] == expected) {  // it ended (timing)
      growth_end = i + 1;
      break;
    }
    expected = std::min(expected * 4, kLast);
  }
  for (size_t j = growth_end; j < sizes.size(); ++j) FUZZ_CHECK(sizes[j] == sizes[growth_end - 1]);
  FUZZ_CHECK(sizes.size() <= growth_end + 3 || growth_end == sizes.size());
  FUZZ_CHECK(sizes.size() <= 14);

  // How it ended.
  const Step* failed = nullptr;
  if (!sizes.empty() && script[sizes.size() - 1].action == kFail) failed = &script[sizes.size() - 1];
  if (failed != nullptr) {
    FUZZ_CHECK(link.status().code() == absl::StatusCode::kUnavailable);
    FUZZ_CHECK(link.status().message().find("peer-under-test") != absl::string_view::npos);
    FUZZ_CHECK(link.status().message().find(absl::StrCat("(", sizes.back(), " bytes)")) !=
               absl::string_view::npos);
    return;
  }
  if (!link.ok()) {
    // Only a passed deadline ends it otherwise, before a probe.
    FUZZ_CHECK(link.status().code() == absl::StatusCode::kDeadlineExceeded && late);
    FUZZ_CHECK(link.status().message().find("peer-under-test") != absl::string_view::npos);
    if (deadline == absl::InfinitePast()) FUZZ_CHECK(sizes.empty());
    return;
  }
  FUZZ_CHECK(sizes.size() == growth_end + 3 && growth_end >= 8);
  FUZZ_CHECK(link->incarnation == 0);
  FUZZ_CHECK(link->bytes_per_s >= 1 && link->bytes_per_s <= 1e15);
  FUZZ_CHECK(link->latency_s >= 0 && link->latency_s <= 1e3);
  FUZZ_CHECK(plan::RoundToThreeDigits(link->bytes_per_s) == link->bytes_per_s);
  FUZZ_CHECK(plan::RoundToThreeDigits(link->latency_s) == link->latency_s);
}

// ---------------------------------------------------------------------------
// The answering side.

struct Listener {
  Cluster cluster;       // started, with the token
  Cluster not_started;   // its service before Start
  std::unique_ptr<grpc::Server> server, early_server;
  std::shared_ptr<grpc::Channel> channel, early_channel;
  Listener() {
    ClusterOptions o;
    o.advertise_address = "127.0.0.1:7";
    o.token = kToken;
    o.heartbeat_period = absl::Hours(1);
    FUZZ_CHECK(cluster.Start(o, nullptr).ok());
    server = Serve(cluster.service(), &channel);
    early_server = Serve(not_started.service(), &early_channel);
  }
  // The daemon's TCP listener settings (server/daemon.cc).
  static std::unique_ptr<grpc::Server> Serve(grpc::Service* service,
                                             std::shared_ptr<grpc::Channel>* channel) {
    grpc::ServerBuilder b;
    int port = 0;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    b.SetMaxReceiveMessageSize(kMaxTcpMessageBytes);
    grpc::ResourceQuota quota("fuzz-tcp");
    quota.Resize(kTcpMemoryQuotaBytes);
    b.SetResourceQuota(quota);
    b.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
    b.RegisterService(service);
    std::unique_ptr<grpc::Server> s = b.BuildAndStart();
    FUZZ_CHECK(s != nullptr && port > 0);
    grpc::ChannelArguments args;
    args.SetMaxSendMessageSize(-1);
    *channel = grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", port),
                                         grpc::InsecureChannelCredentials(), args);
    return s;
  }
};

Listener& L() {
  static Listener* l = new Listener;
  return *l;
}

// Printable header values (gRPC refuses others before sending).
std::string Printable(FuzzedDataProvider& in, size_t max) {
  std::string s = in.ConsumeRandomLengthString(max);
  for (char& c : s) c = static_cast<char>(0x20 + (static_cast<unsigned char>(c) % 95));
  return s;
}

std::string SomeAuthorization(FuzzedDataProvider& in) {
  const std::string token = kToken;
  switch (in.ConsumeIntegralInRange<int>(0, 11)) {
    case 0: return "bearer " + token;
    case 1: return "Bearer  " + token;
    case 2: return "Bearer " + token + "x";
    case 3: return "Bearer " + token.substr(0, in.ConsumeIntegralInRange<size_t>(0, token.size()));
    case 4: return "Bearer ";
    case 5: return "";
    case 6: return Printable(in, 40);
    case 7: return "Bearer " + Printable(in, 30);
    case 8: {  // one character changed
      std::string t = token;
      t[in.ConsumeIntegralInRange<size_t>(0, t.size() - 1)] ^= 1;
      return "Bearer " + t;
    }
    case 9: return "Basic " + token;
    default: return "Bearer " + token;
  }
}

int64_t SomePayload(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange<int>(0, 15)) {
    case 15: return (int64_t{4} << 20) + 1;  // over the limit
    case 14: return (int64_t{4} << 20) - 16;  // with its 5 bytes of framing: under
    case 13: return int64_t{3} << 20;         // the largest probe
    default: return in.ConsumeIntegralInRange<int64_t>(0, 70000);
  }
}

void ExpectAnswer(const grpc::Status& st, size_t message_bytes,
                  const std::vector<std::string>& headers) {
  Code expected = Code::OK;
  if (message_bytes > static_cast<size_t>(kMaxTcpMessageBytes)) {
    expected = Code::RESOURCE_EXHAUSTED;
  } else if (headers.empty() || headers[0] != absl::StrCat("Bearer ", kToken)) {
    expected = Code::UNAUTHENTICATED;
  }
  if (st.error_code() != expected) {
    std::fprintf(stderr, "ProbeLink (%zu bytes, %zu headers, first '%s'): %d %s; expected %d\n",
                 message_bytes, headers.size(), headers.empty() ? "" : headers[0].c_str(),
                 st.error_code(), st.error_message().c_str(), expected);
  }
  FUZZ_CHECK(st.error_code() == expected);
}

void FuzzAnswer(FuzzedDataProvider& in) {
  std::vector<std::string> headers;
  const int n = in.ConsumeIntegralInRange<int>(0, 2);
  for (int i = 0; i < n; ++i) headers.push_back(SomeAuthorization(in));
  v1::ProbeLinkRequest request;
  request.mutable_payload()->assign(static_cast<size_t>(SomePayload(in)), 'p');
  const bool early = in.ConsumeIntegralInRange<int>(0, 7) == 7;
  auto stub = v1::Peer::NewStub(early ? L().early_channel : L().channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
  for (const std::string& h : headers) context.AddMetadata("authorization", h);
  v1::ProbeLinkResponse response;
  const grpc::Status st = stub->ProbeLink(&context, request, &response);
  if (early) {
    // Not started: UNAVAILABLE, whatever the credentials (the size limit
    // is the listener's, before any handler).
    FUZZ_CHECK(st.error_code() == (request.ByteSizeLong() > static_cast<size_t>(kMaxTcpMessageBytes)
                                       ? Code::RESOURCE_EXHAUSTED
                                       : Code::UNAVAILABLE));
    return;
  }
  ExpectAnswer(st, request.ByteSizeLong(), headers);
}

void FuzzRawRequest(const uint8_t* data, size_t size) {
  const bool with_token = size > 0 && (data[0] & 1);
  grpc::TemplatedGenericStub<grpc::ByteBuffer, grpc::ByteBuffer> stub(L().channel);
  grpc::Slice slice(data, size);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
  std::vector<std::string> headers;
  if (with_token) {
    headers.push_back(absl::StrCat("Bearer ", kToken));
    context.AddMetadata("authorization", headers[0]);
  }
  grpc::CompletionQueue cq;
  auto call = stub.PrepareUnaryCall(&context, "/hsap.v1.Peer/ProbeLink", request, &cq);
  call->StartCall();
  grpc::Status st;
  call->Finish(&response, &st, reinterpret_cast<void*>(1));
  void* tag = nullptr;
  bool ok = false;
  FUZZ_CHECK(cq.Next(&tag, &ok) && tag == reinterpret_cast<void*>(1));
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  v1::ProbeLinkRequest parsed;
  if (!parsed.ParseFromArray(data, static_cast<int>(size))) {
    // Not a ProbeLinkRequest: gRPC's deserializer refuses it.
    FUZZ_CHECK(st.error_code() == Code::INTERNAL);
    return;
  }
  ExpectAnswer(st, size, headers);
}

}  // namespace
}  // namespace hsap::cluster

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  setenv("GRPC_VERBOSITY", "NONE", 1);
  hsap::cluster::L();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static hsap::fuzz::ModeCounts& counts =
      *new hsap::fuzz::ModeCounts("link_probe_fuzzer", {"measure", "answer", "raw"});
  if (size == 0) return 0;
  FuzzedDataProvider in(data + 1, size - 1);
  // A call to the listener costs about a millisecond under ASan, a
  // measurement microseconds: at most one input in 4 makes a call (past
  // the budget the same bytes script a measurement).
  static uint64_t inputs = 0;
  const bool call = inputs++ % 4 == 0;
  hsap::cluster::Slow().Tick();
  switch (call ? data[0] & 3 : 0) {
    case 0:
    case 1: counts.Add(0), hsap::cluster::FuzzMeasure(in); break;
    case 2: counts.Add(1), hsap::cluster::FuzzAnswer(in); break;
    default: counts.Add(2), hsap::cluster::FuzzRawRequest(data + 1, size - 1); break;
  }
  return 0;
}
