/* qp_hold: a preload library for tests/integration/ucx.sh. uroced's status
 * lists only the QPs that exist, and a program such as ucx_perftest
 * destroys its QPs as it ends, so the test could not see which QPs carried
 * its traffic. This stops the program in each ibv_destroy_qp of a QP of the
 * type asked for: it creates DIR/held.PID.N (N counts from 0) and waits for
 * DIR/release.PID.N (at most 120 s), then destroys the QP as asked. Each
 * destroy is held, not only the first: UCX may drop a QP it made during
 * wire-up before any traffic, and the test reads the status at every hold.
 * The program and its libraries are left as they are; only the order in
 * time changes.
 *
 *   LD_PRELOAD=libqp_hold.so UROCE_HOLD_DIR=DIR UROCE_HOLD_QP_TYPE=RC|UD PROGRAM...
 *
 * Without UROCE_HOLD_DIR it only passes the call on. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int held;  /* holds so far */

static void hold(void) {
  const char* dir = getenv("UROCE_HOLD_DIR");
  char path[4096], release[4096];
  snprintf(path, sizeof path, "%s/held.%d.%d", dir, (int)getpid(), held);
  snprintf(release, sizeof release, "%s/release.%d.%d", dir, (int)getpid(), held);
  FILE* f = fopen(path, "w");
  if (f) fclose(f);
  const struct timespec tick = {0, 10 * 1000 * 1000};
  for (int i = 0; i < 12000 && access(release, F_OK) != 0; ++i) nanosleep(&tick, NULL);
}

int ibv_destroy_qp(struct ibv_qp* qp) {
  static int (*real)(struct ibv_qp*);
  if (!real) {
    /* UCX loads libibverbs in a dlopen()ed plugin, outside the global
     * scope that RTLD_NEXT searches: ask the loaded library itself. */
    void* lib = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_NOLOAD);
    void* sym = lib ? dlvsym(lib, "ibv_destroy_qp", "IBVERBS_1.1") : NULL;
    memcpy(&real, &sym, sizeof real); /* POSIX's way from dlsym to a function pointer */
  }
  if (!real) {
    fprintf(stderr, "qp_hold: no libibverbs.so.1 loaded with ibv_destroy_qp@IBVERBS_1.1\n");
    abort();
  }
  const char* dir = getenv("UROCE_HOLD_DIR");
  const char* type = getenv("UROCE_HOLD_QP_TYPE");
  const enum ibv_qp_type want = type && strcmp(type, "UD") == 0 ? IBV_QPT_UD : IBV_QPT_RC;
  if (dir && qp && qp->qp_type == want) {
    hold();
    ++held;
  }
  return real(qp);
}
