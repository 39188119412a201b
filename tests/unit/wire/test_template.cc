// The per-QP header template against the builder and the ICRC it replaces
// on the data path: for random QPs (IPv4 and IPv6, with and without VLAN,
// checksum offloaded or not) and random packets of every opcode in the
// table, emit() writes what build_headers writes, byte for byte, and icrc()
// gives what icrc_compute gives over the same frame, its payload split into
// random segments.
#include "stack/wire/header_template.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "stack/wire/parser.h"

namespace uroce::wire {
namespace {

FrameSpec random_qp(std::mt19937_64& rng) {
  FrameSpec s;
  const bool v4 = rng() & 1;
  s.ipver = v4 ? IpVersion::kV4 : IpVersion::kV6;
  for (auto& b : s.eth_dst) b = static_cast<std::uint8_t>(rng());
  for (auto& b : s.eth_src) b = static_cast<std::uint8_t>(rng());
  s.vlan = rng() & 1;
  s.vlan_tci = static_cast<std::uint16_t>(rng());
  if (v4) {
    s.src = IpAddr::from_v4(10, static_cast<std::uint8_t>(rng()), static_cast<std::uint8_t>(rng()), 1);
    s.dst = IpAddr::from_v4(10, static_cast<std::uint8_t>(rng()), static_cast<std::uint8_t>(rng()), 2);
  } else {
    for (auto& b : s.src.b) b = static_cast<std::uint8_t>(rng());
    for (auto& b : s.dst.b) b = static_cast<std::uint8_t>(rng());
    s.src.b[0] = s.dst.b[0] = 0xfd;
  }
  s.dscp = static_cast<std::uint8_t>(rng() % 64);
  s.ecn = static_cast<std::uint8_t>(rng() % 4);
  s.ttl = static_cast<std::uint8_t>(rng());
  s.ip_id = static_cast<std::uint16_t>(rng());
  s.dont_fragment = rng() & 1;
  s.ipv4_checksum = rng() % 4 != 0;
  s.flow_label = static_cast<std::uint32_t>(rng()) & 0xfffff;
  s.udp_sport = static_cast<std::uint16_t>(0xc000 | rng());
  s.migreq = rng() & 1;
  s.pkey = static_cast<std::uint16_t>(rng());
  s.destqp = static_cast<std::uint32_t>(rng()) & 0xffffff;
  return s;
}

ExtFields random_ext(std::mt19937_64& rng) {
  ExtFields e;
  e.reth_va = rng();
  e.reth_rkey = static_cast<std::uint32_t>(rng());
  e.reth_len = static_cast<std::uint32_t>(rng());
  e.aeth_syndrome = static_cast<std::uint8_t>(rng());
  e.aeth_msn = static_cast<std::uint32_t>(rng()) & 0xffffff;
  e.atomic_va = rng();
  e.atomic_rkey = static_cast<std::uint32_t>(rng());
  e.atomic_swap_add = rng();
  e.atomic_compare = rng();
  e.atomic_ack_orig = rng();
  e.imm = static_cast<std::uint32_t>(rng());
  e.ieth_rkey = static_cast<std::uint32_t>(rng());
  e.deth_qkey = static_cast<std::uint32_t>(rng());
  e.deth_src_qp = static_cast<std::uint32_t>(rng()) & 0xffffff;
  e.feth = static_cast<std::uint32_t>(rng());
  e.srh_msn = static_cast<std::uint32_t>(rng());
  e.srh_offset = static_cast<std::uint32_t>(rng());
  e.srh_total = static_cast<std::uint32_t>(rng());
  e.srh_flags = static_cast<std::uint8_t>(rng());
  e.sack_base = static_cast<std::uint32_t>(rng()) & 0xffffff;
  for (auto& w : e.sack_bits) w = rng();
  return e;
}

TEST(HeaderTemplate, EmitsWhatTheBuilderBuildsAndTheIcrcOfTheWholeFrame) {
  std::mt19937_64 rng(14);
  std::vector<std::uint8_t> valid;
  for (int op = 0; op < 256; ++op)
    if (opcode_info(static_cast<std::uint8_t>(op)).valid()) valid.push_back(static_cast<std::uint8_t>(op));
  ASSERT_GT(valid.size(), 40u);
  std::vector<std::uint8_t> payload(9000);
  int checked = 0, payloads = 0, contiguous = 0;
  std::uint8_t whole_frame[256];
  for (int q = 0; q < 200; ++q) {
    const FrameSpec qp = random_qp(rng);
    HeaderTemplate t;
    ASSERT_TRUE(t.build(qp));
    EXPECT_EQ(t.l3_offset(), qp.vlan ? 18u : 14u);
    for (int k = 0; k < 100; ++k) {
      FrameSpec s = qp;
      s.opcode = valid[rng() % valid.size()];
      s.se = rng() & 1;
      s.ackreq = rng() & 1;
      s.psn = Psn(static_cast<std::uint32_t>(rng()));
      s.ext = random_ext(rng);
      const bool has_payload = opcode_info(s.opcode).has(kOpPayload);
      const std::size_t len = has_payload ? rng() % 4200 : 0;
      payloads += len != 0;
      for (std::size_t i = 0; i < len; ++i) payload[i] = static_cast<std::uint8_t>(rng());

      std::uint8_t want[HeaderTemplate::kMaxLen], got[HeaderTemplate::kMaxLen];
      const std::size_t wn = build_headers(Bytes(want, sizeof want), s, len);
      const std::size_t gn = t.emit(got, PacketFields{s.opcode, s.se, s.ackreq, s.psn}, s.ext, len);
      ASSERT_NE(wn, 0u);
      ASSERT_EQ(gn, wn) << "opcode " << int(s.opcode);
      ASSERT_EQ(0, std::memcmp(got, want, wn)) << "opcode " << int(s.opcode) << " payload " << len;

      // The ICRC, the payload in up to three segments, against the whole-frame one.
      const std::uint8_t pad = pad_for(len);
      std::vector<std::uint8_t> frame(got + t.l3_offset(), got + gn);
      frame.insert(frame.end(), payload.begin(), payload.begin() + static_cast<std::ptrdiff_t>(len));
      frame.insert(frame.end(), pad, 0);
      const auto whole = icrc_compute(ConstBytes(frame));
      ASSERT_TRUE(whole.has_value());
      const std::size_t cut1 = len ? rng() % (len + 1) : 0, cut2 = cut1 + (len - cut1 ? rng() % (len - cut1 + 1) : 0);
      const ConstBytes segs[3] = {ConstBytes(payload.data(), cut1), ConstBytes(payload.data() + cut1, cut2 - cut1),
                                  ConstBytes(payload.data() + cut2, len - cut2)};
      std::uint8_t before[HeaderTemplate::kMaxLen];
      std::memcpy(before, got, gn);
      ASSERT_EQ(t.icrc(got, gn, segs, pad), *whole) << "opcode " << int(s.opcode) << " payload " << len;
      ASSERT_EQ(0, std::memcmp(before, got, gn)) << "icrc() leaves the frame as it was";
      // The payload and pad copied after the headers (the engine's small
      // packets): one buffer, the same ICRC.
      if (gn + len + pad <= sizeof whole_frame) {
        std::memcpy(whole_frame, got, gn);
        std::memcpy(whole_frame + gn, payload.data(), len);
        std::memset(whole_frame + gn + len, 0, pad);
        ASSERT_EQ(t.icrc(whole_frame, gn + len + pad, {}, 0), *whole) << "opcode " << int(s.opcode) << " in one buffer";
        ++contiguous;
      }
      ++checked;
    }
  }
  EXPECT_EQ(checked, 20000);
  EXPECT_GT(payloads, 5000);
  EXPECT_GT(contiguous, 500);
}

TEST(HeaderTemplate, RefusesWhatTheBuilderRefuses) {
  FrameSpec s;
  HeaderTemplate t;
  EXPECT_FALSE(t.valid());
  ASSERT_TRUE(t.build(s));
  EXPECT_TRUE(t.valid());
  std::uint8_t out[HeaderTemplate::kMaxLen];
  EXPECT_EQ(t.emit(out, PacketFields{0x15, false, false, Psn{}}, ExtFields{}, 0), 0u) << "not in the table";
  EXPECT_EQ(t.emit(out, PacketFields{op::kRcAck, false, false, Psn{}}, ExtFields{}, 8), 0u) << "an ACK has no payload";
  EXPECT_EQ(t.emit(out, PacketFields{op::kRcSendOnly, false, false, Psn{}}, ExtFields{}, 70000), 0u) << "over 64 KiB";
  t.clear();
  EXPECT_FALSE(t.valid());
}

}  // namespace
}  // namespace uroce::wire
