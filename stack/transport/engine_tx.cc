// TX framing: a slot in the TX ring, a packet's headers from its QP's
// template or its frame spec, the ICRC over the frame as scatter-gather (no
// copy of the payload), and the bounce buffers ODP payloads go out in.
#include <cstring>

#include "stack/transport/engine.h"
#include "stack/wire/icrc.h"

namespace uroce::transport {

using wire::Psn;

std::size_t TxFrame::copy_to(wire::Bytes out) const {
  const std::size_t n = size();
  if (out.size() < n) return 0;
  std::uint8_t* p = out.data();
  std::memcpy(p, hdr, hdr_len);
  p += hdr_len;
  for (std::uint8_t i = 0; i < nseg; ++i) {
    if (seg[i].len) std::memcpy(p, seg[i].p, seg[i].len);
    p += seg[i].len;
  }
  std::memcpy(p, trailer, trailer_len);
  return n;
}

void Engine::ensure_bounce() {
  if (!odp_bounce_) odp_bounce_ = std::make_unique<std::uint8_t[]>(std::size_t{tx_.slot_count()} * TxFrame::kMaxPayload);
}

bool Engine::add_odp_seg(TxFrame& f, MemRef src, std::uint32_t len) {
  std::uint8_t* b = bounce_of(f);
  for (std::uint8_t i = 0; i < f.nseg; ++i)
    if (f.seg[i].p >= b && f.seg[i].p < b + TxFrame::kMaxPayload) b = const_cast<std::uint8_t*>(f.seg[i].p) + f.seg[i].len;
  if (!get_bytes(src, b, len)) return false;
  f.seg[f.nseg++] = {b, len};
  f.bounced = true;
  return true;
}

TxFrame* Engine::tx_slot() {
  TxFrame* f = tx_.size() < tx_limit() ? tx_.emplace() : nullptr;
  if (f == nullptr) {
    tx_full_ = true;
    port_ctr_.inc(PortCounter::tx_ring_full);
    return nullptr;
  }
  f->nseg = 0;
  f->trailer_len = 0;
  f->bounced = false;
  f->raw = false;
  return f;
}

wire::FrameSpec Engine::spec_for(const Qp& qp, std::uint8_t opcode, Psn psn) const {
  wire::FrameSpec s;
  s.eth_src = cfg_.mac;
  s.eth_dst = qp.remote_mac;
  s.vlan = cfg_.vlan_tci != 0;
  s.vlan_tci = cfg_.vlan_tci;
  s.ipver = qp.remote_ip.is_v4_mapped() ? wire::IpVersion::kV4 : wire::IpVersion::kV6;
  s.src = cfg_.ip;
  s.dst = qp.remote_ip;
  s.dscp = cfg_.dscp;
  s.ecn = cfg_.ecn;
  s.ipv4_checksum = !cfg_.ipv4_checksum_offload;
  s.udp_sport = qp.udp_sport;
  if (qp.hop_limit != 0) s.ttl = qp.hop_limit;  // 0: the default (64)
  s.flow_label = qp.flow_label;
  s.opcode = opcode;
  s.destqp = qp.dest_qp_num;
  s.psn = psn;
  return s;
}

void Engine::finish_frame(TxFrame& f, Qp& qp, const wire::FrameSpec& spec, std::uint32_t payload_len) {
  f.hdr_len = static_cast<std::uint16_t>(wire::build_headers(wire::Bytes(f.hdr, sizeof f.hdr), spec, payload_len));
  if (f.hdr_len == 0) return unbuilt(f);
  const std::uint8_t pad = wire::pad_for(payload_len);
  std::memset(f.trailer, 0, pad);
  // ICRC over L3..payload+pad, as scatter-gather: no copy of the payload.
  const std::size_t l3 = spec.vlan ? 18 : 14;
  wire::ConstBytes segs[kMaxSge + 3];
  std::size_t n = 0;
  segs[n++] = wire::ConstBytes(f.hdr + l3, f.hdr_len - l3);
  for (std::uint8_t i = 0; i < f.nseg; ++i) segs[n++] = wire::ConstBytes(f.seg[i].p, f.seg[i].len);
  if (pad) segs[n++] = wire::ConstBytes(f.trailer, pad);
  seal_frame(f, qp, spec.opcode, spec.psn, pad, wire::icrc_compute(std::span<const wire::ConstBytes>(segs, n)).value_or(0));
}

void Engine::unbuilt(TxFrame& f) {
  f.hdr_len = 0;
  f.nseg = 0;
  f.trailer_len = 0;
  port_ctr_.inc(PortCounter::tx_unbuilt);
}

void Engine::seal_frame(TxFrame& f, Qp& qp, std::uint8_t opcode, Psn psn, std::uint8_t pad, std::uint32_t icrc) {
  wire::icrc_store(f.trailer + pad, icrc);
  f.trailer_len = static_cast<std::uint8_t>(pad + wire::kIcrcLen);
  f.qpn = qp.qpn;
  f.psn = psn;
  f.opcode = opcode;
  qp.ctr.inc(QpCounter::sent_pkts);
  port_ctr_.inc(PortCounter::tx_frames);
}

wire::FrameSpec Engine::full_spec(const Qp& qp, const wire::PacketFields& p, const wire::ExtFields& ext) const {
  wire::FrameSpec s = spec_for(qp, p.opcode, p.psn);
  s.se = p.se;
  s.ackreq = p.ackreq;
  s.ext = ext;
  return s;
}

void Engine::finish_packet(TxFrame& f, Qp& qp, const wire::PacketFields& p_in, const wire::ExtFields& ext,
                           std::uint32_t payload_len) {
  wire::PacketFields p = p_in;
  // An XRC QP sends RC's packets under XRC's opcodes (the XRCETH, on
  // requests, comes from ext).
  if (qp.xrc != Xrc::kNone && p.opcode < 0x20) [[unlikely]]
    p.opcode = static_cast<std::uint8_t>(p.opcode + wire::op::kXrcBase);
  if (!qp.tmpl.valid()) return finish_frame(f, qp, full_spec(qp, p, ext), payload_len);
  const std::size_t hlen = qp.tmpl.emit(f.hdr, p, ext, payload_len);
  if (hlen == 0) return unbuilt(f);
  const std::uint8_t pad = wire::pad_for(payload_len);
  if (hlen + payload_len + 4 <= sizeof f.hdr) {
    // Small enough to copy after the headers: one buffer, one CRC, and
    // no segment for the driver to chain (its bytes are read now, as a NIC
    // would read them on the way out).
    std::uint8_t* b = f.hdr + hlen;
    for (std::uint8_t i = 0; i < f.nseg; ++i) {
      std::memcpy(b, f.seg[i].p, f.seg[i].len);
      b += f.seg[i].len;
    }
    std::memset(b, 0, 4);  // the pad (writing 4 is cheaper than 0..3)
    f.nseg = 0;
    f.hdr_len = static_cast<std::uint16_t>(hlen + payload_len + pad);
    seal_frame(f, qp, p.opcode, p.psn, 0, qp.tmpl.icrc(f.hdr, f.hdr_len, {}, 0));
    return;
  }
  f.hdr_len = static_cast<std::uint16_t>(hlen);
  std::memset(f.trailer, 0, pad);
  wire::ConstBytes segs[kMaxSge + 1];
  for (std::uint8_t i = 0; i < f.nseg; ++i) segs[i] = wire::ConstBytes(f.seg[i].p, f.seg[i].len);
  seal_frame(f, qp, p.opcode, p.psn, pad,
             qp.tmpl.icrc(f.hdr, f.hdr_len, std::span<const wire::ConstBytes>(segs, f.nseg), pad));
}

}  // namespace uroce::transport
