// A view of one shared-memory ring (see uroce_abi.h for the protocol). The
// same code runs in the application and in the daemon, each mapping the ring
// at its own address. Lock-free, single producer and single consumer, and
// allocation-free.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <type_traits>

#include "stack/abi/uroce_abi.h"

namespace uroce::abi {

template <typename E>
concept RingEntry = std::is_trivially_copyable_v<E> && std::is_standard_layout_v<E> && requires(E e) { e.seq; };

enum class AttachError { kOk, kTooSmall, kBadMagic, kBadVersion, kBadKind, kBadEntrySize, kBadEntries };
const char* to_string(AttachError e);

template <RingEntry E>
class Ring {
 public:
  Ring() = default;

  /// Lays out a new ring in `mem` (uroce_ring_bytes(entries, sizeof(E)) bytes).
  static Ring create(void* mem, std::uint32_t entries, uroce_ring_kind kind, std::uint32_t handle) {
    std::memset(mem, 0, uroce_ring_bytes(entries, sizeof(E)));
    auto* h = static_cast<uroce_ring_header*>(mem);
    h->magic = UROCE_ABI_MAGIC;
    h->major = UROCE_ABI_MAJOR;
    h->minor = UROCE_ABI_MINOR;
    h->kind = kind;
    h->entries = entries;
    h->entry_size = sizeof(E);
    h->handle = handle;
    return Ring(h);
  }

  /// Attaches to a ring laid out by the other side, checking everything a
  /// hostile or stale peer could have got wrong before trusting it.
  static AttachError attach(void* mem, std::size_t bytes, uroce_ring_kind kind, Ring& out) {
    if (bytes < sizeof(uroce_ring_header)) return AttachError::kTooSmall;
    auto* h = static_cast<uroce_ring_header*>(mem);
    if (h->magic != UROCE_ABI_MAGIC) return AttachError::kBadMagic;
    if (!uroce_abi_compatible(h->major, h->minor)) return AttachError::kBadVersion;
    if (h->kind != static_cast<std::uint32_t>(kind)) return AttachError::kBadKind;
    if (h->entry_size != sizeof(E)) return AttachError::kBadEntrySize;
    if (h->entries == 0 || (h->entries & (h->entries - 1)) != 0 || h->entries > (1u << 20)) return AttachError::kBadEntries;
    if (bytes < uroce_ring_bytes(h->entries, sizeof(E))) return AttachError::kTooSmall;
    out = Ring(h);
    return AttachError::kOk;
  }

  /// Producer: false when full.
  bool push(const E& e) {
    const std::uint32_t i = prod_;
    if (i - load(&h_->cons, std::memory_order_acquire) >= entries_) return false;
    E& slot = slots_[i & mask_];
    std::memcpy(static_cast<void*>(&slot), &e, offsetof_seq());
    std::memcpy(reinterpret_cast<char*>(&slot) + offsetof_seq() + 4, reinterpret_cast<const char*>(&e) + offsetof_seq() + 4,
                sizeof(E) - offsetof_seq() - 4);
    store(&slot.seq, i + 1, std::memory_order_release);  // the valid flag, last
    prod_ = i + 1;
    store(&h_->prod, prod_, std::memory_order_release);
    return true;
  }

  /// Consumer: false when empty.
  bool pop(E& out) {
    const std::uint32_t i = cons_;
    E& slot = slots_[i & mask_];
    if (load(&slot.seq, std::memory_order_acquire) != i + 1) return false;
    std::memcpy(&out, &slot, sizeof(E));
    cons_ = i + 1;
    store(&h_->cons, cons_, std::memory_order_release);
    return true;
  }

  /// Consumer, in place: copies entry i (the consumer's own index, which the
  /// caller keeps within cons .. cons + capacity) once its producer has
  /// published it, without consuming it. The caller validates the copy and
  /// never reads the shared slot again, so a producer that rewrites an entry
  /// after publishing it can change nothing the consumer has checked.
  bool peek(std::uint32_t i, E& out) const {
    const E& slot = slots_[i & mask_];
    if (load(const_cast<std::uint32_t*>(&slot.seq), std::memory_order_acquire) != i + 1) return false;
    std::memcpy(&out, &slot, sizeof(E));
    return true;
  }
  /// Consumer, in place: calls f(entry&) on each entry published and not
  /// yet consumed, in order, and lets it rewrite the entry (never its seq):
  /// the producer does not touch a slot again before the consumer frees it.
  template <class F>
  void edit_pending(F&& f) {
    for (std::uint32_t i = cons_; i - cons_ < entries_; ++i) {
      E& slot = slots_[i & mask_];
      if (load(&slot.seq, std::memory_order_acquire) != i + 1) break;
      f(slot);
    }
  }
  /// Consumer: entries up to index i are done with; their slots go back to
  /// the producer (used with peek, where an entry is retired only when its
  /// work completes, so a full ring is the queue's whole depth).
  void release(std::uint32_t i) {
    cons_ = i;
    store(&h_->cons, cons_, std::memory_order_release);
  }
  /// Consumer: entries the producer says it has published beyond what this
  /// side consumed, at most the capacity (for status; never trusted as an index).
  [[nodiscard]] std::uint32_t pending() const {
    const std::uint32_t n = load(&h_->prod, std::memory_order_acquire) - cons_;
    return n < entries_ ? n : entries_;
  }

  /// The entry count fixed when this side attached (never re-read from the
  /// shared header, which the other side could rewrite).
  [[nodiscard]] std::uint32_t capacity() const { return entries_; }
  /// Producer: entries that can be pushed now.
  [[nodiscard]] std::uint32_t space() const { return entries_ - used(); }
  /// Producer: entries pushed and not yet released by the consumer.
  [[nodiscard]] std::uint32_t used() const { return prod_ - load(&h_->cons, std::memory_order_acquire); }
  [[nodiscard]] std::uint32_t handle() const { return h_->handle; }
  /// The shared header (its work_queued word: work_ring.h).
  [[nodiscard]] uroce_ring_header* header() const { return h_; }

  // CQ notification (a completion channel). The consumer arms: arm += 1,
  // then a full fence, then it polls once more. The producer, after pushing,
  // fences and signals when arm != notified, then sets notified = arm. The
  // two fences make a lost wake-up impossible: either the producer sees the
  // new arm, or the consumer's final poll sees the entry.
  void arm_notify() {
    store(&h_->arm, load(&h_->arm, std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }
  /// Producer side: true once per arm, when the consumer asked to be told.
  [[nodiscard]] bool take_notify() {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    const std::uint32_t a = load(&h_->arm, std::memory_order_relaxed);
    if (a == load(&h_->notified, std::memory_order_relaxed)) return false;
    store(&h_->notified, a, std::memory_order_release);
    return true;
  }
  /// Consumer side: how many notifications the producer has sent so far.
  [[nodiscard]] std::uint32_t notified() const { return load(&h_->notified, std::memory_order_acquire); }
  [[nodiscard]] bool valid() const { return h_ != nullptr; }

  /// QP send rings. The consumer (the daemon) publishes the QP's state at
  /// every change; the producer (the application) reads it before a post.
  /// The fence after it orders the state before the consumer's next look at
  /// the QP's queues (a flush in ERR), against the producer's publish-then-
  /// look-at-the-state (work_ring.h): one of the two sees the other.
  void publish_qp_state(std::uint32_t state) {
    if (!h_) return;
    store(&h_->qp_state, state + 1, std::memory_order_release);
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }
  /// The published state, or -1 when none is (a daemon before minor 11).
  [[nodiscard]] int qp_state() const {
    const std::uint32_t s = load(&h_->qp_state, std::memory_order_acquire);
    return s == 0 ? -1 : static_cast<int>(s - 1);
  }

  /// Producer: copies the entries pushed and not yet consumed, in order,
  /// into `to` (a fresh ring of the same kind), and a CQ's notification
  /// state with them, for a resize. False, with `to` unusable, if they do
  /// not fit or the consumer's index makes no sense.
  bool copy_to(Ring& to) const {
    const std::uint32_t cons = load(&h_->cons, std::memory_order_acquire);
    if (prod_ - cons > to.capacity() || prod_ - cons > entries_) return false;
    for (std::uint32_t i = cons; i != prod_; ++i) {
      E e;
      if (!peek(i, e) || !to.push(e)) return false;
    }
    store(&to.h_->arm, load(&h_->arm, std::memory_order_relaxed), std::memory_order_relaxed);
    store(&to.h_->notified, load(&h_->notified, std::memory_order_relaxed), std::memory_order_release);
    return true;
  }

 private:
  explicit Ring(uroce_ring_header* h)
      : h_(h), slots_(reinterpret_cast<E*>(h + 1)), entries_(h->entries), mask_(h->entries - 1), prod_(load(&h->prod, std::memory_order_acquire)),
        cons_(load(&h->cons, std::memory_order_acquire)) {}
  static constexpr std::size_t offsetof_seq() {
    static_assert(std::is_same_v<decltype(E::seq), std::uint32_t>);
    return offsetof(E, seq);
  }
  static std::uint32_t load(std::uint32_t* p, std::memory_order o) { return std::atomic_ref<std::uint32_t>(*p).load(o); }
  static void store(std::uint32_t* p, std::uint32_t v, std::memory_order o) {
    std::atomic_ref<std::uint32_t>(*p).store(v, o);
  }

  uroce_ring_header* h_ = nullptr;
  E* slots_ = nullptr;
  std::uint32_t entries_ = 0;
  std::uint32_t mask_ = 0;
  std::uint32_t prod_ = 0;  // local copies: each side only trusts its own index
  std::uint32_t cons_ = 0;
};

/// A ring laid out in this process's own memory: the same queue as a shared
/// ring, placed in the heap (the engine's queues when no application shares
/// them: the CM agent, tests, benches). Owns its memory.
template <RingEntry E>
class HeapRing {
 public:
  HeapRing() = default;
  HeapRing(std::uint32_t entries, uroce_ring_kind kind, std::uint32_t handle)
      : mem_(static_cast<std::byte*>(std::aligned_alloc(UROCE_ABI_CACHELINE, bytes(entries)))) {
    if (!mem_) throw std::bad_alloc();
    ring_ = Ring<E>::create(mem_.get(), entries, kind, handle);
  }
  Ring<E>& ring() { return ring_; }

 private:
  static std::size_t bytes(std::uint32_t entries) {
    const std::size_t n = uroce_ring_bytes(entries, sizeof(E));
    return (n + UROCE_ABI_CACHELINE - 1) & ~std::size_t{UROCE_ABI_CACHELINE - 1};
  }
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::unique_ptr<std::byte, Free> mem_;
  Ring<E> ring_;
};

inline const char* to_string(AttachError e) {
  switch (e) {
    case AttachError::kOk: return "ok";
    case AttachError::kTooSmall: return "shared memory too small for the ring";
    case AttachError::kBadMagic: return "not a uroce ring (bad magic)";
    case AttachError::kBadVersion: return "ABI major version mismatch";
    case AttachError::kBadKind: return "wrong ring kind";
    case AttachError::kBadEntrySize: return "entry size does not match this ABI";
    case AttachError::kBadEntries: return "entry count is not a power of two in 1..2^20";
  }
  return "?";
}

}  // namespace uroce::abi
