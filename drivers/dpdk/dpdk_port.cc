#include "drivers/dpdk/dpdk_port.h"

#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_mbuf.h>

#include <cstring>

namespace uroce::dpdk {

namespace {
constexpr std::uint16_t kBurst = 64;
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

void eal_cleanup() { rte_eal_cleanup(); }

struct Port::Impl {
  std::uint16_t port_id = 0;
  rte_mempool* pool = nullptr;
  rte_mbuf* rx[kBurst] = {};
  std::uint16_t nrx = 0;
  rte_mbuf* tx[kBurst] = {};
  std::uint16_t ntx = 0;
  std::vector<std::uint8_t> linear;  // multi-segment frames made contiguous
  std::uint64_t tx_offloads = 0;
  std::string driver;
  PortStats st;
  std::uint16_t data_room = 0;
  // Zero-copy TX: mbufs with no data room, attached to registered memory.
  bool zero_copy = false;
  std::uint32_t zero_copy_min = 0;
  rte_mempool* ext_pool = nullptr;
  std::vector<rte_mbuf_ext_shared_info> shinfo;  // one per attach, reused round robin
  std::uint32_t shinfo_next = 0;
};

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
  conf.txmode.offloads = m.tx_offloads;
  int rc = rte_eth_dev_configure(m.port_id, 1, 1, &conf);
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
  if (rc != 0) {
    err = "rte_eth_dev_start: " + std::string(rte_strerror(-rc));
    return nullptr;
  }
  rte_eth_promiscuous_enable(m.port_id);  // not all vdevs support it; harmless if not
  if (o.zero_copy && (m.tx_offloads & RTE_ETH_TX_OFFLOAD_MULTI_SEGS) && rte_eal_iova_mode() == RTE_IOVA_VA) {
    // IOVA == VA: registered memory needs no DMA mapping of its own. (With
    // physical IOVAs it would have to be registered with rte_extmem_register
    // and mapped for the device; until then such ports use the copy path.)
    const std::string ext_name = "uroce_ext_" + std::to_string(m.port_id);
    m.ext_pool = rte_pktmbuf_pool_create(ext_name.c_str(), o.mbufs, 256, 0, 0, socket);
    if (m.ext_pool != nullptr) {
      m.shinfo.resize(o.mbufs * 2);
      for (auto& si : m.shinfo) {
        si.free_cb = ext_free_noop;
        si.fcb_opaque = nullptr;
        rte_mbuf_ext_refcnt_set(&si, 1);
      }
      m.zero_copy = true;
      m.zero_copy_min = o.zero_copy_min;
    }
  }
  rte_ether_addr mac{};
  rte_eth_macaddr_get(m.port_id, &mac);
  std::memcpy(p->mac_.data(), mac.addr_bytes, 6);
  m.linear.resize(std::size_t{kBurst} * 9216);
  return p;
}

Port::~Port() {
  if (!impl_) return;
  rx_done();
  tx_flush();
  rte_eth_dev_stop(impl_->port_id);
  rte_eth_dev_close(impl_->port_id);
}

std::uint16_t Port::rx_burst(engine::RxFrame* out, std::uint16_t max) {
  Impl& m = *impl_;
  rx_done();
  m.nrx = rte_eth_rx_burst(m.port_id, 0, m.rx, std::min(max, kBurst));
  for (std::uint16_t i = 0; i < m.nrx; ++i) {
    rte_mbuf* b = m.rx[i];
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
  m.st.rx_frames += m.nrx;
  return m.nrx;
}

void Port::rx_done() {
  Impl& m = *impl_;
  if (m.nrx) rte_pktmbuf_free_bulk(m.rx, m.nrx);
  m.nrx = 0;
}

bool Port::tx(const transport::TxFrame& f) {
  Impl& m = *impl_;
  if (m.ntx == kBurst) tx_flush();
  if (m.zero_copy) {
    std::size_t payload = 0;
    bool external = f.nseg > 0;
    for (std::uint8_t i = 0; i < f.nseg; ++i) {
      payload += f.seg[i].len;
      // Inline payloads live in the TX ring slot, which is reused: copy those.
      if (f.seg[i].p >= f.inline_buf && f.seg[i].p < f.inline_buf + sizeof f.inline_buf) external = false;
    }
    if (external && payload >= m.zero_copy_min && tx_zero_copy(f)) return true;
  }
  ++m.st.tx_copied;
  rte_mbuf* b = rte_pktmbuf_alloc(m.pool);
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
  m.tx[m.ntx++] = b;
  return true;
}

bool Port::tx_zero_copy(const transport::TxFrame& f) {
  Impl& m = *impl_;
  // head: the headers (copied, 100 bytes or so); then one external segment per
  // payload piece, pointing into registered memory; then pad + ICRC.
  rte_mbuf* head = rte_pktmbuf_alloc(m.pool);
  rte_mbuf* tail = rte_pktmbuf_alloc(m.pool);
  if (head == nullptr || tail == nullptr) {
    rte_pktmbuf_free(head);
    rte_pktmbuf_free(tail);
    return false;
  }
  std::memcpy(rte_pktmbuf_append(head, f.hdr_len), f.hdr, f.hdr_len);
  for (std::uint8_t i = 0; i < f.nseg; ++i) {
    if (f.seg[i].len == 0) continue;
    rte_mbuf* e = rte_pktmbuf_alloc(m.ext_pool);
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
  m.tx[m.ntx++] = head;
  ++m.st.tx_zero_copy;
  return true;
}

bool Port::tx_raw(wire::ConstBytes frame) {
  Impl& m = *impl_;
  if (m.ntx == kBurst) tx_flush();
  rte_mbuf* b = rte_pktmbuf_alloc(m.pool);
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
  m.tx[m.ntx++] = b;
  return true;
}

void Port::tx_flush() {
  Impl& m = *impl_;
  std::uint16_t sent = 0;
  // A few tries, then drop what the PMD will not take: never block the loop.
  for (int tries = 0; sent < m.ntx && tries < 4; ++tries)
    sent += rte_eth_tx_burst(m.port_id, 0, m.tx + sent, static_cast<std::uint16_t>(m.ntx - sent));
  if (sent < m.ntx) {
    rte_pktmbuf_free_bulk(m.tx + sent, m.ntx - sent);
    m.st.tx_dropped += m.ntx - sent;
  }
  m.st.tx_frames += sent;
  m.ntx = 0;
}

PortStats Port::stats() const {
  PortStats s = impl_->st;
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

std::string Port::describe() const {
  std::string s = "driver=" + impl_->driver;
  s += (impl_->tx_offloads & RTE_ETH_TX_OFFLOAD_MULTI_SEGS) ? " tx_multi_seg=on" : " tx_multi_seg=off";
  s += impl_->zero_copy ? " tx_path=zero-copy(extbuf)+copy<" + std::to_string(impl_->zero_copy_min) + "B"
                         : " tx_path=copy";
  return s;
}

}  // namespace uroce::dpdk
