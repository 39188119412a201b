#include "control/node/systemd.h"

#include <systemd/sd-daemon.h>
#include <time.h>

#include "control/node/node.h"

namespace uroce::control {

namespace {
std::uint64_t watchdog_timeout_ns() {
  std::uint64_t usec = 0;
  return sd_watchdog_enabled(0, &usec) > 0 ? usec * 1000 : 0;
}
}  // namespace

SystemdNotify::SystemdNotify() : wd_(watchdog_timeout_ns()) {
  if (wd_.enabled())
    log(1, "systemd watchdog: fed while every pipeline turns", "timeout_ms=" + std::to_string(wd_.timeout_ns() / 1'000'000));
}

void SystemdNotify::ready(const std::string& s) { (void)sd_notify(0, ("READY=1\nSTATUS=" + s).c_str()); }

void SystemdNotify::status(const std::string& s) { (void)sd_notify(0, ("STATUS=" + s).c_str()); }

void SystemdNotify::reloading() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);
  const auto usec = static_cast<unsigned long long>(t.tv_sec) * 1000000ull + static_cast<unsigned long long>(t.tv_nsec) / 1000;
  (void)sd_notify(0, ("RELOADING=1\nMONOTONIC_USEC=" + std::to_string(usec) + "\nSTATUS=reloading").c_str());
}

void SystemdNotify::stopping() { (void)sd_notify(0, "STOPPING=1\nSTATUS=stopping: flushing QPs"); }

void SystemdNotify::tick(std::uint64_t now, std::span<const std::uint64_t> passes) {
  const std::uint64_t stalls = wd_.stalls();
  if (wd_.due(now, passes)) {
    (void)sd_notify(0, "WATCHDOG=1");
    if (stalled_) log(1, "systemd watchdog: every pipeline turns again");
    stalled_ = false;
  } else if (wd_.stalls() != stalls && !stalled_) {
    stalled_ = true;
    log(3, "systemd watchdog: a pipeline made no pass; not feeding the watchdog",
        "pipeline=" + std::to_string(wd_.stalled_pipeline()));
  }
}

}  // namespace uroce::control
