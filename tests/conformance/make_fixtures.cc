// Writes the project's own capture fixtures into a directory:
//
//   make_fixtures DIR
//
// Each fixture is a scripted, deterministic conversation built with uroce's
// frame builder (fixed timestamps, fixed seeds), so regenerating them gives
// byte-identical files; the `fixtures_reproducible` test checks that.
// pcap-fixtures/README.md describes each file.

#include <cstdio>
#include <string>
#include <vector>

#include "drivers/pcap/pcap_io.h"
#include "stack/wire/builder.h"
#include "stack/wire/icrc.h"

using namespace uroce;
using namespace uroce::wire;

namespace {

constexpr std::uint32_t kMtu = 1024;

/// One side of an RC connection as seen on the wire.
struct Side {
  MacAddr mac;
  IpAddr ip;
  std::uint32_t qpn;
};

class Conversation {
 public:
  Conversation(const std::string& path, Side a, Side b, IpVersion v, bool vlan)
      : a_(a), b_(b), ipver_(v), vlan_(vlan) {
    ok_ = w_.open(path);
    if (!ok_) std::fprintf(stderr, "make_fixtures: %s: %s\n", path.c_str(), w_.error().c_str());
  }
  bool ok() const { return ok_; }

  /// Sends one frame from `from` (true: A->B). Returns the frame as built.
  std::vector<std::uint8_t> send(bool a_to_b, std::uint8_t opcode, Psn psn, const ExtFields& ext = {},
                                 std::size_t payload = 0, bool ackreq = false, std::uint8_t ecn = 2,
                                 bool becn = false) {
    const Side& s = a_to_b ? a_ : b_;
    const Side& d = a_to_b ? b_ : a_;
    FrameSpec f;
    f.eth_src = s.mac;
    f.eth_dst = d.mac;
    f.vlan = vlan_;
    f.vlan_tci = 0x6064;  // PCP 3, VID 100
    f.ipver = ipver_;
    f.src = s.ip;
    f.dst = d.ip;
    f.dscp = 26;
    f.ecn = ecn;
    f.udp_sport = udp_sport_for(s.qpn, d.qpn);
    f.opcode = opcode;
    f.destqp = d.qpn;
    f.psn = psn;
    f.ackreq = ackreq;
    f.becn = becn;
    f.ext = ext;
    std::vector<std::uint8_t> pl(payload);
    for (std::size_t i = 0; i < payload; ++i) pl[i] = static_cast<std::uint8_t>(psn.value() + i);
    std::vector<std::uint8_t> frame(frame_len(f, payload));
    if (build_frame(frame, f, pl) != frame.size()) {
      std::fprintf(stderr, "make_fixtures: cannot build opcode 0x%02x\n", opcode);
      ok_ = false;
    }
    emit(frame);
    return frame;
  }
  void emit(const std::vector<std::uint8_t>& frame) {
    usec_ += 7;
    w_.write(frame, 1767225600 + usec_ / 1000000, usec_ % 1000000);  // 2026-01-01T00:00:00Z
  }

  static ExtFields ack(std::uint32_t msn, std::uint8_t syndrome = 0x1f) {
    ExtFields e;
    e.aeth_syndrome = syndrome;
    e.aeth_msn = msn;
    return e;
  }
  static ExtFields reth(std::uint64_t va, std::uint32_t rkey, std::uint32_t len) {
    ExtFields e;
    e.reth_va = va;
    e.reth_rkey = rkey;
    e.reth_len = len;
    return e;
  }

 private:
  pcapio::Writer w_;
  Side a_, b_;
  IpVersion ipver_;
  bool vlan_;
  bool ok_ = false;
  std::int64_t usec_ = 0;
};

Side side_a(IpVersion v) {
  Side s{{0x02, 0, 0, 0, 0, 0x0a}, IpAddr::from_v4(10, 90, 0, 1), 0x11};
  if (v == IpVersion::kV6) IpAddr::parse("fd00:90::1", s.ip);
  return s;
}
Side side_b(IpVersion v) {
  Side s{{0x02, 0, 0, 0, 0, 0x0b}, IpAddr::from_v4(10, 90, 0, 2), 0x12};
  if (v == IpVersion::kV6) IpAddr::parse("fd00:90::2", s.ip);
  return s;
}

/// An RC conversation exercising every RC operation, one lost packet with
/// its NAK and go-back-N retransmission, and an RNR NAK with its retry.
bool rc_conversation(const std::string& path, IpVersion v, bool vlan) {
  Conversation c(path, side_a(v), side_b(v), v, vlan);
  if (!c.ok()) return false;
  Psn p(0xfffffd);  // crosses the 2^24 wrap early on
  std::uint32_t msn = 0;
  // SEND of 2500 bytes at MTU 1024: FIRST, MIDDLE, LAST, acknowledged once.
  c.send(true, op::kRcSendFirst, p, {}, kMtu);
  c.send(true, op::kRcSendMiddle, p + 1, {}, kMtu);
  c.send(true, op::kRcSendLast, p + 2, {}, 2500 - 2 * kMtu, true);
  c.send(false, op::kRcAck, p + 2, Conversation::ack(++msn));
  p += 3;
  // WRITE with immediate.
  ExtFields wi = Conversation::reth(0x7f0000001000, 0x00012345, 100);
  wi.imm = 0xc0ffee;
  c.send(true, op::kRcWriteOnlyImm, p, wi, 100, true);
  c.send(false, op::kRcAck, p, Conversation::ack(++msn));
  p += 1;
  // READ of 3000 bytes: three response packets, so three PSNs.
  c.send(true, op::kRcReadRequest, p, Conversation::reth(0x7f0000002000, 0x00012346, 3000), 0, true);
  c.send(false, op::kRcReadRespFirst, p, Conversation::ack(++msn), kMtu);
  c.send(false, op::kRcReadRespMiddle, p + 1, {}, kMtu);
  c.send(false, op::kRcReadRespLast, p + 2, Conversation::ack(msn), 3000 - 2 * kMtu);
  p += 3;
  // Atomics.
  ExtFields cs;
  cs.atomic_va = 0x7f0000003000;
  cs.atomic_rkey = 0x00012347;
  cs.atomic_compare = 0;
  cs.atomic_swap_add = 42;
  c.send(true, op::kRcCmpSwap, p, cs, 0, true);
  ExtFields aa = Conversation::ack(++msn);
  aa.atomic_ack_orig = 0;
  c.send(false, op::kRcAtomicAck, p, aa);
  p += 1;
  cs.atomic_swap_add = 1;
  c.send(true, op::kRcFetchAdd, p, cs, 0, true);
  aa = Conversation::ack(++msn);
  aa.atomic_ack_orig = 42;
  c.send(false, op::kRcAtomicAck, p, aa);
  p += 1;
  // SEND with invalidate.
  ExtFields inv;
  inv.ieth_rkey = 0x00012345;
  c.send(true, op::kRcSendOnlyInv, p, inv, 64, true);
  c.send(false, op::kRcAck, p, Conversation::ack(++msn));
  p += 1;
  // A 3-packet WRITE whose MIDDLE is lost: the responder NAKs the first
  // missing PSN once, the requester goes back to it.
  const ExtFields w3 = Conversation::reth(0x7f0000004000, 0x00012345, 3 * kMtu);
  c.send(true, op::kRcWriteFirst, p, w3, kMtu);
  // (p + 1, WRITE_MIDDLE, lost on the wire: not in the capture)
  c.send(true, op::kRcWriteLast, p + 2, {}, kMtu, true);
  c.send(false, op::kRcAck, p + 1, Conversation::ack(msn, 0x60));  // NAK: PSN sequence error
  c.send(true, op::kRcWriteMiddle, p + 1, {}, kMtu);
  c.send(true, op::kRcWriteLast, p + 2, {}, kMtu, true);
  c.send(false, op::kRcAck, p + 2, Conversation::ack(++msn));
  p += 3;
  // SEND with no receive posted: RNR NAK (timer code 14 = 1.28 ms), then a retry.
  c.send(true, op::kRcSendOnly, p, {}, 32, true);
  c.send(false, op::kRcAck, p, Conversation::ack(msn, 0x20 | 14));
  c.send(true, op::kRcSendOnly, p, {}, 32, true);
  c.send(false, op::kRcAck, p, Conversation::ack(++msn));
  return c.ok();
}

/// UD SENDs (with and without immediate) and a UC WRITE.
bool ud_uc(const std::string& path) {
  Conversation c(path, side_a(IpVersion::kV4), side_b(IpVersion::kV4), IpVersion::kV4, false);
  if (!c.ok()) return false;
  ExtFields d;
  d.deth_qkey = 0x11111111;
  d.deth_src_qp = 0x11;
  c.send(true, op::kUdSendOnly, Psn(7), d, 200);
  d.imm = 0x1234;
  c.send(true, op::kUdSendOnlyImm, Psn(8), d, 1);
  d.deth_src_qp = 0x12;
  c.send(false, op::kUdSendOnly, Psn(100), d, 0);
  const ExtFields w = Conversation::reth(0x1000, 0xabc, 1500);
  c.send(true, op::kUcWriteFirst, Psn(50), w, kMtu);
  c.send(true, op::kUcWriteLast, Psn(51), {}, 1500 - kMtu);
  return c.ok();
}

/// ECN congestion: data marked CE on the way, and the receiver's CNPs back.
bool cnp_ecn(const std::string& path) {
  Conversation c(path, side_a(IpVersion::kV4), side_b(IpVersion::kV4), IpVersion::kV4, false);
  if (!c.ok()) return false;
  for (std::uint32_t i = 0; i < 6; ++i) {
    const bool ce = i == 2 || i == 3;
    c.send(true, op::kRcWriteOnly, Psn(1000 + i), Conversation::reth(0x2000, 0x77, 256), 256, i == 5,
           ce ? 3 : 2);
    if (ce) c.send(false, op::kCnp, Psn(0), {}, 0, false, 2, true);  // CNPs go back to the sender's QP
  }
  c.send(false, op::kRcAck, Psn(1005), Conversation::ack(6));
  return c.ok();
}

/// Frames that must be refused: each is a valid frame, then damaged.
bool malformed(const std::string& path) {
  Conversation c(path, side_a(IpVersion::kV4), side_b(IpVersion::kV4), IpVersion::kV4, false);
  if (!c.ok()) return false;
  // Build the frame in a scratch conversation (written to /dev/null), then emit damaged copies.
  Conversation scratch("/dev/null", side_a(IpVersion::kV4), side_b(IpVersion::kV4), IpVersion::kV4, false);
  auto f = scratch.send(true, op::kRcSendOnly, Psn(1), {}, 40, true);
  auto bad_icrc = f;
  bad_icrc.back() ^= 0xff;
  c.emit(bad_icrc);
  auto truncated = f;
  truncated.resize(14 + 20 + 8 + 6);  // inside the BTH, lengths left claiming more
  c.emit(truncated);
  auto tver = f;
  tver[14 + 20 + 8 + 1] |= 0x01;
  icrc_store(tver.data() + tver.size() - 4, *icrc_compute(ConstBytes(tver.data() + 14, tver.size() - 18)));
  c.emit(tver);
  c.send(true, op::kRcSendOnly, Psn(2), {}, 40, true);  // one good frame among them
  return c.ok();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_fixtures DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  bool ok = rc_conversation(dir + "/rc_conversation_v4.pcap", IpVersion::kV4, false);
  ok = rc_conversation(dir + "/rc_conversation_v6_vlan.pcap", IpVersion::kV6, true) && ok;
  ok = ud_uc(dir + "/ud_uc.pcap") && ok;
  ok = cnp_ecn(dir + "/cnp_ecn.pcap") && ok;
  ok = malformed(dir + "/bad/malformed.pcap") && ok;
  return ok ? 0 : 1;
}
