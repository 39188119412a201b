// liburoce's side of the RDMA CM: the uroce_cm_* calls, which ask the
// daemon's CM agent (stack/cm) through the session, and the CM event
// channel that the daemon rings.
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <mutex>

#include "stack/abi/session_proto.h"
#include "stack/verbs/liburoce_internal.h"

namespace {
namespace abi = uroce::abi;
using uroce::verbs_detail::call;
using uroce::verbs_detail::set_error;
using uroce::verbs_detail::wait_fd;

/// A CM request with its parameters filled in.
int cm_call(uroce_context* ctx, std::uint16_t type, uroce_cm_msg& m, const uroce_cm_param* p, void* reply = nullptr,
            std::size_t rlen = 0) {
  if (p) {
    if (p->private_data_len > UROCE_CM_PRIVATE_MAX || (p->private_data_len && !p->private_data))
      return set_error(EINVAL, "CM private data is at most 56 bytes");
    m.private_len = p->private_data_len;
    if (p->private_data_len) std::memcpy(m.private_data, p->private_data, p->private_data_len);
    m.mtu = static_cast<std::uint8_t>(p->mtu);
    m.responder_resources = p->responder_resources;
    m.initiator_depth = p->initiator_depth;
    m.retry_cnt = p->retry_count;
    m.rnr_retry = p->rnr_retry_count;
    if (p->flags & ~(UROCE_CM_APP_QP | UROCE_CM_ACK_TIMEOUT)) return set_error(EINVAL, "unknown CM flags");
    if ((p->flags & UROCE_CM_APP_QP) && ctx->minor < 9)
      return set_error(EOPNOTSUPP, "this uroced cannot leave a QP to the application (ABI minor < 9)");
    if (p->flags & UROCE_CM_ACK_TIMEOUT) {
      if (ctx->minor < 12) return set_error(EOPNOTSUPP, "this uroced takes no ACK timeout for a CM connection (ABI minor < 12)");
      if (p->ack_timeout > 31) return set_error(EINVAL, "the ACK timeout is 0..31");
      m.ack_timeout = p->ack_timeout;
    }
    m.flags = p->flags;
  }
  return call(ctx, type, &m, sizeof m, -1, reply, rlen);
}

/// A listen or unlisten of a port, in RDMA_PS_UDP's space with UROCE_CM_UD.
int cm_port_call(uroce_context* ctx, std::uint16_t type, std::uint16_t port, std::uint8_t flags) {
  if (!ctx) return set_error(EINVAL, "no context");
  if (flags && ctx->minor < 9) return set_error(EOPNOTSUPP, "this uroced has no SIDR (ABI minor < 9)");
  uroce_cm_msg m{};
  m.port = port;
  m.flags = flags;
  return cm_call(ctx, type, m, nullptr);
}

}  // namespace

extern "C" {

int uroce_cm_listen(uroce_context* ctx, std::uint16_t port) { return cm_port_call(ctx, UROCE_MSG_CM_LISTEN, port, 0); }
int uroce_cm_unlisten(uroce_context* ctx, std::uint16_t port) {
  return cm_port_call(ctx, UROCE_MSG_CM_UNLISTEN, port, 0);
}
int uroce_cm_listen_ud(uroce_context* ctx, std::uint16_t port) {
  return cm_port_call(ctx, UROCE_MSG_CM_LISTEN, port, UROCE_CM_UD);
}
int uroce_cm_unlisten_ud(uroce_context* ctx, std::uint16_t port) {
  return cm_port_call(ctx, UROCE_MSG_CM_UNLISTEN, port, UROCE_CM_UD);
}

int uroce_cm_connect(uroce_qp* qp, const ibv_gid* dgid, std::uint16_t port, const uroce_cm_param* p,
                     std::uint32_t* id) {
  if (!qp || !dgid || !id) return set_error(EINVAL, "no QP, GID or id");
  uroce_cm_msg m{};
  m.qp = qp->handle;
  std::memcpy(m.dgid, dgid->raw, 16);
  m.port = port;
  uroce_cm_id_reply r{};
  const int rc = cm_call(qp->ctx, UROCE_MSG_CM_CONNECT, m, p, &r, sizeof r);
  if (rc == 0) *id = r.id;
  return rc;
}

int uroce_cm_accept(uroce_qp* qp, std::uint32_t id, const uroce_cm_param* p) {
  if (!qp) return set_error(EINVAL, "no QP");
  uroce_cm_msg m{};
  m.qp = qp->handle;
  m.id = id;
  return cm_call(qp->ctx, UROCE_MSG_CM_ACCEPT, m, p);
}

int uroce_cm_reject(uroce_context* ctx, std::uint32_t id, const void* priv, std::uint8_t len) {
  if (!ctx) return set_error(EINVAL, "no context");
  uroce_cm_msg m{};
  m.id = id;
  const uroce_cm_param p{priv, len, 0, 0, 0, 0, static_cast<ibv_mtu>(0)};
  return cm_call(ctx, UROCE_MSG_CM_REJECT, m, &p);
}

int uroce_cm_establish(uroce_context* ctx, std::uint32_t id) {
  if (!ctx) return set_error(EINVAL, "no context");
  uroce_cm_msg m{};
  m.id = id;
  return cm_call(ctx, UROCE_MSG_CM_ESTABLISH, m, nullptr);
}

int uroce_cm_disconnect(uroce_context* ctx, std::uint32_t id) {
  if (!ctx) return set_error(EINVAL, "no context");
  uroce_cm_msg m{};
  m.id = id;
  return cm_call(ctx, UROCE_MSG_CM_DISCONNECT, m, nullptr);
}

int uroce_cm_fd(uroce_context* ctx) {
  if (!ctx) return set_error(EINVAL, "no context"), -1;
  std::call_once(ctx->cm_once, [ctx] {
    // A datagram socket pair, as for a completion channel: the daemon rings
    // its end per queued event and never blocks on it.
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0) return;
    ctx->cm_fd = sv[0];
    ctx->cm_pushed = call(ctx, UROCE_MSG_CM_CHANNEL, nullptr, 0, sv[1], nullptr, 0) == 0;
    ::close(sv[1]);  // the daemon holds its own copy
  });
  if (ctx->cm_fd < 0) return set_error(EMFILE, "cannot create the CM channel"), -1;
  return ctx->cm_fd;
}

int uroce_cm_get_event(uroce_context* ctx, int timeout_ms, uroce_cm_event* ev) {
  if (!ctx || !ev) return set_error(EINVAL, "no context or event");
  // Events wait in the daemon (or the embedded node), which rings the CM
  // channel after queueing one: drain the channel, ask, and sleep on it if
  // there was none (a ring that comes after the drain wakes the sleep).
  const int fd = uroce_cm_fd(ctx);
  if (fd < 0) return errno;
  using clk = std::chrono::steady_clock;
  const auto deadline = clk::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    (void)abi::drain(fd);
    uroce_cm_event_msg r{};
    // An older daemon's event is shorter: what it lacks reads as 0.
    const std::size_t rlen = ctx->minor >= 9 ? sizeof r : offsetof(uroce_cm_event_msg, sq_psn);
    const int rc = call(ctx, UROCE_MSG_CM_EVENT, nullptr, 0, -1, &r, rlen);
    if (rc == 0) {
      *ev = uroce_cm_event{};
      ev->event = static_cast<uroce_cm_event_type>(r.event);
      ev->id = r.id;
      ev->status = r.status;
      ev->peer_qp_num = r.peer_qpn;
      std::memcpy(ev->peer_gid.raw, r.peer_gid, 16);
      ev->peer_port = r.peer_port;
      ev->local_port = r.local_port;
      ev->responder_resources = r.responder_resources;
      ev->initiator_depth = r.initiator_depth;
      ev->mtu = static_cast<ibv_mtu>(r.mtu);
      ev->private_data_len = std::min<std::uint8_t>(r.private_len, sizeof ev->private_data);
      std::memcpy(ev->private_data, r.private_data, ev->private_data_len);
      ev->sq_psn = r.sq_psn;
      ev->rq_psn = r.rq_psn;
      ev->retry_count = r.retry_cnt;
      ev->rnr_retry_count = r.rnr_retry;
      ev->timeout = r.ack_timeout;
      ev->max_rd_atomic = r.max_rd_atomic;
      ev->max_dest_rd_atomic = r.max_dest_rd_atomic;
      ev->ud = r.ud;
      ev->qkey = r.qkey;
      return 0;
    }
    if (rc != EAGAIN) return rc;
    if (timeout_ms == 0) return rc;
    int wait_ms = -1;
    if (timeout_ms > 0) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clk::now()).count();
      if (left <= 0) return set_error(ETIMEDOUT, "no CM event in time");
      wait_ms = static_cast<int>(left);
    }
    if (!ctx->cm_pushed) wait_ms = wait_ms < 0 ? 1 : std::min(wait_ms, 1);  // an older daemon: ask again in 1 ms
    if (wait_fd(fd, wait_ms) < 0 && errno != EINTR) return set_error(errno, "cannot wait on the CM channel");
  }
}

}  // extern "C"
