// The node's data path allocates nothing after warm-up, end to end: an
// application posting and polling through liburoce, the session server's
// rings, the doorbell (the node blocks between bursts, so posts ring it) and
// completion channel (the application blocks in uroce_poll_cq_wait), the
// pipeline, the DPDK port (net_memif), the wire, and the peer's pipeline and
// engine, under injected loss, with go-back-N and with selective repeat
// (one process each: the test is run once per recovery, by name, as DPDK's
// EAL starts once per process).
//
// One process: a node (control/node) with two net_memif ports joined to each
// other (server and client on one socket), --no-huge. Pipeline 0, run by
// this test's main thread in Node::run as in uroced, serves the application
// socket; pipeline 1, on a worker lcore, carries the peer: a Stage that owns
// its QPs on the engine directly (as uroce-traffic's does). The application
// is a thread of this process attached through liburoce. Every allocation
// in the process, in any thread, is counted (tests/support/alloc_counter.h).
#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "control/node/node.h"
#include "control/node/options.h"
#include "stack/pipeline/dataplane.h"
#include "stack/transport/engine.h"
#include "stack/verbs/uroce_verbs.h"
#include "tests/support/alloc_counter.h"

namespace uroce::testing {
namespace {

namespace ac = alloc_counter;
using transport::Engine;

constexpr int kQps = 2;  // two QPs in one session
constexpr std::size_t kMem = 1u << 20;
constexpr int kBatch = 24;  // WRs per batch, spread over the QPs
constexpr int kWarmBatches = 40, kCountedBatches = 300;
const wire::IpAddr kIpApp = wire::IpAddr::from_v4(10, 93, 0, 1);   // port 0: the application's node side
const wire::IpAddr kIpPeer = wire::IpAddr::from_v4(10, 93, 0, 2);  // port 1: the peer stage

/// What the application and the peer stage tell each other (the
/// out-of-band exchange, in memory).
struct Shared {
  std::atomic<std::uint32_t> peer_qpn[kQps] = {};
  std::uint64_t peer_addr = 0;
  std::uint32_t peer_rkey = 0;
  std::atomic<std::uint32_t> app_qpn[kQps] = {};
  std::atomic<bool> peer_up{false};
  std::atomic<std::uint64_t> peer_recvs{0};  // receive completions at the peer
  std::atomic<std::uint64_t> peer_errors{0};
  std::atomic<bool> stop{false};
  bool selective_repeat = false;  // every QP, on both sides
};

/// The peer: QPs on pipeline 1's engine, brought up once the application's
/// QPNs are known; it keeps its receive queues full and polls its CQ.
class Peer : public control::Stage {
 public:
  Peer(Engine& eng, pipeline::Dataplane& dp, Shared& sh) : eng_(eng), dp_(dp), sh_(sh), mem_(kMem) {
    pd_ = eng_.alloc_pd();
    cq_ = eng_.create_cq(1024);
    mr_ = eng_.reg_mr(pd_, mem_.data(), mem_.size(),
                      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                          IBV_ACCESS_REMOTE_ATOMIC);
    for (int i = 0; i < kQps; ++i) {
      transport::QpInitAttr ia;
      ia.send_cq = ia.recv_cq = cq_;
      ia.cap.max_send_wr = 64;
      ia.cap.max_recv_wr = 256;
      qp_[i] = eng_.create_qp(pd_, ia);
      ok_ = ok_ && qp_[i] != nullptr;
      if (qp_[i] && sh_.selective_repeat) ok_ = ok_ && eng_.set_selective_repeat(qp_[i], true) == 0;
      sh_.peer_qpn[i] = qp_[i] ? qp_[i]->qpn : 0;
    }
    ok_ = ok_ && pd_ && cq_ && mr_;
    sh_.peer_addr = reinterpret_cast<std::uint64_t>(mem_.data());
    sh_.peer_rkey = mr_ ? mr_->rkey : 0;
  }
  [[nodiscard]] bool ok() const { return ok_; }

  std::size_t step(std::uint64_t now) override {
    if (!up_) return bring_up(now);
    std::size_t work = 0;
    for (int i = 0; i < kQps; ++i)
      while (posted_[i] - done_[i] < 192) {  // receives always waiting: no RNR
        transport::Sge s{reinterpret_cast<std::uint64_t>(mem_.data()) + kMem / 2 + 8192 * (posted_[i] % 32), 8192,
                         mr_->lkey};
        if (eng_.post_recv(qp_[i], transport::RecvWr{posted_[i], {&s, 1}}) != 0) {
          ++sh_.peer_errors;
          break;
        }
        ++posted_[i];
        ++work;
      }
    ibv_wc wc[32];
    const int n = eng_.poll_cq(cq_, wc);
    for (int k = 0; k < n; ++k) {
      if (wc[k].status != IBV_WC_SUCCESS) ++sh_.peer_errors;
      for (int i = 0; i < kQps; ++i)
        if (qp_[i]->qpn == wc[k].qp_num) ++done_[i];
    }
    if (n > 0) sh_.peer_recvs.fetch_add(static_cast<std::uint64_t>(n), std::memory_order_relaxed);
    return work + static_cast<std::size_t>(n);
  }
  void request_shutdown() override { stopping_ = true; }
  [[nodiscard]] bool finished() const override { return stopping_; }
  [[nodiscard]] int exit_code() const override { return 0; }
  [[nodiscard]] std::string summary() const override { return "peer: " + std::to_string(sh_.peer_recvs.load()) + " receives"; }

 private:
  std::size_t bring_up(std::uint64_t now) {
    if (sh_.app_qpn[kQps - 1].load() == 0) return 0;
    if (!eng_.neighbors().lookup(kIpApp)) {  // ARP over the memif link first
      if (now - last_arp_ > 1'000'000) {
        dp_.resolve(kIpApp);
        last_arp_ = now;
      }
      return 0;
    }
    for (int i = 0; i < kQps; ++i) {
      abi::Connect k;
      k.access = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
      k.dest_qp_num = sh_.app_qpn[i];
      k.rq_psn = 0x100;
      k.sq_psn = 0x200;
      k.timeout = 14;  // 67 ms: beyond the idle loop's longest sleep (20 ms)
      k.min_rnr_timer = 1;
      k.max_rd_atomic = k.max_dest_rd_atomic = 8;
      std::memcpy(k.dgid.raw, kIpApp.b.data(), 16);
      if (!eng_.bring_up(qp_[i], k)) ++sh_.peer_errors;
    }
    up_ = true;
    sh_.peer_up = true;
    return 1;
  }

  Engine& eng_;
  pipeline::Dataplane& dp_;
  Shared& sh_;
  std::vector<std::uint8_t> mem_;
  transport::Pd* pd_ = nullptr;
  transport::Cq* cq_ = nullptr;
  transport::Mr* mr_ = nullptr;
  transport::Qp* qp_[kQps] = {};
  std::uint64_t posted_[kQps] = {}, done_[kQps] = {};
  bool ok_ = true, up_ = false;
  std::atomic<bool> stopping_{false};
  std::uint64_t last_arp_ = 0;
};

/// The application, on its own thread: liburoce only.
struct App {
  Shared& sh;
  std::string sock;
  std::string error;  // set on a failure to set up
  std::string first_failure;  // the first completion in error
  std::uint64_t posted = 0, completed = 0, failed = 0, sends = 0, timeouts = 0;
  std::uint64_t allocs = 0;
  std::string alloc_report;

  uroce_context* ctx = nullptr;
  uroce_pd* pd = nullptr;
  uroce_mr* mr = nullptr;
  uroce_comp_channel* ch = nullptr;
  uroce_cq* cq = nullptr;
  uroce_qp* qp[kQps] = {};
  std::uint8_t* buf = nullptr;

  bool setup() {
    ctx = uroce_open_device(sock.c_str());
    if (!ctx) return fail("open");
    pd = uroce_alloc_pd(ctx);
    buf = static_cast<std::uint8_t*>(uroce_alloc_buf(ctx, kMem));
    if (!pd || !buf) return fail("pd/buf");
    mr = uroce_reg_mr(pd, buf, kMem,
                      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
    ch = uroce_create_comp_channel(ctx);
    cq = mr && ch ? uroce_create_cq(ctx, 256, nullptr, ch, 0) : nullptr;
    if (!cq) return fail("mr/channel/cq");
    for (int i = 0; i < kQps; ++i) {
      uroce_qp_init_attr a{};
      a.send_cq = a.recv_cq = cq;
      a.qp_type = IBV_QPT_RC;
      a.cap.max_send_wr = 64;
      a.cap.max_recv_wr = 16;
      a.cap.max_send_sge = a.cap.max_recv_sge = 1;
      qp[i] = uroce_create_qp(pd, &a);
      if (!qp[i]) return fail("create_qp");
      if (sh.selective_repeat && uroce_qp_set_selective_repeat(qp[i], 1) != 0) return fail("selective repeat");
      sh.app_qpn[i] = uroce_qp_num(qp[i]);
    }
    for (int k = 0; k < 10000 && !sh.peer_up; ++k) ::usleep(1000);
    if (!sh.peer_up) return fail("the peer never came up");
    for (int i = 0; i < kQps; ++i) {
      uroce_rc_conn c{};
      c.dest_qp_num = sh.peer_qpn[i];
      std::memcpy(c.dgid.raw, kIpPeer.b.data(), 16);
      c.rq_psn = 0x200;
      c.sq_psn = 0x100;
      c.access = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
      c.timeout = 14;
      c.min_rnr_timer = 1;
      c.max_rd_atomic = c.max_dest_rd_atomic = 8;
      if (uroce_connect_qp(qp[i], &c) != 0) return fail("connect");
    }
    return true;
  }
  void teardown() {
    for (uroce_qp* q : qp)
      if (q) uroce_destroy_qp(q);
    if (cq) uroce_destroy_cq(cq);
    if (ch) uroce_destroy_comp_channel(ch);
    if (mr) uroce_dereg_mr(mr);
    if (pd) uroce_dealloc_pd(pd);
    if (ctx) uroce_close_device(ctx);
  }
  bool fail(const char* what) {
    error = std::string(what) + ": " + uroce_last_error();
    return false;
  }

  /// One batch of every kind of operation, then wait for all of it.
  void batch(int n) {
    static const ibv_wr_opcode kOps[] = {IBV_WR_RDMA_WRITE, IBV_WR_SEND, IBV_WR_RDMA_READ, IBV_WR_ATOMIC_FETCH_AND_ADD,
                                         IBV_WR_RDMA_WRITE_WITH_IMM, IBV_WR_SEND_WITH_IMM, IBV_WR_ATOMIC_CMP_AND_SWP};
    for (int i = 0; i < kBatch; ++i) {
      const ibv_wr_opcode op = kOps[posted % 7];
      const bool atomic = op == IBV_WR_ATOMIC_FETCH_AND_ADD || op == IBV_WR_ATOMIC_CMP_AND_SWP;
      const std::uint32_t len = atomic ? 8 : static_cast<std::uint32_t>(1 + (posted * 977) % 3000);
      ibv_sge s{reinterpret_cast<std::uint64_t>(buf) + 8192 * (posted % 32), len, uroce_mr_lkey(mr)};
      ibv_send_wr wr{};
      wr.wr_id = posted;
      wr.sg_list = &s;
      wr.num_sge = 1;
      wr.opcode = op;
      wr.send_flags = IBV_SEND_SIGNALED;
      if (atomic) {
        wr.wr.atomic.remote_addr = sh.peer_addr + kMem / 4;
        wr.wr.atomic.rkey = sh.peer_rkey;
        wr.wr.atomic.compare_add = 1;
        wr.wr.atomic.swap = 2;
      } else {
        wr.wr.rdma.remote_addr = sh.peer_addr + 8192 * (posted % 32);
        wr.wr.rdma.rkey = sh.peer_rkey;
      }
      if (op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM || op == IBV_WR_RDMA_WRITE_WITH_IMM) ++sends;
      ibv_send_wr* bad = nullptr;
      if (uroce_post_send(qp[posted % kQps], &wr, &bad) != 0) ++failed;
      ++posted;
    }
    // Block in the completion channel after a short spin: the node's
    // completion doorbell wakes us.
    while (completed + failed < posted) {
      ibv_wc wc[16];
      const int got = uroce_poll_cq_wait(cq, 16, wc, 20, 5000);
      if (got <= 0) {
        ++timeouts;
        if (timeouts > 3) return;
        continue;
      }
      for (int k = 0; k < got; ++k) {
        if (wc[k].status != IBV_WC_SUCCESS && first_failure.empty())
          first_failure = std::string(uroce_wc_status_str(wc[k].status)) + " on QP " + std::to_string(wc[k].qp_num) +
                          ", opcode " + std::to_string(wc[k].opcode) + ", wr_id " + std::to_string(wc[k].wr_id) +
                          " (batch " + std::to_string(n) + ")";
        (wc[k].status == IBV_WC_SUCCESS ? completed : failed) += 1;
      }
    }
    // Every fourth batch, a pause long enough for the node to go to sleep:
    // the next post rings its doorbell.
    if (n % 4 == 3) ::usleep(2000);
  }

  void run() {
    // The node's main lcore pinned this thread's parent; any core will do.
    cpu_set_t all;
    CPU_ZERO(&all);
    for (int c = 0; c < CPU_SETSIZE; ++c) CPU_SET(c, &all);
    pthread_setaffinity_np(pthread_self(), sizeof all, &all);
    if (setup()) {
      for (int n = 0; n < kWarmBatches && !timeouts; ++n) batch(n);
      ac::start();
      for (int n = 0; n < kCountedBatches && !timeouts; ++n) batch(n);
      allocs = ac::stop();
      alloc_report = ac::report();
    }
    teardown();
    sh.stop = true;
  }
};

volatile sig_atomic_t g_stop = 0;

class NoAllocNode : public ::testing::TestWithParam<bool> {};

TEST_P(NoAllocNode, ApplicationSessionPipelineAndPortAllocateNothingAfterWarmUp) {
  const std::string dir = "/tmp/uroce-noalloc-" + std::to_string(::getpid());
  ASSERT_EQ(::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str()), 0);
  // The options of the port the application's node side uses, parsed as
  // uroced's; the peer's port is added after, as the parser takes an
  // application socket with one pipeline only (uroced serves applications
  // on pipeline 0; the peer here is a stage on pipeline 1, which Node::start
  // runs on a worker lcore as it runs any pipeline after the first).
  control::NodeOptions o;
  std::string text;
  const std::string sock = dir + "/memif.sock";
  const std::string args = "--no-huge --mem-mb 256 --file-prefix noalloc-" + std::to_string(::getpid()) +
                           " --port net_memif0 --vdev net_memif0,role=server,socket=" + sock + " --ip " +
                           kIpApp.to_string() + " --lcore 0 --app-socket " + dir +
                           "/app.sock --log-level warn"
                           " --fault-rx drop=0.002";  // both pipelines: retransmissions through the real port
  ASSERT_EQ(control::parse_options(args, o, text), control::ParseResult::kOk) << text;
  o.ports.push_back("net_memif1");
  o.vdevs.push_back("net_memif1,role=client,socket=" + sock);
  o.ips.push_back(kIpPeer);
  o.lcores = {0, 1};

  Shared sh;
  sh.selective_repeat = GetParam();
  Peer* peer = nullptr;
  control::StageSpec spec;
  spec.pipeline = 1;
  spec.make = [&](Engine& eng, pipeline::Dataplane& dp) {
    auto p = std::make_unique<Peer>(eng, dp, sh);
    peer = p.get();
    return std::unique_ptr<control::Stage>(std::move(p));
  };
  std::string err;
  auto node = control::Node::start(o, /*embedded=*/false, err, spec);
  ASSERT_TRUE(node) << err;
  ASSERT_TRUE(peer && peer->ok());

  App app{sh, dir + "/app.sock"};
  std::thread t([&] {
    app.run();
    g_stop = 1;
  });
  const int rc = node->run(g_stop);
  t.join();
  const nlohmann::ordered_json st = node->status();
  node.reset();
  (void)::system(("rm -rf " + dir).c_str());

  EXPECT_EQ(rc, 0);
  ASSERT_EQ(app.error, "");
  EXPECT_EQ(app.timeouts, 0u) << "operations that never completed";
  EXPECT_EQ(app.failed, 0u) << app.first_failure;
  EXPECT_EQ(app.completed, app.posted);
  EXPECT_EQ(app.posted, std::uint64_t{kBatch} * (kWarmBatches + kCountedBatches));
  EXPECT_EQ(sh.peer_errors.load(), 0u);
  EXPECT_EQ(sh.peer_recvs.load(), app.sends) << "every SEND and WRITE with immediate reached the peer";
  // What ran: both ports carried frames, loss was repaired on the
  // application's side, the node slept and was woken by doorbells.
  std::printf("status: doorbells=%s sleeps=%s ethdev=%s ethdev_1=%s qp_totals=%s\n",
              st["wait"]["doorbells"].dump().c_str(), st["dataplane"]["idle_sleeps"].dump().c_str(),
              st["ethdev"].dump().c_str(), st["ethdev_1"].dump().c_str(), st["qp_totals"].dump().c_str());
  EXPECT_GE(st["ethdev_1"]["rx"].get<std::uint64_t>(), app.posted) << "a request frame or more for each WR";
  EXPECT_GT(st["ethdev"]["rx"].get<std::uint64_t>(), 0u);
  EXPECT_GT(st["qp_totals"]["retransmitted_pkts"].get<std::uint64_t>(), 0u);
  // Which recovery repaired it: go-back-N's sequence NAKs, or none at all.
  if (GetParam()) {
    EXPECT_EQ(st["qp_totals"]["rcvd_seq_err"].get<std::uint64_t>(), 0u) << "selective repeat sends no NAKs";
  } else {
    EXPECT_GT(st["qp_totals"]["rcvd_seq_err"].get<std::uint64_t>(), 0u);
  }
  EXPECT_GT(st["wait"]["doorbells"].get<std::uint64_t>(), 0u);
  EXPECT_EQ(app.allocs, 0u) << "allocations in the counted window: " << app.alloc_report;
}

INSTANTIATE_TEST_SUITE_P(Recovery, NoAllocNode, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return std::string(i.param ? "SelectiveRepeat" : "GoBackN");
                         });

}  // namespace
}  // namespace uroce::testing
