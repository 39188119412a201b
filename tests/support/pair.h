// Two transport engines joined by a SimWire, with helpers to create
// connected QPs (RC, UC or UD) and registered buffers. Used by the
// transport tests and benchmarks.
#pragma once

#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#include "drivers/sim/sim_wire.h"
#include "stack/transport/engine.h"

namespace uroce::testing {

using namespace uroce::transport;

struct Side {
  std::unique_ptr<Engine> eng;
  Pd* pd = nullptr;
  Cq* cq = nullptr;  // send and receive completions
  std::vector<std::uint8_t> mem;
  Mr* mr = nullptr;
};

struct QpPair {
  Qp* a = nullptr;
  Qp* b = nullptr;
};

struct PairOptions {
  ibv_qp_type type = IBV_QPT_RC;
  ibv_mtu mtu = IBV_MTU_1024;
  std::uint32_t psn_a = 0x100;
  std::uint32_t psn_b = 0x200;
  std::uint8_t timeout = 8;       // 4.096 us * 2^8 ~= 1 ms on the virtual clock
  std::uint8_t retry_cnt = 7;
  std::uint8_t rnr_retry = 7;
  std::uint8_t min_rnr_timer = 1;  // 10 us
  std::uint8_t rd_atomic = 4;
  unsigned access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                    IBV_ACCESS_REMOTE_ATOMIC;
  QpCap cap{};
  std::uint32_t qkey = 0x11111111;
  bool ipv6 = false;
  bool selective_repeat = false;  // both QPs, before RTR
};

class Pair {
 public:
  /// `configure`, if given, adjusts node i's engine configuration first.
  explicit Pair(std::uint64_t seed = 1, std::size_t mem_bytes = 4u << 20, std::uint32_t max_qps = 64,
                bool ipv6 = false, const std::function<void(int, EngineConfig&)>& configure = {})
      : wire(seed) {
    for (int i = 0; i < 2; ++i) {
      EngineConfig c;
      c.mac = {0x02, 0, 0, 0, 0, static_cast<std::uint8_t>(0xa + i)};
      if (ipv6) {
        wire::IpAddr::parse(i == 0 ? "fd00::a" : "fd00::b", c.ip);
      } else {
        c.ip = wire::IpAddr::from_v4(10, 0, 0, static_cast<std::uint8_t>(1 + i));
      }
      c.max_qps = max_qps;
      c.seed = seed * 2 + static_cast<std::uint64_t>(i);
      if (configure) configure(i, c);
      Side& n = node[i];
      n.eng = std::make_unique<Engine>(c);
      n.pd = n.eng->alloc_pd();
      n.cq = n.eng->create_cq(1u << 16);
      n.mem.assign(mem_bytes, 0);
      n.mr = n.eng->reg_mr(n.pd, n.mem.data(), n.mem.size(),
                           IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                               IBV_ACCESS_REMOTE_ATOMIC);
      wire.attach(n.eng.get());
    }
    for (int i = 0; i < 2; ++i)
      node[i].eng->set_neighbor(node[1 - i].eng->config().ip, node[1 - i].eng->config().mac);
  }

  Engine& A() { return *node[0].eng; }
  Engine& B() { return *node[1].eng; }

  /// Creates a QP on each side and moves both to RTS, connected to each other.
  QpPair connect(const PairOptions& o = {}) {
    QpPair p;
    Qp* q[2];
    for (int i = 0; i < 2; ++i) {
      QpInitAttr ia;
      ia.qp_type = o.type;
      ia.send_cq = ia.recv_cq = node[i].cq;
      ia.cap = o.cap;
      q[i] = node[i].eng->create_qp(node[i].pd, ia);
      if (o.selective_repeat && node[i].eng->set_selective_repeat(q[i], true) != 0) std::abort();
    }
    for (int i = 0; i < 2; ++i) {
      abi::Connect k;
      k.type = o.type;
      k.access = o.access;
      k.qkey = o.qkey;
      k.path_mtu = o.mtu;
      k.dest_qp_num = q[1 - i]->qpn;
      k.rq_psn = i == 0 ? o.psn_b : o.psn_a;
      k.sq_psn = i == 0 ? o.psn_a : o.psn_b;
      std::memcpy(k.dgid.raw, node[1 - i].eng->config().ip.b.data(), 16);
      k.max_rd_atomic = k.max_dest_rd_atomic = o.rd_atomic;
      k.min_rnr_timer = o.min_rnr_timer;
      k.timeout = o.timeout;
      k.retry_cnt = o.retry_cnt;
      k.rnr_retry = o.rnr_retry;
      must(node[i].eng->bring_up(q[i], k));
    }
    p.a = q[0];
    p.b = q[1];
    return p;
  }

  static void must(const ModifyResult& r) {
    if (!r) {
      std::fprintf(stderr, "modify_qp failed: %s\n", r.why);
      std::abort();
    }
  }

  /// An SGE over node i's registered memory.
  Sge sge(int i, std::uint64_t off, std::uint32_t len) {
    return Sge{reinterpret_cast<std::uint64_t>(node[i].mem.data() + off), len, node[i].mr->lkey};
  }
  std::uint64_t addr(int i, std::uint64_t off) { return reinterpret_cast<std::uint64_t>(node[i].mem.data() + off); }
  std::uint32_t rkey(int i) { return node[i].mr->rkey; }
  /// A signalled RDMA WRITE of `s` to node i's memory at `off`.
  SendWr write_to(int i, const Sge& s, std::uint64_t off, std::uint64_t wr_id = 1) {
    SendWr w;
    w.wr_id = wr_id;
    w.opcode = IBV_WR_RDMA_WRITE;
    w.send_flags = IBV_SEND_SIGNALED;
    w.sg_list = {&s, 1};
    w.remote_addr = addr(i, off);
    w.rkey = rkey(i);
    return w;
  }

  /// Polls up to `max` completions from node i into `out` (appending).
  int poll(int i, std::vector<ibv_wc>& out, int max = 64) {
    ibv_wc wc[64];
    const int n = node[i].eng->poll_cq(node[i].cq, std::span<ibv_wc>(wc, static_cast<std::size_t>(std::min(max, 64))));
    out.insert(out.end(), wc, wc + n);
    return n;
  }

  sim::SimWire wire;
  Side node[2];
};

}  // namespace uroce::testing
