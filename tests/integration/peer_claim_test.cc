// Issue 33, mutual TLS: a caller's certificate against the address its
// request claims (Cluster::CheckClaim), driven through real peer calls to
// real hsapd processes. Loopback gives each daemon its own address (all of
// 127/8 is loopback on Linux): A listens and advertises 127.0.0.2, B
// 127.0.0.3, each with a certificate naming its own IP (make_certs.sh); a
// rogue process holds a valid certificate from the same CA for 127.0.0.4.
//
//  * The rogue's JoinGroup and AbortCall to A, claiming to be B: refused
//    PERMISSION_DENIED naming the claim and the certificate, and A logs the
//    refusal; the same rogue claiming its own address passes the claim
//    check and is refused further on (not a member), so the check is what
//    refused the others. A group of A and B computes correctly around it.
//  * A self-signed certificate with a 3-byte iPAddress SAN: gRPC 1.51
//    aborted the daemon while reading its names (peer_tls_fuzzer); the
//    handshake now refuses a certificate the CA did not sign before gRPC
//    reads it. A stays up and its groups compute correctly.
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hsap/v1/peer.grpc.pb.h"
#include "server/transport/ucx_worker.h"
#include "tests/integration/group_call.h"
#include "tests/integration/test_daemon.h"

namespace hsap::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// A TCP port free on `host` (a loopback address) a moment ago.
int FreePortOn(const std::string& host) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  inet_pton(AF_INET, host.c_str(), &addr.sin_addr);
  addr.sin_port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return 0;
  }
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

struct Node {
  std::string host;
  int port = 0;
  std::unique_ptr<DaemonProcess> process;
  std::string address() const { return absl::StrCat(host, ":", port); }
};

class PeerClaimTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string make_certs = Runfile("deploy/tls/make_certs.sh");
    const std::string command =
        absl::StrCat("bash ", make_certs, " ", certs_.path(),
                     " a=IP:127.0.0.2 b=IP:127.0.0.3 rogue=IP:127.0.0.4 >/dev/null");
    ASSERT_EQ(std::system(command.c_str()), 0) << command;
    token_ = absl::StrCat(certs_.path(), "/token");
    std::ofstream(token_) << "claim-test-token-0123456789abcdef\n";
    chmod(token_.c_str(), 0600);
  }

  // A daemon listening on and advertising `host`, with certificate `name`.
  Node* StartNode(const std::string& host, const std::string& name) {
    auto n = std::make_unique<Node>();
    n->host = host;
    n->port = FreePortOn(host);
    EXPECT_GT(n->port, 0) << "cannot bind " << host;
    const std::string dir = certs_.path();
    std::vector<std::string> flags = {
        "--devices=cpu:1", "--cpu_threads=1", "--ucx_transports=tcp", "--heartbeat_ms=100",
        absl::StrCat("--host=", host), absl::StrCat("--port=", n->port),
        absl::StrCat("--advertise_address=", n->address()),
        absl::StrCat("--tls_cert=", dir, "/", name, ".pem"),
        absl::StrCat("--tls_key=", dir, "/", name, ".key"),
        absl::StrCat("--tls_ca=", dir, "/ca.pem"), absl::StrCat("--token_file=", token_)};
    auto p = DaemonProcess::Start(Runfile("server/hsapd"), flags,
                                  absl::StrCat(logs_.path(), "/", name, ".log"));
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) return nullptr;
    n->process = std::move(p).value();
    nodes_.push_back(std::move(n));
    return nodes_.back().get();
  }

  // A channel to `node` presenting `cert_pem`/`key_pem` (none when empty),
  // checking the daemon's certificate against the CA and its IP.
  std::shared_ptr<grpc::Channel> Channel(const Node& node, const std::string& cert_pem,
                                         const std::string& key_pem) {
    grpc::SslCredentialsOptions options;
    options.pem_root_certs = ReadFile(absl::StrCat(certs_.path(), "/ca.pem"));
    options.pem_cert_chain = cert_pem;
    options.pem_private_key = key_pem;
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    return grpc::CreateCustomChannel(node.address(), grpc::SslCredentials(options), args);
  }
  std::shared_ptr<grpc::Channel> RogueChannel(const Node& node) {
    return Channel(node, ReadFile(absl::StrCat(certs_.path(), "/rogue.pem")),
                   ReadFile(absl::StrCat(certs_.path(), "/rogue.key")));
  }

  GroupSpec Declared(const std::string& name, const std::vector<Node*>& members) {
    GroupSpec spec;
    spec.group = name;
    spec.nodes = static_cast<int32_t>(members.size());
    spec.devices_per_node = 1;
    for (Node* n : members) {
      spec.sockets.push_back(n->process->socket());
      spec.member_addresses.push_back(n->address());
    }
    spec.strategy = hsap::v1::STRATEGY_SAP;
    spec.deadline_ms = 60000;
    return spec;
  }

  TempDir certs_, logs_;
  std::string token_;
  std::vector<std::unique_ptr<Node>> nodes_;
};

std::unique_ptr<grpc::ClientContext> Context() {
  auto c = std::make_unique<grpc::ClientContext>();
  c->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  return c;
}

const std::vector<int64_t> kDocs = {0, 40, 41, 100, 128};

TEST_F(PeerClaimTest, ACertificateCannotClaimAnotherNodesAddress) {
  Node* a = StartNode("127.0.0.2", "a");
  Node* b = StartNode("127.0.0.3", "b");
  ASSERT_TRUE(a != nullptr && b != nullptr);
  {  // Two daemons on two loopback addresses, over mutual TLS.
    auto r = RunGroup(MakeProblem(kDocs, true, 1), Declared("G1", {a, b}));
    ASSERT_TRUE(r.ok()) << r.status() << "\nA: " << a->process->ReadLog();
    EXPECT_LT(r->max_error, 1e-4);
  }
  auto rogue = v1::Peer::NewStub(RogueChannel(*a));
  // B's incarnation, from B itself (the rogue's certificate is valid).
  v1::HeartbeatRequest hello;
  hello.set_address("127.0.0.4:9");
  hello.set_incarnation(1);
  v1::HeartbeatResponse answer;
  const grpc::Status hb =
      v1::Peer::NewStub(RogueChannel(*b))->Heartbeat(Context().get(), hello, &answer);
  ASSERT_TRUE(hb.ok()) << hb.error_message();
  const uint64_t b_incarnation = answer.incarnation();
  auto worker = transport::UcxWorker::Create({.transports = "tcp"});
  ASSERT_TRUE(worker.ok()) << worker.status();

  // 1. JoinGroup claiming to be B.
  v1::JoinGroupRequest join;
  join.set_group("G2");
  join.add_nodes(a->address());
  join.add_nodes(b->address());
  join.set_node_index(1);
  join.set_address(b->address());
  join.set_incarnation(b_incarnation);
  join.set_ucx_worker_address((*worker)->Address());
  v1::JoinGroupResponse joined;
  const grpc::Status j = rogue->JoinGroup(Context().get(), join, &joined);
  EXPECT_EQ(j.error_code(), grpc::StatusCode::PERMISSION_DENIED) << j.error_message();
  EXPECT_FALSE(joined.formed());
  const std::string certificate = "subject /CN=rogue, SANs [IP:127.0.0.4]";
  EXPECT_THAT(j.error_message(), HasSubstr(absl::StrCat("JoinGroup for group 'G2' from ipv4:")));
  EXPECT_THAT(j.error_message(),
              HasSubstr(absl::StrCat("claims to be ", b->address(), " but its certificate (",
                                     certificate, ") does not name '127.0.0.3'")));
  std::printf("JoinGroup claiming B: %s\n", j.error_message().c_str());

  // 2. AbortCall claiming to be B, while G3 of A and B is live: refused, and
  //    G3's results are correct.
  std::vector<grpc::Status> aborts;
  GroupSpec g3 = Declared("G3", {a, b});
  g3.while_open = [&] {
    for (uint64_t seq : {1, 2, 3}) {
      v1::AbortCallRequest abort;
      abort.set_group("G3");
      abort.set_call_seq(seq);
      abort.set_code(10);
      abort.set_message("rogue abort");
      abort.set_address(b->address());
      abort.set_incarnation(b_incarnation);
      v1::AbortCallResponse none;
      aborts.push_back(rogue->AbortCall(Context().get(), abort, &none));
    }
  };
  auto r3 = RunGroup(MakeProblem(kDocs, true, 3), g3);
  ASSERT_TRUE(r3.ok()) << r3.status();
  EXPECT_LT(r3->max_error, 1e-4);
  ASSERT_EQ(aborts.size(), 3u);
  for (const grpc::Status& s : aborts) {
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(absl::StrCat("AbortCall from ipv4:")));
    EXPECT_THAT(s.error_message(),
                HasSubstr(absl::StrCat("claims to be ", b->address(), " but its certificate (",
                                       certificate, ") does not name '127.0.0.3'")));
  }

  // 3. The control: claiming the address its certificate names, the rogue
  //    passes the claim check and is refused as a non-member (so the claim
  //    check, not membership, refused 1 and 2).
  v1::AbortCallRequest own;
  own.set_group("G3");
  own.set_call_seq(9);
  own.set_code(10);
  own.set_address("127.0.0.4:9");
  own.set_incarnation(1);
  v1::AbortCallResponse none;
  const grpc::Status o = rogue->AbortCall(Context().get(), own, &none);
  EXPECT_EQ(o.error_code(), grpc::StatusCode::PERMISSION_DENIED) << o.error_message();
  EXPECT_THAT(o.error_message(), Not(HasSubstr("claims to be")));
  EXPECT_THAT(o.error_message(), HasSubstr("127.0.0.4:9#1"));
  std::printf("AbortCall claiming its own address: %s\n", o.error_message().c_str());

  // 4. The root's log names each refusal; the next group is correct.
  const std::string log = a->process->ReadLog();
  EXPECT_THAT(log, HasSubstr(absl::StrCat("refused: JoinGroup for group 'G2' from ipv4:")));
  EXPECT_THAT(log, HasSubstr(absl::StrCat("claims to be ", b->address(), " but its certificate (",
                                          certificate, ") does not name '127.0.0.3'")));
  auto r4 = RunGroup(MakeProblem(kDocs, true, 4), Declared("G4", {b, a}));
  ASSERT_TRUE(r4.ok()) << r4.status();
  EXPECT_LT(r4->max_error, 1e-4);
}

// OpenSSL helpers for a certificate make_certs.sh would never write.
struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
struct CertFree {
  void operator()(X509* x) const { X509_free(x); }
};

std::string ToPem(X509* x) {
  BIO* b = BIO_new(BIO_s_mem());
  PEM_write_bio_X509(b, x);
  char* data = nullptr;
  const long n = BIO_get_mem_data(b, &data);
  std::string out(data, static_cast<size_t>(n));
  BIO_free(b);
  return out;
}

std::string ToPem(EVP_PKEY* k) {
  BIO* b = BIO_new(BIO_s_mem());
  PEM_write_bio_PrivateKey(b, k, nullptr, nullptr, 0, nullptr, nullptr);
  char* data = nullptr;
  const long n = BIO_get_mem_data(b, &data);
  std::string out(data, static_cast<size_t>(n));
  BIO_free(b);
  return out;
}

TEST_F(PeerClaimTest, AMalformedSelfSignedCertificateDoesNotStopTheDaemon) {
  Node* a = StartNode("127.0.0.2", "a");
  Node* b = StartNode("127.0.0.3", "b");
  ASSERT_TRUE(a != nullptr && b != nullptr);
  // Self-signed, its subject alternative names one iPAddress of 3 bytes.
  std::unique_ptr<EVP_PKEY, KeyFree> key(EVP_EC_gen("P-256"));
  ASSERT_NE(key, nullptr);
  std::unique_ptr<X509, CertFree> cert(X509_new());
  X509_set_version(cert.get(), 2);
  ASN1_INTEGER_set(X509_get_serialNumber(cert.get()), 7);
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>("attacker"), -1, -1, 0);
  X509_set_issuer_name(cert.get(), name);
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), 86400);
  X509_set_pubkey(cert.get(), key.get());
  GENERAL_NAMES* names = sk_GENERAL_NAME_new_null();
  GENERAL_NAME* ip = GENERAL_NAME_new();
  ASN1_OCTET_STRING* bytes = ASN1_OCTET_STRING_new();
  ASN1_STRING_set(bytes, "\x01\x02\x03", 3);
  GENERAL_NAME_set0_value(ip, GEN_IPADD, bytes);
  sk_GENERAL_NAME_push(names, ip);
  X509_add1_ext_i2d(cert.get(), NID_subject_alt_name, names, 0, X509V3_ADD_DEFAULT);
  GENERAL_NAMES_free(names);
  ASSERT_GT(X509_sign(cert.get(), key.get(), EVP_sha256()), 0);

  auto attacker = v1::Peer::NewStub(Channel(*a, ToPem(cert.get()), ToPem(key.get())));
  for (int i = 0; i < 3; ++i) {
    v1::HeartbeatRequest hello;
    hello.set_address("127.0.0.4:9");
    hello.set_incarnation(1);
    v1::HeartbeatResponse answer;
    const grpc::Status s = attacker->Heartbeat(Context().get(), hello, &answer);
    // The handshake fails (the CA did not sign it): no answer at all.
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  }
  absl::SleepFor(absl::Milliseconds(500));
  EXPECT_EQ(kill(a->process->pid(), 0), 0) << "hsapd A died:\n" << a->process->ReadLog();
  EXPECT_THAT(a->process->ReadLog(), Not(HasSubstr("assertion failed")));
  EXPECT_THAT(a->process->ReadLog(), HasSubstr("certificate verify failed"));
  // A client without a certificate (an operator's, with the token) still
  // connects: A answers, and refuses the peer call for want of one.
  v1::HeartbeatRequest hello;
  hello.set_address("127.0.0.4:9");
  v1::HeartbeatResponse answer;
  const grpc::Status op =
      v1::Peer::NewStub(Channel(*a, "", ""))->Heartbeat(Context().get(), hello, &answer);
  EXPECT_EQ(op.error_code(), grpc::StatusCode::UNAUTHENTICATED) << op.error_message();
  EXPECT_THAT(op.error_message(), HasSubstr("presented no client certificate"));
  auto r = RunGroup(MakeProblem(kDocs, true, 5), Declared("G5", {a, b}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_LT(r->max_error, 1e-4);
}

}  // namespace
}  // namespace hsap::testing
