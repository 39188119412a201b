// Queue pair state. Requester, responder and completer state are separate
// structs; each is written by one stage only (the completer also moves the
// requester's cursor back on go-back-N, in the same single-threaded
// pipeline), and all of a QP's state is owned by one pipeline.
#pragma once

#include <array>
#include <cstdint>
#include <memory>

#include "stack/cc/cc.h"
#include "stack/transport/counters.h"
#include "stack/transport/objects.h"
#include "stack/transport/fifo.h"
#include "stack/transport/sr.h"
#include "stack/transport/timer_wheel.h"
#include "stack/transport/verbs.h"
#include "stack/wire/addr.h"
#include "stack/wire/header_template.h"
#include "stack/wire/psn.h"

namespace uroce::transport {

/// Packets a message of `len` bytes occupies in PSN space (a READ: its
/// response packets), at a path MTU of `mtu` bytes. The requester and the
/// responder count alike; most messages fit one packet, and they pay no
/// division.
inline std::uint32_t packets_for(std::uint64_t len, std::uint32_t mtu) {
  if (len <= mtu) return 1;
  return static_cast<std::uint32_t>((len + mtu - 1) / mtu);
}

/// kLocal: a WQE that sends nothing (IBV_WR_BIND_MW, IBV_WR_LOCAL_INV). It
/// is executed when the requester reaches it and completes in order.
enum class WqeKind : std::uint8_t { kSend, kWrite, kRead, kAtomic, kLocal };

/// What every send WQE sets, and its progress: the part of a shadow slot
/// that SendWqe::reset() makes new for the next entry.
struct SendWqeHead {
  std::uint64_t wr_id = 0;
  std::uint64_t length = 0;
  std::uint64_t remote_addr = 0;
  ibv_wr_opcode opcode = IBV_WR_SEND;
  unsigned flags = 0;
  std::uint32_t imm = 0;
  std::uint32_t invalidate_rkey = 0;
  std::uint32_t rkey = 0;
  std::uint32_t nsge = 0;
  // Progress
  wire::Psn first_psn{};
  std::uint32_t npkts = 0;           // PSNs this WQE consumes (READ: response packets)
  std::uint32_t read_pkts_done = 0;  // READ response packets received
  std::uint32_t rmsn = 0;            // selective repeat: its receive sequence number (SENDs, WRITEs with immediate)
  /// kLocal, once executed: its completion status (an error completes when
  /// it is the oldest, and the QP goes to ERR).
  ibv_wc_status local_status = IBV_WC_SUCCESS;
  WqeKind kind = WqeKind::kSend;
  bool is_inline = false;
  /// Malformed in the ring: it completes with LOC_QP_OP_ERR when it is the oldest.
  bool refused = false;
  bool started = false;           // PSNs assigned
  bool read_stream_open = false;  // a FIRST (or ONLY) of the current response stream was seen
  /// The engine's own work on the QP, not the application's: a tag-matching
  /// rendezvous (the READ of the data into tag tm_tag of the QP's SRQ, and
  /// the FIN after it). It completes into no CQ, and owns no ring slot.
  bool internal = false;
  std::uint16_t tm_tag = 0;
};

/// The engine's shadow of one send queue entry: its head first, in the
/// lines to_send_wqe() writes; after it the SGEs (only the first nsge are
/// ever written or read), and last what only some operations carry,
/// written only for them. With 10,000 QPs each message's WQE is a cold
/// slot, and every line written is a miss.
struct alignas(64) SendWqe : SendWqeHead {
  Sge sge[kMaxSge]{};
  MemRef local[kMaxSge]{};  // where each SGE's bytes are (MemRef), set when the WQE starts
  // Only some operations: atomics (compare_add, swap), FLUSH (its length
  // in compare_add), binds (bind), UD (ah, remote_qpn, remote_qkey), inline.
  std::uint64_t compare_add = 0;
  std::uint64_t swap = 0;
  MwBind bind{};
  std::uint32_t remote_qpn = 0;
  std::uint32_t remote_qkey = 0;
  std::uint32_t xrc_srqn = 0;  // an XRC send QP's: the XRC SRQ its request is for
  Ah ah{};
  std::uint8_t inline_data[kMaxInline]{};

  /// Ready for the next entry: its head at the defaults (the rest is
  /// written when an operation uses it).
  void reset() { static_cast<SendWqeHead&>(*this) = SendWqeHead{}; }
};

struct Requester {
  std::uint32_t cursor = 0;      // absolute SQ index of the WQE being sent
  std::uint32_t cursor_pkt = 0;  // packet within it
  wire::Psn next_psn{};          // first PSN for the next never-sent WQE
  wire::Psn sent_hi{};           // one past the highest PSN ever sent
  wire::Psn una{};               // oldest PSN not yet acknowledged
  std::uint32_t rd_atomic_inflight = 0;
  std::uint32_t pkts_since_ackreq = 0;
  std::uint64_t retry_deadline = 0;  // 0: timer off
  std::uint64_t rnr_until = 0;       // 0: not waiting out an RNR NAK
  /// Selective repeat: its short (round-trip) timeouts resend for free until
  /// this time, one IBTA timeout after the last progress or the last retry
  /// spent; the first timeout at or after it spends a retry (0: not running).
  std::uint64_t charge_at = 0;
  std::uint8_t retry_left = 0;
  std::uint8_t rnr_left = 0;
  /// A go-back-N restart is under way: later out-of-sequence responses for
  /// the same gap are ignored until progress, so one loss costs one retry.
  bool retry_pending = false;
  /// The next packet restarts go-back-N: it asks for an ACK, and after a
  /// failed retry it is sent twice, so one more loss does not cost a timeout.
  bool restart_ackreq = false;
  bool restart_twice = false;
  /// The pacer: the earliest time (ns) the next request packet may leave
  /// while the QP has a rate (Qp::rate_bps).
  std::uint64_t pace_next = 0;
  /// Round-trip probes: request packets sent for the first time that asked
  /// for an ACK, oldest first, with when they left. Each one's
  /// acknowledgement is a sample; go-back-N voids them all (Karn's rule:
  /// the ACK of a resent packet is ambiguous).
  struct Probe {
    wire::Psn psn{};
    std::uint64_t sent = 0;
  };
  static constexpr std::uint32_t kProbes = 16;
  std::array<Probe, kProbes> probes{};
  std::uint32_t probe_head = 0, probe_count = 0;
};

/// One executed READ or atomic, kept so a duplicate can be answered without
/// executing again (IBTA 9.7.5.1.5).
struct ReplayEntry {
  bool valid = false;
  bool atomic = false;
  wire::Psn psn{};
  std::uint32_t npkts = 0;
  std::uint64_t orig = 0;  // atomic: the value returned
};

/// A response still to be sent. Responses leave in PSN order through one
/// queue, so an ACK or atomic ACK never overtakes READ response packets.
struct RespTx {
  enum class Kind : std::uint8_t { kRead, kAtomicAck, kAck } kind = Kind::kAck;
  wire::Psn psn{};  // PSN of the next packet
  // kRead
  std::uint32_t pkt = 0;  // index of the next packet in this response
  std::uint32_t npkts = 0;
  // Where the data is, as the requester named it: the key is checked again
  // for every packet, so an MR deregistered mid-response is never read.
  std::uint32_t rkey = 0;
  std::uint64_t va = 0;
  std::uint32_t len = 0;
  // kAtomicAck
  std::uint64_t orig = 0;
  // kAck (NAKs and RNR NAKs)
  std::uint8_t syndrome = 0;
};

struct Responder {
  wire::Psn epsn{};  // expected PSN
  std::uint32_t msn = 0;
  bool nak_sent = false;  // a sequence NAK is out for the current gap
  enum class InMsg : std::uint8_t { kNone, kSend, kWrite } in_msg = InMsg::kNone;
  bool uc_drop = false;  // UC: dropping until the next FIRST/ONLY
  // Read on every visit: what is still to be sent, and a coalesced ACK.
  Fifo<RespTx> out{4 * kMaxRdAtomic};
  // A coalesced ACK waiting for the end of the receive burst.
  bool ack_pending = false;
  bool ack_listed = false;  // on the engine's ACK flush list
  wire::Psn ack_psn{};
  // The receive WQE being filled by a multi-packet SEND (or WRITE_WITH_IMM).
  bool have_rwqe = false;
  RecvWqe rwqe{};
  std::uint64_t offset = 0;
  /// On a tag-matching SRQ, what the SEND in hand is (uroce_abi.h): kNone
  /// (no TMH: another SRQ), a NO_TAG one, unexpected (a receive's), or
  /// matched to tag tm_tag (EAGER: its data after the TMH; RNDV: nothing
  /// placed, the READ follows).
  enum class Tm : std::uint8_t { kNone, kNoTag, kUnexpected, kEager, kRndv } tm = Tm::kNone;
  std::uint16_t tm_tag = 0;
  std::uint32_t tm_ctx = 0;     // the TMH's app_ctx
  std::uint64_t tm_msg_tag = 0;
  std::uint64_t rndv_va = 0;    // the RVH
  std::uint32_t rndv_rkey = 0, rndv_len = 0;
  // The WRITE in progress: its rkey and start address, checked again for
  // every packet (an MR deregistered mid-message is never written).
  std::uint32_t wkey = 0;
  std::uint64_t wva = 0;
  std::uint64_t wremain = 0;
  // Last: only READs and atomics touch it.
  std::uint32_t replay_next = 0;
  std::array<ReplayEntry, kMaxRdAtomic> replay{};
};

/// An XRC QP's role (IBTA 9.8.5): an RC QP underneath, whose requests
/// carry an XRCETH (kSend, the initiator), or which takes requests for the
/// XRC SRQs of its domain (kRecv, the target).
enum class Xrc : std::uint8_t { kNone, kSend, kRecv };

class Qp {
 public:
  std::uint32_t qpn = 0;
  ibv_qp_type type = IBV_QPT_RC;  // IBV_QPT_RC for both XRC roles (xrc says which)
  Xrc xrc = Xrc::kNone;
  /// An XRC target's domain. Its pd, recv_cq and srq are those of the XRC
  /// SRQ the request in hand names (from its XRCETH), set as each arrives.
  Xrcd* xrcd = nullptr;
  ibv_qp_state state = IBV_QPS_RESET;
  Pd* pd = nullptr;
  Cq* send_cq = nullptr;
  Cq* recv_cq = nullptr;
  Srq* srq = nullptr;
  /// An RSS QP's hash and table; its srq, recv_cq and pd are those of the
  /// work queue the frame in hand hashed to, set as each arrives.
  std::unique_ptr<RssConf> rss;
  void* owner = nullptr;  // the control plane's tag (its record of the QP), handed back in async events
  /// The work source (a session, pipeline/intake.h) whose work ring may name
  /// this QP; 0 for none.
  std::uint32_t poster = 0;
  /// Nonzero once destroyed: until then (ns) the QPN is held back, and a
  /// retry of a message it already took is ACKed again (QPN quarantine).
  std::uint64_t quarantine_until = 0;
  /// The peer (RC/UC), fixed at RTR: rx checks every frame's source against it.
  wire::IpAddr remote_ip{};

  // What every visit of the poll loop reads (the pacer, the window, the
  // congestion control, the active list and the wheel) sits here, next to
  // the state, in the first lines of the object: with thousands of QPs each
  // line is a cache miss (docs/performance.md).
  /// The pacer's rate for request packets, bits per second of frame bytes
  /// (Ethernet header to ICRC); 0: unpaced. The lower of set_rate's limit
  /// and the congestion control's rate.
  std::uint64_t rate_bps = 0;
  std::uint64_t rate_limit_bps = 0;  // Engine::set_rate's (0: none)
  /// Request packets in flight at most (RC): the engine's send_window, or
  /// the congestion control's window when that is lower.
  std::uint32_t window = 0;
  /// Congestion control (Engine::set_cc); null for "none".
  std::unique_ptr<cc::Algorithm> cc;
  /// Selective repeat (Engine::set_selective_repeat); null: go-back-N.
  std::unique_ptr<SrState> sr;
  // Notification point: when this QP may send its next CNP (ns; 0: at once).
  std::uint64_t cnp_next = 0;
  // Engine bookkeeping: on the active list when it may have work now; in
  // the timer wheel when it waits only on time (its earliest deadline).
  bool active = false;
  std::uint16_t tenant = 0;  // its entry in the engine's transmit share (Engine::set_tenant)
  WheelHook<Qp> wheel;
  std::uint64_t handle = 0;

  bool sq_sig_all = false;  // every send WQE completes (IBV_QP_INIT_ATTR sq_sig_all)
  // Set at create, read by every post (the queue's depth, the SGE limit).
  QpCap cap{};

  // Attributes that govern the wire (ibv_qp_attr names).
  std::uint32_t mtu = 1024;
  ibv_mtu path_mtu = IBV_MTU_1024;
  std::uint32_t dest_qp_num = 0;
  std::uint32_t qkey = 0;
  std::uint8_t timeout = 14;  // 4.096 us * 2^14 = 67 ms
  std::uint8_t retry_cnt = 7;
  std::uint8_t rnr_retry = 7;
  std::uint8_t min_rnr_timer = 12;
  std::uint8_t max_rd_atomic = 1;
  std::uint8_t max_dest_rd_atomic = 1;
  unsigned access = 0;
  std::uint16_t pkey_index = 0;
  std::uint8_t port_num = 1;
  wire::Psn rq_psn{}, sq_psn{};

  /// The send queue: the ring the application posts to (or a heap ring that
  /// post_send fills), and the engine's private shadow of it, slot for slot:
  /// what was taken from the ring and validated, and its progress. An entry
  /// leaves the ring (its slot goes back to the producer) when it completes.
  abi::Ring<uroce_send_entry> sq_ring;
  abi::HeapRing<uroce_send_entry> sq_heap;
  Fifo<SendWqe> sq;
  /// The engine's own WQEs (SendWqeHead::internal) put in the shadow, and
  /// those completed: the ring's index of a shadow slot is the slot's minus
  /// the internal ones before it (0 and 0 but on a tag-matching SRQ's QP).
  std::uint32_t sq_internal_in = 0, sq_internal_out = 0;
  RecvQueue rq;  // unused with an SRQ
  Requester req;
  Responder resp;
  // On cache-line boundaries, so that the counters every packet bumps (the
  // first four) share one line, and the template spans three, not four.
  alignas(64) QpCounters ctr;

  /// Its packets' headers, built at each modify for a connected QP past
  /// INIT (the fields spec_for takes from it); invalid for UD, whose
  /// every datagram has its own destination.
  alignas(64) wire::HeaderTemplate tmpl;

  // Set at RTR, read only when the header template is built or the QP is
  // queried: after everything a packet touches.
  // The peer (RC/UC), fixed at RTR.
  wire::MacAddr remote_mac{};
  std::uint8_t traffic_class = 0;
  std::uint8_t hop_limit = 0;  // 0: the default TTL (64)
  std::uint8_t sl = 0;
  std::uint32_t flow_label = 0;
  std::uint16_t udp_sport = 0;
  // Last, after everything a packet touches: its round trips (a kilobyte of histogram).
  cc::RttStats rtt;
};

/// IBTA C9-140: the transport timer is 4.096 us * 2^timeout; 0 means infinite.
constexpr std::uint64_t timeout_ns(std::uint8_t t) {
  return t == 0 ? 0 : (4096ull << t);
}

/// IBTA table 45: RNR NAK timer field to the delay it encodes.
constexpr std::uint64_t rnr_timer_ns(std::uint8_t code) {
  constexpr std::uint32_t kUs[32] = {655360, 10,    20,    30,    40,    60,    80,    120,   160,   240,  320,
                                     480,    640,   960,   1280,  1920,  2560,  3840,  5120,  7680,  10240, 15360,
                                     20480,  30720, 40960, 61440, 81920, 122880, 163840, 245760, 327680, 491520};
  return std::uint64_t{kUs[code & 31]} * 1000;
}

}  // namespace uroce::transport
