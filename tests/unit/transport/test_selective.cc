// Selective repeat (IRN-style, uroce peers only): exactly-once delivery of
// every byte of every operation (READs and atomics fenced, in IBTA's
// opcodes) under loss, duplication, reordering and corruption; packets
// placed out of order; only the lost packets resent (fewer than go-back-N
// on the same trace); the window capped; refusals; and a QP without it
// stays go-back-N on the wire.
#include <gtest/gtest.h>

#include <random>

#include "tests/support/impairment_case.h"
#include "tests/support/traffic.h"

namespace uroce::testing {
namespace {

/// What selective repeat carries in its own opcodes; the others (READ,
/// atomics) go fenced, in IBTA's.
bool carried(std::uint8_t opcode) {
  namespace op = wire::op;
  return opcode != op::kRcReadRequest && opcode != op::kRcCmpSwap && opcode != op::kRcFetchAdd;
}

class SrImpaired : public ::testing::TestWithParam<Case> {};

TEST_P(SrImpaired, MixedMessagesArriveExactlyOnceByteForByte) {
  const Case c = GetParam();
  Pair p(static_cast<std::uint64_t>(c.percent) * 10 + static_cast<std::uint64_t>(c.kind) + 101);
  PairOptions po;
  po.selective_repeat = true;
  const QpPair q = p.connect(po);
  p.wire.set_impairments(c.impairments());
  // Request opcodes on the wire: SENDs and WRITEs only as selective
  // repeat's, READs and atomics only as IBTA's (fenced).
  std::uint64_t go_back_n = 0, fenced = 0;
  p.wire.tap = [&](wire::ConstBytes f, std::uint64_t) {
    wire::Packet pkt;
    wire::ParseOptions o;
    o.verify_icrc = false;
    if (!wire::parse_frame(f, o, pkt).ok() || !pkt.info->has(wire::kOpRequest) || wire::is_sr_opcode(pkt.opcode))
      return;
    ++(carried(pkt.opcode) ? go_back_n : fenced);
  };
  TrafficOptions o;  // every operation: SEND and WRITE (+-imm), READ, fetch-add, compare-swap
  o.messages = 3000;
  o.seed = 11 + static_cast<std::uint64_t>(c.percent);
  Traffic t(p, q, o);
  const TrafficResult r = t.run();
  EXPECT_EQ(r.errors, 0u) << r.first_error;
  EXPECT_EQ(r.completed, 3000u);
  EXPECT_EQ(go_back_n, 0u) << "every SEND and WRITE went as selective repeat";
  EXPECT_GT(fenced, 500u) << "READs and atomics went, in IBTA's opcodes";
  if (c.percent > 0 && c.kind == Kind::kLoss) {
    EXPECT_GT(q.a->ctr[QpCounter::retransmitted_pkts], 0u);
    EXPECT_GT(q.b->sr->ooo, 0u) << "packets after a loss were placed before it was repaired";
  }
  if (c.percent > 0 && c.kind == Kind::kReorder) EXPECT_GT(q.b->sr->ooo, 0u);
  if (c.percent > 0 && c.kind == Kind::kDup) EXPECT_GT(q.b->ctr[QpCounter::duplicate_request], 0u);
  EXPECT_EQ(q.b->ctr[QpCounter::sent_seq_naks], 0u) << "no go-back-N NAKs";
}

INSTANTIATE_TEST_SUITE_P(Matrix, SrImpaired, ::testing::ValuesIn(matrix()), name);

/// Big WRITEs at 2% loss; A's retransmitted packets.
std::uint64_t resent_at_loss(bool sr, std::uint64_t* bytes) {
  Pair p(77, 8u << 20);
  PairOptions po;
  po.selective_repeat = sr;
  const QpPair q = p.connect(po);
  sim::Impairments imp;
  imp.loss = 0.02;
  p.wire.set_impairments(imp);
  TrafficOptions o;
  o.messages = 200;
  o.ops = {IBV_WR_RDMA_WRITE};
  o.sizes = {64 * 1024};
  o.max_size = 64 * 1024;
  o.depth = 8;
  o.seed = 5;
  Traffic t(p, q, o);
  const TrafficResult r = t.run();
  EXPECT_EQ(r.errors, 0u) << r.first_error;
  EXPECT_EQ(r.completed, 200u);
  *bytes = q.a->ctr[QpCounter::retransmitted_bytes];
  return q.a->ctr[QpCounter::retransmitted_pkts];
}

TEST(SelectiveRepeat, ResendsOnlyWhatWasLost) {
  std::uint64_t gbn_bytes = 0, sr_bytes = 0;
  const std::uint64_t gbn = resent_at_loss(false, &gbn_bytes), sr = resent_at_loss(true, &sr_bytes);
  std::printf("    resent at 2%% loss: go-back-N %lu packets (%lu bytes), selective repeat %lu (%lu bytes)\n",
              (unsigned long)gbn, (unsigned long)gbn_bytes, (unsigned long)sr, (unsigned long)sr_bytes);
  EXPECT_GT(sr, 0u);
  EXPECT_LT(sr * 4, gbn) << "a loss costs about one packet, not the rest of the window";
  EXPECT_LT(sr_bytes * 4, gbn_bytes);
}

TEST(SelectiveRepeat, KeepsItsWindowAndLeavesOtherQpsGoBackN) {
  Pair p(3, 8u << 20, 64, false, [](int, EngineConfig& c) { c.sr_window = 32; });
  PairOptions po;
  po.selective_repeat = true;
  const QpPair q = p.connect(po);
  const QpPair plain = p.connect();
  EXPECT_EQ(q.a->window, 32u) << "the BDP cap";
  EXPECT_EQ(plain.a->window, 512u);
  std::uint32_t most = 0;
  std::uint64_t sr_frames = 0, plain_sr_frames = 0;
  p.wire.tap = [&](wire::ConstBytes f, std::uint64_t) {
    wire::Packet pkt;
    wire::ParseOptions o;
    o.verify_icrc = false;
    if (!wire::parse_frame(f, o, pkt).ok()) return;
    const bool sr = wire::is_sr_opcode(pkt.opcode);
    if (pkt.destqp == q.b->qpn || pkt.destqp == q.a->qpn) sr_frames += sr;
    if (pkt.destqp == plain.b->qpn || pkt.destqp == plain.a->qpn) plain_sr_frames += sr;
    most = std::max(most, static_cast<std::uint32_t>(distance(q.a->req.una, q.a->req.sent_hi)));
  };
  for (const QpPair* x : {&q, &plain}) {
    Sge s = p.sge(0, 0, 1u << 20);
    ASSERT_EQ(p.A().post_send(x->a, p.write_to(1, s, 2u << 20)), 0);
    std::vector<ibv_wc> wc;
    ASSERT_TRUE(p.wire.run_until([&] { return p.poll(0, wc) > 0 || !wc.empty(); }, 1'000'000'000));
    EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
    EXPECT_EQ(0, std::memcmp(p.node[0].mem.data(), p.node[1].mem.data() + (2u << 20), 1u << 20));
  }
  EXPECT_LE(most, 32u);
  EXPECT_GT(sr_frames, 1000u);
  EXPECT_EQ(plain_sr_frames, 0u) << "go-back-N stays the default";
}

/// A selective-repeat pair (retry_cnt `retries`) whose first WRITE has
/// measured the round trip, so its short timer runs; then a second
/// operation (`opcode`: a WRITE, or a READ, which goes fenced) that the
/// wire drops for `silence_ns` (all of it if 0). Returns the second
/// operation's completion and, in *when, the virtual time it took.
ibv_wc write_through_silence(std::uint8_t retries, std::uint64_t silence_ns, std::uint64_t* when,
                             std::uint64_t* timeouts, ibv_wr_opcode opcode = IBV_WR_RDMA_WRITE) {
  Pair p(21);
  PairOptions po;
  po.selective_repeat = true;
  po.retry_cnt = retries;
  const QpPair q = p.connect(po);
  std::vector<ibv_wc> wc;
  const Sge s = p.sge(0, 0, 4096);
  EXPECT_EQ(p.A().post_send(q.a, p.write_to(1, s, 0, 1)), 0);
  EXPECT_TRUE(p.wire.run_until([&] { return p.poll(0, wc) > 0; }, 100'000'000));
  EXPECT_GT(q.a->rtt.count(), 0u) << "the short timer needs a round trip";
  sim::Impairments dead;
  dead.loss = 1.0;
  p.wire.set_impairments(dead);
  wc.clear();
  const std::uint64_t t0 = p.wire.now();
  SendWr second = p.write_to(1, s, 8192, 2);
  second.opcode = opcode;
  EXPECT_EQ(p.A().post_send(q.a, second), 0);
  if (silence_ns != 0) {
    p.wire.run_until([&] { return p.poll(0, wc) > 0; }, silence_ns);
    p.wire.set_impairments({});
  }
  EXPECT_TRUE(p.wire.run_until([&] { return !wc.empty() || p.poll(0, wc) > 0; }, 1'000'000'000));
  *when = p.wire.now() - t0;
  *timeouts = q.a->ctr[QpCounter::timeouts];
  return wc.empty() ? ibv_wc{} : wc[0];
}

TEST(SelectiveRepeat, ShortTimeoutsSpendNoRetryBeforeTheIbtaTimer) {
  // retry_cnt 1 and a 1.05 ms IBTA timer (PairOptions::timeout 8): a peer
  // silent for 0.8 ms sees dozens of round-trip timeouts (20 us each), and
  // none of them may spend the budget; the WRITE completes once the wire
  // is back.
  std::uint64_t t = 0, timeouts = 0;
  const ibv_wc wc = write_through_silence(1, 800'000, &t, &timeouts);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << "status " << wc.status;
  EXPECT_EQ(wc.wr_id, 2u);
  EXPECT_GT(timeouts, 10u) << "the short timer resent during the silence";
}

TEST(SelectiveRepeat, AFencedReadSpendsNoRetryBeforeTheIbtaTimerEither) {
  // A READ goes fenced, recovering as go-back-N does, which spends a retry
  // on every timeout: so while fenced the timer is IBTA's, never the short
  // one (whose timeouts would spend retry_cnt in a few round trips of a
  // slow peer).
  std::uint64_t t = 0, timeouts = 0;
  const ibv_wc wc = write_through_silence(1, 800'000, &t, &timeouts, IBV_WR_RDMA_READ);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << "status " << wc.status;
  EXPECT_EQ(wc.wr_id, 2u);
  EXPECT_EQ(wc.opcode, IBV_WC_RDMA_READ);
  EXPECT_LE(timeouts, 1u);
}

TEST(SelectiveRepeat, ADeadPeerFailsAfterRetryCntPlusOneIbtaTimeouts) {
  // As under go-back-N (IBTA C9-141): retry_cnt 2 fails the WRITE on the
  // third IBTA timeout after the last progress, not sooner.
  std::uint64_t t = 0, timeouts = 0;
  const ibv_wc wc = write_through_silence(2, 0, &t, &timeouts);
  EXPECT_EQ(wc.status, IBV_WC_RETRY_EXC_ERR) << "status " << wc.status;
  const std::uint64_t full = transport::timeout_ns(8);
  EXPECT_GE(t, 3 * full);
  EXPECT_LT(t, 3 * full + full / 2);
}

TEST(SelectiveRepeat, RefusesWhatItCannotDo) {
  Pair p;
  PairOptions po;
  po.selective_repeat = true;
  const QpPair q = p.connect(po);
  EXPECT_EQ(p.A().set_selective_repeat(q.a, false), EBUSY) << "past INIT: the peer already expects it";
  EXPECT_EQ(p.A().set_selective_repeat(nullptr, true), EINVAL);
  PairOptions ud;
  ud.type = IBV_QPT_UD;
  const QpPair u = p.connect(ud);
  EXPECT_EQ(p.A().set_selective_repeat(u.a, true), EOPNOTSUPP);
}

TEST(SelectiveRepeat, AReadGoesAfterTheWritesBeforeItAndBeforeTheOnesAfter) {
  // WRITE x, READ x, WRITE y over x, READ x, in one burst at 10% loss: each
  // READ sees exactly the WRITE before it (the fence keeps IBTA's order),
  // and the QP keeps selective repeat for the WRITEs.
  Pair p(9, 4u << 20);
  PairOptions po;
  po.selective_repeat = true;
  const QpPair q = p.connect(po);
  sim::Impairments imp;
  imp.loss = 0.10;
  p.wire.set_impairments(imp);
  constexpr std::uint32_t kLen = 256 * 1024;
  auto& a = p.node[0].mem;
  for (std::uint32_t i = 0; i < kLen; ++i) {
    a[i] = static_cast<std::uint8_t>(i * 7 + 1);
    a[kLen + i] = static_cast<std::uint8_t>(i * 13 + 5);
  }
  const std::uint64_t x = 1u << 20;  // on B
  Sge w1 = p.sge(0, 0, kLen), w2 = p.sge(0, kLen, kLen);
  Sge r1 = p.sge(0, 2 * kLen, kLen), r2 = p.sge(0, 3 * kLen, kLen);
  SendWr read1 = p.write_to(1, r1, x), read2 = p.write_to(1, r2, x);
  read1.opcode = read2.opcode = IBV_WR_RDMA_READ;
  for (const SendWr& w : {p.write_to(1, w1, x), read1, p.write_to(1, w2, x), read2})
    ASSERT_EQ(p.A().post_send(q.a, w), 0);
  std::vector<ibv_wc> wc;
  ASSERT_TRUE(p.wire.run_until([&] { return p.poll(0, wc) >= 0 && wc.size() >= 4; }, 5'000'000'000));
  ASSERT_EQ(wc.size(), 4u);
  for (const ibv_wc& c : wc) EXPECT_EQ(c.status, IBV_WC_SUCCESS) << c.status;
  EXPECT_EQ(wc[1].opcode, IBV_WC_RDMA_READ);
  EXPECT_EQ(0, std::memcmp(a.data() + 2 * kLen, a.data(), kLen)) << "the first READ saw the first WRITE";
  EXPECT_EQ(0, std::memcmp(a.data() + 3 * kLen, a.data() + kLen, kLen)) << "the second, the second";
  EXPECT_GT(q.a->ctr[QpCounter::retransmitted_pkts], 0u);
  EXPECT_GT(q.b->sr->ooo, 0u) << "the WRITEs still went as selective repeat";
  EXPECT_FALSE(q.a->sr->fenced && is_before(q.a->req.una, q.a->sr->fence_end));
}

TEST(SelectiveRepeat, ItsFramesAreDroppedByAGoBackNQp) {
  // A peer that did not agree: the frames are counted and dropped, never executed.
  Pair p;
  const QpPair plain = p.connect();
  Pair s;
  PairOptions po;
  po.selective_repeat = true;
  const QpPair q = s.connect(po);
  std::vector<std::vector<std::uint8_t>> frames;
  s.wire.tap = [&](wire::ConstBytes f, std::uint64_t) { frames.emplace_back(f.begin(), f.end()); };
  Sge g = s.sge(0, 0, 64);
  ASSERT_EQ(s.A().post_send(q.a, s.write_to(1, g, 4096)), 0);
  std::vector<ibv_wc> wc;
  ASSERT_TRUE(s.wire.run_until([&] { return s.poll(0, wc) > 0 || !wc.empty(); }, 10'000'000));
  ASSERT_FALSE(frames.empty());
  // The same addressing in the other pair (its QPNs match: both engines number alike).
  ASSERT_EQ(plain.b->qpn, q.b->qpn);
  const auto before = p.B().counters()[PortCounter::rx_wrong_transport];
  EXPECT_EQ(p.B().rx(frames[0], p.wire.now()), RxVerdict::kWrongTransport);
  EXPECT_EQ(p.B().counters()[PortCounter::rx_wrong_transport], before + 1);
}

/// Frames a hostile peer could send a selective-repeat QP: every SRH and
/// SACK field random (message numbers far ahead and behind, offsets past
/// the message, lengths that do not add up, PSNs anywhere around the window),
/// with valid ICRCs so they reach the QP. Nothing may crash (ASan runs
/// this), nothing outside the registered memory changes, and what is not
/// refused leaves the QP either working or in ERR with everything flushed.
TEST(SelectiveRepeat, SurvivesHostileFrames) {
  for (std::uint64_t seed = 1; seed <= 4; ++seed) {
    Pair p(seed, 1u << 20);
    PairOptions po;
    po.selective_repeat = true;
    const QpPair q = p.connect(po);
    for (int i = 0; i < 32; ++i) {
      Sge r = p.sge(1, std::uint64_t{4096} * i, 4096);
      ASSERT_EQ(p.B().post_recv(q.b, RecvWr{static_cast<std::uint64_t>(i), {&r, 1}}), 0);
    }
    std::mt19937_64 rng(seed);
    std::vector<std::uint8_t> frame(9000), payload(2048);
    for (auto& b : payload) b = static_cast<std::uint8_t>(rng());
    const std::uint8_t ops[] = {wire::op::kSrSend, wire::op::kSrWrite, wire::op::kSrAck};
    for (int i = 0; i < 5000; ++i) {
      const bool to_b = rng() % 2;  // requests at B's responder, SACKs at A's completer too
      wire::FrameSpec s;
      s.eth_src = p.node[to_b ? 0 : 1].eng->config().mac;
      s.eth_dst = p.node[to_b ? 1 : 0].eng->config().mac;
      s.src = p.node[to_b ? 0 : 1].eng->config().ip;
      s.dst = p.node[to_b ? 1 : 0].eng->config().ip;
      s.opcode = ops[rng() % 3];
      s.destqp = to_b ? q.b->qpn : q.a->qpn;
      const wire::Psn base = to_b ? q.b->resp.epsn : q.a->req.una;
      s.psn = base + static_cast<std::uint32_t>(rng() % 600) - 300;
      s.ackreq = rng() % 2;
      s.ext.reth_va = p.addr(to_b ? 1 : 0, rng() % (1u << 20)) - (rng() % 2 ? 0 : rng() % 4096);
      s.ext.reth_rkey = rng() % 4 ? p.rkey(to_b ? 1 : 0) : static_cast<std::uint32_t>(rng());
      const std::uint32_t len = static_cast<std::uint32_t>(rng() % 1100);
      s.ext.reth_len = rng() % 4 ? len : static_cast<std::uint32_t>(rng());
      s.ext.srh_msn = rng() % 4 ? static_cast<std::uint32_t>(rng() % 80) : static_cast<std::uint32_t>(rng());
      s.ext.srh_offset = rng() % 2 ? static_cast<std::uint32_t>(rng() % 8192) : static_cast<std::uint32_t>(rng());
      s.ext.srh_total = rng() % 2 ? static_cast<std::uint32_t>(rng() % 8192) : static_cast<std::uint32_t>(rng());
      s.ext.srh_flags = static_cast<std::uint8_t>(rng());
      s.ext.imm = static_cast<std::uint32_t>(rng());
      s.ext.aeth_syndrome = rng() % 4 ? 0x1f : static_cast<std::uint8_t>(rng());
      s.ext.sack_base = (base + static_cast<std::uint32_t>(rng() % 600) - 300).value();
      for (auto& w : s.ext.sack_bits) w = rng();
      const std::size_t n = wire::build_frame(
          frame, s, s.opcode == wire::op::kSrAck ? wire::ConstBytes{} : wire::ConstBytes(payload.data(), len));
      ASSERT_GT(n, 0u);
      p.node[to_b ? 1 : 0].eng->rx(wire::ConstBytes(frame.data(), n), p.wire.now());
      if (i % 50 == 0) p.wire.run_until([] { return false; }, 20'000);
    }
    p.wire.run_until([] { return false; }, 50'000'000);
    // Whatever state they are in, ERR flushes everything: every receive
    // completes exactly once.
    ibv_qp_attr err{};
    err.qp_state = IBV_QPS_ERR;
    p.B().modify_qp(q.b, err, IBV_QP_STATE);
    std::vector<ibv_wc> wc;
    for (int k = 0; k < 10; ++k) p.poll(1, wc);
    std::vector<int> seen(32, 0);
    for (const ibv_wc& c : wc)
      if (c.wr_id < 32) ++seen[c.wr_id];
    for (int i = 0; i < 32; ++i) EXPECT_EQ(seen[i], 1) << "receive " << i << ", seed " << seed;
  }
}

}  // namespace
}  // namespace uroce::testing
