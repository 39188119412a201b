// The pipeline's intake stage: what applications published in their shared
// queues reaches the engine here, and only here. An application of ABI
// minor 20 or later names each queue it posted to in its session's work
// ring (stack/abi/work_ring.h), so a pass looks at exactly those queues,
// whatever else the session holds. Older applications are still served:
// from minor 5, every queue of a session whose posts word moved; before
// that, every queue on every pass.
//
// The control plane registers what it creates (sessions, their QPs and
// tag-matching SRQs) and nothing else: it never takes a post. Every name a
// work ring carries is checked against the session's own queues; another's
// is counted and ignored. Allocation-free once registered.
#pragma once

#include <cstdint>
#include <vector>

#include "stack/abi/uroce_abi.h"
#include "stack/abi/work_ring.h"
#include "stack/transport/engine.h"

namespace uroce::pipeline {

class Intake {
 public:
  explicit Intake(transport::Engine& eng) : eng_(eng) {}

  /// A session (`id`, never 0) and its page, served as its application's
  /// ABI `minor` says. The page must stay mapped until remove_session.
  void add_session(std::uint32_t id, uroce_session_page* page, std::uint16_t minor);
  void remove_session(std::uint32_t id);
  /// A QP of session `id`: its work ring may name it from now on.
  void add_qp(std::uint32_t id, transport::Qp* qp);
  /// Before the QP is destroyed.
  void remove_qp(transport::Qp* qp);
  /// A tag-matching SRQ of session `id`, named by its session handle.
  void add_tm_srq(std::uint32_t id, std::uint32_t handle, transport::Srq* srq);
  void remove_srq(transport::Srq* srq);

  /// The stage: takes the names published since the last pass and hands
  /// each queue's new entries to the engine. Returns the work done.
  std::size_t run();

  /// The pipeline is about to block (true) or is awake again (false):
  /// written to every session's page, so applications ring their doorbell
  /// only while it sleeps. After `true` the caller runs a pass once more.
  void set_sleeping(bool sleeping);

  struct Counters {
    std::uint64_t names = 0;      // names taken from work rings
    std::uint64_t foreign = 0;    // names that are not the session's own queues, ignored
    std::uint64_t overflows = 0;  // full work rings: every queue of the session looked at once
    std::uint64_t looks = 0;      // queues handed to the engine
    std::uint64_t scans = 0;      // passes that looked at every queue of a session (old ABI, overflow)
  };
  [[nodiscard]] const Counters& counters() const { return ctr_; }

 private:
  struct TmSrq {
    std::uint32_t handle;
    transport::Srq* srq;
  };
  struct Source {
    std::uint32_t id = 0;
    uroce_session_page* page = nullptr;
    std::uint16_t minor = 0;
    abi::WorkRing ring;
    std::uint32_t posts_seen = 0;
    std::vector<transport::Qp*> qps;
    std::vector<TmSrq> tm;
    /// QPs that gave a ring's worth on their last look (the engine takes no
    /// more at once): looked at again on the next pass. Capacity: qps'.
    std::vector<transport::Qp*> again, again_now;
    bool again_all = false;  // more than `again` holds: look at every queue next pass
  };
  Source* find(std::uint32_t id);
  std::size_t named(Source& s);
  std::size_t scan(Source& s, bool clear_names);
  std::size_t look(Source& s, transport::Qp* qp);
  std::size_t look_tm(transport::Srq* srq);

  transport::Engine& eng_;
  std::vector<Source> sources_;
  bool sleeping_ = false;
  Counters ctr_;
};

}  // namespace uroce::pipeline
