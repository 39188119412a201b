// Replays the RDMA CM handshakes that Linux rxe made in ../shared/captures
// against our agent, one side at a time, on a virtual clock:
//  - passive: the captured active side's REQ, RTU, DREQ go into our engine;
//    our REP and DREP must equal the captured ones;
//  - active: we connect with the captured REQ's parameters; the captured
//    REP and DREP go in; our REQ, RTU and DREQ must equal the captured ones.
// "Equal" is byte for byte over the whole 256-byte MAD, except the fields a
// side chooses for itself that we cannot pin: our QP number (and, in a REQ,
// the flow label). Comm IDs, transaction ID, PSN, CA GUID and the RDMA CM
// source port are pinned to the captured values, so they are compared too.
// The frames we send must also carry what the captured ones do on the wire:
// UD SEND only to QP1 from QP1, Q_Key 0x80010000, P_Key 0xffff, a valid ICRC.
#include <gtest/gtest.h>

#include <map>
#include <optional>

#include "drivers/pcap/pcap_io.h"
#include "stack/cm/agent.h"
#include "stack/wire/parser.h"

namespace uroce::cm {
namespace {

using transport::Engine;
using transport::Qp;

struct CapMad {
  std::vector<std::uint8_t> frame;
  wire::IpAddr src, dst;
  wire::MacAddr smac, dmac;
  std::uint16_t pkey;
  Mad mad;
  std::size_t index;
};

std::vector<CapMad> load(const std::string& path) {
  std::vector<CapMad> out;
  pcapio::Reader r;
  if (!r.open(path)) return out;
  pcapio::Frame f;
  std::size_t i = 0;
  while (r.next(f)) {
    ++i;
    wire::Packet p;
    if (!wire::parse_frame(f.data, wire::ParseOptions{}, p).ok() || p.destqp != transport::kGsiQpn) continue;
    CapMad m;
    if (parse_mad(p.payload().data(), p.payload().size(), m.mad) != MadError::kOk) continue;
    m.frame.assign(f.data.begin(), f.data.end());
    m.src = p.src;
    m.dst = p.dst;
    m.smac = p.eth_src;
    m.dmac = p.eth_dst;
    m.pkey = p.pkey;
    m.index = i;
    out.push_back(m);
  }
  return out;
}

/// The PSN of the first request (SEND, WRITE, READ, atomic) that src sent to
/// QP dest_qpn after the handshake: where that side's send queue started.
std::optional<std::uint32_t> first_request_psn(const std::string& path, const wire::IpAddr& src,
                                               std::uint32_t dest_qpn) {
  pcapio::Reader r;
  if (!r.open(path)) return std::nullopt;
  pcapio::Frame f;
  while (r.next(f)) {
    wire::Packet p;
    if (!wire::parse_frame(f.data, wire::ParseOptions{}, p).ok()) continue;
    if (p.src == src && p.destqp == dest_qpn && p.info->has(wire::kOpRequest)) return p.psn.value();
  }
  return std::nullopt;
}

/// Byte offsets (into the MAD) that a side picks for itself.
bool masked(Attr a, std::size_t off) {
  constexpr std::size_t d = sizeof(MadHdr);
  if (a == Attr::kReq) return (off >= d + 32 && off < d + 35) || (off >= d + 88 && off < d + 92);  // QPN, flow label
  if (a == Attr::kRep) return off >= d + 12 && off < d + 15;                                       // QPN
  return false;
}

std::string diff(const Mad& ours, const Mad& theirs) {
  const auto* x = reinterpret_cast<const std::uint8_t*>(&ours);
  const auto* y = reinterpret_cast<const std::uint8_t*>(&theirs);
  std::string d;
  for (std::size_t i = 0; i < kMadBytes; ++i)
    if (x[i] != y[i] && !masked(theirs.attr(), i)) {
      char b[48];
      std::snprintf(b, sizeof b, " [%zu] ours %02x theirs %02x", i, x[i], y[i]);
      d += b;
    }
  return d;
}

/// One side of a captured conversation, replayed.
struct Side {
  Side(const wire::IpAddr& ip, const wire::MacAddr& mac, std::uint64_t guid) {
    transport::EngineConfig c;
    c.ip = ip;
    c.mac = mac;
    eng = std::make_unique<Engine>(c);
    CmConfig cc;
    cc.ca_guid = guid;
    agent = std::make_unique<CmAgent>(*eng, cc);
    pd = eng->alloc_pd();
    cq = eng->create_cq(64);
    transport::QpInitAttr ia;
    ia.send_cq = ia.recv_cq = cq;
    qp = eng->create_qp(pd, ia);
  }
  void rx(const CapMad& m) {
    eng->rx(m.frame, now);
    step();
  }
  void step() {
    agent->poll(now);
    eng->poll(now);
    now += 1000;
  }
  /// The MADs our engine sent since the last call.
  std::vector<std::pair<wire::Packet, Mad>> sent() {
    std::vector<std::pair<wire::Packet, Mad>> out;
    step();
    eng->drain_tx([&](const transport::TxFrame& f) {
      auto buf = std::make_shared<std::vector<std::uint8_t>>(f.size());
      f.copy_to(*buf);
      keep.push_back(buf);
      wire::Packet p;
      Mad m;
      if (wire::parse_frame(*buf, wire::ParseOptions{}, p).ok() &&
          parse_mad(p.payload().data(), p.payload().size(), m) == MadError::kOk)
        out.emplace_back(p, m);
      else
        ADD_FAILURE() << "we sent a frame that is not a valid CM MAD (ICRC or header)";
    });
    return out;
  }
  std::unique_ptr<Engine> eng;
  std::unique_ptr<CmAgent> agent;
  transport::Pd* pd;
  transport::Cq* cq;
  Qp* qp;
  std::uint64_t now = 1'000'000;
  std::vector<std::shared_ptr<std::vector<std::uint8_t>>> keep;
};

/// After the handshake, our QP must start where the captured side did: its
/// send PSN at that side's first request, its receive PSN at the peer's.
void expect_psns(Side& s, const std::string& file, const wire::IpAddr& us, const wire::IpAddr& peer,
                 std::uint32_t our_qpn_in_capture, std::uint32_t peer_qpn, const std::string& where) {
  ibv_qp_attr a{};
  ASSERT_EQ(s.eng->query_qp(s.qp, a), 0);
  const std::string path = std::string(UROCE_CAPTURES_DIR) + "/" + file;
  if (auto sent = first_request_psn(path, us, peer_qpn)) {
    EXPECT_EQ(a.sq_psn, *sent) << where << ": our first request PSN differs from the captured side's";
  }
  if (auto got = first_request_psn(path, peer, our_qpn_in_capture)) {
    EXPECT_EQ(a.rq_psn, *got) << where << ": we would not accept the peer's first request";
  }
}

/// A DREQ or DREP from the peer: one kDisconnected event (the first time),
/// and the QP in ERR.
void expect_disconnected(Side& s, bool& disconnected, const std::string& at) {
  CmEvent e;
  if (!disconnected) {
    ASSERT_TRUE(s.agent->next_event(1, e)) << at;
    EXPECT_EQ(e.type, CmEvent::Type::kDisconnected) << at;
    disconnected = true;
  }
  EXPECT_EQ(s.qp->state, IBV_QPS_ERR) << at;
}

void expect_same(Side& s, const CapMad& want, const std::string& where) {
  auto got = s.sent();
  ASSERT_EQ(got.size(), 1u) << where << ": expected our " << to_string(want.mad.attr()) << " (capture frame "
                            << want.index << ")";
  const auto& [p, m] = got[0];
  EXPECT_EQ(m.attr(), want.mad.attr()) << where;
  EXPECT_EQ(diff(m, want.mad), "") << where << ": our " << to_string(m.attr()) << " differs from capture frame "
                                   << want.index;
  EXPECT_EQ(p.opcode, wire::op::kUdSendOnly) << where;
  EXPECT_EQ(p.destqp, transport::kGsiQpn) << where;
  EXPECT_EQ(p.deth()->src_qp.get(), transport::kGsiQpn) << where;
  EXPECT_EQ(p.deth()->qkey.get(), transport::kGsiQkey) << where;
  EXPECT_EQ(p.pkey, want.pkey) << where;
  EXPECT_TRUE(p.src == want.src && p.dst == want.dst) << where;
}

struct Conversation {
  std::vector<CapMad> mads;
  [[nodiscard]] const CapMad* first(Attr a) const {
    for (const CapMad& m : mads)
      if (m.mad.attr() == a) return &m;
    return nullptr;
  }
};

/// Groups a capture's CM MADs by connection: a REQ opens one (its local
/// comm ID), the REP names the other side's; later MADs carry both IDs.
std::vector<Conversation> conversations(const std::string& file) {
  struct Ids {
    std::uint32_t active = 0, passive = 0;
  };
  std::vector<Conversation> out;
  std::vector<Ids> ids;
  for (CapMad& m : load(std::string(UROCE_CAPTURES_DIR) + "/" + file)) {
    const auto& r = m.mad.as<Rtu>();  // every CM message starts with local, remote comm ID
    const std::uint32_t local = r.local_comm_id.get(), remote = r.remote_comm_id.get();
    if (m.mad.attr() == Attr::kReq) {
      ids.push_back({local, 0});
      out.emplace_back();
      out.back().mads.push_back(std::move(m));
      continue;
    }
    for (std::size_t i = 0; i < ids.size(); ++i) {
      const bool rep = m.mad.attr() == Attr::kRep && ids[i].active == remote && ids[i].passive == 0;
      const bool pair = (ids[i].active == local && ids[i].passive == remote) ||
                        (ids[i].active == remote && ids[i].passive == local);
      if (rep) ids[i].passive = local;
      if (rep || pair) {
        out[i].mads.push_back(std::move(m));
        break;
      }
    }
  }
  return out;
}

/// The MADs in the order one side saw cause and effect: a DREQ of ours that
/// the capture shows right after the peer's DREQ crossed it on the wire (it
/// was sent before theirs arrived), so it goes first.
std::vector<CapMad> causal(std::vector<CapMad> mads, const wire::IpAddr& us) {
  for (std::size_t i = 1; i < mads.size(); ++i)
    if (mads[i].mad.attr() == Attr::kDreq && mads[i - 1].mad.attr() == Attr::kDreq && mads[i].src == us &&
        !(mads[i - 1].src == us))
      std::swap(mads[i], mads[i - 1]);
  return mads;
}

void replay_passive(const Conversation& c, const std::string& file, const std::string& where) {
  const CapMad* req = c.first(Attr::kReq);
  const CapMad* rep = c.first(Attr::kRep);
  ASSERT_TRUE(req && rep) << where;
  const Req& rq = req->mad.as<Req>();
  const Rep& rp = rep->mad.as<Rep>();
  Side s(req->dst, req->dmac, rp.local_ca_guid.get());
  s.agent->next_comm_id = [&] { return rp.local_comm_id.get(); };
  s.agent->next_psn = [&] { return rp.starting_psn.get(); };
  std::uint64_t dreq_tid = 0;  // a DREQ of ours opens a transaction of its own
  for (const CapMad& m : c.mads)
    if (m.mad.attr() == Attr::kDreq && m.src == req->dst) dreq_tid = m.mad.hdr.tid.get();
  s.agent->next_tid = [&] { return dreq_tid; };
  ASSERT_EQ(s.agent->listen(static_cast<std::uint16_t>(rq.service_id.get()), 1), 0);
  std::uint32_t id = 0;
  bool disconnected = false;
  for (const CapMad& m : causal(c.mads, req->dst)) {
    const bool theirs = m.src == req->src;
    const std::string at = where + " frame " + std::to_string(m.index) + " " + to_string(m.mad.attr());
    CmEvent e;
    if (theirs) {
      s.rx(m);
      switch (m.mad.attr()) {
        case Attr::kReq:
          ASSERT_TRUE(s.agent->next_event(1, e)) << at;
          ASSERT_EQ(e.type, CmEvent::Type::kConnectRequest) << at;
          EXPECT_EQ(e.peer_qpn, rq.local_qpn.get()) << at;
          EXPECT_EQ(e.peer_port, reinterpret_cast<const CmaHdr*>(rq.private_data)->src_port.get()) << at;
          id = e.id;
          // The application's private data in the captured REP is what ours sends.
          ASSERT_EQ(s.agent->accept(id, s.qp, rp.private_data, 1, s.now), 0) << at;
          EXPECT_EQ(s.qp->state, IBV_QPS_RTS) << at;
          EXPECT_EQ(s.qp->dest_qp_num, rq.local_qpn.get()) << at;
          EXPECT_EQ(s.qp->path_mtu, static_cast<ibv_mtu>(rq.path_mtu())) << at;
          expect_psns(s, file, req->dst, req->src, rp.local_qpn.get(), rq.local_qpn.get(), at);
          break;
        case Attr::kRtu:
          ASSERT_TRUE(s.agent->next_event(1, e)) << at;
          EXPECT_EQ(e.type, CmEvent::Type::kEstablished) << at;
          break;
        case Attr::kDreq:
        case Attr::kDrep: expect_disconnected(s, disconnected, at); break;
        default: break;
      }
    } else {
      if (m.mad.attr() == Attr::kDreq) {
        ASSERT_EQ(s.agent->disconnect(id, 1, s.now), 0) << at;
      }
      expect_same(s, m, at);
    }
  }
  EXPECT_EQ(s.agent->counter(CmCounter::unmatched), 0u) << where;
}

void replay_active(const Conversation& c, const std::string& file, const std::string& where) {
  const CapMad* req = c.first(Attr::kReq);
  ASSERT_TRUE(req) << where;
  const Req& rq = req->mad.as<Req>();
  Side s(req->src, req->smac, rq.local_ca_guid.get());
  s.eng->set_neighbor(req->dst, req->dmac);
  s.agent->next_comm_id = [&] { return rq.local_comm_id.get(); };
  s.agent->next_psn = [&] { return rq.starting_psn.get(); };
  s.agent->next_tid = [&] { return req->mad.hdr.tid.get(); };
  s.agent->next_src_port = [&] { return reinterpret_cast<const CmaHdr*>(rq.private_data)->src_port.get(); };
  ConnParams cp;
  cp.mtu = static_cast<ibv_mtu>(rq.path_mtu());
  cp.responder_resources = rq.responder_resources;
  cp.initiator_depth = rq.initiator_depth;
  cp.retry_cnt = rq.retry_count();
  cp.rnr_retry = rq.rnr_retry();
  cp.ack_timeout = rq.primary.ack_timeout >> 3;
  std::uint32_t id = 0;
  ASSERT_EQ(s.agent->connect(s.qp, req->dst, static_cast<std::uint16_t>(rq.service_id.get()),
                             wire::ConstBytes(rq.private_data + sizeof(CmaHdr), kReqUserPrivate), 1, cp, s.now, id),
            0);
  bool disconnected = false;
  for (const CapMad& m : causal(c.mads, req->src)) {
    const bool ours = m.src == req->src;
    const std::string at = where + " frame " + std::to_string(m.index) + " " + to_string(m.mad.attr());
    CmEvent e;
    if (ours) {
      if (m.mad.attr() == Attr::kDreq) {
        ASSERT_EQ(s.agent->disconnect(id, 1, s.now), 0) << at;
      }
      expect_same(s, m, at);
      continue;
    }
    s.rx(m);
    switch (m.mad.attr()) {
      case Attr::kRep:
        ASSERT_TRUE(s.agent->next_event(1, e)) << at;
        ASSERT_EQ(e.type, CmEvent::Type::kEstablished) << at;
        EXPECT_EQ(s.qp->state, IBV_QPS_RTS) << at;
        EXPECT_EQ(s.qp->dest_qp_num, m.mad.as<Rep>().local_qpn.get()) << at;
        expect_psns(s, file, req->src, req->dst, rq.local_qpn.get(), m.mad.as<Rep>().local_qpn.get(), at);
        break;
      case Attr::kDrep:
      case Attr::kDreq: expect_disconnected(s, disconnected, at); break;
      default: break;
    }
  }
  EXPECT_EQ(s.agent->counter(CmCounter::unmatched), 0u) << where;
}

class CmReplay : public ::testing::TestWithParam<const char*> {};

TEST_P(CmReplay, BothSidesMatchTheCapture) {
  const auto convs = conversations(GetParam());
  ASSERT_FALSE(convs.empty()) << "no CM MADs in " << GetParam() << " (is ../shared/captures there?)";
  std::size_t n = 0;
  for (const Conversation& c : convs) {
    const std::string where = std::string(GetParam()) + " conversation " + std::to_string(++n);
    replay_passive(c, GetParam(), where + " (we are passive)");
    replay_active(c, GetParam(), where + " (we are active)");
  }
}

INSTANTIATE_TEST_SUITE_P(Captures, CmReplay,
                         ::testing::Values("rxe-linlinw5/rdma_cm.pcap", "rxe-linlinw5/rping.pcap",
                                           "rxe-montybeatnik/read-write.pcap", "rxe-montybeatnik/test.pcap"));

}  // namespace
}  // namespace uroce::cm
