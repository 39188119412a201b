// Drives a stream of mixed, verified messages over a connected QP pair:
// every payload is checked byte for byte, every WR completes exactly once and
// in order, and atomics are checked for exactly-once execution (a FETCH_ADD
// or CMP_SWAP executed twice breaks the running value).
#pragma once

#include <gtest/gtest.h>

#include <deque>
#include <random>
#include <string>
#include <vector>

#include "tests/support/pair.h"

namespace uroce::testing {

struct TrafficOptions {
  std::uint32_t messages = 1000;
  std::vector<ibv_wr_opcode> ops = {IBV_WR_SEND,      IBV_WR_SEND_WITH_IMM,         IBV_WR_RDMA_WRITE,
                                    IBV_WR_RDMA_WRITE_WITH_IMM, IBV_WR_RDMA_READ, IBV_WR_ATOMIC_FETCH_AND_ADD,
                                    IBV_WR_ATOMIC_CMP_AND_SWP};
  std::uint32_t max_size = 3 * 1024 + 7;
  std::vector<std::uint32_t> sizes;  // if set, cycle through these instead of random sizes
  std::uint64_t seed = 1;
  std::uint64_t max_virtual_ns = 60'000'000'000ull;
  std::uint32_t depth = 64;  // WRs in flight
};

struct TrafficResult {
  std::uint64_t completed = 0;
  std::uint64_t bytes = 0;
  std::uint64_t errors = 0;
  std::string first_error;
};

class Traffic {
 public:
  static constexpr std::uint64_t kSlot = 16384;

  Traffic(Pair& p, QpPair q, TrafficOptions o) : p_(p), q_(q), o_(std::move(o)), rng_(o_.seed) {
    slot_size_ = std::max<std::uint64_t>(kSlot, o_.max_size + 64);
    nslots_ = std::min<std::uint64_t>(o_.depth, (p_.node[0].mem.size() / 2) / slot_size_);
  }

  TrafficResult run() {
    // B's counter for atomics lives at the top of its memory.
    counter_off_ = p_.node[1].mem.size() - 64;
    std::memset(&p_.node[1].mem[counter_off_], 0, 8);
    model_ = 0;
    post_recvs();
    const bool ok = p_.wire.run_until(
        [&] {
          pump();
          return (next_ == o_.messages && inflight_.empty() && recv_expect_.empty()) || res_.errors > 0;
        },
        o_.max_virtual_ns);
    if (!ok && res_.errors == 0) fail("timed out with " + std::to_string(inflight_.size()) + " WRs in flight, " +
                                      std::to_string(recv_expect_.size()) + " receives outstanding");
    std::uint64_t final_counter;
    std::memcpy(&final_counter, &p_.node[1].mem[counter_off_], 8);
    if (res_.errors == 0 && final_counter != model_) fail("atomic counter mismatch: executed twice or lost");
    return res_;
  }

 private:
  struct Pending {
    std::uint64_t id;
    ibv_wr_opcode op;
    std::uint32_t len;
    std::uint64_t slot;
    std::uint64_t expect_orig;  // atomics
  };
  struct RecvExpect {
    std::uint64_t id;  // message id of the SEND (or WRITE_WITH_IMM) it should carry
    std::uint32_t len;
    bool imm;
    bool write_imm;
  };

  static std::uint8_t pattern(std::uint64_t id, std::size_t i) {
    return static_cast<std::uint8_t>((id * 131) ^ (i * 7) ^ (i >> 8));
  }
  void fail(const std::string& why) {
    if (res_.errors++ == 0) res_.first_error = why;
  }
  std::uint8_t* a_mem(std::uint64_t off) { return &p_.node[0].mem[off]; }
  std::uint8_t* b_mem(std::uint64_t off) { return &p_.node[1].mem[off]; }
  std::uint64_t b_half() const { return p_.node[1].mem.size() / 2; }

  void post_recvs() {
    // A ring of receive buffers in B's upper half; refilled as they complete.
    for (std::uint64_t i = 0; i < nslots_; ++i) post_one_recv();
  }
  void post_one_recv() {
    const std::uint64_t off = b_half() + (recv_posted_ % nslots_) * slot_size_;
    Sge s = p_.sge(1, off, static_cast<std::uint32_t>(slot_size_));
    recv_slots_.push_back(off);
    ASSERT_EQ(p_.B().post_recv(q_.b, RecvWr{recv_posted_, {&s, 1}}), 0);
    ++recv_posted_;
  }

  std::uint32_t pick_size(ibv_wr_opcode op) {
    if (op == IBV_WR_ATOMIC_FETCH_AND_ADD || op == IBV_WR_ATOMIC_CMP_AND_SWP) return 8;
    if (!o_.sizes.empty()) return o_.sizes[sizes_i_++ % o_.sizes.size()];
    // Mostly small, some multi-packet.
    const std::uint32_t r = static_cast<std::uint32_t>(rng_() % 4);
    if (r == 0) return static_cast<std::uint32_t>(rng_() % (o_.max_size + 1));
    return static_cast<std::uint32_t>(rng_() % 64);
  }

  void post_next() {
    const std::uint64_t id = next_++;
    const ibv_wr_opcode op = o_.ops[rng_() % o_.ops.size()];
    const std::uint32_t len = pick_size(op);
    const std::uint64_t slot = id % nslots_;
    const std::uint64_t a_off = slot * slot_size_;
    const std::uint64_t b_off = slot * slot_size_;
    Sge s = p_.sge(0, a_off, len);
    SendWr wr;
    wr.wr_id = id;
    wr.opcode = op;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.sg_list = {&s, 1};
    wr.remote_addr = p_.addr(1, b_off);
    wr.rkey = p_.rkey(1);
    wr.imm_data = static_cast<std::uint32_t>(id);
    Pending pd{id, op, len, slot, 0};
    switch (op) {
      case IBV_WR_SEND:
      case IBV_WR_SEND_WITH_IMM:
      case IBV_WR_RDMA_WRITE:
      case IBV_WR_RDMA_WRITE_WITH_IMM:
        for (std::uint32_t i = 0; i < len; ++i) *a_mem(a_off + i) = pattern(id, i);
        break;
      case IBV_WR_RDMA_READ:
        for (std::uint32_t i = 0; i < len; ++i) *b_mem(b_off + i) = pattern(id, i);
        std::memset(a_mem(a_off), 0xee, len);
        break;
      case IBV_WR_ATOMIC_FETCH_AND_ADD: {
        const std::uint64_t add = 1 + rng_() % 1000;
        wr.remote_addr = p_.addr(1, counter_off_);
        wr.compare_add = add;
        pd.expect_orig = model_;
        model_ += add;
        break;
      }
      case IBV_WR_ATOMIC_CMP_AND_SWP: {
        wr.remote_addr = p_.addr(1, counter_off_);
        wr.compare_add = model_;  // always matches when executed once, in order
        wr.swap = model_ + 1 + rng_() % 1000;
        pd.expect_orig = model_;
        model_ = wr.swap;
        break;
      }
      default: break;
    }
    if (op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM) recv_expect_.push_back({id, len, op == IBV_WR_SEND_WITH_IMM, false});
    if (op == IBV_WR_RDMA_WRITE_WITH_IMM) recv_expect_.push_back({id, len, true, true});
    const int rc = p_.A().post_send(q_.a, wr);
    if (rc != 0) {
      fail("post_send failed: " + std::to_string(rc));
      return;
    }
    inflight_.push_back(pd);
  }

  void pump() {
    while (next_ < o_.messages && inflight_.size() < nslots_ && res_.errors == 0) post_next();
    ibv_wc wc[64];
    int n = p_.A().poll_cq(p_.node[0].cq, wc);
    for (int i = 0; i < n; ++i) on_send_wc(wc[i]);
    n = p_.B().poll_cq(p_.node[1].cq, wc);
    for (int i = 0; i < n; ++i) on_recv_wc(wc[i]);
  }

  void on_send_wc(const ibv_wc& wc) {
    if (inflight_.empty()) return fail("completion with nothing in flight (duplicate?) wr_id " + std::to_string(wc.wr_id));
    const Pending pd = inflight_.front();
    inflight_.pop_front();
    if (wc.wr_id != pd.id) return fail("completion out of order: got " + std::to_string(wc.wr_id) + " want " + std::to_string(pd.id));
    if (wc.status != IBV_WC_SUCCESS)
      return fail("wr " + std::to_string(pd.id) + " failed: " + transport::to_string(wc.status));
    const std::uint64_t off = pd.slot * slot_size_;
    switch (pd.op) {
      case IBV_WR_RDMA_WRITE:
      case IBV_WR_RDMA_WRITE_WITH_IMM:
        for (std::uint32_t i = 0; i < pd.len; ++i)
          if (*b_mem(off + i) != pattern(pd.id, i)) return fail("WRITE " + std::to_string(pd.id) + " data wrong at byte " + std::to_string(i));
        break;
      case IBV_WR_RDMA_READ:
        for (std::uint32_t i = 0; i < pd.len; ++i)
          if (*a_mem(off + i) != pattern(pd.id, i)) return fail("READ " + std::to_string(pd.id) + " data wrong at byte " + std::to_string(i));
        break;
      case IBV_WR_ATOMIC_FETCH_AND_ADD:
      case IBV_WR_ATOMIC_CMP_AND_SWP: {
        std::uint64_t orig;
        std::memcpy(&orig, a_mem(off), 8);
        if (orig != pd.expect_orig) return fail("atomic " + std::to_string(pd.id) + " returned " + std::to_string(orig) + " want " + std::to_string(pd.expect_orig));
        break;
      }
      default: break;
    }
    ++res_.completed;
    res_.bytes += pd.len;
  }

  void on_recv_wc(const ibv_wc& wc) {
    if (recv_expect_.empty()) return fail("unexpected receive completion");
    const RecvExpect e = recv_expect_.front();
    recv_expect_.pop_front();
    const std::uint64_t off = recv_slots_.front();
    recv_slots_.pop_front();
    if (wc.status != IBV_WC_SUCCESS) return fail(std::string("receive failed: ") + transport::to_string(wc.status));
    if (wc.byte_len != e.len) return fail("receive length " + std::to_string(wc.byte_len) + " want " + std::to_string(e.len));
    if (e.imm != ((wc.wc_flags & IBV_WC_WITH_IMM) != 0) ||
        (e.imm && __builtin_bswap32(wc.imm_data) != static_cast<std::uint32_t>(e.id)))
      return fail("immediate data wrong on message " + std::to_string(e.id));
    if (e.write_imm != (wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM)) return fail("receive opcode wrong");
    if (!e.write_imm) {
      for (std::uint32_t i = 0; i < e.len; ++i)
        if (*b_mem(off + i) != pattern(e.id, i)) return fail("SEND " + std::to_string(e.id) + " data wrong at byte " + std::to_string(i));
    }
    post_one_recv();
  }

  Pair& p_;
  QpPair q_;
  TrafficOptions o_;
  std::mt19937_64 rng_;
  std::uint64_t slot_size_ = kSlot;
  std::uint64_t nslots_ = 0;
  std::uint64_t counter_off_ = 0;
  std::uint64_t model_ = 0;
  std::uint64_t next_ = 0;
  std::uint64_t recv_posted_ = 0;
  std::size_t sizes_i_ = 0;
  std::deque<Pending> inflight_;
  std::deque<RecvExpect> recv_expect_;
  std::deque<std::uint64_t> recv_slots_;
  TrafficResult res_;
};

}  // namespace uroce::testing
