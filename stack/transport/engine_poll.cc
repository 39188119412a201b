// The poll loop: the QPs that may have work now (the active list), served
// in turn, and the timer wheel that holds the QPs waiting only on a
// deadline until it comes.
#include <algorithm>

#include "stack/transport/engine.h"

namespace uroce::transport {

void Engine::poll(std::uint64_t now) {
  last_now_ = now;
  send_coalesced_acks();
  // Quarantined numbers whose time is up are freed a few slots a pass, so
  // they do not pile up (their memory, the status) until the table fills.
  // Nothing to look at, and nothing done, while none is quarantined.
  if (quarantined_) {
    for (int k = 0; k < 8 && quarantined_; ++k) {
      reap_cursor_ = (reap_cursor_ + 1) % qps_.size();
      Qp* q = qps_[reap_cursor_].get();
      if (q && q->quarantine_until && q->quarantine_until <= now) release(*q);
    }
  }
  // Neighbours still waited for, asked again on their backoff.
  if (neighbors_.waiting())
    neighbors_.due(now, [this](const wire::IpAddr& ip) {
      if (resolver_) resolver_(resolver_ctx_, ip);
    });
  // QPs whose time has come join those with work.
  wheel_.expire(now, [this](Qp& qp) { activate(qp); });
  if (!metered()) {
    serve_active(now, true);
    cq_events();
    return;
  }
  // Deficit round robin between tenants. Each starts the poll with its
  // quantum (what it saved is capped at that, and a debt is carried). The
  // first pass serves every QP within its tenant's share, so a tenant with
  // one packet to send gets it out behind at most a quantum of any other's.
  // While two or more tenants have work left, the ones with work share the
  // ring's remaining room by weight and are served again, so a poll takes
  // a round or two however full the ring gets; when only one has, it takes
  // what room is left.
  for_each_share([this](std::uint16_t, Tenant& t) {
    const std::int64_t q = std::int64_t{cfg_.tx_quantum} * t.weight;
    t.deficit = std::min(t.deficit + q, q);
    t.backlog = false;
  });
  unmetered_ = -1;
  poll_bytes_ = poll_frames_ = 0;
  serve_active(now, true);
  for (int round = 1; round < 16 && tx_.size() < tx_limit(); ++round) {
    std::size_t waiting = 0, last = 0;
    std::int64_t weights = 0;
    for_each_share([&](std::uint16_t i, Tenant& t) {
      t.serve = t.backlog;
      t.backlog = false;
      if (!t.serve) return;
      ++waiting;
      last = i;
      weights += t.weight;
    });
    if (waiting == 0) break;
    if (waiting == 1) {
      unmetered_ = static_cast<std::int64_t>(last);
    } else {
      // The room left in the TX ring, in bytes at this poll's mean frame,
      // shared by weight (at least a quantum each): a round or two fills
      // it, each tenant its share, whatever order its QPs are listed in.
      const std::int64_t mean = poll_frames_ ? static_cast<std::int64_t>(poll_bytes_ / poll_frames_) : 1024;
      const std::int64_t room = std::int64_t{tx_limit() - tx_.size()} * mean;
      for_each_share([&](std::uint16_t, Tenant& t) {
        if (t.serve) t.deficit += std::max<std::int64_t>(std::int64_t{cfg_.tx_quantum} * t.weight, room * t.weight / weights);
      });
    }
    serve_active(now, false);
  }
  // A tenant that has sent all it had keeps no credit (only a debt).
  for_each_share([](std::uint16_t, Tenant& t) {
    if (!t.backlog) t.deficit = std::min<std::int64_t>(t.deficit, 0);
  });
  unmetered_ = -1;
  cq_events();
}

void Engine::serve_active(std::uint64_t now, bool first) {
  // In turn from the second QP listed: the first pass of each poll starts one
  // further on, so the QPs that fill the TX ring (or a tenant's share) take
  // turns. Those that stay are listed again in the order served.
  const std::size_t n = active_.size();
  const std::size_t start = first && n > 1 ? 1 : 0;
  still_active_.clear();
  for (std::size_t k = 0; k < n; ++k) {
    Qp& qp = *active_[(start + k) % n];
    if (!first && !tenants_[qp.tenant].serve) {
      still_active_.push_back(&qp);
      continue;
    }
    const bool live = qp.quarantine_until == 0;  // a quarantined QP only sends its re-ACKs
    tx_full_ = false;
    qp_throttled_ = false;
    if (live && first) on_timers(qp, now);
    if (live && (qp.state == IBV_QPS_RTS || qp.state == IBV_QPS_SQD)) run_requester(qp, now);
    const std::uint32_t from = tx_.tail();
    run_responses(qp);
    if (metered()) charge(qp, from);
    // It stays only while it could do more now: responses not yet sent, or
    // requests the TX ring (or its tenant's share) had no room for. Anything
    // else it waits for comes as an event that activates it again (a post,
    // an ACK or response, a CNP, a modify) or as a deadline, which the
    // wheel keeps.
    const bool dead = qp.state == IBV_QPS_ERR || qp.state == IBV_QPS_RESET;
    if (!dead && (!qp.resp.out.empty() || (live && (tx_full_ || qp_throttled_)))) {
      still_active_.push_back(&qp);
      continue;
    }
    qp.active = false;
    if (dead || !live) {
      wheel_.cancel(qp);
    } else {
      settle_timer(qp, now);
    }
  }
  // QPs activated while serving (a looped datagram's receiver) were listed
  // after the n served.
  for (std::size_t i = n; i < active_.size(); ++i) still_active_.push_back(active_[i]);
  active_.swap(still_active_);
}

void Engine::activate(Qp& qp) {
  if (!qp.active) {
    qp.active = true;
    active_.push_back(&qp);
  }
}

std::uint64_t Engine::deadline_of(const Qp& qp, std::uint64_t now) const {
  std::uint64_t best = 0;
  // The pacer's next slot, while something could be sent in it.
  const std::uint64_t pace = qp.rate_bps != 0 && qp.req.pace_next > now ? qp.req.pace_next : 0;
  const std::uint64_t cct = qp.cc ? qp.cc->next_timer() : 0;
  for (std::uint64_t d : {qp.req.retry_deadline, qp.req.rnr_until, pace, cct})
    if (d != 0 && (best == 0 || d < best)) best = d;
  return best;
}

void Engine::settle_timer(Qp& qp, std::uint64_t now) {
  if (const std::uint64_t at = deadline_of(qp, now)) {
    wheel_.schedule(qp, at);
  } else {
    wheel_.cancel(qp);
  }
}

std::uint64_t Engine::next_deadline() const {
  std::uint64_t best = wheel_.next_at();
  for (const Qp* qp : active_) {
    // A paced QP with packets to send wakes at its next packet's time.
    const std::uint64_t pace = qp->rate_bps != 0 && qp->req.cursor != qp->sq.tail() ? qp->req.pace_next : 0;
    const std::uint64_t cct = qp->cc ? qp->cc->next_timer() : 0;
    for (std::uint64_t d : {qp->req.retry_deadline, qp->req.rnr_until, pace, cct})
      if (d != 0 && (best == 0 || d < best)) best = d;
  }
  return best;
}

}  // namespace uroce::transport
