// Application sessions: the daemon side of liburoce. Each application
// connects to the application socket, says hello (ABI version check), and
// creates PDs, MRs, CQs and QPs there; rings and registered memory are
// shared memory handed over as file descriptors. A session sees only its own
// handles; when its socket closes (exit or crash), everything it held is
// torn down: QPs to ERR and destroyed, memory unmapped, keys invalidated.
//
// Everything here runs on the lcore of the pipeline it serves: the control
// messages are served by the same thread's io_context poll, and step() is the
// pipeline's application stage.
#pragma once

#include <utility>  // boost 1.74's asio uses std::exchange without including it

#include <boost/asio.hpp>
#include <nlohmann/json.hpp>
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "control/node/accept_guard.h"
#include "control/node/options.h"
#include "stack/abi/ring.h"
#include "stack/abi/session_proto.h"
#include "stack/cm/agent.h"
#include "stack/pipeline/intake.h"
#include "stack/pipeline/port_io.h"
#include "stack/transport/engine.h"
#include "stack/wire/addr.h"

namespace uroce::control {

class SessionServer {
 public:
  /// `link()` says the port's link state and speed (QUERY of the port, and
  /// port events to every session when the state changes).
  using Link = pipeline::LinkInfo (*)(void* ctx);
  /// `intake` is the pipeline's stage that takes the sessions' posts: each
  /// session, QP and tag-matching SRQ is registered there as it is made.
  SessionServer(boost::asio::io_context& io, const std::string& path, unsigned mode, transport::Engine& eng,
                pipeline::Intake& intake, const SessionLimits& limits, Link link = nullptr, void* link_ctx = nullptr);
  ~SessionServer();
  /// The control plane's share of a pass: parked RTRs, the CM agent, QPs
  /// being destroyed, silent connections, faulted memory. (Posts never come
  /// here: the pipeline's intake takes them.) Returns the work done.
  std::size_t step();
  [[nodiscard]] std::size_t sessions() const { return sessions_.size(); }
  /// Doorbells rung by applications so far, over all sessions.
  [[nodiscard]] std::uint64_t doorbells() const { return doorbells_; }
  /// Completion channels rung so far (an application had armed its CQ to
  /// block on it), over all sessions.
  [[nodiscard]] std::uint64_t cq_notifies() const { return cq_notifies_; }
  /// Per session its id, the application's pid and uid, and what it holds.
  [[nodiscard]] nlohmann::ordered_json describe() const;
  /// The CM agent's counters.
  [[nodiscard]] nlohmann::ordered_json cm_status() const;
  /// The limits in force, and what they refused.
  [[nodiscard]] nlohmann::ordered_json limits_status() const;
  /// New limits (a reload): they bound what comes next; nothing held now
  /// is taken back.
  /// Transmit weights change at once for the uids that hold QPs.
  void set_limits(const SessionLimits& limits);
  /// The transmit share between tenants: quantum, weights, and per uid
  /// what it sent and how often it waited for its share.
  [[nodiscard]] nlohmann::ordered_json tx_share_status() const;

  struct Session;

 private:
  void accept();
  void wait_read(const std::shared_ptr<Session>& s);
  void wait_bell(Session& s);
  /// The engine's hooks (Engine::set_hooks): a completion channel to ring,
  /// an async event to send on the session's doorbell socket.
  static void on_cq_notify(void* ctx, transport::Cq& cq);
  static void on_async_event(void* ctx, ibv_event_type type, transport::Cq* cq, transport::Qp* qp);
  /// The CM agent's hook: a CM event waits for session `owner`; ring its
  /// CM channel, if it gave one.
  static void on_cm_event(void* ctx, std::uint32_t owner);
  void on_readable(const std::shared_ptr<Session>& s);
  void handle(Session& s, const uroce_msg_hdr& h, const std::uint8_t* body, std::vector<int>& fds);
  /// One request being served: its header, the session's socket, the
  /// descriptors that came with it (the handler takes the ones it keeps),
  /// and its body.
  struct Req {
    const uroce_msg_hdr& h;
    int sock;
    std::vector<int>& fds;
    const std::uint8_t* body;
    /// Answers the request with an error and why.
    void fail(int err, const std::string& why) const;
    /// Answers it: `err` (0 or an errno value) and why, then `body`, with
    /// a descriptor (-1: none), or with several.
    void reply(int err, const std::string& why, const void* body, std::size_t len, int fd = -1) const;
    void reply_fds(int err, const std::string& why, const void* body, std::size_t len, const int* fds,
                   std::size_t nfds) const;
    /// Copies the body into `m`, or answers that it is too short. Fields a
    /// newer minor appended after `min` bytes read as zero when an older
    /// library leaves them out.
    template <class M>
    bool take(M& m, std::size_t min = sizeof(M)) const {
      if (h.len < min) {
        fail(EINVAL, "message too short for its type");
        return false;
      }
      std::memset(&m, 0, sizeof m);
      std::memcpy(&m, body, std::min<std::size_t>(h.len, sizeof m));
      return true;
    }
  };
  // One handler per request type (handle() dispatches): each answers its
  // request, with an error and why when it refuses it.
  void on_hello(Session& s, const Req& req);
  void on_alloc_pd(Session& s, const Req& req);
  void on_reg_mr(Session& s, const Req& req);
  void on_create_flow(Session& s, const Req& req);
  void on_reg_mr_odp(Session& s, const Req& req);
  void on_rereg_mr(Session& s, const Req& req);
  void on_alloc_mw(Session& s, const Req& req);
  void on_resize_cq(Session& s, const Req& req);
  void on_create_cq(Session& s, const Req& req);
  void on_open_xrcd(Session& s, const Req& req);
  void on_create_srq(Session& s, const Req& req);
  void on_create_qp(Session& s, const Req& req);
  void on_modify_qp(Session& s, const Req& req);
  void on_set_qp_opt(Session& s, const Req& req);
  void on_mcast(Session& s, const Req& req);
  void on_resolve(Session& s, const Req& req);
  void on_destroy(Session& s, const Req& req);
  void on_cm_call(Session& s, const Req& req);
  void on_cm_unlisten(Session& s, const Req& req);
  void on_cm_channel(Session& s, const Req& req);
  void on_cm_event(Session& s, const Req& req);
  void on_query(Session& s, const Req& req);
  void close(Session& s);

  /// A request waiting for the MAC of `dgid` (ARP/ND in flight): a
  /// MODIFY_QP to RTR, or a RESOLVE for a UD address handle (qp_handle 0).
  struct PendingRequest {
    std::uint32_t session, qp_handle;
    uroce_msg_hdr hdr;
    ibv_qp_attr attr;
    int mask;
    wire::IpAddr dgid;
    std::uint64_t deadline_ms;
  };
  std::size_t retry_pending();
  /// Parks a request until dgid resolves (false: the bounds are reached).
  bool park(const Session& s, std::uint32_t qp_handle, const uroce_msg_hdr& h, const ibv_qp_attr& a, int mask,
            const wire::IpAddr& dgid);

  std::vector<PendingRequest> pending_;
  /// A DESTROY of a UD or UC QP whose posted datagrams are not all on the
  /// wire yet: the reply waits until they are (at most kClosingMs), as a
  /// NIC, or rxe, has them in hand by the time a destroy comes. One entry
  /// per QP, so they are bounded as QPs are.
  struct ClosingQp {
    std::uint32_t session, qp_handle;
    uroce_msg_hdr hdr;
    std::uint64_t deadline_ms;
  };
  static constexpr std::uint64_t kClosingMs = 50;
  std::vector<ClosingQp> closing_;
  /// Destroys the QPs of closing_ that have sent all (or whose time is up), and replies.
  std::size_t finish_closing();
  void destroy_qp(Session& s, std::uint32_t qp_handle);
  std::unique_ptr<cm::CmAgent> cm_;  // RDMA CM on QP1, for every session
  Link link_;
  void* link_ctx_;
  bool link_up_ = true;                // as last told to the sessions
  std::uint64_t link_checked_ms_ = 0;  // when step() last asked
  /// Asks about the link every 200 ms; a change goes to every session as
  /// IBV_EVENT_PORT_ACTIVE or IBV_EVENT_PORT_ERR.
  void watch_link();
  boost::asio::local::stream_protocol::acceptor acceptor_;
  transport::Engine& eng_;
  pipeline::Intake& intake_;
  SessionLimits limits_;
  std::map<std::uint32_t, std::shared_ptr<Session>> sessions_;
  std::uint32_t next_session_ = 1;
  /// XRC domains, shared by the sessions that opened them: a file's (by its
  /// inode), or one session's own. Freed when the last session lets go.
  struct XrcdShare {
    bool file = false;
    std::uint64_t dev = 0, ino = 0;
    std::uint32_t openers = 0;
  };
  std::map<transport::Xrcd*, XrcdShare> xrcds_;
  /// A session lets go of an XRC domain it opened (its SRQs and QPs in it
  /// are gone); the last one frees it.
  void release_xrcd(transport::Xrcd* x);
  AcceptGuard guard_;  // accepting out of descriptors: shed and pause, never spin
  boost::asio::steady_timer accept_pause_;
  std::uint64_t last_sweep_ms_ = 0;
  struct Refusals {
    std::uint64_t sessions = 0, sessions_per_uid = 0, unhelloed = 0, unhelloed_per_uid = 0, hello_timeouts = 0,
                  qps_per_uid = 0, mcast_per_uid = 0, flows_per_uid = 0, pending_rtr_per_uid = 0;
  } refused_;
  std::uint64_t memory_fault_closes_ = 0;  // sessions closed because their memory faulted (sigbus_guard)
  std::uint64_t sigbus_seen_ = 0;  // sigbus_guard::caught() at the last look
  std::uint64_t doorbells_ = 0;
  std::uint64_t cq_notifies_ = 0;
  std::string path_;
};

}  // namespace uroce::control
