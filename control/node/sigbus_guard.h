// The last line of defence against SIGBUS on an application's memory.
//
// uroced maps memory that applications own: each registered MR is the
// application's memfd, mapped shared. The session server refuses any memfd
// that is not sealed against shrinking and any range beyond its end, so an
// application cannot truncate its memory under the daemon (the usual cause
// of SIGBUS). Some faults remain possible all the same (a hugetlbfs page
// that cannot be allocated when first touched, a filesystem error), and one
// would kill the daemon and every application on it.
//
// So every such mapping is guarded. A SIGBUS whose address lies in a
// guarded range is caught: the whole range is replaced in place
// (MAP_FIXED) by private anonymous memory, the range is marked poisoned,
// and the faulting instruction runs again and completes on that memory.
// The session server then closes the session that owns it (its QPs go to
// ERR, its peers see a dead host). A SIGBUS anywhere else goes to the
// handler that was there before (uroced's backtrace, then the default
// action): a fault in the daemon's own memory is still a crash.
//
// Why this is safe:
// - The handler only reads a fixed table of ranges (atomics; written by the
//   main lcore alone, which registers before the engine can touch a range
//   and unregisters before it unmaps) and calls mmap(2), a plain system
//   call, and nothing that allocates or locks.
// - Replacing the mapping is what the access needed: the page is there
//   when the instruction runs again, so no daemon state is left half
//   updated. The engine's accesses to a poisoned range read zeros and
//   write to memory nobody else sees, until its session is closed.
// - A guarded range is application memory only: the daemon's own state
//   never lies in one, so a fault in it is never hidden.
//
// Installed by uroced (a node with an application socket, not embedded):
// an application in embedded mode keeps its own SIGBUS handling.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

namespace uroce::control::sigbus_guard {

/// Installs the handler (once per process) with room for `capacity` ranges.
/// False if sigaction or the table's allocation failed.
bool install(std::size_t capacity);

/// Guards [addr, addr + len) for `owner` (a session id). Returns the range's
/// slot, or -1 when not installed or the table is full (then unguarded).
/// Main lcore only.
int guard(void* addr, std::size_t len, std::uint32_t owner);
/// Stops guarding a slot from guard() (-1 is ignored); before its munmap.
void unguard(int slot);

/// Faults caught since install (any thread may read it).
std::uint64_t caught();
/// Calls `fn(owner)` for each guarded range caught since the last call, and
/// clears its mark. Main lcore only.
void take_poisoned(const std::function<void(std::uint32_t owner)>& fn);

}  // namespace uroce::control::sigbus_guard
