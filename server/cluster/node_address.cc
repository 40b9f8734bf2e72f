#include "server/cluster/node_address.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace hsap::cluster {

absl::Status ValidateNodeAddress(absl::string_view field, absl::string_view address) {
  const std::string shown(address.substr(0, 64));
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(field, " is '", shown,
                                                   address.size() > 64 ? "...'" : "'", ": ", why,
                                                   " (a daemon's address is <host>:<port>)"));
  };
  if (address.size() < 3 || address.size() > kMaxNodeAddressBytes) {
    return bad(absl::StrCat("has ", address.size(), " bytes; 3 to ", kMaxNodeAddressBytes));
  }
  for (char c : address) {
    if (c <= 0x20 || c > 0x7e) return bad("holds a space or a non-printable character");
  }
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos || colon == 0) return bad("has no host:port");
  const absl::string_view port = address.substr(colon + 1);
  int value = 0;
  if (port.empty() || port.size() > 5) return bad("has no port number");
  for (char c : port) {
    if (c < '0' || c > '9') return bad("has no port number");
    value = value * 10 + (c - '0');
  }
  if (value < 1 || value > 65535) return bad("has a port outside 1..65535");
  return absl::OkStatus();
}

}  // namespace hsap::cluster
