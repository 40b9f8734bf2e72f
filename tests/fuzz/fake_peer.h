// A scripted stand-in for another hsapd on loopback, for the fuzz targets
// that drive a real Cluster through the peer protocol (group_join_fuzzer,
// group_profile_fuzzer): the Cluster under test calls it back
// (ConfirmMember), asks it (JoinGroup to a root, GroupProfile), probes it
// (ProbeLink) and heartbeats it, over real gRPC; the fuzzer sets what it
// answers and reads what it was sent.
//
//   auto peer = FakePeer::Start();
//   peer->SetAccount(account);               // what ConfirmMember answers
//   ... cluster.service()->JoinGroup(...)    // the root calls the peer back
//   std::vector<std::string> nonces = peer->Nonces();
//
// Heartbeat answers UNAVAILABLE, which the Cluster ignores (its liveness
// then rests on last_heard and a down_after the fixtures make hours long),
// so no background thread changes a group's state while an input runs.
// Thread-safe: gRPC threads answer while the fuzzer thread scripts.
#ifndef HSAP_TESTS_FUZZ_FAKE_PEER_H_
#define HSAP_TESTS_FUZZ_FAKE_PEER_H_

#include <grpcpp/grpcpp.h>

#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "hsap/v1/peer.grpc.pb.h"
#include "tests/fuzz/fuzz_util.h"

namespace hsap::fuzz {

class FakePeer final : public v1::Peer::Service {
 public:
  // One scripted answer: a status, and the message when it is OK.
  template <typename Response>
  struct Answer {
    grpc::StatusCode code = grpc::StatusCode::OK;
    Response response;
  };

  // Serves on 127.0.0.1:<free port>, plain gRPC.
  static std::unique_ptr<FakePeer> Start() {
    auto peer = std::unique_ptr<FakePeer>(new FakePeer);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(peer.get());
    builder.SetMaxReceiveMessageSize(8 << 20);
    peer->server_ = builder.BuildAndStart();
    FUZZ_CHECK(peer->server_ != nullptr && port > 0);
    peer->address_ = absl::StrCat("127.0.0.1:", port);
    return peer;
  }
  ~FakePeer() override {
    if (server_ != nullptr) server_->Shutdown();
  }

  const std::string& address() const { return address_; }

  // Forgets what it was sent and answers with the defaults below.
  void Reset() {
    absl::MutexLock lock(&mu_);
    confirm_ = Answer<v1::ConfirmMemberResponse>{};
    nonces_.clear();
    confirms_ = 0;
    joins_.clear();
    join_answers_.clear();
    probe_codes_.clear();
    probes_ = 0;
    profile_answers_.clear();
    profile_requests_.clear();
  }

  // ConfirmMember's answer (default: OK, not joining).
  void SetAccount(const Answer<v1::ConfirmMemberResponse>& answer) {
    absl::MutexLock lock(&mu_);
    confirm_ = answer;
  }
  // The nonces of the ConfirmMember calls received, in order.
  std::vector<std::string> Nonces() const {
    absl::MutexLock lock(&mu_);
    return nonces_;
  }
  int confirms() const {
    absl::MutexLock lock(&mu_);
    return confirms_;
  }

  // JoinGroup (this peer as a group's root): the answers, one per call
  // (the last repeats; none: FAILED_PRECONDITION), and what was sent.
  void SetJoinAnswers(std::vector<Answer<v1::JoinGroupResponse>> answers) {
    absl::MutexLock lock(&mu_);
    join_answers_.assign(answers.begin(), answers.end());
  }
  std::vector<v1::JoinGroupRequest> Joins() const {
    absl::MutexLock lock(&mu_);
    return joins_;
  }

  // ProbeLink: codes for the next calls, in order (then OK); calls seen.
  void SetProbeCodes(std::vector<grpc::StatusCode> codes) {
    absl::MutexLock lock(&mu_);
    probe_codes_.assign(codes.begin(), codes.end());
  }
  int probes() const {
    absl::MutexLock lock(&mu_);
    return probes_;
  }

  // GroupProfile (this peer as a group's root): answers as for JoinGroup
  // (none: FAILED_PRECONDITION), and the requests received.
  void SetProfileAnswers(std::vector<Answer<v1::GroupProfileResponse>> answers) {
    absl::MutexLock lock(&mu_);
    profile_answers_.assign(answers.begin(), answers.end());
  }
  std::vector<v1::GroupProfileRequest> ProfileRequests() const {
    absl::MutexLock lock(&mu_);
    return profile_requests_;
  }

  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest*,
                         v1::HeartbeatResponse*) override {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "fake peer: no heartbeats");
  }
  grpc::Status ConfirmMember(grpc::ServerContext*, const v1::ConfirmMemberRequest* request,
                             v1::ConfirmMemberResponse* response) override {
    absl::MutexLock lock(&mu_);
    ++confirms_;
    nonces_.push_back(request->nonce());
    if (confirm_.code != grpc::StatusCode::OK) return grpc::Status(confirm_.code, "fake peer");
    *response = confirm_.response;
    return grpc::Status::OK;
  }
  grpc::Status JoinGroup(grpc::ServerContext*, const v1::JoinGroupRequest* request,
                         v1::JoinGroupResponse* response) override {
    absl::MutexLock lock(&mu_);
    joins_.push_back(*request);
    return Next(&join_answers_, response);
  }
  grpc::Status ProbeLink(grpc::ServerContext*, const v1::ProbeLinkRequest*,
                         v1::ProbeLinkResponse*) override {
    absl::MutexLock lock(&mu_);
    ++probes_;
    if (probe_codes_.empty()) return grpc::Status::OK;
    const grpc::StatusCode code = probe_codes_.front();
    probe_codes_.pop_front();
    return grpc::Status(code, "fake peer: scripted probe answer");
  }
  grpc::Status GroupProfile(grpc::ServerContext*, const v1::GroupProfileRequest* request,
                            v1::GroupProfileResponse* response) override {
    absl::MutexLock lock(&mu_);
    profile_requests_.push_back(*request);
    return Next(&profile_answers_, response);
  }

 private:
  FakePeer() = default;

  template <typename Response>
  static grpc::Status Next(std::deque<Answer<Response>>* answers, Response* response) {
    if (answers->empty()) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "fake peer: no answer scripted");
    }
    const Answer<Response> a = answers->front();
    if (answers->size() > 1) answers->pop_front();
    if (a.code != grpc::StatusCode::OK) return grpc::Status(a.code, "fake peer: scripted refusal");
    *response = a.response;
    return grpc::Status::OK;
  }

  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  mutable absl::Mutex mu_;
  Answer<v1::ConfirmMemberResponse> confirm_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> nonces_ ABSL_GUARDED_BY(mu_);
  int confirms_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<v1::JoinGroupRequest> joins_ ABSL_GUARDED_BY(mu_);
  std::deque<Answer<v1::JoinGroupResponse>> join_answers_ ABSL_GUARDED_BY(mu_);
  std::deque<grpc::StatusCode> probe_codes_ ABSL_GUARDED_BY(mu_);
  int probes_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<Answer<v1::GroupProfileResponse>> profile_answers_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::GroupProfileRequest> profile_requests_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hsap::fuzz

#endif  // HSAP_TESTS_FUZZ_FAKE_PEER_H_
