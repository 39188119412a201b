#include "control/node/sigbus_guard.h"

#include <signal.h>
#include <sys/mman.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <new>
#include <vector>

namespace uroce::control::sigbus_guard {

namespace {

struct Range {
  std::atomic<std::uintptr_t> start{0};
  std::atomic<std::size_t> len{0};  // 0: the slot is free; stored last, with release
  std::atomic<std::uint32_t> owner{0};
  std::atomic<bool> poisoned{false};
};

Range* g_table = nullptr;               // `g_capacity` slots, mmap'ed once, never freed
std::size_t g_capacity = 0;
std::atomic<std::size_t> g_high{0};     // slots at or above it were never used
std::vector<int>* g_free = nullptr;     // free slots below g_high (main lcore only)
std::atomic<std::uint64_t> g_caught{0};
struct sigaction g_prev {};

void on_sigbus(int sig, siginfo_t* info, void* uctx) {
  const auto a = reinterpret_cast<std::uintptr_t>(info->si_addr);
  const std::size_t high = g_high.load(std::memory_order_acquire);
  for (std::size_t i = 0; i < high; ++i) {
    Range& r = g_table[i];
    const std::size_t len = r.len.load(std::memory_order_acquire);
    const std::uintptr_t start = r.start.load(std::memory_order_relaxed);
    if (len == 0 || a < start || a - start >= len) continue;
    // Application memory: put private zeroed memory in its place, whole.
    void* p = ::mmap(reinterpret_cast<void*>(start), len, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) break;  // cannot recover: the previous handler decides
    r.poisoned.store(true, std::memory_order_release);
    g_caught.fetch_add(1, std::memory_order_relaxed);
    return;  // the access runs again, on the new memory
  }
  // Not ours: whoever handled SIGBUS before (a backtrace), else the default.
  if (g_prev.sa_flags & SA_SIGINFO) {
    if (g_prev.sa_sigaction) return g_prev.sa_sigaction(sig, info, uctx);
  } else if (g_prev.sa_handler != SIG_DFL && g_prev.sa_handler != SIG_IGN) {
    return g_prev.sa_handler(sig);
  }
  ::signal(SIGBUS, SIG_DFL);  // the fault happens again on return, and kills
}

}  // namespace

bool install(std::size_t capacity) {
  if (g_table) return true;
  if (capacity == 0) return false;
  void* mem = ::mmap(nullptr, capacity * sizeof(Range), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) return false;
  auto* table = static_cast<Range*>(mem);  // slots are made as first used: untouched pages cost nothing
  struct sigaction sa {};
  sa.sa_sigaction = on_sigbus;
  sa.sa_flags = SA_SIGINFO | SA_NODEFER;
  sigemptyset(&sa.sa_mask);
  struct sigaction prev {};
  if (::sigaction(SIGBUS, &sa, &prev) != 0) {
    ::munmap(mem, capacity * sizeof(Range));
    return false;
  }
  g_prev = prev;
  g_free = new std::vector<int>();
  g_capacity = capacity;
  g_table = table;
  return true;
}

int guard(void* addr, std::size_t len, std::uint32_t owner) {
  if (!g_table || !addr || len == 0) return -1;
  int slot;
  if (!g_free->empty()) {
    slot = g_free->back();
    g_free->pop_back();
  } else {
    const std::size_t h = g_high.load(std::memory_order_relaxed);
    if (h == g_capacity) return -1;
    slot = static_cast<int>(h);
    new (&g_table[slot]) Range();  // before g_high lets the handler see it
  }
  Range& r = g_table[slot];
  r.start.store(reinterpret_cast<std::uintptr_t>(addr), std::memory_order_relaxed);
  r.owner.store(owner, std::memory_order_relaxed);
  r.poisoned.store(false, std::memory_order_relaxed);
  r.len.store(len, std::memory_order_release);
  if (static_cast<std::size_t>(slot) >= g_high.load(std::memory_order_relaxed))
    g_high.store(static_cast<std::size_t>(slot) + 1, std::memory_order_release);
  return slot;
}

void unguard(int slot) {
  if (!g_table || slot < 0 || static_cast<std::size_t>(slot) >= g_capacity) return;
  g_table[slot].len.store(0, std::memory_order_release);
  g_free->push_back(slot);
}

std::uint64_t caught() { return g_caught.load(std::memory_order_relaxed); }

void take_poisoned(const std::function<void(std::uint32_t owner)>& fn) {
  const std::size_t high = g_high.load(std::memory_order_relaxed);
  for (std::size_t i = 0; i < high; ++i) {
    Range& r = g_table[i];
    if (r.len.load(std::memory_order_relaxed) != 0 && r.poisoned.exchange(false, std::memory_order_acq_rel))
      fn(r.owner.load(std::memory_order_relaxed));
  }
}

}  // namespace uroce::control::sigbus_guard
