// The doorbell protocol of the session page (uroce_abi.h): a producer rings
// the daemon only while the daemon says it may be blocked. Both sides use
// these helpers, so the fences that make a lost wake-up impossible are
// written once.
#pragma once

#include <sys/socket.h>

#include <cerrno>
#include <atomic>
#include <cstdint>

#include "stack/abi/uroce_abi.h"

namespace uroce::abi {

inline std::atomic_ref<std::uint32_t> sleeping_word(uroce_session_page* p) {
  return std::atomic_ref<std::uint32_t>(p->daemon_sleeping);
}

/// One byte on a doorbell or completion-channel socket. Never blocks, even
/// if the other end cleared O_NONBLOCK on a shared description or stopped
/// reading: a full socket is already readable, so nothing is lost. Returns
/// false when the byte could not be queued for any other reason.
inline bool ring(int fd) {
  const char b = 1;
  return ::send(fd, &b, 1, MSG_DONTWAIT | MSG_NOSIGNAL) == 1 || errno == EAGAIN;
}

/// Whether `fd` is a Unix datagram socket: the only kind of descriptor the
/// daemon accepts to write to (a pipe or a file could block it, or fill a disk).
inline bool is_unix_dgram(int fd) {
  int type = 0, domain = 0;
  socklen_t len = sizeof type;
  if (::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_DGRAM) return false;
  len = sizeof domain;
  return ::getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) == 0 && domain == AF_UNIX;
}

/// Producer: call after publishing entries (and naming their queue in the
/// work ring, work_ring.h). Rings `doorbell` (one byte, non-blocking) when
/// the consumer has said it may block. Returns whether it rang.
inline bool notify(uroce_session_page* page, int doorbell) {
  if (!page) return false;
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (doorbell < 0) return false;
  if (sleeping_word(page).load(std::memory_order_relaxed) == 0) return false;
  (void)ring(doorbell);
  return true;
}

/// Producer, for a consumer before ABI minor 20 (no work ring): bumps the
/// page's posts word (so an awake consumer looks at this session's queues),
/// then notifies. Returns whether it rang.
inline bool bump_posts(uroce_session_page* page, int doorbell) {
  if (!page) return false;
  // Release: a consumer that sees the new count (acquire) sees the entries
  // published before it, even while it is awake and fences nothing.
  std::atomic_ref<std::uint32_t>(page->posts).fetch_add(1, std::memory_order_release);
  return notify(page, doorbell);
}

/// Consumer: announce that it may block. It must look at every ring once
/// more afterwards and block only if all are empty.
inline void announce_sleep(uroce_session_page* page) {
  sleeping_word(page).store(1, std::memory_order_relaxed);
  std::atomic_ref<std::uint32_t>(page->sleeps).store(page->sleeps + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

/// Consumer: awake again; producers stop ringing.
inline void announce_awake(uroce_session_page* page) { sleeping_word(page).store(0, std::memory_order_relaxed); }

/// Consumer: empties a doorbell socket (non-blocking). Returns the bytes read.
inline std::size_t drain(int doorbell) {
  char buf[64];
  std::size_t n = 0;
  for (;;) {
    const ssize_t r = ::recv(doorbell, buf, sizeof buf, MSG_DONTWAIT);
    if (r <= 0) return n;
    n += static_cast<std::size_t>(r);
  }
}

}  // namespace uroce::abi
