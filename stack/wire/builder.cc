#include "stack/wire/builder.h"

#include <cstring>

#include "stack/wire/icrc.h"
#include "stack/wire/parser.h"

namespace uroce::wire {

namespace {

std::size_t l2_len(const FrameSpec& s) { return sizeof(EthHdr) + (s.vlan ? sizeof(VlanTag) : 0); }
std::size_t l3_len(const FrameSpec& s) {
  return s.ipver == IpVersion::kV4 ? sizeof(Ipv4Hdr) : sizeof(Ipv6Hdr);
}

template <typename H>
H* put(std::uint8_t* bth, std::uint8_t off) {
  return view<H>(bth + off);
}

}  // namespace

std::size_t header_len(const FrameSpec& spec) noexcept {
  return l2_len(spec) + l3_len(spec) + sizeof(UdpHdr) + opcode_info(spec.opcode).hdr_len;
}

std::size_t frame_len(const FrameSpec& spec, std::size_t payload_len) noexcept {
  return header_len(spec) + payload_len + pad_for(payload_len) + kIcrcLen;
}

std::size_t build_headers(Bytes out, const FrameSpec& spec, std::size_t payload_len) noexcept {
  const OpcodeInfo& info = opcode_info(spec.opcode);
  if (!info.valid()) return 0;
  if (!info.has(kOpPayload) && payload_len != 0) return 0;
  const std::size_t hlen = header_len(spec);
  const std::size_t total = frame_len(spec, payload_len);
  if (out.size() < hlen || total > 0xffff) return 0;
  std::uint8_t* p = out.data();
  std::memset(p, 0, hlen);

  const std::uint16_t l3_type = spec.ipver == IpVersion::kV4 ? kEtherTypeIpv4 : kEtherTypeIpv6;
  auto* eth = view<EthHdr>(p);
  eth->dst = spec.eth_dst;
  eth->src = spec.eth_src;
  std::size_t off = sizeof(EthHdr);
  if (spec.vlan) {
    eth->ethertype.set(kEtherTypeVlan);
    auto* tag = view<VlanTag>(p + off);
    tag->tci.set(spec.vlan_tci);
    tag->ethertype.set(l3_type);
    off += sizeof(VlanTag);
  } else {
    eth->ethertype.set(l3_type);
  }

  const std::size_t udp_len = total - off - l3_len(spec);
  const std::uint8_t tos = static_cast<std::uint8_t>((spec.dscp << 2) | (spec.ecn & 3));
  if (spec.ipver == IpVersion::kV4) {
    auto* ip = view<Ipv4Hdr>(p + off);
    ip->ver_ihl = 0x45;
    ip->tos = tos;
    ip->total_len.set(static_cast<std::uint16_t>(udp_len + sizeof(Ipv4Hdr)));
    ip->id.set(spec.ip_id);
    ip->frag.set(spec.dont_fragment ? 0x4000 : 0);
    ip->ttl = spec.ttl;
    ip->proto = kIpProtoUdp;
    std::memcpy(ip->src.data(), spec.src.v4(), 4);
    std::memcpy(ip->dst.data(), spec.dst.v4(), 4);
    if (spec.ipv4_checksum) ip->csum.set(ipv4_header_checksum(p + off, sizeof(Ipv4Hdr)));
  } else {
    auto* ip = view<Ipv6Hdr>(p + off);
    ip->ver_tc_flow.set((6u << 28) | (std::uint32_t{tos} << 20) | (spec.flow_label & 0xfffff));
    ip->payload_len.set(static_cast<std::uint16_t>(udp_len));
    ip->next_header = kIpProtoUdp;
    ip->hop_limit = spec.ttl;
    ip->src = spec.src.b;
    ip->dst = spec.dst.b;
  }
  off += l3_len(spec);

  auto* udp = view<UdpHdr>(p + off);
  udp->sport.set(spec.udp_sport);
  udp->dport.set(kRoceV2Port);
  udp->len.set(static_cast<std::uint16_t>(udp_len));
  udp->csum.set(0);  // RoCEv2 senders put 0 in the UDP checksum (Annex A17; rxe does the same)
  off += sizeof(UdpHdr);

  std::uint8_t* b = p + off;
  auto* bth = view<Bth>(b);
  bth->opcode = spec.opcode;
  bth->set_flags(spec.se, spec.migreq, pad_for(payload_len));
  bth->pkey.set(spec.pkey);
  bth->resv8a = static_cast<std::uint8_t>((spec.fecn ? 0x80 : 0) | (spec.becn ? 0x40 : 0));
  bth->destqp.set(spec.destqp);
  bth->ackreq = spec.ackreq ? 0x80 : 0;
  bth->psn.set(spec.psn.value());
  build_ext(b, info, spec.ext);
  return hlen;
}

void build_ext(std::uint8_t* b, const OpcodeInfo& info, const ExtFields& e) noexcept {
  if (info.off_deth) {
    auto* h = put<Deth>(b, info.off_deth);
    h->qkey.set(e.deth_qkey);
    h->src_qp.set(e.deth_src_qp);
  }
  if (info.off_xrceth) put<Xrceth>(b, info.off_xrceth)->srqn.set(e.xrc_srqn);
  if (info.off_feth) put<Feth>(b, info.off_feth)->bits.set(e.feth);
  if (info.off_reth) {
    auto* h = put<Reth>(b, info.off_reth);
    h->va.set(e.reth_va);
    h->rkey.set(e.reth_rkey);
    h->dma_len.set(e.reth_len);
  }
  if (info.off_atomic_eth) {
    auto* h = put<AtomicEth>(b, info.off_atomic_eth);
    h->va.set(e.atomic_va);
    h->rkey.set(e.atomic_rkey);
    h->swap_add.set(e.atomic_swap_add);
    h->compare.set(e.atomic_compare);
  }
  if (info.off_aeth) {
    auto* h = put<Aeth>(b, info.off_aeth);
    h->syndrome = e.aeth_syndrome;
    h->msn.set(e.aeth_msn);
  }
  if (info.off_atomic_ack) put<AtomicAckEth>(b, info.off_atomic_ack)->orig.set(e.atomic_ack_orig);
  if (info.off_immdt) put<ImmDt>(b, info.off_immdt)->imm.set(e.imm);
  if (info.off_ieth) put<Ieth>(b, info.off_ieth)->rkey.set(e.ieth_rkey);
  if (info.off_srh) {
    auto* h = put<Srh>(b, info.off_srh);
    h->msn.set(e.srh_msn);
    h->offset.set(e.srh_offset);
    h->total.set(e.srh_total);
    h->imm.set(e.imm);
    h->flags = e.srh_flags;
  }
  if (info.off_sack) {
    auto* h = put<Sack>(b, info.off_sack);
    h->base.set(e.sack_base & 0xffffff);
    for (int i = 0; i < 4; ++i) h->bits[i].set(e.sack_bits[i]);
  }
  // The CNP body is 16 reserved zero bytes, already cleared.
}

std::size_t build_frame(Bytes out, const FrameSpec& spec, ConstBytes payload) noexcept {
  const std::size_t total = frame_len(spec, payload.size());
  if (out.size() < total) return 0;
  const std::size_t hlen = build_headers(out, spec, payload.size());
  if (hlen == 0) return 0;
  std::uint8_t* p = out.data();
  if (!payload.empty()) std::memcpy(p + hlen, payload.data(), payload.size());
  const std::size_t pad = pad_for(payload.size());
  std::memset(p + hlen + payload.size(), 0, pad);
  const std::size_t l3 = l2_len(spec);
  const std::size_t icrc_off = total - kIcrcLen;
  const auto icrc = icrc_compute(ConstBytes(p + l3, icrc_off - l3));
  if (!icrc) return 0;
  icrc_store(p + icrc_off, *icrc);
  return total;
}

void mark_ce(std::uint8_t* l3, IpVersion v) noexcept {
  if (v == IpVersion::kV4) {
    auto* ip = view<Ipv4Hdr>(l3);
    ip->tos |= 3;
    ip->csum.set(0);
    ip->csum.set(ipv4_header_checksum(l3, std::size_t{ip->ihl()} * 4));
  } else {
    l3[1] |= 0x30;  // the ECN bits of the traffic class
  }
}

}  // namespace uroce::wire
