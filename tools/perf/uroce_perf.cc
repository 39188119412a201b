// uroce-perf: perftest's tests over uroce, with perftest's flags, output
// columns and out-of-band exchange, so real perftest can be the peer.
//
//   uroce-perf TEST [options]          server (no host)
//   uroce-perf TEST [options] HOST     client
//   TEST: write_bw write_lat send_bw send_lat read_bw read_lat atomic_bw atomic_lat
//
// The run follows perftest's protocol (tools/perf/perftest_oob.h, and the
// message sequence per test in docs/performance.md): the same key rounds at
// the same points, the same buffers and target addresses, the same
// ping-pong roles (write_lat: the server writes first; send_lat: the client
// sends first; read/atomic: only the client issues), and the same report
// exchange for write/read/atomic_bw.
#include <getopt.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "stack/verbs/uroce_verbs.h"
#include "tools/perf/perftest_oob.h"
#include "tools/perf/wait.h"

namespace {

using uroce::perf::BwReport;
using uroce::perf::Dest;
using uroce::perf::PerftestOob;
using clk = std::chrono::steady_clock;

enum class Verb { kWrite, kSend, kRead, kAtomic };
enum class Kind { kBw, kLat };

struct Options {
  std::string test;
  Verb verb = Verb::kWrite;
  Kind kind = Kind::kBw;
  std::string host;  // empty: server
  std::uint16_t port = 18515;
  std::uint32_t size = 0;
  std::uint64_t iters = 0;
  bool all = false;
  std::uint32_t qps = 1;
  double duration = 0;
  bool gbits = false;
  int mtu = 0;  // bytes; 0: the port's (1024)
  int gid_index = 0;
  std::string device;
  bool json = false;
  std::uint32_t tx_depth = 0;
  std::uint32_t rx_depth = 0;
  std::uint32_t cq_mod = 100;
  int timeout_ms = 60000;  // waiting for the peer
  uroce::tools::WaitMode wait;  // spin briefly, then block; or busy-poll
  std::uint8_t qp_timeout = 14;  // -u: 4.096 us * 2^N before a retry (perftest's default 14)
  std::int64_t psn = -1;         // --psn: QP i's first send PSN is this + i (default: random)
};

const char* verb_name(Verb v) {
  switch (v) {
    case Verb::kWrite: return "RDMA_Write";
    case Verb::kSend: return "Send";
    case Verb::kRead: return "RDMA_Read";
    case Verb::kAtomic: return "Atomic";
  }
  return "?";
}

constexpr std::uint32_t kMaxRdAtomic = 16;  // what uroce's QPs accept (query_device's max_qp_rd_atom)

std::uint32_t mtu_enum(int bytes) {
  switch (bytes) {
    case 256: return IBV_MTU_256;
    case 512: return IBV_MTU_512;
    case 1024: return IBV_MTU_1024;
    case 2048: return IBV_MTU_2048;
    case 4096: return IBV_MTU_4096;
  }
  return 0;
}

// ------------------------------------------------------------------ setup

struct Ctx {
  const Options* o = nullptr;
  uroce_context* ctx = nullptr;
  uroce_pd* pd = nullptr;
  uroce_cq* cq = nullptr;
  uroce_comp_channel* channel = nullptr;  // blocking waits
  uroce_mr* mr = nullptr;
  std::uint8_t* buf = nullptr;
  std::size_t buff_size = 0;  // perftest's BUFF_SIZE: max(size, cycle buffer), per QP and direction
  std::uint32_t cycle = 4096, cache_line = 64;
  std::vector<uroce_qp*> qp;
  std::vector<Dest> mine, theirs;
  int mtu = IBV_MTU_1024;
  std::string devname;
  ibv_wc_status failed = IBV_WC_SUCCESS;  // the status of the last failed completion
  std::uint32_t lat_pkts = 0;             // packets sent by write_lat on QP 0, for the PSN of the last

  [[nodiscard]] std::uint8_t* send_half(std::uint32_t q) const { return buf + q * buff_size; }
  [[nodiscard]] std::uint8_t* recv_half(std::uint32_t q) const { return buf + (o->qps + q) * buff_size; }
};

bool die(const std::string& why) {
  std::fprintf(stderr, "uroce-perf: %s\n", why.c_str());
  return false;
}

std::string find_device(const std::string& want, std::string& name) {
  if (want.find('/') != std::string::npos || want.rfind("embedded:", 0) == 0) {  // a path or an embedded spec
    name = want;
    return want;
  }
  int n = 0;
  uroce_device** list = uroce_get_device_list(&n);
  std::string path;
  for (int i = 0; i < n && path.empty(); ++i)
    if (want.empty() || want == uroce_get_device_name(list[i])) {
      path = uroce_get_device_path(list[i]);
      name = uroce_get_device_name(list[i]);
    }
  uroce_free_device_list(list);
  return path;
}

bool setup(Ctx& c, const Options& o, std::uint32_t max_size) {
  c.o = &o;
  const std::string path = find_device(o.device, c.devname);
  if (path.empty())
    return die(o.device.empty() ? "no uroce device (start uroced with --app-socket under /run/uroce, or set "
                                  "UROCE_DEVICES, or pass -d SOCKET)"
                                : "no device named " + o.device);
  c.ctx = uroce_open_device(path.c_str());
  if (!c.ctx) return die(std::string("cannot open ") + path + ": " + uroce_last_error());
  c.cycle = static_cast<std::uint32_t>(sysconf(_SC_PAGESIZE));
  c.buff_size = std::max<std::size_t>(max_size, c.cycle);
  const std::size_t total = 2 * c.buff_size * o.qps;
  c.buf = static_cast<std::uint8_t*>(uroce_alloc_buf(c.ctx, total));
  c.pd = uroce_alloc_pd(c.ctx);
  if (!c.buf || !c.pd) return die(std::string("cannot allocate: ") + uroce_last_error());
  c.mr = uroce_reg_mr(c.pd, c.buf, total,
                      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                          IBV_ACCESS_REMOTE_ATOMIC);
  if (!o.wait.busy) c.channel = uroce_create_comp_channel(c.ctx);
  c.cq = uroce_create_cq(c.ctx, static_cast<int>((o.tx_depth + o.rx_depth) * o.qps + 16), nullptr, c.channel, 0);
  if (!c.mr || !c.cq || (!o.wait.busy && !c.channel)) return die(std::string("cannot register memory or make the CQ: ") + uroce_last_error());
  ibv_gid gid{};
  uroce_query_gid(c.ctx, 1, 0, &gid);
  std::mt19937 rng(static_cast<unsigned>(getpid()) * static_cast<unsigned>(time(nullptr)));
  for (std::uint32_t i = 0; i < o.qps; ++i) {
    uroce_qp_init_attr ia{};
    ia.send_cq = ia.recv_cq = c.cq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = o.tx_depth + 1;
    ia.cap.max_recv_wr = std::max<std::uint32_t>(o.rx_depth, 1);
    uroce_qp* q = uroce_create_qp(c.pd, &ia);
    if (!q) return die(std::string("cannot create a QP: ") + uroce_last_error());
    c.qp.push_back(q);
    Dest d;
    d.out_reads = (o.verb == Verb::kRead || o.verb == Verb::kAtomic) ? kMaxRdAtomic : 1;
    d.qpn = uroce_qp_num(q);
    d.psn = o.psn >= 0 ? static_cast<std::uint32_t>((o.psn + i) & 0xffffff) : rng() & 0xffffff;
    d.rkey = uroce_mr_rkey(c.mr);
    d.vaddr = reinterpret_cast<std::uint64_t>(c.recv_half(i));
    std::memcpy(d.gid.data(), gid.raw, 16);
    c.mine.push_back(d);
  }
  c.theirs.resize(o.qps);
  return true;
}

bool connect_qps(Ctx& c) {
  for (std::uint32_t i = 0; i < c.o->qps; ++i) {
    const Dest& me = c.mine[i];
    const Dest& th = c.theirs[i];
    uroce_rc_conn k{};
    k.dest_qp_num = th.qpn;
    std::memcpy(k.dgid.raw, th.gid.data(), 16);
    k.rq_psn = th.psn;
    k.sq_psn = me.psn;
    k.path_mtu = static_cast<ibv_mtu>(c.mtu);
    k.access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
    k.timeout = c.o->qp_timeout;
    // perftest's rule: we accept as many READs as we said we would, and
    // issue as many as the peer said it accepts.
    k.max_dest_rd_atomic = static_cast<std::uint8_t>(std::clamp<std::uint32_t>(me.out_reads, 1, kMaxRdAtomic));
    k.max_rd_atomic = static_cast<std::uint8_t>(std::clamp<std::uint32_t>(th.out_reads, 1, kMaxRdAtomic));
    if (uroce_connect_qp(c.qp[i], &k) != 0) return die(std::string("cannot connect QP: ") + uroce_last_error());
  }
  return true;
}

// ---------------------------------------------------------------- progress

/// A progress line on stderr, once a second, for runs that take a while.
struct Progress {
  explicit Progress(std::uint64_t total, double duration) : total(total), duration(duration) {}
  void tick(std::uint64_t done) {
    if ((++calls & 15) != 0) return;  // a clock read every 16 calls: cheap when busy-polling, often enough when blocking
    const auto now = clk::now();
    const double el = std::chrono::duration<double>(now - start).count();
    // The first line at 1.5 s (so a 2 s run shows one), then once a second.
    if (el < 1.5 || now - last < std::chrono::seconds(1)) return;
    last = now;
    shown = true;
    if (duration > 0)
      std::fprintf(stderr, " progress: %.0f of %.0f s, %lu operations\n", el, duration, static_cast<unsigned long>(done));
    else
      std::fprintf(stderr, " progress: %lu of %lu (%.0f%%), %.1f s\n", static_cast<unsigned long>(done),
                   static_cast<unsigned long>(total), 100.0 * static_cast<double>(done) / static_cast<double>(total), el);
  }
  std::uint64_t total;
  double duration;
  std::uint64_t calls = 0;
  bool shown = false;
  clk::time_point start = clk::now(), last = clk::now();
};

// ------------------------------------------------------------------- runs

struct BwResult {
  std::uint64_t size = 0, iters = 0;
  double peak = 0, avg = 0, rate = 0;  // bytes/s, bytes/s, messages/s
};

struct LatResult {
  std::uint64_t size = 0, iters = 0;
  double t_min = 0, t_max = 0, t_typical = 0, t_avg = 0, t_stdev = 0, p99 = 0, p999 = 0;
};

/// perftest's INC: size rounded up to the cache line.
std::uint64_t inc(std::uint64_t size, std::uint32_t line) { return (size + line - 1) / line * line; }

int poll_some(Ctx& c, ibv_wc* wc, int n, std::string& err) {
  const int got = uroce::tools::poll_wait(c.cq, n, wc, c.o->wait, 100);
  if (got < 0) {
    err = std::string("cannot wait for completions: ") + uroce_last_error();
    return -1;
  }
  for (int i = 0; i < got; ++i)
    if (wc[i].status != IBV_WC_SUCCESS) {
      c.failed = wc[i].status;
      err = std::string("completion error: ") + uroce_wc_status_str(wc[i].status) + " (wr_id " +
            std::to_string(wc[i].wr_id) + ")";
      return -1;
    }
  return got;
}

/// The client of write/read/atomic/send BW: tx_depth in flight per QP,
/// signalled every cq_mod, addresses cycling through the cycle buffer for
/// small messages (as perftest).
bool run_bw_client(Ctx& c, std::uint64_t size, BwResult& r) {
  const Options& o = *c.o;
  const std::uint32_t nq = o.qps;
  const bool timed = o.duration > 0;
  const std::uint64_t per_qp = timed ? UINT64_MAX : o.iters;
  const std::uint32_t cq_mod = std::min(o.cq_mod, o.tx_depth);
  const bool cycling = size <= c.cycle / 2;
  const std::uint64_t step = inc(size, c.cache_line), slots = cycling ? c.cycle / step : 1;
  std::vector<std::uint64_t> posted(nq, 0), done(nq, 0);
  std::vector<bool> tail(nq, false);  // duration mode: the last WR posted is signalled
  std::uint64_t total_done = 0;
  double peak = 0;
  Progress prog(o.iters * nq, o.duration);
  const auto t0 = clk::now();
  auto last = t0;
  const auto end = t0 + std::chrono::duration_cast<clk::duration>(std::chrono::duration<double>(o.duration));
  bool stop = false;
  std::string err;
  ibv_wc wc[32];
  // Posts WR number k (from 0) on QP q.
  auto post = [&](std::uint32_t q, std::uint64_t k, bool signal) {
    const std::uint64_t off = cycling ? (k % slots) * step : 0;
    ibv_sge sg{reinterpret_cast<std::uint64_t>(c.send_half(q)) + off, static_cast<std::uint32_t>(size),
               uroce_mr_lkey(c.mr)};
    ibv_send_wr w{};
    w.wr_id = (static_cast<std::uint64_t>(q) << 48) | (k + 1);
    w.sg_list = &sg;
    w.num_sge = 1;
    w.send_flags = signal ? IBV_SEND_SIGNALED : 0;
    switch (o.verb) {
      case Verb::kWrite: w.opcode = IBV_WR_RDMA_WRITE; break;
      case Verb::kRead: w.opcode = IBV_WR_RDMA_READ; break;
      case Verb::kSend: w.opcode = IBV_WR_SEND; break;
      case Verb::kAtomic: w.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD; break;
    }
    if (o.verb == Verb::kAtomic) {
      w.wr.atomic.remote_addr = c.theirs[q].vaddr + off;
      w.wr.atomic.rkey = c.theirs[q].rkey;
      w.wr.atomic.compare_add = 1;
    } else {
      w.wr.rdma.remote_addr = c.theirs[q].vaddr + off;
      w.wr.rdma.rkey = c.theirs[q].rkey;
    }
    ibv_send_wr* bad = nullptr;
    if (uroce_post_send(c.qp[q], &w, &bad) != 0) return false;
    ++posted[q];
    return true;
  };
  while (true) {
    if (timed && !stop && clk::now() >= end) stop = true;
    bool finished = true;
    for (std::uint32_t q = 0; q < nq; ++q) {
      if (!stop) {
        while (posted[q] < per_qp && posted[q] - done[q] < o.tx_depth) {
          const std::uint64_t k = posted[q];
          if (!post(q, k, (k + 1) % cq_mod == 0 || k + 1 == per_qp)) break;
        }
      } else if (!tail[q]) {
        // Stopping: make sure the last WR is signalled, or its count is never seen.
        if (posted[q] % cq_mod == 0) tail[q] = true;
        else if (posted[q] - done[q] < o.tx_depth && post(q, posted[q], true)) tail[q] = true;
      }
      const bool q_done = timed ? (stop && tail[q] && done[q] == posted[q]) : done[q] == per_qp;
      finished = finished && q_done;
    }
    if (finished) break;
    const int n = poll_some(c, wc, 32, err);
    if (n < 0) return die(err);
    for (int i = 0; i < n; ++i) {
      const auto q = static_cast<std::uint32_t>(wc[i].wr_id >> 48);
      const std::uint64_t upto = wc[i].wr_id & 0xffffffffffffull;
      const std::uint64_t newly = upto - done[q];
      done[q] = upto;
      total_done += newly;
      const auto now = clk::now();
      const double dt = std::chrono::duration<double>(now - last).count();
      if (dt > 0 && newly >= cq_mod) peak = std::max(peak, static_cast<double>(newly * size) / dt);
      last = now;
    }
    prog.tick(total_done);
  }
  const double secs = std::chrono::duration<double>(clk::now() - t0).count();
  r.size = size;
  r.iters = total_done;
  r.avg = static_cast<double>(total_done * size) / secs;
  r.peak = std::max(peak, r.avg);
  r.rate = static_cast<double>(total_done) / secs;
  return true;
}

void post_recvs(Ctx& c, std::uint32_t q, std::uint64_t size, std::uint32_t n) {
  for (std::uint32_t i = 0; i < n; ++i) {
    ibv_sge sg{reinterpret_cast<std::uint64_t>(c.recv_half(q)), static_cast<std::uint32_t>(std::max<std::uint64_t>(size, 1)),
               uroce_mr_lkey(c.mr)};
    ibv_recv_wr w{};
    w.wr_id = q;
    w.sg_list = &sg;
    w.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    uroce_post_recv(c.qp[q], &w, &bad);
  }
}

/// The send_bw server: counts receives and reposts; no peak (as perftest).
bool run_bw_server_send(Ctx& c, std::uint64_t size, BwResult& r) {
  const Options& o = *c.o;
  const std::uint64_t want = o.iters * o.qps;
  std::uint64_t got = 0;
  std::vector<std::uint64_t> posted(o.qps, o.rx_depth);
  ibv_wc wc[32];
  std::string err;
  clk::time_point t0{};
  const auto deadline = clk::now() + std::chrono::milliseconds(o.timeout_ms) +
                        std::chrono::duration_cast<clk::duration>(std::chrono::duration<double>(o.duration));
  Progress prog(want, o.duration);
  while (o.duration > 0 ? clk::now() < deadline : got < want) {
    const int n = poll_some(c, wc, 32, err);
    if (n < 0) return die(err);
    if (n == 0 && o.duration <= 0 && clk::now() > deadline) return die("the client stopped sending");
    for (int i = 0; i < n; ++i) {
      if (got == 0) t0 = clk::now();
      ++got;
      const auto q = static_cast<std::uint32_t>(wc[i].wr_id);
      if (o.duration > 0 || posted[q] < o.iters) {
        post_recvs(c, q, size, 1);
        ++posted[q];
      }
    }
    if (o.duration > 0 && got > 0 &&
        clk::now() - t0 > std::chrono::duration_cast<clk::duration>(std::chrono::duration<double>(o.duration)))
      break;
    prog.tick(got);
  }
  const double secs = std::max(1e-9, std::chrono::duration<double>(clk::now() - t0).count());
  r.size = size;
  r.iters = got;
  r.avg = static_cast<double>(got * size) / secs;
  r.peak = 0;  // perftest's send_bw server prints no peak
  r.rate = static_cast<double>(got) / secs;
  return true;
}

LatResult lat_stats(std::vector<double>& t, double rtt_factor, std::uint64_t size, std::uint64_t iters) {
  // perftest: deltas between consecutive posts, sorted, the 2 largest dropped.
  std::vector<double> d;
  for (std::size_t i = 1; i < t.size(); ++i) d.push_back((t[i] - t[i - 1]) / rtt_factor);
  std::sort(d.begin(), d.end());
  if (d.size() > 3) d.resize(d.size() - 2);
  LatResult r;
  r.size = size;
  r.iters = iters;
  if (d.empty()) return r;
  const std::size_t n = d.size();
  double sum = 0;
  for (double v : d) sum += v;
  r.t_min = d.front();
  r.t_max = d.back();
  r.t_typical = d[n / 2];
  r.t_avg = sum / static_cast<double>(n);
  double var = 0;
  for (double v : d) var += (v - r.t_avg) * (v - r.t_avg);
  r.t_stdev = std::sqrt(var / static_cast<double>(n));
  r.p99 = d[std::min(n - 1, static_cast<std::size_t>(std::ceil(static_cast<double>(n) * 0.99)))];
  r.p999 = d[std::min(n - 1, static_cast<std::size_t>(std::ceil(static_cast<double>(n) * 0.999)))];
  return r;
}

double now_us() { return std::chrono::duration<double, std::micro>(clk::now().time_since_epoch()).count(); }

/// Waits (bounded) for one completion of the wanted kind.
bool wait_wc(Ctx& c, bool want_recv, std::uint64_t& recvs, std::uint64_t& sends, std::string& err) {
  ibv_wc wc[8];
  const auto deadline = clk::now() + std::chrono::milliseconds(c.o->timeout_ms);
  while (true) {
    // One taken earlier (a send and a receive can come in one poll) first:
    // a blocking poll would wait for a completion that is already here.
    if (want_recv ? recvs > 0 : sends > 0) {
      (want_recv ? recvs : sends)--;
      return true;
    }
    const int n = poll_some(c, wc, 8, err);
    if (n < 0) return false;
    for (int i = 0; i < n; ++i) (wc[i].opcode & IBV_WC_RECV) ? ++recvs : ++sends;
    if (n == 0 && clk::now() > deadline) {
      err = "no completion from the peer within the timeout";
      return false;
    }
  }
}

/// write_lat: whether the peer's last WRITE (number iters, seen as the last
/// byte of our receive buffer) has arrived, waiting for it if ours are
/// ahead. A peer writes only after seeing our previous WRITE.
bool last_write_arrived(const Ctx& c, std::uint64_t rcnt, volatile std::uint8_t* poll_buf) {
  const std::uint64_t iters = c.o->iters;
  if (rcnt >= iters) return true;
  if (rcnt + 1 < iters) return false;
  const auto deadline = clk::now() + std::chrono::milliseconds(c.o->timeout_ms);
  return uroce::tools::wait_byte(poll_buf, static_cast<std::uint8_t>(iters), c.o->wait, deadline);
}

bool run_lat(Ctx& c, std::uint64_t size, LatResult& r) {
  const Options& o = *c.o;
  const bool client = !o.host.empty();
  std::vector<double> t;
  t.reserve(o.iters);
  std::string err;
  std::uint64_t recvs = 0, sends = 0;
  ibv_sge sg{reinterpret_cast<std::uint64_t>(c.send_half(0)), static_cast<std::uint32_t>(size), uroce_mr_lkey(c.mr)};
  ibv_send_wr w{};
  w.sg_list = &sg;
  w.num_sge = 1;
  w.send_flags = IBV_SEND_SIGNALED;
  ibv_send_wr* bad = nullptr;
  Progress prog(o.iters, 0);
  if (o.verb == Verb::kWrite) {
    // Both sides write the peer's buffer and spin on the last byte of their
    // own; the server writes first.
    volatile std::uint8_t* post_buf = c.send_half(0) + size - 1;
    volatile std::uint8_t* poll_buf = c.recv_half(0) + size - 1;
    const std::uint64_t mtu = 128u << c.mtu;
    w.opcode = IBV_WR_RDMA_WRITE;
    w.wr.rdma.remote_addr = c.theirs[0].vaddr;
    w.wr.rdma.rkey = c.theirs[0].rkey;
    std::uint64_t scnt = 0, rcnt = 0;
    while (scnt < o.iters || rcnt < o.iters) {
      if (rcnt < o.iters && !(scnt < 1 && !client)) {
        ++rcnt;
        const auto deadline = clk::now() + std::chrono::milliseconds(o.timeout_ms);
        if (!uroce::tools::wait_byte(poll_buf, static_cast<std::uint8_t>(rcnt), o.wait, deadline))
          return die("the peer's write never arrived");
      }
      if (scnt < o.iters) {
        *post_buf = static_cast<std::uint8_t>(++scnt);
        t.push_back(now_us());
        if (uroce_post_send(c.qp[0], &w, &bad) != 0) return die("cannot post a WRITE");
        c.lat_pkts += std::max<std::uint32_t>(1, static_cast<std::uint32_t>((size + mtu - 1) / mtu));
        if (!wait_wc(c, false, recvs, sends, err)) {
          const bool last_lost = scnt == o.iters && c.failed == IBV_WC_RETRY_EXC_ERR;
          // The QP and PSN, for a script that looks for that PSN's ACK in a capture.
          char which[96];
          std::snprintf(which, sizeof which, "QPN 0x%06x PSN 0x%06x to QPN 0x%06x", c.mine[0].qpn,
                        (c.mine[0].psn + c.lat_pkts - 1) & 0xffffff, c.theirs[0].qpn);
          // write_lat has no closing exchange: a peer that has written its
          // last message may leave before the ACK of our last WRITE, lost,
          // is resent. The server writes first, so the client's last WRITE
          // is the run's last message. For the server, the client's last
          // WRITE proves ours arrived (it writes only after seeing it), so
          // this is the end of the run, not a failure. The client has no
          // such proof: nothing follows its last WRITE. It fails, and says
          // why (the peer's own report is the only evidence left).
          if (last_lost && client) {
            std::fprintf(stderr,
                         "uroce-perf: the last WRITE was never acknowledged (%s), and as the client nothing "
                         "from the peer follows it: no proof it arrived (%s)\n",
                         uroce_wc_status_str(c.failed), which);
            return die(err);
          }
          if (!last_lost || !last_write_arrived(c, rcnt, poll_buf)) return die(err);
          std::fprintf(stderr,
                       "uroce-perf: the last WRITE was never acknowledged (%s) but every WRITE from the peer "
                       "arrived: the peer finished and left (%s)\n",
                       uroce_wc_status_str(c.failed), which);
          rcnt = o.iters;
        }
      }
      prog.tick(scnt);
    }
    r = lat_stats(t, 2, size, o.iters);
    return true;
  }
  if (o.verb == Verb::kSend) {
    // Receives were posted before the last key round; the client sends first.
    w.opcode = IBV_WR_SEND;
    std::uint64_t scnt = 0, rcnt = 0, reposted = o.rx_depth;
    while (scnt < o.iters || rcnt < o.iters) {
      if (rcnt < o.iters && !(scnt < 1 && client)) {
        if (!wait_wc(c, true, recvs, sends, err)) return die(err);
        ++rcnt;
        if (reposted < o.iters) {
          post_recvs(c, 0, size, 1);
          ++reposted;
        }
      }
      if (scnt < o.iters) {
        ++scnt;
        t.push_back(now_us());
        if (uroce_post_send(c.qp[0], &w, &bad) != 0 || !wait_wc(c, false, recvs, sends, err)) return die(err);
      }
      prog.tick(scnt);
    }
    r = lat_stats(t, 2, size, o.iters);
    return true;
  }
  // READ and atomic: only the client issues, one at a time.
  if (!client) return true;
  if (o.verb == Verb::kRead) {
    w.opcode = IBV_WR_RDMA_READ;
    w.wr.rdma.remote_addr = c.theirs[0].vaddr;
    w.wr.rdma.rkey = c.theirs[0].rkey;
  } else {
    w.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
    w.wr.atomic.remote_addr = c.theirs[0].vaddr;
    w.wr.atomic.rkey = c.theirs[0].rkey;
    w.wr.atomic.compare_add = 1;
  }
  for (std::uint64_t i = 0; i < o.iters; ++i) {
    t.push_back(now_us());
    if (uroce_post_send(c.qp[0], &w, &bad) != 0 || !wait_wc(c, false, recvs, sends, err)) return die(err);
    prog.tick(i);
  }
  t.push_back(now_us());
  r = lat_stats(t, 1, size, o.iters);
  return true;
}

// ----------------------------------------------------------------- output

constexpr const char* kLine = "---------------------------------------------------------------------------------------\n";

void print_info(const Ctx& c, const Options& o) {
  std::printf("%s                    %s %s Test\n", kLine, verb_name(o.verb), o.kind == Kind::kBw ? "BW" : "Latency");
  std::printf(" Dual-port       : OFF\t\tDevice         : %s\n", c.devname.c_str());
  std::printf(" Number of qps   : %u\t\tTransport type : IB\n", o.qps);
  std::printf(" Connection type : RC\t\tUsing SRQ      : OFF\n");
  if (!o.host.empty() || o.kind == Kind::kLat) std::printf(" TX depth        : %u\n", o.tx_depth);
  if (o.verb == Verb::kSend) std::printf(" RX depth        : %u\n", o.rx_depth);
  if (o.kind == Kind::kBw) std::printf(" CQ Moderation   : %u\n", std::min(o.cq_mod, o.tx_depth));
  std::printf(" Mtu             : %u[B]\n", 128u << c.mtu);
  std::printf(" Link type       : Ethernet\n GID index       : %d\n", o.gid_index);
  if (o.verb == Verb::kRead || o.verb == Verb::kAtomic)
    std::printf(" Outstand reads  : %u\n", kMaxRdAtomic);
  else
    std::printf(" Max inline data : 0[B]\n");
  std::printf(" rdma_cm QPs\t : OFF\n Data ex. method : Ethernet\n%s", kLine);
  auto addr = [&](const char* who, const Dest& d) {
    std::printf(" %s address: LID %#04x QPN %#06x PSN %#06x", who, d.lid, d.qpn, d.psn);
    if (o.verb == Verb::kRead) std::printf(" OUT %#04x", d.out_reads);
    if (o.verb == Verb::kRead || o.verb == Verb::kWrite)
      std::printf(" RKey %#08x VAddr %#016llx", d.rkey, static_cast<unsigned long long>(d.vaddr));
    std::printf("\n GID: ");
    for (std::size_t i = 0; i < 16; ++i) std::printf("%02d%s", d.gid[i], i < 15 ? ":" : "\n");
  };
  for (std::uint32_t i = 0; i < o.qps; ++i) {
    addr("local", c.mine[i]);
    addr("remote", c.theirs[i]);
  }
  std::printf("%s", kLine);
}

void print_bw_header(const Options& o) {
  std::printf(" #bytes     #iterations    BW peak[%s]    BW average[%s]   MsgRate[Mpps]\n",
              o.gbits ? "Gb/sec" : "MB/sec", o.gbits ? "Gb/sec" : "MB/sec");
}

double unit(const Options& o, double bytes_per_s) { return o.gbits ? bytes_per_s / 125e6 : bytes_per_s / 1048576.0; }

void print_bw_row(const Options& o, const BwResult& r) {
  std::printf(" %-7lu    %-10lu       %-7.2f            %-7.2f\t\t   %-7.6f\n", static_cast<unsigned long>(r.size),
              static_cast<unsigned long>(r.iters), unit(o, r.peak), unit(o, r.avg), r.rate / 1e6);
}

void print_lat_header() {
  std::printf(" #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   "
              "99%% percentile[usec]   99.9%% percentile[usec] \n");
}

void print_lat_row(const LatResult& r) {
  std::printf(" %-7lu %lu          %-7.2f        %-7.2f      %-7.2f  \t       %-7.2f     \t%-7.2f\t\t%-7.2f \t\t%-7.2f\n",
              static_cast<unsigned long>(r.size), static_cast<unsigned long>(r.iters), r.t_min, r.t_max, r.t_typical,
              r.t_avg, r.t_stdev, r.p99, r.p999);
}

/// `v` to `digits` decimals, as the text report prints it.
double rounded(double v, int digits) {
  const double k = std::pow(10.0, digits);
  return std::round(v * k) / k;
}

nlohmann::ordered_json bw_json(const Options& o, const BwResult& r) {
  return {{"bytes", r.size},
          {"iterations", r.iters},
          {"bw_peak", rounded(unit(o, r.peak), 4)},
          {"bw_average", rounded(unit(o, r.avg), 4)},
          {"msg_rate_mpps", rounded(r.rate / 1e6, 6)},
          {"unit", o.gbits ? "Gb/sec" : "MB/sec"}};
}

nlohmann::ordered_json lat_json(const LatResult& r) {
  return {{"bytes", r.size},
          {"iterations", r.iters},
          {"t_min", rounded(r.t_min, 3)},
          {"t_max", rounded(r.t_max, 3)},
          {"t_typical", rounded(r.t_typical, 3)},
          {"t_avg", rounded(r.t_avg, 3)},
          {"t_stdev", rounded(r.t_stdev, 3)},
          {"p99", rounded(r.p99, 3)},
          {"p99_9", rounded(r.p999, 3)},
          {"unit", "usec"}};
}

// ------------------------------------------------------------------- main

void usage(FILE* f) {
  std::fprintf(f,
               "usage: uroce-perf TEST [options] [HOST]\n"
               "  TEST: write_bw write_lat send_bw send_lat read_bw read_lat atomic_bw atomic_lat\n"
               "  no HOST: server; HOST: client (perftest's TCP exchange on --port)\n"
               "  -s, --size N          message size (BW 65536, LAT 2; atomics 8)\n"
               "  -n, --iters N         iterations (write_bw 5000, others 1000)\n"
               "  -a, --all             every size from 2 to 8 MiB (between uroce-perf peers)\n"
               "  -q, --qp N            QPs (BW tests)\n"
               "  -D, --duration S      run for S seconds instead of -n\n"
               "  -m, --mtu N           256..4096 (default: the port's, 1024)\n"
               "  -x, --gid-index N     GID index (uroce has one GID per device)\n"
               "  -d, --ib-dev NAME     device name from the device list, or a uroced socket path\n"
               "  -p, --port N          TCP port of the exchange (18515)\n"
               "  -t, --tx-depth N      outstanding WRs per QP (BW 128, LAT 1)\n"
               "  -u, --qp-timeout N    ACK timeout 4.096 us * 2^N (14)\n"
               "      --report_gbits    BW in Gb/s\n"
               "      --json            results as JSON on stdout\n"
               "      --busy-poll       poll completions without end, as perftest does (default: poll\n"
               "                        --spin-us, then block on the completion channel)\n"
               "      --spin-us N       poll this long before blocking (5)\n"
               "      --psn N           the first send PSN (QP i: N + i; default random), so a\n"
               "                        test can aim a fault rule at a PSN before the run\n"
               "      --yield           busy-poll, with sched_yield() after an empty poll\n");
}

bool parse_args(int argc, char** argv, Options& o) {
  if (argc < 2) return false;
  o.test = argv[1];
  static const struct {
    const char* name;
    Verb v;
    Kind k;
  } kTests[] = {{"write_bw", Verb::kWrite, Kind::kBw}, {"write_lat", Verb::kWrite, Kind::kLat},
                {"send_bw", Verb::kSend, Kind::kBw},   {"send_lat", Verb::kSend, Kind::kLat},
                {"read_bw", Verb::kRead, Kind::kBw},   {"read_lat", Verb::kRead, Kind::kLat},
                {"atomic_bw", Verb::kAtomic, Kind::kBw}, {"atomic_lat", Verb::kAtomic, Kind::kLat}};
  bool known = false;
  for (const auto& t : kTests)
    if (o.test == t.name) {
      o.verb = t.v;
      o.kind = t.k;
      known = true;
    }
  if (!known) return die("unknown test '" + o.test + "'");
  enum { kGbits = 1000, kJson, kYield, kBusy, kSpin, kPsn };
  static const option kLong[] = {{"size", required_argument, nullptr, 's'},    {"iters", required_argument, nullptr, 'n'},
                                 {"all", no_argument, nullptr, 'a'},           {"qp", required_argument, nullptr, 'q'},
                                 {"duration", required_argument, nullptr, 'D'}, {"mtu", required_argument, nullptr, 'm'},
                                 {"gid-index", required_argument, nullptr, 'x'}, {"ib-dev", required_argument, nullptr, 'd'},
                                 {"port", required_argument, nullptr, 'p'},    {"tx-depth", required_argument, nullptr, 't'},
                                 {"report_gbits", no_argument, nullptr, kGbits}, {"json", no_argument, nullptr, kJson},
                                 {"yield", no_argument, nullptr, kYield},
                                 {"busy-poll", no_argument, nullptr, kBusy},
                                 {"spin-us", required_argument, nullptr, kSpin},
                                 {"psn", required_argument, nullptr, kPsn},
                                 {"qp-timeout", required_argument, nullptr, 'u'},
                                 {"help", no_argument, nullptr, 'h'},          {nullptr, 0, nullptr, 0}};
  optind = 2;
  int ch;
  auto number = [](const char* s, std::uint64_t lo, std::uint64_t hi, std::uint64_t& out) {
    char* end = nullptr;
    const unsigned long long v = std::strtoull(s, &end, 0);
    if (!end || *end != '\0' || v < lo || v > hi) return false;
    out = v;
    return true;
  };
  std::uint64_t v = 0;
  while ((ch = getopt_long(argc, argv, "s:n:aq:D:m:x:d:p:t:u:h", kLong, nullptr)) != -1) {
    switch (ch) {
      case 's':
        if (!number(optarg, 1, 1u << 23, v)) return die("-s: 1..8388608");
        o.size = static_cast<std::uint32_t>(v);
        break;
      case 'n':
        if (!number(optarg, 5, 100000000, v)) return die("-n: 5..100000000");
        o.iters = v;
        break;
      case 'a': o.all = true; break;
      case 'q':
        if (!number(optarg, 1, 256, v)) return die("-q: 1..256");
        o.qps = static_cast<std::uint32_t>(v);
        break;
      case 'D':
        if (!number(optarg, 1, 3600, v)) return die("-D: 1..3600 seconds");
        o.duration = static_cast<double>(v);
        break;
      case 'm':
        if (!number(optarg, 256, 4096, v) || mtu_enum(static_cast<int>(v)) == 0) return die("-m: 256, 512, 1024, 2048 or 4096");
        o.mtu = static_cast<int>(v);
        break;
      case 'x':
        if (!number(optarg, 0, 255, v)) return die("-x: a GID index");
        o.gid_index = static_cast<int>(v);
        break;
      case 'd': o.device = optarg; break;
      case 'p':
        if (!number(optarg, 1, 65535, v)) return die("-p: a TCP port");
        o.port = static_cast<std::uint16_t>(v);
        break;
      case 't':
        if (!number(optarg, 1, 4096, v)) return die("-t: 1..4096");
        o.tx_depth = static_cast<std::uint32_t>(v);
        break;
      case 'u':
        if (!number(optarg, 1, 31, v)) return die("-u: 1..31");
        o.qp_timeout = static_cast<std::uint8_t>(v);
        break;
      case kGbits: o.gbits = true; break;
      case kJson: o.json = true; break;
      case kYield: o.wait.yield = o.wait.busy = true; break;
      case kBusy: o.wait.busy = true; break;
      case kSpin:
        if (!number(optarg, 0, 1000000, v)) return die("--spin-us: 0..1000000");
        o.wait.spin_us = static_cast<int>(v);
        break;
      case kPsn:
        if (!number(optarg, 0, 0xffffff, v)) return die("--psn: 0..0xffffff");
        o.psn = static_cast<std::int64_t>(v);
        break;
      case 'h': usage(stdout); std::exit(0);
      default: return false;
    }
  }
  if (optind < argc) o.host = argv[optind++];
  if (optind < argc) return die(std::string("unexpected argument '") + argv[optind] + "'");
  if (o.kind == Kind::kLat && o.qps != 1) return die("latency tests use one QP");
  if (o.verb == Verb::kAtomic) o.size = 8;
  if (o.size == 0) o.size = o.kind == Kind::kBw ? 65536 : 2;
  if (o.iters == 0) o.iters = (o.kind == Kind::kBw && o.verb == Verb::kWrite) ? 5000 : 1000;
  if (o.tx_depth == 0) o.tx_depth = o.kind == Kind::kBw ? 128 : 1;
  o.tx_depth = static_cast<std::uint32_t>(std::min<std::uint64_t>(o.tx_depth, o.iters));
  o.rx_depth = o.verb == Verb::kSend ? static_cast<std::uint32_t>(std::min<std::uint64_t>(512, o.iters)) : 1;
  if (o.duration > 0 && o.kind == Kind::kLat) return die("-D is for BW tests here");
  return true;
}

int run(const Options& o) {
  o.wait.setup();
  const bool client = !o.host.empty();
  std::vector<std::uint64_t> sizes;
  if (o.all && o.verb != Verb::kAtomic)
    for (int i = 1; i <= 23; ++i) sizes.push_back(1ull << i);
  else
    sizes.push_back(o.size);
  Ctx c;
  if (!setup(c, o, static_cast<std::uint32_t>(sizes.back()))) return 1;
  PerftestOob oob;
  oob.set_timeout(o.timeout_ms);
  if (!client && !o.json)
    std::printf("\n************************************\n* Waiting for client to connect... *\n"
                "************************************\n");
  std::fflush(stdout);
  if (!(client ? oob.connect(o.host, o.port, o.timeout_ms) : oob.accept(o.port, o.timeout_ms))) return die(oob.error());
  std::string peer_version;
  c.mtu = o.mtu ? static_cast<int>(mtu_enum(o.mtu)) : IBV_MTU_1024;
  auto ex = [&](bool ok) {
    if (!ok) die("exchange with the peer failed: " + oob.error());
    return ok;
  };
  Dest scratch;
  // Before the run: perftest's rounds for this test (docs/performance.md).
  if (!ex(oob.exchange_versions(peer_version)) || !ex(oob.sys_data(c.cycle, c.cache_line)) || !ex(oob.mtu(c.mtu)))
    return 1;
  // write_lat, read_lat and atomic_lat open with one extra round on QP 0.
  const bool extra_first = o.kind == Kind::kLat && o.verb != Verb::kSend;
  if (extra_first && !ex(oob.hand_shake(c.mine[0], scratch))) return 1;
  for (std::uint32_t i = 0; i < o.qps; ++i)
    if (!ex(oob.hand_shake(c.mine[i], c.theirs[i]))) return 1;
  const bool v4 = c.mine[0].gid[10] == 0xff && c.mine[0].gid[11] == 0xff;
  const bool rv4 = c.theirs[0].gid[10] == 0xff && c.theirs[0].gid[11] == 0xff;
  if (v4 != rv4) return die("the peer's GID is of the other IP version (perftest: incompatible GID types)"), 1;
  if (!connect_qps(c)) return 1;
  const bool send = o.verb == Verb::kSend;
  if (send && !ex(oob.hand_shake(c.mine[0], scratch))) return 1;  // after connect
  for (std::uint32_t i = 0; i < o.qps; ++i)
    if (!ex(oob.hand_shake(c.mine[i], scratch))) return 1;  // the second loop
  if (send) {
    // send_bw: the server posts its receives; send_lat: both do.
    if (!client || o.kind == Kind::kLat)
      for (std::uint32_t q = 0; q < o.qps; ++q) post_recvs(c, q, sizes.front(), o.rx_depth);
  }
  if (!ex(oob.hand_shake(c.mine[0], scratch))) return 1;  // "after RTR" / pre-run
  if (!o.json) print_info(c, o);
  std::fflush(stdout);  // scripts read the addresses while the run goes on

  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  if (o.kind == Kind::kBw) {
    if (!o.json) print_bw_header(o);
    oob.set_timeout(o.timeout_ms + static_cast<int>(o.duration * 1000) * static_cast<int>(sizes.size()) + 600000);
    for (std::size_t si = 0; si < sizes.size(); ++si) {
      const std::uint64_t size = sizes[si];
      BwResult r;
      bool ok = true;
      if (client) {
        ok = run_bw_client(c, size, r);
      } else if (send) {
        ok = run_bw_server_send(c, size, r);
      }
      if (!ok) return 1;
      if (si + 1 < sizes.size()) {  // -a between uroce-perf peers: line up the next size
        if (send && !client)
          for (std::uint32_t q = 0; q < o.qps; ++q) post_recvs(c, q, sizes[si + 1], o.rx_depth);
        if (!ex(oob.hand_shake(c.mine[0], scratch))) return 1;
      }
      if (!send) {
        // write/read/atomic_bw: a key round, then the report; the server prints the client's.
        if (si + 1 == sizes.size() && !ex(oob.hand_shake(c.mine[0], scratch))) return 1;
        BwReport mine{r.size, r.iters, unit(o, r.peak), unit(o, r.avg), r.rate / 1e6}, theirs;
        if (si + 1 == sizes.size()) {
          if (!ex(oob.bw_report(mine, theirs))) return 1;
          if (!client) {
            r.size = theirs.size;
            r.iters = theirs.iters;
            const double k = o.gbits ? 125e6 : 1048576.0;
            r.peak = theirs.bw_peak * k;
            r.avg = theirs.bw_avg * k;
            r.rate = theirs.msg_rate * 1e6;
          }
        } else if (!client) {
          continue;  // the server of -a learns only the last size's report
        }
      }
      if (o.json) rows.push_back(bw_json(o, r));
      else print_bw_row(o, r);
    }
  } else {
    if (!o.json) print_lat_header();
    for (std::size_t si = 0; si < sizes.size(); ++si) {
      LatResult r;
      if (!run_lat(c, sizes[si], r)) return 1;
      const bool prints = client || o.verb == Verb::kWrite || o.verb == Verb::kSend;
      if (si + 1 < sizes.size()) {
        if (send)
          for (std::uint32_t q = 0; q < o.qps; ++q) post_recvs(c, q, sizes[si + 1], o.rx_depth);
        if (!ex(oob.hand_shake(c.mine[0], scratch))) return 1;
      }
      if (!prints) continue;
      if (o.json) rows.push_back(lat_json(r));
      else print_lat_row(r);
    }
  }
  // The close: write_lat has none; the others a key round then "done".
  if (o.test != "write_lat" && !ex(oob.close_connection(c.mine[0]))) return 1;
  if (o.json) {
    // Through the JSON library: a device name or a peer's version string
    // may hold quotes, backslashes or bytes that are not UTF-8.
    const nlohmann::ordered_json doc = {{"test", o.test},       {"role", client ? "client" : "server"},
                                        {"device", c.devname},  {"qps", o.qps},
                                        {"mtu", 128u << c.mtu}, {"peer_version", peer_version},
                                        {"results", rows}};
    std::printf("%s\n", doc.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
    std::printf("%s", kLine);
  }
  // write_lat ends without a closing exchange: the peer may still wait for
  // the ACK of its last WRITE. If that ACK was lost, its retry meets our
  // QP's number in quarantine, where the daemon ACKs it again.
  for (uroce_qp* q : c.qp) uroce_destroy_qp(q);
  uroce_close_device(c.ctx);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (argc >= 2 && (std::string(argv[1]) == "-h" || std::string(argv[1]) == "--help")) {
    usage(stdout);
    return 0;
  }
  if (!parse_args(argc, argv, o)) {
    usage(stderr);
    return 2;
  }
  return run(o);
}
