// Replays loss-recovery captures made live against Linux rxe
// (pcap-fixtures/rxe/, written by tests/interop/make_fixtures.sh) into a
// fresh engine on a virtual clock, in lock-step with the capture:
//  - every frame rxe sent goes into Engine::rx() where the capture has it;
//  - where the capture has a frame of ours, the engine is polled (at the
//    captured time, or at its own timer deadline when that is what sent it
//    live) and must send exactly that frame next: same opcode and PSN, and
//    for ACKs and NAKs the same AETH syndrome and MSN.
// The engine is set up as uroced set it up live (same QPN, PSNs, MTU, ACK
// timeout, RDMA read depth); as requester it is given each work request just
// before the capture shows its first packet (taken from that packet's RETH).
// rxe's requests carry the rkey of the live run's MR; they are rewritten to
// the replay MR's rkey (and their ICRC recomputed), which is the only change
// made to what rxe sent. So these tests pin our NAK sequence errors, duplicate
// handling, go-back-N retransmissions and READ replays against what rxe did.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "drivers/pcap/pcap_io.h"
#include "stack/transport/engine.h"
#include "stack/wire/icrc.h"
#include "stack/wire/opcode.h"
#include "stack/wire/parser.h"

namespace uroce::transport {
namespace {

using wire::Psn;

const wire::IpAddr kOurIp = wire::IpAddr::from_v4(10, 77, 0, 10);  // uroced's address in tests/interop

struct Cap {
  std::size_t index = 0;  // frame number in the file, from 1
  std::uint64_t t_ns = 0;
  std::vector<std::uint8_t> bytes;
  bool ours = false;
  wire::Packet pkt;  // points into bytes
};

struct Seen {  // what a frame says, for comparing ours with the capture's
  std::uint8_t opcode = 0;
  std::uint32_t psn = 0;
  bool has_aeth = false;
  std::uint8_t syndrome = 0;
  std::uint32_t msn = 0;
  std::string str() const {
    char b[96];
    std::snprintf(b, sizeof b, "opcode 0x%02x psn %u", opcode, psn);
    std::string s = b;
    if (has_aeth) {
      std::snprintf(b, sizeof b, " syndrome 0x%02x msn %u", syndrome, msn);
      s += b;
    }
    return s;
  }
  bool operator==(const Seen&) const = default;
};

Seen seen_of(const wire::Packet& p) {
  Seen s;
  s.opcode = p.opcode;
  s.psn = p.psn.value();
  if (p.info->off_aeth != 0) {
    s.has_aeth = true;
    s.syndrome = p.aeth()->syndrome;
    s.msn = p.aeth()->msn.get();
  }
  return s;
}

bool is_request(const wire::Packet& p) { return p.info->has(wire::kOpRequest); }

std::vector<Cap> load(const std::string& path, std::string& err) {
  std::vector<Cap> out;
  pcapio::Reader r;
  if (!r.open(path)) {
    err = r.error();
    return out;
  }
  pcapio::Frame f;
  std::size_t i = 0;
  while (r.next(f)) {
    ++i;
    wire::Packet p;
    if (!wire::parse_frame(f.data, wire::ParseOptions{}, p).ok()) continue;  // ARP and friends
    if (p.destqp == kGsiQpn || p.info == nullptr || (p.opcode >> 5) != 0) continue;  // RC only
    Cap c;
    c.index = i;
    c.t_ns = static_cast<std::uint64_t>(f.ts_sec) * 1'000'000'000ull + static_cast<std::uint64_t>(f.ts_usec) * 1000ull;
    c.bytes.assign(f.data.begin(), f.data.end());
    out.push_back(std::move(c));
  }
  for (auto& c : out) {  // parse again now that the bytes sit still
    EXPECT_TRUE(wire::parse_frame(wire::ConstBytes(c.bytes.data(), c.bytes.size()), wire::ParseOptions{}, c.pkt).ok());
    c.ours = c.pkt.src == kOurIp;
  }
  return out;
}

/// Rewrites the RETH's rkey of a frame from rxe and recomputes its ICRC.
void set_rkey(Cap& c, std::uint32_t rkey) {
  if (c.pkt.info->off_reth == 0) return;
  auto* reth = const_cast<wire::Reth*>(c.pkt.reth());
  reth->rkey.set(rkey);
  const auto icrc = wire::icrc_compute(
      wire::ConstBytes(c.bytes.data() + c.pkt.l3_off, static_cast<std::size_t>(c.pkt.icrc_off - c.pkt.l3_off)));
  ASSERT_TRUE(icrc.has_value());
  wire::icrc_store(c.bytes.data() + c.pkt.icrc_off, *icrc);
}

struct Fixture {
  const char* file;
  std::uint8_t timeout;     // the live run's ACK timeout (uroce-perf -u 18)
  std::size_t min_events;   // NAKs we sent + frames we sent twice, at least
};

class RxeReplay : public ::testing::TestWithParam<Fixture> {};

TEST_P(RxeReplay, OurRepliesMatchTheCapture) {
  const Fixture fx = GetParam();
  const std::string path = std::string(UROCE_FIXTURES_DIR) + "/rxe/" + fx.file;
  std::string err;
  std::vector<Cap> caps = load(path, err);
  ASSERT_FALSE(caps.empty()) << path << ": " << err;

  // The one RC connection in the file, and our role in it.
  std::optional<std::uint32_t> our_qpn, their_qpn;
  bool we_request = false, they_request = false;
  wire::MacAddr our_mac{}, their_mac{};
  wire::IpAddr our_ip{}, their_ip{};
  std::optional<Psn> first_req_psn;  // of the requester, whichever side
  std::uint32_t mtu = 256;
  for (const Cap& c : caps) {
    const auto& p = c.pkt;
    (c.ours ? their_qpn : our_qpn) = p.destqp;
    if (c.ours) {
      our_mac = p.eth_src, their_mac = p.eth_dst, our_ip = p.src, their_ip = p.dst;
    }
    const bool req = is_request(p);
    (c.ours ? we_request : they_request) |= req;
    if (req && (!first_req_psn || is_before(p.psn, *first_req_psn))) first_req_psn = p.psn;
    while (mtu < p.payload_len && mtu < 4096) mtu *= 2;
  }
  ASSERT_TRUE(our_qpn && their_qpn) << "no RC conversation in " << path;
  ASSERT_NE(we_request, they_request) << "one side must be the requester";
  ASSERT_TRUE(first_req_psn.has_value());

  EngineConfig cfg;  // uroced's defaults
  cfg.mac = our_mac;
  cfg.ip = our_ip;
  // Lock-step with the capture: the engine queues at most two frames per turn
  // (a restart packet and its deliberate second copy, see requester.cc).
  cfg.tx_ring = 2;
  Engine eng(cfg);
  eng.set_neighbor(their_ip, their_mac);
  Pd* pd = eng.alloc_pd();
  Cq* cq = eng.create_cq(65536);
  const unsigned all = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;

  // Our MR: where rxe's RDMA requests pointed, at the same addresses.
  std::uint64_t lo = ~0ull, hi = 0;
  for (const Cap& c : caps)
    if (!c.ours && c.pkt.info->off_reth != 0) {
      lo = std::min(lo, c.pkt.reth()->va.get());
      hi = std::max(hi, c.pkt.reth()->va.get() + c.pkt.reth()->dma_len.get());
    }
  std::vector<std::uint8_t> remote_mem(they_request ? hi - lo : 0);
  Mr* rmr = they_request ? eng.reg_mr_iova(pd, remote_mem.data(), remote_mem.size(), all, lo) : nullptr;
  std::vector<std::uint8_t> local_mem(1 << 20);
  Mr* lmr = eng.reg_mr(pd, local_mem.data(), local_mem.size(), all);
  ASSERT_TRUE(lmr != nullptr && (!they_request || rmr != nullptr));

  // Our QP gets the captured QPN: the engine hands out QPNs in order.
  QpInitAttr ia;
  ia.qp_type = IBV_QPT_RC;
  ia.send_cq = ia.recv_cq = cq;
  ia.cap.max_send_wr = 4096;
  Qp* qp = nullptr;
  for (int i = 0; i < 64 && (qp == nullptr || qp->qpn != *our_qpn); ++i) qp = eng.create_qp(pd, ia);
  ASSERT_TRUE(qp != nullptr && qp->qpn == *our_qpn) << "cannot make QPN " << *our_qpn;
  abi::Connect k;
  k.access = all;
  k.path_mtu = mtu == 4096 ? IBV_MTU_4096 : mtu == 2048 ? IBV_MTU_2048 : mtu == 512 ? IBV_MTU_512 : IBV_MTU_1024;
  k.dest_qp_num = *their_qpn;
  k.rq_psn = they_request ? first_req_psn->value() : 0;
  k.sq_psn = we_request ? first_req_psn->value() : 0;
  std::memcpy(k.dgid.raw, their_ip.b.data(), 16);
  k.max_rd_atomic = k.max_dest_rd_atomic = kMaxRdAtomic;
  k.timeout = fx.timeout;
  ASSERT_TRUE(eng.bring_up(qp, k));

  if (they_request)
    for (Cap& c : caps)
      if (!c.ours) set_rkey(c, rmr->rkey);

  // Lock-step.
  const std::uint64_t t0 = caps.front().t_ns, base = 1'000'000'000ull;
  std::uint64_t clock = base;
  std::deque<Seen> sent;  // by the engine, not yet matched
  auto take = [&] {
    eng.drain_tx([&](const TxFrame& f) {
      std::vector<std::uint8_t> flat(f.size());
      ASSERT_EQ(f.copy_to(wire::Bytes(flat.data(), flat.size())), flat.size());
      wire::Packet p;
      ASSERT_TRUE(wire::parse_frame(wire::ConstBytes(flat.data(), flat.size()), wire::ParseOptions{}, p).ok());
      EXPECT_EQ(p.destqp, *their_qpn);
      sent.push_back(seen_of(p));
    });
  };
  std::optional<Psn> next_new;  // requester: first PSN not yet posted
  std::size_t matched = 0, our_naks = 0, our_repeats = 0;
  std::vector<std::uint32_t> psns_sent;
  for (Cap& c : caps) {
    clock = std::max(clock, base + (c.t_ns - t0));
    if (!c.ours) {
      eng.rx(wire::ConstBytes(c.bytes.data(), c.bytes.size()), clock);
      continue;
    }
    const Seen want = seen_of(c.pkt);
    if (we_request && is_request(c.pkt) && c.pkt.info->off_reth != 0 &&
        (!next_new || !is_before(c.pkt.psn, *next_new))) {
      // The first packet of a message we have not posted yet: post it now.
      const wire::Reth* r = c.pkt.reth();
      Sge sge{reinterpret_cast<std::uint64_t>(local_mem.data()), std::min<std::uint32_t>(r->dma_len.get(), 1 << 20),
              lmr->lkey};
      SendWr wr;
      wr.opcode = c.pkt.opcode == wire::op::kRcReadRequest ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE;
      wr.send_flags = IBV_SEND_SIGNALED;
      wr.sg_list = std::span<const Sge>(&sge, 1);
      wr.remote_addr = r->va.get();
      wr.rkey = r->rkey.get();
      ASSERT_EQ(eng.post_send(qp, wr), 0) << "frame " << c.index;
      next_new = c.pkt.psn + std::max<std::uint32_t>(1, (r->dma_len.get() + mtu - 1) / mtu);
    }
    // Poll at the captured time; a retransmission after a timeout may need
    // the timer's own deadline, which the µs-resolution capture can round
    // below.
    for (int k = 0; k < 4 && sent.empty(); ++k) {
      eng.poll(clock);
      take();
      if (!sent.empty()) break;
      const std::uint64_t dl = eng.next_deadline();
      if (dl == 0 || dl > clock + 2'000'000) break;
      clock = std::max(clock, dl);
    }
    ASSERT_FALSE(sent.empty()) << fx.file << " frame " << c.index << ": the capture has our " << want.str()
                               << " here; the engine sent nothing (" << matched << " matched before)";
    ASSERT_EQ(sent.front(), want) << fx.file << " frame " << c.index << ": captured " << want.str() << ", replay sent "
                                  << sent.front().str() << " (" << matched << " matched before)";
    sent.pop_front();
    ++matched;
    if (want.has_aeth && (want.syndrome & 0xe0) == 0x60) ++our_naks;
    if (is_request(c.pkt)) {
      if (std::find(psns_sent.begin(), psns_sent.end(), want.psn) != psns_sent.end()) ++our_repeats;
      psns_sent.push_back(want.psn);
    }
  }
  // Nothing more queued than the capture shows.
  eng.poll(clock);
  take();
  EXPECT_TRUE(sent.empty()) << fx.file << ": the replay sent more than the capture: " << sent.front().str();
  EXPECT_GE(our_naks + our_repeats, fx.min_events) << "the fixture shows no loss recovery on our side";
  std::printf("%s: %zu of our frames matched; we NAKed %zu times and retransmitted %zu requests\n", fx.file, matched,
              our_naks, our_repeats);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, RxeReplay,
                         ::testing::Values(Fixture{"write_uroce_requester.pcap", 18, 1},
                                           Fixture{"write_uroce_responder.pcap", 18, 1},
                                           Fixture{"read_uroce_requester.pcap", 18, 1},
                                           Fixture{"read_uroce_responder.pcap", 18, 1}),
                         [](const auto& info) {
                           std::string n = info.param.file;
                           return n.substr(0, n.find('.'));
                         });

}  // namespace
}  // namespace uroce::transport
