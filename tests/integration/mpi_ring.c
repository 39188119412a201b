/* A small MPI program for uroce: built with Debian's mpicc, run by mpirun
 * with Open MPI's UCX PML over uroce's verbs devices (tests/integration/
 * ucx.sh). Every rank sends a message of each size to the next rank and
 * receives one from the one before, every byte checked: the receive buffer
 * is filled with the complement of the expected bytes first, so a byte not
 * placed is a wrong byte, and the received count must be the size sent.
 * Then an Allreduce whose sum is known. Prints "rank R: N passed, M failed".
 *
 *   mpi_ring [ROUNDS]      (default 20)
 *
 * With MPI_RING_HOLD=DIR in its environment, a rank creates DIR/held.RANK
 * once everything is checked and waits for DIR/release.RANK (at most 120 s)
 * before MPI_Finalize, so that the test can read the daemon's per-QP status
 * while the QPs that carried the traffic still exist. */
#define _GNU_SOURCE
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static unsigned char pattern(int from, size_t size, int round, size_t i) {
  return (unsigned char)((size_t)from * 37 + size * 11 + (size_t)round * 5 + i * 3 + 1);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, n = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  const int rounds = argc > 1 ? atoi(argv[1]) : 20;
  static const size_t sizes[] = {1, 64, 1000, 4096, 8193, 65536, 1 << 20};
  const size_t max = 1 << 20;
  unsigned char* out = malloc(max);
  unsigned char* in = malloc(max);
  int passed = 0, failed = 0;
  const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
  for (int r = 0; r < rounds; ++r) {
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; ++s) {
      const size_t size = sizes[s];
      for (size_t i = 0; i < size; ++i) out[i] = pattern(rank, size, r, i);
      for (size_t i = 0; i < size; ++i) in[i] = (unsigned char)~pattern(prev, size, r, i);
      MPI_Status st;
      MPI_Sendrecv(out, (int)size, MPI_BYTE, next, 7, in, (int)size, MPI_BYTE, prev, 7, MPI_COMM_WORLD, &st);
      int bad = 0, count = -1;
      MPI_Get_count(&st, MPI_BYTE, &count);
      for (size_t i = 0; i < size; ++i) bad += in[i] != pattern(prev, size, r, i);
      if (bad || count != (int)size) {
        ++failed;
        printf("rank %d: round %d, %zu bytes from rank %d: %d received, %d wrong\n", rank, r, size, prev, count, bad);
      } else {
        ++passed;
      }
    }
  }
  long mine = rank + 1, sum = 0;
  MPI_Allreduce(&mine, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  if (sum == (long)n * (n + 1) / 2) ++passed;
  else ++failed, printf("rank %d: Allreduce gave %ld\n", rank, sum);
  printf("rank %d: %d passed, %d failed\n", rank, passed, failed);
  fflush(stdout);
  const char* hold = getenv("MPI_RING_HOLD");
  if (hold) {
    char held[4096], release[4096];
    snprintf(held, sizeof held, "%s/held.%d", hold, rank);
    snprintf(release, sizeof release, "%s/release.%d", hold, rank);
    FILE* f = fopen(held, "w");
    if (f) fclose(f);
    const struct timespec tick = {0, 10 * 1000 * 1000};
    for (int i = 0; i < 12000 && access(release, F_OK) != 0; ++i) nanosleep(&tick, NULL);
  }
  free(out);
  free(in);
  MPI_Finalize();
  return failed ? 1 : 0;
}
