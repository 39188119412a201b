// Applications over liburoce against two running uroced.
//
//   app_pair ops SOCK_A SOCK_B      every operation between two applications, data verified
//   app_pair hostile SOCK_A SOCK_B  another session's handle, a guessed rkey, an ABI mismatch
//   app_pair events SOCK_A SOCK_B  completion channels (eventfd, arm, get_cq_event)
//   app_pair oob SOCK_A SOCK_B PORT  the out-of-band TCP exchange (loopback), then a WRITE with what was learnt
//   app_pair crash SOCK_A           create resources, then die without cleaning up
//   app_pair srq SOCK_A SOCK_B      two QPs receiving from one shared receive queue
//   app_pair devices N              the device list ($UROCE_RUN_DIR, $UROCE_DEVICES) has N devices, all usable
//   app_pair rings SOCK_A SOCK_B    a raw session corrupts its own rings; a victim pair checks its bytes
//   app_pair cqoverflow SOCK_A SOCK_B  an overflowed CQ: async events, its QP in ERR
//   app_pair cm SOCK_A SOCK_B       RDMA CM: listen, connect, accept with private data, data, reject,
//                                   no listener, disconnect, a client that dies connected
//
// Prints "N passed, M failed"; exits 0 only if nothing failed.
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sched.h>
#include <sys/wait.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "stack/abi/fd_msg.h"
#include "stack/abi/session_proto.h"
#include "stack/abi/work_ring.h"
#include "stack/verbs/uroce_verbs.h"

namespace {

int g_pass = 0, g_fail = 0;
void check(bool ok, const std::string& what) {
  if (ok) ++g_pass;
  else {
    ++g_fail;
    std::printf("FAIL: %s (%s)\n", what.c_str(), uroce_last_error());
  }
}

struct End {
  uroce_context* ctx = nullptr;
  uroce_pd* pd = nullptr;
  uroce_comp_channel* channel = nullptr;
  uroce_cq* cq = nullptr;
  uroce_qp* qp = nullptr;
  std::uint8_t* buf = nullptr;
  uroce_mr* mr = nullptr;
  ibv_gid gid{};
};

constexpr std::size_t kBuf = 1 << 20;

bool open_end(End& e, const char* sock, bool ordinary_memory) {
  e.ctx = uroce_open_device(sock);
  if (!e.ctx) return false;
  e.pd = uroce_alloc_pd(e.ctx);
  if (ordinary_memory) {
    e.buf = static_cast<std::uint8_t*>(std::aligned_alloc(4096, kBuf));  // plain heap memory, remapped at reg_mr
    std::memset(e.buf, 0x77, kBuf);
  } else {
    e.buf = static_cast<std::uint8_t*>(uroce_alloc_buf(e.ctx, kBuf));
  }
  e.mr = uroce_reg_mr(e.pd, e.buf, kBuf,
                      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                          IBV_ACCESS_REMOTE_ATOMIC);
  if (ordinary_memory) check(e.buf[12345] == 0x77, "ordinary memory keeps its contents when remapped");
  e.channel = uroce_create_comp_channel(e.ctx);  // for blocking waits (wait_wc)
  e.cq = uroce_create_cq(e.ctx, 256, nullptr, e.channel, 0);
  uroce_qp_init_attr ia{};
  ia.send_cq = ia.recv_cq = e.cq;
  ia.qp_type = IBV_QPT_RC;
  ia.cap.max_send_wr = 64;
  ia.cap.max_recv_wr = 64;
  e.qp = uroce_create_qp(e.pd, &ia);
  uroce_query_gid(e.ctx, 1, 0, &e.gid);
  return e.pd && e.mr && e.cq && e.qp;
}

bool connect(End& me, const End& peer) {
  uroce_rc_conn c{};
  c.dest_qp_num = uroce_qp_num(peer.qp);
  c.dgid = peer.gid;
  c.access = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
  c.rq_psn = c.sq_psn = 0x77;
  c.timeout = 12;
  return uroce_connect_qp(me.qp, &c) == 0;
}

/// Waits (bounded) for one completion on `e`.
bool wait_wc(End& e, ibv_wc& wc, int ms = 5000) { return uroce_poll_cq_wait(e.cq, 1, &wc, 5, ms) == 1; }

ibv_send_wr wr_to(const End& peer, std::uint64_t id, ibv_wr_opcode op, ibv_sge* sge, std::uint64_t roff) {
  ibv_send_wr w{};
  w.wr_id = id;
  w.opcode = op;
  w.send_flags = IBV_SEND_SIGNALED;
  w.sg_list = sge;
  w.num_sge = 1;
  w.wr.rdma.remote_addr = reinterpret_cast<std::uint64_t>(peer.buf) + roff;
  w.wr.rdma.rkey = uroce_mr_rkey(peer.mr);
  return w;
}

int ops(const char* sa, const char* sb) {
  End a, b;
  check(open_end(a, sa, false), "application A opens uroced A, shared buffers");
  check(open_end(b, sb, true), "application B opens uroced B, ordinary memory");
  if (g_fail) return 1;
  check(connect(a, b) && connect(b, a), "QPs connected");
  if (g_fail) return 1;
  for (int i = 0; i < 8192; ++i) a.buf[i] = static_cast<std::uint8_t>(i * 13 + 1);
  ibv_wc wc{};
  // SEND with immediate.
  ibv_sge rs{reinterpret_cast<std::uint64_t>(b.buf) + 65536, 8192, uroce_mr_lkey(b.mr)};
  ibv_recv_wr rw{};
  rw.wr_id = 11;
  rw.sg_list = &rs;
  rw.num_sge = 1;
  check(uroce_post_recv(b.qp, &rw, nullptr) == 0, "post_recv");
  ibv_sge ss{reinterpret_cast<std::uint64_t>(a.buf), 5000, uroce_mr_lkey(a.mr)};
  ibv_send_wr sw = wr_to(b, 1, IBV_WR_SEND_WITH_IMM, &ss, 0);
  sw.imm_data = htonl(0xabcd1234);
  check(uroce_post_send(a.qp, &sw, nullptr) == 0, "post_send SEND");
  check(wait_wc(b, wc) && wc.status == IBV_WC_SUCCESS && wc.byte_len == 5000 && wc.wr_id == 11 &&
            (wc.wc_flags & IBV_WC_WITH_IMM) && ntohl(wc.imm_data) == 0xabcd1234,
        "SEND received with its immediate");
  check(std::memcmp(b.buf + 65536, a.buf, 5000) == 0, "SEND payload verified");
  check(wait_wc(a, wc) && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_SEND, "SEND completed");
  // WRITE, then READ it back.
  ibv_send_wr ww = wr_to(b, 2, IBV_WR_RDMA_WRITE, &ss, 200000);
  check(uroce_post_send(a.qp, &ww, nullptr) == 0 && wait_wc(a, wc) && wc.status == IBV_WC_SUCCESS, "WRITE completed");
  check(std::memcmp(b.buf + 200000, a.buf, 5000) == 0, "WRITE landed in B's (remapped) memory");
  ibv_sge rd{reinterpret_cast<std::uint64_t>(a.buf) + 300000, 5000, uroce_mr_lkey(a.mr)};
  ibv_send_wr rr = wr_to(b, 3, IBV_WR_RDMA_READ, &rd, 200000);
  check(uroce_post_send(a.qp, &rr, nullptr) == 0 && wait_wc(a, wc) && wc.status == IBV_WC_SUCCESS &&
            wc.opcode == IBV_WC_RDMA_READ,
        "READ completed");
  check(std::memcmp(a.buf + 300000, a.buf, 5000) == 0, "READ data verified");
  // Atomics.
  std::uint64_t v = 100;
  std::memcpy(b.buf + 400000, &v, 8);
  ibv_sge as{reinterpret_cast<std::uint64_t>(a.buf) + 500000, 8, uroce_mr_lkey(a.mr)};
  ibv_send_wr fa{};
  fa.wr_id = 4;
  fa.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
  fa.send_flags = IBV_SEND_SIGNALED;
  fa.sg_list = &as;
  fa.num_sge = 1;
  fa.wr.atomic.remote_addr = reinterpret_cast<std::uint64_t>(b.buf) + 400000;
  fa.wr.atomic.rkey = uroce_mr_rkey(b.mr);
  fa.wr.atomic.compare_add = 5;
  check(uroce_post_send(a.qp, &fa, nullptr) == 0 && wait_wc(a, wc) && wc.status == IBV_WC_SUCCESS, "FETCH_ADD completed");
  std::uint64_t orig, now_v;
  std::memcpy(&orig, a.buf + 500000, 8);
  std::memcpy(&now_v, b.buf + 400000, 8);
  check(orig == 100 && now_v == 105, "FETCH_ADD returned 100 and left 105");
  fa.opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
  fa.wr.atomic.compare_add = 105;
  fa.wr.atomic.swap = 7;
  check(uroce_post_send(a.qp, &fa, nullptr) == 0 && wait_wc(a, wc) && wc.status == IBV_WC_SUCCESS, "CMP_SWAP completed");
  std::memcpy(&now_v, b.buf + 400000, 8);
  check(now_v == 7, "CMP_SWAP swapped");
  // A burst: 1,000 WRITEs through the ring, completions counted.
  int posted = 0, done = 0;
  while (done < 1000) {
    while (posted < 1000 && posted - done < 32) {
      ibv_send_wr w = wr_to(b, 100 + static_cast<std::uint64_t>(posted), IBV_WR_RDMA_WRITE, &ss, 600000);
      if (uroce_post_send(a.qp, &w, nullptr) != 0) break;
      ++posted;
    }
    int n = uroce_poll_cq(a.cq, 1, &wc);
    if (n == 1) {
      if (wc.status != IBV_WC_SUCCESS) break;
      ++done;
    }
  }
  check(done == 1000, "1,000 WRITEs through the shared rings");
  // A bad lkey is a local protection error, delivered as a completion.
  ibv_sge bad{reinterpret_cast<std::uint64_t>(a.buf), 64, uroce_mr_lkey(a.mr) ^ 0x80};
  ibv_send_wr bw = wr_to(b, 9, IBV_WR_RDMA_WRITE, &bad, 0);
  check(uroce_post_send(a.qp, &bw, nullptr) == 0 && wait_wc(a, wc) && wc.status == IBV_WC_LOC_PROT_ERR,
        "a bad lkey completes with LOC_PROT_ERR");
  // Queries.
  ibv_device_attr da{};
  check(uroce_query_device(a.ctx, &da) == 0 && da.max_qp > 0 && da.max_sge == 4 && da.max_cqe >= 256 &&
            da.phys_port_cnt == 1 && da.node_guid != 0,
        "query_device: limits, one port, a GUID");
  ibv_port_attr pa{};
  check(uroce_query_port(a.ctx, 1, &pa) == 0 && pa.state == IBV_PORT_ACTIVE && pa.link_layer == IBV_LINK_LAYER_ETHERNET,
        "query_port: active Ethernet port");
  check(uroce_query_port(a.ctx, 2, &pa) == EINVAL, "query_port of a port that does not exist: EINVAL");
  ibv_qp_attr qa{};
  uroce_qp_init_attr qi{};
  check(uroce_query_qp(a.qp, &qa, IBV_QP_STATE, &qi) == 0 && qa.qp_state == IBV_QPS_ERR &&
            qa.dest_qp_num == uroce_qp_num(b.qp) && qa.path_mtu == IBV_MTU_1024 && qa.timeout == 12 &&
            qa.retry_cnt == 7 && std::memcmp(qa.ah_attr.grh.dgid.raw, b.gid.raw, 16) == 0 && qi.cap.max_send_wr == 64,
        "query_qp: ERR (after the LOC_PROT_ERR above), with the attributes it was connected with");
  // Teardown in verbs order; what is still in use is refused with EBUSY.
  check(uroce_destroy_cq(b.cq) == EBUSY, "destroy_cq while a QP uses it: EBUSY");
  check(uroce_dealloc_pd(b.pd) == EBUSY, "dealloc_pd while a QP and an MR use it: EBUSY");
  check(uroce_destroy_qp(b.qp) == 0, "destroy_qp");
  check(uroce_dealloc_pd(b.pd) == EBUSY, "dealloc_pd while an MR uses it: EBUSY");
  check(uroce_destroy_cq(b.cq) == 0, "destroy_cq once no QP uses it");
  check(uroce_dereg_mr(b.mr) == 0, "dereg_mr");
  check(uroce_dealloc_pd(b.pd) == 0, "dealloc_pd once empty");
  uroce_close_device(a.ctx);
  uroce_close_device(b.ctx);
  std::printf("%d passed, %d failed\n", g_pass, g_fail);
  return g_fail ? 1 : 0;
}

/// A raw session, to send what liburoce never would.
int raw_session(const char* sock, std::uint16_t major, std::uint16_t minor = 0) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, sock, sizeof a.sun_path - 1);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return -1;
  std::uint8_t out[64];
  uroce_msg_hdr h{UROCE_MSG_MAGIC, major, UROCE_MSG_HELLO, sizeof(uroce_hello_msg), 1};
  uroce_hello_msg hello{major, minor, 1};
  std::memcpy(out, &h, sizeof h);
  std::memcpy(out + sizeof h, &hello, sizeof hello);
  (void)::send(fd, out, sizeof h + sizeof hello, 0);
  return fd;
}

int raw_reply_err(int fd) {
  std::uint8_t in[UROCE_MSG_MAX];
  const ssize_t n = ::recv(fd, in, sizeof in, 0);
  if (n < static_cast<ssize_t>(sizeof(uroce_msg_hdr) + sizeof(uroce_reply_status))) return -1;
  uroce_reply_status st;
  std::memcpy(&st, in + sizeof(uroce_msg_hdr), sizeof st);
  return st.err;
}

int hostile(const char* sa, const char* sb) {
  End a, b;
  check(open_end(a, sa, false) && open_end(b, sb, false) && connect(a, b) && connect(b, a), "set up");
  // ABI version mismatch: refused.
  int fd = raw_session(sa, UROCE_ABI_MAJOR + 1);
  check(fd >= 0 && raw_reply_err(fd) == EPROTO, "an ABI major mismatch is refused (EPROTO)");
  ::close(fd);
  // Another session's QP handle: handles are per session.
  fd = raw_session(sa, UROCE_ABI_MAJOR);
  check(raw_reply_err(fd) == 0, "a second session says hello");
  std::uint8_t out[128];
  uroce_modify_qp_msg m{};
  m.qp = 1;  // low handles exist in the first session: try a few
  m.mask = IBV_QP_STATE;
  m.qp_state = IBV_QPS_ERR;
  bool refused_all = true;
  for (std::uint32_t hdl = 1; hdl < 16; ++hdl) {
    m.qp = hdl;
    uroce_msg_hdr h{UROCE_MSG_MAGIC, UROCE_ABI_MAJOR, UROCE_MSG_MODIFY_QP, sizeof m, 2 + hdl};
    std::memcpy(out, &h, sizeof h);
    std::memcpy(out + sizeof h, &m, sizeof m);
    (void)::send(fd, out, sizeof h + sizeof m, 0);
    refused_all = refused_all && raw_reply_err(fd) == EINVAL;
  }
  check(refused_all, "another session's QP handles are refused");
  ::close(fd);
  // The first session's QP is unharmed: traffic still flows.
  ibv_sge ss{reinterpret_cast<std::uint64_t>(a.buf), 64, uroce_mr_lkey(a.mr)};
  ibv_wc wc{};
  ibv_send_wr w = wr_to(b, 1, IBV_WR_RDMA_WRITE, &ss, 0);
  check(uroce_post_send(a.qp, &w, nullptr) == 0 && wait_wc(a, wc) && wc.status == IBV_WC_SUCCESS,
        "the victim's QP still works");
  // A guessed rkey (right index, wrong random byte): remote access error.
  w = wr_to(b, 2, IBV_WR_RDMA_WRITE, &ss, 0);
  w.wr.rdma.rkey = uroce_mr_rkey(b.mr) ^ 0x5a;
  check(uroce_post_send(a.qp, &w, nullptr) == 0 && wait_wc(a, wc) && wc.status == IBV_WC_REM_ACCESS_ERR,
        "a guessed rkey is refused (REM_ACCESS_ERR)");
  uroce_close_device(a.ctx);
  uroce_close_device(b.ctx);
  std::printf("%d passed, %d failed\n", g_pass, g_fail);
  return g_fail ? 1 : 0;
}

/// One raw request with descriptors; returns the reply's status (or -1)
/// and the first descriptor that came back in *got.
int raw_call_fds(int sock, std::uint16_t type, std::uint32_t seq, const void* body, std::uint32_t len,
                 const int* send_fds, std::size_t nfds, int* got = nullptr, void* reply = nullptr,
                 std::size_t reply_len = 0) {
  std::uint8_t out[UROCE_MSG_MAX];
  uroce_msg_hdr h{UROCE_MSG_MAGIC, UROCE_ABI_MAJOR, type, len, seq};
  std::memcpy(out, &h, sizeof h);
  if (len) std::memcpy(out + sizeof h, body, len);
  if (uroce::abi::send_with_fds(sock, out, sizeof h + len, send_fds, nfds) < 0) return -1;
  std::uint8_t in[UROCE_MSG_MAX];
  const ssize_t n = uroce::abi::recv_with_fds(sock, in, sizeof in, 0, [&](int fd) {
    if (got && *got < 0) *got = fd;
    else ::close(fd);
  });
  if (n < static_cast<ssize_t>(sizeof(uroce_msg_hdr) + sizeof(uroce_reply_status))) return -1;
  uroce_reply_status st;
  std::memcpy(&st, in + sizeof(uroce_msg_hdr), sizeof st);
  const std::size_t at = sizeof(uroce_msg_hdr) + sizeof st;
  if (reply) std::memcpy(reply, in + at, std::min(reply_len, static_cast<std::size_t>(n) - at));
  return st.err;
}

/// The same with at most one descriptor (-1 for none).
int raw_call(int sock, std::uint16_t type, std::uint32_t seq, const void* body, std::uint32_t len, int send_fd,
             int* got = nullptr, void* reply = nullptr, std::size_t reply_len = 0) {
  return raw_call_fds(sock, type, seq, body, len, &send_fd, send_fd >= 0 ? 1 : 0, got, reply, reply_len);
}

int count_fds(int pid) {
  DIR* d = ::opendir(("/proc/" + std::to_string(pid) + "/fd").c_str());
  if (!d) return -1;
  int n = 0;
  while (::readdir(d)) ++n;
  ::closedir(d);
  return n;
}

/// Hostile uses of the shared-memory seam (hardening rows 1-6): ring and MR
/// memfds cannot be shrunk under the daemon, a pipe is refused as a
/// completion channel, and descriptors sent with unfinished requests are
/// closed when the connection goes. `daemon_pid` is the daemon's, for its
/// descriptor count.
int seams(const char* sa, int daemon_pid) {
  int s = raw_session(sa, UROCE_ABI_MAJOR);
  check(s >= 0 && raw_reply_err(s) == 0, "a raw session says hello");
  uroce_handle_reply pd{};
  check(raw_call(s, UROCE_MSG_ALLOC_PD, 2, nullptr, 0, -1) == 0, "ALLOC_PD");
  uroce_create_cq_msg cm{64};
  int ring = -1;
  check(raw_call(s, UROCE_MSG_CREATE_CQ, 3, &cm, sizeof cm, -1, &ring) == 0 && ring >= 0, "CREATE_CQ hands out a ring");
  check(ring >= 0 && ::ftruncate(ring, 0) != 0 && errno == EPERM,
        "the CQ ring's memfd cannot be shrunk (sealed): no SIGBUS in the daemon");
  check(ring >= 0 && ::ftruncate(ring, 1 << 24) != 0 && errno == EPERM, "nor grown");
  if (ring >= 0) ::close(ring);
  uroce_create_qp_msg qm{};
  qm.pd = 1;
  qm.send_cq = qm.recv_cq = 2;  // handles in order: PD 1, CQ 2
  qm.qp_type = IBV_QPT_RC;
  qm.max_send_wr = qm.max_recv_wr = 16;
  int qring = -1;
  check(raw_call(s, UROCE_MSG_CREATE_QP, 4, &qm, sizeof qm, -1, &qring) == 0 && qring >= 0, "CREATE_QP hands out rings");
  check(qring >= 0 && ::ftruncate(qring, 0) != 0 && errno == EPERM, "the QP rings' memfd cannot be shrunk");
  if (qring >= 0) ::close(qring);
  // REG_MR (rows 3, 4): the memfd must hold the range and be sealed.
  auto reg = [&](int mfd, std::uint64_t len, std::uint64_t off, std::uint32_t seq) {
    uroce_reg_mr_msg rm{1, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE, 0x100000, len, off};
    return raw_call(s, UROCE_MSG_REG_MR, seq, &rm, sizeof rm, mfd);
  };
  const int loose = ::memfd_create("loose", MFD_ALLOW_SEALING);
  check(loose >= 0 && ::ftruncate(loose, 4096) == 0 && reg(loose, 4096, 0, 10) == EINVAL,
        "REG_MR of an unsealed memfd is refused (it could be shrunk under the daemon)");
  check(loose >= 0 && ::fcntl(loose, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) == 0, "the memfd sealed");
  check(reg(loose, 64u << 20, 0, 11) == EINVAL, "REG_MR of 64 MiB on a 4 KiB memfd is refused");
  check(reg(loose, 4096, 1ull << 62, 12) == EINVAL, "REG_MR at offset 2^62 is refused");
  const int empty = ::memfd_create("empty", MFD_ALLOW_SEALING);
  check(empty >= 0 && ::fcntl(empty, F_ADD_SEALS, F_SEAL_SHRINK) == 0 && reg(empty, 4096, 0, 13) == EINVAL,
        "REG_MR on a 0-byte memfd is refused");
  check(reg(loose, 4096, 0, 14) == 0, "REG_MR of a sealed memfd that holds the range works");
  check(::ftruncate(loose, 0) != 0 && errno == EPERM, "and the registered memfd cannot be shrunk afterwards");
  // REG_MR_PIECES (minor 7): an MR over several memfds, each checked as one.
  const int big = ::memfd_create("big", MFD_ALLOW_SEALING);
  check(big >= 0 && ::ftruncate(big, 3 * 4096) == 0 && ::fcntl(big, F_ADD_SEALS, F_SEAL_SHRINK) == 0, "a sealed 12 KiB memfd");
  auto reg_pieces = [&](std::uint32_t count, std::uint64_t len, std::vector<uroce_reg_mr_piece> pieces,
                        std::vector<int> fds, std::uint32_t seq) {
    uroce_reg_mr_pieces_msg pm{};
    pm.mr = {1, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE, 0x200000, len, 0};
    pm.count = count;
    for (std::size_t i = 0; i < pieces.size() && i < UROCE_MR_MAX_PIECES; ++i) pm.piece[i] = pieces[i];
    return raw_call_fds(s, UROCE_MSG_REG_MR_PIECES, seq, &pm, sizeof pm, fds.data(), fds.size());
  };
  check(reg_pieces(2, 8192, {{0, 4096}, {8192, 4096}}, {loose, big}, 20) == 0,
        "REG_MR_PIECES of two sealed memfds, a page of each, works");
  check(reg_pieces(0, 4096, {}, {big}, 21) == EINVAL, "REG_MR_PIECES with no piece is refused");
  check(reg_pieces(17, 4096, {{0, 4096}}, {big}, 22) == EINVAL, "REG_MR_PIECES with 17 pieces is refused");
  check(reg_pieces(2, 8192, {{0, 4096}, {0, 4096}}, {big}, 23) == EINVAL,
        "REG_MR_PIECES with fewer descriptors than pieces is refused");
  check(reg_pieces(2, 12288, {{0, 4096}, {0, 4096}}, {big, big}, 24) == EINVAL,
        "REG_MR_PIECES whose pieces do not add up to its length is refused");
  check(reg_pieces(2, 8192, {{0, 4096}, {4096, 8192}}, {big, big}, 25) == EINVAL,
        "REG_MR_PIECES whose pieces add up to more than its length is refused");
  check(reg_pieces(2, 8192, {{0, 4096}, {8192, 8192}}, {big, big}, 26) == EINVAL,
        "REG_MR_PIECES with a piece beyond the end of its memfd is refused");
  check(reg_pieces(2, 6144, {{0, 2048}, {0, 4096}}, {big, big}, 27) == EINVAL,
        "REG_MR_PIECES with a piece that is not whole pages is refused");
  const int unsealed = ::memfd_create("unsealed", MFD_ALLOW_SEALING);
  check(unsealed >= 0 && ::ftruncate(unsealed, 4096) == 0 &&
            reg_pieces(2, 8192, {{0, 4096}, {0, 4096}}, {big, unsealed}, 28) == EINVAL,
        "REG_MR_PIECES with one unsealed piece is refused");
  ::close(big);
  ::close(unsealed);
  ::close(loose);
  ::close(empty);
  int p[2];
  check(::pipe(p) == 0, "a pipe");
  check(raw_call(s, UROCE_MSG_CREATE_CQ, 5, &cm, sizeof cm, p[1]) == EINVAL,
        "a pipe as the completion channel is refused (EINVAL): the daemon never writes to what could block it");
  // The CM channel (minor 7) is held to the same rule, and unlisten to the owner.
  check(raw_call(s, UROCE_MSG_CM_CHANNEL, 30, nullptr, 0, p[1]) == EINVAL, "a pipe as the CM channel is refused");
  check(raw_call(s, UROCE_MSG_CM_CHANNEL, 31, nullptr, 0, -1) == EINVAL, "a CM channel without a descriptor is refused");
  uroce_cm_msg um{};
  um.port = 7999;
  check(raw_call(s, UROCE_MSG_CM_UNLISTEN, 32, &um, sizeof um, -1) == EINVAL,
        "unlistening a port this session does not listen on is refused");
  ::close(p[0]);
  ::close(p[1]);
  ::close(s);
  (void)pd;
  // Descriptors with an unfinished request, then a disconnect: the daemon
  // must close them all (and refuses more than a message may carry).
  usleep(200000);
  const int before = count_fds(daemon_pid);
  for (int round = 0; round < 5; ++round) {
    const int t = raw_session(sa, UROCE_ABI_MAJOR);
    (void)raw_reply_err(t);
    uroce_msg_hdr h{UROCE_MSG_MAGIC, UROCE_ABI_MAJOR, UROCE_MSG_REG_MR, 1000, 9};
    (void)uroce::abi::send_with_fd(t, &h, sizeof h, -1);
    const int mfd = ::memfd_create("hostile", 0);
    for (int i = 0; i < 200; ++i) {
      const int four[4] = {mfd, mfd, mfd, mfd};
      const char byte = 0;
      if (uroce::abi::send_with_fds(t, &byte, 1, four, 4) < 0) break;  // the daemon may hang up first
    }
    ::close(mfd);
    ::close(t);
  }
  usleep(300000);
  const int after = count_fds(daemon_pid);
  std::printf("daemon descriptors: %d before, %d after 5 rounds of 800 descriptors with unfinished requests\n", before,
              after);
  check(before > 0 && after <= before + 2, "descriptors sent with unfinished requests are closed");
  std::printf("%d passed, %d failed\n", g_pass, g_fail);
  return g_fail ? 1 : 0;
}

/// Hardening row 7: a flood of MODIFY_QP(RTR) to a GID nobody answers for.
/// The daemon parks a bounded number (the rest get EAGAIN at once), sends
/// one resolution per destination on a backoff, and answers every parked
/// one with EHOSTUNREACH after its timeout.
int rtrflood(const char* sa, long n) {
  int s = raw_session(sa, UROCE_ABI_MAJOR);
  check(s >= 0 && raw_reply_err(s) == 0, "a raw session says hello");
  uroce_create_cq_msg cm{64};
  int ring = -1;
  check(raw_call(s, UROCE_MSG_ALLOC_PD, 2, nullptr, 0, -1) == 0, "ALLOC_PD");
  check(raw_call(s, UROCE_MSG_CREATE_CQ, 3, &cm, sizeof cm, -1, &ring) == 0, "CREATE_CQ");
  if (ring >= 0) ::close(ring);
  uroce_create_qp_msg qm{};
  qm.pd = 1;
  qm.send_cq = qm.recv_cq = 2;
  qm.qp_type = IBV_QPT_RC;
  qm.max_send_wr = qm.max_recv_wr = 16;
  ring = -1;
  check(raw_call(s, UROCE_MSG_CREATE_QP, 4, &qm, sizeof qm, -1, &ring) == 0, "CREATE_QP");
  if (ring >= 0) ::close(ring);
  uroce_modify_qp_msg m{};
  m.qp = 3;
  m.mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
  m.qp_state = IBV_QPS_INIT;
  m.port_num = 1;
  check(raw_call(s, UROCE_MSG_MODIFY_QP, 5, &m, sizeof m, -1) == 0, "the QP to INIT");
  // RTR to 10.99.0.99 (IPv4-mapped), which nobody answers for.
  m.mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
           IBV_QP_MIN_RNR_TIMER;
  m.qp_state = IBV_QPS_RTR;
  m.path_mtu = IBV_MTU_1024;
  m.dest_qp_num = 0x123;
  m.max_dest_rd_atomic = 1;
  m.min_rnr_timer = 12;
  const std::uint8_t gid[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 99, 0, 99};
  std::memcpy(m.dgid, gid, 16);
  std::uint8_t out[UROCE_MSG_MAX];
  long eagain = 0, unreach = 0, other = 0;
  std::vector<std::uint8_t> in;
  std::uint8_t buf[4096];
  timeval tv{10, 0};
  ::setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  // Pipelined: each request goes without waiting for the last one's reply
  // (the parked ones have none yet); replies are taken as they come, since
  // the daemon cuts off a client that does not read them. At most 64 go
  // unanswered: a Unix socket counts each small reply as a whole buffer
  // (about 1.3 KiB), so a client that the scheduler kept off its core
  // while the daemon answered a few hundred would find itself cut off.
  constexpr long kAhead = 64;
  long sent = 0;
  while (eagain + unreach + other < n) {
    const bool may_send = sent < n && sent - (eagain + unreach + other) < kAhead;
    if (may_send) {
      uroce_msg_hdr h{UROCE_MSG_MAGIC, UROCE_ABI_MAJOR, UROCE_MSG_MODIFY_QP, sizeof m,
                      static_cast<std::uint32_t>(100 + sent)};
      std::memcpy(out, &h, sizeof h);
      std::memcpy(out + sizeof h, &m, sizeof m);
      if (::send(s, out, sizeof h + sizeof m, MSG_NOSIGNAL) < 0) break;
      ++sent;
    }
    const ssize_t k = ::recv(s, buf, sizeof buf, may_send ? MSG_DONTWAIT : 0);
    if (k == 0 || (k < 0 && (!may_send || errno != EAGAIN))) break;
    if (k < 0) continue;
    in.insert(in.end(), buf, buf + k);
    while (in.size() >= sizeof(uroce_msg_hdr) + sizeof(uroce_reply_status)) {
      uroce_msg_hdr h;
      std::memcpy(&h, in.data(), sizeof h);
      if (in.size() < sizeof h + h.len) break;
      uroce_reply_status st;
      std::memcpy(&st, in.data() + sizeof h, sizeof st);
      (st.err == EAGAIN ? eagain : st.err == EHOSTUNREACH ? unreach : other)++;
      in.erase(in.begin(), in.begin() + static_cast<long>(sizeof h + h.len));
    }
  }
  std::printf("%ld RTRs: %ld refused at once (EAGAIN), %ld parked then EHOSTUNREACH, %ld other\n", n, eagain, unreach,
              other);
  check(eagain + unreach == n && other == 0, "every request was answered, with EAGAIN or EHOSTUNREACH");
  check(unreach > 0 && unreach <= 16, "at most the per-session bound (16) was parked");
  ::close(s);
  std::printf("%d passed, %d failed\n", g_pass, g_fail);
  return g_fail ? 1 : 0;
}

int crash(const char* sa) {
  End a;
  if (!open_end(a, sa, false)) return 1;
  std::printf("created QP 0x%06x, now dying without cleaning up\n", uroce_qp_num(a.qp));
  std::fflush(stdout);
  std::abort();
}

}  // namespace

/// The out-of-band TCP exchange: two applications learn each other's QPN,
/// PSN, GID, rkey and address over loopback TCP only, connect with them, and
/// move data with what they learnt. Then a peer speaking something else, and
/// nobody at all.
int oob(const char* sa, const char* sb, int port) {
  End a, b;
  check(open_end(a, sa, false) && open_end(b, sb, false), "two applications open their daemons");
  if (g_fail) return 1;
  const uroce_conn_info ia{uroce_qp_num(a.qp), 0x123456, a.gid, uroce_mr_rkey(a.mr),
                           reinterpret_cast<std::uint64_t>(a.buf)};
  const uroce_conn_info ib{uroce_qp_num(b.qp), 0xabcdef, b.gid, uroce_mr_rkey(b.mr),
                           reinterpret_cast<std::uint64_t>(b.buf)};
  uroce_conn_info ga{}, gb{};  // what A and B learn
  int rc_server = -1;
  std::thread server([&] { rc_server = uroce_exchange_tcp(nullptr, static_cast<uint16_t>(port), 5000, &ia, &ga); });
  const int rc_client = uroce_exchange_tcp("127.0.0.1", static_cast<uint16_t>(port), 5000, &ib, &gb);
  server.join();
  check(rc_server == 0 && rc_client == 0, "exchange over TCP succeeds on both sides");
  check(ga.qp_num == ib.qp_num && ga.psn == ib.psn && ga.rkey == ib.rkey && ga.addr == ib.addr &&
            std::memcmp(ga.gid.raw, ib.gid.raw, 16) == 0,
        "A learnt exactly B's QPN, PSN, rkey, address and GID");
  check(gb.qp_num == ia.qp_num && gb.psn == ia.psn && gb.rkey == ia.rkey && gb.addr == ia.addr &&
            std::memcmp(gb.gid.raw, ia.gid.raw, 16) == 0,
        "B learnt exactly A's");
  uroce_rc_conn ca{}, cb{};
  ca.dest_qp_num = ga.qp_num;
  ca.dgid = ga.gid;
  ca.rq_psn = ga.psn;
  ca.sq_psn = ia.psn;
  ca.access = IBV_ACCESS_REMOTE_WRITE;
  cb.dest_qp_num = gb.qp_num;
  cb.dgid = gb.gid;
  cb.rq_psn = gb.psn;
  cb.sq_psn = ib.psn;
  cb.access = IBV_ACCESS_REMOTE_WRITE;
  check(uroce_connect_qp(a.qp, &ca) == 0 && uroce_connect_qp(b.qp, &cb) == 0, "connect_qp with what was exchanged");
  for (int i = 0; i < 4096; ++i) b.buf[i] = static_cast<std::uint8_t>(i * 7 + 3);
  ibv_sge s{reinterpret_cast<std::uint64_t>(b.buf), 4096, uroce_mr_lkey(b.mr)};
  ibv_send_wr w{};
  w.wr_id = 1;
  w.opcode = IBV_WR_RDMA_WRITE;
  w.send_flags = IBV_SEND_SIGNALED;
  w.sg_list = &s;
  w.num_sge = 1;
  w.wr.rdma.remote_addr = gb.addr + 8192;  // A's buffer, as B learnt it
  w.wr.rdma.rkey = gb.rkey;
  ibv_wc wc{};
  check(uroce_post_send(b.qp, &w, nullptr) == 0 && wait_wc(b, wc) && wc.status == IBV_WC_SUCCESS,
        "B writes into A with the learnt rkey and address");
  check(std::memcmp(a.buf + 8192, b.buf, 4096) == 0, "the data is in A's buffer");

  // A listener that answers with something else: EPROTO, no hang.
  const int ls = ::socket(AF_INET, SOCK_STREAM, 0);
  const int one = 1;
  ::setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in sin{};
  sin.sin_family = AF_INET;
  sin.sin_port = htons(static_cast<uint16_t>(port + 1));
  sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  check(::bind(ls, reinterpret_cast<sockaddr*>(&sin), sizeof sin) == 0 && ::listen(ls, 1) == 0, "junk listener up");
  std::thread junk([&] {
    const int fd = ::accept(ls, nullptr, nullptr);
    if (fd < 0) return;
    char garbage[64];
    std::memset(garbage, 'x', sizeof garbage);
    (void)::send(fd, garbage, sizeof garbage, MSG_NOSIGNAL);
    usleep(200000);
    ::close(fd);
  });
  uroce_conn_info gj{};
  const int rj = uroce_exchange_tcp("127.0.0.1", static_cast<uint16_t>(port + 1), 2000, &ib, &gj);
  junk.join();
  ::close(ls);
  check(rj == EPROTO, "a peer speaking something else is refused with EPROTO");
  // Nobody listening, and nobody connecting: ETIMEDOUT within the bound.
  check(uroce_exchange_tcp("127.0.0.1", static_cast<uint16_t>(port + 2), 300, &ib, &gj) == ETIMEDOUT,
        "no listener: ETIMEDOUT");
  check(uroce_exchange_tcp(nullptr, static_cast<uint16_t>(port + 2), 300, &ib, &gj) == ETIMEDOUT,
        "no client: ETIMEDOUT");
  check(uroce_exchange_tcp(nullptr, static_cast<uint16_t>(port), 300, nullptr, &gj) == EINVAL, "no info: EINVAL");
  std::printf("%d passed, %d failed\n", g_pass, g_fail);
  return g_fail == 0 ? 0 : 1;
}

/// Completion channels: an armed CQ wakes the channel's eventfd once; an
/// unarmed one does not; get_cq_event names the CQ and its context.
int events(const char* sa, const char* sb) {
  End a, b;
  check(open_end(a, sa, false) && open_end(b, sb, false), "two applications open their daemons");
  if (g_fail) return 1;
  uroce_comp_channel* ch = uroce_create_comp_channel(b.ctx);
  check(ch != nullptr && uroce_comp_channel_fd(ch) >= 0, "create_comp_channel");
  int tag = 0;
  uroce_cq* ecq = uroce_create_cq(b.ctx, 64, &tag, ch, 0);
  check(ecq != nullptr, "create_cq with the channel");
  uroce_qp_init_attr ia{};
  ia.send_cq = b.cq;
  ia.recv_cq = ecq;
  ia.qp_type = IBV_QPT_RC;
  ia.cap.max_send_wr = 16;
  ia.cap.max_recv_wr = 16;
  uroce_qp* old = b.qp;
  b.qp = uroce_create_qp(b.pd, &ia);
  check(b.qp != nullptr && connect(a, b) && connect(b, a), "a QP whose receive CQ has the channel, connected");
  if (g_fail) return 1;
  const int fd = uroce_comp_channel_fd(ch);
  const auto readable = [fd](int ms) {
    pollfd p{fd, POLLIN, 0};
    return ::poll(&p, 1, ms) == 1;
  };
  const auto recv_one = [&](std::uint64_t id) {
    ibv_sge rs{reinterpret_cast<std::uint64_t>(b.buf), 64, uroce_mr_lkey(b.mr)};
    ibv_recv_wr rw{};
    rw.wr_id = id;
    rw.sg_list = &rs;
    rw.num_sge = 1;
    return uroce_post_recv(b.qp, &rw, nullptr) == 0;
  };
  const auto send_one = [&] {
    ibv_sge ss{reinterpret_cast<std::uint64_t>(a.buf), 16, uroce_mr_lkey(a.mr)};
    ibv_send_wr sw = wr_to(b, 1, IBV_WR_SEND, &ss, 0);
    ibv_wc wc{};
    return uroce_post_send(a.qp, &sw, nullptr) == 0 && wait_wc(a, wc) && wc.status == IBV_WC_SUCCESS;
  };
  ibv_wc wc{};
  // Armed: one event, naming the CQ and its context.
  check(recv_one(1) && uroce_req_notify_cq(ecq, 0) == 0 && uroce_poll_cq(ecq, 1, &wc) == 0, "armed, CQ empty");
  check(send_one(), "SEND completes at the sender");
  check(readable(5000), "the channel's eventfd becomes readable");
  uroce_cq* got = nullptr;
  void* ctxp = nullptr;
  check(uroce_get_cq_event(ch, &got, &ctxp) == 0 && got == ecq && ctxp == &tag, "get_cq_event names the CQ and context");
  uroce_ack_cq_events(ecq, 1);
  check(uroce_poll_cq(ecq, 1, &wc) == 1 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 1, "the completion is there");
  // Not armed: a completion arrives, but no wake-up.
  check(recv_one(2) && send_one(), "second SEND, CQ not armed");
  int n = 0;
  for (int i = 0; i < 50000 && n == 0; ++i) {
    n = uroce_poll_cq(ecq, 1, &wc);
    if (n == 0) usleep(100);
  }
  check(n == 1 && wc.wr_id == 2, "its completion arrives");
  check(!readable(300), "no event without arming");
  // Armed again: one event for a burst of completions, then none.
  check(recv_one(3) && recv_one(4) && uroce_req_notify_cq(ecq, 0) == 0, "armed again");
  check(send_one() && send_one(), "two SENDs");
  check(readable(5000) && uroce_get_cq_event(ch, &got, &ctxp) == 0 && got == ecq, "one event for them");
  check(uroce_poll_cq(ecq, 2, &wc) >= 1, "their completions are there");
  uroce_cq* plain = uroce_create_cq(b.ctx, 8, nullptr, nullptr, 0);
  check(plain && uroce_req_notify_cq(plain, 0) == EINVAL, "arming a CQ without a channel: EINVAL");
  ibv_wc none{};
  check(plain && uroce_poll_cq_wait(plain, 1, &none, 0, 10) == -1 && errno == EINVAL,
        "a blocking wait on a CQ without a channel: EINVAL");
  if (plain) uroce_destroy_cq(plain);
  check(uroce_destroy_comp_channel(ch) == EBUSY, "destroy_comp_channel while a CQ uses it: EBUSY");
  check(uroce_destroy_qp(b.qp) == 0 && uroce_destroy_cq(ecq) == 0 && uroce_destroy_comp_channel(ch) == 0,
        "teardown: QP, CQ, then the channel");
  (void)old;
  uroce_close_device(a.ctx);
  uroce_close_device(b.ctx);
  std::printf("%d passed, %d failed\n", g_pass, g_fail);
  return g_fail == 0 ? 0 : 1;
}

/// UD through the library: a UD QP on each daemon, address handles
/// resolved by the daemons (ARP over the link), 64 datagrams each way with
/// every byte, the GRH area and the source QP checked; a wrong Q_Key is
/// dropped; and what must be refused is.
bool ud_up(uroce_qp* qp, std::uint32_t qkey) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qkey = qkey;
  if (uroce_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY) != 0) return false;
  a = ibv_qp_attr{};
  a.qp_state = IBV_QPS_RTR;
  if (uroce_modify_qp(qp, &a, IBV_QP_STATE) != 0) return false;
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = 0x123;
  return uroce_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0;
}

int ud(const char* sa, const char* sb) {
  End a, b;
  check(open_end(a, sa, false) && open_end(b, sb, false), "both applications open");
  if (g_fail) return 1;
  constexpr std::uint32_t kQkey = 0x11111111;
  uroce_qp_init_attr ia{};
  ia.qp_type = IBV_QPT_UD;
  ia.cap.max_send_wr = ia.cap.max_recv_wr = 64;
  ia.send_cq = ia.recv_cq = a.cq;
  uroce_qp* qa = uroce_create_qp(a.pd, &ia);
  ia.send_cq = ia.recv_cq = b.cq;
  uroce_qp* qb = uroce_create_qp(b.pd, &ia);
  check(qa && qb, "a UD QP on each daemon");
  if (g_fail) return 1;
  {
    ibv_qp_attr k{};
    k.qp_state = IBV_QPS_INIT;
    k.port_num = 1;
    k.qkey = 0x80010000;  // QP1's controlled Q_Key
    check(uroce_modify_qp(qa, &k, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY) == EPERM,
          "a controlled Q_Key (high bit) is refused: EPERM");
  }
  check(ud_up(qa, kQkey) && ud_up(qb, kQkey), "both UD QPs to RTS");
  ibv_ah_attr aa{};
  aa.is_global = 1;
  aa.port_num = 1;
  aa.grh.dgid = b.gid;
  ibv_ah* to_b = uroce_create_ah(a.pd, &aa);
  aa.grh.dgid = a.gid;
  ibv_ah* to_a = uroce_create_ah(b.pd, &aa);
  check(to_b && to_a, "address handles: each daemon resolves the other's MAC");
  {
    ibv_ah_attr bad = aa;
    bad.is_global = 0;
    check(uroce_create_ah(a.pd, &bad) == nullptr && errno == EINVAL, "an AH without a GRH: EINVAL (RoCE needs one)");
    bad = aa;
    std::memset(bad.grh.dgid.raw, 0, 16);
    bad.grh.dgid.raw[10] = bad.grh.dgid.raw[11] = 0xff;
    bad.grh.dgid.raw[12] = 240;  // reserved (class E): no host has it, and no group
    check(uroce_create_ah(a.pd, &bad) == nullptr && errno == EINVAL, "an AH to a reserved address: EINVAL");
    bad.grh.dgid.raw[12] = 239;  // a multicast group: its MAC is its address's, with no ARP
    ibv_ah* group = uroce_create_ah(a.pd, &bad);
    check(group != nullptr, "an AH to a multicast group (minor 15), at once");
    if (group) uroce_destroy_ah(group);
    bad.grh.dgid.raw[12] = 10;
    bad.grh.dgid.raw[13] = 250;  // nobody there
    const auto t0 = std::chrono::steady_clock::now();
    const bool refused = uroce_create_ah(a.pd, &bad) == nullptr && errno == EHOSTUNREACH;
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    check(refused && secs > 2 && secs < 10, "an AH to an address nobody answers: EHOSTUNREACH after the 3 s of ARP");
  }
  if (!to_a || !to_b) return 1;
  // B posts receives: a 40-byte GRH area, then the payload.
  constexpr int kMsgs = 64;
  constexpr std::uint32_t kLen = 1000;
  auto post_recvs = [](End& e, uroce_qp* qp, int n) {
    for (int i = 0; i < n; ++i) {
      ibv_sge rs{reinterpret_cast<std::uint64_t>(e.buf) + 65536 + 2048 * i, 40 + kLen, uroce_mr_lkey(e.mr)};
      ibv_recv_wr rw{};
      rw.wr_id = 500 + i;
      rw.sg_list = &rs;
      rw.num_sge = 1;
      if (uroce_post_recv(qp, &rw, nullptr) != 0) return false;
    }
    return true;
  };
  auto send_ud = [](End& e, uroce_qp* qp, ibv_ah* ah, std::uint32_t qpn, std::uint32_t qkey, int i) {
    std::uint8_t* p = e.buf + 8192 + 1024 * (i % 32);
    for (std::uint32_t k = 0; k < kLen; ++k) p[k] = static_cast<std::uint8_t>(i * 7 + k);
    ibv_sge ss{reinterpret_cast<std::uint64_t>(p), kLen, uroce_mr_lkey(e.mr)};
    ibv_send_wr w{};
    w.wr_id = 900 + i;
    w.opcode = IBV_WR_SEND;
    w.send_flags = IBV_SEND_SIGNALED;
    w.sg_list = &ss;
    w.num_sge = 1;
    w.wr.ud.ah = ah;
    w.wr.ud.remote_qpn = qpn;
    w.wr.ud.remote_qkey = qkey;
    ibv_wc wc{};
    return uroce_post_send(qp, &w, nullptr) == 0 && wait_wc(e, wc) && wc.status == IBV_WC_SUCCESS &&
           wc.wr_id == 900u + i;
  };
  auto recv_ud = [](End& e, uroce_qp* qp, const End& from, std::uint32_t from_qpn, int i) {
    ibv_wc wc{};
    if (!wait_wc(e, wc) || wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_RECV || wc.byte_len != 40 + kLen ||
        !(wc.wc_flags & IBV_WC_GRH) || wc.src_qp != from_qpn || wc.qp_num != uroce_qp_num(qp))
      return false;
    const std::uint8_t* r = e.buf + 65536 + 2048 * (wc.wr_id - 500);
    // RoCE v2 over IPv4: 20 bytes, then the IPv4 header, its source the sender.
    if (r[20] != 0x45 || std::memcmp(r + 20 + 12, from.gid.raw + 12, 4) != 0) return false;
    for (std::uint32_t k = 0; k < kLen; ++k)
      if (r[40 + k] != static_cast<std::uint8_t>(i * 7 + k)) return false;
    return true;
  };
  int ab = 0, ba = 0;
  for (int round = 0; round < kMsgs / 16; ++round) {
    check(post_recvs(b, qb, 16) && post_recvs(a, qa, 16), "receives posted");
    for (int i = round * 16; i < round * 16 + 16; ++i) {
      if (send_ud(a, qa, to_b, uroce_qp_num(qb), kQkey, i) && recv_ud(b, qb, a, uroce_qp_num(qa), i)) ++ab;
      if (send_ud(b, qb, to_a, uroce_qp_num(qa), kQkey, i) && recv_ud(a, qa, b, uroce_qp_num(qb), i)) ++ba;
    }
  }
  check(ab == kMsgs && ba == kMsgs, "64 datagrams each way, every byte, the GRH and the source QP right");
  // A wrong Q_Key: sent (UD does not know), dropped by B; the next, right one arrives.
  check(post_recvs(b, qb, 1) && send_ud(a, qa, to_b, uroce_qp_num(qb), kQkey + 1, 1000), "a datagram with a wrong Q_Key is sent");
  check(send_ud(a, qa, to_b, uroce_qp_num(qb), kQkey, 1001) && recv_ud(b, qb, a, uroce_qp_num(qa), 1001),
        "... dropped by the receiver: the next datagram takes the receive");
  {
    ibv_sge ss{reinterpret_cast<std::uint64_t>(a.buf), 16, uroce_mr_lkey(a.mr)};
    ibv_send_wr w{};
    w.opcode = IBV_WR_SEND;
    w.sg_list = &ss;
    w.num_sge = 1;
    ibv_send_wr* bw = nullptr;
    check(uroce_post_send(qa, &w, &bw) == EINVAL && bw == &w, "a UD send without an AH: EINVAL");
    w.opcode = IBV_WR_RDMA_WRITE;
    w.wr.ud.ah = to_b;
    ibv_wc wc{};
    check(uroce_post_send(qa, &w, &bw) != 0 || (wait_wc(a, wc) && wc.status != IBV_WC_SUCCESS),
          "a WRITE on a UD QP is refused");
  }
  check(uroce_destroy_ah(to_b) == 0 && uroce_destroy_ah(to_a) == 0, "address handles destroyed");
  check(uroce_destroy_qp(qa) == 0 && uroce_destroy_qp(qb) == 0, "UD QPs destroyed");
  uroce_close_device(a.ctx);
  uroce_close_device(b.ctx);
  std::printf("%d passed, %d failed\n", g_pass, g_fail);
  return g_fail == 0 ? 0 : 1;
}

/// uroce's QP attributes through the library (ABI minor 10): congestion
/// control by name, and selective repeat on both ends before RTR; then
/// SENDs and a WRITE, every byte checked, over selective repeat, and a READ
/// (fenced, in IBTA's opcodes) that reads what the WRITE wrote.
int qpopt(const char* sa, const char* sb) {
  End a, b;
  check(open_end(a, sa, false) && open_end(b, sb, false), "both applications open");
  if (g_fail) return 1;
  check(uroce_qp_set_cc(a.qp, "cubic") == EINVAL, "an unknown congestion control: EINVAL");
  check(uroce_qp_set_cc(a.qp, "dcqcn") == 0, "A's QP: dcqcn");
  check(uroce_qp_set_cc(b.qp, "swift") == 0, "B's QP: swift");
  check(uroce_qp_set_selective_repeat(a.qp, 1) == 0 && uroce_qp_set_selective_repeat(b.qp, 1) == 0,
        "selective repeat on both QPs, before RTR");
  check(connect(a, b) && connect(b, a), "connected");
  check(uroce_qp_set_selective_repeat(a.qp, 0) == EBUSY, "selective repeat after RTR: EBUSY");
  check(uroce_qp_set_cc(a.qp, "none") == 0 && uroce_qp_set_cc(a.qp, "dcqcn") == 0, "the algorithm changes at RTS too");
  constexpr int kMsgs = 16;
  constexpr std::uint32_t kLen = 4096 + 77;  // five packets, the last short
  for (int i = 0; i < kMsgs; ++i) {
    ibv_sge rs{reinterpret_cast<std::uint64_t>(b.buf) + 8192 * i, 8192, uroce_mr_lkey(b.mr)};
    ibv_recv_wr rw{};
    rw.wr_id = 500 + i;
    rw.sg_list = &rs;
    rw.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    uroce_post_recv(b.qp, &rw, &bad);
  }
  int sent = 0, got = 0, right = 0;
  for (int i = 0; i < kMsgs; ++i) {
    for (std::uint32_t j = 0; j < kLen; ++j) a.buf[8192 * i + j] = static_cast<std::uint8_t>(i * 7 + j * 13);
    ibv_sge s{reinterpret_cast<std::uint64_t>(a.buf) + 8192 * i, kLen, uroce_mr_lkey(a.mr)};
    ibv_send_wr w = wr_to(b, i, IBV_WR_SEND, &s, 0);
    ibv_send_wr* bw = nullptr;
    ibv_wc wc{};
    if (uroce_post_send(a.qp, &w, &bw) == 0 && wait_wc(a, wc) && wc.status == IBV_WC_SUCCESS) ++sent;
    ibv_wc rc{};
    if (wait_wc(b, rc) && rc.status == IBV_WC_SUCCESS && rc.byte_len == kLen && rc.wr_id == 500u + i) {
      ++got;
      right += std::memcmp(a.buf + 8192 * i, b.buf + 8192 * i, kLen) == 0;
    }
  }
  check(sent == kMsgs && got == kMsgs && right == kMsgs, "16 SENDs of 4173 bytes, in order, every byte right");
  for (std::uint32_t j = 0; j < 65536; ++j) a.buf[262144 + j] = static_cast<std::uint8_t>(j * 31 + 5);
  ibv_sge s{reinterpret_cast<std::uint64_t>(a.buf) + 262144, 65536, uroce_mr_lkey(a.mr)};
  ibv_send_wr w = wr_to(b, 99, IBV_WR_RDMA_WRITE, &s, 262144);
  ibv_send_wr* bw = nullptr;
  ibv_wc wc{};
  check(uroce_post_send(a.qp, &w, &bw) == 0 && wait_wc(a, wc) && wc.status == IBV_WC_SUCCESS &&
            std::memcmp(a.buf + 262144, b.buf + 262144, 65536) == 0,
        "a 64 KiB WRITE over selective repeat, every byte right");
  // A READ goes fenced, in IBTA's opcodes, and reads what the WRITE wrote.
  ibv_sge rd{reinterpret_cast<std::uint64_t>(a.buf) + 524288, 4096, uroce_mr_lkey(a.mr)};
  ibv_send_wr r = wr_to(b, 100, IBV_WR_RDMA_READ, &rd, 262144);
  check(uroce_post_send(a.qp, &r, &bw) == 0 && wait_wc(a, wc) && wc.status == IBV_WC_SUCCESS &&
            wc.opcode == IBV_WC_RDMA_READ && std::memcmp(a.buf + 524288, b.buf + 262144, 4096) == 0,
        "a READ on a selective-repeat QP reads what the WRITE before it wrote");
  std::printf("%d passed, %d failed\n", g_pass, g_fail);
  return g_fail ? 1 : 0;
}

/// Two QPs on B share one SRQ; A sends on both; every receive is consumed
/// from the SRQ and names the QP it arrived on.
int srq(const char* sa, const char* sb) {
  End a, b;
  check(open_end(a, sa, false) && open_end(b, sb, false), "both applications open");
  if (g_fail) return 1;
  ibv_srq_init_attr sia{};
  sia.attr.max_wr = 20;  // rounded up to 32
  sia.attr.max_sge = 1;
  uroce_srq* srq = uroce_create_srq(b.pd, &sia);
  check(srq != nullptr && sia.attr.max_wr == 32, "create_srq: 20 entries asked, 32 given");
  ibv_srq_init_attr bad = sia;
  bad.attr.max_sge = 9;
  check(uroce_create_srq(b.pd, &bad) == nullptr && errno == EINVAL, "create_srq with 9 SGEs: EINVAL");
  // A second QP pair; B's two QPs both take receives from the SRQ.
  End a2 = a, b2 = b;
  uroce_qp_init_attr ia{};
  ia.send_cq = ia.recv_cq = a.cq;
  ia.qp_type = IBV_QPT_RC;
  ia.cap.max_send_wr = ia.cap.max_recv_wr = 64;
  a2.qp = uroce_create_qp(a.pd, &ia);
  ia.send_cq = ia.recv_cq = b.cq;
  ia.srq = srq;
  uroce_destroy_qp(b.qp);
  b.qp = uroce_create_qp(b.pd, &ia);
  b2.qp = uroce_create_qp(b.pd, &ia);
  check(a2.qp && b.qp && b2.qp, "QPs created, B's two on the SRQ");
  {
    // A receive posted to a QP still in RESET is refused at the post, with
    // EINVAL and the WR named, as rxe refuses it.
    ibv_sge es{reinterpret_cast<std::uint64_t>(a.buf), 64, uroce_mr_lkey(a.mr)};
    ibv_recv_wr ew{};
    ew.wr_id = 4242;
    ew.sg_list = &es;
    ew.num_sge = 1;
    ibv_recv_wr* ebad = nullptr;
    check(uroce_post_recv(a2.qp, &ew, &ebad) == EINVAL && ebad == &ew,
          "a receive posted in RESET is refused: EINVAL, the WR named");
  }
  check(connect(a, b) && connect(b, a) && connect(a2, b2) && connect(b2, a2), "both pairs connected");
  ibv_sge rs{reinterpret_cast<std::uint64_t>(b.buf), 64, uroce_mr_lkey(b.mr)};
  ibv_recv_wr rw{};
  rw.sg_list = &rs;
  rw.num_sge = 1;
  ibv_recv_wr* badwr = nullptr;
  check(uroce_post_recv(b.qp, &rw, &badwr) == EINVAL && badwr == &rw, "post_recv on a QP with an SRQ: EINVAL");
  constexpr int kMsgs = 16;
  std::vector<ibv_recv_wr> rws(kMsgs);
  std::vector<ibv_sge> rsg(kMsgs);
  for (int i = 0; i < kMsgs; ++i) {
    rsg[i] = {reinterpret_cast<std::uint64_t>(b.buf) + 4096 + 64 * i, 64, uroce_mr_lkey(b.mr)};
    rws[i].wr_id = 1000 + i;
    rws[i].sg_list = &rsg[i];
    rws[i].num_sge = 1;
    rws[i].next = i + 1 < kMsgs ? &rws[i + 1] : nullptr;
  }
  check(uroce_post_srq_recv(srq, rws.data(), &badwr) == 0, "16 receives posted to the SRQ");
  // Eight SENDs on each of A's QPs; byte 0 names the QP, byte 1 the message.
  int sent_ok = 0;
  for (int i = 0; i < kMsgs; ++i) {
    End& from = (i % 2) ? a2 : a;
    from.buf[64 * i] = static_cast<std::uint8_t>(i % 2);
    from.buf[64 * i + 1] = static_cast<std::uint8_t>(i);
    ibv_sge s{reinterpret_cast<std::uint64_t>(from.buf) + 64 * i, 32, uroce_mr_lkey(a.mr)};
    ibv_send_wr w = wr_to(b, i, IBV_WR_SEND, &s, 0);
    ibv_send_wr* bw = nullptr;
    if (uroce_post_send(from.qp, &w, &bw) != 0) continue;
    ibv_wc wc{};
    if (wait_wc(a, wc) && wc.status == IBV_WC_SUCCESS) ++sent_ok;
  }
  check(sent_ok == kMsgs, "A: 16 SENDs completed, 8 on each QP");
  int on[2] = {0, 0}, right = 0;
  std::vector<bool> seen(kMsgs, false);
  for (int i = 0; i < kMsgs; ++i) {
    ibv_wc wc{};
    if (!wait_wc(b, wc) || wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_RECV) continue;
    const int slot = static_cast<int>(wc.wr_id) - 1000;
    if (slot < 0 || slot >= kMsgs || seen[slot]) continue;
    seen[slot] = true;
    const std::uint8_t* m = b.buf + 4096 + 64 * slot;
    const int which = wc.qp_num == uroce_qp_num(b2.qp) ? 1 : 0;
    ++on[which];
    if (m[0] == which && wc.byte_len == 32) ++right;
  }
  check(on[0] == 8 && on[1] == 8, "B: 8 receives from the SRQ on each QP");
  check(right == kMsgs, "B: every message landed whole, on the QP it was sent to");
  check(uroce_destroy_srq(srq) == EBUSY, "destroy_srq while QPs use it: EBUSY");
  check(uroce_destroy_qp(b.qp) == 0 && uroce_destroy_qp(b2.qp) == 0 && uroce_destroy_srq(srq) == 0,
        "teardown: QPs, then the SRQ");
  uroce_close_device(a.ctx);
  uroce_close_device(b.ctx);
  std::printf("%d passed, %d failed\n", g_pass, g_fail);
  return g_fail == 0 ? 0 : 1;
}

/// Waits for the next CM event of `ctx`; false on timeout.
bool cm_event(uroce_context* ctx, uroce_cm_event& e, uroce_cm_event_type want, const std::string& what) {
  const int rc = uroce_cm_get_event(ctx, 5000, &e);
  check(rc == 0 && e.event == want, what + " (got event " + std::to_string(rc == 0 ? e.event : -rc) + ")");
  return rc == 0 && e.event == want;
}

/// A fresh RC QP on an open end (the CM agent takes it from RESET).
uroce_qp* rc_qp(End& e) {
  uroce_qp_init_attr ia{};
  ia.send_cq = ia.recv_cq = e.cq;
  ia.qp_type = IBV_QPT_RC;
  ia.cap.max_send_wr = ia.cap.max_recv_wr = 64;
  return uroce_create_qp(e.pd, &ia);
}

struct CmOffer {  // what the server puts in its REP's private data, as rping does
  std::uint64_t addr;
  std::uint32_t rkey;
};

int cm(const char* sa, const char* sb) {
  End a, b;
  check(open_end(a, sa, false) && open_end(b, sb, false), "both applications open");
  const std::uint16_t port = static_cast<std::uint16_t>(7000 + getpid() % 1000);
  check(uroce_cm_listen(a.ctx, port) == 0, "A listens");
  End o;  // a third application, on A's daemon
  check(open_end(o, sa, false), "a third application opens");
  uroce_context* other = o.ctx;
  check(uroce_cm_listen(other, port) == EADDRINUSE, "a second listen on the port: EADDRINUSE");

  // Connect with private data; the server accepts with its buffer's address and rkey.
  const char hello[] = "hello from B";
  uroce_cm_param cp{};
  cp.private_data = hello;
  cp.private_data_len = sizeof hello;
  cp.responder_resources = cp.initiator_depth = 4;
  cp.mtu = IBV_MTU_4096;
  std::uint32_t bid = 0;
  check(uroce_cm_connect(b.qp, &a.gid, port, &cp, &bid) == 0, "B connects");
  uroce_cm_event e{};
  if (!cm_event(a.ctx, e, UROCE_CM_EVENT_CONNECT_REQUEST, "A: a connect request")) return 1;
  check(e.peer_qp_num == uroce_qp_num(b.qp), "A: the request names B's QP");
  check(std::memcmp(e.peer_gid.raw, b.gid.raw, 16) == 0, "A: the request comes from B's GID");
  check(e.local_port == port && e.peer_port != 0, "A: ports (ours and the peer's RDMA CM source port)");
  check(e.private_data_len >= sizeof hello && std::memcmp(e.private_data, hello, sizeof hello) == 0,
        "A: B's private data arrived");
  check(e.mtu == IBV_MTU_4096 && e.responder_resources == 4, "A: MTU 4096 and 4 responder resources asked");
  const std::uint32_t aid = e.id;
  check(uroce_cm_accept(o.qp, aid, nullptr) == EINVAL, "accepting another session's request: refused");
  uroce_cm_event oe{};
  check(uroce_cm_get_event(other, 0, &oe) == EAGAIN, "another session sees none of A's events");
  CmOffer offer{reinterpret_cast<std::uint64_t>(a.buf), uroce_mr_rkey(a.mr)};
  uroce_cm_param ap{};
  ap.private_data = &offer;
  ap.private_data_len = sizeof offer;
  check(uroce_cm_accept(a.qp, aid, &ap) == 0, "A accepts with its buffer's address and rkey");
  if (!cm_event(b.ctx, e, UROCE_CM_EVENT_ESTABLISHED, "B: established")) return 1;
  check(e.id == bid && e.peer_qp_num == uroce_qp_num(a.qp), "B: the connection and A's QP");
  CmOffer got{};
  std::memcpy(&got, e.private_data, sizeof got);
  check(got.addr == offer.addr && got.rkey == offer.rkey, "B: A's offer arrived in the REP");
  cm_event(a.ctx, e, UROCE_CM_EVENT_ESTABLISHED, "A: established");
  ibv_qp_attr qa{};
  uroce_query_qp(b.qp, &qa, IBV_QP_STATE, nullptr);
  check(qa.qp_state == IBV_QPS_RTS && qa.path_mtu == IBV_MTU_4096 && qa.dest_qp_num == uroce_qp_num(a.qp),
        "B's QP: RTS, MTU 4096, connected to A's");

  // Data over what CM set up: a WRITE to the offered buffer, then a SEND.
  for (int i = 0; i < 8192; ++i) b.buf[i] = static_cast<std::uint8_t>(i * 13 + 5);
  ibv_sge ws{reinterpret_cast<std::uint64_t>(b.buf), 8192, uroce_mr_lkey(b.mr)};
  ibv_send_wr w{};
  w.wr_id = 1;
  w.opcode = IBV_WR_RDMA_WRITE;
  w.send_flags = IBV_SEND_SIGNALED;
  w.sg_list = &ws;
  w.num_sge = 1;
  w.wr.rdma.remote_addr = got.addr + 65536;
  w.wr.rdma.rkey = got.rkey;
  ibv_send_wr* bad = nullptr;
  ibv_wc wc{};
  check(uroce_post_send(b.qp, &w, &bad) == 0 && wait_wc(b, wc) && wc.status == IBV_WC_SUCCESS,
        "B: an 8 KiB WRITE through the CM-made connection completes");
  check(std::memcmp(a.buf + 65536, b.buf, 8192) == 0, "A: the WRITE's bytes are all there");

  // Reject, and no listener.
  check(uroce_cm_listen(a.ctx, port + 1) == 0, "A listens on a second port");
  End b2 = b;
  b2.qp = rc_qp(b);
  std::uint32_t rid = 0;
  check(uroce_cm_connect(b2.qp, &a.gid, port + 1, nullptr, &rid) == 0, "B connects to the second port");
  if (cm_event(a.ctx, e, UROCE_CM_EVENT_CONNECT_REQUEST, "A: the second request")) {
    check(uroce_cm_reject(other, e.id, nullptr, 0) == EINVAL, "rejecting another session's request: refused");
    check(uroce_cm_reject(a.ctx, e.id, "busy", 5) == 0, "A rejects it, saying why");
  }
  if (cm_event(b.ctx, e, UROCE_CM_EVENT_REJECTED, "B: rejected"))
    check(e.status == 28 && std::strcmp(reinterpret_cast<const char*>(e.private_data), "busy") == 0,
          "B: reason 28 (consumer) and A's words");
  uroce_qp* b3 = rc_qp(b);
  check(uroce_cm_connect(b3, &a.gid, port + 2, nullptr, &rid) == 0, "B connects to a port nobody listens on");
  if (cm_event(b.ctx, e, UROCE_CM_EVENT_REJECTED, "B: rejected by the daemon"))
    check(e.status == 8, "B: reason 8 (invalid service ID)");

  // Disconnect: both sides hear of it, both QPs end in ERR.
  check(uroce_cm_disconnect(other, aid) == EINVAL, "disconnecting another session's connection: refused");
  check(uroce_cm_disconnect(b.ctx, bid) == 0, "B disconnects");
  cm_event(a.ctx, e, UROCE_CM_EVENT_DISCONNECTED, "A: disconnected");
  check(e.id == aid, "A: the disconnect names the connection");
  cm_event(b.ctx, e, UROCE_CM_EVENT_DISCONNECTED, "B: disconnected");
  uroce_query_qp(a.qp, &qa, IBV_QP_STATE, nullptr);
  check(qa.qp_state == IBV_QPS_ERR, "A's QP is in ERR");

  // A client that dies while connected: its daemon disconnects for it.
  const pid_t child = fork();
  if (child == 0) {
    End c;
    if (!open_end(c, sb, false)) _exit(3);
    std::uint32_t cid;
    if (uroce_cm_connect(c.qp, &a.gid, port, nullptr, &cid) != 0) _exit(4);
    uroce_cm_event ce{};
    if (uroce_cm_get_event(c.ctx, 5000, &ce) != 0 || ce.event != UROCE_CM_EVENT_ESTABLISHED) _exit(5);
    _exit(0);  // no disconnect, no cleanup
  }
  uroce_qp* a2 = rc_qp(a);
  if (cm_event(a.ctx, e, UROCE_CM_EVENT_CONNECT_REQUEST, "A: the doomed client's request"))
    check(uroce_cm_accept(a2, e.id, nullptr) == 0, "A accepts it");
  int status = -1;
  waitpid(child, &status, 0);
  check(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the client connected, then exited");
  uroce_cm_event last{};
  for (int i = 0; i < 3; ++i) {  // ESTABLISHED first, then the disconnect its daemon sent
    if (uroce_cm_get_event(a.ctx, 5000, &last) != 0 || last.event == UROCE_CM_EVENT_DISCONNECTED) break;
  }
  check(last.event == UROCE_CM_EVENT_DISCONNECTED, "A: the dead client's daemon disconnected it");
  uroce_close_device(other);
  uroce_close_device(a.ctx);
  uroce_close_device(b.ctx);
  std::printf("%d passed, %d failed\n", g_pass, g_fail);
  return g_fail == 0 ? 0 : 1;
}

/// The device list finds `want` devices, and each one opens and answers.
/// Per-uid limits: `nsess` sessions on one daemon, each creating RC QPs
/// until the daemon refuses. Prints, per session, how many it got and why it
/// stopped ("open: ..." for a session refused at hello); the script checks
/// the totals against the limits it gave the daemon.
int qpcap(const char* sock, int nsess) {
  std::vector<uroce_context*> ctxs;
  int total = 0;
  for (int i = 0; i < nsess; ++i) {
    uroce_context* ctx = uroce_open_device(sock);
    if (!ctx) {
      std::printf("session %d: open: %s\n", i, uroce_last_error());
      continue;
    }
    ctxs.push_back(ctx);
    uroce_pd* pd = uroce_alloc_pd(ctx);
    uroce_cq* cq = pd ? uroce_create_cq(ctx, 16, nullptr, nullptr, 0) : nullptr;
    int got = 0;
    std::string why = "no PD or CQ";
    while (cq && got < 300) {
      uroce_qp_init_attr ia{};
      ia.send_cq = ia.recv_cq = cq;
      ia.qp_type = IBV_QPT_RC;
      ia.cap.max_send_wr = ia.cap.max_recv_wr = 4;
      if (!uroce_create_qp(pd, &ia)) {
        why = uroce_last_error();
        break;
      }
      ++got;
    }
    total += got;
    std::printf("session %d: %d QPs (%s)\n", i, got, why.c_str());
  }
  std::printf("total %d QPs\n", total);
  std::fflush(stdout);
  for (uroce_context* c : ctxs) uroce_close_device(c);
  return 0;
}

/// Embedded mode's life: two contexts share the process's node; the node
/// outlives the first close; after the last one it is gone, and a new open
/// is refused with the reason (DPDK's EAL cannot start twice).
int reopen(const char* spec) {
  uroce_context* a = uroce_open_device(spec);
  uroce_context* b = uroce_open_device(spec);
  check(a && b, "two contexts open the embedded node");
  ibv_gid ga{}, gb{};
  check(a && b && uroce_query_gid(a, 1, 0, &ga) == 0 && uroce_query_gid(b, 1, 0, &gb) == 0 &&
            std::memcmp(ga.raw, gb.raw, 16) == 0,
        "both see the one node's GID");
  if (a) uroce_close_device(a);
  uroce_cq* cq = b ? uroce_create_cq(b, 16, nullptr, nullptr, 0) : nullptr;
  check(cq != nullptr, "the node outlives the first close: the second context creates a CQ");
  if (cq) uroce_destroy_cq(cq);
  std::string other = std::string(spec) + " --log-level error";
  check(uroce_open_device(other.c_str()) == nullptr && std::strstr(uroce_last_error(), "other options"),
        "a second node with other options is refused");
  if (b) uroce_close_device(b);
  // The node outlives the last close (the EAL cannot start twice): an open
  // after it finds the node running, as programs that close their device
  // and open it again need (rdma-core's test suite does, per test).
  uroce_context* c = uroce_open_device(spec);
  uroce_cq* cq2 = c ? uroce_create_cq(c, 16, nullptr, nullptr, 0) : nullptr;
  check(c != nullptr && cq2 != nullptr, "after the last close, an open finds the node running and it works");
  if (cq2) uroce_destroy_cq(cq2);
  if (c) uroce_close_device(c);
  std::printf("%d passed, %d failed\n", g_pass, g_fail);
  return g_fail == 0 ? 0 : 1;
}

int devices(int want) {
  int n = -1;
  uroce_device** list = uroce_get_device_list(&n);
  check(list != nullptr && n == want, "device list: " + std::to_string(want) + " devices, got " + std::to_string(n));
  std::vector<std::string> gids;
  for (int i = 0; list && i < n; ++i) {
    std::printf("device %s at %s\n", uroce_get_device_name(list[i]), uroce_get_device_path(list[i]));
    uroce_context* ctx = uroce_open_device(uroce_get_device_path(list[i]));
    ibv_gid gid{};
    check(ctx && uroce_query_gid(ctx, 1, 0, &gid) == 0, std::string("device ") + uroce_get_device_name(list[i]) + " opens");
    gids.emplace_back(reinterpret_cast<const char*>(gid.raw), 16);
    if (ctx) uroce_close_device(ctx);
  }
  check(list && list[n] == nullptr, "the list is NULL-terminated");
  check(gids.size() < 2 || gids[0] != gids[1], "two devices, two different GIDs");
  uroce_free_device_list(list);
  std::printf("%d passed, %d failed\n", g_pass, g_fail);
  return g_fail == 0 ? 0 : 1;
}

/// No RNR on a clean link: `n` rounds in which B posts one receive and A,
/// told to go at once (the same process), sends into it. A receive posted
/// before its SEND arrives must be found: each round B's daemon may see the
/// SEND before it has looked at B's ring, and must then take the receive
/// from the ring instead of answering with an RNR NAK. Prints B's and A's QPNs; the
/// script counts RNR NAKs from the daemons and from the capture.
int rnr(const char* sa, const char* sb, long n) {
  alarm(120);
  End a, b;
  check(open_end(a, sa, false) && open_end(b, sb, false), "two applications open their daemons");
  if (g_fail) return 1;
  check(connect(a, b) && connect(b, a), "connected");
  std::printf("qpn %u %u\n", uroce_qp_num(b.qp), uroce_qp_num(a.qp));
  std::fflush(stdout);
  long recvd = 0, sent = 0;
  for (long i = 0; i < n && g_fail == 0; ++i) {
    ibv_sge rs{reinterpret_cast<std::uint64_t>(b.buf), 64, uroce_mr_lkey(b.mr)};
    ibv_recv_wr rw{};
    rw.wr_id = static_cast<std::uint64_t>(i);
    rw.sg_list = &rs;
    rw.num_sge = 1;
    ibv_recv_wr* rbad = nullptr;
    if (uroce_post_recv(b.qp, &rw, &rbad) != 0) break;
    ibv_sge ss{reinterpret_cast<std::uint64_t>(a.buf), 64, uroce_mr_lkey(a.mr)};
    ibv_send_wr w = wr_to(b, static_cast<std::uint64_t>(i), IBV_WR_SEND, &ss, 0);
    ibv_send_wr* bad = nullptr;
    if (uroce_post_send(a.qp, &w, &bad) != 0) break;
    ibv_wc wc{};
    if (!wait_wc(a, wc) || wc.status != IBV_WC_SUCCESS) {
      std::printf("round %ld: the SEND did not complete (%s)\n", i, uroce_wc_status_str(wc.status));
      break;
    }
    ++sent;
    if (!wait_wc(b, wc) || wc.status != IBV_WC_SUCCESS || wc.wr_id != static_cast<std::uint64_t>(i)) {
      std::printf("round %ld: no receive completion (%s)\n", i, uroce_wc_status_str(wc.status));
      break;
    }
    ++recvd;
  }
  check(sent == n && recvd == n, "every SEND completed and was received in order (" + std::to_string(recvd) + " of " +
                                     std::to_string(n) + ")");
  std::printf("%d passed, %d failed\n", g_pass, g_fail);
  return g_fail == 0 ? 0 : 1;
}

/// A full send queue is ENOMEM at post time, as in verbs: A's QP sends to a
/// peer QP that never answers (B's, left in RESET), so nothing retires. The
/// posts must stop with ENOMEM once the QP's ring and the engine's queue are
/// full, and every posted WR must end in the retry failure and its flushes,
/// never in a LOC_QP_OP_ERR refusal.
int sqfull(const char* sa, const char* sb) {
  End a, b;
  check(open_end(a, sa, false) && open_end(b, sb, false), "two applications open their daemons");
  if (g_fail) return 1;
  uroce_rc_conn c{};
  c.dest_qp_num = uroce_qp_num(b.qp);
  c.dgid = b.gid;
  c.timeout = 17;  // 537 ms: the queue must still be full when the posts end, however slow they are
  c.retry_cnt = 1;
  check(uroce_connect_qp(a.qp, &c) == 0, "A connected to B's QP, which stays in RESET");
  ibv_sge ss{reinterpret_cast<std::uint64_t>(a.buf), 64, uroce_mr_lkey(a.mr)};
  long posted = 0;
  int err = 0;
  for (; posted < 1000; ++posted) {
    ibv_send_wr w = wr_to(b, static_cast<std::uint64_t>(posted), IBV_WR_SEND, &ss, 0);
    ibv_send_wr* bad = nullptr;
    if ((err = uroce_post_send(a.qp, &w, &bad)) != 0) break;
    usleep(20);  // let the daemon take what it can, so the engine's queue fills too
  }
  std::printf("posted %ld before %s\n", posted, std::strerror(err));
  check(err == ENOMEM, "the post after the queue is full fails with ENOMEM");
  check(posted >= 64 && posted <= 2 * 64 + 1, "at most the ring plus the engine's queue (2 x 64) were taken");
  long done = 0, refused = 0;
  ibv_wc wc{};
  while (done < posted && wait_wc(a, wc, 3000)) {
    ++done;
    if (wc.status == IBV_WC_LOC_QP_OP_ERR) ++refused;
  }
  check(done == posted, "every posted WR completed (" + std::to_string(done) + " of " + std::to_string(posted) + ")");
  check(refused == 0, "none was refused with LOC_QP_OP_ERR");
  std::printf("%d passed, %d failed\n", g_pass, g_fail);
  return g_fail == 0 ? 0 : 1;
}

/// No lost wake-up, through a real daemon: `n` sends, one at a time, on a
/// QP in ERR, so each comes straight back from the daemon as a
/// WR_FLUSH_ERR completion without touching the wire. The daemon sleeps
/// between them (started with --idle-spin-us 0 and a poll tick of a second),
/// so each post must wake it through the doorbell and each completion must
/// wake us through the channel: one lost wake-up costs a whole tick. No
/// round (its posts and their completions) is judged against a clock: the
/// control is this run's own typical round (the median of the first 1,000,
/// then of all), and a stall is a round over `factor` times it. The tick is
/// tens of thousands of times the typical round; load slows the typical
/// round and the stragglers alike.
int wakes(const char* sock, long n, long factor) {
  alarm(0);
  uroce_context* ctx = uroce_open_device(sock);
  uroce_pd* pd = ctx ? uroce_alloc_pd(ctx) : nullptr;
  uroce_comp_channel* ch = ctx ? uroce_create_comp_channel(ctx) : nullptr;
  uroce_cq* cq = ch ? uroce_create_cq(ctx, 64, nullptr, ch, 0) : nullptr;
  uroce_qp_init_attr ia{};
  ia.send_cq = ia.recv_cq = cq;
  ia.qp_type = IBV_QPT_RC;
  ia.cap.max_send_wr = 16;
  ia.cap.max_recv_wr = 16;
  uroce_qp* qp = cq && pd ? uroce_create_qp(pd, &ia) : nullptr;
  ibv_qp_attr err{};
  err.qp_state = IBV_QPS_ERR;
  check(qp != nullptr && uroce_modify_qp(qp, &err, IBV_QP_STATE) == 0, "a QP in ERR with a CQ on a completion channel");
  if (!qp) return 1;
  using clk = std::chrono::steady_clock;
  const auto median = [](std::vector<double> v) {
    if (v.empty()) return 0.0;
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
    return v[v.size() / 2];
  };
  constexpr std::size_t kControl = 1000;  // rounds that make the early control
  constexpr long kGiveUp = 3;             // stalls after which the run stops (each costs a tick)
  std::vector<double> rounds;
  rounds.reserve(static_cast<std::size_t>(n));
  long got = 0, wrong = 0, posted = 0, early_stalls = 0, hung = 0;
  double early = 0, sum_us = 0;
  std::uint32_t rnd = 12345;
  const auto t0 = clk::now();
  // Rounds of 1 to 3 posts, a few microseconds apart, so later posts land
  // while the daemon is busy with the first or just going to sleep: the
  // moments a lost wake-up would come from.
  while (posted < n && early_stalls < kGiveUp) {
    const auto t = clk::now();
    rnd = rnd * 1103515245u + 12345u;
    const long k = std::min<long>(1 + (rnd >> 16) % 3, n - posted);
    for (long j = 0; j < k; ++j) {
      if (j > 0) {
        const auto until = clk::now() + std::chrono::microseconds((rnd >> (8 + j)) % 16);
        while (clk::now() < until) {
        }
      }
      ibv_send_wr w{};
      w.wr_id = static_cast<std::uint64_t>(posted + j);
      w.opcode = IBV_WR_SEND;
      w.send_flags = IBV_SEND_SIGNALED;
      ibv_send_wr* bad = nullptr;
      if (uroce_post_send(qp, &w, &bad) != 0) break;
    }
    for (long j = 0; j < k; ++j) {
      ibv_wc wc{};
      // 30 s: only a hang ends this wait; a lost wake-up ends with the tick.
      if (uroce_poll_cq_wait(cq, 1, &wc, 0, 30'000) != 1) {
        ++hung;
        break;
      }
      if (wc.wr_id != static_cast<std::uint64_t>(got) || wc.status != IBV_WC_WR_FLUSH_ERR) ++wrong;
      ++got;
    }
    // A round: its first post to its last completion.
    const double us = std::chrono::duration<double, std::micro>(clk::now() - t).count();
    sum_us += us;
    rounds.push_back(us);
    if (rounds.size() == kControl) early = median(rounds);
    if (early > 0 && us > static_cast<double>(factor) * early) ++early_stalls;
    posted += k;
    if (got != posted) break;
  }
  const double secs = std::chrono::duration<double>(clk::now() - t0).count();
  const double typical = median(rounds);
  long stalls = 0;
  double worst_us = 0;
  for (double w : rounds) {
    worst_us = std::max(worst_us, w);
    if (w > static_cast<double>(factor) * typical) ++stalls;
  }
  std::printf("%ld posts in %zu rounds, %.1f s: mean round %.1f us, typical %.1f us, worst %.1f us (%.0f x typical); "
              "%ld rounds over %ld x typical\n",
              got, rounds.size(), secs, rounds.empty() ? 0.0 : sum_us / static_cast<double>(rounds.size()), typical, worst_us,
              typical > 0 ? worst_us / typical : 0.0, stalls, factor);
  check(got == n, "every post came back (" + std::to_string(got) + " of " + std::to_string(n) + ")");
  check(hung == 0, "no wait hung");
  check(wrong == 0, "each completion is the one posted, in order, as WR_FLUSH_ERR");
  check(stalls == 0, "no round over " + std::to_string(factor) + " x the typical one: no lost doorbell or notification");
  uroce_close_device(ctx);
  std::printf("%d passed, %d failed\n", g_pass, g_fail);
  return g_fail == 0 ? 0 : 1;
}

/// One WRITE of fresh bytes from a to b, checked byte for byte at b: the
/// well-behaved application that must not notice a hostile neighbour.
bool victim_round(End& a, End& b, std::uint32_t round) {
  for (std::size_t i = 0; i < 4096; ++i) a.buf[i] = static_cast<std::uint8_t>(i * 7 + round);
  ibv_sge ss{reinterpret_cast<std::uint64_t>(a.buf), 4096, uroce_mr_lkey(a.mr)};
  ibv_send_wr w = wr_to(b, round, IBV_WR_RDMA_WRITE, &ss, 8192);
  ibv_wc wc{};
  return uroce_post_send(a.qp, &w, nullptr) == 0 && wait_wc(a, wc) && wc.status == IBV_WC_SUCCESS &&
         wc.wr_id == round && std::memcmp(a.buf, b.buf + 8192, 4096) == 0;
}

/// Hostile rings (one queue per verbs queue): a raw session writes its own
/// shared rings as no library would -- malformed entries, entries rewritten
/// after they were published, indices and ring headers out of range -- while
/// a well-behaved pair of applications on the same daemons writes and checks
/// its bytes after every step. The daemon copies an entry once and checks
/// the copy, and trusts no index of the application's, so only the hostile
/// session's own QP suffers (LOC_QP_OP_ERR, then ERR).
int rings(const char* sa, const char* sb) {
  End a, b;
  check(open_end(a, sa, false) && open_end(b, sb, false) && connect(a, b) && connect(b, a), "the victim pair is up");
  std::uint32_t round = 1;
  check(victim_round(a, b, round++), "victim: a WRITE, every byte checked");
  int s = raw_session(sa, UROCE_ABI_MAJOR, UROCE_ABI_MINOR);
  int hfd[2] = {-1, -1};
  {
    std::uint8_t in[UROCE_MSG_MAX];
    int k = 0;
    const ssize_t n = uroce::abi::recv_with_fds(s, in, sizeof in, 0, [&](int fd) {
      if (k < 2) hfd[k++] = fd;
      else ::close(fd);
    });
    check(n > 0 && hfd[0] >= 0 && hfd[1] >= 0, "a raw session says hello and gets its page and doorbell");
  }
  auto* page = hfd[0] >= 0 ? static_cast<uroce_session_page*>(::mmap(nullptr, UROCE_SESSION_PAGE_BYTES,
                                                                      PROT_READ | PROT_WRITE, MAP_SHARED, hfd[0], 0))
                           : nullptr;
  std::uint32_t qpn = 0;
  uroce_ring_header* named = nullptr;  // the hostile QP's send ring header, once mapped
  auto posted = [&] {  // what liburoce does after a post: name the QP in the work ring, and ring the doorbell
    if (page && page != MAP_FAILED && named) (void)uroce::abi::queue_work(page, named, qpn);
    const char byte = 1;
    (void)::send(hfd[1], &byte, 1, MSG_DONTWAIT);
  };
  check(raw_call(s, UROCE_MSG_ALLOC_PD, 2, nullptr, 0, -1) == 0, "ALLOC_PD");
  uroce_create_cq_msg cm{64};
  int cfd = -1;
  check(raw_call(s, UROCE_MSG_CREATE_CQ, 3, &cm, sizeof cm, -1, &cfd) == 0 && cfd >= 0, "CREATE_CQ");
  uroce_create_qp_msg qm{};
  qm.pd = 1;
  qm.send_cq = qm.recv_cq = 2;
  qm.qp_type = IBV_QPT_RC;
  qm.max_send_wr = qm.max_recv_wr = 16;
  int qfd = -1;
  uroce_create_qp_reply qr{};
  check(raw_call(s, UROCE_MSG_CREATE_QP, 4, &qm, sizeof qm, -1, &qfd, &qr, sizeof qr) == 0 && qfd >= 0, "CREATE_QP");
  qpn = qr.qpn;
  struct stat st {};
  const std::size_t qlen = qfd >= 0 && ::fstat(qfd, &st) == 0 ? static_cast<std::size_t>(st.st_size) : 0;
  const std::size_t clen = cfd >= 0 && ::fstat(cfd, &st) == 0 ? static_cast<std::size_t>(st.st_size) : 0;
  auto* q = static_cast<std::uint8_t*>(qlen ? ::mmap(nullptr, qlen, PROT_READ | PROT_WRITE, MAP_SHARED, qfd, 0) : MAP_FAILED);
  auto* c = static_cast<std::uint8_t*>(clen ? ::mmap(nullptr, clen, PROT_READ | PROT_WRITE, MAP_SHARED, cfd, 0) : MAP_FAILED);
  check(q != MAP_FAILED && c != MAP_FAILED, "the hostile session maps its own rings");
  if (q == MAP_FAILED || c == MAP_FAILED) return 1;
  // To RTS, aimed at a QPN nobody has on daemon B, with one retry: sends are
  // taken into the daemon's shadow and go out (and fail), as real work would.
  const std::uint32_t states[3] = {IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS};
  for (std::uint32_t k = 0; k < 3; ++k) {
    uroce_modify_qp_msg m{};
    m.qp = 3;
    m.port_num = 1;
    m.qp_state = states[k];
    m.mask = IBV_QP_STATE;
    if (k == 0) m.mask |= IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
    if (k == 1) {
      m.mask |= IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
                IBV_QP_MIN_RNR_TIMER;
      m.path_mtu = IBV_MTU_1024;
      m.dest_qp_num = 0xfff0;
      std::memcpy(m.dgid, b.gid.raw, 16);
      m.max_dest_rd_atomic = 1;
      m.min_rnr_timer = 12;
    }
    if (k == 2) {
      m.mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC;
      m.timeout = 8;
      m.retry_cnt = 1;
      m.rnr_retry = 1;
      m.max_rd_atomic = 1;
    }
    const int rc = raw_call(s, UROCE_MSG_MODIFY_QP, 5 + k, &m, sizeof m, -1);
    check(rc == 0, "the hostile QP to state " + std::to_string(states[k]) + ": " + std::to_string(rc));
  }
  auto* sqh = reinterpret_cast<uroce_ring_header*>(q);
  auto* sqe = reinterpret_cast<uroce_send_entry*>(q + sizeof(uroce_ring_header));
  named = sqh;
  // 1. Malformed entries: an unknown opcode, 200 SGEs, 4 KiB of "inline" data.
  for (std::uint32_t i = 0; i < 3; ++i) {
    uroce_send_entry e{};
    e.wr_id = 100 + i;
    e.opcode = i == 0 ? 200 : IBV_WR_SEND;
    e.num_sge = i == 1 ? 200 : 1;
    e.send_flags = i == 2 ? IBV_SEND_INLINE | IBV_SEND_SIGNALED : IBV_SEND_SIGNALED;
    e.inline_len = i == 2 ? 4096 : 0;
    e.sg_list[0] = {0xdead0000, 0xffffffff, 0x1234};
    sqe[i] = e;
    __atomic_store_n(&sqe[i].seq, i + 1, __ATOMIC_RELEASE);
  }
  __atomic_store_n(&sqh->prod, 3u, __ATOMIC_RELEASE);
  posted();
  usleep(100000);
  auto* cqh = reinterpret_cast<uroce_ring_header*>(c);
  auto* cqe = reinterpret_cast<uroce_cq_entry*>(c + sizeof(uroce_ring_header));
  const bool first_refused = __atomic_load_n(&cqe[0].seq, __ATOMIC_ACQUIRE) == 1 && cqe[0].wr_id == 100 &&
                             cqe[0].status == IBV_WC_LOC_QP_OP_ERR;
  check(first_refused, "a malformed entry completes with LOC_QP_OP_ERR on the hostile QP's own CQ");
  check(victim_round(a, b, round++), "victim unaffected by malformed entries");
  // 2. An entry rewritten after it was published: the daemon took its copy.
  for (std::uint32_t i = 3; i < 11; ++i) {
    uroce_send_entry e{};
    e.wr_id = 200 + i;
    e.opcode = IBV_WR_RDMA_WRITE;
    e.num_sge = 1;
    e.sg_list[0] = {0x1000, 64, 0};
    sqe[i & 15] = e;
    __atomic_store_n(&sqe[i & 15].seq, i + 1, __ATOMIC_RELEASE);
    __atomic_store_n(&sqh->prod, i + 1, __ATOMIC_RELEASE);
    posted();
    for (int r = 0; r < 2000; ++r) {  // rewrite it while the daemon may be reading it
      sqe[i & 15].num_sge = static_cast<std::uint8_t>(r * 37);
      sqe[i & 15].opcode = static_cast<std::uint8_t>(r);
      sqe[i & 15].sg_list[0].length = static_cast<std::uint32_t>(r) << 20;
    }
  }
  check(victim_round(a, b, round++), "victim unaffected by entries rewritten after posting");
  // 3. Indices and headers out of range, in every ring: the daemon keeps its own.
  auto* rqh = reinterpret_cast<uroce_ring_header*>(q + (qlen - uroce_ring_bytes(16, sizeof(uroce_recv_entry))));
  for (uroce_ring_header* h : {sqh, rqh, cqh}) {
    h->entries = 0xffffffffu;
    h->entry_size = 1;
    h->magic = 0;
    __atomic_store_n(&h->prod, 0x7ffffff0u, __ATOMIC_RELEASE);
    __atomic_store_n(&h->cons, 0x80000123u, __ATOMIC_RELEASE);
    __atomic_store_n(&h->arm, 0xffffffffu, __ATOMIC_RELEASE);
  }
  // Every slot claims to be the next one, whichever index the daemon is at.
  for (std::uint32_t k = 0; k < 16; ++k) {
    sqe[k].seq = 0x7ffffff0u + k;
    sqe[k].num_sge = 1;
    sqe[k].opcode = IBV_WR_SEND;
  }
  std::memset(reinterpret_cast<std::uint8_t*>(rqh) + sizeof(uroce_ring_header), 0xff,
              16 * sizeof(uroce_recv_entry));
  std::memset(cqe, 0xee, 64 * sizeof(uroce_cq_entry));
  for (int k = 0; k < 50; ++k) {
    posted();
    usleep(2000);
  }
  check(victim_round(a, b, round++), "victim unaffected by ring headers and indices out of range");
  // 3b. The session's work ring (minor 20): the victims' QP numbers and
  // numbers nobody has named in it, its indices and overflow word thrown
  // about, every slot claiming to be ready. The daemon names only the
  // session's own QPs (the others are counted: intake.foreign).
  if (page && page != MAP_FAILED) {
    uroce_work_ring* w = uroce_session_work(page);
    const std::uint32_t victims[4] = {uroce_qp_num(a.qp), uroce_qp_num(b.qp), 0xffffff, UROCE_WORK_TM_SRQ | 7};
    for (int k = 0; k < 200; ++k) {
      for (std::uint32_t i = 0; i < UROCE_WORK_ENTRIES; ++i) {
        w->slots[i].what = victims[(i + static_cast<std::uint32_t>(k)) % 4];
        // Even rounds: every slot ready on the ring's first lap (the daemon's
        // own index is there); odd ones: wild.
        const std::uint32_t seq = (k & 1) ? static_cast<std::uint32_t>(k) * 7919u + i : i + 1;
        __atomic_store_n(&w->slots[i].seq, seq, __ATOMIC_RELEASE);
      }
      __atomic_store_n(&w->prod, static_cast<std::uint32_t>(k) * 0x9e3779b9u, __ATOMIC_RELEASE);
      __atomic_store_n(&w->cons, ~static_cast<std::uint32_t>(k), __ATOMIC_RELEASE);
      __atomic_store_n(&w->overflow, static_cast<std::uint32_t>(k & 1), __ATOMIC_RELEASE);
      const char byte = 1;
      (void)::send(hfd[1], &byte, 1, MSG_DONTWAIT);
      usleep(500);
    }
  }
  check(victim_round(a, b, round++), "victim unaffected by a work ring full of other QPs' names and wild indices");
  // 4. The hostile session goes away with its rings in that state.
  ::munmap(q, qlen);
  ::munmap(c, clen);
  if (page && page != MAP_FAILED) ::munmap(page, UROCE_SESSION_PAGE_BYTES);
  for (int fd : {qfd, cfd, hfd[0], hfd[1], s})
    if (fd >= 0) ::close(fd);
  usleep(200000);
  for (int k = 0; k < 20; ++k, ++round)
    check(victim_round(a, b, round), "victim: WRITE " + std::to_string(round) + " after the hostile session left");
  uroce_close_device(a.ctx);
  uroce_close_device(b.ctx);
  std::printf("%d passed, %d failed\n", g_pass, g_fail);
  return g_fail ? 1 : 0;
}

/// CQ overflow is never silent: a CQ of 4 entries that nobody polls, fed by
/// 16 signalled WRITEs. The owner gets IBV_EVENT_CQ_ERR for the CQ and
/// IBV_EVENT_QP_FATAL for the QP, which is in ERR (a later post flushes),
/// and a second QP of the same application on another CQ still works.
int cqoverflow(const char* sa, const char* sb) {
  End a, b;
  check(open_end(a, sa, false) && open_end(b, sb, false) && connect(a, b) && connect(b, a), "set up");
  End a2 = a, b2 = b;
  a2.cq = uroce_create_cq(a.ctx, 4, nullptr, nullptr, 0);
  uroce_qp_init_attr ia{};
  ia.send_cq = ia.recv_cq = a2.cq;
  ia.qp_type = IBV_QPT_RC;
  ia.cap.max_send_wr = ia.cap.max_recv_wr = 16;
  a2.qp = a2.cq ? uroce_create_qp(a.pd, &ia) : nullptr;
  ia.send_cq = ia.recv_cq = b.cq;
  b2.qp = uroce_create_qp(b.pd, &ia);
  check(a2.qp && b2.qp && connect(a2, b2) && connect(b2, a2), "a second pair, A's side on a CQ of 4");
  ibv_sge ss{reinterpret_cast<std::uint64_t>(a.buf), 64, uroce_mr_lkey(a.mr)};
  int posted = 0;
  for (int i = 0; i < 16; ++i) {
    ibv_send_wr w = wr_to(b2, static_cast<std::uint64_t>(i), IBV_WR_RDMA_WRITE, &ss, 0);
    if (uroce_post_send(a2.qp, &w, nullptr) == 0) ++posted;
  }
  check(posted == 16, "16 signalled WRITEs posted");
  bool cq_err = false, qp_fatal = false;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while ((!cq_err || !qp_fatal) && std::chrono::steady_clock::now() < until) {
    pollfd p{uroce_async_fd(a.ctx), POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    uroce_async_event ev{};
    if (uroce_get_async_event(a.ctx, &ev) != 0) break;
    if (ev.event_type == IBV_EVENT_CQ_ERR && ev.cq == a2.cq) cq_err = true;
    if (ev.event_type == IBV_EVENT_QP_FATAL && ev.qp == a2.qp) qp_fatal = true;
  }
  check(cq_err, "IBV_EVENT_CQ_ERR names the CQ that overflowed");
  check(qp_fatal, "IBV_EVENT_QP_FATAL names the QP that completes into it");
  ibv_qp_attr qa{};
  uroce_qp_init_attr qi{};
  check(uroce_query_qp(a2.qp, &qa, IBV_QP_STATE, &qi) == 0 && qa.qp_state == IBV_QPS_ERR, "and that QP is in ERR");
  ibv_wc wc[8];
  const int n = uroce_poll_cq(a2.cq, 8, wc);
  check(n == 4, "the CQ holds the 4 completions that fitted (" + std::to_string(n) + ")");
  check(victim_round(a, b, 1), "the application's other QP, on another CQ, still works");
  uroce_close_device(a.ctx);
  uroce_close_device(b.ctx);
  std::printf("%d passed, %d failed\n", g_pass, g_fail);
  return g_fail ? 1 : 0;
}

/// fork() in an embedded-mode process: the child must not turn the
/// parent's node (its sockets and port are shared with the parent; a child
/// that turned its copy would take the parent's requests). While a child
/// calls uroce_progress and uroce_wait_fd for a while, the parent creates,
/// queries and destroys QPs without a failure; the child's progress does
/// nothing, and it cannot open an embedded device of its own.
int forked(const char* spec) {
  End a;
  check(open_end(a, spec, false), "the embedded application opens");
  const pid_t child = fork();
  if (child == 0) {
    int turned = 0;
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(1500);
    while (std::chrono::steady_clock::now() < until) {
      turned += uroce_progress(nullptr) > 0;
      (void)uroce_wait_fd(-1, 1);
    }
    uroce_context* mine = uroce_open_device(spec);
    const bool refused = !mine && std::strstr(uroce_last_error(), "fork() child");
    std::printf("child: %d turns did work; own embedded device: %s\n", turned, mine ? "opened" : uroce_last_error());
    std::fflush(stdout);
    _exit(turned == 0 && refused ? 0 : 1);
  }
  int ok = 0, bad = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(1500);
  while (std::chrono::steady_clock::now() < until) {
    uroce_qp* q = rc_qp(a);
    ibv_qp_attr qa{};
    uroce_qp_init_attr qi{};
    const bool good = q && uroce_query_qp(q, &qa, IBV_QP_STATE, &qi) == 0 && qa.qp_state == IBV_QPS_RESET &&
                      uroce_destroy_qp(q) == 0;
    good ? ++ok : ++bad;
    if (!good) std::printf("  parent: %s\n", uroce_last_error());
  }
  int status = -1;
  waitpid(child, &status, 0);
  std::printf("parent: %d QP create/query/destroy rounds, %d failed\n", ok, bad);
  check(ok > 20 && bad == 0, "the parent's requests all succeed while the child runs");
  check(WIFEXITED(status) && WEXITSTATUS(status) == 0,
        "the child's progress did nothing, and it may not start an embedded node of its own");
  uroce_close_device(a.ctx);
  std::printf("%d passed, %d failed\n", g_pass, g_fail);
  return g_fail ? 1 : 0;
}

/// Port events: the link of the daemon at `sa`, as an application sees it.
/// Prints "ready" when the port is up, then waits (20 s at most each) for
/// IBV_EVENT_PORT_ERR and IBV_EVENT_PORT_ACTIVE, which the test causes by
/// stopping and restarting the peer daemon (memif's link follows it),
/// printing "down" in between.
int port_events(const char* sa) {
  uroce_context* ctx = uroce_open_device(sa);
  ibv_port_attr pa{};
  check(ctx && uroce_query_port(ctx, 1, &pa) == 0 && pa.state == IBV_PORT_ACTIVE && pa.phys_state == 5 &&
            pa.active_speed != 0 && pa.active_width != 0,
        "query_port: ACTIVE, LinkUp, a width and speed from the link");
  if (g_fail) return 1;
  std::printf("ready: speed %u width %u\n", pa.active_speed, pa.active_width);
  std::fflush(stdout);
  const auto wait_event = [&](ibv_event_type want) {
    pollfd p{uroce_async_fd(ctx), POLLIN, 0};
    if (::poll(&p, 1, 20000) != 1) return false;
    uroce_async_event e{};
    return uroce_get_async_event(ctx, &e) == 0 && e.event_type == want && e.port_num == 1 && !e.qp && !e.cq;
  };
  check(wait_event(IBV_EVENT_PORT_ERR), "IBV_EVENT_PORT_ERR on port 1 when the link went down");
  check(uroce_query_port(ctx, 1, &pa) == 0 && pa.state == IBV_PORT_DOWN && pa.phys_state == 3,
        "query_port then: DOWN, Disabled");
  std::printf("down\n");
  std::fflush(stdout);
  check(wait_event(IBV_EVENT_PORT_ACTIVE), "IBV_EVENT_PORT_ACTIVE on port 1 when it came back");
  check(uroce_query_port(ctx, 1, &pa) == 0 && pa.state == IBV_PORT_ACTIVE, "query_port then: ACTIVE");
  uroce_close_device(ctx);
  std::printf("%d passed, %d failed\n", g_pass, g_fail);
  return g_fail ? 1 : 0;
}

int main(int argc, char** argv) {
  alarm(60);  // a blocking call that never returns is a failure, not a hang
  if (argc >= 4 && std::string(argv[1]) == "ops") return ops(argv[2], argv[3]);
  if (argc >= 4 && std::string(argv[1]) == "hostile") return hostile(argv[2], argv[3]);
  if (argc >= 3 && std::string(argv[1]) == "crash") return crash(argv[2]);
  if (argc >= 4 && std::string(argv[1]) == "hold") {  // hold a QP for a while, for uroce-ctl to list
    End e;
    if (!open_end(e, argv[2], false)) return 1;
    std::printf("qpn %u\n", uroce_qp_num(e.qp));
    std::fflush(stdout);
    // Waiting in liburoce, not in sleep(3): an embedded node keeps serving
    // (its control socket among the rest) while the application waits.
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(std::atoi(argv[3]));
    while (std::chrono::steady_clock::now() < until) (void)uroce_wait_fd(-1, 10);
    uroce_close_device(e.ctx);
    return 0;
  }
  if (argc >= 4 && std::string(argv[1]) == "events") return events(argv[2], argv[3]);
  if (argc >= 3 && std::string(argv[1]) == "port") return port_events(argv[2]);
  if (argc >= 4 && std::string(argv[1]) == "srq") return srq(argv[2], argv[3]);
  if (argc >= 4 && std::string(argv[1]) == "qpopt") return qpopt(argv[2], argv[3]);
  if (argc >= 4 && std::string(argv[1]) == "ud") return ud(argv[2], argv[3]);
  if (argc >= 4 && std::string(argv[1]) == "cm") return cm(argv[2], argv[3]);
  if (argc >= 3 && std::string(argv[1]) == "fork") return forked(argv[2]);
  if (argc >= 3 && std::string(argv[1]) == "devices") return devices(std::atoi(argv[2]));
  if (argc >= 3 && std::string(argv[1]) == "reopen") return reopen(argv[2]);
  if (argc >= 4 && std::string(argv[1]) == "qpcap") return qpcap(argv[2], std::atoi(argv[3]));
  if (argc >= 5 && std::string(argv[1]) == "oob") return oob(argv[2], argv[3], std::atoi(argv[4]));
  if (argc >= 4 && std::string(argv[1]) == "rtrflood") return rtrflood(argv[2], std::atol(argv[3]));
  if (argc >= 4 && std::string(argv[1]) == "seams") return seams(argv[2], std::atoi(argv[3]));
  if (argc >= 4 && std::string(argv[1]) == "sqfull") return sqfull(argv[2], argv[3]);
  if (argc >= 4 && std::string(argv[1]) == "rings") return rings(argv[2], argv[3]);
  if (argc >= 4 && std::string(argv[1]) == "cqoverflow") return cqoverflow(argv[2], argv[3]);
  if (argc >= 5 && std::string(argv[1]) == "rnr") return rnr(argv[2], argv[3], std::atol(argv[4]));
  if (argc >= 5 && std::string(argv[1]) == "wakes") return wakes(argv[2], std::atol(argv[3]), std::atol(argv[4]));
  std::fprintf(stderr, "usage: app_pair ops|hostile|events|srq|ud SOCK_A SOCK_B | crash SOCK_A | oob SOCK_A SOCK_B PORT | devices N | wakes SOCK N FACTOR | rnr SOCK_A SOCK_B N | sqfull|rings|cqoverflow SOCK_A SOCK_B | seams SOCK DAEMON_PID | rtrflood SOCK N\n");
  return 2;
}
