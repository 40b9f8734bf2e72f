// The HSAP release, reported by hsapd, hsapctl and the session handshake.
#ifndef HSAP_COMMON_VERSION_H_
#define HSAP_COMMON_VERSION_H_

namespace hsap {
inline constexpr char kVersion[] = "0.1.0";
}  // namespace hsap

#endif  // HSAP_COMMON_VERSION_H_
