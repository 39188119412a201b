// The capture decoder behind uroce-pcap: per-frame records and the per-QP
// summary. Kept apart from main() so unit tests can drive it.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <tuple>

#include <nlohmann/json.hpp>

#include "stack/wire/addr.h"
#include "stack/wire/parser.h"

namespace uroce::tools {

struct QpKey {
  wire::IpAddr dst;
  std::uint32_t destqp = 0;
  friend auto operator<=>(const QpKey&, const QpKey&) = default;
};

/// What a passive observer can say about one QP (one destination QP number
/// at one destination address). See tests/conformance/README.md for the
/// exact definitions, which the conformance test recomputes independently.
struct QpSummary {
  std::uint64_t packets = 0;
  std::uint64_t payload_bytes = 0;
  std::uint64_t messages = 0;
  std::uint64_t psn_gaps = 0;
  std::uint64_t psn_repeats = 0;
  std::uint64_t acks = 0;
  std::uint64_t naks[5] = {};  // by wire::NakCode
  std::uint64_t rnr_naks = 0;
  std::uint64_t cnps = 0;
  std::uint64_t ecn_ce = 0;
  // PSN tracking over request packets.
  bool have_expected = false;
  wire::Psn expected{};
};

struct Totals {
  std::uint64_t frames = 0;
  std::uint64_t roce = 0;
  std::uint64_t non_roce = 0;
  std::uint64_t malformed = 0;
  std::uint64_t bad_icrc = 0;
};

class Decoder {
 public:
  /// `mtu`: path MTU used to predict the PSN after a READ request; 0 = unknown.
  explicit Decoder(std::uint32_t mtu = 0) : mtu_(mtu) {}

  /// Classifies one frame. Returns the parse status; `pkt` is valid when ok().
  /// Frames that are not RoCE are counted and otherwise ignored.
  wire::ParseStatus add(wire::ConstBytes frame, wire::Packet& pkt);

  [[nodiscard]] const std::map<QpKey, QpSummary>& qps() const { return qps_; }
  [[nodiscard]] const Totals& totals() const { return totals_; }

 private:
  void account(const wire::Packet& pkt);
  std::uint32_t mtu_;
  std::map<QpKey, QpSummary> qps_;
  Totals totals_;
};

/// One line for a frame: opcode name, DestQP, PSN, AckReq and the key
/// extension header fields, e.g. "RC_RDMA_WRITE_FIRST dqp=0x11 psn=5 A=0 va=0x.. rkey=0x.. len=4096".
[[nodiscard]] std::string describe(const wire::Packet& pkt);

/// The frame's fields as a JSON object (keys as in tests/conformance/README.md),
/// without the frame number and time, which the caller adds.
[[nodiscard]] nlohmann::ordered_json packet_json(const wire::Packet& pkt);

/// One QP's summary as a JSON object.
[[nodiscard]] nlohmann::ordered_json summary_json(const QpKey& key, const QpSummary& s);

[[nodiscard]] std::string_view nak_name(unsigned code);

}  // namespace uroce::tools
