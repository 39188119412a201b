// The transport engine: verbs objects plus the RC/UC/UD requester,
// responder and completer for one port, on an injected clock.
//
// Frames come in through rx() and go out through a TX ring that the driver
// drains with drain_tx(). Time is whatever the caller passes as `now` (ns),
// so tests run on a virtual clock. Nothing here knows about DPDK, and nothing
// on the data path (rx, poll, drain_tx, post_*, poll_cq) allocates, locks or
// throws: every queue is a fixed ring sized when its object is created.
//
// The class is split into one file per role or concern, as rxe and eRPC
// do. The roles: requester.cc, responder.cc, completer.cc, selective.cc
// (selective repeat), raw.cc (raw packet QPs, flow rules) and tm.cc (tag
// matching). The rest: engine.cc (construction, QPs by number, totals),
// engine_objects.cc (verbs objects, QP creation and quarantine),
// engine_qp_state.cc (the QP state machine), engine_post.cc (work requests
// in), engine_completions.cc (completions out, the flush in ERR),
// engine_tx.cc (TX framing), engine_rx.cc (receive dispatch, multicast),
// engine_poll.cc (the poll loop, the timer wheel), engine_tx_share.cc
// (tenants' transmit share) and engine_congestion.cc (CNPs, congestion
// control hooked up).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "stack/abi/qp_attr.h"
#include "stack/abi/session_proto.h"
#include "stack/transport/counters.h"
#include "stack/transport/qpn_space.h"
#include "stack/transport/objects.h"
#include "stack/transport/qp.h"
#include "stack/transport/fifo.h"
#include "stack/transport/neighbor_table.h"
#include "stack/transport/verbs.h"
#include "stack/wire/builder.h"
#include "stack/wire/parser.h"

namespace uroce::transport {

struct EngineConfig {
  wire::MacAddr mac{};
  wire::IpAddr ip{};
  std::uint32_t max_qps = 1024;
  std::uint32_t max_mrs = 4096;
  std::uint32_t tx_ring = 1024;
  std::uint32_t send_window = 512;  // RC packets in flight per QP
  std::uint32_t ackreq_every = 16;  // AckReq at least every N packets
  std::uint8_t dscp = 0;
  std::uint8_t ecn = 2;  // ECT(0) on data by default
  /// The notification point (IBTA A17.9.2): a CE-marked packet of an RC or
  /// UC QP makes a CNP to the peer QP, at most one per QP per interval
  /// (the DCQCN paper's 50 us); 0 sends none. CNPs carry cnp_dscp (48, as
  /// mlx5's cnp_dscp default and the ConnectX-4 Lx CNP in the captures).
  std::uint64_t cnp_interval_ns = 50'000;
  std::uint8_t cnp_dscp = 48;
  std::uint16_t vlan_tci = 0;  // 802.1Q tag on every frame; 0 = untagged
  /// Sharding: the QPNs this engine owns (qpn_space.h), so several engines
  /// (one per lcore) can share a port without overlap.
  QpnSpace qpns{};
  /// The port computes IPv4 header checksums (TX offload): frames leave the
  /// engine with the field zero. (It is not covered by the ICRC.)
  bool ipv4_checksum_offload = false;
  std::uint64_t seed = 1;
  /// The congestion control every new RC and UC QP starts with (a name in
  /// cc::registry(); set_cc changes one QP's), and the port's rate it
  /// starts from.
  std::string cc = "none";
  std::uint64_t line_rate_bps = 100'000'000'000;
  /// The unloaded round trip of the port's paths, for delay-based
  /// algorithms (0: each QP measures its own, the smallest sample).
  std::uint64_t base_rtt_ns = 0;
  /// Selective repeat's cap on a QP's packets in flight (IRN's BDP-FC: about
  /// a bandwidth-delay product); 0 or more than 256: 256, what a SACK spans.
  std::uint32_t sr_window = 0;
  /// A UD message's largest size, in bytes: the port's active MTU
  /// (abi::roce_active_mtu of the link's Ethernet MTU), as rxe takes it.
  std::uint32_t ud_mtu = 4096;
  /// Multicast attachments (a UD QP in a group), all QPs together: the
  /// table is this size from the start (no allocation when one attaches).
  std::uint32_t max_mcast_attach = 1024;
  std::uint32_t max_flows = 256;  // raw packet QPs' flow rules, in all
  /// The transmit share between tenants (set_tenant): deficit round robin
  /// over frame bytes on the wire, `tx_quantum` bytes times a tenant's
  /// weight a round. Tenants beyond max_tenants share one entry.
  std::uint32_t max_tenants = 256;
  std::uint32_t tx_quantum = 4096;
};

/// One tenant's transmit share and what it sent (Engine::tenant_report),
/// counted while two or more tenants hold QPs (the share is metered then).
struct TenantReport {
  std::uint32_t uid = 0, weight = 1, qps = 0;
  std::uint64_t tx_bytes = 0, tx_frames = 0;
  std::uint64_t throttled = 0;  // times one of its QPs stopped at the end of its share
};

/// A QP's congestion control as telemetry shows it (Engine::cc_report).
struct CcReport {
  std::string_view algorithm;
  cc::State state;
  std::uint64_t pace_bps = 0;  // the pacer's rate now (0: unpaced)
  std::uint32_t window = 0;    // packets in flight allowed now
  std::uint64_t rtt_samples = 0, rtt_min_ns = 0, rtt_mean_ns = 0, rtt_p99_ns = 0;
};

/// A frame queued for transmission: headers in place, payload by reference
/// into registered memory (no copy), then pad and ICRC. A driver sends it as
/// a scatter-gather list, or flattens it with copy_to().
struct TxFrame {
  static constexpr std::size_t kMaxHdr = 128;
  static constexpr std::size_t kMaxPayload = 4096;  // the largest MTU
  static constexpr std::size_t kMaxRawFrame = kMaxHdr + kMaxPayload;  // a raw packet QP's largest frame
  std::uint8_t hdr[kMaxHdr];
  std::uint16_t hdr_len = 0;
  struct Seg {
    const std::uint8_t* p;
    std::uint32_t len;
  } seg[kMaxSge + 1];
  std::uint8_t nseg = 0;
  std::uint8_t trailer[8];  // pad (0..3 zero bytes) then ICRC
  std::uint8_t trailer_len = 0;
  std::uint8_t inline_buf[kMaxInline];  // payload copied here when it is not in an MR
  bool bounced = false;  // a segment is in the engine's ODP bounce buffer, reused with the slot: copy it out
  bool raw = false;      // a raw packet QP's frame: sent as the application wrote it (no checksum offload)
  // What the fault injector and tests may want to know without parsing.
  std::uint32_t qpn = 0;
  wire::Psn psn{};
  std::uint8_t opcode = 0;

  [[nodiscard]] std::size_t size() const {
    std::size_t n = hdr_len + trailer_len;
    for (std::uint8_t i = 0; i < nseg; ++i) n += seg[i].len;
    return n;
  }
  /// Flattens into `out`; returns the length, or 0 if it does not fit.
  std::size_t copy_to(wire::Bytes out) const;
};

/// What Engine::rx did with a frame.
/// What became of a received frame: each verdict but kToQp, kQuarantined
/// and kRaw is exactly one drop counter, named beside it.
enum class RxVerdict : std::uint8_t {
  kToQp,         // handed to a QP's responder or completer
  kQuarantined,  // for a destroyed QP in quarantine (re-ACKed or dropped)
  kCnp,          // a CNP for a live QP, from its peer (rx_cnp; its congestion control reacts)
  kCnpDropped,   // a CNP for no live QP or from another host (rx_cnp_dropped)
  kNotRoce,      // not RoCEv2 at all: the caller's (rx_not_roce)
  kWrongVlan,    // another VLAN's, or tagged where the port is untagged (rx_wrong_vlan)
  kMalformed,    // rx_malformed
  kBadIcrc,      // rx_icrc_err
  kWrongDst,     // rx_wrong_dst
  kUnknownQp,    // rx_unknown_qp
  kBadState,     // rx_bad_state
  kBadPkey,      // rx_bad_pkey
  kWrongPeer,    // rx_wrong_peer
  kWrongTransport,  // an opcode of another transport than the QP's (rx_wrong_transport)
  kRaw,          // not RoCEv2, and a flow rule steered it to a raw packet QP (rx_raw)
};

struct ModifyResult {
  int err = 0;                 // 0 or an errno value
  const char* why = "";        // a clear reason when err != 0
  explicit operator bool() const { return err == 0; }
};

class Engine {
 public:
  explicit Engine(const EngineConfig& cfg);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // ---- Verbs objects (control path; may allocate) ----
  Pd* alloc_pd();
  int dealloc_pd(Pd* pd);  // EBUSY while in use
  Mr* reg_mr(Pd* pd, void* addr, std::uint64_t len, unsigned access);
  /// Registers memory that the application (and its peers) address as
  /// [iova, iova+len) but that sits at `addr` for the engine, e.g. a shared
  /// mapping at another address in the daemon.
  Mr* reg_mr_iova(Pd* pd, void* addr, std::uint64_t len, unsigned access, std::uint64_t iova);
  /// An ODP MR (on-demand paging): the application's [app_addr, +len),
  /// none of it shared or pinned, each access made through its memory file
  /// `mem_fd` when it happens (MemRef). The whole address space with
  /// app_addr 0 and len UINT64_MAX (implicit ODP; iova 0). Peers and SGEs
  /// address app_addr's byte as iova. The caller keeps mem_fd
  /// open for the MR's life.
  Mr* reg_mr_odp(Pd* pd, std::uint64_t app_addr, std::uint64_t len, std::uint64_t iova, unsigned access, int mem_fd);
  int dereg_mr(Mr* mr);  // EBUSY while memory windows are bound to it
  /// ibv_rereg_mr in place, keeping the keys: `flags` is IBV_REREG_MR_CHANGE_*
  /// (at least one); `pd` with CHANGE_PD, `access` with CHANGE_ACCESS, and
  /// addr, len, iova (as for reg_mr_iova) with CHANGE_TRANSLATION. 0, EINVAL
  /// (a bad flag, PD, access or range) or EBUSY (windows are bound to it).
  int rereg_mr(Mr* mr, int flags, Pd* pd, unsigned access, void* addr, std::uint64_t len, std::uint64_t iova);
  /// A memory window (IBTA 10.6.7) of IBV_MW_TYPE_1 or _2, unbound; it
  /// is bound by an IBV_WR_BIND_MW work request, and shares the MRs' key
  /// table (and its capacity).
  Mr* alloc_mw(Pd* pd, unsigned type);
  int dealloc_mw(Mr* mw);
  /// `shared`: the ring an application consumes (see Cq); else a heap ring.
  Cq* create_cq(std::uint32_t cqe, const abi::Ring<uroce_cq_entry>* shared = nullptr);
  int destroy_cq(Cq* cq);  // EBUSY while a QP uses it
  /// A basic SRQ, or with `xrcd` an XRC SRQ, whose receives complete in
  /// `cq` and which XRC requests name by its srq_num().
  Srq* create_srq(Pd* pd, std::uint32_t max_wr, std::uint32_t max_sge,
                  const abi::Ring<uroce_recv_entry>* shared = nullptr, Xrcd* xrcd = nullptr, Cq* cq = nullptr);
  int destroy_srq(Srq* srq);
  /// Every new RC and UC QP's congestion control from now on (a reload);
  /// false, and nothing changed, for a name the registry does not know.
  bool set_default_cc(const std::string& name) {
    if (cc::find(name) == nullptr) return false;
    cfg_.cc = name;
    return true;
  }
  /// Makes a basic SRQ a tag-matching one (uroce_abi.h: tag matching):
  /// `max_tags` tags, operations taken from `ops` and completed in `cq`,
  /// and `released` (max_tags words the application reads) written as tags
  /// leave the list. False for bad arguments.
  bool make_tm(Srq* srq, Cq* cq, std::uint32_t max_tags, const abi::Ring<uroce_tm_op>& ops, std::uint32_t* released);
  /// Runs the operations posted to a tag-matching SRQ since the last call
  /// (at most a ring's worth); how many.
  std::size_t run_tm_ops(Srq& srq);
  Xrcd* alloc_xrcd();
  int dealloc_xrcd(Xrcd* x);  // EBUSY while an XRC SRQ or target QP is in it
  Qp* create_qp(Pd* pd, const QpInitAttr& attr);
  int destroy_qp(Qp* qp);
  ModifyResult modify_qp(Qp* qp, const ibv_qp_attr& attr, int mask);
  int query_qp(const Qp* qp, ibv_qp_attr& attr) const;
  /// Paces the QP's request packets to `bits_per_s` of frame bytes (0: no
  /// pacing): in any interval of T ns it sends at most T x rate plus one
  /// frame. No timer of its own: the requester waits while the next
  /// packet's time has not come, and next_deadline() says when it has.
  int set_rate(Qp* qp, std::uint64_t bits_per_s);
  /// Puts a QP in tenant `uid`'s transmit share, of weight `weight` (1 to
  /// kMaxWeight; the tenant's weight for all its QPs). While QPs of two or
  /// more tenants exist, poll() serves them by deficit round robin: each
  /// tenant sends about its weight's share of the frame bytes when several
  /// have work, and all there is room for when only one has. QPs never put
  /// in one share tenant 0 (the engine's own, and embedded use).
  int set_tenant(Qp* qp, std::uint32_t uid, std::uint32_t weight);
  /// A tenant's new weight (a reload); false when it holds no QP.
  bool set_tenant_weight(std::uint32_t uid, std::uint32_t weight);
  static constexpr std::uint32_t kMaxWeight = 1000;
  /// Calls fn(const TenantReport&) for every tenant holding QPs.
  template <typename F>
  void for_each_tenant(F&& fn) const {
    for (const std::uint16_t i : live_) fn(static_cast<const TenantReport&>(tenants_[i]));
  }
  /// Gives a QP the congestion control of that name (a fresh one; "none"
  /// removes it): 0, EINVAL (no such QP or algorithm) or EOPNOTSUPP (an
  /// algorithm that needs ACKs, for a UD QP: cc::Entry::ud). Control path:
  /// it allocates.
  /// The pacer then runs at the lower of set_rate's rate and the
  /// algorithm's, and the window is the lower of send_window and its.
  int set_cc(Qp* qp, std::string_view name);
  /// Selective repeat (IRN-style, uroce peers only) for an RC QP, set on
  /// both ends before RTR: 0, EINVAL, EOPNOTSUPP (not RC, or with an SRQ)
  /// or EBUSY (past INIT). Such a QP sends SENDs and WRITEs (with or without
  /// immediate) as self-describing packets, placed however they arrive, and
  /// resends only what selective acknowledgements show missing; every other
  /// operation (READs, atomics, ...) goes fenced in IBTA's opcodes, with
  /// go-back-N recovery. Off (the default): IBTA go-back-N.
  int set_selective_repeat(Qp* qp, bool on);
  /// The QP's rate, window, algorithm state and round-trip statistics.
  [[nodiscard]] CcReport cc_report(const Qp& qp) const;
  /// RESET (or INIT) -> INIT -> RTR -> RTS with abi::bring_up_steps, the
  /// one bring-up sequence every caller uses.
  ModifyResult bring_up(Qp* qp, const abi::Connect& c);
  /// The port's one neighbour table (the ARP/ND handler writes it; RTR and
  /// UD read it).
  NeighborTable& neighbors() { return neighbors_; }
  /// A static entry in it (configuration, tests).
  void set_neighbor(const wire::IpAddr& ip, const wire::MacAddr& mac) { neighbors_.add_static(ip, mac); }
  /// Sends an ARP request or neighbour solicitation (the pipeline's).
  using Resolver = void (*)(void* ctx, const wire::IpAddr& ip);
  void set_resolver(Resolver fn, void* ctx) {
    resolver_ = fn;
    resolver_ctx_ = ctx;
  }
  /// Someone needs ip's MAC until `until` (ns, as `now`): asked at once if
  /// nobody was waiting, then again on poll() on a backoff while anybody
  /// waits (neighbor_table.h). The caller looks neighbor() up again itself.
  [[nodiscard]] bool resolves() const { return resolver_ != nullptr; }
  void want_neighbor(const wire::IpAddr& ip, std::uint64_t now, std::uint64_t until) {
    if (neighbors_.want(ip, now, until) && resolver_) resolver_(resolver_ctx_, ip);
  }
  /// The entry for ip, if there is one.
  bool neighbor(const wire::IpAddr& ip, wire::MacAddr& mac) const {
    const auto m = neighbors_.lookup(ip);
    if (m) mac = *m;
    return m.has_value();
  }

  // ---- Data path ----
  // Every verbs queue is one abi::Ring (stack/abi/ring.h), shared with an
  // application or placed in the heap. post_* are the heap rings' producer;
  // an application produces into its shared rings itself and calls take_posts().
  /// Posts a send WR. 0, or an errno: EINVAL (bad WR or QP state), ENOMEM (SQ full).
  int post_send(Qp* qp, const SendWr& wr);
  int post_recv(Qp* qp, const RecvWr& wr);
  int post_srq_recv(Srq* srq, const RecvWr& wr);
  int poll_cq(Cq* cq, std::span<ibv_wc> out) { return cq->poll(out); }
  /// The QP's producer has published entries: the engine takes the new send
  /// entries (validating each into its shadow) and starts them, or flushes
  /// them in ERR. Receive entries need no look: the responder reads the
  /// ring when a request needs one. Returns the entries taken. Takes at
  /// most one ring's worth; `more` is set when the producer may have
  /// published more meanwhile (look again on the next pass).
  std::size_t take_posts(Qp* qp, bool* more = nullptr);
  /// Whether a UD or UC QP that may send still has posted work not yet on
  /// the wire (nothing waits for such a send once it left: a destroy can
  /// let it go first, as a NIC has it in hand by then).
  [[nodiscard]] bool datagrams_unsent(const Qp* qp) const;
  /// Hooks for the owner of shared CQs. notify(ctx, cq): entries landed in a
  /// CQ made with want_notify(true) whose consumer had armed it (once per
  /// arm; abi::Ring::take_notify). event(ctx, type, cq, qp): an async event
  /// (IBV_EVENT_CQ_ERR with the CQ, IBV_EVENT_QP_FATAL with the QP).
  using CqNotify = void (*)(void* ctx, Cq& cq);
  using AsyncEvent = void (*)(void* ctx, ibv_event_type type, Cq* cq, Qp* qp);
  void set_hooks(CqNotify notify, AsyncEvent event, void* ctx) {
    cq_notify_ = notify;
    async_event_ = event;
    hooks_ctx_ = ctx;
  }

  /// Processes one received frame, and says what it did with it (each drop
  /// is also counted in the port counters).
  RxVerdict rx(wire::ConstBytes frame, std::uint64_t now);
  /// A flow rule (ibv_create_flow): the frames that match `value` under
  /// `mask` (uroce_flow_key), from the wire or from this port's raw packet
  /// QPs, go to raw packet QP `qp`; of several rules that match, the
  /// lowest priority value's (the oldest among equals). A handle (> 0), or
  /// 0: not a raw packet QP, or the table (max_flows) is full.
  std::uint32_t create_flow(Qp* qp, std::uint32_t priority, const uroce_flow_key& value, const uroce_flow_key& mask);
  int destroy_flow(std::uint32_t handle);  // EINVAL if there is no such rule
  [[nodiscard]] std::size_t flow_count() const { return flows_.size(); }
  /// Multicast (IBTA 10.5.2.3): a UD QP joins the group `gid` (an IPv4
  /// 224/4 or IPv6 ff00::/8 address); a datagram to the group (DQPN
  /// 0xFFFFFF) reaches each QP in it, from the wire or from a QP of this
  /// engine (the port loops a group's datagrams back to its members here,
  /// as a NIC does). 0 (already in: 0 too), EINVAL (not UD, not a group)
  /// or ENOMEM (the table is full). Control path.
  int attach_mcast(Qp* qp, const wire::IpAddr& gid);
  /// 0, or EINVAL when the QP is not in the group.
  int detach_mcast(Qp* qp, const wire::IpAddr& gid);
  [[nodiscard]] std::size_t mcast_attachments() const { return mcast_.size(); }
  /// Runs the requesters, READ responders, ACK flush and timers.
  void poll(std::uint64_t now);
  /// Hands every queued frame to fn(const TxFrame&) and empties the ring.
  template <typename F>
  std::size_t drain_tx(F&& fn) {
    std::size_t n = 0;
    while (!tx_.empty()) {
      if (tx_.front().hdr_len != 0) {  // 0: headers refused (tx_unbuilt), nothing to send
        fn(tx_.front());
        ++n;
      }
      tx_.pop();
    }
    // Empty: the next frames take the first slots again, which are still
    // in cache, instead of walking the whole ring's memory.
    tx_.clear();
    return n;
  }
  [[nodiscard]] std::size_t tx_pending() const { return tx_.size(); }
  /// How many frames the port can take before it drops: the TX ring holds
  /// no more than this until the next drain, and what does not fit waits in
  /// its QP (counted as tx_ring_full), not lost (the driver's backpressure).
  void set_tx_room(std::uint32_t frames) { tx_room_ = frames; }
  /// The earliest timer deadline of any QP, or 0 if none is armed.
  [[nodiscard]] std::uint64_t next_deadline() const;

  // ---- Introspection ----
  [[nodiscard]] const PortCounters& counters() const { return port_ctr_; }
  [[nodiscard]] const EngineConfig& config() const { return cfg_; }
  /// A live QP by number (not one in quarantine).
  [[nodiscard]] Qp* find_qp(std::uint32_t qpn) const;
  /// Calls fn(const Qp&) for every live QP (control path: status, tools);
  /// not for numbers in quarantine, which are no QP of anybody's.
  template <typename F>
  void for_each_qp(F&& fn) const {
    for (const auto& q : qps_)
      if (q && !q->quarantine_until) fn(static_cast<const Qp&>(*q));
  }
  [[nodiscard]] std::size_t qp_count() const { return qps_live_; }
  /// QPs poll() will visit (they may have work now), and QPs waiting only
  /// on a deadline, in the timer wheel.
  [[nodiscard]] std::size_t active_count() const { return active_.size(); }
  [[nodiscard]] std::size_t timers_pending() const { return wheel_.size(); }
  /// Numbers in quarantine (destroyed RC QPs still answering retries).
  [[nodiscard]] std::size_t quarantined_count() const { return quarantined_; }
  /// Sum of a counter over all QPs (live and destroyed).
  [[nodiscard]] std::uint64_t qp_counter_total(QpCounter c) const;

 private:
  friend struct EngineTestPeer;

  // engine_*.cc (the list at the top of this file)
  void set_error(Qp& qp);
  void flush_wqes(Qp& qp);
  void activate(Qp& qp);
  /// The earliest time `qp` must be looked at again without an event (0: none).
  [[nodiscard]] std::uint64_t deadline_of(const Qp& qp, std::uint64_t now) const;
  /// An idle QP (off the active list): its place in the timer wheel, at deadline_of.
  void settle_timer(Qp& qp, std::uint64_t now);
  void complete_send(Qp& qp, ibv_wc_status status);
  // Tag matching (tm.cc).
  [[gnu::noinline]] void complete_internal(Qp& qp, ibv_wc_status status);
  void exec_tm_op(TagMatch& tm, const uroce_tm_op& op);
  void push_tm_cqe(Cq& cq, std::uint64_t wr_id, ibv_wc_status status, ibv_wc_opcode op, std::uint32_t byte_len,
                   unsigned flags, std::uint32_t qpn, std::uint64_t tag, std::uint32_t ctx);
  bool push_internal(Qp& qp, ibv_wr_opcode op, std::uint16_t tag, uroce_send_entry e);
  void tm_drop_internal(Qp& qp);
  /// The first packet of a SEND to a tag-matching SRQ: what the message is
  /// (Responder::tm), and the receive or tag it goes to.
  [[gnu::noinline]] bool tm_start(Qp& qp, const wire::Packet& pkt);
  [[gnu::noinline]] void tm_finish(Qp& qp, std::uint32_t byte_len, unsigned flags, std::uint32_t extra);
  void tm_abort(Qp& qp);
  void complete_recv(Qp& qp, const RecvWqe& w, ibv_wc_status status, ibv_wc_opcode op, std::uint32_t byte_len,
                     unsigned flags = 0, std::uint32_t imm_or_inv = 0, std::uint32_t src_qp = 0);
  TxFrame* tx_slot();
  /// Reads an ODP payload into the frame's own bounce buffer and adds it as
  /// a segment (the frame then carries a copy: `bounced`). False if the
  /// application has no such page.
  bool add_odp_seg(TxFrame& f, MemRef src, std::uint32_t len);
  /// The bounce buffers of the TX slots (ODP payloads, raw frames' tails).
  void ensure_bounce();
  std::uint8_t* bounce_of(const TxFrame& f) { return odp_bounce_.get() + std::size_t{tx_.slot_of(&f)} * TxFrame::kMaxPayload; }
  /// Copies n bytes of a WQE's data from offset `off` (its SGEs through
  /// their MemRefs, or its inline copy). False on a page that is not there.
  bool gather(const SendWqe& w, std::uint64_t off, std::uint8_t* dst, std::uint32_t n) const;
  /// A raw packet QP's SEND: the WQE's bytes are a whole Ethernet frame,
  /// sent as they are (and to this port's own flows when addressed to the
  /// port or to a group). Completes at once.
  bool send_raw(Qp& qp, SendWqe& w);
  /// A frame to the flows: true if a rule took it (its QP received it, or
  /// had no receive posted and it was dropped).
  bool rx_raw(wire::ConstBytes frame);
  wire::FrameSpec spec_for(const Qp& qp, std::uint8_t opcode, wire::Psn psn) const;
  void finish_frame(TxFrame& f, Qp& qp, const wire::FrameSpec& spec, std::uint32_t payload_len);
  /// A packet of the QP's connection (a request, ACK or READ response),
  /// given by its BTH fields and extension headers: the frame from the QP's
  /// header template (a payload that fits is copied in after the headers,
  /// so that small packets are one contiguous buffer and one CRC), or,
  /// without a template, from spec_for through finish_frame.
  void finish_packet(TxFrame& f, Qp& qp, const wire::PacketFields& p, const wire::ExtFields& ext,
                     std::uint32_t payload_len);
  /// A response's extension headers: its AETH (every ACK, NAK, READ
  /// response and selective ACK carries one), the rest to fill in.
  static wire::ExtFields aeth(std::uint8_t syndrome, std::uint32_t msn) {
    wire::ExtFields e;
    e.aeth_syndrome = syndrome;
    e.aeth_msn = msn;
    return e;
  }
  /// spec_for's spec with a packet's BTH fields and extension headers.
  wire::FrameSpec full_spec(const Qp& qp, const wire::PacketFields& p, const wire::ExtFields& ext) const;
  /// A frame whose headers the builder refused: emptied (drain_tx skips
  /// it) and counted, never sent with bytes it did not write.
  void unbuilt(TxFrame& f);
  /// The ICRC, the trailer's length and the frame's notes, and the counters: both finishes end here.
  void seal_frame(TxFrame& f, Qp& qp, std::uint8_t opcode, wire::Psn psn, std::uint8_t pad, std::uint32_t icrc);
  bool take_recv(Qp& qp, RecvWqe& out);
  /// to_qp's second half, once the opcode is the QP's transport's (an XRC
  /// one as RC's).
  RxVerdict deliver(Qp& qp, const wire::Packet& pkt, std::uint64_t now);
  /// An XRC target's request: the XRC SRQ its XRCETH names, if that is in
  /// the QP's domain (and the same as the message's so far), becomes the
  /// QP's srq, recv_cq and pd. False when it cannot.
  bool xrc_bind(Qp& qp, const wire::Packet& pkt);
  [[gnu::noinline]] bool take_recv_past_bad(Qp& qp, RecvQueue& q, RecvWqe& out);  // take_recv's rare path
  /// Takes what the producer published in the QP's send ring into the shadow.
  std::size_t fetch_sends(Qp& qp);
  /// Validates a send entry into its shadow slot (refused when malformed).
  void to_send_wqe(const Qp& qp, const uroce_send_entry& e, SendWqe& w) const;
  /// What to_send_wqe writes once the entry passed its checks (the
  /// engine's own WQEs, which no application cap bounds, come here direct).
  static void fill_send_wqe(const Qp& qp, const uroce_send_entry& e, SendWqe& w);
  /// Writes a completion, noting the CQ for its notification or overflow.
  void push_cqe(Cq& cq, const uroce_cq_entry& e);
  [[gnu::cold, gnu::noinline]] void cq_dropped(Cq& cq);  // push_cqe's rare paths, out of line
  [[gnu::noinline]] void cq_note(Cq& cq);
  /// Sends the notifications and handles the overflows noted since last time.
  void cq_events();
  /// The QP in a QPN's slot, live or in quarantine.
  [[nodiscard]] Qp* slot_qp(std::uint32_t qpn) const;
  /// Frees the slot of a QP whose quarantine is over.
  void release(Qp& qp);
  /// A frame for a QP in quarantine: re-ACK a retried SEND or WRITE, drop the rest.
  void on_quarantined(Qp& qp, const wire::Packet& pkt, std::uint64_t now);
  /// A CE-marked packet arrived for `qp`: count it, and send the peer QP a
  /// CNP unless one went less than cnp_interval_ns ago.
  void notify_congestion(Qp& qp, std::uint64_t now);
  /// The same for a UD QP: the CNP goes to the datagram's source QP (its
  /// DETH) at its source address, at most once an interval per such flow.
  void notify_congestion_ud(Qp& qp, const wire::Packet& pkt, std::uint64_t now);
  /// Sends a CNP with `spec`'s addresses; false if the TX ring is full.
  bool send_cnp(Qp& qp, wire::FrameSpec spec);
  /// Translates a WQE's SGEs through their MRs into w.local, checking keys,
  /// bounds and access: when the WQE starts, and again before later packets
  /// and READ responses touch the memory. False if any check fails.
  bool translate_sges(Qp& qp, SendWqe& w);
  /// Executes a kLocal WQE (a bind or a local invalidate) on the key table.
  ibv_wc_status exec_local(Qp& qp, const SendWqe& w);
  /// Completes the oldest WQEs while they are executed local ones.
  void retire_local(Qp& qp);
  /// Sets the QP's pacer rate and window from set_rate and its algorithm.
  void apply_cc(Qp& qp);
  /// Runs one congestion-control hook, then takes its limits (nothing
  /// without an algorithm).
  template <typename F>
  void cc_event(Qp& qp, F&& hook) {
    if (!qp.cc) return;
    hook(*qp.cc);
    apply_cc(qp);
    if (!qp.active && qp.cc->next_timer() != 0) activate(qp);  // its timer needs the poll loop
  }

  // requester.cc
  void run_requester(Qp& qp, std::uint64_t now);
  bool send_next_packet(Qp& qp, std::uint64_t now);
  void go_back(Qp& qp, wire::Psn from);
  void arm_retry(Qp& qp, std::uint64_t now);

  // responder.cc
  void on_request(Qp& qp, const wire::Packet& pkt, std::uint64_t now);
  /// A parsed packet for this port, to its QP: the per-QP checks, then the
  /// responder or the completer.
  RxVerdict to_qp(Qp* qp, const wire::Packet& pkt, std::uint64_t now);
  /// A datagram to a multicast group: to each member QP.
  RxVerdict to_group(const wire::Packet& pkt, std::uint64_t now);
  /// A datagram this engine sent to a group, to its members here too.
  void loop_to_group(const TxFrame& f, const wire::IpAddr& group, std::uint64_t now);
  void on_rc_request(Qp& qp, const wire::Packet& pkt);
  [[gnu::noinline]] void on_rc_out_of_order(Qp& qp, const wire::Packet& pkt);  // on_rc_request: a gap or a duplicate
  void on_uc_request(Qp& qp, const wire::Packet& pkt);
  void on_ud_request(Qp& qp, const wire::Packet& pkt);
  enum class Exec : std::uint8_t { kOk, kRnr, kNakInvalid, kNakAccess, kNakOp, kDrop };
  [[gnu::noinline]] void on_rc_refused(Qp& qp, const wire::Packet& pkt, Exec e);  // on_rc_request: RNR, drop, NAK
  Exec execute(Qp& qp, const wire::Packet& pkt);
  Exec exec_send(Qp& qp, const wire::Packet& pkt);
  Exec tm_place(Qp& qp, const wire::Packet& pkt);  // a matched SEND's bytes (tm.cc)
  Exec exec_write(Qp& qp, const wire::Packet& pkt);
  Exec exec_atomic_write(Qp& qp, const wire::Packet& pkt);
  Exec exec_flush(Qp& qp, const wire::Packet& pkt);
  Exec exec_read(Qp& qp, const wire::Packet& pkt, wire::Psn psn);
  Exec exec_atomic(Qp& qp, const wire::Packet& pkt);
  void replay_duplicate(Qp& qp, const wire::Packet& pkt);
  void settle_pending_ack(Qp& qp);
  bool queue_ack(Qp& qp, std::uint8_t syndrome, wire::Psn psn);
  bool queue_atomic_ack(Qp& qp, wire::Psn psn, std::uint64_t orig);
  bool send_ack(Qp& qp, std::uint8_t syndrome, wire::Psn psn);
  bool send_atomic_ack(Qp& qp, wire::Psn psn, std::uint64_t orig);
  void run_responses(Qp& qp);
  void schedule_ack(Qp& qp, wire::Psn psn);
  [[gnu::noinline]] void list_for_ack(Qp& qp);  // schedule_ack's first ACK of a burst
  void send_coalesced_acks();
  void responder_error(Qp& qp, const wire::Packet& pkt, Exec e);

  // selective.cc
  static bool sr_carries(const SendWqe& w);
  bool sr_may_start(Qp& qp, const SendWqe& w);
  void sr_fence(Qp& qp, const SendWqe& w);
  static bool sr_fenced(const Qp& qp);
  void sr_resend(Qp& qp, std::uint64_t now);
  void sr_timeout(Qp& qp, std::uint64_t now);
  void on_sr_ack(Qp& qp, const wire::Packet& pkt, std::uint64_t now);
  bool sr_take_rwqe(Qp& qp, std::uint32_t msn);
  Exec sr_place(Qp& qp, const wire::Packet& pkt);
  void on_sr_request(Qp& qp, const wire::Packet& pkt);
  static bool sr_quiet(const Qp& qp);
  bool send_sr_ack(Qp& qp);

  // completer.cc
  void on_response(Qp& qp, const wire::Packet& pkt, std::uint64_t now);
  bool ack_upto(Qp& qp, wire::Psn psn);
  void retry_or_fail(Qp& qp, std::uint64_t now, bool from_timeout, std::optional<wire::Psn> from = std::nullopt);
  void on_timers(Qp& qp, std::uint64_t now);
  /// una moved on from `una_before`: the round-trip sample, if the probe
  /// is now acknowledged, and the congestion control's ACK hook.
  void on_acked(Qp& qp, wire::Psn una_before, std::uint64_t now);
  /// Forward progress (an ACK, a NAK's or RNR NAK's implied ACK, a
  /// response): the retry and RNR budgets are whole again, and no retry
  /// waits. The one reset of the budgets, wherever progress is seen.
  void renew_retries(Qp& qp);
  /// Forward progress from `una_before`: on_acked, the retry budget reset,
  /// the timer restarted.
  void on_progress(Qp& qp, wire::Psn una_before, std::uint64_t now);

  EngineConfig cfg_;
  MrTable mrs_;
  std::vector<std::unique_ptr<Pd>> pds_;
  std::vector<std::unique_ptr<Cq>> cqs_;
  std::vector<std::unique_ptr<Srq>> srqs_;
  std::vector<std::unique_ptr<Xrcd>> xrcds_;
  std::unordered_map<std::uint32_t, Srq*> xrc_srqs_;  // XRC SRQs by number (filled on the control path)
  std::uint32_t next_srq_num_ = 0;
  std::vector<std::unique_ptr<Qp>> qps_;  // index: cfg_.qpns.index(qpn)
  std::unique_ptr<Qp> gsi_;               // QP1, when the CM agent made it
  std::size_t qps_live_ = 0;
  std::size_t quarantined_ = 0;  // QPs in quarantine; poll() frees the expired ones
  std::size_t reap_cursor_ = 0;  // where poll()'s sweep of quarantined slots goes on
  std::vector<Qp*> active_;       // QPs that may have work now; fixed capacity
  std::vector<Qp*> still_active_;  // serve_active's next list (swapped with active_); fixed capacity
  /// Serves the active list once (poll's pass; `first`: the poll's first,
  /// which also runs timers; later passes serve only tenants with work left).
  void serve_active(std::uint64_t now, bool first);
  // The transmit share (set_tenant): deficit round robin between tenants.
  struct Tenant : TenantReport {
    std::int64_t deficit = 0;  // bytes it may still send this round (negative: owed)
    bool backlog = false;      // stopped at its share in this pass
    bool serve = false;        // served in this round (it had work left)
  };
  std::vector<Tenant> tenants_;     // [0]: QPs in no tenant's share; sized once
  std::vector<std::uint16_t> live_;  // the entries from 1 that hold QPs (capacity reserved): metered from 2
  std::int64_t unmetered_ = -1;     // the one tenant with work left in this poll: it takes the rest
  bool qp_throttled_ = false;       // the QP being served stopped at its tenant's share
  std::uint64_t poll_bytes_ = 0, poll_frames_ = 0;  // charged in this poll (its mean frame)
  [[nodiscard]] bool metered() const { return live_.size() >= 2; }
  /// fn(entry, Tenant&) for entry 0 and every live one: those a poll shares.
  template <typename F>
  void for_each_share(F&& fn) {
    fn(std::uint16_t{0}, tenants_[0]);
    for (const std::uint16_t i : live_) fn(i, tenants_[i]);
  }
  /// The live entry of uid, or 0.
  [[nodiscard]] std::uint16_t tenant_of(std::uint32_t uid) const;
  /// Frames the TX ring may hold this poll: its size, or the port's room.
  [[nodiscard]] std::uint32_t tx_limit() const { return std::min(tx_room_, tx_.capacity()); }
  /// May qp's tenant send another frame now (false: noted as backlog).
  bool tx_share_left(Qp& qp);
  /// Whether a packet of `payload` bytes is the QP's last before the TX room
  /// or its tenant's share runs out (it then asks for an ACK).
  [[nodiscard]] bool last_in_turn(const Qp& qp, std::uint32_t payload) const;
  /// Charges qp's tenant for the frames queued since TX index `from`.
  void charge(const Qp& qp, std::uint32_t from);
  void leave_tenant(Qp& qp);
  TimerWheel<Qp, &Qp::wheel> wheel_;  // QPs that wait only on a deadline
  bool tx_full_ = false;          // tx_slot() found the TX ring full (poll's per-QP note)
  std::vector<Qp*> ack_waiters_;  // QPs with a coalesced ACK pending
  NeighborTable neighbors_;
  Resolver resolver_ = nullptr;
  void* resolver_ctx_ = nullptr;
  struct McastAttach {
    wire::IpAddr gid;
    Qp* qp;
  };
  std::vector<McastAttach> mcast_;  // capacity cfg_.max_mcast_attach, reserved
  struct RawFlow {
    std::uint32_t handle;
    std::uint32_t priority;
    Qp* qp;
    uroce_flow_key value, mask;  // value already masked
  };
  std::vector<RawFlow> flows_;  // capacity cfg_.max_flows, reserved
  std::uint32_t next_flow_ = 1;
  std::unique_ptr<std::uint8_t[]> raw_scratch_;  // a raw frame for this port's own flows (kMaxRawFrame)
  std::vector<std::uint8_t> mcast_loop_;  // a looped datagram, flattened (one MTU frame)
  // When each UD flow (source address and QP, to our QP) may next be sent a
  // CNP. Direct-mapped: two flows that share a slot may each get one more.
  struct UdCnpSlot {
    wire::IpAddr src{};
    std::uint32_t src_qp = 0, qpn = 0;
    std::uint64_t next = 0;
  };
  std::array<UdCnpSlot, 256> ud_cnp_{};
  Fifo<TxFrame> tx_;
  std::uint32_t tx_room_ = UINT32_MAX;  // set_tx_room
  // ODP payloads on their way out: one MTU per TX slot, made at the first
  // ODP registration (a frame's bytes must outlive the read of them).
  std::unique_ptr<std::uint8_t[]> odp_bounce_;
  PortCounters port_ctr_;
  QpCounters dead_qp_ctr_;  // counters of destroyed QPs, kept for totals
  std::uint64_t last_now_ = 0;  // the latest time rx or poll was given
  std::vector<Cq*> cq_noted_;       // CQs pushed to since cq_events(); capacity: one per CQ
  std::vector<Cq*> cq_overflowed_;  // CQs that overflowed since cq_events()
  CqNotify cq_notify_ = nullptr;
  AsyncEvent async_event_ = nullptr;
  void* hooks_ctx_ = nullptr;
  std::uint32_t next_handle_ = 1;
};

// On every receive completion: inline, so the responder's common path
// passes no arguments on the stack.
inline void Engine::complete_recv(Qp& qp, const RecvWqe& w, ibv_wc_status status, ibv_wc_opcode op,
                           std::uint32_t byte_len, unsigned flags, std::uint32_t imm_or_inv, std::uint32_t src_qp) {
  uroce_cq_entry e{};
  e.wr_id = w.wr_id;
  e.status = status;
  e.opcode = op;
  e.byte_len = byte_len;
  e.wc_flags = flags;
  // imm_data in network order, as verbs defines it; or the invalidated R_Key.
  if (flags & IBV_WC_WITH_IMM) e.imm_or_inv = __builtin_bswap32(imm_or_inv);
  if (flags & IBV_WC_WITH_INV) e.imm_or_inv = imm_or_inv;
  e.qp_num = qp.qpn;
  e.src_qp = src_qp;
  e.timestamp = last_now_;
  push_cqe(*qp.recv_cq, e);
  qp.ctr.inc(QpCounter::completions);
}


}  // namespace uroce::transport
