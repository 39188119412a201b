// The connection manager: RDMA CM's wire protocol (IBTA chapter 12 with the
// RoCE/IP addressing of Annex A11) on the engine's QP1, so a peer using
// librdmacm can connect to a uroce QP and a uroce QP to it.
//
//   active side:   connect()  --REQ-->   (peer)  --REP-->  QP to RTR/RTS, --RTU--> established
//   passive side:  listen(port); REQ --> a kConnectRequest event; accept() takes the QP to
//                  RTR/RTS and sends REP; RTU (or traffic on the QP) --> established
//   either side:   disconnect(): QP to ERR, --DREQ-->, DREP --> disconnected (then time-wait)
//   UD (SIDR):     connect() with a UD QP --SIDR_REQ-->; listen(port, owner, true) gives a
//                  kConnectRequest; accept() answers SIDR_REP with the QP and its Q_Key, and the
//                  active side's kEstablished carries them (no QP moves: UD needs no peer)
//
// Every message is resent on a timer until its answer comes (REQ, REP, DREQ)
// and a duplicate is answered again (REP, RTU, DREP), so a lost MAD costs a
// resend interval, not the connection. Like rdma_cm, one transaction ID
// serves a connection's whole life.
//
// Runs on the owner thread of its engine, on the engine's clock (`now`, ns).
// It is control path: it may allocate, but poll() without MADs or due timers
// does not.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <vector>

#include "stack/cm/mad.h"
#include "stack/transport/engine.h"

namespace uroce::cm {

struct CmConfig {
  std::uint64_t ca_guid = 0;                   // the CA GUID we advertise (EUI-64 of the MAC)
  std::uint64_t resend_ns = 500'000'000;       // a REQ, REP or DREQ unanswered for this long is sent again (then 2x, 4x)
  std::uint32_t max_sends = 8;                 // then the attempt fails
  std::uint64_t timewait_ns = 2'000'000'000;   // a closed connection still answers duplicate DREQs
  std::uint64_t resolve_ns = 3'000'000'000;    // a MAD waits this long for the peer's MAC
  ibv_mtu max_mtu = IBV_MTU_4096;
  std::uint64_t seed = 1;
};

/// What the active side asks for (rdma_conn_param's fields and the path's).
struct ConnParams {
  ibv_mtu mtu = IBV_MTU_1024;
  std::uint8_t responder_resources = 4;  // READs/atomics we accept at once
  std::uint8_t initiator_depth = 4;      // READs/atomics we issue at once
  std::uint8_t retry_cnt = 7;
  std::uint8_t rnr_retry = 7;
  std::uint8_t ack_timeout = 14;  // 4.096 us * 2^14 = 67 ms
};

struct CmEvent {
  /// kConnectResponse: the REP of a connection whose application brings its
  /// own QP up (connect(..., app_qp)); it answers with establish().
  enum class Type : std::uint8_t { kConnectRequest, kEstablished, kRejected, kDisconnected, kUnreachable, kConnectResponse };
  Type type = Type::kConnectRequest;
  std::uint32_t id = 0;  // the connection: our local communication ID
  wire::IpAddr peer{};
  std::uint16_t peer_port = 0, local_port = 0;
  std::uint32_t peer_qpn = 0;
  std::uint8_t responder_resources = 0, initiator_depth = 0;
  ibv_mtu mtu = IBV_MTU_1024;
  // What the QP is to be brought up with (kConnectRequest, kConnectResponse),
  // as rdma_init_qp_attr reports it: our send PSN (the peer's starting PSN),
  // our receive PSN (the one our REQ or REP advertises), the retries and the
  // READ/atomic depths both ways.
  std::uint32_t sq_psn = 0, rq_psn = 0;
  std::uint8_t retry_cnt = 7, rnr_retry = 7, ack_timeout = 14;
  std::uint8_t max_rd_atomic = 0, max_dest_rd_atomic = 0;
  bool ud = false;         // a SIDR request (kConnectRequest) or answer (kEstablished)
  std::uint32_t qkey = 0;  // UD kEstablished: the peer QP's Q_Key
  std::uint16_t reason = 0;  // kRejected: the reject reason; kUnreachable: it, or the SIDR status
  std::uint8_t private_len = 0;
  std::uint8_t private_data[kReqUserPrivate] = {};
};
const char* to_string(CmEvent::Type t);

#define UROCE_CM_COUNTERS(X) \
  X(mads_rx)                 \
  X(mads_tx)                 \
  X(resends)                 \
  X(bad_mads)                \
  X(unmatched)               \
  X(duplicates)              \
  X(rejects_sent)            \
  X(unresolved)              \
  X(send_full)               \
  X(established)             \
  X(disconnected)

enum class CmCounter : std::uint8_t {
#define X(n) n,
  UROCE_CM_COUNTERS(X)
#undef X
  kCount
};
const char* to_string(CmCounter c);

class CmAgent {
 public:
  /// A MAD to a peer whose MAC is not known waits for it through the
  /// engine's one neighbour wait (Engine::want_neighbor).
  CmAgent(transport::Engine& eng, const CmConfig& cfg);
  ~CmAgent();
  CmAgent(const CmAgent&) = delete;
  CmAgent& operator=(const CmAgent&) = delete;

  /// False if QP1 could not be made (another agent has it).
  [[nodiscard]] bool ok() const { return qp_ != nullptr; }

  /// 0, EADDRINUSE. `ud`: RDMA_PS_UDP's service IDs (SIDR), a port space of its own.
  int listen(std::uint16_t port, std::uint32_t owner, bool ud = false);
  int unlisten(std::uint16_t port, std::uint32_t owner, bool ud = false);
  /// Sends a REQ for an RC QP in RESET or INIT; *id names the connection.
  /// 0, or EINVAL (QP type or state, private data over 56 bytes).
  /// With app_qp the agent never moves the QP (rdma_cm's ids without a QP:
  /// the application brings it up itself with the event's attributes): the
  /// REP is a kConnectResponse event, and establish() sends the RTU.
  int connect(transport::Qp* qp, const wire::IpAddr& dst, std::uint16_t port, wire::ConstBytes priv,
              std::uint32_t owner, const ConnParams& p, std::uint64_t now, std::uint32_t& id, bool app_qp = false);
  /// Answers a kConnectRequest: the QP (RC, RESET or INIT) goes to RTS and a
  /// REP goes out. With app_qp the application has brought the QP (RC, not
  /// in ERR) up itself, to the request's peer QP, and the agent leaves it be.
  /// ack_timeout 0..31 replaces the request's for our QP (rdma_cm's
  /// RDMA_OPTION_ID_ACK_TIMEOUT on the passive side); -1 keeps it.
  int accept(std::uint32_t id, transport::Qp* qp, wire::ConstBytes priv, std::uint32_t owner, std::uint64_t now,
             bool app_qp = false, int ack_timeout = -1);
  /// The active side of an app_qp connection, after kConnectResponse: sends
  /// the RTU (rdma_establish). 0, or EINVAL (no such connection waiting).
  int establish(std::uint32_t id, std::uint32_t owner, std::uint64_t now);
  int reject(std::uint32_t id, wire::ConstBytes priv, std::uint32_t owner, std::uint64_t now);
  /// The QP goes to ERR and a DREQ goes out; kDisconnected follows.
  int disconnect(std::uint32_t id, std::uint32_t owner, std::uint64_t now);
  /// An owner went away: its connections are closed (DREQ or REJ), its
  /// listens and events dropped.
  void drop_owner(std::uint32_t owner, std::uint64_t now);
  /// The owner's next event, if any.
  bool next_event(std::uint32_t owner, CmEvent& out);
  /// Called each time an event is queued for `owner` (after it is queued).
  using EventHook = void (*)(void* ctx, std::uint32_t owner);
  void set_event_hook(EventHook hook, void* ctx) {
    event_hook_ = hook;
    event_hook_ctx_ = ctx;
  }

  /// Receives MADs, resends on timers, sends MADs whose peer MAC arrived.
  std::size_t poll(std::uint64_t now);

  /// The earliest resend or time-wait deadline, or 0.
  [[nodiscard]] std::uint64_t next_deadline() const;
  [[nodiscard]] std::uint64_t counter(CmCounter c) const { return ctr_[static_cast<std::size_t>(c)]; }
  [[nodiscard]] std::size_t connections() const { return conns_.size(); }

  /// Where new communication IDs, transaction IDs, PSNs and source ports come
  /// from (random by default; replay tests pin them).
  std::function<std::uint32_t()> next_comm_id, next_psn;
  std::function<std::uint64_t()> next_tid;
  std::function<std::uint16_t()> next_src_port;

 private:
  enum class State : std::uint8_t {
    kReqSent, kReqRcvd, kRepSent, kRepRcvd, kEstablished, kDreqSent, kTimeWait,
    kSidrSent, kSidrRcvd,  // UD: asked, or asked and not yet answered; answered, a SIDR is in kTimeWait
  };
  struct Conn {
    std::uint32_t local_id = 0, remote_id = 0;
    std::uint64_t tid = 0;
    std::uint32_t owner = 0;
    State state = State::kReqSent;
    bool active = false;
    bool app_qp = false;  // the application moves the QP, never the agent
    bool ud = false;      // a SIDR exchange, not a connection
    std::uint32_t qpn = 0;
    /// The engine's handle of that QP: a QPN can belong to another QP
    /// later (destroyed in INIT, a QPN is free at once), so the QP is found
    /// by both.
    std::uint64_t qp_handle = 0;
    wire::IpAddr peer{};
    std::uint16_t local_port = 0, peer_port = 0;
    std::uint32_t peer_qpn = 0;
    // The starting PSN a side puts in its REQ or REP is the one it expects
    // to *receive* (its RQ PSN); the peer starts sending there. That is what
    // Linux's CM does (rxe's captures: the passive side's first SEND carries
    // the REQ's PSN), and what interoperates. So the PSN we advertise is our
    // rq_psn, and the one we are told is our sq_psn.
    std::uint32_t rq_psn = 0, sq_psn = 0;
    std::uint32_t qkey = 0;  // UD: the Q_Key a SIDR_REP named
    ibv_mtu mtu = IBV_MTU_1024;
    std::uint8_t responder_resources = 0, initiator_depth = 0;  // as offered in our REQ or REP
    std::uint8_t max_rd_atomic = 0, max_dest_rd_atomic = 0;     // what the QP gets, once the peer's are known
    std::uint8_t retry_cnt = 7, rnr_retry = 7, ack_timeout = 14;
    Mad last{};  // the last MAD sent, for resends and duplicate answers
    std::uint64_t deadline = 0;
    std::uint32_t sends = 0;
    std::uint64_t qp_rx_at_rep = 0;
  };
  struct Pending {
    wire::IpAddr dst;
    Mad mad;
    std::uint64_t give_up;
  };

  void on_mad(const Mad& m, const wire::IpAddr& src, std::uint64_t now);
  void on_req(const Mad& m, const wire::IpAddr& src, std::uint64_t now);
  void on_rep(const Mad& m, const wire::IpAddr& src, std::uint64_t now);
  void on_rtu(const Mad& m, const wire::IpAddr& src);
  void on_rej(const Mad& m, const wire::IpAddr& src);
  void on_dreq(const Mad& m, const wire::IpAddr& src, std::uint64_t now);
  void on_drep(const Mad& m, const wire::IpAddr& src, std::uint64_t now);
  void on_mra(const Mad& m, const wire::IpAddr& src);
  void on_sidr_req(const Mad& m, const wire::IpAddr& src, std::uint64_t now);
  void on_sidr_rep(const Mad& m, const wire::IpAddr& src);
  /// A new active-side connection (REQ or SIDR_REQ) from `qp` to dst:port.
  Conn active_conn(const transport::Qp* qp, const wire::IpAddr& dst, std::uint16_t port, std::uint32_t owner,
                   State state);
  /// RDMA CM's header at the start of a REQ's or SIDR_REQ's private data.
  void put_cma_hdr(std::uint8_t* priv, const wire::IpAddr& dst, std::uint16_t src_port) const;
  int sidr_connect(transport::Qp* qp, const wire::IpAddr& dst, std::uint16_t port, wire::ConstBytes priv,
                   std::uint32_t owner, std::uint64_t now, std::uint32_t& id);
  void send_sidr_rep(Conn& c, std::uint8_t status, std::uint32_t qpn, std::uint32_t qkey, wire::ConstBytes priv,
                     std::uint64_t now);
  void on_timer(Conn& c, std::uint64_t now, bool& erase);

  Conn* find(std::uint32_t local_id, const wire::IpAddr& src);
  /// RESET/INIT -> RTR -> RTS with what the handshake agreed.
  int bring_up(transport::Qp* qp, const Conn& c, std::uint8_t max_rd_atomic, std::uint8_t max_dest_rd_atomic);
  static abi::Connect connect_params(const Conn& c, std::uint8_t max_rd_atomic, std::uint8_t max_dest_rd_atomic);
  int to_init(transport::Qp* qp);
  /// The connection's QP, if it is still the one it was made with.
  transport::Qp* qp_of(const Conn& c) const;
  void qp_to_error(const Conn& c);
  void send(const wire::IpAddr& dst, const Mad& m, std::uint64_t now);
  void send_conn(Conn& c, const Mad& m, std::uint64_t now);  // and arm the resend timer
  void send_rej(const wire::IpAddr& dst, std::uint64_t tid, std::uint32_t local_id, std::uint32_t remote_id,
                std::uint8_t msg, std::uint16_t reason, wire::ConstBytes priv, std::uint64_t now);
  bool post(const wire::IpAddr& dst, const wire::MacAddr& mac, const Mad& m);
  void event(const Conn& c, CmEvent::Type t, std::uint16_t reason = 0, wire::ConstBytes priv = {});
  void inc(CmCounter c) { ++ctr_[static_cast<std::size_t>(c)]; }

  transport::Engine& eng_;
  CmConfig cfg_;
  EventHook event_hook_ = nullptr;
  void* event_hook_ctx_ = nullptr;
  transport::Pd* pd_ = nullptr;
  transport::Cq* cq_ = nullptr;
  transport::Mr* mr_ = nullptr;
  transport::Qp* qp_ = nullptr;
  static constexpr std::uint32_t kRecvSlots = 64, kSendSlots = 64, kSlot = transport::kGrhBytes + kMadBytes;
  std::vector<std::uint8_t> mem_;  // receive slots, then send slots
  std::uint32_t send_next_ = 0, send_outstanding_ = 0;
  std::map<std::uint32_t, Conn> conns_;  // by our local communication ID
  std::map<std::uint32_t, std::uint32_t> listens_;  // port (| 1 << 16 for UD) -> owner
  std::map<std::uint32_t, std::deque<CmEvent>> events_;
  std::vector<Pending> pending_;
  std::uint64_t ctr_[static_cast<std::size_t>(CmCounter::kCount)] = {};
  std::uint64_t rng_;
};

}  // namespace uroce::cm
