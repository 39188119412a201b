// Raw packet QPs and flow rules: a SEND is a whole Ethernet frame, sent as
// written; a frame reaches a raw packet QP only through a flow rule that
// matches it, from the wire or looped back from this port (to a group, or
// to the port's own MAC, which never leaves it). RSS: the Toeplitz hash
// against Microsoft's published values, and an RSS QP's frames spread over
// its work queues as the hash says.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstring>

#include "tests/support/pair.h"

namespace uroce::testing {
namespace {

const std::uint8_t kGroupMac[6] = {0x01, 0x50, 0x56, 0x19, 0x20, 0xa7};
const std::uint8_t kSrcMac[6] = {0x24, 0x8a, 0x07, 0xa5, 0x28, 0xc8};

/// Eth | IPv4 | UDP to `dst`, from 1.1.1.1:1234 to 2.2.2.2:dport, `len` bytes in all.
std::vector<std::uint8_t> udp_frame(const std::uint8_t* dst, std::uint16_t dport, std::size_t len = 128) {
  std::vector<std::uint8_t> f(len, 0);
  std::memcpy(f.data(), dst, 6);
  std::memcpy(f.data() + 6, kSrcMac, 6);
  f[12] = 0x08;
  f[13] = 0x00;
  std::uint8_t* ip = f.data() + 14;
  ip[0] = 0x45;
  ip[8] = 64;
  ip[9] = 17;
  const std::uint8_t src[4] = {1, 1, 1, 1}, dip[4] = {2, 2, 2, 2};
  std::memcpy(ip + 12, src, 4);
  std::memcpy(ip + 16, dip, 4);
  std::uint8_t* udp = ip + 20;
  udp[0] = 1234 >> 8;
  udp[1] = 1234 & 0xff;
  udp[2] = static_cast<std::uint8_t>(dport >> 8);
  udp[3] = static_cast<std::uint8_t>(dport & 0xff);
  for (std::size_t i = 42; i < len; ++i) f[i] = static_cast<std::uint8_t>(i * 3);
  return f;
}

Qp* raw_qp(Pair& p, int i) {
  QpInitAttr ia;
  ia.qp_type = IBV_QPT_RAW_PACKET;
  ia.send_cq = ia.recv_cq = p.node[i].cq;
  ia.cap.max_send_wr = ia.cap.max_recv_wr = 16;
  ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
  Engine& e = *p.node[i].eng;
  Qp* q = e.create_qp(p.node[i].pd, ia);
  if (q == nullptr) return nullptr;
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  if (!e.modify_qp(q, a, IBV_QP_STATE | IBV_QP_PORT)) return nullptr;
  a.qp_state = IBV_QPS_RTR;
  if (!e.modify_qp(q, a, IBV_QP_STATE)) return nullptr;
  a.qp_state = IBV_QPS_RTS;
  if (!e.modify_qp(q, a, IBV_QP_STATE)) return nullptr;
  return q;
}

/// A rule on the destination MAC and the UDP destination port.
std::uint32_t flow(Engine& e, Qp* q, const std::uint8_t* dmac, std::uint16_t dport, std::uint32_t prio = 0) {
  uroce_flow_key v{}, m{};
  std::memcpy(v.dmac, dmac, 6);
  std::memset(m.dmac, 0xff, 6);
  v.dport[0] = static_cast<std::uint8_t>(dport >> 8);
  v.dport[1] = static_cast<std::uint8_t>(dport & 0xff);
  m.dport[0] = m.dport[1] = 0xff;
  return e.create_flow(q, prio, v, m);
}

struct Raw {
  Pair p{21, 1 << 20};
  std::vector<ibv_wc> wa, wb;
  /// Sends `f` from node i's QP q (the frame at offset 0 of its memory);
  /// runs the fabric a while.
  ibv_wc_status send(int i, Qp* q, const std::vector<std::uint8_t>& f) {
    std::memcpy(p.node[i].mem.data(), f.data(), f.size());
    Sge s = p.sge(i, 0, static_cast<std::uint32_t>(f.size()));
    SendWr w;
    w.wr_id = 5;
    w.opcode = IBV_WR_SEND;
    w.send_flags = IBV_SEND_SIGNALED;
    w.sg_list = {&s, 1};
    EXPECT_EQ(p.node[i].eng->post_send(q, w), 0);
    std::vector<ibv_wc> mine;
    p.wire.run_until(
        [&] {
          p.poll(0, i == 0 ? mine : wa);
          p.poll(1, i == 1 ? mine : wb);
          return false;
        },
        2'000'000);
    EXPECT_EQ(mine.size(), std::size_t{1});
    return mine.empty() ? IBV_WC_GENERAL_ERR : mine.front().status;
  }
  void post_recv(int i, Qp* q, std::uint64_t off) {
    Sge s = p.sge(i, off, 4096);
    ASSERT_EQ(p.node[i].eng->post_recv(q, RecvWr{77, {&s, 1}}), 0);
  }
};

TEST(Raw, AFrameToAGroupReachesTheFlowOfAQpOnTheSamePortAndTheWire) {
  Raw t;
  Qp* tx = raw_qp(t.p, 0);
  Qp* rx = raw_qp(t.p, 0);
  Qp* far = raw_qp(t.p, 1);
  ASSERT_TRUE(tx && rx && far);
  ASSERT_NE(flow(t.p.A(), rx, kGroupMac, 5678), 0u);
  ASSERT_NE(flow(t.p.B(), far, kGroupMac, 5678), 0u);
  t.post_recv(0, rx, 65536);
  t.post_recv(1, far, 65536);
  const auto f = udp_frame(kGroupMac, 5678, 300);
  // The sender's own CQ is node 0's: its completion and rx's share it.
  std::memcpy(t.p.node[0].mem.data(), f.data(), f.size());
  Sge s = t.p.sge(0, 0, 300);
  SendWr w;
  w.wr_id = 5;
  w.opcode = IBV_WR_SEND;
  w.send_flags = IBV_SEND_SIGNALED;
  w.sg_list = {&s, 1};
  ASSERT_EQ(t.p.A().post_send(tx, w), 0);
  t.p.wire.run_until(
      [&] {
        t.p.poll(0, t.wa);
        t.p.poll(1, t.wb);
        return t.wa.size() >= 2 && !t.wb.empty();
      },
      50'000'000);
  ASSERT_EQ(t.wa.size(), 2u);
  ASSERT_EQ(t.wb.size(), 1u);
  for (const ibv_wc& c : t.wa) {
    EXPECT_EQ(c.status, IBV_WC_SUCCESS);
    if (c.opcode == IBV_WC_RECV) {
      EXPECT_EQ(c.byte_len, 300u);
    }
  }
  EXPECT_EQ(t.wb[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(t.wb[0].byte_len, 300u);
  // Byte for byte as written, on this port and across the wire.
  EXPECT_EQ(std::memcmp(t.p.node[0].mem.data() + 65536, f.data(), f.size()), 0);
  EXPECT_EQ(std::memcmp(t.p.node[1].mem.data() + 65536, f.data(), f.size()), 0);
  EXPECT_EQ(t.p.B().counters()[PortCounter::rx_raw], 1u);
}

TEST(Raw, AFrameNoRuleMatchesIsNotDelivered) {
  Raw t;
  Qp* tx = raw_qp(t.p, 0);
  Qp* far = raw_qp(t.p, 1);
  ASSERT_TRUE(tx && far);
  ASSERT_NE(flow(t.p.B(), far, kGroupMac, 5678), 0u);
  t.post_recv(1, far, 65536);
  EXPECT_EQ(t.send(0, tx, udp_frame(kGroupMac, 5679)), IBV_WC_SUCCESS);
  EXPECT_TRUE(t.wb.empty());
  EXPECT_EQ(t.p.B().counters()[PortCounter::rx_raw], 0u);
  EXPECT_GE(t.p.B().counters()[PortCounter::rx_not_roce], 1u);
}

TEST(Raw, OfTwoMatchingRulesTheLowerPriorityValueTakesTheFrame) {
  Raw t;
  Qp* tx = raw_qp(t.p, 0);
  Qp* lo = raw_qp(t.p, 1);
  Qp* hi = raw_qp(t.p, 1);
  ASSERT_TRUE(tx && lo && hi);
  ASSERT_NE(flow(t.p.B(), hi, kGroupMac, 5678, 5), 0u);
  ASSERT_NE(flow(t.p.B(), lo, kGroupMac, 5678, 1), 0u);
  t.post_recv(1, lo, 65536);
  t.post_recv(1, hi, 131072);
  EXPECT_EQ(t.send(0, tx, udp_frame(kGroupMac, 5678)), IBV_WC_SUCCESS);
  ASSERT_EQ(t.wb.size(), 1u);
  EXPECT_EQ(t.wb[0].qp_num, lo->qpn);
}

TEST(Raw, AFrameToThePortsOwnMacStaysOnThePort) {
  Raw t;
  Qp* tx = raw_qp(t.p, 0);
  Qp* rx = raw_qp(t.p, 0);
  ASSERT_TRUE(tx && rx);
  const std::uint8_t* own = t.p.A().config().mac.data();
  ASSERT_NE(flow(t.p.A(), rx, own, 9), 0u);
  t.post_recv(0, rx, 65536);
  const std::uint64_t out = t.p.A().counters()[PortCounter::tx_frames];
  std::vector<std::uint8_t> f = udp_frame(own, 9, 100);
  std::memcpy(t.p.node[0].mem.data(), f.data(), f.size());
  Sge s = t.p.sge(0, 0, 100);
  SendWr w;
  w.opcode = IBV_WR_SEND;
  w.send_flags = IBV_SEND_SIGNALED;
  w.sg_list = {&s, 1};
  ASSERT_EQ(t.p.A().post_send(tx, w), 0);
  t.p.wire.run_until([&] { return t.p.poll(0, t.wa) >= 0 && t.wa.size() >= 2; }, 10'000'000);
  ASSERT_EQ(t.wa.size(), 2u);
  EXPECT_EQ(t.p.A().counters()[PortCounter::tx_frames], out);  // never on the wire
  EXPECT_EQ(std::memcmp(t.p.node[0].mem.data() + 65536, f.data(), f.size()), 0);
}

TEST(Raw, ShortFramesWrongOpcodesAndRulesForOtherQpsAreRefused) {
  Raw t;
  Qp* tx = raw_qp(t.p, 0);
  ASSERT_NE(tx, nullptr);
  // Shorter than an Ethernet header: a local length error.
  EXPECT_EQ(t.send(0, tx, std::vector<std::uint8_t>(10, 1)), IBV_WC_LOC_LEN_ERR);
  // Only SEND: an RDMA WRITE is refused at the post.
  Qp* tx2 = raw_qp(t.p, 0);
  Sge s = t.p.sge(0, 0, 64);
  SendWr w = t.p.write_to(1, s, 0);
  EXPECT_EQ(t.p.A().post_send(tx2, w), EINVAL);
  // A flow rule is for a raw packet QP only.
  auto q = t.p.connect();
  uroce_flow_key v{}, m{};
  EXPECT_EQ(t.p.A().create_flow(q.a, 0, v, m), 0u);
  // A destroyed QP's rules go with it.
  Qp* r = raw_qp(t.p, 0);
  ASSERT_NE(flow(t.p.A(), r, kGroupMac, 1), 0u);
  const std::size_t n = t.p.A().flow_count();
  EXPECT_EQ(t.p.A().destroy_qp(r), 0);
  EXPECT_EQ(t.p.A().flow_count(), n - 1);
  const std::uint32_t h = flow(t.p.A(), tx2, kGroupMac, 2);
  EXPECT_EQ(t.p.A().destroy_flow(h), 0);
  EXPECT_EQ(t.p.A().destroy_flow(h), EINVAL);
}

// Microsoft's RSS key and its verification suite ("Verifying the RSS Hash
// Calculation"): IPv4 source, destination, then the TCP ports.
constexpr std::array<std::uint8_t, 40> kMsKey = {
    0x6d, 0x5a, 0x56, 0xda, 0x25, 0x5b, 0x0e, 0xc2, 0x41, 0x67, 0x25, 0x3d, 0x43, 0xa3,
    0x8f, 0xb0, 0xd0, 0xca, 0x2b, 0xcb, 0xae, 0x7b, 0x30, 0xb4, 0x77, 0xcb, 0x2d, 0xa3,
    0x80, 0x30, 0xf2, 0x0c, 0x6a, 0x42, 0xb7, 0x3b, 0xbe, 0xac, 0x01, 0xfa};

TEST(Rss, ToeplitzGivesMicrosoftsPublishedHashes) {
  struct V {
    std::uint8_t in[12];  // source, destination, source port, destination port
    std::uint32_t ip, ip_ports;
  };
  const V v[] = {
      {{66, 9, 149, 187, 161, 142, 100, 80, 2794 >> 8, 2794 & 255, 1766 >> 8, 1766 & 255}, 0x323e8fc2, 0x51ccc178},
      {{199, 92, 111, 2, 65, 69, 140, 83, 14230 >> 8, 14230 & 255, 4739 >> 8, 4739 & 255}, 0xd718262a, 0xc626b0ea},
      {{24, 19, 198, 95, 12, 22, 207, 184, 12898 >> 8, 12898 & 255, 38024 >> 8, 38024 & 255}, 0xd2d0a5de, 0x5c2b394a},
      {{38, 27, 205, 30, 209, 142, 163, 6, 48228 >> 8, 48228 & 255, 2217 >> 8, 2217 & 255}, 0x82989176, 0xafc7327f},
      {{153, 39, 163, 191, 202, 188, 127, 2, 44251 >> 8, 44251 & 255, 1303 >> 8, 1303 & 255}, 0x5d1809c5, 0x10e828a2},
  };
  for (const V& x : v) {
    EXPECT_EQ(transport::toeplitz(kMsKey, std::span<const std::uint8_t>(x.in, 8)), x.ip);
    EXPECT_EQ(transport::toeplitz(kMsKey, std::span<const std::uint8_t>(x.in, 12)), x.ip_ports);
  }
}

TEST(Rss, FramesSpreadOverTheWorkQueuesAsTheHashSays) {
  Raw t;
  Qp* tx = raw_qp(t.p, 0);
  ASSERT_NE(tx, nullptr);
  Engine& b = t.p.B();
  // Four work queues, each with a CQ of its own, and an RSS QP over them
  // hashing the IPv4 addresses; it stays in RESET, as an RSS QP may.
  constexpr int kWqs = 4;
  Cq* cq[kWqs];
  transport::RssConf conf;
  conf.key = kMsKey;
  conf.fields = IBV_RX_HASH_SRC_IPV4 | IBV_RX_HASH_DST_IPV4;
  for (int i = 0; i < kWqs; ++i) {
    cq[i] = b.create_cq(64);
    Srq* wq = b.create_srq(t.p.node[1].pd, 32, 1, nullptr, nullptr, cq[i]);
    ASSERT_NE(wq, nullptr);
    conf.table.push_back(wq);
    for (int k = 0; k < 16; ++k) {
      Sge s = t.p.sge(1, static_cast<std::uint64_t>(i * 16 + k) * 256, 256);
      ASSERT_EQ(b.post_srq_recv(wq, RecvWr{static_cast<std::uint64_t>(i * 16 + k), {&s, 1}}), 0);
    }
  }
  QpInitAttr ia;
  ia.qp_type = IBV_QPT_RAW_PACKET;
  ia.rss = &conf;
  Qp* rss = b.create_qp(t.p.node[1].pd, ia);
  ASSERT_NE(rss, nullptr);
  ASSERT_NE(flow(b, rss, kGroupMac, 5678), 0u);
  // 24 frames from 24 sources: each completes in the CQ of the work queue
  // its hash names, and more than one queue is used.
  int used[kWqs] = {};
  for (std::uint8_t src = 1; src <= 24; ++src) {
    auto f = udp_frame(kGroupMac, 5678, 100);
    f[14 + 12] = 10;
    f[14 + 15] = src;
    const std::uint8_t in[8] = {f[26], f[27], f[28], f[29], f[30], f[31], f[32], f[33]};
    const std::uint32_t want = transport::toeplitz(kMsKey, in) & (kWqs - 1);
    ASSERT_EQ(t.send(0, tx, f), IBV_WC_SUCCESS);
    for (int i = 0; i < kWqs; ++i) {
      ibv_wc wc[4];
      const int n = b.poll_cq(cq[i], std::span<ibv_wc>(wc, 4));
      EXPECT_EQ(n, i == static_cast<int>(want) ? 1 : 0) << "source " << int{src} << ", queue " << i;
      if (n == 1) {
        EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
        EXPECT_EQ(wc[0].byte_len, 100u);
        EXPECT_EQ(wc[0].qp_num, rss->qpn);
        EXPECT_EQ(wc[0].wr_id / 16, static_cast<std::uint64_t>(i)) << "a receive of that queue";
        EXPECT_EQ(std::memcmp(t.p.node[1].mem.data() + wc[0].wr_id * 256, f.data(), f.size()), 0);
        ++used[i];
      }
    }
  }
  EXPECT_GT(std::count_if(used, used + kWqs, [](int n) { return n > 0; }), 1);
  EXPECT_TRUE(t.wb.empty()) << "nothing in the node's own CQ";
  // A work queue in a table is not destroyed, nor its CQ; with the QP gone, both are.
  EXPECT_EQ(b.destroy_srq(conf.table[0]), EBUSY);
  EXPECT_EQ(b.destroy_cq(cq[0]), EBUSY);
  EXPECT_EQ(b.destroy_qp(rss), 0);
  EXPECT_EQ(b.destroy_srq(conf.table[0]), 0);
  EXPECT_EQ(b.destroy_cq(cq[0]), 0);
}

TEST(Rss, WhatIsNotAnRssQpIsRefused) {
  Raw t;
  Engine& b = t.p.B();
  Cq* cq = b.create_cq(16);
  Srq* wq = b.create_srq(t.p.node[1].pd, 8, 1, nullptr, nullptr, cq);
  Srq* plain = b.create_srq(t.p.node[1].pd, 8, 1);
  ASSERT_TRUE(wq && plain);
  transport::RssConf conf;
  conf.key = kMsKey;
  conf.table = {wq, wq, wq};
  QpInitAttr ia;
  ia.qp_type = IBV_QPT_RAW_PACKET;
  ia.rss = &conf;
  EXPECT_EQ(b.create_qp(t.p.node[1].pd, ia), nullptr) << "a table of 3";
  conf.table = {wq, plain};
  EXPECT_EQ(b.create_qp(t.p.node[1].pd, ia), nullptr) << "an SRQ that is no work queue";
  conf.table = {wq, wq};
  ia.qp_type = IBV_QPT_UD;
  EXPECT_EQ(b.create_qp(t.p.node[1].pd, ia), nullptr) << "RSS on a UD QP";
  // A work queue is no QP's SRQ.
  QpInitAttr q;
  q.qp_type = IBV_QPT_RC;
  q.send_cq = q.recv_cq = t.p.node[1].cq;
  q.srq = wq;
  q.cap.max_send_wr = 4;
  EXPECT_EQ(b.create_qp(t.p.node[1].pd, q), nullptr);
  q.srq = plain;
  EXPECT_NE(b.create_qp(t.p.node[1].pd, q), nullptr);
}

}  // namespace
}  // namespace uroce::testing
