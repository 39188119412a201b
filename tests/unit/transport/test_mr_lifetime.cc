// Memory-region lifetime: an MR deregistered while a multi-packet message
// uses it. The memory is mapped on its own and made inaccessible
// (PROT_NONE) at the moment of deregistration, so any later touch through
// a pointer kept from the first packet would crash the test. Each case
// runs 1,000 times, deregistering after a different number of packets,
// and must end in a clear completion: SUCCESS when the message was done
// before, else the error verbs names for it.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include "stack/wire/parser.h"
#include "tests/support/pair.h"

namespace uroce::testing {
namespace {

constexpr std::uint32_t kLen = 64 * 1024;  // 64 packets at MTU 1024

struct Region {
  std::uint8_t* p = nullptr;
  Region() {
    p = static_cast<std::uint8_t*>(::mmap(nullptr, kLen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    EXPECT_NE(p, MAP_FAILED);
  }
  ~Region() { ::munmap(p, kLen); }
  void revoke() const { ::mprotect(p, kLen, PROT_NONE); }
};

enum class Op { kWriteTarget, kReadSource, kSendTarget, kWriteSource, kReadTarget };

/// One round: the message on a fresh QP pair, the MR on `side` deregistered
/// (and its memory revoked) after node B has taken `after` packets.
ibv_wc_status round(Pair& p, Op op, std::uint32_t after) {
  auto q = p.connect();
  Region r;
  const bool remote = op == Op::kWriteTarget || op == Op::kReadSource || op == Op::kSendTarget;
  const int side = remote ? 1 : 0;
  Engine& owner = side == 1 ? p.B() : p.A();
  (void)remote;
  Mr* mr = owner.reg_mr(p.node[side].pd, r.p, kLen,
                        IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
  EXPECT_NE(mr, nullptr);
  const auto base = reinterpret_cast<std::uint64_t>(r.p);
  // The other side's buffer: node memory (64 KiB).
  Sge local = side == 0 ? Sge{base, kLen, mr->lkey} : p.sge(0, 0, kLen);
  SendWr w;
  w.wr_id = 7;
  w.send_flags = IBV_SEND_SIGNALED;
  w.sg_list = {&local, 1};
  if (op == Op::kSendTarget) {
    w.opcode = IBV_WR_SEND;
    Sge rs{base, kLen, mr->lkey};
    EXPECT_EQ(p.B().post_recv(q.b, RecvWr{9, {&rs, 1}}), 0);
  } else {
    const bool write = op == Op::kWriteTarget || op == Op::kWriteSource;
    w.opcode = write ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ;
    w.remote_addr = side == 1 ? base : p.addr(1, 0);
    w.rkey = side == 1 ? mr->rkey : p.rkey(1);
  }
  // Deregister just before the `after`-th frame of the message reaches the
  // side that uses the memory next (B for WRITE and SEND requests, A for
  // READ responses), so the rest of the message meets a dead MR.
  const bool read = op == Op::kReadSource || op == Op::kReadTarget;
  const Engine* watched = read ? &p.A() : &p.B();
  std::uint32_t seen = 0;
  bool gone = false;
  auto revoke = [&] {
    if (gone) return;
    gone = true;
    EXPECT_EQ(owner.dereg_mr(mr), 0);
    r.revoke();  // any later touch through a stale pointer: SIGSEGV
  };
  p.wire.deliver_tap = [&](const Engine* to, wire::ConstBytes, std::uint64_t) {
    if (to == watched && ++seen == after) revoke();
  };
  if (after == 0) revoke();
  if (op == Op::kWriteSource) {
    // A sends the whole message at once, so only a resend meets the dead
    // MR: drop its 6th packet once, and go-back-N resends from there.
    sim::Impairments imp;
    imp.loss = 1.0;
    const std::uint32_t first = q.a->req.next_psn.value();
    bool dropped = false;
    imp.filter = [first, dropped](const TxFrame& f) mutable {
      const bool hit = !dropped && f.psn.value() == ((first + 5) & 0xffffff);
      dropped = dropped || hit;
      return hit;
    };
    p.wire.set_impairments(imp);
  }
  EXPECT_EQ(p.A().post_send(q.a, w), 0);
  std::vector<ibv_wc> wa, wb;
  p.wire.run_until(
      [&] {
        p.poll(0, wa);
        p.poll(1, wb);
        return !wa.empty();
      },
      200'000'000);
  EXPECT_FALSE(wa.empty()) << "the requester's WQE never completed";
  p.wire.deliver_tap = nullptr;
  p.wire.set_impairments(sim::Impairments{});
  revoke();  // a message shorter than `after` frames: deregistered once done
  for (Qp* x : {q.a, q.b}) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_ERR;
    (x == q.a ? p.A() : p.B()).modify_qp(x, a, IBV_QP_STATE);
  }
  p.wire.run_until(
      [&] {
        p.poll(0, wa);
        p.poll(1, wb);
        return false;
      },
      1'000'000);  // let flushes and stray frames settle before the QPs go
  EXPECT_EQ(p.A().destroy_qp(q.a), 0);
  EXPECT_EQ(p.B().destroy_qp(q.b), 0);
  return wa.empty() ? IBV_WC_GENERAL_ERR : wa.front().status;
}

void run_case(Op op, std::initializer_list<ibv_wc_status> errors) {
  int ok = 0, failed = 0;
  Pair p(static_cast<std::uint64_t>(op) + 1, 64 * 1024);
  // Every frame either side sends is whole (an abandoned TX slot would go
  // out as a stale frame without its ICRC).
  std::uint64_t bad_frames = 0;
  p.wire.tap = [&bad_frames](wire::ConstBytes f, std::uint64_t) {
    wire::Packet pkt;
    if (!wire::parse_frame(f, wire::ParseOptions{}, pkt).ok()) ++bad_frames;
  };
  for (std::uint32_t i = 0; i < 1000; ++i) {
    const ibv_wc_status st = round(p, op, i % 70);
    if (st == IBV_WC_SUCCESS) {
      ++ok;
    } else {
      bool known = false;
      for (auto e : errors) known = known || st == e;
      EXPECT_TRUE(known) << "round " << i << ": " << st;
      ++failed;
    }
  }
  EXPECT_EQ(bad_frames, 0u);
  // Early deregistrations fail, late ones find the message done.
  EXPECT_GT(failed, 0);
  EXPECT_GT(ok, 0);
}

TEST(MrLifetime, DeregisterTheTargetOfAWriteMidMessage) { run_case(Op::kWriteTarget, {IBV_WC_REM_ACCESS_ERR}); }
TEST(MrLifetime, DeregisterTheSourceOfAReadMidResponse) { run_case(Op::kReadSource, {IBV_WC_REM_ACCESS_ERR}); }
TEST(MrLifetime, DeregisterTheReceiveBufferOfASendMidMessage) {
  run_case(Op::kSendTarget, {IBV_WC_REM_OP_ERR, IBV_WC_REM_INV_REQ_ERR, IBV_WC_REM_ACCESS_ERR});
}
TEST(MrLifetime, DeregisterTheLocalSourceOfAWriteMidMessage) {
  run_case(Op::kWriteSource, {IBV_WC_LOC_PROT_ERR, IBV_WC_WR_FLUSH_ERR});
}
TEST(MrLifetime, DeregisterTheLocalTargetOfAReadMidResponse) {
  run_case(Op::kReadTarget, {IBV_WC_LOC_PROT_ERR, IBV_WC_WR_FLUSH_ERR});
}

}  // namespace
}  // namespace uroce::testing
