// Verbs objects owned by the engine: PD, MR (with its key table), CQ, SRQ.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "stack/transport/ring.h"
#include "stack/transport/verbs.h"

namespace uroce::transport {

struct Pd {
  std::uint32_t handle = 0;
  std::uint32_t refs = 0;  // MRs, QPs and SRQs that use it
};

struct Mr {
  Pd* pd = nullptr;
  std::uint8_t* addr = nullptr;
  std::uint64_t iova = 0;  // the address the peer uses in RETH/AtomicETH
  std::uint64_t length = 0;
  unsigned access = 0;  // ibv_access_flags
  std::uint32_t lkey = 0;
  std::uint32_t rkey = 0;
  bool valid = false;       // registered
  bool remote_ok = false;   // not invalidated by a SEND_WITH_INV
};

/// Why a key lookup failed (or kOk).
enum class KeyCheck : std::uint8_t { kOk, kBadKey, kWrongPd, kOutOfBounds, kNoPermission };

/// MRs indexed by key >> 8; the low byte of each key is random and changes
/// on every registration into the slot, so a stale or guessed key misses.
class MrTable {
 public:
  MrTable(std::uint32_t capacity, std::uint64_t seed);

  /// Registers [addr, addr+len) with `access`; iova is what the peer sees.
  /// Returns nullptr if the table is full.
  Mr* reg(Pd* pd, void* addr, std::uint64_t len, unsigned access, std::uint64_t iova);
  void dereg(Mr* mr);

  /// Checks `key` for an access of `len` bytes at `va` (iova space) needing
  /// `need` (ibv_access_flags; 0 for local read). `remote` selects the rkey
  /// rules (remote access must be granted, and not invalidated).
  KeyCheck check(std::uint32_t key, bool remote, const Pd* pd, std::uint64_t va, std::uint64_t len, unsigned need,
                 std::uint8_t** out) const;

  /// Remote invalidation (SEND_WITH_INV). False if no such rkey in `pd`.
  bool invalidate(std::uint32_t rkey, const Pd* pd);

  [[nodiscard]] std::size_t in_use() const { return in_use_; }

 private:
  Mr* find(std::uint32_t key) const;
  std::vector<Mr> slots_;
  std::vector<std::uint8_t> last_byte_;
  std::vector<std::uint32_t> free_;
  std::mt19937_64 rng_;
  std::size_t in_use_ = 0;
};

/// A completion queue: a fixed ring of ibv_wc.
class Cq {
 public:
  explicit Cq(std::uint32_t cqe) : ring_(cqe) {}
  /// False (and the CQ is marked overflowed) when full.
  bool push(const ibv_wc& wc) {
    if (!ring_.push(wc)) {
      overflowed_ = true;
      return false;
    }
    return true;
  }
  int poll(std::span<ibv_wc> out) {
    int n = 0;
    while (n < static_cast<int>(out.size()) && !ring_.empty()) {
      out[static_cast<std::size_t>(n++)] = ring_.front();
      ring_.pop();
    }
    return n;
  }
  [[nodiscard]] std::uint32_t depth() const { return ring_.size(); }
  [[nodiscard]] bool overflowed() const { return overflowed_; }
  std::uint32_t handle = 0;

 private:
  Ring<ibv_wc> ring_;
  bool overflowed_ = false;
};

struct RecvWqe {
  std::uint64_t wr_id = 0;
  Sge sge[kMaxSge]{};
  std::uint32_t nsge = 0;
  std::uint64_t length = 0;
};

/// A shared receive queue.
class Srq {
 public:
  Srq(Pd* pd, std::uint32_t max_wr, std::uint32_t max_sge) : pd_(pd), ring_(max_wr), max_sge_(max_sge) {}
  bool post(const RecvWqe& w) { return ring_.push(w); }
  bool pop(RecvWqe& w) {
    if (ring_.empty()) return false;
    w = ring_.front();
    ring_.pop();
    return true;
  }
  [[nodiscard]] Pd* pd() const { return pd_; }
  [[nodiscard]] std::uint32_t max_sge() const { return max_sge_; }
  [[nodiscard]] std::uint32_t depth() const { return ring_.size(); }
  [[nodiscard]] bool full() const { return ring_.full(); }
  std::uint32_t handle = 0;
  void* owner = nullptr;  // the control plane's tag, handed to the receive refill

 private:
  Pd* pd_;
  Ring<RecvWqe> ring_;
  std::uint32_t max_sge_;
};

}  // namespace uroce::transport
