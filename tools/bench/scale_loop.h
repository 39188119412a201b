// The workload of qp_scale (and of its instruction count, qp_scale_ipp):
// 8-byte RDMA WRITEs spread round-robin over N connected QP pairs, with at
// most 1024 in flight in all (16 a QP at most), over the in-memory wire.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "tools/bench/loopback.h"

namespace uroce::bench {

class ScaleLoop {
 public:
  explicit ScaleLoop(std::uint32_t nqp)
      : nqp_(nqp), lb_(IBV_MTU_1024, 64, 1u << 20, nqp + 16), qps_{lb_.side[0].qp}, inflight_(nqp, 0) {
    for (std::uint32_t i = 1; i < nqp; ++i) {
      auto [a, b] = lb_.add_pair(64);
      if (!a) return;
      qps_.push_back(a);
    }
    Side& s = lb_.side[0];
    Side& r = lb_.side[1];
    sg_ = {reinterpret_cast<std::uint64_t>(s.mem.data()), 8, s.mr->lkey};
    wr_.opcode = IBV_WR_RDMA_WRITE;
    wr_.sg_list = {&sg_, 1};
    wr_.send_flags = IBV_SEND_SIGNALED;
    wr_.remote_addr = reinterpret_cast<std::uint64_t>(r.mem.data());
    wr_.rkey = r.mr->rkey;
    per_qp_ = std::max<std::uint32_t>(1, std::min<std::uint32_t>(16, 1024 / nqp));
  }
  /// False when the engines refused a QP.
  [[nodiscard]] bool ok() const { return qps_.size() == nqp_; }

  /// One round: visit 256 QPs round-robin, posting to each that has room,
  /// move every frame across, and take the completions. Returns them.
  std::uint64_t step() {
    Side& s = lb_.side[0];
    for (std::uint32_t k = 0; k < 256; ++k) {
      const auto q = static_cast<std::uint32_t>(next_++ % nqp_);
      if (inflight_[q] >= per_qp_) continue;
      wr_.wr_id = q;
      if (s.eng->post_send(qps_[q], wr_) == 0) ++inflight_[q];
    }
    lb_.pump();
    std::uint64_t done = 0;
    int n;
    while ((n = s.eng->poll_cq(s.cq, wc_)) > 0)
      for (int i = 0; i < n; ++i) {
        --inflight_[wc_[i].wr_id];
        ++done;
      }
    return done;
  }

 private:
  std::uint32_t nqp_;
  Loopback lb_;
  std::vector<Qp*> qps_;
  std::vector<std::uint32_t> inflight_;
  Sge sg_{};
  SendWr wr_;
  std::uint32_t per_qp_ = 1;
  std::uint64_t next_ = 0;
  ibv_wc wc_[64];
};

}  // namespace uroce::bench
