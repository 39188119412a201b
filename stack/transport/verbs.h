// The verbs vocabulary of the engine. Enums and the completion and QP
// attribute structs are rdma-core's own (infiniband/verbs.h), so a verbs
// programmer reads the same names; work requests are our own plain structs,
// because ibv_send_wr points at provider objects (ibv_ah) we do not have.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <span>

#include "stack/abi/ring.h"
#include "stack/wire/addr.h"
#include "stack/wire/headers.h"

namespace uroce::transport {

inline constexpr std::uint32_t kMaxSge = 4;
/// Inline bytes a send WR may carry: what a ring entry holds in place of its SGEs.
inline constexpr std::uint32_t kMaxInline = UROCE_ABI_MAX_INLINE;
inline constexpr std::uint32_t kMaxRdAtomic = 16;
inline constexpr std::uint32_t kMaxMessage = 1u << 31;  // IBTA: 2^31 bytes
/// Bytes of the Global Route Header area at the start of a UD receive buffer.
inline constexpr std::uint32_t kGrhBytes = 40;

struct Sge {
  std::uint64_t addr = 0;
  std::uint32_t length = 0;
  std::uint32_t lkey = 0;
};

/// An address handle for UD: where to send.
struct Ah {
  wire::IpAddr dgid{};
  wire::MacAddr dmac{};
  std::uint8_t traffic_class = 0;
};

struct SendWr {
  std::uint64_t wr_id = 0;
  ibv_wr_opcode opcode = IBV_WR_SEND;
  unsigned send_flags = 0;  // IBV_SEND_SIGNALED | FENCE | INLINE | SOLICITED
  std::span<const Sge> sg_list{};
  std::uint32_t imm_data = 0;         // host order; sent big-endian
  std::uint32_t invalidate_rkey = 0;  // IBV_WR_SEND_WITH_INV, IBV_WR_LOCAL_INV
  // RDMA and atomics
  std::uint64_t remote_addr = 0;
  std::uint32_t rkey = 0;
  std::uint64_t compare_add = 0;
  std::uint64_t swap = 0;
  // IBV_WR_BIND_MW: the window, its new R_Key, the MR and the range
  // (IBV_WR_LOCAL_INV takes its key from invalidate_rkey)
  std::uint32_t bind_mw_rkey = 0;
  std::uint32_t bind_new_rkey = 0;
  std::uint32_t bind_mr_lkey = 0;
  std::uint64_t bind_addr = 0;
  std::uint64_t bind_length = 0;
  unsigned bind_access = 0;
  // UD
  const Ah* ah = nullptr;
  std::uint32_t remote_qpn = 0;
  std::uint32_t remote_qkey = 0;
  std::uint32_t xrc_srqn = 0;  // an XRC send QP's: the XRC SRQ at the target (qp_type.xrc.remote_srqn)
};

struct RecvWr {
  std::uint64_t wr_id = 0;
  std::span<const Sge> sg_list{};
};

/// Capacities fixed at QP creation (ibv_qp_init_attr.cap).
struct QpCap {
  std::uint32_t max_send_wr = 128;
  std::uint32_t max_recv_wr = 128;
  std::uint32_t max_send_sge = kMaxSge;
  std::uint32_t max_recv_sge = kMaxSge;
  std::uint32_t max_inline_data = kMaxInline;
};

class Cq;
class Srq;
struct Pd;
struct Xrcd;
struct RssConf;

struct QpInitAttr {
  /// RC, UC, UD, RAW_PACKET, or XRC: IBV_QPT_XRC_SEND (a PD and a send CQ;
  /// no receive side) or IBV_QPT_XRC_RECV (xrcd alone: no PD, CQs or queues).
  ibv_qp_type qp_type = IBV_QPT_RC;
  Cq* send_cq = nullptr;
  Cq* recv_cq = nullptr;
  Srq* srq = nullptr;
  Xrcd* xrcd = nullptr;  // IBV_QPT_XRC_RECV
  /// RAW_PACKET with receive-side scaling: receive only (no CQs, no
  /// queues); its frames go to the table's work queues (copied).
  const RssConf* rss = nullptr;
  QpCap cap{};
  bool sq_sig_all = false;
  /// The General Services Interface QP: UD, QP number 1, Q_Key 0x80010000
  /// (IBTA 13.5.1; the CM's MADs travel on it). One per engine.
  bool gsi = false;
  /// Rings an application shares (laid out by the caller, mapped for the
  /// QP's life); without them the QP's queues are placed in the heap.
  const abi::Ring<uroce_send_entry>* sq_ring = nullptr;
  const abi::Ring<uroce_recv_entry>* rq_ring = nullptr;
};

inline constexpr std::uint32_t kGsiQpn = 1;
inline constexpr std::uint32_t kGsiQkey = 0x80010000u;
/// The one partition: every QP is a full member of the default P_Key.
inline constexpr std::uint16_t kDefaultPkey = 0xffff;

/// Bytes in an IBTA MTU enum value, or 0 if it is not one.
constexpr std::uint32_t mtu_bytes(ibv_mtu m) {
  switch (m) {
    case IBV_MTU_256: return 256;
    case IBV_MTU_512: return 512;
    case IBV_MTU_1024: return 1024;
    case IBV_MTU_2048: return 2048;
    case IBV_MTU_4096: return 4096;
  }
  return 0;
}

const char* to_string(ibv_qp_state s);
const char* to_string(ibv_wc_status s);

}  // namespace uroce::transport
