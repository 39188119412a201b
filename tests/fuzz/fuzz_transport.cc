// libFuzzer target for the transport's state: one engine (the DUT) with one
// connected RC QP, and the fuzzer as its peer. Each input is a script of
// steps, one byte's op each with its arguments from the bytes after it:
// the DUT posts sends (SEND, WRITE, READ, FETCH_ADD) and receives; the peer
// injects requests at the responder (SEND/WRITE first, middle, last, only,
// READ, atomics; PSNs in order, duplicated, behind or ahead; keys right or
// wrong), responses at the completer (ACK, RNR and sequence NAKs, errors,
// READ responses, atomic ACKs, at any PSN around what the DUT sent),
// repeats the last frame, jumps its PSN, or lets virtual time pass.
//
// Asserted after every step, and at the end once the QP is moved to ERR
// (which must flush everything outstanding):
// - every WR posted completes exactly once, and the sends in post order;
// - the messages delivered to receives (each SEND carries its first PSN)
//   come in strictly increasing PSN order: nothing twice, nothing out of
//   order, and never more completions than receives;
// - nothing outside the DUT's registered region is ever written (canaries
//   around it, checked at the end; ASan checks every access besides).
// Built with -Dfuzz=true. FUZZ_TRACE=1 prints each injected frame and each
// delivery, to read a crash input: fuzz_transport CRASH_FILE.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "stack/abi/qp_attr.h"
#include "stack/transport/engine.h"
#include "stack/wire/builder.h"
#include "stack/wire/opcode.h"

namespace {

using namespace uroce;
using namespace uroce::transport;
namespace w = uroce::wire;

const w::MacAddr kDutMac{0x02, 0, 0, 0, 0, 0x0a};
const w::MacAddr kPeerMac{0x02, 0, 0, 0, 0, 0x0b};
const w::IpAddr kDutIp = w::IpAddr::from_v4(10, 0, 0, 1);
const w::IpAddr kPeerIp = w::IpAddr::from_v4(10, 0, 0, 2);
constexpr std::uint32_t kPeerQpn = 0x99;
constexpr std::uint32_t kSqPsn = 0xfffff0;  // both directions cross the 2^24 wrap early
constexpr std::uint32_t kRqPsn = 0xffffe0;
constexpr std::size_t kCanary = 4096;      // bytes either side of the region
constexpr std::size_t kRegion = 1 << 18;   // the DUT's MR
constexpr std::size_t kRecvSlots = 32;     // receive buffers, 4 KiB each, at the region's end
constexpr std::size_t kRecvBase = kRegion - kRecvSlots * 4096;
constexpr std::uint8_t kCanaryByte = 0xc5;

[[noreturn]] void broken(const char* what) {
  std::fprintf(stderr, "fuzz_transport: invariant broken: %s\n", what);
  std::abort();
}

class Input {
 public:
  Input(const std::uint8_t* d, std::size_t n) : d_(d), n_(n) {}
  bool more() const { return i_ < n_; }
  std::uint8_t u8() { return i_ < n_ ? d_[i_++] : 0; }
  std::uint16_t u16() { return static_cast<std::uint16_t>(u8() | (u8() << 8)); }

 private:
  const std::uint8_t* d_;
  std::size_t n_, i_ = 0;
};

struct Dut {
  std::unique_ptr<Engine> eng;
  Pd* pd = nullptr;
  Cq* cq = nullptr;
  Mr* mr = nullptr;
  Qp* qp = nullptr;
  // One buffer for every input (a fresh one each time costs page faults), canaries refilled.
  static std::uint8_t* memory() {
    static std::uint8_t* m = new std::uint8_t[kRegion + 2 * kCanary];
    return m;
  }
  std::uint8_t* mem = memory();
  std::uint8_t* region() { return mem + kCanary; }
  std::uint64_t now = 1'000'000;

  // The invariants' bookkeeping.
  std::uint64_t next_send_id = 1, next_recv_id = 1 << 20;
  std::vector<std::uint8_t> send_done, recv_done;  // completions seen per id
  std::uint64_t last_send_done = 0;
  std::uint32_t recvs_out = 0;
  bool delivered_any = false;
  w::Psn last_delivered{};
  // What the DUT sent last (for responses) and the peer's own PSN.
  w::Psn dut_psn{kSqPsn};
  w::Psn peer_psn{kRqPsn};
  std::vector<std::uint8_t> last_frame;

  Dut() {
    EngineConfig c;
    c.mac = kDutMac;
    c.ip = kDutIp;
    c.max_qps = 4;
    c.max_mrs = 4;
    c.tx_ring = 256;
    c.seed = 1;
    eng = std::make_unique<Engine>(c);
    eng->set_neighbor(kPeerIp, kPeerMac);
    pd = eng->alloc_pd();
    cq = eng->create_cq(512);
    std::memset(mem, kCanaryByte, kCanary);
    std::memset(region(), 0, kRegion);
    std::memset(region() + kRegion, kCanaryByte, kCanary);
    mr = eng->reg_mr(pd, region(), kRegion,
                     IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                         IBV_ACCESS_REMOTE_ATOMIC);
    QpInitAttr ia;
    ia.qp_type = IBV_QPT_RC;
    ia.send_cq = ia.recv_cq = cq;
    ia.cap.max_send_wr = 64;
    ia.cap.max_recv_wr = kRecvSlots;
    qp = eng->create_qp(pd, ia);
    abi::Connect k;
    k.type = IBV_QPT_RC;
    k.access = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
    k.path_mtu = IBV_MTU_1024;
    k.dest_qp_num = kPeerQpn;
    k.rq_psn = kRqPsn;
    k.sq_psn = kSqPsn;
    k.max_rd_atomic = k.max_dest_rd_atomic = 4;
    k.min_rnr_timer = 1;
    k.timeout = 8;  // ~1 ms on the virtual clock
    k.retry_cnt = 3;
    k.rnr_retry = 3;
    std::memcpy(k.dgid.raw, kPeerIp.b.data(), 16);
    if (!mr || !qp || !eng->bring_up(qp, k)) broken("the rig does not come up");
  }

  /// One turn: the engine's loop, what it sent, what it completed.
  void turn() {
    eng->poll(now);
    eng->drain_tx([&](const TxFrame& f) {
      if (w::kOpcodeTable[f.opcode].has(w::kOpRequest)) dut_psn = f.psn;
    });
    ibv_wc wc[32];
    int n;
    while ((n = eng->poll_cq(cq, wc)) > 0)
      for (int i = 0; i < n; ++i) on_wc(wc[i]);
  }

  void on_wc(const ibv_wc& c) {
    if (c.wr_id >= (1u << 20)) {  // a receive
      const std::uint64_t id = c.wr_id - (1u << 20);
      if (id >= recv_done.size() || recv_done[id]++) broken("a receive completed twice, or one never posted");
      --recvs_out;
      if (c.status != IBV_WC_SUCCESS || c.opcode != IBV_WC_RECV) return;  // a WRITE with immediate places no data here
      if (c.byte_len < 4) return;  // too short to carry its tag (zero-length SENDs are legal)
      std::uint32_t tag;
      std::memcpy(&tag, region() + kRecvBase + (id % kRecvSlots) * 4096, 4);
      const w::Psn psn(tag & 0xffffff);
      if (trace) std::fprintf(stderr, "  delivered: receive %lu, %u bytes, tag psn 0x%06x\n", static_cast<unsigned long>(id), c.byte_len, psn.value());
      if (delivered_any && !is_before(last_delivered, psn)) broken("a message delivered twice or out of order");
      delivered_any = true;
      last_delivered = psn;
      return;
    }
    if (c.wr_id == 0 || c.wr_id >= send_done.size() || send_done[c.wr_id]++) broken("a send completed twice, or one never posted");
    if (c.wr_id <= last_send_done) broken("sends completed out of post order");
    last_send_done = c.wr_id;
  }

  void post_send(Input& in) {
    static const ibv_wr_opcode kOps[] = {IBV_WR_SEND, IBV_WR_RDMA_WRITE, IBV_WR_RDMA_READ, IBV_WR_ATOMIC_FETCH_AND_ADD};
    SendWr wr;
    wr.opcode = kOps[in.u8() % 4];
    const bool atomic = wr.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD;
    const std::uint32_t len = atomic ? 8 : (in.u8() % 17) * 256;  // 0..4096: up to 4 packets at MTU 1024
    Sge sge{reinterpret_cast<std::uint64_t>(region() + 8 * (in.u8() % 64)), len, mr->lkey};
    wr.sg_list = {&sge, len ? 1u : 0u};
    wr.wr_id = next_send_id;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.remote_addr = 0x10000000ull + 8 * in.u8();
    wr.rkey = 0x1234;
    wr.compare_add = 1;
    if (eng->post_send(qp, wr) != 0) return;  // full, or a state that takes none: not posted
    send_done.resize(next_send_id + 1, 0);
    ++next_send_id;
  }

  void post_recv() {
    if (recvs_out >= kRecvSlots) return;
    const std::uint64_t id = next_recv_id - (1u << 20);
    Sge sge{reinterpret_cast<std::uint64_t>(region() + kRecvBase + (id % kRecvSlots) * 4096), 4096, mr->lkey};
    if (eng->post_recv(qp, RecvWr{next_recv_id, {&sge, 1}}) != 0) return;
    recv_done.resize(id + 1, 0);
    ++next_recv_id;
    ++recvs_out;
  }

  bool trace = std::getenv("FUZZ_TRACE") != nullptr;
  void inject(const w::FrameSpec& s, std::vector<std::uint8_t> payload) {
    if (trace) std::fprintf(stderr, "inject %s psn 0x%06x len %zu%s\n", w::kOpcodeTable[s.opcode].name.data(), s.psn.value(), payload.size(), s.ackreq ? " ackreq" : "");
    std::vector<std::uint8_t> frame(payload.size() + 256);
    const std::size_t n = w::build_frame(frame, s, payload);
    if (n == 0) return;
    frame.resize(n);
    last_frame = frame;
    (void)eng->rx(frame, now);
  }

  w::FrameSpec spec(std::uint8_t opcode, w::Psn psn) const {
    w::FrameSpec s;
    s.eth_dst = kDutMac;
    s.eth_src = kPeerMac;
    s.src = kPeerIp;
    s.dst = kDutIp;
    s.udp_sport = w::udp_sport_for(kPeerQpn, qp->qpn);
    s.opcode = opcode;
    s.psn = psn;
    s.destqp = qp->qpn;
    return s;
  }

  /// A request from the peer, to the DUT's responder.
  void inject_request(Input& in) {
    static const std::uint8_t kOps[] = {
        w::op::kRcSendFirst,        w::op::kRcSendMiddle,        w::op::kRcSendLast,         w::op::kRcSendOnly,
        w::op::kRcSendOnlyImm,      w::op::kRcWriteFirst,    w::op::kRcWriteMiddle,  w::op::kRcWriteLast,
        w::op::kRcWriteOnly,    w::op::kRcWriteOnlyImm,  w::op::kRcReadRequest,  w::op::kRcCmpSwap,
        w::op::kRcFetchAdd,         w::op::kRcSendLastImm,       w::op::kRcWriteLastImm, w::op::kRcSendOnly};
    const std::uint8_t sel = in.u8();
    const std::uint8_t opc = kOps[sel % 16];
    const std::int8_t delta = static_cast<std::int8_t>(in.u8());
    const bool in_order = (sel & 0x10) == 0;  // mostly the PSN the responder expects
    const w::Psn psn = in_order ? peer_psn : peer_psn + static_cast<std::uint32_t>(static_cast<std::int32_t>(delta));
    w::FrameSpec s = spec(opc, psn);
    const std::uint8_t flags = in.u8();
    s.ackreq = flags & 1;
    s.se = flags & 2;
    const bool middle_or_first = opc == w::op::kRcSendFirst || opc == w::op::kRcSendMiddle || opc == w::op::kRcWriteFirst ||
                                 opc == w::op::kRcWriteMiddle;
    std::size_t len = middle_or_first ? 1024 : 4 + (in.u8() % 64) * 16;
    if (flags & 4) len = in.u8();  // any length, the MTU's rules broken or not
    const std::uint32_t off = static_cast<std::uint32_t>(in.u16()) * 4;
    s.ext.reth_va = s.ext.atomic_va = reinterpret_cast<std::uint64_t>(region()) + ((flags & 8) ? off * 16 : off);
    s.ext.reth_rkey = s.ext.atomic_rkey = (flags & 16) ? in.u16() : mr->rkey;
    s.ext.reth_len = (flags & 32) ? in.u16() * 16u : static_cast<std::uint32_t>(len);
    s.ext.atomic_swap_add = 1;
    s.ext.imm = 7;
    const bool has_payload = w::kOpcodeTable[opc].has(w::kOpPayload);
    std::vector<std::uint8_t> payload(has_payload ? len : 0, static_cast<std::uint8_t>(psn.value()));
    if (payload.size() >= 4) {  // a SEND's tag: its PSN, for the delivery check
      const std::uint32_t tag = psn.value();
      std::memcpy(payload.data(), &tag, 4);
    }
    inject(s, std::move(payload));
    if (in_order) peer_psn = peer_psn + 1;
  }

  /// A response from the peer, to the DUT's completer.
  void inject_response(Input& in) {
    static const std::uint8_t kOps[] = {w::op::kRcAck,         w::op::kRcAck,         w::op::kRcReadRespFirst,
                                        w::op::kRcReadRespMiddle, w::op::kRcReadRespLast, w::op::kRcReadRespOnly,
                                        w::op::kRcAtomicAck,   w::op::kRcAck};
    static const std::uint8_t kSyndromes[] = {0x1f, 0x1f, 0x00, 0x20, 0x60, 0x61, 0x62, 0x63, 0x64, 0x1f, 0x3f, 0x41};
    const std::uint8_t sel = in.u8();
    const std::uint8_t opc = kOps[sel % 8];
    const std::int8_t delta = static_cast<std::int8_t>(in.u8());
    const w::Psn psn = (sel & 8) ? dut_psn + static_cast<std::uint32_t>(static_cast<std::int32_t>(delta)) : dut_psn;
    w::FrameSpec s = spec(opc, psn);
    s.ext.aeth_syndrome = kSyndromes[in.u8() % 12];
    s.ext.aeth_msn = in.u8();
    s.ext.atomic_ack_orig = 5;
    const bool has_payload = w::kOpcodeTable[opc].has(w::kOpPayload);
    const std::size_t len = (opc == w::op::kRcReadRespFirst || opc == w::op::kRcReadRespMiddle) ? 1024 : in.u8() * 4u;
    inject(s, std::vector<std::uint8_t>(has_payload ? len : 0, 0xab));
  }

  /// Virtual time passes, with the engine's timers on the nanosecond.
  void advance(std::uint64_t ns) {
    const std::uint64_t until = now + ns;
    while (now < until) {
      const std::uint64_t d = eng->next_deadline();
      now = (d > now && d < until) ? d : std::min(until, now + 50'000);
      turn();
    }
  }

  // Checked once an input is done: a stray write stays in the canaries, so
  // one check at the end finds it as surely as one after every step.
  void check_canaries() const {
    static const std::vector<std::uint8_t> kExpected(kCanary, kCanaryByte);
    if (std::memcmp(mem, kExpected.data(), kCanary) != 0 || std::memcmp(mem + kCanary + kRegion, kExpected.data(), kCanary) != 0)
      broken("a write outside the MR");
  }

  void finish() {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_ERR;
    eng->modify_qp(qp, a, IBV_QP_STATE);
    advance(5'000'000);
    for (std::size_t id = 1; id < send_done.size(); ++id)
      if (send_done[id] != 1) broken("a send was lost: no completion after the QP went to ERR");
    for (std::size_t id = 0; id < recv_done.size(); ++id)
      if (recv_done[id] != 1) broken("a receive was lost: no completion after the QP went to ERR");
    check_canaries();
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size > 4096) return 0;  // long scripts add time, not states
  Input in(data, size);
  Dut d;
  d.turn();
  for (int i = 0; i < 4; ++i) d.post_recv();
  while (in.more()) {
    switch (in.u8() % 8) {
      case 0: d.post_send(in); break;
      case 1: d.post_recv(); break;
      case 2:
      case 3: d.inject_request(in); break;
      case 4: d.inject_response(in); break;
      case 5:
        if (!d.last_frame.empty()) (void)d.eng->rx(d.last_frame, d.now);  // a duplicate
        break;
      case 6: d.peer_psn = d.peer_psn + in.u16(); break;  // the peer jumps
      case 7: d.advance((in.u8() + 1) * 20'000ull); break;                         // 20 us .. 5.1 ms
    }
    d.turn();
  }
  d.finish();
  return 0;
}
