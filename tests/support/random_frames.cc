#include "tests/support/random_frames.h"

namespace uroce::testing {

using namespace uroce::wire;

std::vector<std::uint8_t> valid_opcodes() {
  std::vector<std::uint8_t> v;
  for (unsigned i = 0; i < 256; ++i)
    if (kOpcodeTable[i].valid()) v.push_back(static_cast<std::uint8_t>(i));
  return v;
}

RandomFrame random_frame(std::mt19937_64& rng, std::uint8_t opcode, IpVersion ipver, bool allow_vlan,
                         std::uint32_t max_payload) {
  auto u = [&rng](std::uint64_t max_inclusive) {
    return std::uniform_int_distribution<std::uint64_t>(0, max_inclusive)(rng);
  };
  RandomFrame f;
  FrameSpec& s = f.spec;
  const OpcodeInfo& info = opcode_info(opcode);
  for (auto& b : s.eth_dst) b = static_cast<std::uint8_t>(u(255));
  for (auto& b : s.eth_src) b = static_cast<std::uint8_t>(u(255));
  s.eth_dst[0] &= 0xfe;  // unicast
  s.eth_src[0] &= 0xfe;
  s.vlan = allow_vlan && u(1) == 1;
  s.vlan_tci = static_cast<std::uint16_t>(u(0xffff));
  s.ipver = ipver;
  if (ipver == IpVersion::kV4) {
    // One draw per statement: the order in which a call's arguments are
    // evaluated is unspecified (gcc and clang differ), and the frames must be
    // the same whichever compiler built the test.
    std::uint8_t a[6];
    for (auto& x : a) x = static_cast<std::uint8_t>(u(255));
    a[2] = static_cast<std::uint8_t>(1 + a[2] % 254);
    a[5] = static_cast<std::uint8_t>(1 + a[5] % 254);
    s.src = IpAddr::from_v4(10, a[0], a[1], a[2]);
    s.dst = IpAddr::from_v4(10, a[3], a[4], a[5]);
  } else {
    s.src.b[0] = 0xfd;
    s.dst.b[0] = 0xfd;
    for (std::size_t i = 1; i < 16; ++i) {
      s.src.b[i] = static_cast<std::uint8_t>(u(255));
      s.dst.b[i] = static_cast<std::uint8_t>(u(255));
    }
    s.flow_label = static_cast<std::uint32_t>(u(0xfffff));
  }
  s.dscp = static_cast<std::uint8_t>(u(63));
  s.ecn = static_cast<std::uint8_t>(u(3));
  s.ttl = static_cast<std::uint8_t>(1 + u(254));
  s.ip_id = static_cast<std::uint16_t>(u(0xffff));
  s.dont_fragment = u(1) == 1;
  s.opcode = opcode;
  s.se = u(1) == 1;
  s.migreq = u(1) == 1;
  s.fecn = u(1) == 1;
  s.becn = info.has(kOpCnp) ? true : u(1) == 1;
  s.ackreq = u(1) == 1;
  s.pkey = static_cast<std::uint16_t>(u(0xffff));
  s.destqp = static_cast<std::uint32_t>(u(0xffffff));
  s.psn = Psn(static_cast<std::uint32_t>(u(0xffffff)));
  s.udp_sport = udp_sport_for(static_cast<std::uint32_t>(u(0xffffff)), s.destqp);
  ExtFields& e = s.ext;
  e.reth_va = u(~0ull);
  e.reth_rkey = static_cast<std::uint32_t>(u(0xffffffff));
  e.reth_len = static_cast<std::uint32_t>(u(1u << 31));
  // Syndromes: ACK with credits, RNR NAK with a timer, or one of the NAK codes.
  switch (u(2)) {
    case 0: e.aeth_syndrome = static_cast<std::uint8_t>(u(31)); break;
    case 1: e.aeth_syndrome = static_cast<std::uint8_t>(0x20 | u(31)); break;
    default: e.aeth_syndrome = static_cast<std::uint8_t>(0x60 | u(4)); break;
  }
  e.aeth_msn = static_cast<std::uint32_t>(u(0xffffff));
  e.atomic_va = u(~0ull) & ~7ull;
  e.atomic_rkey = static_cast<std::uint32_t>(u(0xffffffff));
  e.atomic_swap_add = u(~0ull);
  e.atomic_compare = u(~0ull);
  e.atomic_ack_orig = u(~0ull);
  e.imm = static_cast<std::uint32_t>(u(0xffffffff));
  e.ieth_rkey = static_cast<std::uint32_t>(u(0xffffffff));
  e.deth_qkey = static_cast<std::uint32_t>(u(0xffffffff));
  e.deth_src_qp = static_cast<std::uint32_t>(u(0xffffff));
  e.feth = static_cast<std::uint32_t>(u(0x3f));
  e.xrc_srqn = static_cast<std::uint32_t>(u(0xffffff));

  std::size_t plen = 0;
  if (info.fixed_payload != 0) {
    plen = info.fixed_payload;
  } else if (info.has(kOpPayload)) {
    // Mostly small, sometimes up to the MTU; FIRST/MIDDLE are 4-byte multiples.
    plen = u(3) == 0 ? u(max_payload) : u(64);
    if (!info.has(kOpEnd)) plen &= ~std::size_t{3};
  }
  f.payload.resize(plen);
  for (auto& b : f.payload) b = static_cast<std::uint8_t>(u(255));
  return f;
}

}  // namespace uroce::testing
