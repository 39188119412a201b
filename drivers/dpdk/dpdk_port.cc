#include "drivers/dpdk/dpdk_port.h"

#include <rte_alarm.h>
#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_ip.h>
#include <rte_mbuf.h>
#include <rte_ring.h>

#include <poll.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

namespace uroce::dpdk {

namespace {
constexpr std::uint16_t kBurst = 64;
constexpr unsigned kLoopDepth = kBurst / 2;  // looped frames queued at most (Queue::tx_room)
}

bool eal_init(const std::vector<std::string>& args, std::string& err) {
  std::vector<std::string> copy;
  copy.emplace_back("uroced");
  copy.insert(copy.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  const int rc = rte_eal_init(static_cast<int>(copy.size()), argv.data());
  if (rc < 0) {
    err = std::string("rte_eal_init failed: ") + rte_strerror(rte_errno);
    return false;
  }
  return true;
}

/// One pipeline's view of the port: its TX queue, and RX either from the
/// device queue (unsharded) or from its ring (sharded). Only its own lcore
/// touches it.
struct Port::Queue : pipeline::PortIo {
  Port::Impl* dev = nullptr;
  std::uint16_t txq = 0;
  rte_ring* ring = nullptr;    // sharded RX source; nullptr = the device's RX queue 0
  rte_ring* funnel = nullptr;  // sharded TX (shards > 0): handed to shard 0 instead of the device
  rte_mbuf* rxb[kBurst] = {};
  std::uint16_t nrx = 0;
  rte_mbuf* txb[kBurst] = {};
  std::uint16_t ntx = 0;
  std::vector<std::uint8_t> linear;  // multi-segment frames made contiguous
  std::vector<rte_mbuf_ext_shared_info> shinfo;  // one per zero-copy attach, reused round robin
  std::uint32_t shinfo_next = 0;
  PortStats st;
  wire::MacAddr mac_{};

  std::uint16_t rx_burst(pipeline::RxFrame* out, std::uint16_t max) override;
  void rx_done() override;
  bool tx(const transport::TxFrame& f) override;
  bool tx_raw(wire::ConstBytes frame) override;
  void tx_push() override;
  [[nodiscard]] std::uint32_t tx_room() const override;
  [[nodiscard]] wire::MacAddr mac() const override { return mac_; }
  [[nodiscard]] pipeline::LinkInfo link() const override;
  bool tx_zero_copy(const transport::TxFrame& f);
  void mark_offloads(rte_mbuf* b, const transport::TxFrame& f) const;
  /// Whether a frame is addressed to this port's own MAC: looped back, never
  /// sent (as a NIC loops frames between its own functions).
  [[nodiscard]] bool to_self(const std::uint8_t* frame) const { return std::memcmp(frame, mac_.data(), 6) == 0; }
  bool loop_back(rte_mbuf* b);
};

struct Port::Impl {
  std::uint16_t port_id = 0;
  rte_mempool* pool = nullptr;
  std::uint64_t tx_offloads = 0;
  std::string driver;
  std::uint16_t data_room = 0;
  // Zero-copy TX: mbufs with no data room, attached to registered memory.
  bool zero_copy = false;
  std::uint32_t zero_copy_min = 0;
  rte_mempool* ext_pool = nullptr;
  std::vector<std::unique_ptr<Queue>> queues;  // one per shard
  std::vector<rte_ring*> rings;                // sharded only: RX, one per shard
  rte_ring* tx_funnel = nullptr;               // sharded only: workers' TX, sent by shard 0
  /// Frames to the port's own MAC (two QPs on one device): every shard may
  /// put them here; the RX side (the only queue, or shard 0's dispatcher)
  /// takes them before the device's.
  rte_ring* loop = nullptr;
  std::uint64_t dispatch_drops = 0;
  std::uint64_t funnel_drops = 0;
  std::uint32_t mtu = 0;  // --link-mtu, or 0: the driver's
  int rx_intr_fd = -1;  // RX queue 0's interrupt, when the PMD has one
  bool rx_intr_eventfd = false;  // an eventfd, cleared by reading it
};

namespace {
/// Whether to ask a PMD for RX queue interrupts: every one but the vdevs
/// known to have none in DPDK 22.11 (a NIC's driver is named net_ixgbe,
/// net_ice, ... too). One that refuses at configure or start falls back.
bool may_have_rx_interrupts(const std::string& driver) {
  for (const char* none : {"net_memif", "net_af_packet", "net_ring", "net_pcap", "net_null", "net_vhost", "net_bonding"})
    if (driver == none) return false;
  return true;
}

/// Whether fd is an eventfd (VFIO's and UIO's interrupt descriptors): it
/// must be read to clear it. Never read the others (tap's and af_xdp's are
/// the queue itself: a read would take a frame).
bool is_eventfd(int fd) {
  char link[64], path[64];
  std::snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  const ssize_t n = ::readlink(path, link, sizeof link - 1);
  if (n <= 0) return false;
  link[n] = '\0';
  return std::strstr(link, "eventfd") != nullptr;
}
}  // namespace

namespace {
// The memory belongs to the application's registered region: nothing to free.
void ext_free_noop(void*, void*) {}
}  // namespace

std::unique_ptr<Port> Port::open(const PortOptions& o, std::string& err) {
  std::unique_ptr<Port> p(new Port());
  p->impl_ = std::make_unique<Impl>();
  Impl& m = *p->impl_;
  if (rte_eth_dev_get_port_by_name(o.name.c_str(), &m.port_id) != 0) {
    err = "no ethdev named '" + o.name + "' (give it with --vdev or a PCI address the EAL can probe)";
    return nullptr;
  }
  rte_eth_dev_info info{};
  if (rte_eth_dev_info_get(m.port_id, &info) != 0) {
    err = "rte_eth_dev_info_get failed";
    return nullptr;
  }
  m.driver = info.driver_name ? info.driver_name : "?";
  const std::string pool_name = "uroce_pool_" + std::to_string(m.port_id);
  m.data_room = o.data_room;
  m.pool = rte_pktmbuf_pool_create(pool_name.c_str(), o.mbufs, 256, 0,
                                   static_cast<std::uint16_t>(RTE_PKTMBUF_HEADROOM + o.data_room),
                                   static_cast<int>(rte_eth_dev_socket_id(m.port_id)));
  if (m.pool == nullptr) {
    err = std::string("mbuf pool: ") + rte_strerror(rte_errno);
    return nullptr;
  }
  rte_eth_conf conf{};
  // Use what the port offers; fall back cleanly when it does not.
  if (info.tx_offload_capa & RTE_ETH_TX_OFFLOAD_MULTI_SEGS) m.tx_offloads |= RTE_ETH_TX_OFFLOAD_MULTI_SEGS;
  if (info.tx_offload_capa & RTE_ETH_TX_OFFLOAD_IPV4_CKSUM) m.tx_offloads |= RTE_ETH_TX_OFFLOAD_IPV4_CKSUM;
  conf.txmode.offloads = m.tx_offloads;
  // One RX and one TX queue, whatever the sharding: shard 0 is the port's
  // I/O lcore (it reads RX and sends every shard's TX), so any PMD works,
  // single-queue vdevs included, and the peer sees one flow of frames.
  const std::uint16_t nq = std::max<std::uint16_t>(1, o.shards);
  const bool want_intr = o.rx_interrupts && may_have_rx_interrupts(m.driver);
  conf.intr_conf.rxq = want_intr ? 1 : 0;
  // --link-mtu: given to the driver where it takes it (a NIC); some vdevs carry
  // larger frames than they will configure (memif's limit is its buffer
  // size), so it is in any case the MTU the link is taken to have.
  m.mtu = o.mtu;
  if (o.mtu != 0 && o.mtu >= info.min_mtu && o.mtu <= info.max_mtu &&
      o.mtu + RTE_ETHER_HDR_LEN + RTE_ETHER_CRC_LEN <= info.max_rx_pktlen)
    conf.rxmode.mtu = o.mtu;
  int rc = rte_eth_dev_configure(m.port_id, 1, 1, &conf);
  if (rc != 0 && want_intr) {  // the PMD refuses RX interrupts: poll
    conf.intr_conf.rxq = 0;
    rc = rte_eth_dev_configure(m.port_id, 1, 1, &conf);
  }
  if (rc != 0) {
    err = "rte_eth_dev_configure: " + std::string(rte_strerror(-rc));
    return nullptr;
  }
  std::uint16_t nrx = o.rx_desc, ntx = o.tx_desc;
  rte_eth_dev_adjust_nb_rx_tx_desc(m.port_id, &nrx, &ntx);
  const int socket = static_cast<int>(rte_eth_dev_socket_id(m.port_id));
  rc = rte_eth_rx_queue_setup(m.port_id, 0, nrx, static_cast<unsigned>(socket), nullptr, m.pool);
  if (rc == 0) rc = rte_eth_tx_queue_setup(m.port_id, 0, ntx, static_cast<unsigned>(socket), nullptr);
  if (rc != 0) {
    err = "queue setup: " + std::string(rte_strerror(-rc));
    return nullptr;
  }
  rc = rte_eth_dev_start(m.port_id);
  if (rc != 0 && conf.intr_conf.rxq) {
    // Some PMDs take RX interrupts at configure and fail at start (no
    // vectors): configure again without them and poll.
    conf.intr_conf.rxq = 0;
    rc = rte_eth_dev_configure(m.port_id, 1, 1, &conf);
    if (rc == 0) rc = rte_eth_rx_queue_setup(m.port_id, 0, nrx, static_cast<unsigned>(socket), nullptr, m.pool);
    if (rc == 0) rc = rte_eth_tx_queue_setup(m.port_id, 0, ntx, static_cast<unsigned>(socket), nullptr);
    if (rc == 0) rc = rte_eth_dev_start(m.port_id);
  }
  if (rc != 0) {
    err = "rte_eth_dev_start: " + std::string(rte_strerror(-rc));
    return nullptr;
  }
  rte_eth_promiscuous_enable(m.port_id);  // not all vdevs support it; harmless if not
  if (conf.intr_conf.rxq) {
    // Polling while awake: the interrupt is armed only around a sleep. Some
    // PMDs (tap) have no enable/disable and are always armed.
    const int fd = rte_eth_dev_rx_intr_ctl_q_get_fd(m.port_id, 0);
    if (fd >= 0) {
      m.rx_intr_fd = fd;
      m.rx_intr_eventfd = is_eventfd(fd);
      (void)rte_eth_dev_rx_intr_disable(m.port_id, 0);
    }
  }
  if (o.zero_copy && (m.tx_offloads & RTE_ETH_TX_OFFLOAD_MULTI_SEGS) && rte_eal_iova_mode() == RTE_IOVA_VA) {
    // IOVA == VA: registered memory needs no DMA mapping of its own. (With
    // physical IOVAs it would have to be registered with rte_extmem_register
    // and mapped for the device; until then such ports use the copy path.)
    const std::string ext_name = "uroce_ext_" + std::to_string(m.port_id);
    m.ext_pool = rte_pktmbuf_pool_create(ext_name.c_str(), o.mbufs, 256, 0, 0, socket);
    if (m.ext_pool != nullptr) {
      m.zero_copy = true;
      m.zero_copy_min = o.zero_copy_min;
    }
  }
  rte_ether_addr mac{};
  rte_eth_macaddr_get(m.port_id, &mac);
  std::memcpy(p->mac_.data(), mac.addr_bytes, 6);
  for (std::uint16_t q = 0; q < nq; ++q) {
    auto qu = std::make_unique<Queue>();
    qu->dev = &m;
    qu->txq = 0;
    qu->mac_ = p->mac_;
    qu->linear.resize(std::size_t{kBurst} * 9216);
    if (m.zero_copy) {
      qu->shinfo.resize(o.mbufs * 2 / nq + 64);
      for (auto& si : qu->shinfo) {
        si.free_cb = ext_free_noop;
        si.fcb_opaque = nullptr;
        rte_mbuf_ext_refcnt_set(&si, 1);
      }
    }
    if (nq > 1) {
      const std::string rn = "uroce_rx_" + std::to_string(m.port_id) + "_" + std::to_string(q);
      qu->ring = rte_ring_create(rn.c_str(), 4096, socket, RING_F_SP_ENQ | RING_F_SC_DEQ);
      if (qu->ring == nullptr) {
        err = std::string("dispatch ring: ") + rte_strerror(rte_errno);
        return nullptr;
      }
      m.rings.push_back(qu->ring);
    }
    m.queues.push_back(std::move(qu));
  }
  const std::string ln = "uroce_loop_" + std::to_string(m.port_id);
  m.loop = rte_ring_create(ln.c_str(), 1024, socket, RING_F_SC_DEQ);  // many producers, one consumer
  if (m.loop == nullptr) {
    err = std::string("loopback ring: ") + rte_strerror(rte_errno);
    return nullptr;
  }
  if (nq > 1) {
    const std::string fn = "uroce_txf_" + std::to_string(m.port_id);
    m.tx_funnel = rte_ring_create(fn.c_str(), 8192, socket, RING_F_SC_DEQ);  // many producers, one consumer
    if (m.tx_funnel == nullptr) {
      err = std::string("TX funnel ring: ") + rte_strerror(rte_errno);
      return nullptr;
    }
    for (std::uint16_t q = 1; q < nq; ++q) m.queues[q]->funnel = m.tx_funnel;
  }
  return p;
}

Port::~Port() {
  if (!impl_) return;
  // Stop and close on the EAL's interrupt thread. A driver runs its own
  // callbacks there: memif's control channel handler disconnects the port
  // when the peer hangs up (freeing its regions, closing its queues' fds,
  // then freeing the channel in a pending-unregister callback). Done from
  // this thread, our stop and close would race that handler: two
  // disconnects at once, and queues used after close frees them. The
  // interrupt thread runs one callback at a time, alarms included, so done
  // there it cannot overlap a driver's callback, and every earlier one has
  // finished.
  struct Teardown {
    Impl* m;
    std::atomic<bool> done{false};
  };
  auto* t = new Teardown{impl_.get()};
  rte_eal_alarm_callback run = [](void* arg) {
    auto* td = static_cast<Teardown*>(arg);
    Impl& m = *td->m;
    for (auto& q : m.queues) {
      q->rx_done();
      q->tx_push();
    }
    rte_eth_dev_stop(m.port_id);
    rte_eth_dev_close(m.port_id);
    td->done.store(true, std::memory_order_release);
  };
  if (rte_thread_is_intr() || rte_eal_alarm_set(1, run, t) != 0) run(t);  // no interrupt thread to ask: here
  const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!t->done.load(std::memory_order_acquire) && std::chrono::steady_clock::now() < limit)
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  if (!t->done.load(std::memory_order_acquire)) {
    // The callback may still run: leave it its state.
    std::fprintf(stderr, "uroce: port %u did not stop within 5 s on the interrupt thread\n", impl_->port_id);
    (void)impl_.release();
    return;
  }
  delete t;
  std::vector<rte_ring*> all = impl_->rings;
  if (impl_->tx_funnel) all.push_back(impl_->tx_funnel);
  if (impl_->loop) all.push_back(impl_->loop);
  for (rte_ring* r : all) {
    rte_mbuf* b;
    while (rte_ring_sc_dequeue(r, reinterpret_cast<void**>(&b)) == 0) rte_pktmbuf_free(b);
    rte_ring_free(r);
  }
}

std::uint16_t Port::rx_burst(pipeline::RxFrame* out, std::uint16_t max) { return impl_->queues[0]->rx_burst(out, max); }

int Port::rx_interrupt_fd() const { return impl_->rx_intr_fd; }

void Port::rx_interrupt_arm() {
  if (impl_->rx_intr_fd >= 0) (void)rte_eth_dev_rx_intr_enable(impl_->port_id, 0);
}

void Port::rx_interrupt_disarm() {
  if (impl_->rx_intr_fd < 0) return;
  (void)rte_eth_dev_rx_intr_disable(impl_->port_id, 0);
  if (impl_->rx_intr_eventfd) {  // clear it, or a level-triggered wait would find it readable for ever
    pollfd p{impl_->rx_intr_fd, POLLIN, 0};
    std::uint64_t n;
    if (::poll(&p, 1, 0) == 1) (void)!::read(impl_->rx_intr_fd, &n, sizeof n);
  }
}
void Port::rx_done() { impl_->queues[0]->rx_done(); }
bool Port::tx(const transport::TxFrame& f) { return impl_->queues[0]->tx(f); }
bool Port::tx_raw(wire::ConstBytes frame) { return impl_->queues[0]->tx_raw(frame); }
void Port::tx_push() { impl_->queues[0]->tx_push(); }
std::uint32_t Port::tx_room() const { return impl_->queues[0]->tx_room(); }
namespace {
pipeline::LinkInfo link_of(std::uint16_t port_id, std::uint32_t mtu_given) {
  rte_eth_link l{};
  if (rte_eth_link_get_nowait(port_id, &l) != 0) return {};
  std::uint16_t mtu = 0;
  if (mtu_given == 0 && rte_eth_dev_get_mtu(port_id, &mtu) != 0) mtu = 0;
  return {l.link_status == RTE_ETH_LINK_UP, l.link_speed == RTE_ETH_SPEED_NUM_UNKNOWN ? 0u : l.link_speed,
          mtu_given != 0 ? mtu_given : mtu};
}
}  // namespace

pipeline::LinkInfo Port::link() const { return link_of(impl_->port_id, impl_->mtu); }
pipeline::LinkInfo Port::Queue::link() const { return link_of(dev->port_id, dev->mtu); }

pipeline::PortIo& Port::shard(std::uint16_t i) { return *impl_->queues.at(i); }
std::uint64_t Port::dispatch_drops() const { return impl_->dispatch_drops + impl_->funnel_drops; }

std::uint16_t Port::dispatch(Owner owner) {
  Impl& m = *impl_;
  // The workers' transmissions first.
  rte_mbuf* out[kBurst];
  unsigned nout = rte_ring_sc_dequeue_burst(m.tx_funnel, reinterpret_cast<void**>(out), kBurst, nullptr);
  if (nout) {
    std::uint16_t sent = 0;
    for (int tries = 0; sent < nout && tries < 4; ++tries)
      sent += rte_eth_tx_burst(m.port_id, 0, out + sent, static_cast<std::uint16_t>(nout - sent));
    if (sent < nout) {
      rte_pktmbuf_free_bulk(out + sent, nout - sent);
      m.funnel_drops += nout - sent;
    }
  }
  rte_mbuf* in[kBurst];
  std::uint16_t n = static_cast<std::uint16_t>(rte_ring_sc_dequeue_burst(m.loop, reinterpret_cast<void**>(in), kBurst, nullptr));
  n = static_cast<std::uint16_t>(n + rte_eth_rx_burst(m.port_id, 0, in + n, static_cast<std::uint16_t>(kBurst - n)));
  const auto nq = static_cast<std::uint16_t>(m.queues.size());
  for (std::uint16_t i = 0; i < n; ++i) {
    rte_mbuf* b = in[i];
    const int o = owner(wire::ConstBytes(rte_pktmbuf_mtod(b, const std::uint8_t*), b->data_len), nq);
    if (o < 0) {
      // To every shard: one reference each.
      rte_mbuf_refcnt_update(b, static_cast<int16_t>(nq - 1));
      for (std::uint16_t q = 0; q < nq; ++q)
        if (rte_ring_sp_enqueue(m.rings[q], b) != 0) {
          rte_pktmbuf_free(b);
          ++m.dispatch_drops;
        }
    } else if (rte_ring_sp_enqueue(m.rings[static_cast<std::size_t>(o) % nq], b) != 0) {
      rte_pktmbuf_free(b);
      ++m.dispatch_drops;
    }
  }
  return static_cast<std::uint16_t>(n + nout);
}

std::uint16_t Port::Queue::rx_burst(pipeline::RxFrame* out, std::uint16_t max) {
  Queue& m = *this;
  rx_done();
  const std::uint16_t want = std::min(max, kBurst);
  std::uint16_t looped = 0;  // counted as tx_looped, not as frames from the wire
  if (ring) {
    m.nrx = static_cast<std::uint16_t>(rte_ring_sc_dequeue_burst(ring, reinterpret_cast<void**>(m.rxb), want, nullptr));
  } else {
    // Unsharded: the frames looped back to this port, then the device's.
    looped = static_cast<std::uint16_t>(rte_ring_sc_dequeue_burst(dev->loop, reinterpret_cast<void**>(m.rxb), want, nullptr));
    m.nrx = static_cast<std::uint16_t>(looped + rte_eth_rx_burst(dev->port_id, 0, m.rxb + looped, static_cast<std::uint16_t>(want - looped)));
  }
  for (std::uint16_t i = 0; i < m.nrx; ++i) {
    rte_mbuf* b = m.rxb[i];
    if (b->nb_segs == 1) {
      out[i] = {rte_pktmbuf_mtod(b, const std::uint8_t*), b->data_len};
    } else {
      // Multi-segment: the parser wants contiguous bytes.
      std::uint8_t* dst = &m.linear[std::size_t{i} * 9216];
      const std::uint32_t len = std::min<std::uint32_t>(b->pkt_len, 9216);
      const void* p = rte_pktmbuf_read(b, 0, len, dst);
      out[i] = {static_cast<const std::uint8_t*>(p), len};
      ++m.st.rx_linearized;
    }
  }
  m.st.rx_frames += m.nrx - looped;
  return m.nrx;
}

void Port::Queue::rx_done() {
  Queue& m = *this;
  if (m.nrx) rte_pktmbuf_free_bulk(m.rxb, m.nrx);
  m.nrx = 0;
}

std::uint32_t Port::Queue::tx_room() const {
  // The loopback ring is the one queue here that drops when full (a frame to
  // this port's own MAC goes there, and RX takes a burst a pass from it). It
  // is kept to half a burst, as the kernel's byte queue limits keep a NIC's
  // ring short: what waits beyond that waits in the engine, where the
  // transmit share orders it, not in a FIFO every tenant's frames share.
  // The bound holds frames to the wire too (the engine cannot tell them
  // apart before it builds them). Lifting it for a port that does not loop
  // cost nothing measurable in suite.sh and made DPDK 22.11's memif crash
  // in its burst calls when the peer went away under traffic (restart test:
  // 3 and 1 crashes in 20 cycles, against 0 and 0 with the bound), so it stays.
  if (dev->loop == nullptr) return UINT32_MAX;
  const unsigned queued = rte_ring_count(dev->loop);
  return queued >= kLoopDepth ? 0 : kLoopDepth - queued;
}

bool Port::Queue::loop_back(rte_mbuf* b) {
  // The builder left the IPv4 header checksum to the port's offload, which
  // a looped frame never reaches: compute it here.
  if (b->ol_flags & RTE_MBUF_F_TX_IP_CKSUM) {
    auto* ip = rte_pktmbuf_mtod_offset(b, rte_ipv4_hdr*, b->l2_len);
    ip->hdr_checksum = 0;
    ip->hdr_checksum = rte_ipv4_cksum(ip);
    b->ol_flags &= ~(RTE_MBUF_F_TX_IPV4 | RTE_MBUF_F_TX_IP_CKSUM);
  }
  if (rte_ring_mp_enqueue(dev->loop, b) != 0) {
    rte_pktmbuf_free(b);
    ++st.tx_dropped;
    return false;
  }
  ++st.tx_looped;
  return true;
}

bool Port::Queue::tx(const transport::TxFrame& f) {
  Queue& m = *this;
  if (m.ntx == kBurst) tx_push();
  const bool self = f.hdr_len >= 6 && to_self(f.hdr);  // copied: a looped frame must not borrow memory
  if (dev->zero_copy && !self) {
    std::size_t payload = 0;
    bool external = f.nseg > 0 && !f.bounced;  // an ODP bounce buffer is reused with the slot too
    for (std::uint8_t i = 0; i < f.nseg; ++i) {
      payload += f.seg[i].len;
      // Inline payloads live in the TX ring slot, which is reused: copy those.
      if (f.seg[i].p >= f.inline_buf && f.seg[i].p < f.inline_buf + sizeof f.inline_buf) external = false;
    }
    if (external && payload >= dev->zero_copy_min && tx_zero_copy(f)) return true;
  }
  ++m.st.tx_copied;
  rte_mbuf* b = rte_pktmbuf_alloc(dev->pool);
  if (b == nullptr) {
    ++m.st.tx_dropped;
    return false;
  }
  const std::size_t n = f.size();
  char* dst = rte_pktmbuf_append(b, static_cast<std::uint16_t>(n));
  if (dst == nullptr) {
    rte_pktmbuf_free(b);
    ++m.st.tx_dropped;
    return false;
  }
  // The copy path: one contiguous segment that every PMD accepts.
  f.copy_to(wire::Bytes(reinterpret_cast<std::uint8_t*>(dst), n));
  mark_offloads(b, f);
  if (self) return loop_back(b);
  m.txb[m.ntx++] = b;
  return true;
}

void Port::Queue::mark_offloads(rte_mbuf* b, const transport::TxFrame& f) const {
  if (!(dev->tx_offloads & RTE_ETH_TX_OFFLOAD_IPV4_CKSUM) || f.hdr_len < 34 || f.raw) return;  // raw: as written
  const bool vlan = f.hdr[12] == 0x81 && f.hdr[13] == 0x00;
  const std::size_t l2 = vlan ? 18 : 14;
  if (f.hdr[l2 - 2] != 0x08 || f.hdr[l2 - 1] != 0x00) return;  // IPv6 has no header checksum
  b->l2_len = l2;
  b->l3_len = 20;
  b->ol_flags |= RTE_MBUF_F_TX_IPV4 | RTE_MBUF_F_TX_IP_CKSUM;
}

bool Port::Queue::tx_zero_copy(const transport::TxFrame& f) {
  Queue& m = *this;
  Impl& d = *dev;
  // head: the headers (copied, 100 bytes or so); then one external segment per
  // payload piece, pointing into registered memory; then pad + ICRC.
  rte_mbuf* head = rte_pktmbuf_alloc(d.pool);
  rte_mbuf* tail = rte_pktmbuf_alloc(d.pool);
  if (head == nullptr || tail == nullptr) {
    rte_pktmbuf_free(head);
    rte_pktmbuf_free(tail);
    return false;
  }
  std::memcpy(rte_pktmbuf_append(head, f.hdr_len), f.hdr, f.hdr_len);
  for (std::uint8_t i = 0; i < f.nseg; ++i) {
    if (f.seg[i].len == 0) continue;
    rte_mbuf* e = rte_pktmbuf_alloc(d.ext_pool);
    if (e == nullptr) {
      rte_pktmbuf_free(head);
      rte_pktmbuf_free(tail);
      return false;
    }
    rte_mbuf_ext_shared_info* si = &m.shinfo[m.shinfo_next++ % m.shinfo.size()];
    rte_mbuf_ext_refcnt_set(si, 1);
    void* va = const_cast<std::uint8_t*>(f.seg[i].p);
    rte_pktmbuf_attach_extbuf(e, va, reinterpret_cast<rte_iova_t>(va), static_cast<std::uint16_t>(f.seg[i].len), si);
    e->data_off = 0;
    e->data_len = static_cast<std::uint16_t>(f.seg[i].len);
    e->pkt_len = e->data_len;
    if (rte_pktmbuf_chain(head, e) != 0) {
      rte_pktmbuf_free(e);
      rte_pktmbuf_free(head);
      rte_pktmbuf_free(tail);
      return false;
    }
  }
  std::memcpy(rte_pktmbuf_append(tail, f.trailer_len), f.trailer, f.trailer_len);
  if (rte_pktmbuf_chain(head, tail) != 0) {
    rte_pktmbuf_free(head);
    rte_pktmbuf_free(tail);
    return false;
  }
  mark_offloads(head, f);
  m.txb[m.ntx++] = head;
  ++m.st.tx_zero_copy;
  return true;
}

bool Port::Queue::tx_raw(wire::ConstBytes frame) {
  Queue& m = *this;
  if (m.ntx == kBurst) tx_push();
  rte_mbuf* b = rte_pktmbuf_alloc(dev->pool);
  if (b == nullptr) {
    ++m.st.tx_dropped;
    return false;
  }
  char* dst = rte_pktmbuf_append(b, static_cast<std::uint16_t>(frame.size()));
  if (dst == nullptr) {
    rte_pktmbuf_free(b);
    ++m.st.tx_dropped;
    return false;
  }
  std::memcpy(dst, frame.data(), frame.size());
  if (frame.size() >= 6 && to_self(frame.data())) return loop_back(b);
  m.txb[m.ntx++] = b;
  return true;
}

void Port::Queue::tx_push() {
  Queue& m = *this;
  if (funnel != nullptr) {
    const unsigned n = m.ntx ? rte_ring_mp_enqueue_burst(funnel, reinterpret_cast<void**>(m.txb), m.ntx, nullptr) : 0;
    if (n < m.ntx) {
      rte_pktmbuf_free_bulk(m.txb + n, m.ntx - n);
      m.st.tx_dropped += m.ntx - n;
    }
    m.st.tx_frames += n;
    m.ntx = 0;
    return;
  }
  std::uint16_t sent = 0;
  // A few tries, then drop what the PMD will not take: never block the loop.
  for (int tries = 0; sent < m.ntx && tries < 4; ++tries)
    sent += rte_eth_tx_burst(dev->port_id, txq, m.txb + sent, static_cast<std::uint16_t>(m.ntx - sent));
  if (sent < m.ntx) {
    rte_pktmbuf_free_bulk(m.txb + sent, m.ntx - sent);
    m.st.tx_dropped += m.ntx - sent;
  }
  m.st.tx_frames += sent;
  m.ntx = 0;
}

PortStats Port::stats() const {
  PortStats s;
  for (const auto& q : impl_->queues) {
    s.rx_frames += q->st.rx_frames;
    s.tx_frames += q->st.tx_frames;
    s.tx_dropped += q->st.tx_dropped;
    s.rx_linearized += q->st.rx_linearized;
    s.tx_zero_copy += q->st.tx_zero_copy;
    s.tx_copied += q->st.tx_copied;
    s.tx_looped += q->st.tx_looped;
  }
  rte_eth_stats e{};
  if (rte_eth_stats_get(impl_->port_id, &e) == 0) {
    s.hw_ipackets = e.ipackets;
    s.hw_opackets = e.opackets;
    s.hw_imissed = e.imissed;
    s.hw_ierrors = e.ierrors;
    s.hw_oerrors = e.oerrors;
  }
  return s;
}

bool Port::ipv4_checksum_offload() const { return (impl_->tx_offloads & RTE_ETH_TX_OFFLOAD_IPV4_CKSUM) != 0; }

std::string Port::describe() const {
  std::string s = "driver=" + impl_->driver;
  s += ipv4_checksum_offload() ? " tx_ipv4_cksum=offload" : " tx_ipv4_cksum=software";
  s += (impl_->tx_offloads & RTE_ETH_TX_OFFLOAD_MULTI_SEGS) ? " tx_multi_seg=on" : " tx_multi_seg=off";
  s += impl_->zero_copy ? " tx_path=zero-copy(extbuf)+copy<" + std::to_string(impl_->zero_copy_min) + "B"
                         : " tx_path=copy";
  s += impl_->rx_intr_fd >= 0 ? " rx_interrupts=on" : " rx_interrupts=none";
  return s;
}

}  // namespace uroce::dpdk
