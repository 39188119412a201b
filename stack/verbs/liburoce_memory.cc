// liburoce's registered memory: the segments (sealed memfds mapped where
// the application sees them) that MRs and uroce_alloc_buf pin, what a fork
// does to them, and MR registration (ODP MRs too), reregistration and
// deregistration.
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <vector>

#include "stack/abi/session_proto.h"
#include "stack/verbs/liburoce_internal.h"

namespace {
using uroce::verbs_detail::call;
using uroce::verbs_detail::call_fds;
using uroce::verbs_detail::set_error;
using uroce::verbs_detail::unpin;

/// The process's registered memory. Every page an MR covers lies in one
/// segment: a sealed memfd mapped where the application sees it, so every
/// daemon's mapping of that page shares the application's. A page never
/// moves once in a segment: an MR over pages of several segments (two
/// buffers sharing a page, registered in either order) maps them as pieces
/// (REG_MR_PIECES), and only pages no segment holds yet move onto a new one.
/// A segment lives while an MR (or a uroce_alloc_buf) pins it; after that
/// its pages go back to private memory, with their contents (unpin_locked).
///
/// fork: a shared mapping stays shared in a child, where private memory
/// would be copied. So that a child's pages are its own (as the kernel
/// copies pinned pages for a child), the fork handlers copy every segment
/// before the fork and, in the child, put the copy back as private memory
/// and forget the segments (the child's registrations are its own). A fork
/// costs a copy of the registered memory.
struct Segment {
  std::size_t len;
  int fd;
  std::uint32_t refs;
};
std::mutex g_seg_mu;
// By start address, never overlapping; never destroyed, so a thread still
// in the library while another calls exit() finds it intact.
std::map<std::uintptr_t, Segment>& g_segs = *new std::map<std::uintptr_t, Segment>;

/// A memfd of `len` bytes sealed at that size: the daemon maps registered
/// memory and refuses a memfd that could be shrunk under it.
int sealed_memfd(const char* name, std::size_t len) {
  const int fd = ::memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return -1;
  if (::ftruncate(fd, static_cast<off_t>(len)) != 0 || ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) {
    const int e = errno;
    ::close(fd);
    errno = e;
    return -1;
  }
  return fd;
}

/// Whether [start, start + len) is still mapped from `fd`'s memfd, readable
/// and writable, all of it: an application may unmap or remap memory
/// before it deregisters it (UCX's memory pools do), and nothing may then
/// be read or replaced there. From /proc/self/maps (not on the data path).
bool still_ours(std::uintptr_t start, std::size_t len, int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return false;
  FILE* f = std::fopen("/proc/self/maps", "re");
  if (!f) return false;
  char line[512];
  std::uintptr_t covered = start;
  bool ok = true;
  while (ok && std::fgets(line, sizeof line, f)) {
    unsigned long lo = 0, hi = 0, off = 0, ino = 0;
    unsigned dmaj = 0, dmin = 0;
    char perms[8] = {};
    if (std::sscanf(line, "%lx-%lx %7s %lx %x:%x %lu", &lo, &hi, perms, &off, &dmaj, &dmin, &ino) != 7) continue;
    if (hi <= start || lo >= start + len) continue;
    if (lo > covered || ino != st.st_ino || perms[0] != 'r' || perms[1] != 'w') ok = false;
    covered = hi;
  }
  std::fclose(f);
  return ok && covered >= start + len;
}

/// A private copy of [start, start + len), or null when no memory could be had.
void* snapshot(std::uintptr_t start, std::size_t len) {
  void* c = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (c == MAP_FAILED) return nullptr;
  std::memcpy(c, reinterpret_cast<const void*>(start), len);
  return c;
}

/// Puts [start, start + len) back on private memory, keeping its contents
/// (from `copy`, a snapshot of len bytes, or one of its own when null).
void make_private(std::uintptr_t start, std::size_t len, const void* copy) {
  void* tmp = nullptr;
  if (!copy) {
    tmp = snapshot(start, len);
    if (!tmp) return;  // it stays shared memory: still the application's
    copy = tmp;
  }
  if (::mmap(reinterpret_cast<void*>(start), len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) !=
      MAP_FAILED)
    std::memcpy(reinterpret_cast<void*>(start), copy, len);
  if (tmp) ::munmap(tmp, len);
}

void unpin_locked(std::uintptr_t start) {
  const auto it = g_segs.find(start);
  if (it == g_segs.end() || --it->second.refs != 0) return;
  if (still_ours(it->first, it->second.len, it->second.fd)) make_private(it->first, it->second.len, nullptr);
  ::close(it->second.fd);
  g_segs.erase(it);
}

/// The fork handlers (see Segment). The copies are made before the fork,
/// so the child's pages are what the parent's were at the fork.
struct ForkCopy {
  std::uintptr_t start;
  std::size_t len;
  void* copy;  // private memory, or null when it could not be had
};
std::vector<ForkCopy>& g_fork_copies = *new std::vector<ForkCopy>;
void seg_fork_prepare() {
  g_seg_mu.lock();
  g_fork_copies.clear();
  for (const auto& [start, s] : g_segs) {
    if (!still_ours(start, s.len, s.fd)) continue;  // not the application's memory there any more
    g_fork_copies.push_back({start, s.len, snapshot(start, s.len)});
  }
}
void seg_fork_parent() {
  for (const ForkCopy& f : g_fork_copies)
    if (f.copy) ::munmap(f.copy, f.len);
  g_fork_copies.clear();
  g_seg_mu.unlock();
}
void seg_fork_child() {
  for (const ForkCopy& f : g_fork_copies) {
    if (!f.copy) continue;  // no copy: the page stays shared with the parent
    make_private(f.start, f.len, f.copy);
    ::munmap(f.copy, f.len);
  }
  g_fork_copies.clear();
  for (const auto& [start, s] : g_segs) ::close(s.fd);
  g_segs.clear();
  g_seg_mu.unlock();
}
const bool g_seg_fork_handlers = pthread_atfork(seg_fork_prepare, seg_fork_parent, seg_fork_child) == 0;

/// Moves the pages [start, end), which no segment holds, onto a new
/// segment in place, keeping their contents. 0 or an errno.
int new_segment_locked(std::uintptr_t start, std::uintptr_t end) {
  const std::size_t len = end - start;
  const int fd = sealed_memfd("uroce-mr", len);
  if (fd < 0) return set_error(errno, "memfd");
  void* tmp = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (tmp == MAP_FAILED) return ::close(fd), set_error(errno, "mmap");
  std::memcpy(tmp, reinterpret_cast<void*>(start), len);
  ::munmap(tmp, len);
  if (::mmap(reinterpret_cast<void*>(start), len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED)
    return ::close(fd), set_error(errno, "cannot remap the memory onto shared memory");
  g_segs[start] = {len, fd, 0};
  return 0;
}

/// The memfd pieces behind the pages [start, end), in order, making
/// segments for pages no segment holds; pins each segment used (`segs`).
/// 0, or an errno with nothing pinned.
int pin(std::uintptr_t start, std::uintptr_t end, std::vector<uroce_reg_mr_piece>& pieces, std::vector<int>& fds,
        std::vector<std::uintptr_t>& segs) {
  std::lock_guard<std::mutex> lock(g_seg_mu);
  const auto undo = [&segs] {
    for (std::uintptr_t s : segs) unpin_locked(s);
    segs.clear();
  };
  for (std::uintptr_t pos = start; pos < end;) {
    auto next = g_segs.upper_bound(pos);
    auto it = next == g_segs.begin() ? g_segs.end() : std::prev(next);
    if (it == g_segs.end() || pos >= it->first + it->second.len) {
      const std::uintptr_t gap_end = next == g_segs.end() ? end : std::min(end, next->first);
      if (const int rc = new_segment_locked(pos, gap_end)) {
        undo();
        return rc;
      }
      it = g_segs.find(pos);
    }
    const std::uintptr_t take = std::min(end, it->first + it->second.len) - pos;
    if (pieces.size() == UROCE_MR_MAX_PIECES) {
      undo();
      return set_error(ENOMEM, "the MR spans more than 16 separately registered regions");
    }
    pieces.push_back({pos - it->first, take});
    fds.push_back(it->second.fd);
    ++it->second.refs;
    segs.push_back(it->first);
    pos += take;
  }
  return 0;
}

}  // namespace

namespace uroce::verbs_detail {
void unpin(const std::vector<std::uintptr_t>& segs) {
  std::lock_guard<std::mutex> lock(g_seg_mu);
  for (std::uintptr_t s : segs) unpin_locked(s);
}
}  // namespace uroce::verbs_detail

extern "C" {

void* uroce_alloc_buf(uroce_context* ctx, std::size_t length) {
  if (!ctx || length == 0) return set_error(EINVAL, "empty buffer"), nullptr;
  const std::size_t len = (length + 4095) & ~std::size_t{4095};
  const int fd = sealed_memfd("uroce-buf", len);
  if (fd < 0) return set_error(errno, "memfd"), nullptr;
  void* p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    ::close(fd);
    return set_error(errno, "mmap"), nullptr;
  }
  {
    std::lock_guard<std::mutex> lock(g_seg_mu);
    g_segs[reinterpret_cast<std::uintptr_t>(p)] = {len, fd, 1};
  }
  ctx->bufs.push_back(reinterpret_cast<std::uintptr_t>(p));
  return p;
}

uroce_mr* uroce_reg_mr(uroce_pd* pd, void* addr, std::size_t length, int access) {
  return uroce_reg_mr_iova(pd, addr, length, reinterpret_cast<std::uintptr_t>(addr), access);
}

/// The memory of an MR of [addr, addr + length) that its peers address at
/// iova, as REG_MR_PIECES sends it: the segments' pieces (pinned: segs),
/// or for 0 bytes a page of its own (no application memory is shared).
struct MrMemory {
  uroce_reg_mr_pieces_msg m{};
  uroce_reg_mr_exact exact{};
  std::vector<int> fds;
  std::vector<std::uintptr_t> segs;
  int own_fd = -1;
  MrMemory() = default;
  MrMemory(const MrMemory&) = delete;
  MrMemory& operator=(const MrMemory&) = delete;
  ~MrMemory() {
    if (own_fd >= 0) ::close(own_fd);
  }
};

/// Fills `mem` for pd's MR: 0, or an errno with nothing pinned.
int mr_memory(uroce_pd* pd, void* addr, std::size_t length, std::uint64_t iova, int access, MrMemory& mem) {
  uroce_context* ctx = pd->ctx;
  if (length == 0 && ctx->minor < 15) return set_error(EINVAL, "this uroced registers no MR of 0 bytes");
  if (!addr && length != 0) return set_error(EINVAL, "bad MR arguments");
  if (iova + length < iova) return set_error(EINVAL, "the IOVA range wraps");
  // The daemon maps whole pages: register from the page holding addr,
  // which the MR's address space (its IOVA) reaches at iova - (addr - page).
  const auto page = reinterpret_cast<std::uintptr_t>(addr) & ~std::uintptr_t{4095};
  const auto end = (reinterpret_cast<std::uintptr_t>(addr) + length + 4095) & ~std::uintptr_t{4095};
  const std::uint64_t head = reinterpret_cast<std::uintptr_t>(addr) - page;
  // The MR is exactly [addr, addr + length) (ABI minor 14): its keys reach
  // nothing else on its pages. An older daemon registers the whole pages,
  // whose IOVA must then not wrap.
  if (ctx->minor < 14 && iova < head) return set_error(EINVAL, "the IOVA range wraps");
  mem.exact = {head, length};
  std::vector<uroce_reg_mr_piece> pieces;
  if (length == 0) {
    mem.own_fd = sealed_memfd("uroce-mr0", 4096);
    if (mem.own_fd < 0) return set_error(errno, "memfd");
    pieces.push_back({0, 4096});
    mem.fds.push_back(mem.own_fd);
  } else if (pin(page, end, pieces, mem.fds, mem.segs) != 0) {
    return errno;
  }
  const std::uint64_t span = length == 0 ? 4096 : end - page;
  mem.m.mr = {pd->handle, static_cast<std::uint32_t>(access), iova - head, span, 0};
  mem.m.count = static_cast<std::uint32_t>(pieces.size());
  std::copy(pieces.begin(), pieces.end(), mem.m.piece);
  return 0;
}

namespace {
/// An ODP MR (minor 16): nothing is shared; the daemon reaches the bytes
/// through this process's memory file, sent with the session's first one.
/// NULL with SIZE_MAX bytes: the whole address space (implicit ODP).
uroce_mr* reg_mr_odp(uroce_pd* pd, void* addr, std::size_t length, std::uint64_t iova, int access) {
  uroce_context* ctx = pd->ctx;
  if (ctx->minor < 16) return set_error(EOPNOTSUPP, "this uroced registers no ODP MR (ABI minor < 16)"), nullptr;
  const bool implicit = addr == nullptr && length == SIZE_MAX;
  if (length == 0 || (!addr && !implicit)) return set_error(EINVAL, "bad ODP MR arguments"), nullptr;
  uroce_reg_mr_odp_msg m{pd->handle, static_cast<std::uint32_t>(access), reinterpret_cast<std::uintptr_t>(addr),
                         implicit ? UINT64_MAX : length, implicit ? 0 : iova};
  uroce_reg_mr_reply r{};
  int fd = -1;
  if (!ctx->mem_sent) {
    fd = ::open("/proc/self/mem", O_RDWR | O_CLOEXEC);
    if (fd < 0) return set_error(errno, "cannot open /proc/self/mem for the daemon"), nullptr;
  }
  const int rc = call(ctx, UROCE_MSG_REG_MR_ODP, &m, sizeof m, fd, &r, sizeof r);
  if (fd >= 0) ::close(fd);
  if (rc != 0) return nullptr;
  ctx->mem_sent = true;
  return new uroce_mr{pd, r.handle, r.lkey, r.rkey, {}};
}
}  // namespace

uroce_mr* uroce_reg_mr_iova(uroce_pd* pd, void* addr, std::size_t length, std::uint64_t iova, int access) {
  if (!pd) return set_error(EINVAL, "bad MR arguments"), nullptr;
  if (access & IBV_ACCESS_ON_DEMAND) return reg_mr_odp(pd, addr, length, iova, access);
  uroce_context* ctx = pd->ctx;
  MrMemory mem;
  if (mr_memory(pd, addr, length, iova, access, mem) != 0) return nullptr;
  uroce_reg_mr_reply r{};
  int rc;
  const std::uint32_t tail = ctx->minor >= 14 ? sizeof mem.exact : 0;  // the exact bytes follow the request
  if (mem.m.count == 1) {
    struct {
      uroce_reg_mr_msg mr;
      uroce_reg_mr_exact ex;
    } one{mem.m.mr, mem.exact};
    static_assert(sizeof one == sizeof(uroce_reg_mr_msg) + sizeof(uroce_reg_mr_exact));
    one.mr.offset = mem.m.piece[0].offset;
    rc = call(ctx, UROCE_MSG_REG_MR, &one, sizeof one.mr + tail, mem.fds[0], &r, sizeof r);
  } else {
    struct {
      uroce_reg_mr_pieces_msg m;
      uroce_reg_mr_exact ex;
    } many{mem.m, mem.exact};
    static_assert(sizeof many == sizeof(uroce_reg_mr_pieces_msg) + sizeof(uroce_reg_mr_exact));
    rc = call_fds(ctx, UROCE_MSG_REG_MR_PIECES, &many, sizeof many.m + tail, mem.fds.data(), mem.fds.size(), &r,
                  sizeof r);
  }
  if (rc != 0) {
    const int e = errno;
    unpin(mem.segs);
    errno = e;
    return nullptr;
  }
  return new uroce_mr{pd, r.handle, r.lkey, r.rkey, std::move(mem.segs)};
}

int uroce_rereg_mr(uroce_mr* mr, int flags, uroce_pd* pd, void* addr, std::size_t length, int access) {
  if (!mr) return set_error(EINVAL, "no MR");
  uroce_context* ctx = mr->pd->ctx;
  if (ctx->minor < 15) return set_error(EOPNOTSUPP, "this uroced cannot change an MR in place");
  const bool new_pd = (flags & IBV_REREG_MR_CHANGE_PD) != 0;
  const bool new_memory = (flags & IBV_REREG_MR_CHANGE_TRANSLATION) != 0;
  if (new_pd && (!pd || pd->ctx != ctx)) return set_error(EINVAL, "no PD, or one of another context");
  struct {
    uroce_rereg_mr_msg r;
    uroce_reg_mr_pieces_msg m;
    uroce_reg_mr_exact ex;
  } body{};
  body.r = {mr->handle, static_cast<std::uint32_t>(flags), new_pd ? pd->handle : 0, static_cast<std::uint32_t>(access)};
  std::uint32_t blen = sizeof body.r;
  MrMemory mem;
  if (new_memory) {
    if (mr_memory(new_pd ? pd : mr->pd, addr, length, reinterpret_cast<std::uintptr_t>(addr), access, mem) != 0)
      return errno;
    body.m = mem.m;
    body.ex = mem.exact;
    blen = sizeof body;
  }
  uroce_reg_mr_reply r{};
  if (const int rc = call_fds(ctx, UROCE_MSG_REREG_MR, &body, blen, mem.fds.data(), mem.fds.size(), &r, sizeof r)) {
    unpin(mem.segs);
    errno = rc;
    return rc;
  }
  if (new_memory) {
    unpin(mr->segs);
    mr->segs = std::move(mem.segs);
  }
  if (new_pd) mr->pd = pd;
  mr->lkey = r.lkey;
  mr->rkey = r.rkey;
  return 0;
}

int uroce_dereg_mr(uroce_mr* mr) {
  if (!mr) return EINVAL;
  uroce_destroy_msg d{UROCE_OBJ_MR, mr->handle};
  const int rc = call(mr->pd->ctx, UROCE_MSG_DESTROY, &d, sizeof d, -1, nullptr, 0);
  if (rc == 0) {
    unpin(mr->segs);
    delete mr;
  }
  return rc;
}

std::uint32_t uroce_mr_lkey(const uroce_mr* mr) { return mr->lkey; }
std::uint32_t uroce_mr_rkey(const uroce_mr* mr) { return mr->rkey; }

}  // extern "C"
