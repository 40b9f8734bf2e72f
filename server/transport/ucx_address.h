// Validation of a peer's UCX worker address before UCX sees it.
//
// UCX's unpacker (src/ucp/wireup/address.c, ucp_address_unpack) trusts its
// input: it has no length argument, reads as far as the bytes say, and
// aborts the process on an unknown format version
// (`Assertion '*addr_version == UCP_OBJECT_VERSION_V2' failed`, reached
// with 8 bytes of 0xff). UCX's public API has no bounded unpack either
// (ucp_worker_address_query takes no length and asserts the same way), so
// the daemon walks the packed layout itself, with every read bounds-checked,
// and hands UCX only addresses that
//  * are kMinUcxAddressBytes..kMaxUcxAddressBytes long,
//  * carry the same header (format version and flags) as this worker's own
//    address (every node runs the same UCX build and configuration),
//  * parse completely: header, worker uuid / client id / name as the flags
//    say, then devices (md index, device address length with its flags,
//    paths, system device, device address) each with its interfaces
//    (transport-name checksum, packed attributes, interface address length
//    and flags, interface address), the LAST flags ending both lists
//    exactly at the final byte; at most kMaxUcxInterfaces interfaces and no
//    endpoint addresses (a worker address has none);
//  * give, for every transport this worker also has (same name checksum),
//    the same interface-address length and one of the device-address
//    lengths this worker packs for it (transports read those fields at
//    their own fixed sizes). Transports this worker lacks are allowed: UCX
//    ignores them; but at least one transport must be shared;
//  * (v1) carry packed interface attributes UCX can score: overhead and
//    latency finite in [0, 1] s, bandwidth finite in (0, 1e15] B/s (a NaN or
//    negative one aborts UCX's lane selection).
// The layout is UCX 1.13's (address format v1 and v2, non-unified mode);
// the size of the packed interface attributes is learnt from this worker's
// own address, which must itself parse (ParseUcxAddress) — a UCX whose
// format differs fails loudly at start-up, not on a peer's input.
#ifndef HSAP_SERVER_TRANSPORT_UCX_ADDRESS_H_
#define HSAP_SERVER_TRANSPORT_UCX_ADDRESS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace hsap::transport {

inline constexpr size_t kMinUcxAddressBytes = 8;
inline constexpr size_t kMaxUcxAddressBytes = 8192;
inline constexpr int kMaxUcxInterfaces = 64;

// One interface of a parsed address.
struct UcxAddressInterface {
  uint16_t tl_name_checksum = 0;
  uint32_t device_address_bytes = 0;
  uint32_t interface_address_bytes = 0;
};

// The skeleton of a packed worker address (no pointers into it).
struct UcxAddressLayout {
  uint8_t version = 0;       // 0 = v1, 1 = v2
  uint8_t header_flags = 0;  // debug info, worker uuid, client id, AM only
  size_t attribute_bytes = 0;  // packed interface attributes per interface
  int num_devices = 0;
  std::vector<UcxAddressInterface> interfaces;
};

// Parses `address` with `attribute_bytes` of packed attributes per
// interface. INVALID_ARGUMENT naming the byte offset and what was wrong.
absl::StatusOr<UcxAddressLayout> ParseUcxAddress(absl::string_view address,
                                                 size_t attribute_bytes);

// Parses this worker's own address, trying the attribute sizes UCX 1.13
// packs (v1: 16 or 17 bytes, v2: 8 or 9); INTERNAL when none fits (a UCX
// whose format this code does not know).
absl::StatusOr<UcxAddressLayout> ParseOwnUcxAddress(absl::string_view address);

// OK iff `peer` may be given to ucp_ep_create on a worker whose own address
// parsed as `own` (see the file comment). INVALID_ARGUMENT names the rule
// broken and the values. Pure; thread-safe.
absl::Status ValidatePeerUcxAddress(absl::string_view peer, const UcxAddressLayout& own);

}  // namespace hsap::transport

#endif  // HSAP_SERVER_TRANSPORT_UCX_ADDRESS_H_
