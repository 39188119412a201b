#include <cstring>
#include "stack/transport/objects.h"

#include <unistd.h>

#include <bit>
#include <cerrno>

namespace uroce::transport {

bool odp_copy(int fd, std::uint8_t* buf, std::size_t n, const std::uint8_t* addr, bool to_app) {
  // The file's offsets are the application's addresses. A page it has not
  // mapped (or may not access so) ends the copy short, with EIO or EFAULT:
  // an access error for the caller, never a fault here.
  auto at = reinterpret_cast<std::uintptr_t>(addr);
  while (n != 0) {
    if (at > static_cast<std::uintptr_t>(INT64_MAX) - n) return false;  // past what an offset can name
    const ssize_t r = to_app ? ::pwrite(fd, buf, n, static_cast<off_t>(at)) : ::pread(fd, buf, n, static_cast<off_t>(at));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    buf += r;
    at += static_cast<std::uintptr_t>(r);
    n -= static_cast<std::size_t>(r);
  }
  return true;
}

MrTable::MrTable(std::uint32_t capacity, std::uint64_t seed)
    : slots_(std::make_unique<Mr[]>(capacity)), nslots_(capacity), last_byte_(capacity), rng_(seed) {
  free_.reserve(capacity);
  // Index 0 is never handed out, so key 0 is never valid.
  for (std::uint32_t i = capacity; i-- > 1;) free_.push_back(i);
}

Mr* MrTable::reg(Pd* pd, void* addr, std::uint64_t len, unsigned access, std::uint64_t iova, int odp_fd) {
  if (free_.empty()) return nullptr;
  const std::uint32_t idx = free_.back();
  free_.pop_back();
  std::uint8_t byte;
  do {
    byte = static_cast<std::uint8_t>(rng_());
  } while (byte == last_byte_[idx]);
  last_byte_[idx] = byte;
  Mr& m = slots_[idx];
  m = Mr{};
  m.pd = pd;
  m.addr = static_cast<std::uint8_t*>(addr);
  m.iova = iova;
  m.length = len;
  m.access = access;
  m.odp_fd = odp_fd;
  m.lkey = m.rkey = (idx << 8) | byte;
  m.valid = true;
  m.remote_ok = (access & (IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) != 0;
  ++pd->refs;
  ++in_use_;
  return &m;
}

int MrTable::dereg(Mr* mr) {
  if (mr == nullptr || !mr->valid) return EINVAL;
  if (mr->mw_bound != 0) return EBUSY;  // IBTA 10.6.7.2.4: not while windows are bound to it
  if (mr->parent != nullptr) --mr->parent->mw_bound;  // a window bound at deallocation comes unbound
  const std::uint32_t idx = mr->lkey >> 8;
  --mr->pd->refs;
  *mr = Mr{};
  free_.push_back(idx);
  --in_use_;
  return 0;
}

int MrTable::rereg(Mr* mr, Pd* pd, unsigned access, std::uint8_t* addr, std::uint64_t len, std::uint64_t iova) {
  if (mr == nullptr || !mr->valid || mr->mw_type != 0) return EINVAL;
  if (mr->mw_bound != 0) return EBUSY;
  if (pd != nullptr && pd != mr->pd) {
    --mr->pd->refs;
    ++pd->refs;
    mr->pd = pd;
  }
  if (addr != nullptr) {
    mr->addr = addr;
    mr->odp_fd = -1;  // memory registered in place of what it paged in
    mr->length = len;
    mr->iova = iova;
  }
  mr->access = access;
  // Registered again: remote access as the access says, even after an
  // invalidation (the consumer asked for these keys anew).
  mr->remote_ok = (access & (IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) != 0;
  return 0;
}

Mr* MrTable::alloc_mw(Pd* pd, unsigned type) {
  if (type != IBV_MW_TYPE_1 && type != IBV_MW_TYPE_2) return nullptr;
  Mr* w = reg(pd, nullptr, 0, 0, 0);
  if (w != nullptr) {
    w->mw_type = static_cast<std::uint8_t>(type);
    w->remote_ok = false;  // nothing is reachable through it until it is bound
  }
  return w;
}

ibv_wc_status MrTable::bind(const MwBind& b, const Pd* pd, std::uint64_t qp_handle) {
  // The window by its slot: a consumer whose copy of the R_Key is behind
  // (a type 2 window's key is the consumer's to track) still names it; the
  // PD keeps it to its owner.
  const std::uint32_t slot = b.mw_rkey >> 8;
  if (slot == 0 || slot >= nslots_) return IBV_WC_MW_BIND_ERR;
  Mr* w = &slots_[slot];
  if (!w->valid || w->mw_type == 0 || w->pd != pd) return IBV_WC_MW_BIND_ERR;
  // The new R_Key names the same slot; only its key byte is the consumer's.
  if ((b.new_rkey >> 8) != (b.mw_rkey >> 8)) return IBV_WC_MW_BIND_ERR;
  // A type 2 window is bound once, then invalidated before it is bound again.
  if (w->mw_type == IBV_MW_TYPE_2 && w->parent != nullptr) return IBV_WC_MW_BIND_ERR;
  const unsigned remote = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC;
  // Local rights in a bind's access are ignored, as rxe ignores them (the
  // window takes the remote ones only; rdma-core's tests bind with
  // LOCAL_WRITE | REMOTE_WRITE); anything else unknown is refused.
  if ((b.access & ~(remote | IBV_ACCESS_ZERO_BASED | IBV_ACCESS_LOCAL_WRITE)) != 0) return IBV_WC_MW_BIND_ERR;
  // A type 2 window is bound to a range of an MR, never to nothing (o10-37.2.40).
  if (w->mw_type == IBV_MW_TYPE_2 && b.length == 0) return IBV_WC_MW_BIND_ERR;
  Mr* m = nullptr;
  if (w->mw_type == IBV_MW_TYPE_1 && b.length == 0 && b.mr_lkey == 0) {
    // Unbind: the window reaches nothing.
  } else {
    m = find(b.mr_lkey);
    if (m == nullptr || m->mw_type != 0 || m->pd != pd) return IBV_WC_MW_BIND_ERR;
    if (!(m->access & IBV_ACCESS_MW_BIND)) return IBV_WC_MW_BIND_ERR;
    // IBTA 10.6.7.2.3: remote write or atomic access through a window needs
    // local write on the MR; only type 2 windows may be zero based.
    if ((b.access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) && !(m->access & IBV_ACCESS_LOCAL_WRITE))
      return IBV_WC_MW_BIND_ERR;
    if ((b.access & IBV_ACCESS_ZERO_BASED) && w->mw_type != IBV_MW_TYPE_2) return IBV_WC_MW_BIND_ERR;
    if (b.addr < m->iova || b.length > m->length || b.addr - m->iova > m->length - b.length)
      return IBV_WC_MW_BIND_ERR;
  }
  if (w->parent != nullptr) --w->parent->mw_bound;
  const std::uint32_t idx = b.new_rkey >> 8;
  last_byte_[idx] = static_cast<std::uint8_t>(b.new_rkey);
  w->lkey = w->rkey = b.new_rkey;
  w->parent = m;
  w->remote_ok = m != nullptr;
  w->window_base = b.addr;
  w->iova = (b.access & IBV_ACCESS_ZERO_BASED) ? 0 : b.addr;
  w->length = m != nullptr ? b.length : 0;
  w->access = b.access & remote;
  w->bound_qp = w->mw_type == IBV_MW_TYPE_2 ? qp_handle : 0;
  if (m != nullptr) ++m->mw_bound;
  return IBV_WC_SUCCESS;
}

void MrTable::unbind_qp(std::uint64_t qp_handle) {
  for (Mr& m : std::span<Mr>(slots_.get(), nslots_))
    if (m.valid && m.mw_type == IBV_MW_TYPE_2 && m.parent != nullptr && m.bound_qp == qp_handle) {
      --m.parent->mw_bound;
      m.parent = nullptr;
      m.length = 0;
      m.bound_qp = 0;
      m.remote_ok = false;
    }
}

bool MrTable::invalidate(std::uint32_t rkey, const Pd* pd, std::uint64_t qp_handle) {
  Mr* m = find(rkey);
  if (m == nullptr || m->pd != pd || !m->remote_ok) return false;
  if (m->mw_type == IBV_MW_TYPE_1) return false;
  if (m->mw_type == IBV_MW_TYPE_2) {
    if (m->bound_qp != qp_handle) return false;
    --m->parent->mw_bound;
    m->parent = nullptr;
    m->length = 0;
    m->bound_qp = 0;
  }
  m->remote_ok = false;
  return true;
}

Cq::Cq(std::uint32_t cqe, const abi::Ring<uroce_cq_entry>* shared) {
  if (shared) {
    ring_ = *shared;
  } else {
    heap_ = abi::HeapRing<uroce_cq_entry>(std::bit_ceil(cqe), UROCE_RING_CQ, 0);
    ring_ = heap_.ring();
  }
}

int Cq::poll(std::span<ibv_wc> out) {
  int n = 0;
  uroce_cq_entry e;
  while (n < static_cast<int>(out.size()) && ring_.pop(e)) out[static_cast<std::size_t>(n++)] = abi::to_wc(e);
  return n;
}

bool to_recv_entry(const RecvWr& wr, std::uint32_t max_sge, uroce_recv_entry& out) {
  if (wr.sg_list.size() > max_sge) return false;
  out = uroce_recv_entry{};
  out.wr_id = wr.wr_id;
  out.num_sge = static_cast<std::uint32_t>(wr.sg_list.size());
  for (std::uint32_t i = 0; i < out.num_sge; ++i)
    out.sg_list[i] = {wr.sg_list[i].addr, wr.sg_list[i].length, wr.sg_list[i].lkey};
  return true;
}

RecvQueue::RecvQueue(std::uint32_t max_wr, std::uint32_t max_sge, uroce_ring_kind kind,
                     const abi::Ring<uroce_recv_entry>* shared)
    : max_wr_(max_wr), max_sge_(max_sge) {
  if (shared) {
    ring_ = *shared;
  } else {
    heap_ = abi::HeapRing<uroce_recv_entry>(std::bit_ceil(max_wr < 1 ? 1u : max_wr), kind, 0);
    ring_ = heap_.ring();
  }
}

int RecvQueue::post(const RecvWr& wr) {
  uroce_recv_entry e;
  if (!to_recv_entry(wr, max_sge_, e)) return EINVAL;
  if (ring_.used() >= max_wr_ || !ring_.push(e)) return ENOMEM;
  return 0;
}

}  // namespace uroce::transport
