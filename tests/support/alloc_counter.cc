// The allocation counter of alloc_counter.h. Without AddressSanitizer it
// replaces the global operator new family and interposes glibc's C
// allocators (the executable's definitions come before libc's in symbol
// lookup, for the libraries and plugins the process loads too), forwarding
// to glibc's own implementations, so memory from either side may be freed by
// the other. Under ASan, which intercepts all of them, it counts through
// ASan's allocation hook instead.
#include "tests/support/alloc_counter.h"

#include <execinfo.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <new>

#if defined(__SANITIZE_ADDRESS__)
#define UROCE_ALLOC_COUNTER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UROCE_ALLOC_COUNTER_ASAN 1
#endif
#endif

#ifdef UROCE_ALLOC_COUNTER_ASAN
#include <sanitizer/allocator_interface.h>
#endif

namespace uroce::testing::alloc_counter {
namespace {

constexpr unsigned kKinds = static_cast<unsigned>(Kind::kCount);
constexpr const char* kNames[kKinds] = {"new", "new_aligned", "malloc", "calloc", "realloc", "aligned", "asan_hook"};

std::atomic<bool> g_on{false};
std::atomic<std::uint64_t> g_count[kKinds];
// The first counted allocation's call stack (without ASan: ASan's own
// reports are the better tool there).
std::atomic<bool> g_traced{false};
void* g_trace[32];
int g_trace_len = 0;
[[maybe_unused]] thread_local bool t_inside = false;  // backtrace() may allocate: don't recurse

inline void note(Kind k) {
  if (!g_on.load(std::memory_order_relaxed)) return;
  g_count[static_cast<unsigned>(k)].fetch_add(1, std::memory_order_relaxed);
#ifndef UROCE_ALLOC_COUNTER_ASAN
  if (!t_inside && !g_traced.exchange(true, std::memory_order_relaxed)) {
    t_inside = true;
    g_trace_len = ::backtrace(g_trace, 32);
    t_inside = false;
  }
#endif
}

#ifdef UROCE_ALLOC_COUNTER_ASAN
void on_asan_malloc(const volatile void*, std::size_t) { note(Kind::kSanitizer); }
void on_asan_free(const volatile void*) {}
[[maybe_unused]] const int g_hooked = __sanitizer_install_malloc_and_free_hooks(on_asan_malloc, on_asan_free);
#endif

}  // namespace

void start() {
  if (!g_traced.load()) {  // load libgcc's unwinder now, not inside the first counted allocation
    void* warm[4];
    (void)::backtrace(warm, 4);
  }
  for (auto& c : g_count) c.store(0);
  g_trace_len = 0;
  g_traced.store(false);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  g_on.store(true);
}

std::uint64_t stop() {
  g_on.store(false);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  return total();
}

std::uint64_t count(Kind k) { return g_count[static_cast<unsigned>(k)].load(); }

std::uint64_t total() {
  std::uint64_t t = 0;
  for (const auto& c : g_count) t += c.load();
  return t;
}

bool interposed() {
#ifdef UROCE_ALLOC_COUNTER_ASAN
  return false;
#else
  return true;
#endif
}

std::string report() {
  std::string s;
  if (interposed()) {
    for (unsigned k = 0; k < static_cast<unsigned>(Kind::kSanitizer); ++k)
      s += std::string(s.empty() ? "" : " ") + kNames[k] + "=" + std::to_string(g_count[k].load());
  } else {
    s = "asan_hook=" + std::to_string(count(Kind::kSanitizer)) + " (every form, through ASan's hook)";
  }
  const bool was_on = g_on.exchange(false);  // backtrace_symbols allocates
  if (g_traced.load() && g_trace_len > 0) {
    s += "\nthe first counted allocation:";
    if (char** sym = ::backtrace_symbols(g_trace, g_trace_len)) {
      for (int i = 0; i < g_trace_len; ++i) s += std::string("\n  ") + sym[i];
      std::free(sym);
    }
  }
  g_on.store(was_on);
  return s;
}

}  // namespace uroce::testing::alloc_counter

#ifndef UROCE_ALLOC_COUNTER_ASAN
namespace ac = uroce::testing::alloc_counter;

extern "C" {
void* __libc_malloc(std::size_t);
void* __libc_calloc(std::size_t, std::size_t);
void* __libc_realloc(void*, std::size_t);
void* __libc_memalign(std::size_t, std::size_t);
void* __libc_valloc(std::size_t);
void* __libc_pvalloc(std::size_t);
void __libc_free(void*);

// The C allocators. free() stays glibc's: every block comes from glibc.
void* malloc(std::size_t n) noexcept {
  ac::note(ac::Kind::kMalloc);
  return __libc_malloc(n);
}
void* calloc(std::size_t k, std::size_t n) noexcept {
  ac::note(ac::Kind::kCalloc);
  return __libc_calloc(k, n);
}
void* realloc(void* p, std::size_t n) noexcept {
  ac::note(ac::Kind::kRealloc);
  return __libc_realloc(p, n);
}
void* reallocarray(void* p, std::size_t k, std::size_t n) noexcept {
  ac::note(ac::Kind::kRealloc);
  std::size_t bytes;
  if (__builtin_mul_overflow(k, n, &bytes)) {
    errno = ENOMEM;
    return nullptr;
  }
  return __libc_realloc(p, bytes);
}
void* memalign(std::size_t align, std::size_t n) noexcept {
  ac::note(ac::Kind::kAligned);
  return __libc_memalign(align, n);
}
void* aligned_alloc(std::size_t align, std::size_t n) noexcept {
  ac::note(ac::Kind::kAligned);
  return __libc_memalign(align, n);
}
int posix_memalign(void** out, std::size_t align, std::size_t n) noexcept {
  ac::note(ac::Kind::kAligned);
  if (align % sizeof(void*) != 0 || (align & (align - 1)) != 0) return EINVAL;
  void* p = __libc_memalign(align, n);
  if (!p) return ENOMEM;
  *out = p;
  return 0;
}
void* valloc(std::size_t n) noexcept {
  ac::note(ac::Kind::kAligned);
  return __libc_valloc(n);
}
void* pvalloc(std::size_t n) noexcept {
  ac::note(ac::Kind::kAligned);
  return __libc_pvalloc(n);
}
}  // extern "C"

// The operator new family, every form. Deletes free with glibc's free.
namespace {
void* plain(std::size_t n) {
  ac::note(ac::Kind::kNew);
  return __libc_malloc(n ? n : 1);
}
void* aligned(std::size_t n, std::align_val_t a) {
  ac::note(ac::Kind::kNewAligned);
  return __libc_memalign(static_cast<std::size_t>(a), n ? n : 1);
}
}  // namespace

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpragmas"
#pragma GCC diagnostic ignored "-Wunknown-warning-option"
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(std::size_t n) {
  if (void* p = plain(n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) {
  if (void* p = plain(n)) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return plain(n); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return plain(n); }
void* operator new(std::size_t n, std::align_val_t a) {
  if (void* p = aligned(n, a)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n, std::align_val_t a) {
  if (void* p = aligned(n, a)) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept { return aligned(n, a); }
void* operator new[](std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept { return aligned(n, a); }

void operator delete(void* p) noexcept { __libc_free(p); }
void operator delete[](void* p) noexcept { __libc_free(p); }
void operator delete(void* p, std::size_t) noexcept { __libc_free(p); }
void operator delete[](void* p, std::size_t) noexcept { __libc_free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { __libc_free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { __libc_free(p); }
void operator delete(void* p, std::align_val_t) noexcept { __libc_free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { __libc_free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { __libc_free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { __libc_free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { __libc_free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { __libc_free(p); }
#pragma GCC diagnostic pop
#endif  // !UROCE_ALLOC_COUNTER_ASAN
