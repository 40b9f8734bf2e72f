// Mutual TLS between daemons (hsapd --tls_cert, --tls_key, --tls_ca;
// docs/reliability.md, "Trust between daemons"). A daemon's identity is its
// certificate: every certificate of the cluster is signed by one CA, and
// names in its subject alternative names (DNS names or IP addresses) the
// host of the address its daemon advertises. A peer call is believed only
// for the address the caller's certificate names.
//
// The TCP port serves TLS to every caller; it asks each for a client
// certificate without requiring one (operators authenticate with the token
// over the encrypted connection). A certificate that is presented must
// chain to --tls_ca in the handshake itself: gRPC 1.51 aborts the whole
// process when it extracts the names of a client certificate with an
// iPAddress SAN that is not 4 or 16 bytes (ssl_transport_security.cc
// "property_count == current_insert_index"; peer_tls_fuzzer found it, and a
// self-signed certificate from anyone reaching the port did it), so only
// certificates the cluster's CA signed reach that code. The peer service
// then verifies the presented certificate again (VerifyCaller: client
// purpose, the chain the caller sent) and reads its names, so that a
// claim the certificate does not back is a status and a log line naming
// the certificate. Calls this daemon makes to peers present its own
// certificate and check theirs against the CA and the dialed host (gRPC's
// own check).
//
//   HSAP_ASSIGN_OR_RETURN(auto tls, PeerTls::Load({cert, key, ca}));
//   builder.AddListeningPort(address, tls->ServerCredentials());
//   auto channel = grpc::CreateCustomChannel(peer, tls->ChannelCredentials(), args);
//   ...in a handler:
//   HSAP_ASSIGN_OR_RETURN(CertificateIdentity who, tls->VerifyCaller(*context));
//   if (!who.NamesHostOf(claimed_address)) ... PERMISSION_DENIED
//
// Thread-safe after Load (the CA store is only read).
#ifndef HSAP_SERVER_CLUSTER_PEER_TLS_H_
#define HSAP_SERVER_CLUSTER_PEER_TLS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_context.h"

namespace hsap::cluster {

struct PeerTlsFiles {
  std::string cert_file;  // PEM: this node's certificate (then any intermediates)
  std::string key_file;   // PEM: its private key; mode 0600/0400
  std::string ca_file;    // PEM: the cluster's CA certificate(s)
};

// Who a verified certificate names.
struct CertificateIdentity {
  std::string subject;            // one line, e.g. "CN=node-1"
  std::vector<std::string> dns;   // DNS subject alternative names
  std::vector<std::string> ips;   // IP subject alternative names, as text
  // True when `host` (a DNS name or an IP address, no port) is one of the
  // subject alternative names: an IP SAN with the same address, or a DNS
  // SAN without "*" equal to it (case-insensitively), or "*.<rest>" with
  // <rest> two or more labels of letters, digits and '-' and the host one
  // such label more. Never more than OpenSSL's and gRPC's own host checks
  // accept (peer_tls_fuzzer compares them): no "*.com", no partial or
  // second wildcard, no empty label, no trailing dot.
  bool NamesHost(absl::string_view host) const;
  // The same for the host part of "<host>:<port>" ("[v6]:port" too).
  bool NamesHostOf(absl::string_view address) const;
  // "subject CN=..., SANs [DNS:a, IP:127.0.0.1]".
  std::string Describe() const;
};

// The host part of "<host>:<port>" (brackets of "[v6]" removed).
std::string HostOfAddress(absl::string_view address);

// 16 bytes from OpenSSL's CSPRNG: group keys and confirmation nonces.
std::string NewGroupSecret();

class PeerTls {
 public:
  // Reads and checks the three files: PEM that parses, the key matches the
  // certificate, the certificate is signed by the CA (so peers will accept
  // it), the key file is not accessible to group or others.
  // FAILED_PRECONDITION / NOT_FOUND naming the file and the problem.
  static absl::StatusOr<std::shared_ptr<const PeerTls>> Load(const PeerTlsFiles& files);
  ~PeerTls();
  PeerTls(const PeerTls&) = delete;
  PeerTls& operator=(const PeerTls&) = delete;

  std::shared_ptr<grpc::ServerCredentials> ServerCredentials() const;
  std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials() const;

  // The caller's certificate (from the call's TLS auth context), verified
  // against the CA for client use. UNAUTHENTICATED saying why (no TLS, no
  // certificate, not signed by the CA, expired, ...), naming the caller's
  // transport address and the certificate's subject when there is one.
  absl::StatusOr<CertificateIdentity> VerifyCaller(const grpc::ServerContext& context) const;
  // Verifies a PEM chain (leaf first) the same way.
  absl::StatusOr<CertificateIdentity> VerifyPem(absl::string_view leaf_pem,
                                                absl::string_view chain_pem) const;

  // This node's own certificate.
  const CertificateIdentity& self() const { return self_; }

 private:
  PeerTls() = default;
  struct Store;  // the OpenSSL CA store
  std::unique_ptr<Store> store_;
  std::string cert_pem_, key_pem_, ca_pem_;
  CertificateIdentity self_;
};

}  // namespace hsap::cluster

#endif  // HSAP_SERVER_CLUSTER_PEER_TLS_H_
