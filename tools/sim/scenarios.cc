#include "tools/sim/scenarios.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <memory>

namespace uroce::simx {

using namespace uroce::transport;

double jain_index(const std::vector<double>& x) {
  double s = 0, s2 = 0;
  for (double v : x) {
    s += v;
    s2 += v * v;
  }
  return s2 == 0 ? 0 : s * s / (static_cast<double>(x.size()) * s2);
}

namespace {

struct Host {
  std::unique_ptr<Engine> eng;
  Pd* pd = nullptr;
  Cq* cq = nullptr;
  std::vector<std::uint8_t> mem;
  Mr* mr = nullptr;
};

std::unique_ptr<Host> make_host(int i, const IncastConfig& c, std::size_t mem) {
  auto h = std::make_unique<Host>();
  EngineConfig e;
  e.mac = {0x02, 0, 0, 0, static_cast<std::uint8_t>(i >> 8), static_cast<std::uint8_t>(i)};
  e.ip = wire::IpAddr::from_v4(10, 1, static_cast<std::uint8_t>(i >> 8), static_cast<std::uint8_t>(i));
  e.max_qps = 256;
  e.max_mrs = 16;
  e.tx_ring = 16;  // the NIC's queue: a sender waits for its link
  e.line_rate_bps = c.link_bps;
  e.cc = c.cc;
  // The unloaded round trip: four link delays and four full frames' serialisation (two hops each way).
  e.base_rtt_ns = 4 * c.link_delay_ns + 4 * ((128ull << c.mtu) + 78) * 8'000'000'000 / c.link_bps;
  e.seed = c.seed * 1000 + static_cast<std::uint64_t>(i);
  // Selective repeat's cap on packets in flight: about one bandwidth-delay
  // product (IRN's BDP-FC), with room for the host queue.
  const std::uint64_t frame_bits = ((128ull << c.mtu) + 78) * 8;
  e.sr_window = static_cast<std::uint32_t>(std::min<std::uint64_t>(
      256, 16 + (e.base_rtt_ns * c.link_bps / 1'000'000'000 + frame_bits - 1) / frame_bits));
  h->eng = std::make_unique<Engine>(e);
  h->pd = h->eng->alloc_pd();
  h->cq = h->eng->create_cq(1u << 14);
  h->mem.assign(mem, static_cast<std::uint8_t>(i));
  h->mr = h->eng->reg_mr(h->pd, h->mem.data(), h->mem.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  return h;
}

/// An RC QP on each host, connected to the other, at RTS.
std::pair<Qp*, Qp*> connect(Host& a, Host& b, const IncastConfig& c) {
  Qp* q[2];
  Host* h[2] = {&a, &b};
  for (int i = 0; i < 2; ++i) {
    QpInitAttr ia;
    ia.send_cq = ia.recv_cq = h[i]->cq;
    ia.cap.max_send_wr = 64;
    ia.cap.max_recv_wr = 4;
    q[i] = h[i]->eng->create_qp(h[i]->pd, ia);
    if (c.selective_repeat) h[i]->eng->set_selective_repeat(q[i], true);
  }
  for (int i = 0; i < 2; ++i) {
    abi::Connect k;
    k.access = IBV_ACCESS_REMOTE_WRITE;
    k.path_mtu = c.mtu;
    k.dest_qp_num = q[1 - i]->qpn;
    std::memcpy(k.dgid.raw, h[1 - i]->eng->config().ip.b.data(), 16);
    k.timeout = c.timeout;
    k.retry_cnt = 7;
    k.rnr_retry = 7;
    k.min_rnr_timer = 1;
    h[i]->eng->set_neighbor(h[1 - i]->eng->config().ip, h[1 - i]->eng->config().mac);
    h[i]->eng->bring_up(q[i], k);
  }
  return {q[0], q[1]};
}

}  // namespace

IncastResult run_incast(const IncastConfig& c, const std::function<void(const FlowSample&)>& on_flow,
                        const std::function<void(const QueueSample&)>& on_queue) {
  const int n = c.senders;
  sim::SwitchSpec sw = c.sw;
  sim::Fabric fab(c.seed, 1u << 15, 1024 * 4 + 256);
  const int s = fab.add_switch(sw);
  const sim::LinkSpec link{c.link_bps, c.link_delay_ns};
  auto rx = make_host(0, c, c.message);
  std::vector<std::unique_ptr<Host>> tx;
  std::vector<Qp*> qa(n);
  const int rx_id = fab.add_host(rx->eng.get(), s, link);
  for (int i = 0; i < n; ++i) {
    tx.push_back(make_host(i + 1, c, c.message));
    fab.add_host(tx.back()->eng.get(), s, link);
  }
  for (int i = 0; i < n; ++i) qa[i] = connect(*tx[i], *rx, c).first;
  fab.finish();
  const int out = fab.port_toward(s, rx_id);
  if (c.loss > 0) fab.set_loss(s, out, c.loss);

  IncastResult r;
  std::vector<int> inflight(n, 0);
  std::vector<std::deque<std::uint64_t>> posted_at(n);  // completions come in order
  std::vector<std::uint64_t> mct;
  std::vector<wire::Psn> una(n);
  std::vector<double> acked_2nd(n, 0);
  for (int i = 0; i < n; ++i) una[i] = qa[i]->req.una;
  const std::uint64_t t0 = fab.now(), half = t0 + c.duration_ns / 2;
  double queue_sum = 0;
  std::uint64_t queue_n = 0;
  const std::uint32_t mtu_bytes = 128u << c.mtu;
  auto post = [&](int i) {
    Host& h = *tx[i];
    Sge sg{reinterpret_cast<std::uint64_t>(h.mem.data()), c.message, h.mr->lkey};
    SendWr w;
    w.opcode = IBV_WR_RDMA_WRITE;
    w.send_flags = IBV_SEND_SIGNALED;
    w.sg_list = {&sg, 1};
    w.remote_addr = reinterpret_cast<std::uint64_t>(rx->mem.data());
    w.rkey = rx->mr->rkey;
    while (inflight[i] < static_cast<int>(c.depth) && h.eng->post_send(qa[i], w) == 0) {
      ++inflight[i];
      posted_at[i].push_back(fab.now());
    }
  };
  for (int i = 0; i < n; ++i) post(i);
  fab.on_sample(c.sample_ns, [&](std::uint64_t now) {
    ibv_wc wc[64];
    for (int i = 0; i < n; ++i) {
      for (int k; (k = tx[i]->eng->poll_cq(tx[i]->cq, wc)) > 0;) {
        for (int j = 0; j < k; ++j) {
          --inflight[i];
          if (wc[j].status == IBV_WC_SUCCESS) ++r.messages;
          else ++r.failed;
          if (!posted_at[i].empty()) {
            mct.push_back(now - posted_at[i].front());
            posted_at[i].pop_front();
          }
        }
      }
      if (qa[i]->state == IBV_QPS_RTS) post(i);
      const wire::Psn u = qa[i]->req.una;
      const double bytes = static_cast<double>(distance(una[i], u)) * mtu_bytes;
      una[i] = u;
      if (now > half) acked_2nd[i] += bytes;
      if (on_flow) {
        const CcReport rep = tx[i]->eng->cc_report(*qa[i]);
        on_flow(FlowSample{now - t0, i, bytes * 8e9 / static_cast<double>(c.sample_ns),
                           static_cast<double>(rep.pace_bps), rep.state.alpha, rep.window, qa[i]->rtt.last()});
      }
    }
    const std::uint64_t q = fab.queue_bytes(s, out);
    if (now > half) {
      queue_sum += static_cast<double>(q);
      ++queue_n;
    }
    if (on_queue) on_queue(QueueSample{now - t0, q});
  });
  fab.run_until([] { return false; }, c.duration_ns);
  const double secs = static_cast<double>(fab.now() - half) / 1e9;
  for (int i = 0; i < n; ++i) {
    r.flow_goodput_bps.push_back(acked_2nd[i] * 8 / secs);
    r.goodput_bps += r.flow_goodput_bps.back();
    r.retransmitted_pkts += qa[i]->ctr[QpCounter::retransmitted_pkts];
    r.timeouts += qa[i]->ctr[QpCounter::timeouts];
    r.cnps += qa[i]->ctr[QpCounter::cnp_received];
  }
  r.jain = jain_index(r.flow_goodput_bps);
  if (!mct.empty()) {
    std::sort(mct.begin(), mct.end());
    r.mct_p50_ns = mct[mct.size() / 2];
    r.mct_p99_ns = mct[std::min(mct.size() - 1, mct.size() * 99 / 100)];
  }
  const sim::PortStats& ps = fab.port_stats(s, out);
  r.drops = ps.dropped;
  r.ce_marks = ps.ce_marked;
  r.max_queue_bytes = ps.max_queue_bytes;
  r.mean_queue_bytes = queue_n ? queue_sum / static_cast<double>(queue_n) : 0;
  r.events = fab.stats().events;
  return r;
}

}  // namespace uroce::simx
