// ibv_qp_attr, once: the codec between rdma-core's ibv_qp_attr and the
// session protocol's uroce_modify_qp_msg (MODIFY_QP requests, QUERY
// replies), and the one RESET -> INIT -> RTR -> RTS bring-up sequence that
// every caller uses -- the CM agent, liburoce's uroce_connect_qp, the
// uroce-traffic, the benches and the tests -- whether it modifies through
// the engine or through liburoce.
#pragma once

#include <infiniband/verbs.h>

#include <array>
#include <cstdint>
#include <cstring>

#include "stack/abi/session_proto.h"

namespace uroce::abi {

/// A RoCE port's active MTU for an Ethernet MTU, as Linux sizes it: the
/// largest IB MTU whose packets fit with the most headers a RoCE packet
/// carries (GRH-sized IP header, UDP, BTH, the largest extension, ICRC: 96
/// bytes). 1500 gives 1024, 4200 and up 4096; 0 (unknown) gives 4096.
/// What ibv_query_port reports, and a UD message's largest size.
constexpr ibv_mtu roce_active_mtu(std::uint32_t eth_mtu) {
  if (eth_mtu == 0) return IBV_MTU_4096;
  const std::uint32_t room = eth_mtu > 96 ? eth_mtu - 96 : 0;
  return room >= 4096 ? IBV_MTU_4096 : room >= 2048 ? IBV_MTU_2048 : room >= 1024 ? IBV_MTU_1024
         : room >= 512 ? IBV_MTU_512 : IBV_MTU_256;
}

/// ibv_qp_attr (with its mask) as a message. Every field the message has
/// room for travels, whether or not the mask names it; the receiver
/// decides by the mask, as ibv_modify_qp does.
inline uroce_modify_qp_msg to_msg(const ibv_qp_attr& a, int mask, std::uint32_t qp_handle) {
  uroce_modify_qp_msg m{};
  m.qp = qp_handle;
  m.mask = mask;
  m.qp_state = a.qp_state;
  m.path_mtu = a.path_mtu;
  m.qkey = a.qkey;
  m.rq_psn = a.rq_psn;
  m.sq_psn = a.sq_psn;
  m.dest_qp_num = a.dest_qp_num;
  m.qp_access_flags = a.qp_access_flags;
  std::memcpy(m.dgid, a.ah_attr.grh.dgid.raw, 16);
  m.traffic_class = a.ah_attr.grh.traffic_class;
  m.hop_limit = a.ah_attr.grh.hop_limit;
  m.flow_label = a.ah_attr.grh.flow_label;
  m.sl = a.ah_attr.sl;
  m.max_rd_atomic = a.max_rd_atomic;
  m.max_dest_rd_atomic = a.max_dest_rd_atomic;
  m.min_rnr_timer = a.min_rnr_timer;
  m.port_num = a.port_num;
  m.timeout = a.timeout;
  m.retry_cnt = a.retry_cnt;
  m.rnr_retry = a.rnr_retry;
  m.pkey_index = a.pkey_index;
  m.cur_qp_state = a.cur_qp_state;
  return m;
}

/// The message back as ibv_qp_attr (and its mask). Nothing is defaulted or
/// forced: what the sender gave is what the engine checks.
inline ibv_qp_attr from_msg(const uroce_modify_qp_msg& m, int& mask) {
  ibv_qp_attr a{};
  mask = m.mask;
  a.qp_state = static_cast<ibv_qp_state>(m.qp_state);
  a.cur_qp_state = static_cast<ibv_qp_state>(m.cur_qp_state);
  a.path_mtu = static_cast<ibv_mtu>(m.path_mtu);
  a.qkey = m.qkey;
  a.rq_psn = m.rq_psn;
  a.sq_psn = m.sq_psn;
  a.dest_qp_num = m.dest_qp_num;
  a.qp_access_flags = m.qp_access_flags;
  a.ah_attr.is_global = 1;  // RoCE: every address is a GID
  std::memcpy(a.ah_attr.grh.dgid.raw, m.dgid, 16);
  a.ah_attr.grh.traffic_class = m.traffic_class;
  a.ah_attr.grh.hop_limit = m.hop_limit;
  a.ah_attr.grh.flow_label = m.flow_label;
  a.ah_attr.sl = m.sl;
  a.ah_attr.port_num = m.port_num;
  a.max_rd_atomic = m.max_rd_atomic;
  a.max_dest_rd_atomic = m.max_dest_rd_atomic;
  a.min_rnr_timer = m.min_rnr_timer;
  a.port_num = m.port_num;
  a.timeout = m.timeout;
  a.retry_cnt = m.retry_cnt;
  a.rnr_retry = m.rnr_retry;
  a.pkey_index = m.pkey_index;
  return a;
}

/// What RESET -> INIT -> RTR -> RTS needs. Zero fields take the defaults
/// shown (liburoce's uroce_rc_conn says the same).
struct Connect {
  ibv_qp_type type = IBV_QPT_RC;
  std::uint32_t dest_qp_num = 0;  // RC/UC
  ibv_gid dgid{};                 // RC/UC
  std::uint32_t rq_psn = 0;       // the peer's sq_psn
  std::uint32_t sq_psn = 0;
  ibv_mtu path_mtu = IBV_MTU_1024;
  unsigned access = 0;      // RC/UC: IBV_ACCESS_REMOTE_*
  std::uint32_t qkey = 0;   // UD
  std::uint8_t timeout = 14;  // 4.096 us * 2^14 = 67 ms
  std::uint8_t retry_cnt = 7;
  std::uint8_t rnr_retry = 7;
  std::uint8_t min_rnr_timer = 12;
  std::uint8_t max_rd_atomic = 4;
  std::uint8_t max_dest_rd_atomic = 4;
  std::uint8_t traffic_class = 0;
  std::uint8_t hop_limit = 0;  // 0: the stack's default (64)
};

struct Step {
  ibv_qp_attr attr{};
  int mask = 0;
  const char* to = "";  // "INIT", "RTR", "RTS": for error messages
};

/// The three modify_qp calls of a bring-up, each with exactly the
/// attributes IBTA table 91 requires for the QP's type.
inline std::array<Step, 3> bring_up_steps(const Connect& c) {
  const bool ud = c.type == IBV_QPT_UD, rc = c.type == IBV_QPT_RC;
  std::array<Step, 3> s{};
  ibv_qp_attr& i = s[0].attr;
  i.qp_state = IBV_QPS_INIT;
  i.port_num = 1;
  i.pkey_index = 0;
  i.qp_access_flags = c.access;
  i.qkey = c.qkey;
  s[0].mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | (ud ? IBV_QP_QKEY : IBV_QP_ACCESS_FLAGS);
  s[0].to = "INIT";
  ibv_qp_attr& r = s[1].attr;
  r.qp_state = IBV_QPS_RTR;
  s[1].mask = IBV_QP_STATE;
  s[1].to = "RTR";
  if (!ud) {
    r.path_mtu = c.path_mtu;
    r.dest_qp_num = c.dest_qp_num;
    r.rq_psn = c.rq_psn;
    r.ah_attr.is_global = 1;
    r.ah_attr.port_num = 1;
    r.ah_attr.grh.dgid = c.dgid;
    r.ah_attr.grh.traffic_class = c.traffic_class;
    r.ah_attr.grh.hop_limit = c.hop_limit;
    s[1].mask |= IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
    if (rc) {
      r.max_dest_rd_atomic = c.max_dest_rd_atomic;
      r.min_rnr_timer = c.min_rnr_timer;
      s[1].mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
    }
  }
  ibv_qp_attr& t = s[2].attr;
  t.qp_state = IBV_QPS_RTS;
  t.sq_psn = c.sq_psn;
  s[2].mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
  s[2].to = "RTS";
  if (rc) {
    t.timeout = c.timeout;
    t.retry_cnt = c.retry_cnt;
    t.rnr_retry = c.rnr_retry;
    t.max_rd_atomic = c.max_rd_atomic;
    s[2].mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
  }
  return s;
}

/// Runs the bring-up through `modify(const ibv_qp_attr&, int mask)`, which
/// returns 0 or an errno; stops at the first failure and returns it, with
/// `failed` naming the state it did not reach. `from_init`: the QP is in
/// INIT already (the CM moves a QP there before it knows its peer).
template <typename Modify>
int bring_up(const Connect& c, Modify&& modify, const char** failed = nullptr, bool from_init = false) {
  for (const Step& s : bring_up_steps(c)) {
    if (from_init && s.attr.qp_state == IBV_QPS_INIT) continue;
    if (const int rc = modify(s.attr, s.mask)) {
      if (failed) *failed = s.to;
      return rc;
    }
  }
  return 0;
}

}  // namespace uroce::abi
