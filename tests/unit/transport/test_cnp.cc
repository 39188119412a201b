// ECN and CNPs at the notification point (IBTA A17.9): a CE-marked packet
// makes the receiving QP send its peer QP a CNP, at most one per QP per
// interval, in the format of the real ConnectX-4 Lx CNP in the shared
// captures (read in place); a CNP received is counted for the QP it names.
// A UD QP's CNP goes to the datagram's source QP, once an interval per flow.
#include <gtest/gtest.h>

#include "drivers/pcap/pcap_io.h"
#include "stack/wire/builder.h"
#include "stack/wire/parser.h"
#include "tests/support/pair.h"

namespace uroce::testing {
namespace {

struct Seen {
  std::vector<std::uint8_t> bytes;
  std::uint64_t t = 0;
};

/// The CNPs leaving any engine, with their send times.
std::vector<Seen>* watch_cnps(Pair& p) {
  auto* out = new std::vector<Seen>;
  p.wire.tap = [out](wire::ConstBytes f, std::uint64_t now) {
    wire::Packet pkt;
    if (wire::parse_frame(f, wire::ParseOptions{}, pkt).ok() && pkt.opcode == wire::op::kCnp)
      out->push_back({std::vector<std::uint8_t>(f.begin(), f.end()), now});
  };
  return out;
}

/// Whether node A sent `f` (both engines number their QPs alike).
bool from_a(Pair& p, const TxFrame& f) { return std::memcmp(f.hdr + 6, p.A().config().mac.data(), 6) == 0; }

/// CE on every frame that A's QP `qpn` sends (its data), none elsewhere.
void mark_from(Pair& p, std::uint32_t qpn) {
  sim::Impairments imp;
  imp.ce = 1.0;
  imp.filter = [&p, qpn](const TxFrame& f) { return from_a(p, f) && f.qpn == qpn && f.opcode != wire::op::kCnp; };
  p.wire.set_impairments(imp);
}

/// `n` one-packet WRITEs from A to B on `q`, each waited for.
void writes(Pair& p, const QpPair& q, int n) {
  Sge s = p.sge(0, 0, 512);
  for (int i = 0; i < n; ++i) {
    ASSERT_EQ(p.A().post_send(q.a, p.write_to(1, s, 4096, static_cast<std::uint64_t>(i))), 0);
    std::vector<ibv_wc> wc;
    ASSERT_TRUE(p.wire.run_until([&] { return p.poll(0, wc) > 0 || !wc.empty(); }, 10'000'000));
    ASSERT_EQ(wc[0].status, IBV_WC_SUCCESS);
  }
}

std::vector<std::uint8_t> connectx_cnp() {
  pcapio::Reader r;
  EXPECT_TRUE(r.open(std::string(UROCE_CAPTURES_DIR) + "/hw-cx4lx/cnp.pcap")) << r.error();
  pcapio::Frame f;
  EXPECT_TRUE(r.next(f));
  return {f.data.begin(), f.data.end()};
}

TEST(Cnp, MatchesTheConnectX4LxCnpFieldForField) {
  const std::vector<std::uint8_t> hw = connectx_cnp();
  wire::Packet h;
  ASSERT_TRUE(wire::parse_frame(hw, wire::ParseOptions{}, h).ok());
  ASSERT_EQ(h.opcode, wire::op::kCnp);

  Pair p;
  const QpPair q = p.connect();
  std::unique_ptr<std::vector<Seen>> cnps(watch_cnps(p));
  mark_from(p, q.a->qpn);
  writes(p, q, 1);
  ASSERT_EQ(cnps->size(), 1u);
  const std::vector<std::uint8_t>& ours = cnps->front().bytes;
  wire::Packet u;
  ASSERT_TRUE(wire::parse_frame(ours, wire::ParseOptions{}, u).ok()) << "our CNP parses, ICRC included";

  EXPECT_EQ(ours.size(), hw.size()) << "74 bytes: Ethernet, IPv4, UDP, BTH, 16 reserved bytes, ICRC";
  EXPECT_EQ(u.opcode, h.opcode);
  EXPECT_EQ(u.dscp, h.dscp) << "DSCP 48";
  EXPECT_EQ(u.ecn, h.ecn) << "ECT(0)";
  EXPECT_EQ(u.ttl, h.ttl);
  EXPECT_EQ(u.sport, h.sport) << "UDP source port 0";
  EXPECT_EQ(u.pkey, h.pkey);
  EXPECT_EQ(u.psn, h.psn);
  EXPECT_EQ(u.becn, h.becn);
  EXPECT_TRUE(u.becn);
  EXPECT_EQ(u.fecn, h.fecn);
  EXPECT_EQ(u.se, h.se);
  EXPECT_EQ(u.migreq, h.migreq);
  EXPECT_EQ(u.ackreq, h.ackreq);
  EXPECT_EQ(u.padcnt, h.padcnt);
  EXPECT_EQ(u.bth()->tver(), h.bth()->tver());
  EXPECT_EQ(u.destqp, q.a->qpn) << "to the sender's QP";
  // Byte for byte where the two need not differ (addresses, IP ID, IP
  // checksum, DestQP and the ICRC do): the IP flags (DF), the UDP
  // length and checksum, the BTH's reserved byte and the 16 reserved bytes.
  const std::size_t l3 = 14, l4 = l3 + 20, bth = l4 + 8;
  EXPECT_EQ(ours[l3 + 6], hw[l3 + 6]) << "IP flags";
  EXPECT_EQ(ours[l3 + 9], hw[l3 + 9]) << "UDP";
  for (std::size_t i = 4; i < 8; ++i) EXPECT_EQ(ours[l4 + i], hw[l4 + i]) << "UDP length/checksum byte " << i;
  EXPECT_EQ(ours[bth + 4], hw[bth + 4]) << "BTH reserved byte (BECN)";
  for (std::size_t i = 0; i < 16; ++i) EXPECT_EQ(ours[bth + 12 + i], hw[bth + 12 + i]) << "reserved byte " << i;
  // Counted on both sides.
  EXPECT_EQ(q.b->ctr[QpCounter::ce_marked], 1u);
  EXPECT_EQ(q.b->ctr[QpCounter::cnp_sent], 1u);
  EXPECT_EQ(q.a->ctr[QpCounter::cnp_received], 1u);
  EXPECT_EQ(p.A().counters()[PortCounter::rx_cnp], 1u);
}

TEST(Cnp, DataPacketsLeaveEct0ByDefault) {
  // IBTA A17.9: ECN-capable transport, so that a switch can mark CE
  // rather than drop. Every frame of a connected QP (requests and ACKs,
  // both ways) carries ECT(0), the IP header's ECN field 10.
  Pair p;
  const QpPair q = p.connect();
  int frames = 0, ect0 = 0;
  p.wire.tap = [&](wire::ConstBytes f, std::uint64_t) {
    wire::Packet pkt;
    if (!wire::parse_frame(f, wire::ParseOptions{}, pkt).ok()) return;
    ++frames;
    ect0 += pkt.ecn == 2;
  };
  writes(p, q, 20);
  EXPECT_GE(frames, 40) << "20 WRITEs and their ACKs";
  EXPECT_EQ(ect0, frames);
}

TEST(Cnp, AtMostOnePerQpPerInterval) {
  Pair p;
  const QpPair q = p.connect();
  const QpPair q2 = p.connect();
  std::unique_ptr<std::vector<Seen>> cnps(watch_cnps(p));
  sim::Impairments imp;
  imp.ce = 1.0;
  imp.filter = [&](const TxFrame& f) {
    return from_a(p, f) && (f.qpn == q.a->qpn || f.qpn == q2.a->qpn) && f.opcode != wire::op::kCnp;
  };
  p.wire.set_impairments(imp);
  const std::uint64_t t0 = p.wire.now();
  // Two flows, interleaved: 300 WRITEs each, every packet marked.
  for (int i = 0; i < 300; ++i) {
    writes(p, q, 1);
    writes(p, q2, 1);
  }
  const std::uint64_t span = p.wire.now() - t0;
  ASSERT_GT(span, 10 * p.A().config().cnp_interval_ns) << "the run spans many intervals";
  for (const QpPair* f : {&q, &q2}) {
    std::vector<std::uint64_t> at;
    for (const Seen& s : *cnps) {
      wire::Packet pkt;
      ASSERT_TRUE(wire::parse_frame(s.bytes, wire::ParseOptions{}, pkt).ok());
      if (pkt.destqp == f->a->qpn && pkt.src == p.B().config().ip) at.push_back(s.t);
    }
    const std::uint64_t iv = p.B().config().cnp_interval_ns;
    ASSERT_GE(at.size(), span / iv - 1);
    ASSERT_LE(at.size(), span / iv + 1);
    for (std::size_t i = 1; i < at.size(); ++i) {
      EXPECT_GE(at[i] - at[i - 1], iv) << "never two within an interval";
      EXPECT_LT(at[i] - at[i - 1], iv + 20'000) << "and the next soon after it, while marks go on";
    }
    EXPECT_EQ(f->b->ctr[QpCounter::cnp_sent], at.size());
    EXPECT_EQ(f->a->ctr[QpCounter::cnp_received], at.size());
    EXPECT_EQ(f->b->ctr[QpCounter::ce_marked], 300u);  // one data packet a WRITE
  }
}

TEST(Cnp, NoneWithoutMarksOrWithTheIntervalZero) {
  Pair p;
  const QpPair q = p.connect();
  std::unique_ptr<std::vector<Seen>> cnps(watch_cnps(p));
  writes(p, q, 20);
  EXPECT_TRUE(cnps->empty()) << "no CE, no CNP";
  EXPECT_EQ(q.b->ctr[QpCounter::ce_marked], 0u);
  // B with CNPs off: marks are counted, nothing is sent.
  Pair off(1, 4u << 20, 64, false, [](int i, EngineConfig& c) {
    if (i == 1) c.cnp_interval_ns = 0;
  });
  const QpPair q3 = off.connect();
  std::unique_ptr<std::vector<Seen>> none(watch_cnps(off));
  mark_from(off, q3.a->qpn);
  writes(off, q3, 20);
  EXPECT_TRUE(none->empty());
  EXPECT_EQ(q3.b->ctr[QpCounter::ce_marked], 20u);
  EXPECT_EQ(q3.b->ctr[QpCounter::cnp_sent], 0u);
}

TEST(Cnp, ReceivedOnlyFromTheQpsPeer) {
  Pair p;
  const QpPair q = p.connect();
  // A CNP as B would send it, then the same from another address, and one
  // for a QP that does not exist.
  auto cnp = [&](const wire::IpAddr& src, std::uint32_t destqp) {
    wire::FrameSpec s;
    s.eth_src = p.B().config().mac;
    s.eth_dst = p.A().config().mac;
    s.src = src;
    s.dst = p.A().config().ip;
    s.opcode = wire::op::kCnp;
    s.becn = true;
    s.dscp = 48;
    s.ecn = 2;
    s.udp_sport = 0;
    s.destqp = destqp;
    std::vector<std::uint8_t> f(128);
    f.resize(wire::build_frame(f, s, {}));
    return f;
  };
  const auto good = cnp(p.B().config().ip, q.a->qpn);
  const auto stranger = cnp(wire::IpAddr::from_v4(10, 0, 0, 99), q.a->qpn);
  const auto nobody = cnp(p.B().config().ip, q.a->qpn + 1000);
  EXPECT_EQ(p.A().rx(good, p.wire.now()), RxVerdict::kCnp);
  EXPECT_EQ(p.A().rx(stranger, p.wire.now()), RxVerdict::kCnpDropped);
  EXPECT_EQ(p.A().rx(nobody, p.wire.now()), RxVerdict::kCnpDropped);
  EXPECT_EQ(q.a->ctr[QpCounter::cnp_received], 1u);
  EXPECT_EQ(p.A().counters()[PortCounter::rx_cnp], 1u);
  EXPECT_EQ(p.A().counters()[PortCounter::rx_cnp_dropped], 2u);
}

TEST(Cnp, AUdQpNotifiesEachDatagramFlowsSource) {
  // Two UD QPs on A send datagrams to one on B, every one CE-marked: each
  // of A's QPs hears CNPs from B once an interval; then, with DCQCN, one of
  // them slows down.
  Pair p(1, 4u << 20, 64, false, [](int, EngineConfig& c) { c.line_rate_bps = 10'000'000'000ull; });
  PairOptions o;
  o.type = IBV_QPT_UD;
  const QpPair q = p.connect(o);
  const QpPair q2 = p.connect(o);
  std::unique_ptr<std::vector<Seen>> cnps(watch_cnps(p));
  sim::Impairments imp;
  imp.ce = 1.0;
  imp.filter = [&](const TxFrame& f) { return from_a(p, f) && f.opcode != wire::op::kCnp; };
  p.wire.set_impairments(imp);
  Ah ah;
  ah.dgid = p.B().config().ip;
  ah.dmac = p.B().config().mac;
  const auto send = [&](Qp* from, int i) {
      Sge r = p.sge(1, 8192, 1024 + 40);
      ASSERT_EQ(p.B().post_recv(q.b, RecvWr{static_cast<std::uint64_t>(i), {&r, 1}}), 0);
      Sge s = p.sge(0, 0, 256);
      SendWr wr;
      wr.opcode = IBV_WR_SEND;  // unsignaled: A's CQ is not polled
      wr.sg_list = {&s, 1};
      wr.ah = &ah;
      wr.remote_qpn = q.b->qpn;
      wr.remote_qkey = o.qkey;
      ASSERT_EQ(p.A().post_send(from, wr), 0);
      std::vector<ibv_wc> wb;
      ASSERT_TRUE(p.wire.run_until([&] { return p.poll(1, wb) > 0 || !wb.empty(); }, 100'000'000));
      ASSERT_EQ(wb[0].status, IBV_WC_SUCCESS);
  };
  const std::uint64_t t0 = p.wire.now();
  constexpr int kEach = 300;
  for (int i = 0; i < kEach; ++i) {
    send(q.a, i);
    send(q2.a, i);
  }
  const std::uint64_t span = p.wire.now() - t0, iv = p.B().config().cnp_interval_ns;
  ASSERT_GT(span, 10 * iv) << "the run spans many intervals";
  std::uint64_t total = 0;
  for (Qp* a : {q.a, q2.a}) {
    std::vector<std::uint64_t> at;
    for (const Seen& s : *cnps) {
      wire::Packet pkt;
      ASSERT_TRUE(wire::parse_frame(s.bytes, wire::ParseOptions{}, pkt).ok());
      EXPECT_EQ(pkt.dst, p.A().config().ip) << "back to the datagrams' source";
      if (pkt.destqp == a->qpn) at.push_back(s.t);
    }
    ASSERT_GE(at.size(), span / iv - 1) << "a CNP each interval, for each flow";
    ASSERT_LE(at.size(), span / iv + 1);
    for (std::size_t i = 1; i < at.size(); ++i) EXPECT_GE(at[i] - at[i - 1], iv) << "never two within an interval";
    EXPECT_EQ(a->ctr[QpCounter::cnp_received], at.size());
    total += at.size();
  }
  EXPECT_EQ(q.b->ctr[QpCounter::cnp_sent], total);
  EXPECT_EQ(q.b->ctr[QpCounter::ce_marked], 2u * kEach);
  EXPECT_EQ(cnps->size(), total) << "no CNP to anyone else";
  EXPECT_EQ(q.a->state, IBV_QPS_RTS);
  ASSERT_EQ(p.A().set_cc(q.a, "dcqcn"), 0);
  const auto before = q.a->ctr[QpCounter::cnp_received];
  for (int i = 0; i < 200; ++i) send(q.a, i);  // a few intervals more
  EXPECT_GT(q.a->ctr[QpCounter::cnp_received], before);
  EXPECT_LT(q.a->cc->state().rate_bps, 0.5e10) << "A's DCQCN cut its rate on B's CNP";
  EXPECT_NE(q.a->rate_bps, 0u) << "and the QP is paced";
}

}  // namespace
}  // namespace uroce::testing
