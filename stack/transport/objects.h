// Verbs objects owned by the engine: PD, MR (with its key table), CQ, SRQ.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <span>
#include <vector>

#include "stack/abi/codec.h"
#include "stack/abi/ring.h"
#include "stack/transport/fifo.h"
#include "stack/transport/verbs.h"

namespace uroce::transport {

// n from sizeof(Word) to 2 * sizeof(Word): the first and the last word.
template <typename Word>
void copy_two_words(std::uint8_t* dst, const std::uint8_t* src, std::size_t n) {
  Word a, b;
  std::memcpy(&a, src, sizeof a);
  std::memcpy(&b, src + n - sizeof b, sizeof b);
  std::memcpy(dst, &a, sizeof a);
  std::memcpy(dst + n - sizeof b, &b, sizeof b);
}

/// Copies a payload. Most are small (an 8-byte WRITE, a short SEND): those
/// take two loads and two stores, which may overlap, in place of a call to
/// memcpy; the rest go to memcpy.
inline void copy_payload(std::uint8_t* dst, const std::uint8_t* src, std::size_t n) {
  if (n > 16) {
    std::memcpy(dst, src, n);
  } else if (n >= 8) {
    copy_two_words<std::uint64_t>(dst, src, n);
  } else if (n >= 4) {
    copy_two_words<std::uint32_t>(dst, src, n);
  } else if (n != 0) {
    const std::uint8_t a = src[0], m = src[n / 2], z = src[n - 1];
    dst[0] = a;
    dst[n / 2] = m;
    dst[n - 1] = z;
  }
}

/// p + off as address arithmetic: an ODP MR's base is an address of the
/// application's, never ours to point into, and 0 for an implicit MR.
inline std::uint8_t* advance(std::uint8_t* p, std::uint64_t off) {
  return reinterpret_cast<std::uint8_t*>(reinterpret_cast<std::uintptr_t>(p) + off);
}

/// Where checked bytes are. Registered (pinned) memory: `p`, in our own
/// address space. On-demand paging (an ODP MR): `p` is the application's
/// own address, never dereferenced here, and the bytes are read and written
/// through `fd`, the application's memory file (its /proc/self/mem), page
/// faults and all: a page it has not mapped is an access error, not a crash.
struct MemRef {
  std::uint8_t* p = nullptr;
  int fd = -1;
  [[nodiscard]] MemRef at(std::uint64_t off) const { return {advance(p, off), fd}; }
  [[nodiscard]] bool odp() const { return fd >= 0; }
};

/// An ODP access: n bytes between `buf` and the application's address
/// `addr`, through its memory file. False if any byte cannot be reached.
bool odp_copy(int fd, std::uint8_t* buf, std::size_t n, const std::uint8_t* addr, bool to_app);

/// Copies n bytes into checked memory. False on an ODP page that is not there.
inline bool put_bytes(MemRef dst, const std::uint8_t* src, std::size_t n) {
  if (!dst.odp()) {
    copy_payload(dst.p, src, n);
    return true;
  }
  return odp_copy(dst.fd, const_cast<std::uint8_t*>(src), n, dst.p, true);
}
/// Copies n bytes out of checked memory.
inline bool get_bytes(MemRef src, std::uint8_t* dst, std::size_t n) {
  if (!src.odp()) {
    std::memcpy(dst, src.p, n);
    return true;
  }
  return odp_copy(src.fd, dst, n, src.p, false);
}

struct Pd {
  std::uint32_t handle = 0;
  std::uint32_t refs = 0;  // MRs, QPs and SRQs that use it
};

/// An XRC domain (IBTA 11.2.1.2 and 9.8.5): what ties XRC target QPs to the
/// XRC SRQs their requests may name. Several sessions may share one.
struct Xrcd {
  std::uint32_t handle = 0;
  std::uint32_t refs = 0;  // XRC SRQs and XRC target QPs in it
  void* owner = nullptr;   // the control plane's tag
};

/// An entry of the key table: a memory region, or a memory window (IBTA
/// 10.6.7), which has an R_Key only and names a range of the MR it is bound
/// to, with access rights of its own.
struct Mr {
  Pd* pd = nullptr;
  std::uint8_t* addr = nullptr;  // MR: where the bytes are for us (ODP: the application's address; MW: unused)
  int odp_fd = -1;  // ODP: the application's memory file, through which its bytes are reached (MemRef)
  std::uint64_t iova = 0;  // the address the peer uses in RETH/AtomicETH (a zero-based MW: 0)
  std::uint64_t length = 0;
  unsigned access = 0;  // ibv_access_flags
  std::uint32_t lkey = 0;  // the slot's key (an MW's is its R_Key, never accepted as an L_Key)
  std::uint32_t rkey = 0;
  bool valid = false;       // registered (an MW: allocated)
  bool remote_ok = false;   // MR: not invalidated; MW: bound (and not invalidated)
  std::uint8_t mw_type = 0;  // 0: an MR; IBV_MW_TYPE_1 or IBV_MW_TYPE_2: a memory window
  std::uint32_t mw_bound = 0;  // MR: windows bound to it (it cannot be deregistered meanwhile)
  // MW, while bound:
  Mr* parent = nullptr;           // the MR
  std::uint64_t window_base = 0;  // where the window starts, in the MR's address space
  std::uint64_t bound_qp = 0;     // type 2: the handle of the QP it was bound through (type 2B)
};

/// Why a key lookup failed (or kOk).
enum class KeyCheck : std::uint8_t { kOk, kBadKey, kWrongPd, kOutOfBounds, kNoPermission };

/// A bind of a memory window (IBV_WR_BIND_MW, or ibv_bind_mw for type 1).
struct MwBind {
  std::uint32_t mw_rkey = 0;   // the window's R_Key (its index names it; the key byte may be behind)
  std::uint32_t new_rkey = 0;  // its R_Key after the bind: same index, another key byte
  std::uint32_t mr_lkey = 0;   // the MR (0 with length 0: unbind a type 1 window)
  std::uint64_t addr = 0;      // in the MR's address space
  std::uint64_t length = 0;
  unsigned access = 0;  // REMOTE_READ, REMOTE_WRITE, REMOTE_ATOMIC, ZERO_BASED
};

/// MRs indexed by key >> 8; the low byte of each key is random and changes
/// on every registration into the slot, so a stale or guessed key misses.
class MrTable {
 public:
  MrTable(std::uint32_t capacity, std::uint64_t seed);

  /// Registers [addr, addr+len) with `access`; iova is what the peer sees.
  /// Returns nullptr if the table is full. With `odp_fd`, an ODP MR: addr
  /// is the application's, reached through that memory file (MemRef).
  Mr* reg(Pd* pd, void* addr, std::uint64_t len, unsigned access, std::uint64_t iova, int odp_fd = -1);
  /// Frees the slot: EBUSY while windows are bound to the MR (or, for a
  /// window, never: it is unbound first).
  int dereg(Mr* mr);
  /// Changes a registered MR in place, keeping its keys: its PD (when `pd`
  /// is not null), its access, and (when `addr` is not null) its memory.
  /// EBUSY while windows are bound to it, as for deregistration: a bound
  /// window's bytes stay those it was bound to.
  int rereg(Mr* mr, Pd* pd, unsigned access, std::uint8_t* addr, std::uint64_t len, std::uint64_t iova);

  /// A memory window of `type` (1 or 2) in `pd`, unbound. nullptr if the
  /// table is full.
  Mr* alloc_mw(Pd* pd, unsigned type);
  /// Binds (or, type 1 with length 0, unbinds) a window for a WQE of QP
  /// `qp_handle` in `pd`. IBV_WC_SUCCESS, or IBV_WC_MW_BIND_ERR when any
  /// rule of IBTA 10.6.7.2 is broken (the window and the MR are unchanged).
  ibv_wc_status bind(const MwBind& b, const Pd* pd, std::uint64_t qp_handle);

  /// Checks `key` for an access of `len` bytes at `va` (iova space) needing
  /// `need` (ibv_access_flags; 0 for local read). `remote` selects the rkey
  /// rules (remote access must be granted, and not invalidated; a window
  /// must be bound, and a type 2 window bound through the QP `qp_handle`).
  KeyCheck check(std::uint32_t key, bool remote, const Pd* pd, std::uint64_t qp_handle, std::uint64_t va,
                 std::uint64_t len, unsigned need, MemRef* out) const;

  /// Invalidation: by a SEND_WITH_INV (remote) or a LOCAL_INV WQE of QP
  /// `qp_handle` in `pd`. An MR's remote access stops; a type 2 window is
  /// unbound (if it is bound through that QP). False if no such key, or a
  /// type 1 window (which only a bind changes).
  bool invalidate(std::uint32_t rkey, const Pd* pd, std::uint64_t qp_handle);
  /// A QP is destroyed: the type 2 windows bound through it come unbound
  /// (they could serve no other, nor be invalidated). Control path: a scan.
  void unbind_qp(std::uint64_t qp_handle);

  [[nodiscard]] std::size_t in_use() const { return in_use_; }

 private:
  Mr* find(std::uint32_t key) const;
  // A fixed array and its count: the count is what a lookup compares with
  // (a vector's size() divides its byte span by sizeof(Mr), 80 bytes).
  std::unique_ptr<Mr[]> slots_;
  std::uint32_t nslots_;
  std::vector<std::uint8_t> last_byte_;
  std::vector<std::uint32_t> free_;
  std::mt19937_64 rng_;
  std::size_t in_use_ = 0;
};

// On every packet that touches memory (the requester's SGEs, the
// responder's RETH): inline, where the data path can see through it.
inline Mr* MrTable::find(std::uint32_t key) const {
  const std::uint32_t idx = key >> 8;
  if (idx == 0 || idx >= nslots_) return nullptr;
  const Mr& m = slots_[idx];
  if (!m.valid || m.lkey != key) return nullptr;
  return const_cast<Mr*>(&m);
}

inline KeyCheck MrTable::check(std::uint32_t key, bool remote, const Pd* pd, std::uint64_t qp_handle, std::uint64_t va,
                        std::uint64_t len, unsigned need, MemRef* out) const {
  const Mr* m = find(key);
  if (m == nullptr || (remote && !m->remote_ok)) return KeyCheck::kBadKey;
  if (m->mw_type != 0 && (!remote || (m->mw_type == IBV_MW_TYPE_2 && m->bound_qp != qp_handle)))
    return KeyCheck::kBadKey;  // a window has no L_Key; a type 2 one serves the QP it was bound through
  if (m->pd != pd) return KeyCheck::kWrongPd;
  if (va < m->iova || len > m->length || va - m->iova > m->length - len) return KeyCheck::kOutOfBounds;
  if ((m->access & need) != need) return KeyCheck::kNoPermission;
  if (m->mw_type != 0) {
    // Through the window to its MR, whose bounds hold the window's.
    const Mr* r = m->parent;
    *out = {advance(r->addr, m->window_base + (va - m->iova) - r->iova), r->odp_fd};
    return KeyCheck::kOk;
  }
  *out = {advance(m->addr, va - m->iova), m->odp_fd};
  return KeyCheck::kOk;
}

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
  bool push(const uroce_cq_entry& e) {
    if (overflowed_ || !ring_.push(e)) {
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
/// Copies `data` into a receive WQE's SGEs starting `offset` bytes in.
/// False on a local protection error (bad lkey, bounds, no LOCAL_WRITE).
bool scatter_recv(const MrTable& mrs, const Pd* pd, const RecvWqe& w, std::uint64_t offset, wire::ConstBytes data);
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

/// One tag of a tag-matching SRQ's list (uroce_abi.h: tag matching).
struct TagEntry {
  bool valid = false;  // in the list: an ADD put it there; a match or a DEL takes it out
  bool busy = false;   // matched, its message still to come (a rendezvous READ): not yet released
  std::uint32_t gen = 0;
  std::uint64_t tag = 0, mask = 0;
  std::uint64_t order = 0;  // ADD order: the oldest tag that matches wins
  RecvWqe buf{};            // the buffer and its wr_id (the ADD's recv_wr_id)
};

/// A tag-matching SRQ's list: its tags, the ring its operations come on,
/// the CQ they complete in, and whether the application is in sync with
/// the unexpected messages.
struct TagMatch {
  abi::Ring<uroce_tm_op> ops;
  std::uint32_t* released = nullptr;  // one word per tag, in the mapping the application reads
  std::vector<TagEntry> tags;
  Cq* cq = nullptr;
  std::uint64_t next_order = 0;
  std::uint32_t unexpected = 0;  // unexpected EAGER and RNDV messages so far
  std::uint32_t synced = 0;      // the count the application last said it has seen
  [[nodiscard]] bool in_sync() const { return unexpected == synced; }
  /// The oldest tag in the list that `tag` matches; null if none.
  TagEntry* match(std::uint64_t tag) {
    TagEntry* best = nullptr;
    for (TagEntry& t : tags)
      if (t.valid && (tag & t.mask) == (t.tag & t.mask) && (!best || t.order < best->order)) best = &t;
    return best;
  }
  /// The tag leaves the list for good: the application may ADD its index again.
  void release(TagEntry& t) {
    t.valid = t.busy = false;
    std::atomic_ref<std::uint32_t>(released[&t - tags.data()]).store(t.gen, std::memory_order_release);
  }
};

/// A shared receive queue.
class Srq {
 public:
  Srq(Pd* pd, std::uint32_t max_wr, std::uint32_t max_sge, const abi::Ring<uroce_recv_entry>* shared)
      : pd_(pd), rq_(max_wr, max_sge, UROCE_RING_SRQ, shared) {}
  int post(const RecvWr& wr) { return rq_.post(wr); }
  [[nodiscard]] Pd* pd() const { return pd_; }
  /// An XRC SRQ's domain, completion queue and number (the XRCETH's SRQ
  /// number, unique on the port); null and 0 for a basic SRQ.
  [[nodiscard]] Xrcd* xrcd() const { return xrcd_; }
  [[nodiscard]] Cq* cq() const { return cq_; }
  [[nodiscard]] std::uint32_t srq_num() const { return srq_num_; }
  void make_xrc(Xrcd* x, Cq* cq, std::uint32_t num) {
    xrcd_ = x;
    cq_ = cq;
    srq_num_ = num;
  }
  /// A receive work queue (ibv_create_wq: an RSS table's entry) is a basic
  /// SRQ with a CQ of its own.
  void make_wq(Cq* cq) { cq_ = cq; }
  [[nodiscard]] std::uint32_t max_sge() const { return rq_.max_sge(); }
  [[nodiscard]] std::uint32_t depth() const { return rq_.depth(); }
  RecvQueue& queue() { return rq_; }  // where the responder takes receives (take_recv)
  std::uint32_t handle = 0;
  void* owner = nullptr;  // the control plane's tag
  std::uint32_t rss_refs = 0;  // entries of RSS QPs' indirection tables naming it
  std::unique_ptr<TagMatch> tm;  // a tag-matching SRQ's list (Engine::make_tm); null for others

 private:
  Pd* pd_;
  RecvQueue rq_;
  Xrcd* xrcd_ = nullptr;
  Cq* cq_ = nullptr;
  std::uint32_t srq_num_ = 0;
};

/// Receive-side scaling (a raw packet QP made with an RX hash and an
/// indirection table): the Toeplitz hash of the fields chosen, over a
/// frame's addresses and ports, picks the receive work queue it goes to.
struct RssConf {
  static constexpr std::size_t kKeyLen = 40;      // Toeplitz over up to 36 bytes (IPv6 and ports)
  static constexpr std::uint32_t kMaxTable = 64;  // entries (2^6)
  std::array<std::uint8_t, kKeyLen> key{};
  std::uint64_t fields = 0;  // IBV_RX_HASH_{SRC,DST}_{IPV4,IPV6} and _{SRC,DST}_PORT_{TCP,UDP}
  std::vector<Srq*> table;   // a power of two of work queues
};

/// The Toeplitz hash (Microsoft's RSS hash) of `in` under `key`, which has
/// at least in.size() + 4 bytes.
inline std::uint32_t toeplitz(std::span<const std::uint8_t> key, std::span<const std::uint8_t> in) {
  std::uint32_t h = 0;
  std::uint32_t window = std::uint32_t{key[0]} << 24 | std::uint32_t{key[1]} << 16 | std::uint32_t{key[2]} << 8 | key[3];
  for (std::size_t i = 0; i < in.size(); ++i) {
    const std::uint8_t next = i + 4 < key.size() ? key[i + 4] : 0;
    for (int b = 7; b >= 0; --b) {
      if ((in[i] >> b) & 1) h ^= window;
      window = (window << 1) | ((next >> b) & 1u);
    }
  }
  return h;
}

// On every SEND packet: inline, where the responder can see through them.
inline bool to_recv_wqe(const uroce_recv_entry& e, std::uint32_t max_sge, RecvWqe& out) {
  // Only what nsge covers is written: nothing reads an SGE past it.
  out.wr_id = e.wr_id;
  const std::uint32_t n = e.num_sge;
  std::uint64_t length = 0;
  if (n > max_sge) {
    out.nsge = 0;
    out.length = 0;
    return false;
  }
  for (std::uint32_t i = 0; i < n; ++i) {
    out.sge[i] = {e.sg_list[i].addr, e.sg_list[i].length, e.sg_list[i].lkey};
    length += e.sg_list[i].length;
  }
  out.nsge = n;
  out.length = length;
  return true;
}

inline bool RecvQueue::take(RecvWqe& out, bool& bad) {
  uroce_recv_entry e;
  if (!ring_.valid() || !ring_.pop(e)) return false;
  bad = !to_recv_wqe(e, max_sge_, out);
  return true;
}

inline bool scatter_recv(const MrTable& mrs, const Pd* pd, const RecvWqe& w, std::uint64_t offset, wire::ConstBytes data) {
  std::size_t done = 0;
  for (std::uint32_t i = 0; i < w.nsge && done < data.size(); ++i) {
    const Sge& s = w.sge[i];
    if (offset >= s.length) {
      offset -= s.length;
      continue;
    }
    const std::uint64_t take = std::min<std::uint64_t>(data.size() - done, s.length - offset);
    MemRef dst;
    if (mrs.check(s.lkey, false, pd, 0, s.addr + offset, take, IBV_ACCESS_LOCAL_WRITE, &dst) != KeyCheck::kOk ||
        !put_bytes(dst, data.data() + done, take))
      return false;
    done += take;
    offset = 0;
  }
  return done == data.size();
}

}  // namespace uroce::transport
