// liburoce's data path: posts into the shared rings (sends, receives, SRQ
// receives and tag-matching operations), polling CQs and waiting on them,
// completion channel events, and the calls that turn an embedded node.
#include <fcntl.h>
#include <sched.h>
#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>

#include "stack/abi/codec.h"
#include "stack/abi/send_entry.h"
#include "stack/abi/wc_status.h"
#include "stack/verbs/liburoce_internal.h"

namespace {
namespace abi = uroce::abi;
using uroce::verbs_detail::embedded_deferred;
using uroce::verbs_detail::embedded_progress;
using uroce::verbs_detail::set_error;
using uroce::verbs_detail::wait_fd;

/// Receive work requests into a ring (a QP's RQ or an SRQ).
/// More than `max_sge` SGEs (the queue's max_recv_sge or max_sge) is EINVAL.
int push_recvs(abi::Ring<uroce_recv_entry>& ring, ibv_recv_wr* wr, ibv_recv_wr** bad, int max_sge) {
  for (; wr; wr = wr->next) {
    if (wr->num_sge < 0 || wr->num_sge > UROCE_ABI_MAX_SGE || wr->num_sge > max_sge) {
      if (bad) *bad = wr;
      return set_error(EINVAL, "more SGEs than the queue's max_recv_sge");
    }
    uroce_recv_entry e{};
    e.wr_id = wr->wr_id;
    e.num_sge = static_cast<std::uint32_t>(wr->num_sge);
    for (int i = 0; i < wr->num_sge; ++i)
      e.sg_list[i] = {wr->sg_list[i].addr, wr->sg_list[i].length, wr->sg_list[i].lkey};
    if (!ring.push(e)) {
      if (bad) *bad = wr;
      return set_error(ENOMEM, "receive queue full");
    }
  }
  return 0;
}

/// uroce_poll_cq, uroce_poll_cq_ts and uroce_poll_cq_ex: with kTs, each
/// entry's timestamp too; with kEx, its timestamp and tag.
template <bool kTs, bool kEx = false>
int poll_entries(uroce_cq* cq, int num, ibv_wc* wc, std::uint64_t* ts, uroce_wc_extra* ex = nullptr) {
  int n = 0;
  uroce_cq_entry e;
  const auto take = [&] {
    while (n < num && cq->ring.pop(e)) {
      if (e.opcode == kDiscardedCompletion) continue;  // its QP was reset since (uroce_modify_qp)
      if constexpr (kTs) ts[n] = e.timestamp;
      if constexpr (kEx) {
        const bool tm = e.opcode >= IBV_WC_TM_ADD && e.opcode <= IBV_WC_TM_NO_TAG && e.status == IBV_WC_SUCCESS;
        ex[n] = {e.timestamp, tm ? (std::uint64_t{e.tag_hi} << 32 | e.src_qp) : 0, tm ? e.vendor_err : 0, 0};
      }
      wc[n++] = abi::to_wc(e);
    }
  };
  take();
  // Embedded mode: nothing yet, or posts waiting for a pass
  // (embedded_posted), so turn the loop once and look again.
  if ((n == 0 || embedded_deferred()) && embedded_progress() > 0) take();
  return n;
}

}  // namespace

extern "C" {

const char* uroce_wc_status_str(ibv_wc_status s) { return uroce_wc_status_name(s); }

int uroce_post_send(uroce_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) {
  if ((qp->init.qp_type == IBV_QPT_XRC_RECV || qp->init.rss_log_size) && wr) {
    if (bad) *bad = wr;
    return set_error(EINVAL, "an XRC target QP or an RSS QP has no send queue");
  }
  // The daemon publishes the QP's state; before RTS a send is refused here,
  // as rxe refuses it (in ERR it is taken, and flushed).
  if (const int st = qp->sq.qp_state(); st >= 0 && st < IBV_QPS_RTS && wr) {
    if (bad) *bad = wr;
    return set_error(EINVAL, "the QP is not ready to send (not in RTS)");
  }
  const abi::SendTarget to{qp->init.qp_type == IBV_QPT_UD, qp->init.qp_type == IBV_QPT_XRC_SEND};
  for (; wr; wr = wr->next) {
    abi::SendAv av;
    if (to.ud) {
      // The address vector, from the AH (the entry carries it: uroce_abi.h's op.ud).
      const auto* ah = reinterpret_cast<const uroce_ah*>(wr->wr.ud.ah);
      if (ah != nullptr && ah->magic == uroce_ah::kAhMagic) av = {ah->dgid, ah->dmac, ah->traffic_class};
    }
    uroce_send_entry e;
    if (const char* why = abi::encode_send(*wr, to, &av, e)) {
      if (bad) *bad = wr;
      qp->ctx->posted(qp->sq.header(), qp->qpn);  // what was posted before this one
      return set_error(EINVAL, why);
    }
    if (!qp->sq.push(e)) {
      if (bad) *bad = wr;
      qp->ctx->posted(qp->sq.header(), qp->qpn);  // what was posted before this one
      return set_error(ENOMEM, "send queue full");
    }
  }
  qp->ctx->posted(qp->sq.header(), qp->qpn);
  return 0;
}

int uroce_post_recv(uroce_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  if ((qp->init.qp_type == IBV_QPT_XRC_SEND || qp->init.qp_type == IBV_QPT_XRC_RECV) && wr) {
    if (bad) *bad = wr;
    return set_error(EINVAL, "an XRC QP has no receive queue (its receives are the XRC SRQs')");
  }
  if (qp->init.srq) {
    if (bad) *bad = wr;
    return set_error(EINVAL, "this QP receives from an SRQ: use uroce_post_srq_recv");
  }
  if (qp->init.rss_log_size && wr) {
    if (bad) *bad = wr;
    return set_error(EINVAL, "an RSS QP receives into its work queues: post to them");
  }
  if (qp->sq.qp_state() == IBV_QPS_RESET && wr) {
    if (bad) *bad = wr;
    return set_error(EINVAL, "the QP is in RESET: receives are taken from INIT on");
  }
  // max_recv_sge as created bounds each receive (EINVAL past it, as rxe);
  // a QP created with 0 takes up to the ABI's 4 (liburoce's own callers
  // often leave it unset).
  const std::uint32_t max_sge = qp->init.cap.max_recv_sge ? qp->init.cap.max_recv_sge : UROCE_ABI_MAX_SGE;
  const int rc = push_recvs(qp->rq, wr, bad, static_cast<int>(max_sge));
  qp->ctx->posted_recv(&qp->sq, qp->qpn);
  return rc;
}

int uroce_post_srq_ops(uroce_srq* srq, ibv_ops_wr* wr, ibv_ops_wr** bad) {
  if (!srq || !srq->released) {
    if (bad) *bad = wr;
    return set_error(EINVAL, "not a tag-matching SRQ");
  }
  int rc = 0;
  for (; wr; wr = wr->next) {
    uroce_tm_op op{};
    op.wr_id = wr->wr_id;
    op.opcode = static_cast<std::uint8_t>(wr->opcode);
    op.flags = static_cast<std::uint8_t>(wr->flags);
    op.unexpected_cnt = wr->tm.unexpected_cnt;
    const bool known_flags = (wr->flags & ~(IBV_OPS_SIGNALED | IBV_OPS_TM_SYNC)) == 0;
    if (!known_flags || (wr->opcode != IBV_WR_TAG_ADD && wr->opcode != IBV_WR_TAG_DEL && wr->opcode != IBV_WR_TAG_SYNC)) {
      rc = set_error(EINVAL, "an unknown operation or flag");
      break;
    }
    if (wr->opcode == IBV_WR_TAG_ADD) {
      if (wr->tm.add.num_sge < 0 || wr->tm.add.num_sge > UROCE_TM_MAX_SGE ||
          (wr->tm.add.num_sge > 0 && !wr->tm.add.sg_list)) {
        rc = set_error(EINVAL, "a tag takes at most one SGE");
        break;
      }
      // A free index: the daemon has released its last use.
      std::uint32_t i = 0;
      const auto n = static_cast<std::uint32_t>(srq->gen.size());
      while (i < n && std::atomic_ref<const std::uint32_t>(srq->released[i]).load(std::memory_order_acquire) != srq->gen[i])
        ++i;
      if (i == n) {
        rc = set_error(ENOMEM, "every tag is in use");
        break;
      }
      op.handle = i;
      op.gen = srq->gen[i] + 1;
      op.tag = wr->tm.add.tag;
      op.mask = wr->tm.add.mask;
      op.recv_wr_id = wr->tm.add.recv_wr_id;
      op.num_sge = static_cast<std::uint8_t>(wr->tm.add.num_sge);
      if (op.num_sge)
        op.sge = {wr->tm.add.sg_list[0].addr, wr->tm.add.sg_list[0].length, wr->tm.add.sg_list[0].lkey};
      if (!srq->ops.push(op)) {
        rc = set_error(ENOMEM, "the operations queue is full");
        break;
      }
      srq->gen[i] = op.gen;
      wr->tm.handle = i;
      continue;
    }
    if (wr->opcode == IBV_WR_TAG_DEL) {
      if (wr->tm.handle >= srq->gen.size()) {
        rc = set_error(EINVAL, "no such tag");
        break;
      }
      op.handle = wr->tm.handle;
      op.gen = srq->gen[wr->tm.handle];
    }
    if (!srq->ops.push(op)) {
      rc = set_error(ENOMEM, "the operations queue is full");
      break;
    }
  }
  if (rc && bad) *bad = wr;
  srq->ctx->posted(srq->ops.header(), UROCE_WORK_TM_SRQ | srq->handle);
  return rc;
}

int uroce_post_srq_recv(uroce_srq* srq, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  const int rc = push_recvs(srq->ring, wr, bad, UROCE_ABI_MAX_SGE);
  srq->ctx->posted_recv(nullptr, 0);  // an SRQ's receives are read as requests come
  return rc;
}

int uroce_req_notify_cq(uroce_cq* cq, int solicited_only) {
  (void)solicited_only;  // notified on the next completion of any kind (a superset, as verbs allows)
  if (!cq || !cq->channel) return set_error(EINVAL, "the CQ has no completion channel");
  cq->ring.arm_notify();
  return 0;
}

int uroce_get_cq_event(uroce_comp_channel* ch, uroce_cq** cq, void** cq_context) {
  if (!ch || !cq) return set_error(EINVAL, "no channel");
  for (;;) {
    // Drain the socket first: the daemon moves a CQ's notification count
    // before it writes, so the scan below sees everything drained here.
    (void)abi::drain(ch->fd);
    uroce_cq* hit = nullptr;
    bool more = false;
    for (uroce_cq* c : ch->cqs) {
      if (c->ring.notified() == c->events_seen) continue;
      if (hit) {
        more = true;
        break;
      }
      hit = c;
    }
    if (hit) {
      hit->events_seen = hit->ring.notified();
      *cq = hit;
      if (cq_context) *cq_context = hit->cq_context;
      if (more) (void)abi::ring(ch->peer);  // keep the fd readable for the next one
      return 0;
    }
    if (::fcntl(ch->fd, F_GETFL) & O_NONBLOCK) return set_error(EAGAIN, "no completion event (non-blocking channel)");
    // Block in a read, as rdma-core does (a read() of the channel): a
    // signal then ends the wait with EINTR unless its handler restarts
    // system calls (SA_RESTART), exactly as there. qperf's server ends its
    // test on SIGALRM so.
    char b;
    if (::recv(ch->fd, &b, 1, MSG_PEEK) < 0) return set_error(errno, "cannot wait on the completion channel");
  }
}

void uroce_ack_cq_events(uroce_cq* cq, unsigned int nevents) {
  (void)cq;  // events hold no reference here; kept for verbs compatibility
  (void)nevents;
}

int uroce_poll_cq_wait(uroce_cq* cq, int num, ibv_wc* wc, int spin_us, int timeout_ms) {
  if (!cq || num <= 0 || !wc) return errno = EINVAL, -1;
  int n = uroce_poll_cq(cq, num, wc);
  if (n > 0 || timeout_ms == 0) return n;
  using clk = std::chrono::steady_clock;
  const auto start = clk::now();
  // What came, after how long: the CQ's polling window learns from it.
  const auto got = [&](int k) {
    cq->spin.gap(static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(clk::now() - start).count()));
    return k;
  };
  if (spin_us > 0) {
    // Poll for the window (abi/spin.h), giving the core away between empty
    // polls: the daemon, or the peer, that makes the completion may need it.
    const auto until = start + std::chrono::nanoseconds(cq->spin.window_ns(std::uint64_t(spin_us) * 1000));
    do {
      if ((n = uroce_poll_cq(cq, num, wc)) > 0) return got(n);
      (void)::sched_yield();  // the core to whoever makes the completion (abi/spin.h)
    } while (clk::now() < until);
  }
  if (!cq->channel) {
    set_error(EINVAL, "the CQ has no completion channel to block on");
    return -1;
  }
  const auto deadline = start + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    // Arm, then look once more: a completion pushed before the daemon saw
    // the arm is found here, one after it makes the channel readable.
    cq->ring.arm_notify();
    if ((n = uroce_poll_cq(cq, num, wc)) > 0) return got(n);
    int wait_ms = -1;
    if (timeout_ms > 0) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clk::now()).count();
      if (left <= 0) return 0;
      wait_ms = static_cast<int>(left) + 1;
    }
    if (wait_fd(cq->channel->fd, wait_ms) < 0) {
      set_error(errno, "cannot wait on the completion channel");
      return -1;
    }
    // Empty the channel (another CQ's notification may be drained with it:
    // a spurious wake-up for uroce_get_cq_event, which verbs allows).
    (void)abi::drain(cq->channel->fd);
    if ((n = uroce_poll_cq(cq, num, wc)) > 0) return got(n);
  }
}

int uroce_poll_cq_ts(uroce_cq* cq, int num, ibv_wc* wc, std::uint64_t* ts) { return poll_entries<true>(cq, num, wc, ts); }
int uroce_poll_cq_ex(uroce_cq* cq, int num, ibv_wc* wc, uroce_wc_extra* ex) {
  return poll_entries<false, true>(cq, num, wc, nullptr, ex);
}

int uroce_poll_cq(uroce_cq* cq, int num, ibv_wc* wc) { return poll_entries<false>(cq, num, wc, nullptr); }

int uroce_wait_fd(int fd, int timeout_ms) {
  const int r = wait_fd(fd, timeout_ms);
  if (r < 0) set_error(errno, "cannot wait on the descriptor");
  return r;
}

int uroce_progress(uroce_context* ctx) {
  (void)ctx;  // progress is the process's: one embedded node serves every context
  return static_cast<int>(embedded_progress());
}

}  // extern "C"
