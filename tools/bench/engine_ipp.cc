// A fixed workload for callgrind: N 8-byte WRITEs and N 8-byte SENDs over the
// in-memory wire. tools/bench/ipp.sh runs it under callgrind and divides the
// inclusive cost of the requester and responder entry points by the packets.
// A second argument paces A's QP at that many bits/s (the pacer's own cost:
// a rate high enough never to hold a packet back); a third gives A's QP
// that congestion control (its hooks' cost: nothing congests here).
#include <cstdio>
#include <cstdlib>

#include "tools/bench/loopback.h"

using namespace uroce::bench;

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 20000;
  Loopback lb(IBV_MTU_1024, 1024);
  Side& a = lb.side[0];
  Side& b = lb.side[1];
  if (argc > 2) a.eng->set_rate(a.qp, std::strtoull(argv[2], nullptr, 10));
  if (argc > 3 && a.eng->set_cc(a.qp, argv[3]) != 0) return std::fprintf(stderr, "no congestion control %s\n", argv[3]), 2;
  Sge s{reinterpret_cast<std::uint64_t>(a.mem.data()), 8, a.mr->lkey};
  Sge r{reinterpret_cast<std::uint64_t>(b.mem.data()), 64, b.mr->lkey};
  ibv_wc wc[64];
  for (ibv_wr_opcode op : {IBV_WR_RDMA_WRITE, IBV_WR_SEND}) {
    int posted = 0, done = 0;
    while (done < n) {
      while (posted < n && posted - done < 256) {
        if (op == IBV_WR_SEND) b.eng->post_recv(b.qp, RecvWr{0, {&r, 1}});
        SendWr wr;
        wr.opcode = op;
        wr.sg_list = {&s, 1};
        wr.remote_addr = reinterpret_cast<std::uint64_t>(b.mem.data());
        wr.rkey = b.mr->rkey;
        wr.send_flags = IBV_SEND_SIGNALED;
        a.eng->post_send(a.qp, wr);
        ++posted;
      }
      lb.pump();
      done += a.eng->poll_cq(a.cq, wc);
      b.eng->poll_cq(b.cq, wc);
    }
  }
  std::printf("request packets sent by A: %lu, frames received by B: %lu\n",
              static_cast<unsigned long>(a.qp->ctr[QpCounter::sent_pkts]),
              static_cast<unsigned long>(b.eng->counters()[PortCounter::rx_frames]));
  return 0;
}
