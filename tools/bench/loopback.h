// Two engines joined back to back in memory, for benchmarks: each frame is
// flattened (as a NIC would DMA it) and handed to the other engine at once.
// No impairments, no event queue: this measures the engine.
#pragma once

#include <cstring>
#include <memory>
#include <vector>

#include "stack/transport/engine.h"

namespace uroce::bench {

using namespace uroce::transport;

struct Side {
  std::unique_ptr<Engine> eng;
  Pd* pd = nullptr;
  Cq* cq = nullptr;
  std::vector<std::uint8_t> mem;
  Mr* mr = nullptr;
  Qp* qp = nullptr;
};

class Loopback {
 public:
  Loopback(ibv_mtu mtu, std::uint32_t sq_depth = 1024, std::size_t mem = 8u << 20, std::uint32_t max_qps = 1024)
      : mtu_(mtu) {
    for (int i = 0; i < 2; ++i) {
      EngineConfig c;
      c.mac = {0x02, 0, 0, 0, 0, static_cast<std::uint8_t>(1 + i)};
      c.ip = wire::IpAddr::from_v4(10, 0, 0, static_cast<std::uint8_t>(1 + i));
      c.tx_ring = 4096;
      c.send_window = 1024;
      c.max_qps = max_qps;
      Side& s = side[i];
      s.eng = std::make_unique<Engine>(c);
      s.pd = s.eng->alloc_pd();
      s.cq = s.eng->create_cq(65536);
      s.mem.assign(mem, 1);
      s.mr = s.eng->reg_mr(s.pd, s.mem.data(), s.mem.size(),
                           IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
    }
    for (int i = 0; i < 2; ++i) side[i].eng->set_neighbor(side[1 - i].eng->config().ip, side[1 - i].eng->config().mac);
    auto [a, b] = add_pair(sq_depth);
    side[0].qp = a;
    side[1].qp = b;
    buf_.resize(8192);
  }

  /// Another connected QP pair (RTS on both sides), or nulls when the engines are full.
  std::pair<Qp*, Qp*> add_pair(std::uint32_t depth) {
    Qp* q[2];
    for (int i = 0; i < 2; ++i) {
      QpInitAttr ia;
      ia.send_cq = ia.recv_cq = side[i].cq;
      ia.cap.max_send_wr = depth;
      ia.cap.max_recv_wr = depth;
      q[i] = side[i].eng->create_qp(side[i].pd, ia);
      if (!q[i]) return {nullptr, nullptr};
    }
    for (int i = 0; i < 2; ++i) {
      abi::Connect k;
      k.access = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
      k.path_mtu = mtu_;
      k.dest_qp_num = q[1 - i]->qpn;
      std::memcpy(k.dgid.raw, side[1 - i].eng->config().ip.b.data(), 16);
      k.min_rnr_timer = 1;
      k.max_rd_atomic = k.max_dest_rd_atomic = 16;
      side[i].eng->bring_up(q[i], k);
    }
    return {q[0], q[1]};
  }

  /// One round: both engines poll, and each frame crosses to the other side.
  /// Returns the number of frames moved.
  std::size_t pump() {
    std::size_t n = 0;
    for (int i = 0; i < 2; ++i) {
      Engine& from = *side[i].eng;
      Engine& to = *side[1 - i].eng;
      from.poll(now);
      n += from.drain_tx([&](const TxFrame& f) {
        const std::size_t len = f.copy_to(buf_);
        to.rx(wire::ConstBytes(buf_.data(), len), now);
      });
    }
    now += 1000;
    return n;
  }

  Side side[2];
  std::uint64_t now = 1'000'000;

 private:
  std::vector<std::uint8_t> buf_;
  ibv_mtu mtu_;
};

}  // namespace uroce::bench
