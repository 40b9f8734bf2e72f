#include "server/cluster/peer_tls.h"

#include <arpa/inet.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "grpc/grpc_security_constants.h"

namespace hsap::cluster {
namespace {

// RAII for the OpenSSL objects used here.
struct BioDeleter { void operator()(BIO* b) const { BIO_free(b); } };
struct X509Deleter { void operator()(X509* x) const { X509_free(x); } };
struct KeyDeleter { void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); } };
struct CtxDeleter { void operator()(X509_STORE_CTX* c) const { X509_STORE_CTX_free(c); } };
struct StackDeleter {
  void operator()(STACK_OF(X509) * s) const { sk_X509_pop_free(s, X509_free); }
};
struct NamesDeleter {
  void operator()(GENERAL_NAMES* n) const { GENERAL_NAMES_free(n); }
};
using UniqueBio = std::unique_ptr<BIO, BioDeleter>;
using UniqueX509 = std::unique_ptr<X509, X509Deleter>;
using UniqueStack = std::unique_ptr<STACK_OF(X509), StackDeleter>;

// OpenSSL's queued errors as one line (and the queue cleared).
std::string OpenSslErrors() {
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out.empty() ? "no detail" : out;
}

absl::StatusOr<std::string> ReadFile(const std::string& flag, const std::string& path,
                                     bool secret) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    const std::string what = absl::StrCat(flag, " ", path, ": ", std::strerror(errno));
    return errno == ENOENT ? absl::NotFoundError(what) : absl::FailedPreconditionError(what);
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(flag, " ", path, " is not a regular file"));
  }
  if (secret && (st.st_mode & 077) != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s %s has mode %04o: a private key must not be accessible to its group or others "
        "(chmod 600; in Kubernetes, the Secret volume's defaultMode 0400)",
        flag, path, st.st_mode & 07777));
  }
  if (st.st_size > (1 << 20)) {
    return absl::FailedPreconditionError(
        absl::StrCat(flag, " ", path, " has ", st.st_size, " bytes; at most 1 MiB"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::FailedPreconditionError(absl::StrCat(flag, " ", path, ": cannot read"));
  std::ostringstream content;
  content << in.rdbuf();
  return content.str();
}

// Every certificate of a PEM bundle, in order.
std::vector<UniqueX509> ParseCertificates(absl::string_view pem) {
  std::vector<UniqueX509> out;
  UniqueBio bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  if (bio == nullptr) return out;
  while (X509* x = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) out.emplace_back(x);
  ERR_clear_error();  // the read that ended the loop
  return out;
}

std::string SubjectLine(X509* cert) {
  char buf[512];
  X509_NAME_oneline(X509_get_subject_name(cert), buf, sizeof(buf));
  return buf;
}

CertificateIdentity IdentityOf(X509* cert) {
  CertificateIdentity id;
  id.subject = SubjectLine(cert);
  std::unique_ptr<GENERAL_NAMES, NamesDeleter> names(static_cast<GENERAL_NAMES*>(
      X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr)));
  if (names == nullptr) return id;
  for (int i = 0; i < sk_GENERAL_NAME_num(names.get()); ++i) {
    const GENERAL_NAME* name = sk_GENERAL_NAME_value(names.get(), i);
    if (name->type == GEN_DNS) {
      const ASN1_IA5STRING* s = name->d.dNSName;
      id.dns.emplace_back(reinterpret_cast<const char*>(ASN1_STRING_get0_data(s)),
                          ASN1_STRING_length(s));
    } else if (name->type == GEN_IPADD) {
      const ASN1_OCTET_STRING* s = name->d.iPAddress;
      char text[INET6_ADDRSTRLEN] = {};
      const int len = ASN1_STRING_length(s);
      const unsigned char* bytes = ASN1_STRING_get0_data(s);
      if (len == 4 && inet_ntop(AF_INET, bytes, text, sizeof(text)) != nullptr) {
        id.ips.push_back(text);
      } else if (len == 16 && inet_ntop(AF_INET6, bytes, text, sizeof(text)) != nullptr) {
        id.ips.push_back(text);
      }
    }
  }
  return id;
}

// The canonical text of an IP address, or empty when `host` is not one.
std::string CanonicalIp(const std::string& host) {
  unsigned char bytes[16];
  char text[INET6_ADDRSTRLEN] = {};
  if (inet_pton(AF_INET, host.c_str(), bytes) == 1) {
    inet_ntop(AF_INET, bytes, text, sizeof(text));
    return text;
  }
  if (inet_pton(AF_INET6, host.c_str(), bytes) == 1) {
    inet_ntop(AF_INET6, bytes, text, sizeof(text));
    return text;
  }
  return "";
}

}  // namespace

std::string HostOfAddress(absl::string_view address) {
  if (absl::StartsWith(address, "[")) {
    const size_t close = address.find(']');
    return std::string(address.substr(1, close == absl::string_view::npos ? address.npos : close - 1));
  }
  const size_t colon = address.rfind(':');
  return std::string(colon == absl::string_view::npos ? address : address.substr(0, colon));
}

std::string NewGroupSecret() {
  std::string out(16, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(out.size())) != 1) {
    // OpenSSL's generator failing is not something to run without.
    std::abort();
  }
  return out;
}

namespace {

// Letters, digits and '-': what a wildcard may stand for, and what the rest
// of a wildcard name may hold besides dots (OpenSSL's rule for a valid "*").
bool HostnameChars(absl::string_view s, bool dots) {
  for (char c : s) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '-' && !(dots && c == '.')) {
      return false;
    }
  }
  return true;
}

// No empty label (no leading, trailing or doubled dot).
bool WholeLabels(absl::string_view s) {
  return !s.empty() && s.front() != '.' && s.back() != '.' && s.find("..") == s.npos;
}

// No label of a wildcard's rest starts or ends with '-' (OpenSSL's
// valid_star refuses such a pattern, and then compares it as a plain name).
bool NoEdgeHyphens(absl::string_view s) {
  for (absl::string_view label : absl::StrSplit(s, '.')) {
    if (!label.empty() && (label.front() == '-' || label.back() == '-')) return false;
  }
  return true;
}

}  // namespace

bool CertificateIdentity::NamesHost(absl::string_view host_view) const {
  const std::string host(host_view);
  const std::string ip = CanonicalIp(host);
  if (!ip.empty()) {
    for (const std::string& s : ips) {
      if (s == ip) return true;
    }
    return false;
  }
  // Only what both the TLS libraries' host checks accept (OpenSSL's
  // X509_check_host without partial wildcards, gRPC's own): a DNS name
  // without a "*" equal to the host, or "*.<at least two labels>" for a
  // host of one more label of letters, digits and '-'. Found by
  // peer_tls_fuzzer: "*.com" named "a.com", "*.*.hsap" named "x.*.hsap",
  // "*.c.omexp-" named "node-7.c.omexp-".
  if (!WholeLabels(host)) return false;
  const std::string lower = absl::AsciiStrToLower(host);
  for (const std::string& d : dns) {
    const std::string name = absl::AsciiStrToLower(d);
    if (name.find('*') == std::string::npos) {
      if (name == lower) return true;
      continue;
    }
    if (!absl::StartsWith(name, "*.")) continue;
    const absl::string_view rest = absl::string_view(name).substr(2);
    if (!WholeLabels(rest) || rest.find('.') == rest.npos || !HostnameChars(rest, true) ||
        !NoEdgeHyphens(rest)) {
      continue;
    }
    const size_t dot = lower.find('.');
    if (dot == std::string::npos || dot == 0) continue;
    if (HostnameChars(absl::string_view(lower).substr(0, dot), false) &&
        absl::string_view(lower).substr(dot + 1) == rest) {
      return true;
    }
  }
  return false;
}

bool CertificateIdentity::NamesHostOf(absl::string_view address) const {
  return NamesHost(HostOfAddress(address));
}

std::string CertificateIdentity::Describe() const {
  std::vector<std::string> sans;
  for (const std::string& d : dns) sans.push_back(absl::StrCat("DNS:", d));
  for (const std::string& i : ips) sans.push_back(absl::StrCat("IP:", i));
  return absl::StrCat("subject ", subject, ", SANs [", absl::StrJoin(sans, ", "), "]");
}

struct PeerTls::Store {
  X509_STORE* store = nullptr;
  ~Store() {
    if (store != nullptr) X509_STORE_free(store);
  }
};

PeerTls::~PeerTls() = default;

absl::StatusOr<std::shared_ptr<const PeerTls>> PeerTls::Load(const PeerTlsFiles& files) {
  if (files.cert_file.empty() || files.key_file.empty() || files.ca_file.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "mutual TLS needs all three of --tls_cert, --tls_key and --tls_ca (given: cert '",
        files.cert_file, "', key '", files.key_file, "', ca '", files.ca_file, "')"));
  }
  std::shared_ptr<PeerTls> tls(new PeerTls());
  auto cert = ReadFile("--tls_cert", files.cert_file, false);
  if (!cert.ok()) return cert.status();
  auto key = ReadFile("--tls_key", files.key_file, true);
  if (!key.ok()) return key.status();
  auto ca = ReadFile("--tls_ca", files.ca_file, false);
  if (!ca.ok()) return ca.status();
  tls->cert_pem_ = *std::move(cert);
  tls->key_pem_ = *std::move(key);
  tls->ca_pem_ = *std::move(ca);

  std::vector<UniqueX509> chain = ParseCertificates(tls->cert_pem_);
  if (chain.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("--tls_cert ", files.cert_file, " holds no PEM certificate"));
  }
  std::vector<UniqueX509> cas = ParseCertificates(tls->ca_pem_);
  if (cas.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("--tls_ca ", files.ca_file, " holds no PEM certificate"));
  }
  UniqueBio key_bio(BIO_new_mem_buf(tls->key_pem_.data(), static_cast<int>(tls->key_pem_.size())));
  std::unique_ptr<EVP_PKEY, KeyDeleter> pkey(
      PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr));
  if (pkey == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--tls_key ", files.key_file, " holds no unencrypted PEM private key: ", OpenSslErrors()));
  }
  if (X509_check_private_key(chain[0].get(), pkey.get()) != 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--tls_key ", files.key_file, " is not the key of --tls_cert ", files.cert_file, " (",
        SubjectLine(chain[0].get()), "): ", OpenSslErrors()));
  }
  tls->store_ = std::make_unique<Store>();
  tls->store_->store = X509_STORE_new();
  for (const UniqueX509& c : cas) X509_STORE_add_cert(tls->store_->store, c.get());
  std::string chain_pem;  // the intermediates, for VerifyPem
  {
    UniqueBio out(BIO_new(BIO_s_mem()));
    for (size_t i = 1; i < chain.size(); ++i) PEM_write_bio_X509(out.get(), chain[i].get());
    char* data = nullptr;
    const long n = BIO_get_mem_data(out.get(), &data);
    chain_pem.assign(data, n);
  }
  // Its own certificate must pass the check its peers make of it.
  UniqueBio leaf_out(BIO_new(BIO_s_mem()));
  PEM_write_bio_X509(leaf_out.get(), chain[0].get());
  char* leaf_data = nullptr;
  const long leaf_len = BIO_get_mem_data(leaf_out.get(), &leaf_data);
  auto self = tls->VerifyPem(absl::string_view(leaf_data, leaf_len), chain_pem);
  if (!self.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--tls_cert ", files.cert_file, " does not verify against --tls_ca ", files.ca_file,
        ", so its peers would refuse it: ", self.status().message()));
  }
  tls->self_ = *std::move(self);
  return std::shared_ptr<const PeerTls>(std::move(tls));
}

std::shared_ptr<grpc::ServerCredentials> PeerTls::ServerCredentials() const {
  // Asked, not required (operators come with the token and no
  // certificate), and verified against the CA in the handshake when
  // presented: gRPC 1.51 aborts on the names of some malformed client
  // certificates (peer_tls.h), so an unverified one must not reach it.
  // VerifyCaller checks it again and reads its names.
  grpc::SslServerCredentialsOptions options(GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
  options.pem_root_certs = ca_pem_;
  options.pem_key_cert_pairs.push_back({key_pem_, cert_pem_});
  return grpc::SslServerCredentials(options);
}

std::shared_ptr<grpc::ChannelCredentials> PeerTls::ChannelCredentials() const {
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = ca_pem_;
  options.pem_private_key = key_pem_;
  options.pem_cert_chain = cert_pem_;
  return grpc::SslCredentials(options);
}

absl::StatusOr<CertificateIdentity> PeerTls::VerifyPem(absl::string_view leaf_pem,
                                                       absl::string_view chain_pem) const {
  std::vector<UniqueX509> leaf = ParseCertificates(leaf_pem);
  if (leaf.empty()) return absl::UnauthenticatedError("the certificate is not PEM");
  UniqueStack untrusted(sk_X509_new_null());
  for (UniqueX509& c : ParseCertificates(chain_pem)) {
    // The chain property repeats the leaf: only the others are intermediates.
    if (X509_cmp(c.get(), leaf[0].get()) == 0) continue;
    sk_X509_push(untrusted.get(), c.release());
  }
  std::unique_ptr<X509_STORE_CTX, CtxDeleter> ctx(X509_STORE_CTX_new());
  if (ctx == nullptr ||
      X509_STORE_CTX_init(ctx.get(), store_->store, leaf[0].get(), untrusted.get()) != 1) {
    return absl::InternalError(absl::StrCat("X509_STORE_CTX_init: ", OpenSslErrors()));
  }
  X509_STORE_CTX_set_purpose(ctx.get(), X509_PURPOSE_SSL_CLIENT);
  if (X509_verify_cert(ctx.get()) != 1) {
    const int err = X509_STORE_CTX_get_error(ctx.get());
    ERR_clear_error();
    return absl::UnauthenticatedError(absl::StrCat(
        "certificate ", SubjectLine(leaf[0].get()), " is not accepted by this daemon's --tls_ca: ",
        X509_verify_cert_error_string(err)));
  }
  return IdentityOf(leaf[0].get());
}

absl::StatusOr<CertificateIdentity> PeerTls::VerifyCaller(const grpc::ServerContext& context) const {
  const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  const std::string from = context.peer();
  auto property = [&](const char* name) -> std::string {
    if (auth == nullptr) return "";
    std::vector<grpc::string_ref> values = auth->FindPropertyValues(name);
    return values.empty() ? "" : std::string(values[0].data(), values[0].size());
  };
  if (property(GRPC_TRANSPORT_SECURITY_TYPE_PROPERTY_NAME) != GRPC_SSL_TRANSPORT_SECURITY_TYPE) {
    return absl::UnauthenticatedError(
        absl::StrCat("the peer call from ", from, " did not come over TLS"));
  }
  const std::string leaf = property(GRPC_X509_PEM_CERT_PROPERTY_NAME);
  if (leaf.empty()) {
    return absl::UnauthenticatedError(absl::StrCat(
        "the peer call from ", from, " presented no client certificate: a daemon's peer calls "
        "need its certificate signed by the cluster's CA (--tls_cert/--tls_key/--tls_ca)"));
  }
  auto identity = VerifyPem(leaf, property(GRPC_X509_PEM_CERT_CHAIN_PROPERTY_NAME));
  if (!identity.ok()) {
    return absl::UnauthenticatedError(absl::StrCat("the peer call from ", from, " is refused: ",
                                                   identity.status().message()));
  }
  return identity;
}

}  // namespace hsap::cluster
