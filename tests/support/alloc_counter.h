// Counts every heap allocation a test binary makes while counting is on, in
// any thread: each form of operator new and new[] (plain, aligned, nothrow,
// aligned nothrow) and the C allocators (malloc, calloc, realloc,
// aligned_alloc, posix_memalign, memalign, valloc, pvalloc).
//
// Link alloc_counter.cc into the test binary (one per binary): it replaces
// the global operator new family, and interposes the C allocators in front
// of glibc's (forwarding to __libc_malloc and the like). Under AddressSanitizer,
// which owns malloc itself, the C allocators are left to it and counted
// through its allocation hook (__sanitizer_install_malloc_and_free_hooks),
// which sees every form, operator new included, as one total.
//
// For the no-allocation proofs of the data path (tests/unit/transport/
// test_no_alloc.cc, tests/unit/node/test_no_alloc_node.cc).
#pragma once

#include <cstdint>
#include <string>

namespace uroce::testing::alloc_counter {

enum class Kind : unsigned {
  kNew,           // operator new / new[] (plain and nothrow)
  kNewAligned,    // operator new / new[] with std::align_val_t (plain and nothrow)
  kMalloc,
  kCalloc,
  kRealloc,
  kAligned,       // aligned_alloc, posix_memalign, memalign, valloc, pvalloc
  kSanitizer,     // under ASan: every form, seen by its hook
  kCount
};

/// Zeroes the counts and starts counting, in every thread.
void start();
/// Stops counting; returns the total counted since start().
std::uint64_t stop();
[[nodiscard]] std::uint64_t total();
[[nodiscard]] std::uint64_t count(Kind k);
/// "new=0 new_aligned=0 malloc=1 ...", and where the first counted
/// allocation came from (a backtrace, without ASan), for a failure message.
[[nodiscard]] std::string report();
/// Whether the C allocators are counted by interposition (false: ASan's hook).
[[nodiscard]] bool interposed();

}  // namespace uroce::testing::alloc_counter
