// Selective repeat (IRN-style; Mittal et al., "Revisiting Network Support
// for RDMA", SIGCOMM 2018): the per-QP state of a QP that both ends set to
// selective repeat. Allocated only for such QPs (Engine::set_selective_repeat).
//
// Every packet is self-describing (wire::Srh), so the responder places it
// however it arrives and acknowledges with what it has (wire::Sack); the
// requester resends only what the acknowledgements show missing, and keeps
// at most a bandwidth-delay product of packets in flight (IRN's BDP-FC).
// SENDs and WRITEs (with or without immediate) go in selective repeat's own
// opcodes; every other operation is fenced and goes in IBTA's (sr_fence).
#pragma once

#include <array>
#include <bit>
#include <cstdint>

#include "stack/transport/objects.h"
#include "stack/wire/psn.h"

namespace uroce::transport {

/// 256 bits, bit k for the PSN `base + k` of whoever holds it.
class Bitmap256 {
 public:
  static constexpr std::uint32_t kBits = 256;
  void set(std::uint32_t k) { w_[k >> 6] |= std::uint64_t{1} << (k & 63); }
  void clear(std::uint32_t k) { w_[k >> 6] &= ~(std::uint64_t{1} << (k & 63)); }
  [[nodiscard]] bool test(std::uint32_t k) const { return (w_[k >> 6] >> (k & 63)) & 1; }
  void reset() { w_ = {}; }
  /// Drops the first n bits: bit k becomes bit k - n.
  void shift(std::uint32_t n) {
    if (n >= kBits) return reset();
    const std::uint32_t words = n >> 6, bits = n & 63;
    for (std::uint32_t i = 0; i < 4; ++i) {
      const std::uint32_t src = i + words;
      std::uint64_t v = src < 4 ? w_[src] >> bits : 0;
      if (bits && src + 1 < 4) v |= w_[src + 1] << (64 - bits);
      w_[i] = v;
    }
  }
  /// The lowest set bit below `limit`, or kBits.
  [[nodiscard]] std::uint32_t first(std::uint32_t limit = kBits) const {
    for (std::uint32_t i = 0; i < 4; ++i)
      if (w_[i]) {
        const std::uint32_t k = i * 64 + static_cast<std::uint32_t>(std::countr_zero(w_[i]));
        return k < limit ? k : kBits;
      }
    return kBits;
  }
  /// One past the highest set bit (0 if none).
  [[nodiscard]] std::uint32_t end() const {
    for (std::uint32_t i = 4; i-- > 0;)
      if (w_[i]) return i * 64 + 64 - static_cast<std::uint32_t>(std::countl_zero(w_[i]));
    return 0;
  }
  std::array<std::uint64_t, 4>& words() { return w_; }
  [[nodiscard]] const std::array<std::uint64_t, 4>& words() const { return w_; }

 private:
  std::array<std::uint64_t, 4> w_{};
};

struct SrState {
  // Requester: from una on, what the peer has (SACKed), what must go again
  // (lost), and what was already resent since it was last found missing.
  Bitmap256 sacked, lost, resent;
  /// When each resent PSN went again (by psn % 256, while its resent bit
  /// is set): a resend that is itself lost shows as a hole a round trip later.
  std::array<std::uint64_t, Bitmap256::kBits> resent_at{};
  std::uint32_t next_msn = 0;  // receive sequence number of the next SEND or WRITE with immediate
  // An operation selective repeat does not carry (a READ, an atomic, ...)
  // goes alone, as IBTA go-back-N: it starts once everything before it is
  // acknowledged, and nothing starts after it until it is (Engine::sr_fence).
  bool fenced = false;
  wire::Psn fence_end{0};  // one past its last PSN
  // Responder: from epsn on, what has arrived; where each message that
  // ends in the window ends (its record at psn % 256); and the receive
  // WQEs taken ahead of their turn, by msn % kRwqes.
  Bitmap256 got;
  struct End {
    bool valid = false;
    bool consumes = false;  // a SEND or a WRITE with immediate
    bool is_send = false;
    bool imm = false;
    std::uint32_t msn = 0, total = 0, imm_data = 0;
  };
  std::array<End, Bitmap256::kBits> ends{};
  static constexpr std::uint32_t kRwqes = 64;
  std::array<RecvWqe, kRwqes> rwqes{};
  std::uint32_t rwqe_taken = 0;  // msn of the next WQE to take from the RQ
  std::uint32_t rmsn = 0;        // msn of the next message to complete
  std::uint64_t ooo = 0;         // packets placed ahead of epsn (telemetry)
};

}  // namespace uroce::transport
