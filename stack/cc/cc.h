// The congestion-control interface: one small class per algorithm, one
// object per QP, fed by the engine's hooks and read back as a rate and a
// window.
//
// Dispatch is per QP, through a virtual call on each hook. The engine keeps
// no object for a QP without congestion control ("none"): every hook is
// then one branch on a null pointer, and the pacer and window are as
// before. docs/research.md gives the instructions per packet of each
// choice, and how to add an algorithm (one file, one line in registry.cc).
//
// Hooks run on the QP's pipeline, on the data path: they must not allocate,
// lock or block. Time is the engine's clock, in ns.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

namespace uroce::cc {

/// What an algorithm knows of its QP's path, fixed when it is made.
struct Path {
  std::uint64_t line_rate_bps = 100'000'000'000;  // the port's rate
  std::uint32_t mtu = 1024;                       // payload bytes in a full packet
  std::uint32_t max_window = 512;                 // the engine's own cap on packets in flight
  std::uint64_t base_rtt_ns = 0;                  // the path's unloaded round trip, if known (0: measure it)
};

/// What the algorithm asks of the requester; 0 means no limit.
struct Limits {
  std::uint64_t rate_bps = 0;  // pacing rate of request frames (Ethernet header to ICRC)
  std::uint32_t window = 0;    // request packets in flight
};

/// The algorithm's state as telemetry shows it; a field it does not keep is 0.
struct State {
  double rate_bps = 0;    // current rate (DCQCN's Rc)
  double target_bps = 0;  // target rate (DCQCN's Rt)
  double alpha = 0;       // DCQCN's congestion estimate
  double window = 0;      // congestion window in packets (may be fractional)
};

class Algorithm {
 public:
  virtual ~Algorithm() = default;
  [[nodiscard]] virtual std::string_view name() const = 0;

  /// A request packet of `bytes` frame bytes left (new or resent).
  virtual void on_tx(std::uint64_t /*now*/, std::uint32_t /*bytes*/) {}
  /// The oldest unacknowledged PSN moved on by `pkts` (an ACK, a READ
  /// response or an atomic ACK).
  virtual void on_ack(std::uint64_t /*now*/, std::uint32_t /*pkts*/) {}
  /// A PSN sequence error NAK: the responder saw a gap (a loss).
  virtual void on_nak(std::uint64_t /*now*/) {}
  /// A CNP for this QP arrived from its peer (the reaction point's input).
  virtual void on_cnp(std::uint64_t /*now*/) {}
  /// This QP received a CE-marked packet (the notification point's input).
  virtual void on_ce(std::uint64_t /*now*/) {}
  /// A round-trip sample: a request packet that asked for an ACK, from the
  /// time it was first sent to the time its acknowledgement arrived.
  virtual void on_rtt(std::uint64_t /*now*/, std::uint64_t /*rtt_ns*/) {}
  /// The retransmit timer expired.
  virtual void on_timeout(std::uint64_t /*now*/) {}
  /// The algorithm's own timer, once next_timer() has passed.
  virtual void on_timer(std::uint64_t /*now*/) {}
  /// When on_timer is next due (ns), or 0 when no timer is armed.
  [[nodiscard]] virtual std::uint64_t next_timer() const { return 0; }
  [[nodiscard]] virtual State state() const = 0;

  /// Written by the hooks; the engine reads it after each.
  Limits limits;
};

/// Makes an algorithm for one QP (control path: may allocate).
using Factory = std::unique_ptr<Algorithm> (*)(const Path&);

struct Entry {
  std::string_view name;
  std::string_view about;
  Factory make;  // nullptr for "none"
  bool ud = false;  // it needs only CNPs (no ACKs), so it serves a UD QP too
};

/// Every algorithm there is, "none" first.
std::span<const Entry> registry();
/// The entry of that name, or nullptr.
const Entry* find(std::string_view name);
/// Why a UD QP refuses the algorithm `name` (one that needs ACKs), naming
/// those it takes: the message for Engine::set_cc's EOPNOTSUPP.
std::string ud_refusal(std::string_view name);

/// Round-trip samples of one QP: min, mean and a log-linear histogram for
/// the percentiles (4 buckets per power of two, so within 19%), in fixed
/// storage.
class RttStats {
 public:
  void add(std::uint64_t ns);
  [[nodiscard]] std::uint64_t count() const { return n_; }
  [[nodiscard]] std::uint64_t min() const { return n_ ? min_ : 0; }
  [[nodiscard]] std::uint64_t max() const { return max_; }
  [[nodiscard]] std::uint64_t mean() const { return n_ ? sum_ / n_ : 0; }
  /// The q-quantile (0 < q <= 1): the upper edge of its bucket, capped by the largest sample.
  [[nodiscard]] std::uint64_t quantile(double q) const;
  [[nodiscard]] std::uint64_t last() const { return last_; }

 private:
  static constexpr int kSub = 4;
  static constexpr int kBuckets = 64 * kSub;
  static int bucket(std::uint64_t ns);
  static std::uint64_t upper(int b);
  // The scalars first: with the histogram's first buckets in their line.
  std::uint64_t n_ = 0, sum_ = 0, min_ = 0, max_ = 0, last_ = 0;
  std::array<std::uint32_t, kBuckets> hist_{};
};

}  // namespace uroce::cc
