#include "stack/wire/header_template.h"

#include <isa-l/crc.h>

#include <cstring>

namespace uroce::wire {

namespace {
void put16(std::uint8_t* p, std::uint32_t v) {
  p[0] = static_cast<std::uint8_t>(v >> 8);
  p[1] = static_cast<std::uint8_t>(v);
}
}  // namespace

bool HeaderTemplate::build(const FrameSpec& base) noexcept {
  clear();
  FrameSpec s = base;
  s.opcode = op::kRcSendOnly;  // BTH only, a payload allowed: the template's own lengths are for no payload
  s.se = s.ackreq = s.fecn = s.becn = false;
  s.psn = Psn{};
  std::uint8_t buf[kMaxLen];
  const std::size_t n = build_headers(Bytes(buf, sizeof buf), s, 0);
  if (n == 0 || n > sizeof hdr_) return false;
  std::memcpy(hdr_, buf, n);
  l3_ = static_cast<std::uint8_t>(14 + (s.vlan ? 4 : 0));
  v4_ = s.ipver == IpVersion::kV4;
  udp_ = static_cast<std::uint8_t>(l3_ + (v4_ ? sizeof(Ipv4Hdr) : sizeof(Ipv6Hdr)));
  bth_ = static_cast<std::uint8_t>(udp_ + sizeof(UdpHdr));
  flags_ = hdr_[bth_ + 1] & 0x4f;
  csum_ = v4_ && s.ipv4_checksum;
  len_base_ = static_cast<std::uint16_t>((hdr_[l3_ + (v4_ ? 2 : 4)] << 8) | hdr_[l3_ + (v4_ ? 3 : 5)]);
  if (csum_) {
    const std::uint32_t c = (std::uint32_t{hdr_[l3_ + 10]} << 8) | hdr_[l3_ + 11];
    csum_base_ = (~c & 0xffff) + (~std::uint32_t{len_base_} & 0xffff);
  }
  const std::size_t m = icrc_masked(ConstBytes(hdr_ + l3_, n - l3_), masked_);
  if (m == 0) return false;
  masked_len_ = static_cast<std::uint8_t>(m);
  base_len_ = static_cast<std::uint8_t>(n);
  return true;
}

std::size_t HeaderTemplate::emit(std::uint8_t* out, const PacketFields& p, const ExtFields& ext,
                                 std::size_t payload_len) const noexcept {
  const OpcodeInfo& info = opcode_info(p.opcode);
  if (!info.valid() || (!info.has(kOpPayload) && payload_len != 0)) return 0;
  const std::size_t hlen = std::size_t{bth_} + info.hdr_len;
  const std::uint8_t pad = pad_for(payload_len);
  const std::size_t total = hlen + payload_len + pad + kIcrcLen;
  if (total > 0xffff) return 0;
  std::memcpy(out, hdr_, sizeof hdr_);  // a fixed size: a few vector moves
  std::uint8_t* b = out + bth_;
  if (info.hdr_len > sizeof(Bth)) {
    std::memset(b + sizeof(Bth), 0, info.hdr_len - sizeof(Bth));
    build_ext(b, info, ext);
  }
  const std::size_t udp_len = total - udp_;
  if (v4_) {
    const auto ip_len = static_cast<std::uint32_t>(udp_len + sizeof(Ipv4Hdr));
    put16(out + l3_ + 2, ip_len);
    if (csum_) {
      // RFC 1624 (eqn. 3): HC' = ~(~HC + ~m + m'), m the total length.
      std::uint32_t sum = csum_base_ + ip_len;
      sum = (sum & 0xffff) + (sum >> 16);
      sum = (sum & 0xffff) + (sum >> 16);
      put16(out + l3_ + 10, ~sum & 0xffff);
    }
  } else {
    put16(out + l3_ + 4, static_cast<std::uint32_t>(udp_len));
  }
  put16(out + udp_ + 4, static_cast<std::uint32_t>(udp_len));
  b[0] = p.opcode;
  b[1] = static_cast<std::uint8_t>(flags_ | (p.se ? 0x80 : 0) | (pad << 4));
  b[8] = p.ackreq ? 0x80 : 0;
  const std::uint32_t psn = p.psn.value();
  b[9] = static_cast<std::uint8_t>(psn >> 16);
  b[10] = static_cast<std::uint8_t>(psn >> 8);
  b[11] = static_cast<std::uint8_t>(psn);
  return hlen;
}

std::uint32_t HeaderTemplate::icrc(const std::uint8_t* hdr, std::size_t hdr_len, std::span<const ConstBytes> payload,
                                   std::uint8_t pad) const noexcept {
  // The masked template, with this packet's lengths and BTH fields (none of
  // them masked), then its extension headers as they are.
  std::uint8_t m[kIcrcMaskedMax + 64];
  std::memcpy(m, masked_, sizeof masked_);
  const auto copy = [&](std::size_t off, std::size_t n) { std::memcpy(m + 8 + (off - l3_), hdr + off, n); };
  copy(l3_ + (v4_ ? 2 : 4), 2);  // the IP length
  copy(udp_ + 4, 2);             // the UDP length
  copy(bth_, 2);                 // opcode, SE, PadCnt
  copy(bth_ + 8, 4);             // AckReq and PSN
  const std::uint8_t* h = hdr + bth_;
  const std::size_t ext = hdr_len - bth_ - sizeof(Bth);
  std::memcpy(m + masked_len_, h + sizeof(Bth), ext);
  std::uint32_t crc = crc32_gzip_refl(0, m, masked_len_ + ext);
  for (const ConstBytes& s : payload) crc = crc32_gzip_refl(crc, s.data(), s.size());
  if (pad != 0) {
    static constexpr std::uint8_t kZeros[4] = {};
    crc = crc32_gzip_refl(crc, kZeros, pad);
  }
  return crc;
}

}  // namespace uroce::wire
