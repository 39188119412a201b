// The one ibv_qp_attr <-> uroce_modify_qp_msg codec and the one bring-up
// sequence (stack/abi/qp_attr.h).
#include <gtest/gtest.h>

#include "stack/abi/qp_attr.h"

namespace uroce::abi {
namespace {

ibv_qp_attr every_field() {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  a.cur_qp_state = IBV_QPS_INIT;
  a.path_mtu = IBV_MTU_4096;
  a.qkey = 0x80010000u;
  a.rq_psn = 0xabcdef;
  a.sq_psn = 0x123456;
  a.dest_qp_num = 0x00fedc;
  a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC;
  for (int i = 0; i < 16; ++i) a.ah_attr.grh.dgid.raw[i] = static_cast<std::uint8_t>(0xf0 + i);
  a.ah_attr.grh.traffic_class = 0x68;
  a.ah_attr.grh.hop_limit = 17;
  a.ah_attr.grh.flow_label = 0xbeef5;
  a.ah_attr.sl = 3;
  a.max_rd_atomic = 9;
  a.max_dest_rd_atomic = 11;
  a.min_rnr_timer = 21;
  a.port_num = 1;
  a.timeout = 19;
  a.retry_cnt = 5;
  a.rnr_retry = 6;
  a.pkey_index = 0;
  return a;
}

TEST(QpAttrCodec, EveryCarriedFieldRoundTrips) {
  const ibv_qp_attr a = every_field();
  const int mask = IBV_QP_STATE | IBV_QP_CUR_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
  const uroce_modify_qp_msg m = to_msg(a, mask, 42);
  EXPECT_EQ(m.qp, 42u);
  int got_mask = 0;
  const ibv_qp_attr b = from_msg(m, got_mask);
  EXPECT_EQ(got_mask, mask);
  EXPECT_EQ(b.qp_state, a.qp_state);
  EXPECT_EQ(b.cur_qp_state, a.cur_qp_state);
  EXPECT_EQ(b.path_mtu, a.path_mtu);
  EXPECT_EQ(b.qkey, a.qkey);
  EXPECT_EQ(b.rq_psn, a.rq_psn);
  EXPECT_EQ(b.sq_psn, a.sq_psn);
  EXPECT_EQ(b.dest_qp_num, a.dest_qp_num);
  EXPECT_EQ(b.qp_access_flags, a.qp_access_flags);
  EXPECT_EQ(0, std::memcmp(b.ah_attr.grh.dgid.raw, a.ah_attr.grh.dgid.raw, 16));
  EXPECT_EQ(b.ah_attr.grh.traffic_class, a.ah_attr.grh.traffic_class);
  EXPECT_EQ(b.ah_attr.grh.hop_limit, a.ah_attr.grh.hop_limit) << "dropped by the old hand copies";
  EXPECT_EQ(b.ah_attr.grh.flow_label, a.ah_attr.grh.flow_label) << "dropped by the old hand copies";
  EXPECT_EQ(b.ah_attr.sl, a.ah_attr.sl) << "dropped by the old hand copies";
  EXPECT_EQ(b.max_rd_atomic, a.max_rd_atomic);
  EXPECT_EQ(b.max_dest_rd_atomic, a.max_dest_rd_atomic);
  EXPECT_EQ(b.min_rnr_timer, a.min_rnr_timer);
  EXPECT_EQ(b.port_num, a.port_num);
  EXPECT_EQ(b.timeout, a.timeout);
  EXPECT_EQ(b.retry_cnt, a.retry_cnt);
  EXPECT_EQ(b.rnr_retry, a.rnr_retry);
  EXPECT_EQ(b.pkey_index, a.pkey_index);
  // And back again: the message is a fixed point.
  const uroce_modify_qp_msg m2 = to_msg(b, got_mask, 42);
  EXPECT_EQ(0, std::memcmp(&m, &m2, sizeof m));
}

TEST(QpAttrCodec, NothingIsDefaultedOrForced) {
  ibv_qp_attr a = every_field();
  a.path_mtu = static_cast<ibv_mtu>(0);  // the old copies turned this into 1024
  a.port_num = 2;                         // and forced this to 1
  int mask = 0;
  const ibv_qp_attr b = from_msg(to_msg(a, IBV_QP_STATE | IBV_QP_PATH_MTU | IBV_QP_PORT, 1), mask);
  EXPECT_EQ(b.path_mtu, 0) << "the engine refuses it (EINVAL), nobody rewrites it";
  EXPECT_EQ(b.port_num, 2);
}

TEST(BringUp, StepsCarryExactlyTheAttributesEachTypeNeeds) {
  Connect c;
  c.type = IBV_QPT_RC;
  auto s = bring_up_steps(c);
  EXPECT_EQ(s[0].attr.qp_state, IBV_QPS_INIT);
  EXPECT_EQ(s[1].attr.qp_state, IBV_QPS_RTR);
  EXPECT_EQ(s[2].attr.qp_state, IBV_QPS_RTS);
  EXPECT_TRUE(s[0].mask & IBV_QP_ACCESS_FLAGS);
  EXPECT_TRUE(s[1].mask & IBV_QP_MAX_DEST_RD_ATOMIC);
  EXPECT_TRUE(s[2].mask & IBV_QP_RETRY_CNT);
  c.type = IBV_QPT_UC;
  s = bring_up_steps(c);
  EXPECT_TRUE(s[1].mask & IBV_QP_AV);
  EXPECT_FALSE(s[1].mask & IBV_QP_MAX_DEST_RD_ATOMIC) << "UC has no READ/atomic responder";
  EXPECT_EQ(s[2].mask, IBV_QP_STATE | IBV_QP_SQ_PSN);
  c.type = IBV_QPT_UD;
  s = bring_up_steps(c);
  EXPECT_TRUE(s[0].mask & IBV_QP_QKEY);
  EXPECT_FALSE(s[0].mask & IBV_QP_ACCESS_FLAGS);
  EXPECT_EQ(s[1].mask, IBV_QP_STATE);
}

TEST(BringUp, StopsAtTheFirstFailureAndNamesIt) {
  int calls = 0;
  const char* failed = nullptr;
  const int rc = bring_up(
      Connect{}, [&](const ibv_qp_attr& a, int) { return ++calls, a.qp_state == IBV_QPS_RTR ? EINVAL : 0; }, &failed);
  EXPECT_EQ(rc, EINVAL);
  EXPECT_EQ(calls, 2);
  EXPECT_STREQ(failed, "RTR");
  calls = 0;
  EXPECT_EQ(bring_up(Connect{}, [&](const ibv_qp_attr&, int) { return ++calls, 0; }, nullptr, true), 0);
  EXPECT_EQ(calls, 2) << "from INIT: RTR and RTS only";
}

}  // namespace
}  // namespace uroce::abi
