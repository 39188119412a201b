// Raw packet QPs (IBV_QPT_RAW_PACKET) and their flow rules: a SEND's bytes
// are a whole Ethernet frame, sent as written; frames that are not RoCEv2
// reach a raw packet QP only through a flow rule (ibv_create_flow) that
// matches them, from the wire or from this port's own raw packet QPs.
#include <algorithm>
#include <cstring>

#include "stack/transport/engine.h"

namespace uroce::transport {

namespace {

constexpr std::size_t kKeyLen = sizeof(uroce_flow_key);

/// The match key of a frame: Ethernet (one 802.1Q tag at most), then IPv4
/// or IPv6 (no extension headers), then TCP or UDP ports. What the frame
/// does not have stays 0.
uroce_flow_key key_of(wire::ConstBytes f) {
  uroce_flow_key k{};
  if (f.size() < 14) return k;
  std::memcpy(k.dmac, f.data(), 6);
  std::memcpy(k.smac, f.data() + 6, 6);
  std::size_t l3 = 14;
  if (f[12] == 0x81 && f[13] == 0x00 && f.size() >= 18) {
    std::memcpy(k.vlan, f.data() + 14, 2);
    l3 = 18;
  }
  std::memcpy(k.ethertype, f.data() + l3 - 2, 2);
  std::size_t l4 = 0;
  if (k.ethertype[0] == 0x08 && k.ethertype[1] == 0x00 && f.size() >= l3 + 20) {
    const std::uint8_t* ip = f.data() + l3;
    k.src_ip[10] = k.src_ip[11] = k.dst_ip[10] = k.dst_ip[11] = 0xff;  // IPv4-mapped
    std::memcpy(k.src_ip + 12, ip + 12, 4);
    std::memcpy(k.dst_ip + 12, ip + 16, 4);
    k.ip_proto = ip[9];
    k.tos = ip[1];
    l4 = l3 + std::size_t{ip[0] & 0x0fu} * 4;
  } else if (k.ethertype[0] == 0x86 && k.ethertype[1] == 0xdd && f.size() >= l3 + 40) {
    const std::uint8_t* ip = f.data() + l3;
    std::memcpy(k.src_ip, ip + 8, 16);
    std::memcpy(k.dst_ip, ip + 24, 16);
    k.ip_proto = ip[6];
    k.tos = static_cast<std::uint8_t>(((ip[0] & 0x0f) << 4) | (ip[1] >> 4));
    l4 = l3 + 40;
  }
  if (l4 != 0 && (k.ip_proto == 6 || k.ip_proto == 17) && f.size() >= l4 + 4) {
    std::memcpy(k.sport, f.data() + l4, 2);
    std::memcpy(k.dport, f.data() + l4 + 2, 2);
  }
  return k;
}

/// The RSS hash of a frame (its match key): the Toeplitz hash over the
/// fields asked that the frame has, in Microsoft's order (source address,
/// destination address, source port, destination port).
std::uint32_t rss_hash(const RssConf& c, const uroce_flow_key& k) {
  std::uint8_t in[36];
  std::size_t n = 0;
  const auto put = [&](const std::uint8_t* p, std::size_t len) {
    std::memcpy(in + n, p, len);
    n += len;
  };
  const std::uint64_t f = c.fields;
  const bool v4 = k.ethertype[0] == 0x08 && k.ethertype[1] == 0x00;
  const bool v6 = k.ethertype[0] == 0x86 && k.ethertype[1] == 0xdd;
  if (v4 && (f & IBV_RX_HASH_SRC_IPV4)) put(k.src_ip + 12, 4);
  if (v4 && (f & IBV_RX_HASH_DST_IPV4)) put(k.dst_ip + 12, 4);
  if (v6 && (f & IBV_RX_HASH_SRC_IPV6)) put(k.src_ip, 16);
  if (v6 && (f & IBV_RX_HASH_DST_IPV6)) put(k.dst_ip, 16);
  const bool tcp = (v4 || v6) && k.ip_proto == 6, udp = (v4 || v6) && k.ip_proto == 17;
  if ((tcp && (f & IBV_RX_HASH_SRC_PORT_TCP)) || (udp && (f & IBV_RX_HASH_SRC_PORT_UDP))) put(k.sport, 2);
  if ((tcp && (f & IBV_RX_HASH_DST_PORT_TCP)) || (udp && (f & IBV_RX_HASH_DST_PORT_UDP))) put(k.dport, 2);
  return toeplitz(c.key, std::span<const std::uint8_t>(in, n));
}

bool matches(const uroce_flow_key& k, const uroce_flow_key& value, const uroce_flow_key& mask) {
  const auto* a = reinterpret_cast<const std::uint8_t*>(&k);
  const auto* v = reinterpret_cast<const std::uint8_t*>(&value);
  const auto* m = reinterpret_cast<const std::uint8_t*>(&mask);
  for (std::size_t i = 0; i < kKeyLen; ++i)
    if ((a[i] & m[i]) != v[i]) return false;
  return true;
}

}  // namespace

std::uint32_t Engine::create_flow(Qp* qp, std::uint32_t priority, const uroce_flow_key& value,
                                  const uroce_flow_key& mask) {
  if (qp == nullptr || qp->type != IBV_QPT_RAW_PACKET || qp->quarantine_until || flows_.size() >= cfg_.max_flows)
    return 0;
  RawFlow f{next_flow_++, priority, qp, value, mask};
  if (next_flow_ == 0) next_flow_ = 1;
  auto* v = reinterpret_cast<std::uint8_t*>(&f.value);
  const auto* m = reinterpret_cast<const std::uint8_t*>(&f.mask);
  for (std::size_t i = 0; i < kKeyLen; ++i) v[i] &= m[i];  // bits the mask ignores never decide
  flows_.push_back(f);  // reserved: no allocation
  return f.handle;
}

int Engine::destroy_flow(std::uint32_t handle) {
  return std::erase_if(flows_, [handle](const RawFlow& f) { return f.handle == handle; }) ? 0 : EINVAL;
}

bool Engine::rx_raw(wire::ConstBytes frame) {
  const uroce_flow_key k = key_of(frame);
  const RawFlow* best = nullptr;
  for (const RawFlow& f : flows_)
    if ((best == nullptr || f.priority < best->priority) && matches(k, f.value, f.mask)) best = &f;
  if (best == nullptr) return false;
  Qp& qp = *best->qp;
  Pd* pd = qp.pd;
  bool receives = qp.state == IBV_QPS_RTR || qp.state == IBV_QPS_RTS || qp.state == IBV_QPS_SQD;
  if (qp.rss) {
    // RSS: the hash picks the work queue, whose receive, PD and CQ it
    // takes. The QP has no state of its own to receive in (ConnectX's RSS
    // QP receives from its creation; its work queues hold the receives).
    const RssConf& c = *qp.rss;
    Srq* s = c.table[rss_hash(c, k) & (c.table.size() - 1)];
    qp.srq = s;
    qp.recv_cq = s->cq();
    pd = s->pd();
    receives = qp.state != IBV_QPS_ERR;
  }
  // A raw packet QP receives from RTR on (IBTA's receive states); before,
  // or without a receive posted, the frame is dropped, as datagrams are.
  RecvWqe w;
  if (!receives || !take_recv(qp, w)) {
    port_ctr_.inc(PortCounter::rx_raw_no_recv);
    return true;
  }
  port_ctr_.inc(PortCounter::rx_raw);
  qp.ctr.inc(QpCounter::rcvd_pkts);
  if (frame.size() > w.length) {
    complete_recv(qp, w, IBV_WC_LOC_LEN_ERR, IBV_WC_RECV, 0);
  } else if (!scatter_recv(mrs_, pd, w, 0, frame)) {
    complete_recv(qp, w, IBV_WC_LOC_PROT_ERR, IBV_WC_RECV, 0);
  } else {
    complete_recv(qp, w, IBV_WC_SUCCESS, IBV_WC_RECV, static_cast<std::uint32_t>(frame.size()));
  }
  return true;
}

bool Engine::gather(const SendWqe& w, std::uint64_t off, std::uint8_t* dst, std::uint32_t n) const {
  if (w.is_inline) {
    std::memcpy(dst, w.inline_data + off, n);
    return true;
  }
  for (std::uint32_t i = 0; i < w.nsge && n > 0; ++i) {
    const Sge& s = w.sge[i];
    if (off >= s.length) {
      off -= s.length;
      continue;
    }
    const std::uint32_t take = static_cast<std::uint32_t>(std::min<std::uint64_t>(n, s.length - off));
    if (!get_bytes(w.local[i].at(off), dst, take)) return false;
    dst += take;
    n -= take;
    off = 0;
  }
  return n == 0;
}

bool Engine::send_raw(Qp& qp, SendWqe& w) {
  Requester& r = qp.req;
  if (qp.state == IBV_QPS_SQD) return false;
  // The whole frame now: a local length or protection error completes the
  // WQE (in order) and the QP goes to ERR.
  ibv_wc_status bad = IBV_WC_SUCCESS;
  if (w.length < 14 || w.length > TxFrame::kMaxRawFrame) {
    bad = IBV_WC_LOC_LEN_ERR;
  } else if (!translate_sges(qp, w)) {
    bad = IBV_WC_LOC_PROT_ERR;
  }
  const auto len = static_cast<std::uint32_t>(w.length);
  const auto fail = [&](ibv_wc_status st) {
    if (r.cursor != qp.sq.head()) return false;
    complete_send(qp, st);
    set_error(qp);
    return false;
  };
  if (bad != IBV_WC_SUCCESS) return fail(bad);
  std::uint8_t head[6];
  if (!gather(w, 0, head, 6)) return fail(IBV_WC_LOC_PROT_ERR);
  const bool own = std::memcmp(head, cfg_.mac.data(), 6) == 0;
  if (own) {
    // To the port itself: to its flows only, never on the wire.
    if (!gather(w, 0, raw_scratch_.get(), len)) return fail(IBV_WC_LOC_PROT_ERR);
    (void)rx_raw(wire::ConstBytes(raw_scratch_.get(), len));
  } else {
    TxFrame* f = tx_slot();
    if (f == nullptr) return false;
    // Copied whole (the application may reuse its buffer once the send
    // completes, which is now): the first bytes in place of headers, the
    // rest into the slot's bounce buffer.
    const std::uint32_t h = std::min<std::uint32_t>(len, TxFrame::kMaxHdr);
    bool ok = gather(w, 0, f->hdr, h);
    if (ok && len > h) {
      std::uint8_t* b = bounce_of(*f);
      ok = gather(w, h, b, len - h);
      f->seg[f->nseg++] = {b, len - h};
      f->bounced = true;
    }
    if (!ok) {
      unbuilt(*f);
      return fail(IBV_WC_LOC_PROT_ERR);
    }
    f->hdr_len = static_cast<std::uint16_t>(h);
    f->raw = true;
    f->qpn = qp.qpn;
    f->psn = wire::Psn{};
    f->opcode = 0;
    qp.ctr.inc(QpCounter::sent_pkts);
    port_ctr_.inc(PortCounter::tx_frames);
    if (head[0] & 1) {
      // To a group: this port's own flows get it too, as a NIC loops it back.
      f->copy_to(wire::Bytes(raw_scratch_.get(), TxFrame::kMaxRawFrame));
      (void)rx_raw(wire::ConstBytes(raw_scratch_.get(), len));
    }
  }
  w.started = true;
  w.npkts = 1;
  ++r.cursor;
  r.cursor_pkt = 0;
  complete_send(qp, IBV_WC_SUCCESS);
  return true;
}

}  // namespace uroce::transport
