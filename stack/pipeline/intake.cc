#include "stack/pipeline/intake.h"

#include <algorithm>
#include <atomic>

#include "stack/abi/doorbell.h"

namespace uroce::pipeline {

using transport::Qp;
using transport::Srq;

namespace {
constexpr std::uint16_t kMinorWorkRing = 20;  // names its queues in the work ring
constexpr std::uint16_t kMinorPosts = 5;      // bumps the posts word

template <class T>
void erase_value(std::vector<T>& v, const T& x) {
  v.erase(std::remove(v.begin(), v.end(), x), v.end());
}
}  // namespace

Intake::Source* Intake::find(std::uint32_t id) {
  for (Source& s : sources_)
    if (s.id == id) return &s;
  return nullptr;
}

void Intake::add_session(std::uint32_t id, uroce_session_page* page, std::uint16_t minor) {
  Source s;
  s.id = id;
  s.page = page;
  s.minor = minor;
  if (minor >= kMinorWorkRing) s.ring = abi::WorkRing(page);
  sources_.push_back(std::move(s));
  if (sleeping_) abi::announce_sleep(page);
}

void Intake::remove_session(std::uint32_t id) {
  if (Source* s = find(id))
    for (Qp* q : s->qps) q->poster = 0;
  sources_.erase(std::remove_if(sources_.begin(), sources_.end(), [id](const Source& s) { return s.id == id; }),
                 sources_.end());
}

void Intake::add_qp(std::uint32_t id, Qp* qp) {
  Source* s = find(id);
  if (s == nullptr || qp == nullptr) return;
  qp->poster = id;
  s->qps.push_back(qp);
  // Room for each QP once in the look-again lists, made here, not in a pass.
  s->again.reserve(s->qps.size());
  s->again_now.reserve(s->qps.size());
}

void Intake::remove_qp(Qp* qp) {
  if (qp == nullptr) return;
  Source* s = find(qp->poster);
  qp->poster = 0;
  if (s == nullptr) return;
  erase_value(s->qps, qp);
  erase_value(s->again, qp);
}

void Intake::add_tm_srq(std::uint32_t id, std::uint32_t handle, Srq* srq) {
  if (Source* s = find(id); s && srq && srq->tm) s->tm.push_back({handle, srq});
}

void Intake::remove_srq(Srq* srq) {
  for (Source& s : sources_)
    s.tm.erase(std::remove_if(s.tm.begin(), s.tm.end(), [srq](const TmSrq& t) { return t.srq == srq; }), s.tm.end());
}

std::size_t Intake::look(Source& s, Qp* qp) {
  ++ctr_.looks;
  bool more = false;
  const std::size_t n = eng_.take_posts(qp, &more);
  if (more) {
    // The engine took one ring's worth: the rest on the next pass.
    if (s.again.size() < s.again.capacity()) s.again.push_back(qp);
    else s.again_all = true;
  }
  return n;
}

std::size_t Intake::look_tm(Srq* srq) {
  ++ctr_.looks;
  return eng_.run_tm_ops(*srq);
}

std::size_t Intake::scan(Source& s, bool clear_names) {
  ++ctr_.scans;
  s.again.clear();
  s.again_all = false;
  std::size_t work = 0;
  // Tag-matching operations first: an ADD posted before a SEND that matches
  // it is in the list when the SEND is taken.
  for (const TmSrq& t : s.tm) {
    if (clear_names) abi::take_queued(t.srq->tm->ops.header());
    work += look_tm(t.srq);
  }
  for (Qp* q : s.qps) {
    if (clear_names && q->sq_ring.valid()) abi::take_queued(q->sq_ring.header());
    work += look(s, q);
  }
  return work;
}

std::size_t Intake::named(Source& s) {
  std::size_t work = 0;
  if (s.again_all) {
    work += scan(s, false);
  } else if (!s.again.empty()) {
    s.again_now.swap(s.again);
    for (Qp* q : s.again_now) work += look(s, q);
    s.again_now.clear();
  }
  if (s.ring.take_overflow()) {
    // A name was lost to a full ring: every queue, and every flag cleared
    // so that the next post names its queue again.
    ++ctr_.overflows;
    work += scan(s, true);
  }
  // At most one ring's worth a pass: a producer that names as fast as this
  // takes cannot keep the pipeline here.
  std::uint32_t what = 0;
  for (std::uint32_t k = 0; k < UROCE_WORK_ENTRIES && s.ring.take(what); ++k) {
    ++ctr_.names;
    if (what & UROCE_WORK_TM_SRQ) {
      const std::uint32_t handle = what & ~UROCE_WORK_TM_SRQ;
      const auto t = std::find_if(s.tm.begin(), s.tm.end(), [handle](const TmSrq& x) { return x.handle == handle; });
      if (t == s.tm.end()) {
        ++ctr_.foreign;
        continue;
      }
      abi::take_queued(t->srq->tm->ops.header());
      work += look_tm(t->srq);
      continue;
    }
    Qp* q = eng_.find_qp(what);
    if (q == nullptr || q->poster != s.id) {
      ++ctr_.foreign;
      continue;
    }
    if (q->sq_ring.valid()) abi::take_queued(q->sq_ring.header());
    work += look(s, q);
  }
  return work;
}

std::size_t Intake::run() {
  std::size_t work = 0;
  for (Source& s : sources_) {
    if (s.minor >= kMinorWorkRing) {
      work += named(s);
      continue;
    }
    // Older applications: every queue of the session when its posts word
    // moved (from minor 5), or on every pass (before it).
    const std::uint32_t posts = std::atomic_ref<std::uint32_t>(s.page->posts).load(std::memory_order_acquire);
    if (s.minor >= kMinorPosts && posts == s.posts_seen && s.again.empty() && !s.again_all) continue;
    s.posts_seen = posts;
    work += scan(s, false);
  }
  return work;
}

void Intake::set_sleeping(bool sleeping) {
  sleeping_ = sleeping;
  for (Source& s : sources_) {
    if (sleeping) abi::announce_sleep(s.page);
    else abi::announce_awake(s.page);
  }
}

}  // namespace uroce::pipeline
