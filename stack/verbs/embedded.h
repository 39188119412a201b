// The contract between liburoce and its embedded-mode plugin
// (liburoce-embedded.so, built from control/embedded). liburoce loads the
// plugin only when a device spec asks for embedded mode, so an application
// in daemon mode never loads DPDK. The plugin runs a node (control/node) in
// the application's process; liburoce attaches to it as a session, over the
// same protocol and rings as to uroced, and drives it from its own calls.
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define UROCE_EMBEDDED_VERSION 1u
/// The plugin's one exported symbol: returns its table.
#define UROCE_EMBEDDED_ENTRY "uroce_embedded_entry"

struct uroce_embedded_ops {
  uint32_t version; /* UROCE_EMBEDDED_VERSION */
  /** Starts a node from uroced's options (one string, split as a shell
   *  would). Writes the session socket to attach to into `sock`. NULL and
   *  why in `err` on failure, and `*spent` set when the failure came after
   *  the EAL was started: at most one node per process, ever, as the EAL
   *  cannot start twice. */
  void* (*start)(const char* options, char* sock, size_t sock_len, char* err, size_t err_len, int* spent);
  /** One pass of the node's loop (manual progress); returns the work done. */
  size_t (*progress)(void* node);
  /** Turns the loop until `fd` is readable (1), `timeout_ms` passes (0, -1:
   *  no end) or poll fails (-1). `fd` < 0: at most one idle sleep. */
  int (*wait)(void* node, int fd, int timeout_ms);
  /** Makes every wait in the node, now and later, end at once (0): the
   *  stop at process exit calls it before it waits for calls in flight to leave. */
  void (*interrupt)(void* node);
  /** Stops the node and frees everything it held. No call may be in it. */
  void (*stop)(void* node);
};

typedef const struct uroce_embedded_ops* (*uroce_embedded_entry_fn)(void);

#ifdef __cplusplus
}
#endif
