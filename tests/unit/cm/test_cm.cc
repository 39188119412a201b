// The CM agent between two engines on a virtual wire: the handshake, data
// over the connected QPs, disconnect, rejects, and loss of MADs.
#include <gtest/gtest.h>

#include "stack/abi/qp_attr.h"
#include "stack/cm/agent.h"
#include "tests/support/pair.h"

namespace uroce::cm {
namespace {

using testing::Pair;
using namespace uroce::transport;

constexpr std::uint32_t kOwnerA = 7, kOwnerB = 9;
constexpr std::uint16_t kPort = 7471;

struct CmPair : ::testing::Test {
  explicit CmPair(std::uint64_t seed = 1) : p(seed) { init(); }
  void init() {
    CmConfig c;
    c.ca_guid = 0x0200000000000a01ull;
    c.seed = 11;
    a = std::make_unique<CmAgent>(p.A(), c);
    c.ca_guid = 0x0200000000000b01ull;
    c.seed = 12;
    b = std::make_unique<CmAgent>(p.B(), c);
    p.wire.next_timer = [this] {
      std::uint64_t d = 0;
      for (CmAgent* x : {a.get(), b.get()}) {
        const std::uint64_t t = x->next_deadline();
        if (t != 0 && (d == 0 || t < d)) d = t;
      }
      return d;
    };
  }
  Qp* new_qp(int side) {
    testing::Side& n = p.node[side];
    QpInitAttr ia;
    ia.send_cq = ia.recv_cq = n.cq;
    return n.eng->create_qp(n.pd, ia);
  }
  /// Runs the wire and both agents until `done` or `ns` pass.
  bool run(const std::function<bool()>& done, std::uint64_t ns = 10'000'000'000ull) {
    return p.wire.run_until(
        [&] {
          a->poll(p.wire.now());
          b->poll(p.wire.now());
          return done();
        },
        ns);
  }
  /// Waits for the owner's next event.
  bool event(CmAgent& ag, std::uint32_t owner, CmEvent& e, std::uint64_t ns = 10'000'000'000ull) {
    return run([&] { return ag.next_event(owner, e); }, ns);
  }
  /// B connects to A's listen; A accepts. Fills the QPs and ids.
  void handshake(Qp*& qa, Qp*& qb, std::uint32_t& ida, std::uint32_t& idb) {
    ASSERT_EQ(a->listen(kPort, kOwnerA), 0);
    qa = new_qp(0);
    qb = new_qp(1);
    const std::uint8_t hello[] = {'h', 'i', 0};
    ConnParams cp;
    cp.mtu = IBV_MTU_2048;
    ASSERT_EQ(b->connect(qb, p.A().config().ip, kPort, hello, kOwnerB, cp, p.wire.now(), idb), 0);
    CmEvent e;
    ASSERT_TRUE(event(*a, kOwnerA, e));
    ASSERT_EQ(e.type, CmEvent::Type::kConnectRequest);
    EXPECT_EQ(e.peer_qpn, qb->qpn);
    EXPECT_EQ(e.local_port, kPort);
    EXPECT_EQ(e.mtu, IBV_MTU_2048);
    EXPECT_EQ(e.responder_resources, 4);
    EXPECT_STREQ(reinterpret_cast<const char*>(e.private_data), "hi");
    EXPECT_TRUE(e.peer == p.B().config().ip);
    ida = e.id;
    const std::uint8_t welcome[] = {'o', 'k', 0};
    ASSERT_EQ(a->accept(ida, qa, welcome, kOwnerA, p.wire.now()), 0);
    ASSERT_TRUE(event(*b, kOwnerB, e));
    ASSERT_EQ(e.type, CmEvent::Type::kEstablished) << to_string(e.type);
    EXPECT_EQ(e.id, idb);
    EXPECT_EQ(e.peer_qpn, qa->qpn);
    EXPECT_STREQ(reinterpret_cast<const char*>(e.private_data), "ok");
    ASSERT_TRUE(event(*a, kOwnerA, e));
    ASSERT_EQ(e.type, CmEvent::Type::kEstablished);
    EXPECT_EQ(qa->state, IBV_QPS_RTS);
    EXPECT_EQ(qb->state, IBV_QPS_RTS);
  }
  /// A SEND of `len` bytes from qb to qa, checked on arrival.
  void send_and_check(Qp* qb, Qp* qa, std::uint32_t len) {
    testing::Side& na = p.node[0];
    testing::Side& nb = p.node[1];
    for (std::uint32_t i = 0; i < len; ++i) nb.mem[i] = static_cast<std::uint8_t>(i * 7 + 1);
    const Sge rs{reinterpret_cast<std::uint64_t>(na.mem.data()), len, na.mr->lkey};
    ASSERT_EQ(p.A().post_recv(qa, RecvWr{1, {&rs, 1}}), 0);
    const Sge ss{reinterpret_cast<std::uint64_t>(nb.mem.data()), len, nb.mr->lkey};
    SendWr w;
    w.wr_id = 2;
    w.send_flags = IBV_SEND_SIGNALED;
    w.sg_list = {&ss, 1};
    ASSERT_EQ(p.B().post_send(qb, w), 0);
    ibv_wc wa{}, wb{};
    ASSERT_TRUE(run([&] { return p.A().poll_cq(na.cq, {&wa, 1}) == 1; }));
    ASSERT_TRUE(run([&] { return p.B().poll_cq(nb.cq, {&wb, 1}) == 1; }));
    EXPECT_EQ(wa.status, IBV_WC_SUCCESS);
    EXPECT_EQ(wb.status, IBV_WC_SUCCESS);
    EXPECT_EQ(wa.byte_len, len);
    EXPECT_EQ(std::memcmp(na.mem.data(), nb.mem.data(), len), 0);
  }

  Pair p;
  std::unique_ptr<CmAgent> a, b;
};

TEST(CmMad, RejectsWhatIsNotACmSend) {
  Mad m = Mad::make(Attr::kReq, 1), out;
  auto bytes = [&](const Mad& x) { return reinterpret_cast<const std::uint8_t*>(&x); };
  EXPECT_EQ(parse_mad(bytes(m), kMadBytes, out), MadError::kOk);
  EXPECT_EQ(parse_mad(bytes(m), kMadBytes - 1, out), MadError::kShort);
  Mad bad = m;
  bad.hdr.mgmt_class = 0x04;  // PerfMgt
  EXPECT_EQ(parse_mad(bytes(bad), kMadBytes, out), MadError::kClass);
  bad = m;
  bad.hdr.class_version = 1;
  EXPECT_EQ(parse_mad(bytes(bad), kMadBytes, out), MadError::kClassVersion);
  bad = m;
  bad.hdr.method = 0x01;  // Get
  EXPECT_EQ(parse_mad(bytes(bad), kMadBytes, out), MadError::kMethod);
  bad = m;
  bad.hdr.attr_id.set(0x0019);  // LAP: not handled
  EXPECT_EQ(parse_mad(bytes(bad), kMadBytes, out), MadError::kAttr);
  bad = m;
  bad.hdr.base_version = 2;
  EXPECT_EQ(parse_mad(bytes(bad), kMadBytes, out), MadError::kBaseVersion);
}

TEST(CmMad, ServiceIdAndAddresses) {
  EXPECT_EQ(service_id(kPortSpaceTcp, 0x4853), 0x0000000001064853ull);
  std::uint8_t a[16];
  cma_addr(wire::IpAddr::from_v4(10, 1, 16, 62), a);
  const std::uint8_t want[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 10, 1, 16, 62};
  EXPECT_EQ(std::memcmp(a, want, 16), 0);
  EXPECT_TRUE(ip_from_cma(a, 0x40) == wire::IpAddr::from_v4(10, 1, 16, 62));
}

TEST_F(CmPair, HandshakeDataAndDisconnect) {
  Qp *qa, *qb;
  std::uint32_t ida, idb;
  handshake(qa, qb, ida, idb);
  send_and_check(qb, qa, 3000);  // MTU 2048, as negotiated: two packets
  EXPECT_EQ(qa->mtu, 2048u);
  ASSERT_EQ(b->disconnect(idb, kOwnerB, p.wire.now()), 0);
  EXPECT_EQ(qb->state, IBV_QPS_ERR);  // at once, as rdma_disconnect does
  CmEvent e;
  ASSERT_TRUE(event(*a, kOwnerA, e));
  EXPECT_EQ(e.type, CmEvent::Type::kDisconnected);
  EXPECT_EQ(e.id, ida);
  ASSERT_TRUE(event(*b, kOwnerB, e));
  EXPECT_EQ(e.type, CmEvent::Type::kDisconnected);
  EXPECT_EQ(qa->state, IBV_QPS_ERR);
  EXPECT_EQ(a->counter(CmCounter::established), 1u);
  EXPECT_EQ(b->counter(CmCounter::disconnected), 1u);
  EXPECT_EQ(a->counter(CmCounter::resends) + b->counter(CmCounter::resends), 0u);
  // Time-wait ends: nothing left.
  run([&] { return a->connections() == 0 && b->connections() == 0; });
  EXPECT_EQ(a->connections() + b->connections(), 0u);
}

/// What an application that brings its own QP up passes (the values
/// rdma_init_qp_attr reports from the event).
abi::Connect app_bring_up(const CmEvent& e, const wire::IpAddr& peer) {
  abi::Connect k;
  k.type = IBV_QPT_RC;
  k.access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  k.path_mtu = e.mtu;
  k.dest_qp_num = e.peer_qpn;
  k.rq_psn = e.rq_psn;
  k.sq_psn = e.sq_psn;
  std::memcpy(k.dgid.raw, peer.b.data(), 16);
  k.hop_limit = 64;
  k.min_rnr_timer = 12;
  k.timeout = e.ack_timeout;
  k.retry_cnt = e.retry_cnt;
  k.rnr_retry = e.rnr_retry;
  k.max_rd_atomic = e.max_rd_atomic;
  k.max_dest_rd_atomic = e.max_dest_rd_atomic;
  return k;
}

// rdma_cm's RDMA_OPTION_ID_ACK_TIMEOUT: the active side's QP gets the
// timeout its connect asks for, and the REQ carries it; the passive side's
// takes the request's, or its own accept's.
TEST_F(CmPair, AckTimeoutsAsConnectAndAcceptAskForThem) {
  ASSERT_EQ(a->listen(kPort, kOwnerA), 0);
  for (const int accept_timeout : {-1, 21}) {
    SCOPED_TRACE("accept's ack timeout " + std::to_string(accept_timeout));
    Qp* qa = new_qp(0);
    Qp* qb = new_qp(1);
    ConnParams cp;
    cp.ack_timeout = 18;
    std::uint32_t idb = 0;
    ASSERT_EQ(b->connect(qb, p.A().config().ip, kPort, {}, kOwnerB, cp, p.wire.now(), idb), 0);
    CmEvent e;
    ASSERT_TRUE(event(*a, kOwnerA, e));
    ASSERT_EQ(e.type, CmEvent::Type::kConnectRequest);
    EXPECT_EQ(a->accept(e.id, qa, {}, kOwnerA, p.wire.now(), false, 32), EINVAL) << "0..31 only";
    ASSERT_EQ(a->accept(e.id, qa, {}, kOwnerA, p.wire.now(), false, accept_timeout), 0);
    ASSERT_TRUE(event(*b, kOwnerB, e));
    ASSERT_EQ(e.type, CmEvent::Type::kEstablished);
    ASSERT_TRUE(event(*a, kOwnerA, e));
    ASSERT_EQ(e.type, CmEvent::Type::kEstablished);
    EXPECT_EQ(qb->timeout, 18);
    EXPECT_EQ(qa->timeout, accept_timeout < 0 ? 18 : accept_timeout);
  }
}

TEST_F(CmPair, ApplicationQpsAreLeftToTheApplication) {
  // rdma_cm's ids without a QP: the agent only talks; each side brings its
  // own QP up with the event's values; the REP is a connect response and
  // the RTU waits for establish().
  ASSERT_EQ(a->listen(kPort, kOwnerA), 0);
  Qp* qa = new_qp(0);
  Qp* qb = new_qp(1);
  ConnParams cp;
  cp.mtu = IBV_MTU_2048;
  cp.initiator_depth = 2;
  cp.responder_resources = 3;
  std::uint32_t idb = 0;
  ASSERT_EQ(b->connect(qb, p.A().config().ip, kPort, {}, kOwnerB, cp, p.wire.now(), idb, true), 0);
  EXPECT_EQ(qb->state, IBV_QPS_RESET);  // not even INIT: the application's
  CmEvent req;
  ASSERT_TRUE(event(*a, kOwnerA, req));
  ASSERT_EQ(req.type, CmEvent::Type::kConnectRequest);
  EXPECT_EQ(req.max_rd_atomic, 3);       // what B accepts
  EXPECT_EQ(req.max_dest_rd_atomic, 2);  // what B issues
  // Accepting a QP that is in ERR is refused; a QP the app brought up is not.
  Qp* broken = new_qp(0);
  ibv_qp_attr err{};
  err.qp_state = IBV_QPS_ERR;
  ASSERT_EQ(p.A().modify_qp(broken, err, IBV_QP_STATE).err, 0);
  EXPECT_EQ(a->accept(req.id, broken, {}, kOwnerA, p.wire.now(), true), EINVAL);
  ASSERT_EQ(p.A().bring_up(qa, app_bring_up(req, req.peer)).err, 0);
  ASSERT_EQ(a->accept(req.id, qa, {}, kOwnerA, p.wire.now(), true), 0);
  CmEvent rep;
  ASSERT_TRUE(event(*b, kOwnerB, rep));
  ASSERT_EQ(rep.type, CmEvent::Type::kConnectResponse) << to_string(rep.type);
  EXPECT_EQ(rep.id, idb);
  EXPECT_EQ(rep.peer_qpn, qa->qpn);
  EXPECT_EQ(qb->state, IBV_QPS_RESET);
  // Each side sends from where the other receives.
  EXPECT_EQ(rep.sq_psn, req.rq_psn);
  EXPECT_EQ(req.sq_psn, rep.rq_psn);
  EXPECT_EQ(rep.max_rd_atomic, 2);
  EXPECT_EQ(rep.max_dest_rd_atomic, 3);
  // A resent REP before establish is a duplicate, not a second event.
  CmEvent none;
  EXPECT_FALSE(event(*b, kOwnerB, none, 2'000'000'000ull));
  EXPECT_FALSE(event(*a, kOwnerA, none, 1'000'000));  // no RTU yet
  EXPECT_GT(b->counter(CmCounter::duplicates), 0u);
  ASSERT_EQ(p.B().bring_up(qb, app_bring_up(rep, p.A().config().ip)).err, 0);
  ASSERT_EQ(b->establish(idb, kOwnerB, p.wire.now()), 0);
  EXPECT_EQ(b->establish(idb, kOwnerB, p.wire.now()), EINVAL);  // once
  CmEvent est;
  ASSERT_TRUE(event(*a, kOwnerA, est));
  EXPECT_EQ(est.type, CmEvent::Type::kEstablished);
  EXPECT_EQ(qa->mtu, 2048u);
  send_and_check(qb, qa, 5000);
  send_and_check(qb, qa, 1);
  // Disconnect leaves the QPs to their applications too.
  ASSERT_EQ(b->disconnect(idb, kOwnerB, p.wire.now()), 0);
  EXPECT_EQ(qb->state, IBV_QPS_RTS);
  ASSERT_TRUE(event(*a, kOwnerA, est));
  EXPECT_EQ(est.type, CmEvent::Type::kDisconnected);
  EXPECT_EQ(qa->state, IBV_QPS_RTS);
  EXPECT_EQ(a->counter(CmCounter::established) + b->counter(CmCounter::established), 2u);
}

TEST_F(CmPair, EstablishWantsAnApplicationQpsConnectResponse) {
  Qp *qa, *qb;
  std::uint32_t ida, idb;
  handshake(qa, qb, ida, idb);  // the agent's own bring-up: nothing to establish
  EXPECT_EQ(b->establish(idb, kOwnerB, p.wire.now()), EINVAL);
  EXPECT_EQ(a->establish(ida, kOwnerA, p.wire.now()), EINVAL);
  EXPECT_EQ(b->establish(12345, kOwnerB, p.wire.now()), EINVAL);
}

TEST_F(CmPair, SidrResolvesAUdQpAndItsQkey) {
  // rdma_cm's RDMA_PS_UDP: SIDR_REQ names the service, SIDR_REP the QP and
  // its Q_Key; a datagram then goes where the answer said.
  testing::PairOptions o;
  o.type = IBV_QPT_UD;
  o.qkey = 0x01234567;
  const testing::QpPair q = p.connect(o);
  ASSERT_EQ(a->listen(kPort, kOwnerA), 0);  // RC: not what a SIDR asks for
  std::uint32_t idb = 0;
  ASSERT_EQ(b->connect(q.b, p.A().config().ip, kPort, {}, kOwnerB, {}, p.wire.now(), idb), 0);
  CmEvent e;
  ASSERT_TRUE(event(*b, kOwnerB, e));
  EXPECT_EQ(e.type, CmEvent::Type::kUnreachable);
  EXPECT_EQ(e.reason, kSidrNoService);
  ASSERT_EQ(a->listen(kPort, kOwnerA, true), 0);
  EXPECT_EQ(a->listen(kPort, kOwnerA, true), EADDRINUSE);
  const std::uint8_t hello[] = {'u', 'd', 0};
  ASSERT_EQ(b->connect(q.b, p.A().config().ip, kPort, hello, kOwnerB, {}, p.wire.now(), idb), 0);
  ASSERT_TRUE(event(*a, kOwnerA, e));
  ASSERT_EQ(e.type, CmEvent::Type::kConnectRequest);
  EXPECT_TRUE(e.ud);
  EXPECT_EQ(e.local_port, kPort);
  EXPECT_STREQ(reinterpret_cast<const char*>(e.private_data), "ud");
  EXPECT_TRUE(e.peer == p.B().config().ip);
  Qp* rc = new_qp(0);
  EXPECT_EQ(a->accept(e.id, rc, {}, kOwnerA, p.wire.now()), EINVAL);  // a SIDR is answered with a UD QP
  const std::uint8_t welcome[] = {'o', 'k', 0};
  ASSERT_EQ(a->accept(e.id, q.a, welcome, kOwnerA, p.wire.now()), 0);
  EXPECT_EQ(a->accept(e.id, q.a, welcome, kOwnerA, p.wire.now()), EINVAL);  // once
  ASSERT_TRUE(event(*b, kOwnerB, e));
  ASSERT_EQ(e.type, CmEvent::Type::kEstablished) << to_string(e.type);
  EXPECT_TRUE(e.ud);
  EXPECT_EQ(e.id, idb);
  EXPECT_EQ(e.peer_qpn, q.a->qpn);
  EXPECT_EQ(e.qkey, 0x01234567u);
  EXPECT_STREQ(reinterpret_cast<const char*>(e.private_data), "ok");
  EXPECT_EQ(b->connections(), 0u);  // nothing to keep on the asking side
  // The datagram, to what the answer named.
  testing::Side& na = p.node[0];
  testing::Side& nb = p.node[1];
  for (int i = 0; i < 300; ++i) nb.mem[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(i * 3);
  const Sge rs{reinterpret_cast<std::uint64_t>(na.mem.data()), 300 + 40, na.mr->lkey};
  ASSERT_EQ(p.A().post_recv(q.a, RecvWr{1, {&rs, 1}}), 0);
  Ah ah;
  ah.dgid = p.A().config().ip;
  ah.dmac = p.A().config().mac;
  const Sge ss{reinterpret_cast<std::uint64_t>(nb.mem.data()), 300, nb.mr->lkey};
  SendWr w;
  w.wr_id = 2;
  w.sg_list = {&ss, 1};
  w.ah = &ah;
  w.remote_qpn = e.peer_qpn;
  w.remote_qkey = e.qkey;
  ASSERT_EQ(p.B().post_send(q.b, w), 0);
  ibv_wc wa{};
  ASSERT_TRUE(run([&] { return p.A().poll_cq(na.cq, {&wa, 1}) == 1; }));
  EXPECT_EQ(wa.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wa.byte_len, 300u + 40u);
  EXPECT_EQ(std::memcmp(na.mem.data() + 40, nb.mem.data(), 300), 0);
  // A request the service rejects: UNREACHABLE with SIDR status 2 and the
  // private data.
  ASSERT_EQ(b->connect(q.b, p.A().config().ip, kPort, {}, kOwnerB, {}, p.wire.now(), idb), 0);
  ASSERT_TRUE(event(*a, kOwnerA, e));
  const std::uint8_t no[] = {'n', 'o', 0};
  ASSERT_EQ(a->reject(e.id, no, kOwnerA, p.wire.now()), 0);
  ASSERT_TRUE(event(*b, kOwnerB, e));
  EXPECT_EQ(e.type, CmEvent::Type::kUnreachable);
  EXPECT_EQ(e.reason, kSidrRejected);
  EXPECT_STREQ(reinterpret_cast<const char*>(e.private_data), "no");
  EXPECT_EQ(a->unlisten(kPort, kOwnerA, true), 0);
  EXPECT_EQ(a->unlisten(kPort, kOwnerA), 0);
}

TEST(CmLoss, SidrSurvivesLoss) {
  // MADs lost and duplicated: the request is resent, and a resent request
  // whose answer was lost is answered again, never offered twice.
  std::uint64_t resends = 0, dups = 0;
  for (std::uint64_t seed = 1; seed <= 12; ++seed) {
    struct P : CmPair {
      explicit P(std::uint64_t s) : CmPair(s) {}
      void TestBody() override {}
    } t(seed);
    testing::PairOptions o;
    o.type = IBV_QPT_UD;
    o.qkey = 0x01234567;
    const testing::QpPair q = t.p.connect(o);
    sim::Impairments imp;
    imp.loss = 0.3;
    imp.dup = 0.2;
    imp.filter = [](const TxFrame& f) { return f.qpn == transport::kGsiQpn; };  // MADs only
    t.p.wire.set_impairments(imp);
    ASSERT_EQ(t.a->listen(kPort, kOwnerA, true), 0);
    std::uint32_t idb = 0;
    ASSERT_EQ(t.b->connect(q.b, t.p.A().config().ip, kPort, {}, kOwnerB, {}, t.p.wire.now(), idb), 0);
    CmEvent e;
    ASSERT_TRUE(t.event(*t.a, kOwnerA, e)) << "seed " << seed;
    ASSERT_EQ(e.type, CmEvent::Type::kConnectRequest);
    ASSERT_EQ(t.a->accept(e.id, q.a, {}, kOwnerA, t.p.wire.now()), 0);
    ASSERT_TRUE(t.event(*t.b, kOwnerB, e)) << "seed " << seed;
    EXPECT_EQ(e.type, CmEvent::Type::kEstablished) << "seed " << seed;
    EXPECT_EQ(e.peer_qpn, q.a->qpn);
    CmEvent extra;
    EXPECT_FALSE(t.event(*t.a, kOwnerA, extra, 3'000'000'000ull)) << "a second request, seed " << seed;
    EXPECT_FALSE(t.event(*t.b, kOwnerB, extra, 1'000'000ull)) << "a second answer, seed " << seed;
    resends += t.b->counter(CmCounter::resends);
    dups += t.a->counter(CmCounter::duplicates) + t.b->counter(CmCounter::duplicates);
  }
  EXPECT_GT(resends, 0u);
  EXPECT_GT(dups, 0u);
}

TEST_F(CmPair, NoListenerIsRejectedWithInvalidServiceId) {
  Qp* qb = new_qp(1);
  std::uint32_t id;
  ASSERT_EQ(b->connect(qb, p.A().config().ip, 9999, {}, kOwnerB, {}, p.wire.now(), id), 0);
  CmEvent e;
  ASSERT_TRUE(event(*b, kOwnerB, e));
  EXPECT_EQ(e.type, CmEvent::Type::kRejected);
  EXPECT_EQ(e.reason, kRejInvalidServiceId);
  EXPECT_EQ(a->counter(CmCounter::rejects_sent), 1u);
}

// The hook a daemon rings a session's CM channel from: once per queued
// event, after it is queued (the hook can take it), naming its owner.
TEST_F(CmPair, TheEventHookFiresOncePerQueuedEventForItsOwner) {
  struct Seen {
    CmAgent* agent = nullptr;
    std::vector<std::uint32_t> owners;
    std::vector<CmEvent> taken;  // what the hook found queued when it ran
  } seen_a, seen_b;
  auto hook = [](void* ctx, std::uint32_t owner) {
    auto* s = static_cast<Seen*>(ctx);
    s->owners.push_back(owner);
    CmEvent e;
    if (s->agent->next_event(owner, e)) s->taken.push_back(e);
  };
  seen_a.agent = a.get();
  seen_b.agent = b.get();
  a->set_event_hook(hook, &seen_a);
  b->set_event_hook(hook, &seen_b);
  ASSERT_EQ(a->listen(kPort, kOwnerA), 0);
  Qp* qa = new_qp(0);
  Qp* qb = new_qp(1);
  std::uint32_t idb;
  ASSERT_EQ(b->connect(qb, p.A().config().ip, kPort, {}, kOwnerB, {}, p.wire.now(), idb), 0);
  ASSERT_TRUE(run([&] { return seen_a.owners.size() == 1; }));
  ASSERT_EQ(seen_a.taken.size(), 1u);
  EXPECT_EQ(seen_a.owners[0], kOwnerA);
  EXPECT_EQ(seen_a.taken[0].type, CmEvent::Type::kConnectRequest);
  EXPECT_TRUE(seen_b.owners.empty());
  ASSERT_EQ(a->accept(seen_a.taken[0].id, qa, {}, kOwnerA, p.wire.now()), 0);
  ASSERT_TRUE(run([&] { return seen_a.owners.size() == 2 && seen_b.owners.size() == 1; }));
  ASSERT_EQ(seen_b.taken.size(), 1u);
  EXPECT_EQ(seen_b.owners[0], kOwnerB);
  EXPECT_EQ(seen_b.taken[0].type, CmEvent::Type::kEstablished);
  EXPECT_EQ(seen_b.taken[0].id, idb);
  ASSERT_EQ(seen_a.taken.size(), 2u);
  EXPECT_EQ(seen_a.taken[1].type, CmEvent::Type::kEstablished);
  // Nothing else fires, and nothing is left behind.
  run([] { return false; }, 50'000'000);
  EXPECT_EQ(seen_a.owners.size(), 2u);
  EXPECT_EQ(seen_b.owners.size(), 1u);
  CmEvent e;
  EXPECT_FALSE(a->next_event(kOwnerA, e));
  EXPECT_FALSE(b->next_event(kOwnerB, e));
}

TEST_F(CmPair, UnlistenFreesThePortForItsOwnerOnly) {
  ASSERT_EQ(a->listen(kPort, kOwnerA), 0);
  EXPECT_EQ(a->unlisten(kPort, kOwnerB), EINVAL);  // not B's
  EXPECT_EQ(a->listen(kPort, kOwnerB), EADDRINUSE);
  EXPECT_EQ(a->unlisten(kPort, kOwnerA), 0);
  EXPECT_EQ(a->listen(kPort, kOwnerB), 0);  // free again
  // A request now goes to B's listen.
  Qp* qb = new_qp(1);
  std::uint32_t id;
  ASSERT_EQ(b->connect(qb, p.A().config().ip, kPort, {}, kOwnerB + 7, {}, p.wire.now(), id), 0);
  CmEvent e;
  ASSERT_TRUE(event(*a, kOwnerB, e));
  EXPECT_EQ(e.type, CmEvent::Type::kConnectRequest);
}

TEST_F(CmPair, ApplicationRejectCarriesPrivateData) {
  ASSERT_EQ(a->listen(kPort, kOwnerA), 0);
  EXPECT_EQ(a->listen(kPort, kOwnerB), EADDRINUSE);
  Qp* qb = new_qp(1);
  std::uint32_t id;
  ASSERT_EQ(b->connect(qb, p.A().config().ip, kPort, {}, kOwnerB, {}, p.wire.now(), id), 0);
  CmEvent e;
  ASSERT_TRUE(event(*a, kOwnerA, e));
  EXPECT_EQ(a->accept(e.id, new_qp(0), {}, kOwnerB, p.wire.now()), EINVAL);  // not the listener's owner
  const std::uint8_t why[] = {'f', 'u', 'l', 'l', 0};
  ASSERT_EQ(a->reject(e.id, why, kOwnerA, p.wire.now()), 0);
  ASSERT_TRUE(event(*b, kOwnerB, e));
  EXPECT_EQ(e.type, CmEvent::Type::kRejected);
  EXPECT_EQ(e.reason, kRejConsumer);
  EXPECT_STREQ(reinterpret_cast<const char*>(e.private_data), "full");
  EXPECT_EQ(b->connections(), 0u);
}

TEST_F(CmPair, BadRequestsAreRefused) {
  Qp* qb = new_qp(1);
  std::uint32_t id;
  std::uint8_t big[57] = {};
  EXPECT_EQ(b->connect(qb, p.A().config().ip, kPort, big, kOwnerB, {}, p.wire.now(), id), EINVAL);
  EXPECT_EQ(b->connect(nullptr, p.A().config().ip, kPort, {}, kOwnerB, {}, p.wire.now(), id), EINVAL);
  EXPECT_EQ(b->disconnect(12345, kOwnerB, p.wire.now()), EINVAL);
  EXPECT_EQ(b->accept(12345, qb, {}, kOwnerB, p.wire.now()), EINVAL);
  EXPECT_EQ(b->listen(1, 0), EINVAL);
  Qp* ud = nullptr;
  {
    QpInitAttr ia;
    ia.qp_type = IBV_QPT_UD;
    ia.send_cq = ia.recv_cq = p.node[1].cq;
    ud = p.B().create_qp(p.node[1].pd, ia);
  }
  // UD asks by SIDR; UC has no CM. An application-moved QP only lends its
  // number to an RC REQ, and librdmacm's kernel does not look at its type:
  // UCX names a UD QP it never uses, to reserve a number.
  EXPECT_EQ(b->connect(ud, p.A().config().ip, kPort, {}, kOwnerB, {}, p.wire.now(), id, true), 0);
  std::uint8_t too_big[181] = {};
  EXPECT_EQ(b->connect(ud, p.A().config().ip, kPort, too_big, kOwnerB, {}, p.wire.now(), id), EINVAL);
  {
    QpInitAttr ia;
    ia.qp_type = IBV_QPT_UC;
    ia.send_cq = ia.recv_cq = p.node[1].cq;
    Qp* uc = p.B().create_qp(p.node[1].pd, ia);
    EXPECT_EQ(b->connect(uc, p.A().config().ip, kPort, {}, kOwnerB, {}, p.wire.now(), id), EINVAL);
  }
  QpInitAttr gsi;
  gsi.qp_type = IBV_QPT_UD;
  gsi.gsi = true;
  gsi.send_cq = gsi.recv_cq = p.node[1].cq;
  EXPECT_EQ(p.B().create_qp(p.node[1].pd, gsi), nullptr);  // QP1 is the agent's
  EXPECT_EQ(p.B().find_qp(transport::kGsiQpn)->qkey, transport::kGsiQkey);
}

TEST_F(CmPair, ServerDisconnectsFirst) {
  Qp *qa, *qb;
  std::uint32_t ida, idb;
  handshake(qa, qb, ida, idb);
  ASSERT_EQ(a->disconnect(ida, kOwnerA, p.wire.now()), 0);
  CmEvent e;
  ASSERT_TRUE(event(*b, kOwnerB, e));
  EXPECT_EQ(e.type, CmEvent::Type::kDisconnected);
  ASSERT_TRUE(event(*a, kOwnerA, e));
  EXPECT_EQ(e.type, CmEvent::Type::kDisconnected);
}

TEST_F(CmPair, AnOwnerThatGoesAwayDisconnectsItsPeers) {
  Qp *qa, *qb;
  std::uint32_t ida, idb;
  handshake(qa, qb, ida, idb);
  a->drop_owner(kOwnerA, p.wire.now());
  CmEvent e;
  ASSERT_TRUE(event(*b, kOwnerB, e));
  EXPECT_EQ(e.type, CmEvent::Type::kDisconnected);
  EXPECT_FALSE(a->next_event(kOwnerA, e));
  EXPECT_EQ(a->listen(kPort, kOwnerB), 0);  // its listen is gone too
}

TEST_F(CmPair, AReplyForADestroyedQpDoesNotBringUpTheQpThatTookItsNumber) {
  // B connects, then destroys its QP (still in INIT, so its number is free
  // at once) and makes another, which gets the same QPN. A's REP names the
  // old connection: it must not bring the new QP up.
  ASSERT_EQ(a->listen(kPort, kOwnerA), 0);
  Qp* qb = new_qp(1);
  const std::uint32_t qpn = qb->qpn;
  std::uint32_t idb = 0;
  ASSERT_EQ(b->connect(qb, p.A().config().ip, kPort, {}, kOwnerB, ConnParams{}, p.wire.now(), idb), 0);
  CmEvent e;
  ASSERT_TRUE(event(*a, kOwnerA, e));
  ASSERT_EQ(e.type, CmEvent::Type::kConnectRequest);
  ASSERT_EQ(p.B().destroy_qp(qb), 0);
  Qp* other = new_qp(1);
  ASSERT_NE(other, nullptr);
  ASSERT_EQ(other->qpn, qpn) << "the test needs the number reused";
  Qp* qa = new_qp(0);
  ASSERT_EQ(a->accept(e.id, qa, {}, kOwnerA, p.wire.now()), 0);
  run([&] { return false; }, 50'000'000);
  EXPECT_EQ(other->state, IBV_QPS_RESET) << "another QP was connected by a reply that was not its own";
}

TEST_F(CmPair, UnansweredRequestIsResentThenUnreachable) {
  Qp* qb = new_qp(1);
  std::uint32_t id;
  // Nobody at this address answers (its MAC is known, the frames go nowhere).
  const auto ghost = wire::IpAddr::from_v4(10, 0, 0, 99);
  p.B().set_neighbor(ghost, {0x02, 0, 0, 0, 0, 0x99});
  ASSERT_EQ(b->connect(qb, ghost, kPort, {}, kOwnerB, {}, p.wire.now(), id), 0);
  CmEvent e;
  ASSERT_TRUE(event(*b, kOwnerB, e, 20'000'000'000ull));
  EXPECT_EQ(e.type, CmEvent::Type::kUnreachable);
  EXPECT_EQ(e.reason, kRejTimeout);
  EXPECT_EQ(b->counter(CmCounter::resends), 7u);  // 8 sends in all
}

// MADs lost at random: every handshake and disconnect still completes, by resends.
TEST(CmLoss, HandshakesSurviveLoss) {
  std::uint64_t resends = 0;
  for (std::uint64_t seed = 1; seed <= 8; ++seed) {
    struct P : CmPair {
      explicit P(std::uint64_t s) : CmPair(s) {}
      void TestBody() override {}
    } t(seed);
    sim::Impairments imp;
    imp.loss = 0.3;
    imp.dup = 0.2;
    imp.filter = [](const TxFrame& f) { return f.qpn == transport::kGsiQpn; };  // MADs only
    t.p.wire.set_impairments(imp);
    Qp *qa, *qb;
    std::uint32_t ida, idb;
    t.handshake(qa, qb, ida, idb);
    if (::testing::Test::HasFatalFailure()) return;
    ASSERT_EQ(t.b->disconnect(idb, kOwnerB, t.p.wire.now()), 0);
    CmEvent e;
    ASSERT_TRUE(t.event(*t.a, kOwnerA, e)) << "seed " << seed;
    EXPECT_EQ(e.type, CmEvent::Type::kDisconnected);
    ASSERT_TRUE(t.event(*t.b, kOwnerB, e)) << "seed " << seed;
    EXPECT_EQ(e.type, CmEvent::Type::kDisconnected);
    resends += t.a->counter(CmCounter::resends) + t.b->counter(CmCounter::resends);
  }
  EXPECT_GT(resends, 0u) << "30% loss and not one resend: the loss did not reach the MADs";
}

}  // namespace
}  // namespace uroce::cm
