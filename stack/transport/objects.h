// Verbs objects owned by the engine: PD, MR (with its key table), CQ, SRQ.
#pragma once

#include <cerrno>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "stack/abi/codec.h"
#include "stack/abi/ring.h"
#include "stack/transport/fifo.h"
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

/// A completion queue: an abi::Ring of uroce_cq_entry that the engine alone
/// produces into. One queue with two placements: the ring an application
/// shares (it consumes there), or one in the engine's heap (poll() consumes).
class Cq {
 public:
  /// `shared`: a ring laid out by the caller in memory it keeps mapped for
  /// the CQ's life; without it the ring is in the heap, of bit_ceil(cqe).
  Cq(std::uint32_t cqe, const abi::Ring<uroce_cq_entry>* shared);
  /// False when the ring is full: the CQ is then overflowed, and every later
  /// completion is dropped and counted (the engine raises IBV_EVENT_CQ_ERR).
  bool push(const ibv_wc& wc) {
    if (overflowed_ || !ring_.push(abi::to_cqe(wc))) {
      overflowed_ = true;  // what is dropped is counted by the engine (cqe_dropped)
      return false;
    }
    return true;
  }
  /// Consumes from a heap-placed ring (a shared ring's consumer is the application).
  int poll(std::span<ibv_wc> out);
  /// Completions produced and not yet consumed.
  [[nodiscard]] std::uint32_t depth() const { return ring_.used(); }
  [[nodiscard]] bool overflowed() const { return overflowed_; }
  abi::Ring<uroce_cq_entry>& ring() { return ring_; }
  /// Moves to a larger (or smaller) shared ring, with the completions not
  /// yet consumed and the notification state: EINVAL if they do not fit.
  int resize(const abi::Ring<uroce_cq_entry>& to) {
    abi::Ring<uroce_cq_entry> next = to;
    if (!ring_.copy_to(next)) return EINVAL;
    ring_ = next;
    return 0;
  }
  std::uint32_t handle = 0;
  void* owner = nullptr;  // the control plane's tag, handed to the notify and event hooks
  /// The owner wants to hear when entries land while the consumer has armed.
  void want_notify(bool on) { notify_ = on; }

 private:
  friend class Engine;
  abi::HeapRing<uroce_cq_entry> heap_;
  abi::Ring<uroce_cq_entry> ring_;
  bool overflowed_ = false;
  bool overflow_noted_ = false;
  bool notify_ = false;
  bool noted_ = false;  // pushed to since the engine last looked at notifications
};

struct RecvWqe {
  std::uint64_t wr_id = 0;
  Sge sge[kMaxSge]{};
  std::uint32_t nsge = 0;
  std::uint64_t length = 0;
};

/// A receive entry as the engine takes it: copied once, then checked. False
/// if it names more SGEs than `max_sge`.
bool to_recv_wqe(const uroce_recv_entry& e, std::uint32_t max_sge, RecvWqe& out);
/// A receive work request as an entry, for a heap-placed ring's producer.
bool to_recv_entry(const RecvWr& wr, std::uint32_t max_sge, uroce_recv_entry& out);

/// A receive queue: an abi::Ring of uroce_recv_entry, of a QP or shared
/// (an SRQ). The engine consumes; an application produces into a shared
/// ring, and post() into a heap-placed one.
class RecvQueue {
 public:
  RecvQueue() = default;
  /// `max_wr` bounds post(); the ring holds bit_ceil(max_wr) entries.
  RecvQueue(std::uint32_t max_wr, std::uint32_t max_sge, uroce_ring_kind kind,
            const abi::Ring<uroce_recv_entry>* shared);
  /// Heap producer: 0, EINVAL (too many SGEs) or ENOMEM (full).
  int post(const RecvWr& wr);
  /// Takes the next entry. False when there is none; `bad` when the entry
  /// taken was malformed (its wr_id is in `out` all the same).
  bool take(RecvWqe& out, bool& bad);
  /// Receives waiting (for a shared ring, as its producer's index says).
  [[nodiscard]] std::uint32_t depth() const { return ring_.valid() ? ring_.pending() : 0; }
  [[nodiscard]] std::uint32_t max_sge() const { return max_sge_; }
  /// Slots in the ring: the most entries one pass may take (a producer that
  /// refills as fast as entries are taken must not keep the engine looping).
  [[nodiscard]] std::uint32_t capacity() const { return ring_.valid() ? ring_.capacity() : 0; }

 private:
  abi::HeapRing<uroce_recv_entry> heap_;
  abi::Ring<uroce_recv_entry> ring_;
  std::uint32_t max_wr_ = 0;
  std::uint32_t max_sge_ = 0;
};

/// A shared receive queue.
class Srq {
 public:
  Srq(Pd* pd, std::uint32_t max_wr, std::uint32_t max_sge, const abi::Ring<uroce_recv_entry>* shared)
      : pd_(pd), rq_(max_wr, max_sge, UROCE_RING_SRQ, shared) {}
  int post(const RecvWr& wr) { return rq_.post(wr); }
  bool take(RecvWqe& w, bool& bad) { return rq_.take(w, bad); }
  [[nodiscard]] Pd* pd() const { return pd_; }
  [[nodiscard]] std::uint32_t max_sge() const { return rq_.max_sge(); }
  [[nodiscard]] std::uint32_t depth() const { return rq_.depth(); }
  [[nodiscard]] std::uint32_t capacity() const { return rq_.capacity(); }
  std::uint32_t handle = 0;
  void* owner = nullptr;  // the control plane's tag

 private:
  Pd* pd_;
  RecvQueue rq_;
};

}  // namespace uroce::transport
