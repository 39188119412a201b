// uroce-rping: librdmacm's rping over uroce's RDMA CM, so either side can be
// the real rping.
//
//   uroce-rping -s [-p port] [-C count] [-S size] [-v] [-V] [-d dev]     server
//   uroce-rping -c -a ADDR [-p port] [-C count] [-S size] [-v] [-V]      client
//
// The protocol (rdma-core librdmacm/examples/rping.c), per ping:
//   client: SEND {its start buffer: be64 addr, be32 rkey, be32 size}
//   server: RDMA READ of that buffer into its own; SEND "go ahead"
//   client: SEND {its rdma buffer}
//   server: RDMA WRITE of what it read into the client's rdma buffer; SEND "go ahead"
//   client: (-V) the rdma buffer must equal the start buffer
// Every control message is 16 bytes; the connection is made and closed with
// RDMA CM (REQ/REP/RTU, DREQ/DREP on QP1, service ID RDMA_PS_TCP:port).
#include <arpa/inet.h>
#include <getopt.h>
#include <unistd.h>
#include <netdb.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <string>

#include "stack/verbs/uroce_verbs.h"
#include "tools/perf/wait.h"

namespace {

using clk = std::chrono::steady_clock;

struct Info {  // struct rping_rdma_info, big-endian on the wire
  std::uint64_t buf;
  std::uint32_t rkey;
  std::uint32_t size;
};
static_assert(sizeof(Info) == 16);

struct Opts {
  bool server = false, client = false, verbose = false, validate = false;
  std::string addr, device;
  std::uint16_t port = 7174;
  long count = 0;  // 0: forever (server: until the client disconnects)
  std::uint32_t size = 64;
  int timeout_ms = 30000;
  uroce::tools::WaitMode wait;  // spin briefly, then block on the channel; -B: busy-poll
};

int fail(const std::string& why) {
  std::fprintf(stderr, "uroce-rping: %s\n", why.c_str());
  return 1;
}

struct Conn {
  uroce_context* ctx = nullptr;
  uroce_pd* pd = nullptr;
  uroce_cq* cq = nullptr;
  uroce_comp_channel* channel = nullptr;
  uroce_qp* qp = nullptr;
  std::uint8_t* mem = nullptr;  // recv info | send info | start buffer | rdma buffer
  uroce_mr* mr = nullptr;
  std::uint32_t size = 0;
  std::uint32_t id = 0;
  bool disconnected = false;  // the peer's DREQ (or ours) has been seen
  // Completions taken while waiting for another kind: under loss, the
  // client's next SEND can arrive before the ACK of our go-ahead.
  ibv_wc early[8];
  int n_early = 0;
  Info* recv_info() const { return reinterpret_cast<Info*>(mem); }
  Info* send_info() const { return reinterpret_cast<Info*>(mem + 64); }
  std::uint8_t* start_buf() const { return mem + 4096; }
  std::uint8_t* rdma_buf() const { return mem + 4096 + size; }
};

bool post_recv(Conn& c) {
  ibv_sge s{reinterpret_cast<std::uint64_t>(c.recv_info()), sizeof(Info), uroce_mr_lkey(c.mr)};
  ibv_recv_wr w{};
  w.sg_list = &s;
  w.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  return uroce_post_recv(c.qp, &w, &bad) == 0;
}

bool send_info(Conn& c, const std::uint8_t* buf, std::uint32_t size) {
  c.send_info()->buf = htobe64(reinterpret_cast<std::uint64_t>(buf));
  c.send_info()->rkey = htonl(uroce_mr_rkey(c.mr));
  c.send_info()->size = htonl(size);
  ibv_sge s{reinterpret_cast<std::uint64_t>(c.send_info()), sizeof(Info), uroce_mr_lkey(c.mr)};
  ibv_send_wr w{};
  w.opcode = IBV_WR_SEND;
  w.send_flags = IBV_SEND_SIGNALED;
  w.sg_list = &s;
  w.num_sge = 1;
  ibv_send_wr* bad = nullptr;
  return uroce_post_send(c.qp, &w, &bad) == 0;
}

/// Waits for a completion of `op`; others that come first are kept for a
/// later wait. False on an error status, a disconnect or a timeout.
bool wait_for(Conn& c, ibv_wc_opcode op, const Opts& o, ibv_wc* out = nullptr) {
  for (int i = 0; i < c.n_early; ++i) {
    if (c.early[i].opcode != op) continue;
    if (out) *out = c.early[i];
    for (int j = i + 1; j < c.n_early; ++j) c.early[j - 1] = c.early[j];
    --c.n_early;
    return true;
  }
  const auto end = clk::now() + std::chrono::milliseconds(o.timeout_ms);
  for (;;) {
    ibv_wc wc;
    // Blocking for at most 20 ms, so a disconnect is noticed soon after.
    const int got = uroce::tools::poll_wait(c.cq, 1, &wc, o.wait, 20);
    if (got < 0) {
      std::fprintf(stderr, "uroce-rping: cannot wait for completions: %s\n", uroce_last_error());
      return false;
    }
    if (got == 1) {
      if (wc.status != IBV_WC_SUCCESS) {
        // A flush: the peer's DREQ took our QP to ERR; its event is queued
        // by then (the agent does both at once), so look for it.
        uroce_cm_event e{};
        if (wc.status == IBV_WC_WR_FLUSH_ERR && !c.disconnected && uroce_cm_get_event(c.ctx, 0, &e) == 0 &&
            e.event == UROCE_CM_EVENT_DISCONNECTED)
          c.disconnected = true;
        if (!(c.disconnected && wc.status == IBV_WC_WR_FLUSH_ERR))
          std::fprintf(stderr, "uroce-rping: completion %s\n", uroce_wc_status_str(wc.status));
        return false;
      }
      if (wc.opcode == IBV_WC_RECV && wc.byte_len != sizeof(Info)) {
        std::fprintf(stderr, "uroce-rping: a control message of %u bytes, not 16\n", wc.byte_len);
        return false;
      }
      if (wc.opcode == op) {
        if (out) *out = wc;
        return true;
      }
      if (wc.opcode != IBV_WC_RECV) continue;  // a SEND/READ/WRITE nobody waits for
      if (c.n_early == static_cast<int>(std::size(c.early))) {
        std::fprintf(stderr, "uroce-rping: too many unexpected completions\n");
        return false;
      }
      c.early[c.n_early++] = wc;
      continue;
    }
    uroce_cm_event e{};
    if (!c.disconnected && uroce_cm_get_event(c.ctx, 0, &e) == 0 && e.event == UROCE_CM_EVENT_DISCONNECTED) {
      // The completion may be in the CQ already (the ACK came just before
      // the DREQ): look once more, then give up.
      c.disconnected = true;
      continue;
    }
    if (c.disconnected) return false;
    if (clk::now() > end) {
      std::fprintf(stderr, "uroce-rping: nothing from the peer for %d s\n", o.timeout_ms / 1000);
      return false;
    }
  }
}

bool rdma(Conn& c, ibv_wr_opcode op, std::uint64_t raddr, std::uint32_t rkey, std::uint32_t len) {
  ibv_sge s{reinterpret_cast<std::uint64_t>(c.rdma_buf()), len, uroce_mr_lkey(c.mr)};
  ibv_send_wr w{};
  w.opcode = op;
  w.send_flags = IBV_SEND_SIGNALED;
  w.sg_list = &s;
  w.num_sge = 1;
  w.wr.rdma.remote_addr = raddr;
  w.wr.rdma.rkey = rkey;
  ibv_send_wr* bad = nullptr;
  return uroce_post_send(c.qp, &w, &bad) == 0;
}

int run(const Opts& o) {
  Conn c;
  c.size = o.size;
  c.ctx = uroce_open_device_by_name(o.device.c_str());
  if (!c.ctx) return fail(std::string("cannot open the device: ") + uroce_last_error());
  const std::size_t len = 4096 + 2 * static_cast<std::size_t>(o.size);
  c.mem = static_cast<std::uint8_t*>(uroce_alloc_buf(c.ctx, len));
  c.pd = uroce_alloc_pd(c.ctx);
  c.mr = uroce_reg_mr(c.pd, c.mem, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE);
  c.channel = o.wait.busy ? nullptr : uroce_create_comp_channel(c.ctx);
  c.cq = uroce_create_cq(c.ctx, 32, nullptr, c.channel, 0);
  uroce_qp_init_attr ia{};
  ia.send_cq = ia.recv_cq = c.cq;
  ia.qp_type = IBV_QPT_RC;
  ia.cap.max_send_wr = 16;
  ia.cap.max_recv_wr = 4;
  c.qp = c.cq ? uroce_create_qp(c.pd, &ia) : nullptr;
  if (!c.mr || !c.qp) return fail(std::string("cannot set up: ") + uroce_last_error());
  // As rdma_create_qp does: the QP goes to INIT at once, so receives can be
  // posted before the connection exists (a RESET QP takes none).
  ibv_qp_attr init{};
  init.qp_state = IBV_QPS_INIT;
  init.port_num = 1;
  init.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
  if (uroce_modify_qp(c.qp, &init, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) != 0)
    return fail(std::string("INIT: ") + uroce_last_error());
  uroce_cm_param p{};
  p.responder_resources = p.initiator_depth = 1;
  p.retry_count = p.rnr_retry_count = 7;
  uroce_cm_event e{};
  if (o.server) {
    if (uroce_cm_listen(c.ctx, o.port) != 0) return fail(std::string("listen: ") + uroce_last_error());
    std::printf("listening on port %u\n", o.port);  // scripts wait for this before starting the client
    std::fflush(stdout);
    if (uroce_cm_get_event(c.ctx, o.timeout_ms, &e) != 0 || e.event != UROCE_CM_EVENT_CONNECT_REQUEST)
      return fail("no connect request");
    c.id = e.id;
    if (!post_recv(c) || uroce_cm_accept(c.qp, c.id, &p) != 0)
      return fail(std::string("accept: ") + uroce_last_error());
  } else {
    addrinfo hints{}, *res = nullptr;
    hints.ai_family = AF_INET;
    if (::getaddrinfo(o.addr.c_str(), nullptr, &hints, &res) != 0 || !res) return fail("cannot resolve " + o.addr);
    ibv_gid gid{};
    gid.raw[10] = gid.raw[11] = 0xff;
    std::memcpy(gid.raw + 12, &reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr, 4);
    ::freeaddrinfo(res);
    if (!post_recv(c)) return fail(std::string("cannot post a receive: ") + uroce_last_error());
    // A server that does not listen yet answers REJ 8 (invalid service ID):
    // try again for a few seconds, as a user restarting rping would.
    for (int attempt = 0;; ++attempt) {
      if (uroce_cm_connect(c.qp, &gid, o.port, &p, &c.id) != 0)
        return fail(std::string("connect: ") + uroce_last_error());
      if (uroce_cm_get_event(c.ctx, o.timeout_ms, &e) != 0) return fail("no answer to the connect request");
      if (e.event != UROCE_CM_EVENT_REJECTED || e.status != 8 || attempt >= 10) break;
      ::usleep(500000);
    }
  }
  if (o.server && uroce_cm_get_event(c.ctx, o.timeout_ms, &e) != 0) return fail("no RTU from the client");
  if (e.event != UROCE_CM_EVENT_ESTABLISHED)
    return fail("the connection was not established (event " + std::to_string(e.event) + ", status " +
                std::to_string(e.status) + ")");
  long pings = 0, bad = 0;
  ibv_wc wc;
  if (o.server) {
    // Until the client disconnects (or count pings).
    while (o.count == 0 || pings < o.count) {
      if (!wait_for(c, IBV_WC_RECV, o, &wc)) break;
      const Info in = *c.recv_info();
      const std::uint64_t raddr = be64toh(in.buf);
      const std::uint32_t rkey = ntohl(in.rkey), rlen = std::min(ntohl(in.size), o.size);
      if (!post_recv(c) || !rdma(c, IBV_WR_RDMA_READ, raddr, rkey, rlen) || !wait_for(c, IBV_WC_RDMA_READ, o))
        return fail("RDMA READ of the client's buffer failed");
      if (o.verbose) std::printf("server ping data: %.*s\n", static_cast<int>(rlen), c.rdma_buf());
      if (!send_info(c, c.rdma_buf(), rlen) || !wait_for(c, IBV_WC_SEND, o)) return fail("go-ahead SEND failed");
      if (!wait_for(c, IBV_WC_RECV, o, &wc)) return fail("no sink advertisement");
      const Info sink = *c.recv_info();
      if (!post_recv(c) ||
          !rdma(c, IBV_WR_RDMA_WRITE, be64toh(sink.buf), ntohl(sink.rkey), std::min(ntohl(sink.size), rlen)) ||
          !wait_for(c, IBV_WC_RDMA_WRITE, o))
        return fail("RDMA WRITE to the client's buffer failed");
      if (!send_info(c, c.rdma_buf(), rlen)) return fail("go-ahead SEND failed");
      ++pings;
      if (!wait_for(c, IBV_WC_SEND, o)) {
        // As rping's server: the ping is done once the go-ahead is posted. A
        // client that has all its pings disconnects at once, and its DREQ may
        // overtake the ACK of this SEND (or flush it on our side).
        if (c.disconnected) break;
        return fail("go-ahead SEND failed");
      }
    }
  } else {
    for (; o.count == 0 || pings < o.count; ++pings) {
      // rping's text: "rdma-ping-N: " then cycling printable characters.
      int n = std::snprintf(reinterpret_cast<char*>(c.start_buf()), o.size, "rdma-ping-%ld: ", pings);
      for (std::uint32_t i = static_cast<std::uint32_t>(std::max(n, 0)); i < o.size; ++i)
        c.start_buf()[i] = static_cast<std::uint8_t>(65 + ((pings + i) % 58));
      if (o.size > 0) c.start_buf()[o.size - 1] = 0;
      std::memset(c.rdma_buf(), 0, o.size);
      if (!send_info(c, c.start_buf(), o.size) || !wait_for(c, IBV_WC_RECV, o)) return fail("no go-ahead");
      if (!post_recv(c) || !send_info(c, c.rdma_buf(), o.size) || !wait_for(c, IBV_WC_RECV, o))
        return fail("no second go-ahead");
      if (!post_recv(c)) return fail("cannot post a receive");
      if (o.validate && std::memcmp(c.start_buf(), c.rdma_buf(), o.size) != 0) {
        ++bad;
        std::fprintf(stderr, "data mismatch in ping %ld\n", pings);
      }
      if (o.verbose) std::printf("ping data: %s\n", reinterpret_cast<char*>(c.rdma_buf()));
    }
    uroce_cm_disconnect(c.ctx, c.id);
  }
  // The disconnect: ours (client) or the peer's (server).
  for (int i = 0; i < 10 && !c.disconnected; ++i)
    if (uroce_cm_get_event(c.ctx, 2000, &e) == 0 && e.event == UROCE_CM_EVENT_DISCONNECTED) break;
  std::printf("%ld pings%s\n", pings, o.validate ? (bad ? ", data mismatches" : ", data validated") : "");
  uroce_close_device(c.ctx);
  return bad == 0 && (o.count == 0 || pings == o.count) ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Opts o;
  int ch;
  while ((ch = getopt(argc, argv, "sca:p:C:S:vVd:B")) != -1) {
    switch (ch) {
      case 's': o.server = true; break;
      case 'c': o.client = true; break;
      case 'a': o.addr = optarg; break;
      case 'p': o.port = static_cast<std::uint16_t>(std::atoi(optarg)); break;
      case 'C': o.count = std::atol(optarg); break;
      case 'S': o.size = static_cast<std::uint32_t>(std::atoi(optarg)); break;
      case 'v': o.verbose = true; break;
      case 'V': o.validate = true; break;
      case 'd': o.device = optarg; break;
      case 'B': o.wait.busy = true; break;  // busy-poll the CQ
      default:
        std::fprintf(stderr, "usage: uroce-rping -s|-c [-a addr] [-p port] [-C count] [-S size] [-v] [-V] [-d dev] [-B]\n");
        return 2;
    }
  }
  if (o.server == o.client || (o.client && o.addr.empty()) || o.size < 16 || o.size > (1u << 20) || o.count < 0)
    return fail("give -s, or -c with -a ADDR; -S 16..1048576; -C >= 0");
  o.wait.setup();
  return run(o);
}
