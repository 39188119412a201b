// Accepting on a listening socket without spinning when accepts fail. A
// process out of descriptors (EMFILE) cannot take the connection that waits,
// so the listening socket stays readable and an accept loop would spin on
// it. AcceptGuard keeps one descriptor in reserve: on EMFILE it gives it up,
// takes the waiting connection and closes it (its client sees the close at
// once), then takes the reserve back. After any failed accept the caller
// waits pause() before accepting again.
#pragma once

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>

namespace uroce::control {

class AcceptGuard {
 public:
  AcceptGuard() : reserve_(::open("/dev/null", O_RDONLY | O_CLOEXEC)) {}
  ~AcceptGuard() {
    if (reserve_ >= 0) ::close(reserve_);
  }
  AcceptGuard(const AcceptGuard&) = delete;
  AcceptGuard& operator=(const AcceptGuard&) = delete;

  /// After an accept on `listen_fd` failed with `err` (an errno value).
  void failed(int listen_fd, int err) {
    ++errors_;
    if ((err != EMFILE && err != ENFILE) || reserve_ < 0) return;
    ::close(reserve_);
    const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd >= 0) {
      ::close(fd);
      ++dropped_;
    }
    reserve_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  }
  /// How long to wait after a failure before the next accept.
  static constexpr std::chrono::milliseconds pause() { return std::chrono::milliseconds(10); }
  /// Every server's handling of an accept's error `ec` (an Asio
  /// error_code): false when there is none; else, shed at EMFILE, arm
  /// `timer` to call `again` after pause() (never a spin), and true.
  template <class Ec, class Timer, class Again>
  bool retry_on_failure(const Ec& ec, int listen_fd, Timer& timer, Again again) {
    if (!ec) return false;
    failed(listen_fd, ec.value());
    timer.expires_after(pause());
    timer.async_wait([again](const Ec& e) {
      if (!e) again();
    });
    return true;
  }
  [[nodiscard]] std::uint64_t errors() const { return errors_; }
  [[nodiscard]] std::uint64_t dropped() const { return dropped_; }

 private:
  int reserve_;
  std::uint64_t errors_ = 0, dropped_ = 0;
};

}  // namespace uroce::control
