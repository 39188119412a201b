#include "stack/wire/parser.h"

#include <array>
#include <bit>
#include <cstring>
#include <optional>

#include "stack/wire/icrc.h"

namespace uroce::wire {

namespace {

constexpr std::array<std::string_view, static_cast<std::size_t>(Reject::kCount)> kRejectText = {
#define UROCE_X(name, text) text,
    UROCE_PARSE_REJECTS(UROCE_X)
#undef UROCE_X
};

/// The UDP destination port at `udp_off`, if the frame holds it.
std::optional<std::uint16_t> peek_dport(ConstBytes frame, std::size_t udp_off) {
  if (frame.size() < udp_off + 4) return std::nullopt;
  return view<UdpHdr>(frame.data() + udp_off)->dport.get();
}

/// The first extension header (in wire order) that does not fit in `avail`
/// bytes counted from the start of the BTH; kPayload if they all fit.
HeaderId first_unfit_header(const OpcodeInfo& info, std::size_t avail) {
  struct Slot {
    std::uint8_t off;
    std::size_t len;
    HeaderId id;
  };
  const Slot slots[] = {
      {info.off_deth, sizeof(Deth), HeaderId::kDeth},
      {info.off_xrceth, sizeof(Xrceth), HeaderId::kXrceth},
      {info.off_feth, sizeof(Feth), HeaderId::kFeth},
      {info.off_reth, sizeof(Reth), HeaderId::kReth},
      {info.off_atomic_eth, sizeof(AtomicEth), HeaderId::kAtomicEth},
      {info.off_aeth, sizeof(Aeth), HeaderId::kAeth},
      {info.off_atomic_ack, sizeof(AtomicAckEth), HeaderId::kAtomicAckEth},
      {info.off_immdt, sizeof(ImmDt), HeaderId::kImmDt},
      {info.off_ieth, sizeof(Ieth), HeaderId::kIeth},
      {info.off_cnp, sizeof(CnpBody), HeaderId::kCnp},
      {info.off_srh, sizeof(Srh), HeaderId::kSrh},
      {info.off_sack, sizeof(Sack), HeaderId::kSack},
  };
  for (const auto& s : slots)
    if (s.off != 0 && s.off + s.len > avail) return s.id;
  return HeaderId::kPayload;
}

}  // namespace

std::string_view to_string(Reject r) {
  const auto i = static_cast<std::size_t>(r);
  return i < kRejectText.size() ? kRejectText[i] : std::string_view("unknown");
}

std::string_view to_string(HeaderId h) {
  switch (h) {
    case HeaderId::kNone: return "none";
    case HeaderId::kEth: return "Ethernet";
    case HeaderId::kVlan: return "802.1Q";
    case HeaderId::kIpv4: return "IPv4";
    case HeaderId::kIpv6: return "IPv6";
    case HeaderId::kUdp: return "UDP";
    case HeaderId::kBth: return "BTH";
    case HeaderId::kDeth: return "DETH";
    case HeaderId::kXrceth: return "XRCETH";
    case HeaderId::kFeth: return "FETH";
    case HeaderId::kReth: return "RETH";
    case HeaderId::kAtomicEth: return "AtomicETH";
    case HeaderId::kAeth: return "AETH";
    case HeaderId::kAtomicAckEth: return "AtomicAckETH";
    case HeaderId::kImmDt: return "ImmDt";
    case HeaderId::kIeth: return "IETH";
    case HeaderId::kCnp: return "CNP";
    case HeaderId::kSrh: return "uroce SRH";
    case HeaderId::kSack: return "uroce SACK";
    case HeaderId::kPayload: return "payload";
    case HeaderId::kIcrc: return "ICRC";
  }
  return "unknown";
}

std::string ParseStatus::to_string() const {
  std::string s(wire::to_string(reject));
  if (reject == Reject::kTruncated) {
    s += ": ";
    s += wire::to_string(header);
  }
  return s;
}

std::uint16_t ipv4_header_checksum(const std::uint8_t* hdr, std::size_t len) noexcept {
  // RFC 1071: the one's-complement sum does not depend on byte order
  // (section 2.B), so it adds 32-bit words as they load, folds the carries
  // back in, and swaps the 16 bits that remain once, at the end.
  const auto words = [hdr](std::size_t n) {
    std::uint64_t s = 0;
    for (std::size_t k = 0; k + 4 <= n; k += 4) {
      std::uint32_t w;
      std::memcpy(&w, hdr + k, 4);
      s += w;
    }
    return s;
  };
  // The header without options (every one we send) at a constant length: unrolled.
  std::uint64_t sum = len == 20 ? words(20) : words(len);
  const std::size_t i = len & ~std::size_t{3};
  if (i + 2 <= len) {
    std::uint16_t w;
    std::memcpy(&w, hdr + i, 2);
    sum += w;
  }
  sum = (sum & 0xffffffff) + (sum >> 32);
  sum = (sum & 0xffff) + (sum >> 16);
  sum = (sum & 0xffff) + (sum >> 16);
  sum = (sum & 0xffff) + (sum >> 16);
  const auto folded = static_cast<std::uint16_t>(sum);
  const std::uint16_t be = std::endian::native == std::endian::little ? __builtin_bswap16(folded) : folded;
  return static_cast<std::uint16_t>(~be);
}

ParseStatus parse_frame(ConstBytes frame, const ParseOptions& opts, Packet& out) noexcept {
  const std::uint8_t* const p = frame.data();
  const std::size_t len = frame.size();
  bool roce = false;
  auto fail = [&roce](Reject r, HeaderId h = HeaderId::kNone) { return ParseStatus{r, h, roce}; };
  auto truncated = [&roce](HeaderId h) { return ParseStatus{Reject::kTruncated, h, roce}; };
  out = Packet{};
  out.frame = p;

  // --- L2 ---
  if (len < sizeof(EthHdr)) return truncated(HeaderId::kEth);
  const auto* eth = view<EthHdr>(p);
  out.eth_dst = eth->dst;
  out.eth_src = eth->src;
  std::size_t off = sizeof(EthHdr);
  std::uint16_t ethertype = eth->ethertype.get();
  if (ethertype == kEtherTypeVlan) {
    if (len < off + sizeof(VlanTag)) return truncated(HeaderId::kVlan);
    const auto* tag = view<VlanTag>(p + off);
    out.has_vlan = true;
    out.vlan_tci = tag->tci.get();
    ethertype = tag->ethertype.get();
    off += sizeof(VlanTag);
  }

  // --- L3 ---
  out.l3_off = static_cast<std::uint16_t>(off);
  std::size_t l4_len = 0;  // UDP header + UDP payload, per the IP header
  if (ethertype == kEtherTypeIpv4) {
    if (len < off + sizeof(Ipv4Hdr)) return truncated(HeaderId::kIpv4);
    const auto* ip = view<Ipv4Hdr>(p + off);
    if (ip->version() != 4) return fail(Reject::kBadIpVersion, HeaderId::kIpv4);
    const std::size_t ihl = std::size_t{ip->ihl()} * 4;
    if (ihl < sizeof(Ipv4Hdr)) return fail(Reject::kBadIhl, HeaderId::kIpv4);
    if (len < off + ihl) return truncated(HeaderId::kIpv4);
    if (ip->more_fragments() || ip->frag_offset() != 0) return fail(Reject::kIpFragment, HeaderId::kIpv4);
    if (ip->proto != kIpProtoUdp) return fail(Reject::kNotUdp, HeaderId::kIpv4);
    const auto port = peek_dport(frame, off + ihl);
    if (port && *port != kRoceV2Port) return fail(Reject::kNotRocePort, HeaderId::kUdp);
    roce = port.has_value();  // from here on, a rejection is a malformed RoCE frame
    if (ipv4_header_checksum(p + off, ihl) != 0) return fail(Reject::kBadIpv4Checksum, HeaderId::kIpv4);
    const std::size_t total = ip->total_len.get();
    if (total < ihl) return fail(Reject::kBadIpLength, HeaderId::kIpv4);
    if (off + total > len) return truncated(HeaderId::kIpv4);
    out.ipver = IpVersion::kV4;
    out.src = IpAddr::from_v4_bytes(ip->src.data());
    out.dst = IpAddr::from_v4_bytes(ip->dst.data());
    out.dscp = ip->dscp();
    out.ecn = ip->ecn();
    out.ttl = ip->ttl;
    off += ihl;
    l4_len = total - ihl;
  } else if (ethertype == kEtherTypeIpv6) {
    if (len < off + sizeof(Ipv6Hdr)) return truncated(HeaderId::kIpv6);
    const auto* ip = view<Ipv6Hdr>(p + off);
    if (ip->version() != 6) return fail(Reject::kBadIpVersion, HeaderId::kIpv6);
    if (ip->next_header != kIpProtoUdp) return fail(Reject::kNotUdp, HeaderId::kIpv6);
    const auto port = peek_dport(frame, off + sizeof(Ipv6Hdr));
    if (port && *port != kRoceV2Port) return fail(Reject::kNotRocePort, HeaderId::kUdp);
    roce = port.has_value();
    const std::size_t plen = ip->payload_len.get();
    if (off + sizeof(Ipv6Hdr) + plen > len) return truncated(HeaderId::kIpv6);
    out.ipver = IpVersion::kV6;
    out.src = IpAddr::from_v6_bytes(ip->src.data());
    out.dst = IpAddr::from_v6_bytes(ip->dst.data());
    out.dscp = ip->dscp();
    out.ecn = ip->ecn();
    out.ttl = ip->hop_limit;
    out.flow_label = ip->flow_label();
    off += sizeof(Ipv6Hdr);
    l4_len = plen;
  } else {
    return fail(Reject::kNotIp, HeaderId::kEth);
  }

  // --- UDP ---  (bounded by the IP length, not the frame: Ethernet may pad)
  out.l4_off = static_cast<std::uint16_t>(off);
  if (l4_len < sizeof(UdpHdr)) return truncated(HeaderId::kUdp);
  const auto* udp = view<UdpHdr>(p + off);
  if (udp->dport.get() != kRoceV2Port) return fail(Reject::kNotRocePort, HeaderId::kUdp);
  roce = true;
  if (udp->len.get() != l4_len) return fail(Reject::kBadUdpLength, HeaderId::kUdp);
  out.sport = udp->sport.get();
  off += sizeof(UdpHdr);
  const std::size_t end = off + l4_len - sizeof(UdpHdr);  // end of UDP payload
  out.frame_len = static_cast<std::uint32_t>(end);

  // --- BTH ---
  if (end < off + sizeof(Bth) + kIcrcLen) return truncated(off + sizeof(Bth) > end ? HeaderId::kBth : HeaderId::kIcrc);
  out.bth_off = static_cast<std::uint16_t>(off);
  const auto* bth = view<Bth>(p + off);
  if (bth->tver() != 0) return fail(Reject::kBadTver, HeaderId::kBth);
  const std::uint8_t opcode = bth->opcode;
  const OpcodeInfo& info = opcode_info(opcode);
  if (!info.valid()) {
    return transport_of(opcode) == Transport::kRd ? fail(Reject::kUnsupportedTransport, HeaderId::kBth)
                                                  : fail(Reject::kReservedOpcode, HeaderId::kBth);
  }
  out.opcode = opcode;
  out.info = &info;
  out.se = bth->se();
  out.migreq = bth->migreq();
  out.padcnt = bth->padcnt();
  out.pkey = bth->pkey.get();
  out.fecn = bth->fecn();
  out.becn = bth->becn();
  out.destqp = bth->destqp.get();
  out.ackreq = bth->ack_req();
  out.psn = Psn(bth->psn.get());

  // --- Extension headers, payload, pad, ICRC ---
  const std::size_t icrc_off = end - kIcrcLen;
  const std::size_t transport_len = icrc_off - off;  // BTH, ext headers, payload, pad
  if (transport_len < info.hdr_len) return truncated(first_unfit_header(info, transport_len));
  const std::size_t region = transport_len - info.hdr_len;  // payload + pad
  if (!info.has(kOpPayload)) {
    if (region != 0 || out.padcnt != 0) return fail(Reject::kBadLength, HeaderId::kPayload);
  } else {
    // The pad brings the payload to a 4-byte multiple (IBTA 9.2.4); only a
    // message's last (or only) packet may be short, so only it may pad.
    if (region % 4 != 0 || out.padcnt > region) return fail(Reject::kBadPadCount, HeaderId::kBth);
    if (out.padcnt != 0 && !info.has(kOpEnd)) return fail(Reject::kBadPadCount, HeaderId::kBth);
  }
  out.payload_off = static_cast<std::uint16_t>(off + info.hdr_len);
  out.payload_len = static_cast<std::uint32_t>(region - out.padcnt);
  if (info.fixed_payload != 0 && out.payload_len != info.fixed_payload)
    return fail(Reject::kBadLength, HeaderId::kPayload);
  if (out.payload_len > opts.max_payload) return fail(Reject::kPayloadOverMtu, HeaderId::kPayload);
  out.icrc_off = static_cast<std::uint16_t>(icrc_off);
  out.icrc = icrc_load(p + icrc_off);

  if (opts.verify_icrc) {
    const auto want = icrc_compute(ConstBytes(p + out.l3_off, icrc_off - out.l3_off));
    if (!want || *want != out.icrc) return fail(Reject::kBadIcrc, HeaderId::kIcrc);
  }
  return ParseStatus{Reject::kOk, HeaderId::kNone, true};
}

}  // namespace uroce::wire
