// The one encoder of a send entry (uroce_abi.h): liburoce's posts (and so
// every post of the drop-in libibverbs and librdmacm) and the engine's own
// work requests write their entries here, each operation into its own named
// layout. The engine's decoder (Engine::fill_send_wqe) reads the same names,
// after send_entry_ok has checked the entry against its QP.
#pragma once

#include <arpa/inet.h>
#include <infiniband/verbs.h>

#include <cstdint>
#include <cstring>

#include "stack/abi/uroce_abi.h"

namespace uroce::abi {

/// A UD send's address vector, as the poster resolved its address handle.
struct SendAv {
  const std::uint8_t* dgid = nullptr;  // 16 bytes
  const std::uint8_t* dmac = nullptr;  // 6 bytes
  std::uint8_t traffic_class = 0;
};

/// The QP a request is for, as far as its entry's layout depends on it.
struct SendTarget {
  bool ud = false;        // a UD QP: the address vector and remote QP in op.ud
  bool xrc_send = false;  // an XRC send QP: the XRC SRQ in xrc_srqn
};

/// Writes `wr` (verbs' request; imm_data in network order, as verbs has it)
/// as the send entry `e`. `av`: a UD send's address vector. Returns null, or
/// why the request cannot be posted (the poster's EINVAL); the engine's
/// checks against the QP's own limits come later, on every entry alike.
inline const char* encode_send(const ibv_send_wr& wr, SendTarget to, const SendAv* av, uroce_send_entry& e) {
  e = uroce_send_entry{};
  if (wr.num_sge < 0 || wr.num_sge > UROCE_ABI_MAX_SGE) return "too many SGEs";
  e.wr_id = wr.wr_id;
  e.opcode = static_cast<std::uint8_t>(wr.opcode);
  e.num_sge = static_cast<std::uint8_t>(wr.num_sge);
  e.send_flags = static_cast<std::uint16_t>(wr.send_flags);
  const std::uint32_t xrc_srqn = to.xrc_send ? wr.qp_type.xrc.remote_srqn : 0;
  bool data = true;  // whether sg_list carries the request's data
  switch (static_cast<int>(wr.opcode)) {
    case IBV_WR_BIND_MW: {
      if (wr.bind_mw.mw == nullptr) return "a bind names no memory window";
      const ibv_mw_bind_info& b = wr.bind_mw.bind_info;
      e.imm_or_inv = wr.bind_mw.mw->rkey;
      e.op.bind.addr = b.addr;
      e.op.bind.new_rkey = wr.bind_mw.rkey;
      e.op.bind.mr_lkey = b.mr ? b.mr->lkey : 0;
      e.op.bind.length = b.length;
      e.op.bind.access = b.mw_access_flags;
      e.num_sge = 0;
      e.send_flags &= static_cast<std::uint16_t>(~IBV_SEND_INLINE);
      return nullptr;
    }
    case IBV_WR_LOCAL_INV:
      e.imm_or_inv = wr.invalidate_rkey;
      e.num_sge = 0;
      e.send_flags &= static_cast<std::uint16_t>(~IBV_SEND_INLINE);
      return nullptr;
    case UROCE_WR_FLUSH:
      // rdma-core 44's request has no FLUSH fields: the atomic ones carry it
      // (uroce_verbs.h). No data: whatever sg_list holds is not read.
      e.op.flush.remote_addr = wr.wr.atomic.remote_addr;
      e.op.flush.rkey = wr.wr.atomic.rkey;
      e.op.flush.length = wr.wr.atomic.compare_add;
      e.op.flush.xrc_srqn = xrc_srqn;
      e.imm_or_inv = static_cast<std::uint32_t>(wr.wr.atomic.swap);
      data = false;
      break;
    case IBV_WR_ATOMIC_CMP_AND_SWP:
    case IBV_WR_ATOMIC_FETCH_AND_ADD:
      if (to.ud) break;  // refused by the engine, as verbs refuses it
      e.op.atomic.remote_addr = wr.wr.atomic.remote_addr;
      e.op.atomic.rkey = wr.wr.atomic.rkey;
      e.op.atomic.compare_add = wr.wr.atomic.compare_add;
      e.op.atomic.swap = wr.wr.atomic.swap;
      e.op.atomic.xrc_srqn = xrc_srqn;
      break;
    default:
      if (to.ud) break;
      e.op.rdma.remote_addr = wr.wr.rdma.remote_addr;
      e.op.rdma.rkey = wr.wr.rdma.rkey;
      e.op.rdma.xrc_srqn = xrc_srqn;
      break;
  }
  if (wr.opcode == IBV_WR_SEND_WITH_IMM || wr.opcode == IBV_WR_RDMA_WRITE_WITH_IMM) e.imm_or_inv = ntohl(wr.imm_data);
  if (wr.opcode == IBV_WR_SEND_WITH_INV) e.imm_or_inv = wr.invalidate_rkey;
  if (to.ud) {
    if (av == nullptr || av->dgid == nullptr || av->dmac == nullptr) return "a UD send needs an address handle from ibv_create_ah";
    std::memcpy(e.op.ud.dmac, av->dmac, 6);
    e.op.ud.traffic_class = av->traffic_class;
    e.op.ud.remote_qpn = wr.wr.ud.remote_qpn;
    std::memcpy(e.op.ud.dgid, av->dgid, 16);
    e.op.ud.remote_qkey = wr.wr.ud.remote_qkey;
  }
  if (!data) return nullptr;
  if (wr.send_flags & IBV_SEND_INLINE) {
    // The bytes go in the entry, in place of its SGEs: the buffers may be
    // reused as soon as the post returns, and need no MR.
    std::size_t len = 0;
    for (int i = 0; i < wr.num_sge; ++i) len += wr.sg_list[i].length;
    if (len > UROCE_ABI_MAX_INLINE) return "inline data over 64 bytes (max_inline_data)";
    auto* out = reinterpret_cast<std::uint8_t*>(e.sg_list);
    for (int i = 0; i < wr.num_sge; ++i) {
      std::memcpy(out, reinterpret_cast<const void*>(wr.sg_list[i].addr), wr.sg_list[i].length);
      out += wr.sg_list[i].length;
    }
    e.num_sge = 0;
    e.inline_len = static_cast<std::uint32_t>(len);
  } else {
    for (int i = 0; i < wr.num_sge; ++i) e.sg_list[i] = {wr.sg_list[i].addr, wr.sg_list[i].length, wr.sg_list[i].lkey};
  }
  return nullptr;
}

}  // namespace uroce::abi
