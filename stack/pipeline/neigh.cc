#include "stack/pipeline/neigh.h"

#include <cstring>

#include "stack/wire/parser.h"

namespace uroce::pipeline {

using wire::be16;
using wire::be32;
using wire::ConstBytes;
using wire::IpAddr;
using wire::MacAddr;

namespace {

constexpr MacAddr kBroadcast = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
constexpr std::uint8_t kProtoIcmp = 1;
constexpr std::uint8_t kProtoIcmp6 = 58;

struct ArpHdr {
  be16 htype, ptype;
  std::uint8_t hlen, plen;
  be16 oper;
  MacAddr sha;
  std::array<std::uint8_t, 4> spa;
  MacAddr tha;
  std::array<std::uint8_t, 4> tpa;
};
static_assert(sizeof(ArpHdr) == 28);


/// Solicited-node multicast address and MAC for an IPv6 address (RFC 4291).
IpAddr solicited_node(const IpAddr& ip) {
  IpAddr r;
  const std::uint8_t pre[13] = {0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x01, 0xff};
  std::memcpy(r.b.data(), pre, 13);
  r.b[13] = ip.b[13];
  r.b[14] = ip.b[14];
  r.b[15] = ip.b[15];
  return r;
}
MacAddr multicast_mac(const IpAddr& ip6) { return {0x33, 0x33, ip6.b[12], ip6.b[13], ip6.b[14], ip6.b[15]}; }

/// ICMPv6 checksum over the IPv6 pseudo-header and the message.
std::uint16_t icmp6_csum(const IpAddr& src, const IpAddr& dst, const std::uint8_t* msg, std::size_t len) {
  std::uint32_t s = csum_add(0, src.b.data(), 16);
  s = csum_add(s, dst.b.data(), 16);
  const std::uint8_t tail[8] = {static_cast<std::uint8_t>(len >> 24), static_cast<std::uint8_t>(len >> 16),
                                static_cast<std::uint8_t>(len >> 8),  static_cast<std::uint8_t>(len),
                                0, 0, 0, kProtoIcmp6};
  s = csum_add(s, tail, 8);
  s = csum_add(s, msg, len);
  return csum_fold(s);
}

}  // namespace

std::uint32_t csum_add(std::uint32_t sum, const std::uint8_t* p, std::size_t n) {
  for (std::size_t i = 0; i + 1 < n; i += 2) sum += (std::uint32_t{p[i]} << 8) | p[i + 1];
  if (n & 1) sum += std::uint32_t{p[n - 1]} << 8;
  return sum;
}

std::uint16_t csum_fold(std::uint32_t sum) {
  while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
  return static_cast<std::uint16_t>(~sum);
}

std::size_t Neighbors::put_eth(wire::Bytes out, const MacAddr& dst, std::uint16_t type) const {
  auto* e = wire::view<wire::EthHdr>(out.data());
  e->dst = dst;
  e->src = mac_;
  if (vlan_tci_ == 0) {
    e->ethertype.set(type);
    return sizeof(wire::EthHdr);
  }
  e->ethertype.set(wire::kEtherTypeVlan);
  auto* tag = wire::view<wire::VlanTag>(out.data() + sizeof(wire::EthHdr));
  tag->tci.set(vlan_tci_);
  tag->ethertype.set(type);
  return sizeof(wire::EthHdr) + sizeof(wire::VlanTag);
}

void Neighbors::learn(const IpAddr& ip, const MacAddr& mac) {
  if (table_.learn(ip, mac) && on_learn) on_learn(on_learn_ctx, ip, mac);
}

Neighbors::Verdict Neighbors::handle(ConstBytes f, wire::Bytes reply, std::size_t& len) {
  len = 0;
  if (f.size() < sizeof(wire::EthHdr)) return Verdict::kNotMine;
  std::size_t off = sizeof(wire::EthHdr);
  std::uint16_t type = wire::view<wire::EthHdr>(f.data())->ethertype.get();
  std::uint16_t vid = 0;
  if (type == wire::kEtherTypeVlan) {
    if (f.size() < off + 4) return Verdict::kNotMine;
    vid = wire::view<wire::VlanTag>(f.data() + off)->vid();
    type = wire::view<wire::VlanTag>(f.data() + off)->ethertype.get();
    off += 4;
  }
  if (vid != (vlan_tci_ & 0x0fff)) return Verdict::kNotMine;  // another VLAN (or untagged when we are tagged)
  if (type == wire::kEtherTypeArp) return arp(f, off, reply, len);
  if (type == wire::kEtherTypeIpv4) return icmp4(f, off, reply, len);
  if (type == wire::kEtherTypeIpv6) return icmp6(f, off, reply, len);
  return Verdict::kNotMine;
}

Neighbors::Verdict Neighbors::arp(ConstBytes f, std::size_t l3, wire::Bytes reply, std::size_t& len) {
  if (f.size() < l3 + sizeof(ArpHdr)) return Verdict::kHandled;  // runt ARP: dropped
  const auto* a = wire::view<ArpHdr>(f.data() + l3);
  if (a->htype.get() != 1 || a->ptype.get() != wire::kEtherTypeIpv4 || a->hlen != 6 || a->plen != 4)
    return Verdict::kHandled;
  const IpAddr sender = IpAddr::from_v4_bytes(a->spa.data());
  const IpAddr target = IpAddr::from_v4_bytes(a->tpa.data());
  const bool for_us = ip_.is_v4_mapped() && target == ip_;
  // Learn the sender when the ARP is for us (request or reply), RFC 826's merge rule.
  if (for_us || table_.contains(sender)) learn(sender, a->sha);
  if (a->oper.get() != 1 || !for_us || !answer) return Verdict::kHandled;
  if (reply.size() < sizeof(wire::EthHdr) + 4 + sizeof(ArpHdr)) return Verdict::kHandled;
  std::size_t n = put_eth(reply, a->sha, wire::kEtherTypeArp);
  auto* r = wire::view<ArpHdr>(reply.data() + n);
  *r = *a;
  r->oper.set(2);
  r->sha = mac_;
  std::memcpy(r->spa.data(), ip_.v4(), 4);
  r->tha = a->sha;
  r->tpa = a->spa;
  len = n + sizeof(ArpHdr);
  return Verdict::kReply;
}

Neighbors::Verdict Neighbors::icmp4(ConstBytes f, std::size_t l3, wire::Bytes reply, std::size_t& len) {
  if (f.size() < l3 + sizeof(wire::Ipv4Hdr)) return Verdict::kNotMine;
  const auto* ip = wire::view<wire::Ipv4Hdr>(f.data() + l3);
  if (ip->proto != kProtoIcmp) return Verdict::kNotMine;
  const std::size_t ihl = std::size_t{ip->ihl()} * 4;
  const std::size_t total = ip->total_len.get();
  if (ihl < 20 || total < ihl + 8 || f.size() < l3 + total) return Verdict::kHandled;
  if (!(IpAddr::from_v4_bytes(ip->dst.data()) == ip_)) return Verdict::kHandled;
  const std::uint8_t* icmp = f.data() + l3 + ihl;
  if (icmp[0] != 8 || !answer) return Verdict::kHandled;  // only echo requests get an answer
  if (reply.size() < sizeof(wire::EthHdr) + 4 + total) return Verdict::kHandled;
  std::size_t n = put_eth(reply, wire::view<wire::EthHdr>(f.data())->src, wire::kEtherTypeIpv4);
  std::memcpy(reply.data() + n, f.data() + l3, total);
  auto* rip = wire::view<wire::Ipv4Hdr>(reply.data() + n);
  std::swap(rip->src, rip->dst);
  rip->ttl = 64;
  rip->csum.set(0);
  rip->csum.set(wire::ipv4_header_checksum(reply.data() + n, ihl));
  std::uint8_t* ricmp = reply.data() + n + ihl;
  ricmp[0] = 0;  // echo reply
  ricmp[2] = ricmp[3] = 0;
  const std::uint16_t c = csum_fold(csum_add(0, ricmp, total - ihl));
  ricmp[2] = static_cast<std::uint8_t>(c >> 8);
  ricmp[3] = static_cast<std::uint8_t>(c);
  len = n + total;
  return Verdict::kReply;
}

Neighbors::Verdict Neighbors::icmp6(ConstBytes f, std::size_t l3, wire::Bytes reply, std::size_t& len) {
  if (f.size() < l3 + sizeof(wire::Ipv6Hdr) + 24) return Verdict::kNotMine;
  const auto* ip = wire::view<wire::Ipv6Hdr>(f.data() + l3);
  if (ip->next_header != kProtoIcmp6) return Verdict::kNotMine;
  const std::uint8_t* m = f.data() + l3 + sizeof(wire::Ipv6Hdr);
  const std::size_t mlen = std::min<std::size_t>(ip->payload_len.get(), f.size() - l3 - sizeof(wire::Ipv6Hdr));
  if (mlen < 24) return Verdict::kHandled;
  const IpAddr src = IpAddr::from_v6_bytes(ip->src.data());
  IpAddr target = IpAddr::from_v6_bytes(m + 8);
  // Options: source (1) or target (2) link-layer address.
  auto lladdr = [&](std::uint8_t want) -> std::optional<MacAddr> {
    for (std::size_t o = 24; o + 8 <= mlen;) {
      const std::size_t olen = std::size_t{m[o + 1]} * 8;
      if (olen == 0) break;
      if (m[o] == want && olen >= 8) {
        MacAddr mac;
        std::memcpy(mac.data(), m + o + 2, 6);
        return mac;
      }
      o += olen;
    }
    return std::nullopt;
  };
  if (m[0] == 136) {  // Neighbor Advertisement
    if (auto mac = lladdr(2)) learn(target, *mac);
    return Verdict::kHandled;
  }
  if (m[0] != 135 || ip_.is_v4_mapped() || !(target == ip_)) return Verdict::kHandled;  // NS for us only
  if (auto mac = lladdr(1)) learn(src, *mac);
  if (!answer) return Verdict::kHandled;
  // Neighbor Advertisement: solicited, override, with our link-layer address.
  len = build_nd(reply, wire::view<wire::EthHdr>(f.data())->src, src, 136, 0x60, ip_, 2);
  return len ? Verdict::kReply : Verdict::kHandled;
}

std::size_t Neighbors::build_nd(wire::Bytes out, const MacAddr& dmac, const IpAddr& dst, std::uint8_t type,
                                std::uint8_t flags, const IpAddr& target, std::uint8_t lladdr_option) const {
  // NS (135) and NA (136) share a layout (RFC 4861 4.3/4.4): type, code,
  // checksum, flags, target, then one link-layer address option with ours.
  constexpr std::size_t kMsg = 24 + 8;
  if (out.size() < sizeof(wire::EthHdr) + 4 + sizeof(wire::Ipv6Hdr) + kMsg) return 0;
  const std::size_t n = put_eth(out, dmac, wire::kEtherTypeIpv6);
  auto* ip6 = wire::view<wire::Ipv6Hdr>(out.data() + n);
  ip6->ver_tc_flow.set(6u << 28);
  ip6->payload_len.set(kMsg);
  ip6->next_header = kProtoIcmp6;
  ip6->hop_limit = 255;
  ip6->src = ip_.b;
  ip6->dst = dst.b;
  std::uint8_t* m = out.data() + n + sizeof(wire::Ipv6Hdr);
  std::memset(m, 0, kMsg);
  m[0] = type;
  m[4] = flags;
  std::memcpy(m + 8, target.b.data(), 16);
  m[24] = lladdr_option;
  m[25] = 1;  // length in units of 8 bytes
  std::memcpy(m + 26, mac_.data(), 6);
  const std::uint16_t c = icmp6_csum(ip_, dst, m, kMsg);
  m[2] = static_cast<std::uint8_t>(c >> 8);
  m[3] = static_cast<std::uint8_t>(c);
  return n + sizeof(wire::Ipv6Hdr) + kMsg;
}

std::size_t Neighbors::build_request(const IpAddr& ip, wire::Bytes out) const {
  if (ip.is_v4_mapped()) {
    if (out.size() < 64) return 0;
    std::memset(out.data(), 0, 64);  // minimum Ethernet frame, zero padded
    std::size_t n = put_eth(out, kBroadcast, wire::kEtherTypeArp);
    auto* a = wire::view<ArpHdr>(out.data() + n);
    a->htype.set(1);
    a->ptype.set(wire::kEtherTypeIpv4);
    a->hlen = 6;
    a->plen = 4;
    a->oper.set(1);
    a->sha = mac_;
    std::memcpy(a->spa.data(), ip_.v4(), 4);
    a->tha = {};
    std::memcpy(a->tpa.data(), ip.v4(), 4);
    return n + sizeof(ArpHdr) < 60 ? 60 : n + sizeof(ArpHdr);
  }
  // Neighbor Solicitation to the target's solicited-node multicast address.
  const IpAddr dst = solicited_node(ip);
  return build_nd(out, multicast_mac(dst), dst, 135, 0, ip, 1);
}

}  // namespace uroce::pipeline
