// The dataplane pieces without DPDK: neighbour handling (ARP, ICMP echo,
// IPv6 ND, VLAN), the fault injector, and two pipelines joined by an
// in-memory PortIo running real RC traffic through the whole loop.
#include <gtest/gtest.h>

#include <cstring>
#include <deque>
#include <optional>
#include <vector>

#include "stack/pipeline/dataplane.h"
#include "stack/pipeline/fault.h"
#include "stack/pipeline/neigh.h"
#include "stack/pipeline/shard.h"
#include "stack/transport/qpn_space.h"
#include "stack/wire/builder.h"
#include "stack/wire/parser.h"

namespace uroce::pipeline {
namespace {

using wire::IpAddr;
using wire::MacAddr;

const MacAddr kMacA = {0x02, 0, 0, 0, 0, 0x0a};
const MacAddr kMacB = {0x02, 0, 0, 0, 0, 0x0b};

std::vector<std::uint8_t> arp_request(const MacAddr& from, const IpAddr& sender, const IpAddr& target,
                                      std::uint16_t vlan = 0) {
  transport::NeighborTable t;
  Neighbors n(t, from, sender, vlan);
  std::vector<std::uint8_t> f(128);
  f.resize(n.build_request(target, f));
  return f;
}

TEST(Neighbors, AnswersArpForOurAddressAndLearnsTheSender) {
  transport::NeighborTable t;
  Neighbors n(t, kMacA, IpAddr::from_v4(10, 0, 0, 1));
  const auto req = arp_request(kMacB, IpAddr::from_v4(10, 0, 0, 2), IpAddr::from_v4(10, 0, 0, 1));
  ASSERT_EQ(req.size(), 60u);
  std::uint8_t reply[128];
  std::size_t len = 0;
  ASSERT_EQ(n.handle(req, reply, len), Neighbors::Verdict::kReply);
  EXPECT_EQ(len, 42u);
  EXPECT_EQ(0, std::memcmp(reply, kMacB.data(), 6));       // to the asker
  EXPECT_EQ(0, std::memcmp(reply + 6, kMacA.data(), 6));   // from us
  EXPECT_EQ(reply[14 + 7], 2);                             // ARP reply
  EXPECT_EQ(0, std::memcmp(reply + 14 + 8, kMacA.data(), 6));  // sender hw = us
  ASSERT_TRUE(t.lookup(IpAddr::from_v4(10, 0, 0, 2)).has_value());
  EXPECT_EQ(*t.lookup(IpAddr::from_v4(10, 0, 0, 2)), kMacB);
  // Not for us: no reply, nothing learned about strangers.
  const auto other = arp_request(kMacB, IpAddr::from_v4(10, 0, 0, 3), IpAddr::from_v4(10, 0, 0, 9));
  EXPECT_EQ(n.handle(other, reply, len), Neighbors::Verdict::kHandled);
  EXPECT_FALSE(t.lookup(IpAddr::from_v4(10, 0, 0, 3)).has_value());
}

TEST(Neighbors, VlanTaggedArpOnlyOnOurVlan) {
  transport::NeighborTable t;
  Neighbors n(t, kMacA, IpAddr::from_v4(10, 0, 0, 1), 0x6064);  // PCP 3, VID 100
  std::uint8_t reply[128];
  std::size_t len = 0;
  const auto tagged = arp_request(kMacB, IpAddr::from_v4(10, 0, 0, 2), IpAddr::from_v4(10, 0, 0, 1), 0x0064);
  ASSERT_EQ(n.handle(tagged, reply, len), Neighbors::Verdict::kReply);
  EXPECT_EQ(reply[12], 0x81);  // the reply is tagged too
  EXPECT_EQ(((reply[14] << 8) | reply[15]) & 0x0fff, 100);
  const auto untagged = arp_request(kMacB, IpAddr::from_v4(10, 0, 0, 2), IpAddr::from_v4(10, 0, 0, 1));
  EXPECT_EQ(n.handle(untagged, reply, len), Neighbors::Verdict::kNotMine);
  const auto vlan7 = arp_request(kMacB, IpAddr::from_v4(10, 0, 0, 2), IpAddr::from_v4(10, 0, 0, 1), 7);
  EXPECT_EQ(n.handle(vlan7, reply, len), Neighbors::Verdict::kNotMine);
}

TEST(Neighbors, AnswersIcmpEchoWithValidChecksums) {
  transport::NeighborTable t;
  Neighbors n(t, kMacA, IpAddr::from_v4(10, 0, 0, 1));
  std::vector<std::uint8_t> f(14 + 20 + 8 + 4, 0);
  std::memcpy(f.data(), kMacA.data(), 6);
  std::memcpy(f.data() + 6, kMacB.data(), 6);
  f[12] = 0x08;
  f[14] = 0x45;
  f[14 + 3] = 32;  // total length
  f[14 + 8] = 64;
  f[14 + 9] = 1;   // ICMP
  const std::uint8_t src[] = {10, 0, 0, 2}, dst[] = {10, 0, 0, 1};
  std::memcpy(f.data() + 14 + 12, src, 4);
  std::memcpy(f.data() + 14 + 16, dst, 4);
  const std::uint16_t ipc = wire::ipv4_header_checksum(f.data() + 14, 20);
  f[14 + 10] = static_cast<std::uint8_t>(ipc >> 8);
  f[14 + 11] = static_cast<std::uint8_t>(ipc);
  f[34] = 8;  // echo request
  std::memcpy(f.data() + 42, "ping", 4);
  std::uint8_t reply[128];
  std::size_t len = 0;
  ASSERT_EQ(n.handle(f, reply, len), Neighbors::Verdict::kReply);
  EXPECT_EQ(reply[34], 0);  // echo reply
  EXPECT_EQ(wire::ipv4_header_checksum(reply + 14, 20), 0);
  EXPECT_EQ(csum_fold(csum_add(0, reply + 34, 12)), 0);  // ICMP checksum verifies
  EXPECT_EQ(0, std::memcmp(reply + 14 + 16, src, 4));    // back to the sender
}

TEST(Neighbors, Ipv6SolicitationGetsAnAdvertisement) {
  IpAddr a, b;
  ASSERT_TRUE(IpAddr::parse("fd00::a", a));
  ASSERT_TRUE(IpAddr::parse("fd00::b", b));
  transport::NeighborTable ta, tb;
  Neighbors na(ta, kMacA, a), nb(tb, kMacB, b);
  std::uint8_t ns[128], reply[128];
  const std::size_t nslen = nb.build_request(a, ns);  // B asks for A
  ASSERT_GT(nslen, 0u);
  EXPECT_EQ(ns[0], 0x33);  // solicited-node multicast MAC
  std::size_t len = 0;
  ASSERT_EQ(na.handle(wire::ConstBytes(ns, nslen), reply, len), Neighbors::Verdict::kReply);
  EXPECT_EQ(*ta.lookup(b), kMacB);  // A learned B from the source link-layer option
  // Both messages carry a valid ICMPv6 checksum (pseudo-header + message sums to 0).
  for (auto [frame, flen] : {std::pair<const std::uint8_t*, std::size_t>{ns, nslen}, {reply, len}}) {
    const std::uint8_t* ip6 = frame + 14;
    const std::size_t mlen = (std::size_t{ip6[4]} << 8) | ip6[5];
    std::uint32_t sum = csum_add(0, ip6 + 8, 32);  // source and destination addresses
    const std::uint8_t tail[8] = {0, 0, static_cast<std::uint8_t>(mlen >> 8), static_cast<std::uint8_t>(mlen), 0, 0, 0, 58};
    sum = csum_add(sum, tail, 8);
    sum = csum_add(sum, ip6 + 40, mlen);
    EXPECT_EQ(csum_fold(sum), 0) << "ICMPv6 type " << int(ip6[40]);
    EXPECT_EQ(flen, 14u + 40 + 32);
  }
  // B learns A from the advertisement.
  std::uint8_t dummy[128];
  std::size_t dl = 0;
  EXPECT_EQ(nb.handle(wire::ConstBytes(reply, len), dummy, dl), Neighbors::Verdict::kHandled);
  ASSERT_TRUE(tb.lookup(a).has_value());
  EXPECT_EQ(*tb.lookup(a), kMacA);
}

std::vector<std::uint8_t> roce_frame(std::uint32_t qpn, std::uint32_t psn) {
  wire::FrameSpec s;
  s.opcode = wire::op::kRcSendOnly;
  s.destqp = qpn;
  s.psn = wire::Psn(psn);
  s.src = IpAddr::from_v4(10, 0, 0, 2);
  s.dst = IpAddr::from_v4(10, 0, 0, 1);
  std::vector<std::uint8_t> f(wire::frame_len(s, 16));
  std::vector<std::uint8_t> pl(16, 1);
  EXPECT_EQ(wire::build_frame(f, s, pl), f.size());
  return f;
}

// Sharding: a frame goes to the engine that owns its DestQP, by the one
// formula the engines number their QPs with; what every shard must learn
// from goes to all; the rest to shard 0.
TEST(Shard, RoceGoesToTheEngineThatOwnsItsDestQp) {
  for (std::uint16_t shards : {1, 2, 3, 4, 7}) {
    for (std::uint32_t sh = 0; sh < shards; ++sh) {
      const transport::QpnSpace space{sh, shards};
      for (std::uint32_t i : {0u, 1u, 5u, 1000u}) {
        const std::uint32_t qpn = space.qpn(i);
        std::uint32_t back = 99;
        ASSERT_TRUE(space.index(qpn, back));
        EXPECT_EQ(back, i);
        EXPECT_EQ(frame_owner(roce_frame(qpn, 1), shards), static_cast<int>(sh)) << qpn << " of " << shards;
        const transport::QpnSpace next{(sh + 1) % shards, shards};
        if (shards > 1) {
          EXPECT_FALSE(next.index(qpn, back));
        }
      }
    }
  }
  // Tagged, and over IPv6.
  wire::FrameSpec s;
  s.opcode = wire::op::kRcSendOnly;
  s.destqp = transport::QpnSpace{2, 4}.qpn(9);
  s.vlan = true;
  s.vlan_tci = 7;
  s.ipver = wire::IpVersion::kV6;
  IpAddr::parse("fd00::1", s.dst);
  IpAddr::parse("fd00::2", s.src);
  std::vector<std::uint8_t> f(wire::frame_len(s, 8));
  std::vector<std::uint8_t> pl(8, 1);
  ASSERT_EQ(wire::build_frame(f, s, pl), f.size());
  EXPECT_EQ(frame_owner(f, 4), 2);
}

TEST(Shard, NeighbourDiscoveryGoesToEveryShardAndTheRestToShardZero) {
  EXPECT_EQ(frame_owner(arp_request(kMacB, IpAddr::from_v4(10, 0, 0, 2), IpAddr::from_v4(10, 0, 0, 1)), 4), -1);
  EXPECT_EQ(frame_owner(arp_request(kMacB, IpAddr::from_v4(10, 0, 0, 2), IpAddr::from_v4(10, 0, 0, 1), 5), 4), -1);
  // An IPv6 neighbour solicitation.
  transport::NeighborTable t;
  IpAddr me, them;
  IpAddr::parse("fd00::1", me);
  IpAddr::parse("fd00::2", them);
  Neighbors n(t, kMacA, me);
  std::vector<std::uint8_t> ns(128);
  ns.resize(n.build_request(them, ns));
  ASSERT_GT(ns.size(), 0u);
  EXPECT_EQ(frame_owner(ns, 4), -1);
  // UDP to another port, a truncated RoCE frame, a runt: shard 0.
  auto f = roce_frame(transport::QpnSpace{3, 4}.qpn(1), 1);
  EXPECT_EQ(frame_owner(f, 4), 3);
  auto other = f;
  other[14 + 20 + 2] = 0x13;  // UDP destination port 0x13b7, not 4791
  EXPECT_EQ(frame_owner(other, 4), 0);
  EXPECT_EQ(frame_owner(wire::ConstBytes(f.data(), 14 + 20 + 8 + 4), 4), 0);
  EXPECT_EQ(frame_owner(wire::ConstBytes(f.data(), 10), 4), 0);
}

TEST(Fault, ParsesAndRefusesSpecs) {
  FaultConfig c;
  std::string err;
  EXPECT_TRUE(FaultConfig::parse("drop=0.1,dup=0.2,reorder=0.3,corrupt=0.01,ecn=0.5,delay_us=7,rule=dup:0x11:5:2", c, err));
  EXPECT_DOUBLE_EQ(c.drop, 0.1);
  ASSERT_EQ(c.rules.size(), 1u);
  EXPECT_EQ(c.rules[0].qpn, 0x11u);
  EXPECT_EQ(c.rules[0].times, 2u);
  EXPECT_TRUE(c.active());
  EXPECT_FALSE(FaultConfig::parse("drop=1.5", c, err));
  EXPECT_NE(err.find("drop"), std::string::npos);
  EXPECT_FALSE(FaultConfig::parse("nonsense=1", c, err));
  EXPECT_FALSE(FaultConfig::parse("rule=explode:1:2", c, err));
  EXPECT_FALSE(FaultConfig::parse("rule=drop:0x1000000:1", c, err));  // QPN over 24 bits
  EXPECT_TRUE(FaultConfig::parse("", c, err));
  EXPECT_FALSE(c.active());
}

TEST(Fault, RulesHitTheNamedPacketOnly) {
  FaultInjector fi(1);
  FaultConfig c;
  std::string err;
  ASSERT_TRUE(FaultConfig::parse("rule=drop:0x11:5,rule=dup:0x11:6,rule=ecn:0x11:7,rule=corrupt:0x11:8", c, err));
  fi.configure(c);
  std::vector<int> delivered;
  for (std::uint32_t psn = 4; psn <= 9; ++psn) {
    const auto f = roce_frame(0x11, psn);
    int n = 0;
    fi.apply(f, 0, [&](wire::ConstBytes g) {
      ++n;
      wire::Packet p;
      const auto st = wire::parse_frame(g, wire::ParseOptions{}, p);
      if (psn == 7) {
        EXPECT_TRUE(st.ok());
        EXPECT_EQ(p.ecn, 3);  // CE, and the IPv4 checksum still verifies
      }
      if (psn == 8) {
        EXPECT_FALSE(st.ok());  // corrupted: the ICRC (or a header check) catches it
      }
    });
    delivered.push_back(n);
  }
  EXPECT_EQ(delivered, (std::vector<int>{1, 0, 2, 1, 1, 1}));
  EXPECT_EQ(fi.stats().rule_hits, 4u);
  // Each rule applied once: the same PSNs pass untouched now.
  int n = 0;
  fi.apply(roce_frame(0x11, 5), 0, [&](wire::ConstBytes) { ++n; });
  EXPECT_EQ(n, 1);
}

TEST(Fault, ARuleWithQpnStarHitsThatPsnOnAnyQp) {
  FaultInjector fi(1);
  FaultConfig c;
  std::string err;
  ASSERT_TRUE(FaultConfig::parse("rule=drop:*:7:2", c, err)) << err;
  EXPECT_TRUE(c.rules[0].any_qpn);
  EXPECT_FALSE(FaultConfig::parse("rule=drop:**:7", c, err));
  ASSERT_TRUE(FaultConfig::parse("rule=drop:*:7:2", c, err));
  fi.configure(c);
  int n = 0;
  const auto count = [&](wire::ConstBytes) { ++n; };
  fi.apply(roce_frame(0x11, 7), 0, count);  // dropped
  fi.apply(roce_frame(0x12, 6), 0, count);  // another PSN: passes
  fi.apply(roce_frame(0x12, 7), 0, count);  // another QP, the PSN: dropped
  fi.apply(roce_frame(0x13, 7), 0, count);  // its two times are used up: passes
  EXPECT_EQ(n, 2);
  EXPECT_EQ(fi.stats().rule_hits, 2u);
}

TEST(Fault, DelayHoldsFramesUntilTheirTime) {
  FaultInjector fi(2);
  FaultConfig c;
  c.delay_us = 50;
  fi.configure(c);
  int n = 0;
  fi.apply(roce_frame(0x11, 1), 1'000'000, [&](wire::ConstBytes) { ++n; });
  EXPECT_EQ(n, 0);
  fi.release(1'049'000, [&](wire::ConstBytes) { ++n; });
  EXPECT_EQ(n, 0);
  fi.release(1'050'000, [&](wire::ConstBytes) { ++n; });
  EXPECT_EQ(n, 1);
  // Non-RoCE frames are never touched.
  c = FaultConfig{};
  c.drop = 1.0;
  fi.configure(c);
  std::vector<std::uint8_t> arp = arp_request(kMacB, IpAddr::from_v4(10, 0, 0, 2), IpAddr::from_v4(10, 0, 0, 1));
  n = 0;
  fi.apply(arp, 0, [&](wire::ConstBytes) { ++n; });
  EXPECT_EQ(n, 1);
}

// Two pipelines joined back to back in memory.
class MemPort : public PortIo {
 public:
  explicit MemPort(MacAddr mac) : mac_(mac) {}
  MemPort* peer = nullptr;
  std::uint16_t rx_burst(RxFrame* out, std::uint16_t max) override {
    cur_.clear();
    while (!inbox_.empty() && cur_.size() < max) {
      cur_.push_back(std::move(inbox_.front()));
      inbox_.pop_front();
    }
    for (std::size_t i = 0; i < cur_.size(); ++i) out[i] = {cur_[i].data(), static_cast<std::uint32_t>(cur_[i].size())};
    return static_cast<std::uint16_t>(cur_.size());
  }
  void rx_done() override {}
  bool tx(const transport::TxFrame& f) override {
    std::vector<std::uint8_t> b(f.size());
    f.copy_to(b);
    peer->inbox_.push_back(std::move(b));
    return true;
  }
  bool tx_raw(wire::ConstBytes f) override {
    peer->inbox_.emplace_back(f.begin(), f.end());
    return true;
  }
  void tx_push() override {}
  MacAddr mac() const override { return mac_; }
  /// The frames sent to this port and not yet received, oldest first.
  [[nodiscard]] const std::deque<std::vector<std::uint8_t>>& inbox() const { return inbox_; }

 private:
  MacAddr mac_;
  std::deque<std::vector<std::uint8_t>> inbox_;
  std::vector<std::vector<std::uint8_t>> cur_;
};

/// One pipeline over an in-memory port whose frames go to a sink nobody
/// reads: for the idle policy, which only needs the engine's timers.
struct LonePipeline {
  MemPort port{kMacA}, sink{kMacB};
  transport::EngineConfig c = [] {
    transport::EngineConfig e;
    e.mac = kMacA;
    e.ip = IpAddr::from_v4(10, 0, 0, 1);
    return e;
  }();
  transport::Engine eng{c};
  Neighbors neigh{eng.neighbors(), c.mac, c.ip};
  Dataplane dp{eng, port, neigh};
  LonePipeline() { port.peer = &sink; }
};

TEST(Dataplane, AnIdleSleepEndsAtTheEnginesNextTimer) {
  using namespace transport;
  LonePipeline lp;
  Engine& eng = lp.eng;
  Dataplane& dp = lp.dp;
  IdleConfig ic;  // spin 5 us, tick 20 us, warm 10 ms, backing off to ...
  ic.max_sleep_us = 2000;  // ... 2 ms here (the default is longer)
  dp.set_idle(ic);
  const std::uint64_t t0 = 1'000'000'000;
  // Long idle with nothing armed: the backoff reaches its 2 ms ceiling.
  std::uint64_t t = t0, sleep = 0;
  EXPECT_EQ(dp.idle_sleep_ns(0, t), 0u) << "just gone idle: spin";
  for (int k = 0; k < 40; ++k) sleep = dp.idle_sleep_ns(0, t += 1'000'000);
  EXPECT_EQ(sleep, 2'000'000u);
  // A WRITE to a peer that never answers arms the QP's retransmit timer.
  Pd* pd = eng.alloc_pd();
  Cq* cq = eng.create_cq(16);
  std::vector<std::uint8_t> mem(64);
  Mr* mr = eng.reg_mr(pd, mem.data(), mem.size(), IBV_ACCESS_LOCAL_WRITE);
  QpInitAttr ia;
  ia.send_cq = ia.recv_cq = cq;
  Qp* qp = eng.create_qp(pd, ia);
  eng.set_neighbor(IpAddr::from_v4(10, 0, 0, 2), kMacB);
  abi::Connect k;
  k.dest_qp_num = 0x33;
  k.timeout = 8;  // 4.096 us * 2^8 = 1.05 ms: sooner than the 2 ms sleep
  std::memcpy(k.dgid.raw, IpAddr::from_v4(10, 0, 0, 2).b.data(), 16);
  ASSERT_TRUE(eng.bring_up(qp, k));
  Sge s{reinterpret_cast<std::uint64_t>(mem.data()), 8, mr->lkey};
  SendWr w;
  w.opcode = IBV_WR_RDMA_WRITE;
  w.sg_list = {&s, 1};
  ASSERT_EQ(eng.post_send(qp, w), 0);
  dp.iterate(t);
  const std::uint64_t deadline = eng.next_deadline();
  ASSERT_GT(deadline, t);
  sleep = dp.idle_sleep_ns(0, t + 100'000);
  EXPECT_EQ(sleep, deadline - (t + 100'000)) << "the sleep ends when the retransmit is due, not 2 ms on";
  EXPECT_EQ(dp.idle_sleep_ns(0, deadline), 0u) << "due now: no sleep";
}

TEST(Dataplane, TwoPipelinesResolveEachOtherAndCarryRcTraffic) {
  using namespace transport;
  struct Host {
    std::unique_ptr<MemPort> port;
    std::unique_ptr<Engine> eng;
    std::unique_ptr<Neighbors> neigh;
    std::unique_ptr<Dataplane> dp;
    std::vector<std::uint8_t> mem = std::vector<std::uint8_t>(1 << 16);
    Pd* pd;
    Cq* cq;
    Mr* mr;
    Qp* qp;
  } h[2];
  for (int i = 0; i < 2; ++i) {
    h[i].port = std::make_unique<MemPort>(i == 0 ? kMacA : kMacB);
    EngineConfig c;
    c.mac = h[i].port->mac();
    c.ip = IpAddr::from_v4(10, 0, 0, static_cast<std::uint8_t>(1 + i));
    c.vlan_tci = 42;
    h[i].eng = std::make_unique<Engine>(c);
    h[i].neigh = std::make_unique<Neighbors>(h[i].eng->neighbors(), c.mac, c.ip, c.vlan_tci);
    // No callback keeps a second table in step: what ARP teaches is in the
    // engine's own table, and the RTR below finds it there.
    h[i].dp = std::make_unique<Dataplane>(*h[i].eng, *h[i].port, *h[i].neigh);
    h[i].pd = h[i].eng->alloc_pd();
    h[i].cq = h[i].eng->create_cq(64);
    h[i].mr = h[i].eng->reg_mr(h[i].pd, h[i].mem.data(), h[i].mem.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    QpInitAttr ia;
    ia.send_cq = ia.recv_cq = h[i].cq;
    h[i].qp = h[i].eng->create_qp(h[i].pd, ia);
  }
  h[0].port->peer = h[1].port.get();
  h[1].port->peer = h[0].port.get();
  // ARP in both directions through the loop.
  h[0].dp->resolve(IpAddr::from_v4(10, 0, 0, 2));
  std::uint64_t now = 1'000'000;
  for (int k = 0; k < 10; ++k, now += 1000)
    for (auto& x : h) x.dp->iterate(now);
  ASSERT_TRUE(h[0].eng->neighbors().lookup(IpAddr::from_v4(10, 0, 0, 2)).has_value());
  ASSERT_TRUE(h[1].eng->neighbors().lookup(IpAddr::from_v4(10, 0, 0, 1)).has_value());
  for (int i = 0; i < 2; ++i) {
    abi::Connect k;
    k.access = IBV_ACCESS_REMOTE_WRITE;
    k.dest_qp_num = h[1 - i].qp->qpn;
    std::memcpy(k.dgid.raw, h[1 - i].eng->config().ip.b.data(), 16);
    ASSERT_TRUE(h[i].eng->bring_up(h[i].qp, k));
  }
  for (std::size_t i = 0; i < 5000; ++i) h[0].mem[i] = static_cast<std::uint8_t>(i * 3);
  Sge s{reinterpret_cast<std::uint64_t>(h[0].mem.data()), 5000, h[0].mr->lkey};
  SendWr wr;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.sg_list = {&s, 1};
  wr.remote_addr = reinterpret_cast<std::uint64_t>(h[1].mem.data()) + 8192;
  wr.rkey = h[1].mr->rkey;
  ASSERT_EQ(h[0].eng->post_send(h[0].qp, wr), 0);
  ibv_wc wc[4];
  int got = 0;
  for (int k = 0; k < 100 && got == 0; ++k, now += 1000) {
    for (auto& x : h) x.dp->iterate(now);
    got = h[0].eng->poll_cq(h[0].cq, wc);
  }
  ASSERT_EQ(got, 1);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(0, std::memcmp(h[0].mem.data(), h[1].mem.data() + 8192, 5000));
  EXPECT_GT(h[1].dp->counter(DpCounter::rx_roce), 0u);
  EXPECT_GT(h[0].dp->counter(DpCounter::tx_replies) + h[1].dp->counter(DpCounter::tx_replies), 0u);
}

TEST(Dataplane, TwoQpsOnOneDeviceTalkThroughThePortsLoopback) {
  // A port that turns every frame around, as the DPDK port does with frames
  // to its own MAC: two QPs of one engine, connected to the port's own
  // address, exchange a WRITE. The engine knows its own address without
  // ARP, and the own-frame filter lets a frame from and to us through.
  using namespace transport;
  LonePipeline lp;
  lp.port.peer = &lp.port;
  Engine& eng = lp.eng;
  ASSERT_EQ(eng.neighbors().lookup(lp.c.ip), std::optional<MacAddr>(kMacA)) << "the port's own address, no ARP";
  Pd* pd = eng.alloc_pd();
  Cq* cq = eng.create_cq(16);
  std::vector<std::uint8_t> mem(1 << 16);
  Mr* mr = eng.reg_mr(pd, mem.data(), mem.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  QpInitAttr ia;
  ia.send_cq = ia.recv_cq = cq;
  Qp* a = eng.create_qp(pd, ia);
  Qp* b = eng.create_qp(pd, ia);
  for (Qp* q : {a, b}) {
    abi::Connect k;
    k.access = IBV_ACCESS_REMOTE_WRITE;
    k.dest_qp_num = (q == a ? b : a)->qpn;
    std::memcpy(k.dgid.raw, lp.c.ip.b.data(), 16);
    ASSERT_TRUE(eng.bring_up(q, k));
  }
  for (std::size_t i = 0; i < 5000; ++i) mem[i] = static_cast<std::uint8_t>(i * 7);
  Sge sg{reinterpret_cast<std::uint64_t>(mem.data()), 5000, mr->lkey};
  SendWr wr;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.sg_list = {&sg, 1};
  wr.remote_addr = reinterpret_cast<std::uint64_t>(mem.data()) + 20000;
  wr.rkey = mr->rkey;
  ASSERT_EQ(eng.post_send(a, wr), 0);
  ibv_wc wc[4];
  int got = 0;
  std::uint64_t now = 1'000'000;
  for (int k = 0; k < 100 && got == 0; ++k, now += 1000) {
    lp.dp.iterate(now);
    got = eng.poll_cq(cq, wc);
  }
  ASSERT_EQ(got, 1);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(0, std::memcmp(mem.data(), mem.data() + 20000, 5000));
  EXPECT_EQ(lp.dp.counter(DpCounter::rx_own), 0u);
  EXPECT_GT(lp.dp.counter(DpCounter::rx_roce), 0u);
  // A frame of ours to someone else, handed back (af_packet's echo), is
  // still dropped as our own.
  std::vector<std::uint8_t> echo = arp_request(kMacA, lp.c.ip, IpAddr::from_v4(10, 0, 0, 9));
  std::memcpy(echo.data(), kMacB.data(), 6);
  lp.sink.peer = &lp.port;
  ASSERT_TRUE(lp.sink.tx_raw(echo));
  lp.dp.iterate(now);
  EXPECT_EQ(lp.dp.counter(DpCounter::rx_own), 1u);
}

TEST(Dataplane, APortThatWakesOnRxNeedsNoPollTick) {
  LonePipeline lp;
  Dataplane& dp = lp.dp;
  IdleConfig ic;  // spin 5 us, tick 20 us, warm 10 ms
  dp.set_idle(ic);
  const std::uint64_t t0 = 1'000'000'000;
  // Polling PMD: just past the spin, the loop sleeps one tick.
  EXPECT_EQ(dp.idle_sleep_ns(0, t0), 0u);
  EXPECT_EQ(dp.idle_sleep_ns(0, t0 + 6'000), std::uint64_t{ic.tick_us} * 1000);
  // A port whose RX interrupt ends the sleep: past the spin, the longest
  // sleep at once; work still means poll again, and the spin comes first.
  dp.set_rx_wakes(true);
  EXPECT_EQ(dp.idle_sleep_ns(1, t0), 0u) << "work: poll again";
  EXPECT_EQ(dp.idle_sleep_ns(0, t0 + 1'000), 0u) << "within the spin";
  EXPECT_EQ(dp.idle_sleep_ns(0, t0 + 7'000), std::uint64_t{ic.max_sleep_us} * 1000);
}

TEST(Dataplane, ItPollsOnForTheGapsItHasSeenBetweenWork) {
  LonePipeline lp;
  Dataplane& dp = lp.dp;
  IdleConfig ic;  // spin 5 us, spin_max 200 us, tick 20 us
  dp.set_idle(ic);
  const std::uint64_t tick = std::uint64_t{ic.tick_us} * 1000;
  std::uint64_t t = 1'000'000'000;
  // Nothing learnt yet: past the 5 us spin, a tick's sleep.
  EXPECT_EQ(dp.idle_sleep_ns(1, t), 0u);
  EXPECT_EQ(dp.idle_sleep_ns(0, t + 1'000), 0u);
  EXPECT_EQ(dp.idle_sleep_ns(0, t + 10'000), tick);
  // traffic(P): work every P ns, idle 1 us after each; then the next work.
  const auto traffic = [&](std::uint64_t period) {
    for (int k = 0; k <= 20; ++k) {
      t += period;
      EXPECT_EQ(dp.idle_sleep_ns(1, t), 0u);
      EXPECT_EQ(dp.idle_sleep_ns(0, t + 1'000), 0u) << "gone idle";
    }
  };
  traffic(9'000);  // a ping-pong: 8 us idle between messages
  EXPECT_EQ(dp.idle_sleep_ns(0, t + 10'000), 0u) << "the next message is due: poll on, past the 5 us";
  EXPECT_EQ(dp.idle_sleep_ns(0, t + 20'000), tick) << "twice the gap (16 us) has passed: sleep";
  traffic(250'000);  // gaps past spin_max, but within four of it: polled for twice the last (abi/spin.h)
  EXPECT_EQ(dp.idle_sleep_ns(0, t + 150'000), 0u);
  EXPECT_EQ(dp.idle_sleep_ns(0, t + 450'000), 0u) << "past spin_max, within twice the 249 us gap";
  EXPECT_EQ(dp.idle_sleep_ns(0, t + 500'000), tick);
  traffic(1'000'000);  // sparse traffic (gaps past four spin_max): back to the 5 us
  EXPECT_EQ(dp.idle_sleep_ns(0, t + 7'000), tick);
}

/// The exception path (set_host): with the host's netdev attached, every
/// frame that is not RoCE goes to the host untagged (neighbours are still
/// learned, the node no longer answers), and what the host sends goes out
/// on the wire, tagged with our VLAN where there is one.
void host_path(std::uint16_t vlan) {
  SCOPED_TRACE("vlan " + std::to_string(vlan));
  transport::EngineConfig c;
  c.mac = kMacA;
  c.ip = IpAddr::from_v4(10, 0, 0, 1);
  c.vlan_tci = vlan;
  transport::Engine eng{c};
  Neighbors neigh{eng.neighbors(), c.mac, c.ip, vlan};
  neigh.answer = false;
  MemPort port{kMacA}, wire_peer{kMacB}, host{kMacA}, kernel{kMacA};
  port.peer = &wire_peer;  // what the node sends on the wire
  wire_peer.peer = &port;  // what the wire brings
  host.peer = &kernel;     // what the node hands the host
  kernel.peer = &host;     // what the host writes
  Dataplane dp{eng, port, neigh};
  dp.set_host(&host);
  std::uint64_t now = 1'000'000'000;
  // An ARP request for our address: learned, not answered, handed up untagged.
  const auto req = arp_request(kMacB, IpAddr::from_v4(10, 0, 0, 2), c.ip, vlan);
  ASSERT_TRUE(wire_peer.tx_raw(req));
  dp.iterate(now);
  EXPECT_TRUE(wire_peer.inbox().empty()) << "the node answered: the host should";
  ASSERT_EQ(kernel.inbox().size(), 1u);
  const auto& up = kernel.inbox().front();
  const std::size_t tag = vlan ? 4 : 0;
  ASSERT_EQ(up.size(), req.size() - tag);
  EXPECT_EQ(up[12], 0x08);
  EXPECT_EQ(up[13], 0x06) << "untagged ARP";
  EXPECT_EQ(std::memcmp(up.data() + 12, req.data() + 12 + tag, up.size() - 12), 0);
  EXPECT_TRUE(eng.neighbors().lookup(IpAddr::from_v4(10, 0, 0, 2)).has_value()) << "still learned";
  EXPECT_EQ(dp.counter(DpCounter::rx_to_host), 1u);
  // The host's answer goes out on the wire, tagged as our traffic is.
  std::vector<std::uint8_t> reply(up);
  reply[21] = 2;  // an ARP reply (the bytes do not matter to the node)
  ASSERT_TRUE(kernel.tx_raw(reply));
  dp.iterate(now += 1'000'000);
  ASSERT_EQ(wire_peer.inbox().size(), 1u);
  const auto& out = wire_peer.inbox().front();
  ASSERT_EQ(out.size(), reply.size() + tag);
  if (vlan) {
    EXPECT_EQ(out[12], 0x81);
    EXPECT_EQ(out[13], 0x00);
    EXPECT_EQ(((out[14] << 8) | out[15]) & 0x0fff, vlan);
  }
  EXPECT_EQ(std::memcmp(out.data() + 12 + tag, reply.data() + 12, reply.size() - 12), 0);
  EXPECT_EQ(dp.counter(DpCounter::tx_from_host), 1u);
  // Another host's frame that is not RoCE (here, a too-short UDP): to the host.
  std::vector<std::uint8_t> junk(req);
  junk[12 + tag] = 0x86;
  junk[13 + tag] = 0xdd;  // IPv6 ethertype, garbage body
  ASSERT_TRUE(wire_peer.tx_raw(junk));
  dp.iterate(now += 1'000'000);
  EXPECT_EQ(kernel.inbox().size(), 2u);
  EXPECT_EQ(dp.counter(DpCounter::rx_other), 0u);
}

TEST(Dataplane, TheHostNetdevGetsWhatIsNotRoceAndSendsOnTheWire) {
  host_path(0);
  host_path(100);
}

}  // namespace
}  // namespace uroce::pipeline
