// perftest's out-of-band TCP exchange, so that real perftest (ib_write_bw and
// friends, default mode: TCP port 18515, not -R) can be uroce-perf's peer.
//
// The facts come from reading perftest's sources and Debian 12's binaries
// (perftest 4.5+0.17, which sends version "6.06"); see docs/performance.md
// for the message list. In short, every exchange is symmetric, the client
// writes first and the server reads first, each message is one write of a
// fixed size, and every binary value is big-endian:
//   version  16 bytes  "6.06" padded with NULs (a peer older than 5.70 is refused)
//   sys data 2 x 4     cycle buffer (page size), cache line size; each side takes the max
//   MTU      2 bytes   the ibv_mtu enum as a digit and NUL; each side takes the min
//   keys     108 bytes "%04x:%04x:%06x:%06x:%08x:%016llx:" + 16 x "%02x:" + "%08x:" + NUL
//                      (lid, out_reads, qpn, psn, rkey, vaddr, gid bytes, srqn)
//   report   5 x 8     size, iterations, BW peak, BW average (doubles), message rate
//   close    a key round, then "done\0" written by both sides and never read
#pragma once

#include <array>
#include <cstdint>
#include <string>

namespace uroce::perf {

/// One side's connection details (perftest's pingpong_dest).
struct Dest {
  std::uint32_t lid = 0;
  std::uint32_t out_reads = 1;
  std::uint32_t qpn = 0;
  std::uint32_t psn = 0;
  std::uint32_t rkey = 0;
  std::uint64_t vaddr = 0;
  std::array<std::uint8_t, 16> gid{};
  std::uint32_t srqn = 0;
  bool operator==(const Dest&) const = default;
};

inline constexpr std::size_t kKeyMsgGid = 108;
inline constexpr std::size_t kVersionMsg = 16;
inline constexpr const char* kPerftestVersion = "6.06";
inline constexpr double kMinPeerVersion = 5.70;

/// The 108-byte key message (107 characters and the NUL).
std::array<char, kKeyMsgGid> format_keys(const Dest& d);
/// Parses a key message; false if it is not one.
bool parse_keys(const char* msg, std::size_t len, Dest& out);

/// perftest's bandwidth report (bw_report_data's exchanged fields).
struct BwReport {
  std::uint64_t size = 0, iters = 0;
  double bw_peak = 0, bw_avg = 0, msg_rate = 0;
};

/// The TCP side of it. Every call returns false (and sets error()) when
/// the peer breaks the format, closes, or the timeout passes.
class PerftestOob {
 public:
  PerftestOob() = default;
  ~PerftestOob();
  PerftestOob(const PerftestOob&) = delete;
  PerftestOob& operator=(const PerftestOob&) = delete;

  /// Server: listen on port and accept one client.
  bool accept(std::uint16_t port, int timeout_ms);
  /// Client: connect to host:port, retrying until the server listens.
  bool connect(const std::string& host, std::uint16_t port, int timeout_ms);
  [[nodiscard]] bool is_server() const { return server_; }
  /// How long a read may wait (a BW server waits out the whole run).
  void set_timeout(int ms) { timeout_ms_ = ms; }

  /// The version check; `peer` gets the peer's version string.
  bool exchange_versions(std::string& peer);
  /// cycle_buffer and cache_line_size, each the max of both sides.
  bool sys_data(std::uint32_t& cycle_buffer, std::uint32_t& cache_line);
  /// The MTU enum (1..5), the min of both sides.
  bool mtu(int& mtu);
  /// One key round.
  bool hand_shake(const Dest& mine, Dest& theirs);
  /// The five report items. The server's own values are not used by real
  /// perftest (it sends whatever it has); ours are what it measured.
  bool bw_report(const BwReport& mine, BwReport& theirs);
  /// A key round, then "done\0" (perftest 6.06's close), then close.
  bool close_connection(const Dest& mine);

  [[nodiscard]] const std::string& error() const { return error_; }
  /// Every byte sent and received, for tests.
  std::uint64_t bytes_out = 0, bytes_in = 0;

 private:
  bool xchg(const void* out, void* in, std::size_t n);
  bool write_all(const void* p, std::size_t n);
  bool read_all(void* p, std::size_t n);
  bool fail(std::string why);

  int fd_ = -1;
  bool server_ = false;
  int timeout_ms_ = 30000;
  std::string error_;
};

}  // namespace uroce::perf
