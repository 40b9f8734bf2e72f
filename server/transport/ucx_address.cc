#include "server/transport/ucx_address.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace hsap::transport {
namespace {

// Constants of UCX 1.13's src/ucp/wireup/address.c.
constexpr uint8_t kVersionMask = 0x0f;
constexpr uint8_t kVersionV1 = 0, kVersionV2 = 1;
constexpr int kHeaderFlagsShiftV1 = 4;
constexpr uint8_t kHeaderDebugInfo = 0x1, kHeaderWorkerUuid = 0x2, kHeaderClientId = 0x4;
constexpr uint8_t kNullResource = 0xff;
constexpr uint8_t kMdEmptyDevice = 0x80;
constexpr uint8_t kMdMaskV1 = 0x1f, kMdMaskV2 = 0x7f;
constexpr uint8_t kFlagLast = 0x80;
constexpr uint8_t kDeviceNumPaths = 0x40, kDeviceSysDevice = 0x20, kDeviceLenMask = 0x1f;
constexpr uint8_t kIfaceHasEpAddress = 0x40, kIfaceLenMask = 0x3f;
constexpr int kMaxDevices = 64;

// A bounds-checked reader over the address bytes.
class Reader {
 public:
  explicit Reader(absl::string_view bytes) : bytes_(bytes) {}
  size_t offset() const { return at_; }
  bool done() const { return at_ == bytes_.size(); }

  // The next byte, not consumed.
  absl::StatusOr<uint8_t> Peek(absl::string_view what) const {
    if (at_ >= bytes_.size()) return Short(what, 1);
    return static_cast<uint8_t>(bytes_[at_]);
  }
  absl::StatusOr<uint8_t> Byte(absl::string_view what) {
    if (at_ >= bytes_.size()) return Short(what, 1);
    return static_cast<uint8_t>(bytes_[at_++]);
  }
  absl::StatusOr<uint16_t> U16(absl::string_view what) {
    if (bytes_.size() - at_ < 2) return Short(what, 2);
    const uint16_t v = static_cast<uint8_t>(bytes_[at_]) |
                       (static_cast<uint16_t>(static_cast<uint8_t>(bytes_[at_ + 1])) << 8);
    at_ += 2;
    return v;
  }
  // The `n` bytes at the current offset (REQUIRES: that many remain).
  absl::string_view Ahead(size_t n) const { return bytes_.substr(at_, n); }
  absl::Status Skip(size_t n, absl::string_view what) {
    if (bytes_.size() - at_ < n) return Short(what, n);
    at_ += n;
    return absl::OkStatus();
  }
  // UCX's "byte extended" value: `mask` bits of the byte; in v2 the value
  // `mask` itself means the real value follows in the next byte.
  absl::StatusOr<uint32_t> Extended(uint8_t first, uint8_t mask, uint8_t version,
                                    absl::string_view what) {
    uint32_t value = first & mask;
    if (version != kVersionV1 && value == mask) {
      absl::StatusOr<uint8_t> next = Byte(what);
      if (!next.ok()) return next.status();
      value = *next;
    }
    return value;
  }

 private:
  absl::Status Short(absl::string_view what, size_t n) const {
    return absl::InvalidArgumentError(absl::StrCat("ucx_worker_address ends at byte ", at_, " of ",
                                                   bytes_.size(), " inside ", what, " (", n,
                                                   " more byte(s) needed)"));
  }
  absl::string_view bytes_;
  size_t at_ = 0;
};

absl::Status Bad(const Reader& r, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("ucx_worker_address: ", what, " (at byte ", r.offset(), ")"));
}

// v1's packed interface attributes start with three floats (overhead and
// latency in seconds, bandwidth in bytes/s) that UCX's lane selection turns
// into a score it asserts to be >= 0: a NaN, a negative or an infinite
// value aborts the process (select.c: "Assertion `(score >= 0.0) ...'
// failed", found by feeding UCX addresses with random attribute bytes).
absl::Status CheckAttributesV1(const Reader& r, absl::string_view attributes) {
  float overhead, bandwidth, latency;
  std::memcpy(&overhead, attributes.data(), 4);
  std::memcpy(&bandwidth, attributes.data() + 4, 4);
  std::memcpy(&latency, attributes.data() + 8, 4);
  const bool ok = std::isfinite(overhead) && std::isfinite(latency) && std::isfinite(bandwidth) &&
                  overhead >= 0 && overhead <= 1 && latency >= 0 && latency <= 1 &&
                  bandwidth > 0 && bandwidth <= 1e15f;
  if (!ok) {
    return Bad(r, absl::StrCat("interface attributes out of range: overhead ", overhead,
                               " s, latency ", latency, " s (each 0 to 1), bandwidth ", bandwidth,
                               " B/s (above 0, at most 1e15)"));
  }
  return absl::OkStatus();
}

// One device and its interfaces.
absl::Status ParseDevice(Reader& r, uint8_t version, size_t attribute_bytes,
                         UcxAddressLayout* out, bool* last_device) {
  HSAP_ASSIGN_OR_RETURN(const auto md, r.Byte("the md index"));
  const bool empty = (md & kMdEmptyDevice) != 0;
  HSAP_RETURN_IF_ERROR(
      r.Extended(md, version == kVersionV1 ? kMdMaskV1 : kMdMaskV2, version, "the md index")
          .status());
  HSAP_ASSIGN_OR_RETURN(const auto dev, r.Byte("the device address length"));
  *last_device = (dev & kFlagLast) != 0;
  HSAP_ASSIGN_OR_RETURN(const auto dev_len, r.Extended(dev, kDeviceLenMask, version, "the device address length"));
  if (dev & kDeviceNumPaths) HSAP_RETURN_IF_ERROR(r.Skip(1, "the number of paths"));
  if (dev & kDeviceSysDevice) HSAP_RETURN_IF_ERROR(r.Skip(1, "the system device"));
  HSAP_RETURN_IF_ERROR(r.Skip(dev_len, "a device address"));
  bool last_iface = empty;
  while (!last_iface) {
    if (static_cast<int>(out->interfaces.size()) >= kMaxUcxInterfaces) {
      return Bad(r, absl::StrCat("more than ", kMaxUcxInterfaces, " interfaces"));
    }
    UcxAddressInterface iface;
    HSAP_ASSIGN_OR_RETURN(const auto checksum, r.U16("a transport name checksum"));
    iface.tl_name_checksum = checksum;
    iface.device_address_bytes = dev_len;
    if (version == kVersionV1 && attribute_bytes >= 12 && r.Ahead(attribute_bytes).size() >= 12) {
      HSAP_RETURN_IF_ERROR(CheckAttributesV1(r, r.Ahead(attribute_bytes)));
    }
    HSAP_RETURN_IF_ERROR(r.Skip(attribute_bytes, "interface attributes"));
    HSAP_ASSIGN_OR_RETURN(const auto len, r.Byte("an interface address length"));
    last_iface = (len & kFlagLast) != 0;
    if (len & kIfaceHasEpAddress) return Bad(r, "an endpoint address (a worker address has none)");
    HSAP_ASSIGN_OR_RETURN(const auto iface_len, r.Extended(len, kIfaceLenMask, version, "an interface address length"));
    iface.interface_address_bytes = iface_len;
    HSAP_RETURN_IF_ERROR(r.Skip(iface_len, "an interface address"));
    out->interfaces.push_back(iface);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<UcxAddressLayout> ParseUcxAddress(absl::string_view address,
                                                 size_t attribute_bytes) {
  if (address.size() < kMinUcxAddressBytes || address.size() > kMaxUcxAddressBytes) {
    return absl::InvalidArgumentError(absl::StrCat("ucx_worker_address has ", address.size(),
                                                   " bytes; a UCX worker address has ",
                                                   kMinUcxAddressBytes, " to ",
                                                   kMaxUcxAddressBytes));
  }
  Reader r(address);
  UcxAddressLayout out;
  out.attribute_bytes = attribute_bytes;
  HSAP_ASSIGN_OR_RETURN(const auto header, r.Byte("the header"));
  out.version = header & kVersionMask;
  if (out.version == kVersionV1) {
    out.header_flags = header >> kHeaderFlagsShiftV1;
  } else if (out.version == kVersionV2) {
    HSAP_ASSIGN_OR_RETURN(const auto flags, r.Byte("the header flags"));
    out.header_flags = flags;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "ucx_worker_address has format version ", out.version,
        " (first byte 0x", absl::Hex(header, absl::kZeroPad2), "); UCX knows only 0 and 1"));
  }
  if (out.header_flags & kHeaderWorkerUuid) HSAP_RETURN_IF_ERROR(r.Skip(8, "the worker uuid"));
  if (out.header_flags & kHeaderClientId) HSAP_RETURN_IF_ERROR(r.Skip(8, "the client id"));
  if (out.header_flags & kHeaderDebugInfo) {
    HSAP_ASSIGN_OR_RETURN(const auto name_len, r.Byte("the worker name length"));
    HSAP_RETURN_IF_ERROR(r.Skip(name_len, "the worker name"));
  }
  HSAP_ASSIGN_OR_RETURN(const auto first, r.Peek("the device list"));
  if (first == kNullResource) return Bad(r, "no transport at all (an empty device list)");
  bool last_device = false;
  while (!last_device) {
    if (out.num_devices >= kMaxDevices) return Bad(r, absl::StrCat("more than ", kMaxDevices, " devices"));
    HSAP_RETURN_IF_ERROR(ParseDevice(r, out.version, attribute_bytes, &out, &last_device));
    ++out.num_devices;
  }
  if (!r.done()) {
    return Bad(r, absl::StrCat("the device list ends but ", address.size() - r.offset(),
                               " byte(s) follow"));
  }
  return out;
}

absl::StatusOr<UcxAddressLayout> ParseOwnUcxAddress(absl::string_view address) {
  absl::Status first_error;
  for (size_t attribute_bytes : {16, 17, 8, 9}) {
    auto layout = ParseUcxAddress(address, attribute_bytes);
    if (layout.ok()) {
      const bool v1 = layout->version == kVersionV1;
      if ((v1 && attribute_bytes >= 16) || (!v1 && attribute_bytes < 16)) return layout;
    } else if (first_error.ok()) {
      first_error = layout.status();
    }
  }
  return absl::InternalError(absl::StrCat(
      "this worker's own UCX address (", address.size(),
      " bytes) does not parse as UCX 1.13's packed format: ", first_error.message()));
}

absl::Status ValidatePeerUcxAddress(absl::string_view peer, const UcxAddressLayout& own) {
  auto layout = ParseUcxAddress(peer, own.attribute_bytes);
  if (!layout.ok()) return layout.status();
  if (layout->version != own.version || layout->header_flags != own.header_flags) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ucx_worker_address has format version ", layout->version, " with header flags 0x",
        absl::Hex(layout->header_flags), " but this node's UCX packs version ", own.version,
        " with flags 0x", absl::Hex(own.header_flags),
        " (every node must run the same UCX build and configuration)"));
  }
  int shared = 0;
  for (const UcxAddressInterface& theirs : layout->interfaces) {
    bool known = false, device_ok = false, iface_ok = false;
    uint32_t want_iface = 0;
    for (const UcxAddressInterface& mine : own.interfaces) {
      if (mine.tl_name_checksum != theirs.tl_name_checksum) continue;
      known = true;
      want_iface = mine.interface_address_bytes;
      device_ok |= mine.device_address_bytes == theirs.device_address_bytes;
      iface_ok |= mine.interface_address_bytes == theirs.interface_address_bytes;
    }
    if (!known) continue;  // a transport this node lacks: UCX ignores it
    ++shared;
    if (!iface_ok || !device_ok) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ucx_worker_address: transport 0x", absl::Hex(theirs.tl_name_checksum), " has a ",
          theirs.device_address_bytes, "-byte device address and a ",
          theirs.interface_address_bytes, "-byte interface address, but this node packs ",
          want_iface, "-byte interface addresses for it and other device-address sizes"));
    }
  }
  if (shared == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ucx_worker_address lists ", layout->interfaces.size(),
        " interface(s), none of a transport this node has (no transport in common)"));
  }
  return absl::OkStatus();
}

}  // namespace hsap::transport
