// Sending file descriptors over a Unix socket (SCM_RIGHTS): the one sender
// of the session protocol's fd transfers (client/cpp, the session socket's
// tests and fuzzer, the hardening tests).
#ifndef HSAP_COMMON_FD_PASSING_H_
#define HSAP_COMMON_FD_PASSING_H_

#include <sys/socket.h>
#include <sys/types.h>

#include <cstring>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace hsap {

// Sends `bytes` as one message on `socket` with `fds` attached (none: a plain
// message); `flags` go to sendmsg (MSG_DONTWAIT, MSG_NOSIGNAL, ...). Returns
// what sendmsg returns: the bytes sent, or -1 with errno set.
inline ssize_t SendWithFds(int socket, absl::string_view bytes, absl::Span<const int> fds,
                           int flags) {
  iovec iov = {const_cast<char*>(bytes.data()), bytes.size()};
  msghdr msg = {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<char> control;
  if (!fds.empty()) {
    // CMSG_SPACE is a multiple of cmsghdr's alignment; the vector's storage
    // comes from operator new, aligned for any fundamental type.
    control.assign(CMSG_SPACE(sizeof(int) * fds.size()), 0);
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    cmsghdr* cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(cm), fds.data(), sizeof(int) * fds.size());
  }
  return sendmsg(socket, &msg, flags);
}

}  // namespace hsap

#endif  // HSAP_COMMON_FD_PASSING_H_
