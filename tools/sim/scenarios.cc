#include "tools/sim/scenarios.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <random>
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

/// A host of the fabric; its memory is its own, or `shared` (many hosts
/// may register one buffer: the simulation runs on one thread, and the
/// bytes of a flow-size mix are not checked).
std::unique_ptr<Host> make_host(int i, const IncastConfig& c, std::size_t mem, std::uint8_t* shared = nullptr) {
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
  const std::uint64_t frame_bits = (std::uint64_t{mtu_bytes(c.mtu)} + 78) * 8;  // a full packet's frame
  e.base_rtt_ns = 4 * c.link_delay_ns + 4 * frame_bits * 1'000'000'000 / c.link_bps;
  e.seed = c.seed * 1000 + static_cast<std::uint64_t>(i);
  // Selective repeat's cap on packets in flight: about one bandwidth-delay
  // product (IRN's BDP-FC), with room for the host queue.
  e.sr_window = static_cast<std::uint32_t>(std::min<std::uint64_t>(
      256, 16 + (e.base_rtt_ns * c.link_bps / 1'000'000'000 + frame_bits - 1) / frame_bits));
  h->eng = std::make_unique<Engine>(e);
  h->pd = h->eng->alloc_pd();
  h->cq = h->eng->create_cq(1u << 14);
  std::uint8_t* base = shared;
  if (base == nullptr) {
    h->mem.assign(mem, static_cast<std::uint8_t>(i));
    base = h->mem.data();
  }
  h->mr = h->eng->reg_mr(h->pd, base, mem, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  return h;
}

/// An RC QP on each host, connected to the other, at RTS.
std::pair<Qp*, Qp*> connect(Host& a, Host& b, const IncastConfig& c) {
  Qp* q[2];
  Host* h[2] = {&a, &b};
  for (int i = 0; i < 2; ++i) {
    QpInitAttr ia;
    ia.send_cq = ia.recv_cq = h[i]->cq;
    ia.cap.max_send_wr = 256;
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
  const std::uint32_t mtu = mtu_bytes(c.mtu);
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
      const double bytes = static_cast<double>(distance(una[i], u)) * mtu;
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

// ------------------------------------------------------------------ mix

std::uint64_t web_search_size(double u) {
  // The web-search flow sizes of DCTCP (Alizadeh et al., SIGCOMM 2010,
  // figure 4), as (bytes, cumulative %) points.
  static constexpr double kCdf[][2] = {{0, 0},          {10e3, 15},  {20e3, 20},  {30e3, 30},
                                       {50e3, 40},      {80e3, 53},  {200e3, 60}, {1e6, 70},
                                       {2e6, 80},       {5e6, 90},   {10e6, 97},  {30e6, 100}};
  const double p = u * 100;
  for (std::size_t i = 1; i < std::size(kCdf); ++i)
    if (p <= kCdf[i][1]) {
      const double f = (p - kCdf[i - 1][1]) / (kCdf[i][1] - kCdf[i - 1][1]);
      return std::max<std::uint64_t>(1, static_cast<std::uint64_t>(kCdf[i - 1][0] + f * (kCdf[i][0] - kCdf[i - 1][0])));
    }
  return static_cast<std::uint64_t>(kCdf[std::size(kCdf) - 1][0]);
}

MixResult run_mix(const MixConfig& m) {
  IncastConfig c;
  c.cc = m.cc;
  c.selective_repeat = m.selective_repeat;
  c.link_bps = m.link_bps;
  c.link_delay_ns = m.link_delay_ns;
  c.seed = m.seed;
  const int n = m.hosts;
  sim::Fabric fab(m.seed, 1u << 15, 1024 * 4 + 256);
  const int s = fab.add_switch(m.sw);
  const sim::LinkSpec link{m.link_bps, m.link_delay_ns};
  std::vector<std::uint8_t> buffer(m.max_flow + 64);
  std::vector<std::unique_ptr<Host>> h;
  for (int i = 0; i < n; ++i) {
    h.push_back(make_host(i + 1, c, buffer.size(), buffer.data()));
    fab.add_host(h.back()->eng.get(), s, link);
  }
  // kLanes QPs from every host to every other (qp[i][j][l]: i's, toward j):
  // a flow takes the lane with the fewest flows queued, so a short flow
  // rarely waits behind a long one in the same send queue (as an
  // application with a QP per flow, or per thread, would see).
  constexpr int kLanes = 4;
  using Lanes = std::array<Qp*, kLanes>;
  std::vector<std::vector<Lanes>> qp(n, std::vector<Lanes>(n, Lanes{}));
  for (int i = 0; i < n; ++i)
    for (int j = i + 1; j < n; ++j)
      for (int l = 0; l < kLanes; ++l) {
        auto [a, b] = connect(*h[i], *h[j], c);
        qp[i][j][l] = a;
        qp[j][i][l] = b;
      }
  fab.finish();

  struct Flow {
    std::uint64_t start, bytes;
  };
  using Queues = std::array<std::deque<Flow>, kLanes>;
  std::vector<std::vector<Queues>> open(n, std::vector<Queues>(n));
  std::mt19937_64 rng(m.seed);
  std::uniform_real_distribution<double> uni(0, 1);
  // Mean of the distribution, by sampling its CDF finely: the arrival rate for the load.
  double mean = 0;
  for (int k = 0; k < 10000; ++k) mean += static_cast<double>(web_search_size((k + 0.5) / 10000));
  mean /= 10000;
  const double rate_per_ns = m.load * static_cast<double>(m.link_bps) / 8 / mean / 1e9;
  const std::uint64_t t0 = fab.now(), stop_new = t0 + m.duration_ns * 8 / 10;
  std::vector<std::uint64_t> next_start(n);
  for (int i = 0; i < n; ++i) next_start[i] = t0 + static_cast<std::uint64_t>(-std::log(1 - uni(rng)) / rate_per_ns);
  MixResult r;
  std::vector<std::uint64_t> short_mct, all_mct;
  std::vector<double> short_slow;
  const double frame_ns = (1024.0 + 78) * 8e9 / static_cast<double>(m.link_bps);
  auto ideal = [&](std::uint64_t bytes) {  // an empty fabric: serialisation plus one round trip
    const double pkts = std::ceil(static_cast<double>(bytes) / 1024);
    return pkts * frame_ns + 4.0 * static_cast<double>(m.link_delay_ns) + 3 * frame_ns;
  };
  fab.on_sample(1'000, [&](std::uint64_t now) {
    ibv_wc wc[64];
    for (int i = 0; i < n; ++i) {
      for (; now < stop_new && next_start[i] <= now;
           next_start[i] += std::max<std::uint64_t>(1, static_cast<std::uint64_t>(-std::log(1 - uni(rng)) / rate_per_ns))) {
        int j = static_cast<int>(uni(rng) * (n - 1));
        if (j >= i) ++j;
        const std::uint64_t bytes = std::min(web_search_size(uni(rng)), m.max_flow);
        Sge sg{reinterpret_cast<std::uint64_t>(buffer.data()), static_cast<std::uint32_t>(bytes), h[i]->mr->lkey};
        SendWr w;
        w.opcode = IBV_WR_RDMA_WRITE;
        w.send_flags = IBV_SEND_SIGNALED;
        w.sg_list = {&sg, 1};
        w.remote_addr = reinterpret_cast<std::uint64_t>(buffer.data());
        w.rkey = h[j]->mr->rkey;
        int lane = 0;
        for (int l = 1; l < kLanes; ++l)
          if (open[i][j][l].size() < open[i][j][lane].size()) lane = l;
        w.wr_id = static_cast<std::uint64_t>(j * kLanes + lane);
        if (h[i]->eng->post_send(qp[i][j][lane], w) != 0) continue;  // its SQ is full: the flow is not started
        open[i][j][lane].push_back(Flow{next_start[i], bytes});
        ++r.flows;
      }
      for (int k; (k = h[i]->eng->poll_cq(h[i]->cq, wc)) > 0;)
        for (int x = 0; x < k; ++x) {
          if (wc[x].opcode != IBV_WC_RDMA_WRITE) continue;  // the receive side sees none (WRITEs)
          const int j = static_cast<int>(wc[x].wr_id) / kLanes, lane = static_cast<int>(wc[x].wr_id) % kLanes;
          if (open[i][j][lane].empty()) continue;
          const Flow f = open[i][j][lane].front();
          open[i][j][lane].pop_front();
          if (wc[x].status != IBV_WC_SUCCESS) continue;
          ++r.finished;
          const std::uint64_t mct = now - f.start;
          all_mct.push_back(mct);
          if (f.bytes < m.short_bytes) {
            short_mct.push_back(mct);
            short_slow.push_back(static_cast<double>(mct) / ideal(f.bytes));
          }
        }
    }
  });
  fab.run_until([] { return false; }, m.duration_ns);
  auto pct = [](std::vector<std::uint64_t>& v, double q) -> std::uint64_t {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, static_cast<std::size_t>(q * static_cast<double>(v.size())))];
  };
  r.short_flows = short_mct.size();
  r.short_p50_ns = pct(short_mct, 0.5);
  r.short_p99_ns = pct(short_mct, 0.99);
  r.all_p50_ns = pct(all_mct, 0.5);
  r.all_p99_ns = pct(all_mct, 0.99);
  std::sort(short_slow.begin(), short_slow.end());
  if (!short_slow.empty()) {
    r.short_slowdown_p50 = short_slow[short_slow.size() / 2];
    r.short_slowdown_p99 = short_slow[std::min(short_slow.size() - 1, short_slow.size() * 99 / 100)];
  }
  for (int i = 0; i < n; ++i) {
    r.drops += fab.host_port_stats(i).dropped;
    for (int j = 0; j < n; ++j)
      for (Qp* q : qp[i][j])
        if (q) {
          r.retransmitted_pkts += q->ctr[QpCounter::retransmitted_pkts];
          r.timeouts += q->ctr[QpCounter::timeouts];
        }
  }
  for (int i = 0; i < n; ++i) r.drops += fab.port_stats(s, fab.port_toward(s, i)).dropped;
  r.events = fab.stats().events;
  return r;
}

}  // namespace uroce::simx
