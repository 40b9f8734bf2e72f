// CertificateIdentity::NamesHost: the names a certificate backs (what a
// peer may claim to be). Never more than OpenSSL's and gRPC's own host
// checks accept; the cases peer_tls_fuzzer found are at the end.
#include "server/cluster/peer_tls.h"

#include "gtest/gtest.h"

namespace hsap::cluster {
namespace {

CertificateIdentity With(std::vector<std::string> dns, std::vector<std::string> ips = {}) {
  CertificateIdentity id;
  id.subject = "/CN=test";
  id.dns = std::move(dns);
  id.ips = std::move(ips);
  return id;
}

TEST(NamesHostTest, IpAddressesCompareAsAddresses) {
  const CertificateIdentity id = With({}, {"127.0.0.2", "2001:db8::1"});
  EXPECT_TRUE(id.NamesHost("127.0.0.2"));
  EXPECT_FALSE(id.NamesHost("127.0.0.3"));
  EXPECT_TRUE(id.NamesHost("2001:DB8:0:0:0:0:0:1"));
  EXPECT_FALSE(id.NamesHost("::ffff:127.0.0.2"));  // another address family
  EXPECT_TRUE(id.NamesHostOf("127.0.0.2:7070"));
  EXPECT_TRUE(id.NamesHostOf("[2001:db8::1]:7070"));
  EXPECT_FALSE(id.NamesHostOf("127.0.0.3:7070"));
}

TEST(NamesHostTest, DnsNamesMatchExactlyIgnoringCase) {
  const CertificateIdentity id = With({"node-1.hsap.svc"});
  EXPECT_TRUE(id.NamesHost("node-1.hsap.svc"));
  EXPECT_TRUE(id.NamesHost("NODE-1.Hsap.SVC"));
  EXPECT_FALSE(id.NamesHost("node-2.hsap.svc"));
  EXPECT_FALSE(id.NamesHost("hsap.svc"));
  EXPECT_FALSE(id.NamesHost("x.node-1.hsap.svc"));
  EXPECT_FALSE(id.NamesHost("node-1.hsap.svc."));  // stricter than the libraries
  EXPECT_FALSE(id.NamesHost(""));
}

TEST(NamesHostTest, AWildcardStandsForOneLabel) {
  const CertificateIdentity id = With({"*.hsap.svc"});
  EXPECT_TRUE(id.NamesHost("node-7.hsap.svc"));
  EXPECT_TRUE(id.NamesHost("NODE-7.HSAP.svc"));
  EXPECT_FALSE(id.NamesHost("a.node-7.hsap.svc"));
  EXPECT_FALSE(id.NamesHost("hsap.svc"));
  EXPECT_FALSE(id.NamesHost(".hsap.svc"));
  EXPECT_FALSE(id.NamesHost("*.hsap.svc"));  // a claim of a literal "*"
  EXPECT_FALSE(id.NamesHost("node_7.hsap.svc"));
}

// Found by peer_tls_fuzzer against OpenSSL's X509_check_host and gRPC's
// check: NamesHost accepted these.
TEST(NamesHostTest, NoWildcardThatTheTlsLibrariesRefuse) {
  EXPECT_FALSE(With({"*.com"}).NamesHost("a.com"));            // one label after "*"
  EXPECT_FALSE(With({"*.*.hsap"}).NamesHost("node-7.*.hsap"));  // a second "*"
  EXPECT_FALSE(With({"a*.hsap.svc"}).NamesHost("ab.hsap.svc"));  // partial
  EXPECT_FALSE(With({"*.hsap..svc"}).NamesHost("a.hsap..svc"));  // an empty label
  EXPECT_FALSE(With({"*.hsap_x.svc"}).NamesHost("a.hsap_x.svc"));
  // A label after the "*" that ends or starts with '-' (seed 8101, 2026-12-06:
  // tests/fuzz/corpus/peer_tls_fuzzer/e7d008b9).
  EXPECT_FALSE(With({"*.C.omexp-"}).NamesHost("node-7.C.omexp-"));
  EXPECT_FALSE(With({"*.-c.hsap"}).NamesHost("node-7.-c.hsap"));
  EXPECT_FALSE(With({"*.c-.hsap"}).NamesHost("node-7.c-.hsap"));
  // A '-' inside a label stays valid, and so does one the "*" stands for.
  EXPECT_TRUE(With({"*.c-d.hsap"}).NamesHost("node-7.c-d.hsap"));
  EXPECT_TRUE(With({"*.c.hsap"}).NamesHost("-node-.c.hsap"));
}

}  // namespace
}  // namespace hsap::cluster
