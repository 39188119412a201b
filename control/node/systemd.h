// The daemon's side of systemd's notification protocol (sd_notify(3)):
// READY=1 once the node is started (ports up, sockets listening), STATUS=
// lines, STOPPING=1 on the way out, and WATCHDOG=1 while every pipeline
// turns (watchdog.h). Without $NOTIFY_SOCKET (not under systemd, or not
// Type=notify) every call does nothing.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "control/node/watchdog.h"

namespace uroce::control {

class SystemdNotify {
 public:
  /// Reads $WATCHDOG_USEC (sd_watchdog_enabled) for the watchdog's timeout.
  SystemdNotify();
  void ready(const std::string& status);
  void status(const std::string& status);
  void stopping();
  /// A reload (SIGHUP, systemctl reload): RELOADING=1 with the monotonic
  /// time systemd asks for, then READY=1 once it is done.
  void reloading();
  /// From the main loop: feeds the watchdog when it is due and every
  /// pipeline made passes; logs a stalled pipeline once per stall.
  void tick(std::uint64_t now_ns, std::span<const std::uint64_t> passes);
  [[nodiscard]] const Watchdog& watchdog() const { return wd_; }

 private:
  Watchdog wd_;
  bool stalled_ = false;
};

}  // namespace uroce::control
