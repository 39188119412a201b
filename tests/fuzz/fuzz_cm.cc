// libFuzzer target for the CM agent. Each input is one MAD (up to 256
// bytes) that a peer engine sends as a UD datagram to the agent's QP1,
// where it is parsed and acted on: a REQ, REP, RTU, REJ, DREQ, DREP or MRA
// for a connection that may or may not exist. The agent's state persists
// from input to input, as a hostile peer's would see it; its owner rejects
// every connect request, so the agent's bounds, not the harness, decide
// how much state a stream of MADs can build. Built with -Dfuzz=true.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>

#include "stack/abi/qp_attr.h"
#include "stack/cm/agent.h"
#include "tests/support/pair.h"

namespace {

using namespace uroce;

constexpr std::uint32_t kOwner = 1;

struct Rig {
  testing::Pair p{7, 1u << 16, 64};
  std::unique_ptr<cm::CmAgent> agent;
  transport::Qp* ud = nullptr;  // B's QP1, the sender
  transport::Ah ah;
  Rig() {
    cm::CmConfig c;
    c.ca_guid = 0x0200000000000a01ull;
    c.seed = 3;
    agent = std::make_unique<cm::CmAgent>(p.A(), c);
    (void)agent->listen(7000, kOwner);
    transport::QpInitAttr ia;
    ia.qp_type = IBV_QPT_UD;
    ia.gsi = true;  // B's QP1: the agent takes MADs only from a peer's QP1
    ia.send_cq = ia.recv_cq = p.node[1].cq;
    ud = p.B().create_qp(p.node[1].pd, ia);
    abi::Connect k;
    k.type = IBV_QPT_UD;
    k.qkey = transport::kGsiQkey;  // a Q_Key with the high bit set in a WR means "the QP's own": give it QP1's
    testing::Pair::must(p.B().bring_up(ud, k));
    ah.dgid = p.A().config().ip;
    ah.dmac = p.A().config().mac;
    p.wire.next_timer = [this] { return agent->next_deadline(); };
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static Rig r;
  if (size == 0) return 0;
  // A MAD is 256 bytes: a shorter input is the start of one, zero-filled
  // (so the fuzzer reaches the agent, not only the length check); a longer
  // one is cut. Every ninth input is sent as it is, short ones included.
  const bool as_is = data[0] % 9 == 0;
  const std::size_t n = as_is ? std::min<std::size_t>(size, 256) : 256;
  std::memset(r.p.node[1].mem.data(), 0, 256);
  std::memcpy(r.p.node[1].mem.data(), data, std::min<std::size_t>(size, 256));
  transport::Sge s = r.p.sge(1, 0, static_cast<std::uint32_t>(n));
  transport::SendWr w;
  w.opcode = IBV_WR_SEND;
  w.sg_list = {&s, 1};
  w.ah = &r.ah;
  w.remote_qpn = transport::kGsiQpn;
  w.remote_qkey = transport::kGsiQkey;
  if (r.p.B().post_send(r.ud, w) != 0) return 0;
  // Deliver it, let the agent answer and run its timers for a while (virtual time).
  r.p.wire.run_until(
      [&] {
        r.agent->poll(r.p.wire.now());
        return false;
      },
      2'000'000);
  cm::CmEvent e;
  while (r.agent->next_event(kOwner, e))
    if (e.type == cm::CmEvent::Type::kConnectRequest) (void)r.agent->reject(e.id, {}, kOwner, r.p.wire.now());
  std::vector<ibv_wc> wc;
  while (r.p.poll(1, wc) > 0) wc.clear();  // B's CQ: its sends and whatever the agent answered
  return 0;
}
