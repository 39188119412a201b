#include "stack/wire/header_template.h"

#include <bit>
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
  // Which bits the ICRC masks: the masking of a copy whose bytes are all 0
  // but the first (the IP version, which it reads) sets exactly those. The
  // first byte never changes from packet to packet, so a bit of it already
  // set needs no mask.
  std::uint8_t z[sizeof hdr_] = {};
  z[l3_] = hdr_[l3_];
  std::uint8_t m0[kIcrcMaskedMax];
  const std::size_t m = icrc_masked(ConstBytes(z + l3_, n - l3_), m0);
  if (m != (v4_ ? kMaskedV4 : kMaskedV6)) return false;
  std::uint8_t bytes[kMaskWords * 8] = {};
  for (std::size_t i = 0; i < m; ++i) bytes[i] = static_cast<std::uint8_t>(m0[i] & ~(i < 8 ? 0 : z[l3_ + i - 8]));
  std::memcpy(mask_, bytes, sizeof mask_);
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

namespace {
// The ICRC's view of the headers, `kLen` bytes at `v`, with `mask` ORed in
// while `crc` runs, then put back: a fixed length per IP version, so that
// the word loops unroll.
template <std::size_t kLen, typename F>
std::uint32_t with_mask(std::uint8_t* v, const std::uint64_t* mask, F&& crc) noexcept {
  constexpr std::size_t kWords = kLen / 8, kTail = kLen % 8;
  static_assert(kTail == 0 || kTail == 4);
  std::uint64_t save[kWords];
#pragma GCC unroll 16
  for (std::size_t i = 0; i < kWords; ++i) {
    std::memcpy(&save[i], v + 8 * i, 8);
    const std::uint64_t w = save[i] | mask[i];
    std::memcpy(v + 8 * i, &w, 8);
  }
  std::uint32_t tail = 0;
  if constexpr (kTail == 4) {
    std::memcpy(&tail, v + 8 * kWords, 4);
    const auto w = static_cast<std::uint32_t>(tail | mask[kWords]);  // the mask's low bytes: little-endian
    std::memcpy(v + 8 * kWords, &w, 4);
  }
  const std::uint32_t c = crc();
#pragma GCC unroll 16
  for (std::size_t i = 0; i < kWords; ++i) std::memcpy(v + 8 * i, &save[i], 8);
  if constexpr (kTail == 4) std::memcpy(v + 8 * kWords, &tail, 4);
  return c;
}
}  // namespace

std::uint32_t HeaderTemplate::icrc(std::uint8_t* frame, std::size_t len, std::span<const ConstBytes> more,
                                   std::uint8_t pad) const noexcept {
  // The ICRC's view starts 8 bytes before L3 (the LRH's stand-in, all 1s):
  // mask in place, one CRC over the headers and whatever was copied after
  // them (then the rest), and the bytes as they were.
  static_assert(std::endian::native == std::endian::little, "the mask words are little-endian byte strings");
  std::uint8_t* v = frame + l3_ - 8;
  const auto crc = [&] { return crc32_chain(0, ConstBytes(v, len - (l3_ - 8)), more, pad); };
  return v4_ ? with_mask<kMaskedV4>(v, mask_, crc) : with_mask<kMaskedV6>(v, mask_, crc);
}

}  // namespace uroce::wire
