// Completer: consumes ACKs, NAKs, READ responses and atomic ACKs, retires
// send WQEs in order, and drives go-back-N and the retry/RNR limits
// (IBTA 9.7.5.2, rxe_comp.c's role).
#include <cstring>

#include "stack/transport/engine.h"

namespace uroce::transport {

using wire::AethKind;
using wire::Psn;
namespace op = wire::op;

namespace {

/// Where a READ or atomic WQE still waits for its responses: the PSN of the
/// next response it needs.
Psn waiting_psn(const SendWqe& w) { return w.first_psn + w.read_pkts_done; }

bool needs_response(const SendWqe& w) { return w.kind == WqeKind::kRead || w.kind == WqeKind::kAtomic; }

}  // namespace

/// Retires every SEND/WRITE WQE fully covered by an acknowledgement of
/// `psn` and advances una. Returns true on forward progress.
bool Engine::ack_upto(Qp& qp, Psn psn) {
  Requester& r = qp.req;
  bool progress = false;
  while (!qp.sq.empty()) {
    SendWqe& w = qp.sq.front();
    if (!w.started || needs_response(w)) break;
    if (w.kind == WqeKind::kLocal) {
      // Executed, and now the oldest: done (a failed one is the requester's
      // to complete in error).
      if (w.local_status != IBV_WC_SUCCESS) break;
      complete_send(qp, IBV_WC_SUCCESS);
      progress = true;
      continue;
    }
    if (is_before(psn, w.first_psn + (w.npkts - 1))) break;  // only partly acknowledged
    complete_send(qp, IBV_WC_SUCCESS);
    progress = true;
  }
  Psn new_una = psn + 1;
  if (!qp.sq.empty() && qp.sq.front().started && needs_response(qp.sq.front())) {
    // An ACK cannot acknowledge a READ or atomic: only its responses can.
    const Psn lim = waiting_psn(qp.sq.front());
    if (is_before(lim, new_una)) new_una = lim;
  }
  if (is_before(r.una, new_una)) {
    r.una = new_una;
    progress = true;
  }
  return progress;
}

void Engine::retire_local(Qp& qp) {
  while (!qp.sq.empty() && qp.sq.front().kind == WqeKind::kLocal && qp.sq.front().started &&
         qp.sq.front().local_status == IBV_WC_SUCCESS)
    complete_send(qp, IBV_WC_SUCCESS);
}

void Engine::on_response(Qp& qp, const wire::Packet& pkt, std::uint64_t now) {
  Requester& r = qp.req;
  if (qp.type != IBV_QPT_RC || qp.state == IBV_QPS_RTR) {
    qp.ctr.inc(QpCounter::unexpected_resp);
    return;
  }
  const Psn p = pkt.psn;
  const std::int32_t ahead = distance(r.una, p);
  const std::int32_t outstanding = distance(r.una, r.sent_hi);
  if (ahead >= outstanding) {
    // A PSN we never sent: never act on it (a ghost, or a stale peer).
    qp.ctr.inc(pkt.opcode == op::kRcAck ? QpCounter::ghost_acks : QpCounter::unexpected_resp);
    return;
  }
  if (ahead < 0) {
    qp.ctr.inc(pkt.opcode == op::kRcAck ? QpCounter::duplicate_acks : QpCounter::unexpected_resp);
    return;
  }

  bool progress = false;
  const Psn una_before = r.una;
  const std::uint8_t syn = pkt.aeth() ? pkt.aeth()->syndrome : 0;
  if (pkt.opcode == op::kRcAck) {
    switch (wire::aeth_kind(syn)) {
      case AethKind::kAck: {
        progress = ack_upto(qp, p);
        // An ACK beyond a READ or atomic we still wait on means its responses
        // were lost on the way: go back to them now rather than on timeout.
        if (!qp.sq.empty() && qp.sq.front().started && needs_response(qp.sq.front()) &&
            !is_before(p, waiting_psn(qp.sq.front()))) {
          if (progress) renew_retries(qp);
          if (!r.retry_pending) retry_or_fail(qp, now, false);
          return;
        }
        break;
      }
      case AethKind::kRnrNak: {
        if (ack_upto(qp, p - 1)) renew_retries(qp);
        qp.ctr.inc(QpCounter::rcvd_rnr_err);
        if (qp.rnr_retry != 7) {  // 7: retry for ever (IBTA 9.7.5.2.8)
          if (r.rnr_left == 0) {
            qp.ctr.inc(QpCounter::retry_rnr_exceeded_err);
            if (!qp.sq.empty()) complete_send(qp, IBV_WC_RNR_RETRY_EXC_ERR);
            set_error(qp);
            return;
          }
          --r.rnr_left;
        }
        r.retry_deadline = 0;
        r.rnr_until = now + rnr_timer_ns(syn & 31);
        go_back(qp, p);
        activate(qp);
        return;
      }
      case AethKind::kNak: {
        // A NAK acknowledges everything before it: that is progress, and
        // resets the retry budget before this retry is counted.
        if (ack_upto(qp, p - 1)) renew_retries(qp);
        const unsigned code = syn & 31;
        if (code == static_cast<unsigned>(wire::NakCode::kPsnSeqError)) {
          qp.ctr.inc(QpCounter::rcvd_seq_err);
          // While waiting out an RNR NAK, a sequence NAK for the rest of the
          // same message is its echo (the later packets arrived after the
          // RNR'd one was refused): the RNR retry covers it, and nothing was lost.
          if (r.rnr_until != 0) return;
          cc_event(qp, [now](cc::Algorithm& a) { a.on_nak(now); });
          if (!r.retry_pending) retry_or_fail(qp, now, false, p);
          return;
        }
        qp.ctr.inc(QpCounter::rcvd_naks);
        const ibv_wc_status st = code == 1   ? IBV_WC_REM_INV_REQ_ERR
                                 : code == 2 ? IBV_WC_REM_ACCESS_ERR
                                 : code == 3 ? IBV_WC_REM_OP_ERR
                                             : IBV_WC_REM_INV_RD_REQ_ERR;
        if (!qp.sq.empty()) complete_send(qp, st);
        set_error(qp);
        return;
      }
      case AethKind::kReserved: qp.ctr.inc(QpCounter::unexpected_resp); return;
    }
  } else {
    // READ response or atomic ACK: both acknowledge everything before them.
    progress = ack_upto(qp, p - 1);
    if (qp.sq.empty() || !qp.sq.front().started || !needs_response(qp.sq.front())) {
      qp.ctr.inc(QpCounter::unexpected_resp);
      return;
    }
    SendWqe& w = qp.sq.front();
    const Psn want = waiting_psn(w);
    const bool is_read_resp = pkt.info->has(wire::kOpReadResp);
    if (is_read_resp != (w.kind == WqeKind::kRead)) {
      qp.ctr.inc(QpCounter::unexpected_resp);
      return;
    }
    if (p != want) {
      if (is_before(want, p)) {
        // A response went missing: start again from it (9.7.5.2.7).
        if (progress) renew_retries(qp);
        if (!r.retry_pending) retry_or_fail(qp, now, false, want);
      } else {
        qp.ctr.inc(QpCounter::unexpected_resp);
      }
      return;
    }
    if (is_read_resp) {
      const std::uint64_t off = std::uint64_t{w.read_pkts_done} * qp.mtu;
      const bool last_pkt = w.read_pkts_done + 1 == w.npkts;
      // Opcode sequence (9.7.5.2.3): a response stream starts with FIRST or
      // ONLY, continues with MIDDLE, and ends with LAST exactly at the end.
      // A READ restarted part-way (after a lost response) is a new request,
      // so its answer should start again with FIRST or ONLY; Linux rxe
      // instead continues the original run with MIDDLE or LAST (seen in
      // docs/interop.md). Both are taken at the restart PSN.
      const bool starts = pkt.info->has(wire::kOpStart), ends = pkt.info->has(wire::kOpEnd);
      const bool restarted = w.read_pkts_done > 0 && !w.read_stream_open;
      if ((!restarted && starts == w.read_stream_open) || ends != last_pkt) {
        qp.ctr.inc(QpCounter::unexpected_resp);
        return;
      }
      w.read_stream_open = !ends;
      const std::uint64_t expect = last_pkt ? w.length - off : qp.mtu;
      if (pkt.payload_len != std::min<std::uint64_t>(expect, w.length)) {
        qp.ctr.inc(QpCounter::unexpected_resp);
        return;
      }
      // Scatter into the local SGEs, checked again: the MR may have been
      // deregistered since the READ started.
      if (!translate_sges(qp, w)) {
        if (&w == &qp.sq.at(qp.sq.head())) complete_send(qp, IBV_WC_LOC_PROT_ERR);
        set_error(qp);
        return;
      }
      std::uint64_t skip = off;
      std::size_t done = 0;
      const auto data = pkt.payload();
      for (std::uint32_t i = 0; i < w.nsge && done < data.size(); ++i) {
        const Sge& s = w.sge[i];
        if (skip >= s.length) {
          skip -= s.length;
          continue;
        }
        const std::size_t take = static_cast<std::size_t>(std::min<std::uint64_t>(data.size() - done, s.length - skip));
        if (!put_bytes(w.local[i].at(skip), data.data() + done, take)) {
          // An ODP page the application no longer has: a local protection error.
          if (&w == &qp.sq.at(qp.sq.head())) complete_send(qp, IBV_WC_LOC_PROT_ERR);
          set_error(qp);
          return;
        }
        done += take;
        skip = 0;
      }
      ++w.read_pkts_done;
      r.una = p + 1;
      progress = true;
      if (w.read_pkts_done == w.npkts) {
        complete_send(qp, IBV_WC_SUCCESS);
        retire_local(qp);
      }
    } else {
      const std::uint64_t orig = pkt.atomic_ack()->orig.get();
      if (!translate_sges(qp, w)) {
        if (&w == &qp.sq.at(qp.sq.head())) complete_send(qp, IBV_WC_LOC_PROT_ERR);
        set_error(qp);
        return;
      }
      std::uint8_t ob[sizeof orig];
      std::memcpy(ob, &orig, sizeof orig);
      if (!put_bytes(w.local[0], ob, sizeof ob)) {
        if (&w == &qp.sq.at(qp.sq.head())) complete_send(qp, IBV_WC_LOC_PROT_ERR);
        set_error(qp);
        return;
      }
      w.read_pkts_done = 1;
      r.una = p + 1;
      progress = true;
      complete_send(qp, IBV_WC_SUCCESS);
      retire_local(qp);
    }
  }
  if (progress) on_progress(qp, una_before, now);
}

void Engine::renew_retries(Qp& qp) {
  qp.req.retry_pending = false;
  qp.req.retry_left = qp.retry_cnt;
  qp.req.rnr_left = qp.rnr_retry;
}

void Engine::on_progress(Qp& qp, Psn una_before, std::uint64_t now) {
  Requester& r = qp.req;
  on_acked(qp, una_before, now);
  // Forward progress resets the retry budget and restarts the timer.
  renew_retries(qp);
  r.retry_deadline = 0;
  r.charge_at = 0;
  if (r.una != r.sent_hi) arm_retry(qp, now);
  // A poll visit only when the requester may send now (the window opened,
  // or WQEs wait at the cursor), or may need one for another reason (not in
  // RTS, selective repeat, a response to send). Otherwise the timer is
  // moved here and nothing else: with thousands of QPs, each with a message
  // or two in flight, that is one visit a message instead of two, and each
  // visit is a cache miss (docs/performance.md). Posts that come later
  // activate it themselves (take_posts).
  const bool idle = qp.state == IBV_QPS_RTS && !qp.sr && r.cursor == qp.sq.tail() && qp.resp.out.empty();
  if (qp.active || !idle) {
    activate(qp);
  } else {
    settle_timer(qp, now);
  }
}

/// Starts go-back-N from `from` (default: the oldest unacknowledged PSN), or
/// fails the oldest WQE with RETRY_EXC_ERR when the retry budget is spent.
void Engine::retry_or_fail(Qp& qp, std::uint64_t now, bool from_timeout, std::optional<Psn> from) {
  Requester& r = qp.req;
  const bool sr = qp.sr && !sr_fenced(qp);
  if (sr && from_timeout && r.charge_at != 0 && now < r.charge_at) {
    // A short timeout before the IBTA timer has run out resends what is
    // missing and spends nothing (arm_retry); one at or after it spends a
    // retry, or fails the QP, and restarts that timer.
    sr_timeout(qp, now);
    return;
  }
  if (r.retry_left == 0) {
    qp.ctr.inc(QpCounter::retry_exceeded_err);
    if (!qp.sq.empty()) complete_send(qp, IBV_WC_RETRY_EXC_ERR);
    set_error(qp);
    return;
  }
  // IBTA C9-141: retry_cnt counts retries; unlike rxe, 7 is not infinite.
  --r.retry_left;
  if (!from_timeout) qp.ctr.inc(QpCounter::completer_retry_err);
  if (sr) {
    r.charge_at = 0;
    sr_timeout(qp, now);  // only what is missing goes again
    return;
  }
  r.retry_pending = true;  // cleared by progress; a timeout may retry again
  r.restart_ackreq = true;
  r.restart_twice = r.retry_left + 1 < qp.retry_cnt;  // this stall has already cost a retry
  go_back(qp, from.value_or(r.una));
  r.retry_deadline = 0;
  arm_retry(qp, now);
  activate(qp);
}

void Engine::on_acked(Qp& qp, Psn una_before, std::uint64_t now) {
  Requester& r = qp.req;
  while (r.probe_count != 0 && is_before(r.probes[r.probe_head].psn, r.una)) {
    // A probe is acknowledged: a round-trip sample.
    const std::uint64_t rtt = now - r.probes[r.probe_head].sent;
    r.probe_head = (r.probe_head + 1) % Requester::kProbes;
    --r.probe_count;
    qp.rtt.add(rtt);
    cc_event(qp, [now, rtt](cc::Algorithm& a) { a.on_rtt(now, rtt); });
  }
  const std::int32_t acked = distance(una_before, r.una);
  if (acked > 0) cc_event(qp, [now, acked](cc::Algorithm& a) { a.on_ack(now, static_cast<std::uint32_t>(acked)); });
}

void Engine::on_timers(Qp& qp, std::uint64_t now) {
  Requester& r = qp.req;
  if (qp.cc) {
    const std::uint64_t t = qp.cc->next_timer();
    if (t != 0 && now >= t) cc_event(qp, [now](cc::Algorithm& a) { a.on_timer(now); });
  }
  if (r.rnr_until != 0 && now >= r.rnr_until) {
    r.rnr_until = 0;
    arm_retry(qp, now);
  }
  if (r.retry_deadline != 0 && now >= r.retry_deadline) {
    r.retry_deadline = 0;
    if (r.una == r.sent_hi) return;  // everything acknowledged meanwhile
    qp.ctr.inc(QpCounter::timeouts);
    cc_event(qp, [now](cc::Algorithm& a) { a.on_timeout(now); });
    retry_or_fail(qp, now, true);
  }
}

}  // namespace uroce::transport
