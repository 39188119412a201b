// The node's log: one line an event on stderr, with its time, level,
// message and fields. As logfmt (ts=... level=info msg="..." key=value),
// or with --log-format json one JSON object a line, for journald and log
// shippers. What a peer or an application can set off goes through a
// LogLimit, so that a flood of it costs a few lines a second, and the
// lines it holds back are counted on the next one it lets through.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "control/node/rate.h"

namespace uroce::control {

enum class LogFormat { kText, kJson };

/// From --log-level and --log-format (one node a process).
void set_log(int level, LogFormat format);

/// A line at `level` (0 debug, 1 info, 2 warn, 3 error) if the node's
/// level lets it through. `kv` is logfmt: key=value pairs, a value with a
/// space or a quote in double quotes (log_value makes one).
void log(int level, const std::string& msg, const std::string& kv = "");

/// One line as the format has it (ts an RFC 3339 time): what log() writes.
std::string format_log(LogFormat format, std::string_view ts, int level, std::string_view msg, std::string_view kv);

/// A value for a logfmt field: quoted and escaped when it needs to be.
std::string log_value(std::string_view v);

/// A token bucket for log lines: `per_s` a second, bursts of `burst`.
class LogLimit {
 public:
  LogLimit(double per_s, double burst) : bucket_(per_s, burst) {}
  /// Whether a line may go out at `now_ns`; when it may after some were
  /// held back, *suppressed says how many (else 0).
  bool allow(std::uint64_t now_ns, std::uint64_t* suppressed);

 private:
  TokenBucket bucket_;
  std::uint64_t held_ = 0;
};

}  // namespace uroce::control
