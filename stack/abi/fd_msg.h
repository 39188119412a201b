// One message on a Unix stream socket with file descriptors riding along
// (SCM_RIGHTS): how the session protocol hands over ring and buffer memory.
// Used by both liburoce and uroced's session server.
#pragma once

#include <sys/socket.h>
#include <sys/types.h>

#include <cstddef>
#include <cstring>

namespace uroce::abi {

inline constexpr std::size_t kMaxFdsPerMsg = 16;  // REG_MR_PIECES' most (UROCE_MR_MAX_PIECES)

/// sendmsg of `len` bytes, with the descriptors `fds[0..nfds)` attached
/// (at most kMaxFdsPerMsg; negative ones are skipped). `flags` add to
/// MSG_NOSIGNAL (the daemon passes MSG_DONTWAIT).
inline ssize_t send_with_fds(int sock, const void* buf, std::size_t len, const int* fds, std::size_t nfds,
                             int flags = 0) {
  iovec iov{const_cast<void*>(buf), len};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int) * kMaxFdsPerMsg)];
  int pass[kMaxFdsPerMsg];
  std::size_t k = 0;
  for (std::size_t i = 0; i < nfds && k < kMaxFdsPerMsg; ++i)
    if (fds[i] >= 0) pass[k++] = fds[i];
  if (k > 0) {
    mh.msg_control = ctrl;
    mh.msg_controllen = CMSG_SPACE(sizeof(int) * k);
    std::memset(ctrl, 0, mh.msg_controllen);  // the padding after the descriptors too
    cmsghdr* c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * k);
    std::memcpy(CMSG_DATA(c), pass, sizeof(int) * k);
  }
  return ::sendmsg(sock, &mh, MSG_NOSIGNAL | flags);
}

/// sendmsg of `len` bytes, with descriptor `fd` attached when fd >= 0.
inline ssize_t send_with_fd(int sock, const void* buf, std::size_t len, int fd) {
  return send_with_fds(sock, buf, len, &fd, 1);
}

/// recvmsg into `buf`; every descriptor that came with the bytes is handed to
/// `on_fd` (which owns it from then on). Descriptors are close-on-exec.
template <class OnFd>
ssize_t recv_with_fds(int sock, void* buf, std::size_t len, int flags, OnFd&& on_fd) {
  iovec iov{buf, len};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int) * kMaxFdsPerMsg)];
  mh.msg_control = ctrl;
  mh.msg_controllen = sizeof ctrl;
  const ssize_t n = ::recvmsg(sock, &mh, flags | MSG_CMSG_CLOEXEC);
  if (n <= 0) return n;
  for (cmsghdr* c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const std::size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (std::size_t i = 0; i < k; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      on_fd(fd);
    }
  }
  return n;
}

}  // namespace uroce::abi
