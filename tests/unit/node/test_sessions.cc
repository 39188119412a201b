// The session server's request handlers below the integration level
// (control/node/session_objects.cc, session_control.cc): a server on its own
// io_context and engine, no DPDK, and a client speaking the session protocol
// on its socket, as liburoce does. Each request is answered; each refusal
// says why, and leaves no descriptor and no mapping behind in the daemon.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <dirent.h>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "control/node/sessions.h"
#include "stack/abi/fd_msg.h"
#include "stack/abi/session_proto.h"

namespace uroce::control {
namespace {

struct Reply {
  int err = -1;
  std::string why;
  std::vector<std::uint8_t> body;
  std::vector<int> fds;
  template <class T>
  T as() const {
    T t{};
    std::memcpy(&t, body.data(), std::min(sizeof t, body.size()));
    return t;
  }
};

std::size_t open_fds() {
  std::size_t n = 0;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (::readdir(d)) ++n;
    ::closedir(d);
  }
  return n;
}
std::size_t mappings() {
  std::ifstream f("/proc/self/maps");
  std::size_t n = 0;
  for (std::string l; std::getline(f, l);) ++n;
  return n;
}
int memfd(std::size_t len, bool sealed) {
  const int fd = ::memfd_create("test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd >= 0 && ::ftruncate(fd, static_cast<off_t>(len)) == 0 && sealed)
    (void)::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW);
  return fd;
}

struct Sessions : ::testing::Test {
  boost::asio::io_context io;
  std::unique_ptr<transport::Engine> eng;
  std::unique_ptr<pipeline::Intake> intake;
  std::unique_ptr<SessionServer> srv;
  std::string path = "/tmp/uroce-test-sessions-" + std::to_string(::getpid()) + ".sock";
  int c = -1;
  std::uint32_t seq = 1;

  void SetUp() override {
    transport::EngineConfig cfg;
    cfg.mac = {0x02, 0, 0, 0, 0, 0x0a};
    cfg.ip = wire::IpAddr::from_v4(10, 0, 0, 1);
    cfg.max_qps = 64;
    eng = std::make_unique<transport::Engine>(cfg);
    intake = std::make_unique<pipeline::Intake>(*eng);
    srv = std::make_unique<SessionServer>(io, path, 0600, *eng, *intake, SessionLimits{});
    c = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::snprintf(a.sun_path, sizeof a.sun_path, "%s", path.c_str());
    ASSERT_EQ(::connect(c, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    turn();
  }
  void TearDown() override {
    if (c >= 0) ::close(c);
    srv.reset();
    ::unlink(path.c_str());
  }
  void turn() {
    for (int i = 0; i < 8; ++i) {
      (void)io.poll();
      (void)srv->step();
      (void)intake->run();
      eng->poll(1'000'000);
    }
  }
  /// One request and its reply; the descriptors that come back are the caller's.
  Reply call(std::uint16_t type, const void* body, std::size_t len, const std::vector<int>& fds = {}) {
    std::vector<std::uint8_t> buf(sizeof(uroce_msg_hdr) + len);
    const uroce_msg_hdr h{UROCE_MSG_MAGIC, UROCE_ABI_MAJOR, type, static_cast<std::uint32_t>(len), seq++};
    std::memcpy(buf.data(), &h, sizeof h);
    if (len) std::memcpy(buf.data() + sizeof h, body, len);
    EXPECT_GE(abi::send_with_fds(c, buf.data(), buf.size(), fds.data(), fds.size()), 0);
    turn();
    Reply r;
    std::uint8_t in[4096];
    const ssize_t n = abi::recv_with_fds(c, in, sizeof in, MSG_DONTWAIT, [&r](int f) { r.fds.push_back(f); });
    if (n < static_cast<ssize_t>(sizeof(uroce_msg_hdr) + sizeof(uroce_reply_status))) return r;
    uroce_reply_status st;
    std::memcpy(&st, in + sizeof(uroce_msg_hdr), sizeof st);
    r.err = st.err;
    r.why = std::string(st.why, strnlen(st.why, sizeof st.why));
    r.body.assign(in + sizeof(uroce_msg_hdr) + sizeof st, in + n);
    return r;
  }
  static void close_all(Reply& r) {
    for (int f : r.fds) ::close(f);
    r.fds.clear();
  }
  void hello() {
    const uroce_hello_msg m{UROCE_ABI_MAJOR, UROCE_ABI_MINOR, static_cast<std::uint32_t>(::getpid())};
    Reply r = call(UROCE_MSG_HELLO, &m, sizeof m);
    ASSERT_EQ(r.err, 0) << r.why;
    EXPECT_EQ(r.fds.size(), 2u) << "the session page and the doorbell";
    EXPECT_EQ(r.as<uroce_hello_reply>().minor, UROCE_ABI_MINOR);
    close_all(r);
  }
  std::uint32_t make(std::uint16_t type, const void* body, std::size_t len, std::size_t want_fds) {
    Reply r = call(type, body, len);
    EXPECT_EQ(r.err, 0) << r.why;
    EXPECT_EQ(r.fds.size(), want_fds);
    close_all(r);
    return r.as<uroce_handle_reply>().handle;
  }
};

TEST_F(Sessions, EachRequestIsAnsweredByItsHandler) {
  hello();
  const std::uint32_t pd = make(UROCE_MSG_ALLOC_PD, nullptr, 0, 0);
  const uroce_create_cq_msg cq_msg{64};
  const std::uint32_t cq = make(UROCE_MSG_CREATE_CQ, &cq_msg, sizeof cq_msg, 1);
  uroce_create_qp_msg qp_msg{};
  qp_msg.pd = pd;
  qp_msg.send_cq = qp_msg.recv_cq = cq;
  qp_msg.qp_type = IBV_QPT_RC;
  qp_msg.max_send_wr = qp_msg.max_recv_wr = 16;
  const std::uint32_t qp = make(UROCE_MSG_CREATE_QP, &qp_msg, sizeof qp_msg, 1);
  const uroce_resize_cq_msg rs{cq, 128};
  EXPECT_EQ(make(UROCE_MSG_RESIZE_CQ, &rs, sizeof rs, 1), cq);
  for (const uroce_destroy_msg d : {uroce_destroy_msg{UROCE_OBJ_QP, qp}, uroce_destroy_msg{UROCE_OBJ_CQ, cq},
                                    uroce_destroy_msg{UROCE_OBJ_PD, pd}}) {
    Reply r = call(UROCE_MSG_DESTROY, &d, sizeof d);
    EXPECT_EQ(r.err, 0) << r.why;
  }
}

TEST_F(Sessions, RefusalsSayWhyAndLeaveNoDescriptorOrMappingBehind) {
  hello();
  const std::uint32_t pd = make(UROCE_MSG_ALLOC_PD, nullptr, 0, 0);
  const uroce_create_cq_msg one{16};
  const std::uint32_t cq = make(UROCE_MSG_CREATE_CQ, &one, sizeof one, 1);
  // Warm: what the first refusals allocate once (the engine's tables).
  for (int round = 0; round < 2; ++round) {
    const std::size_t fds_before = open_fds(), maps_before = mappings();
    // Before any handler: an unknown type, a short body.
    Reply r = call(200, nullptr, 0);
    EXPECT_EQ(r.err, EOPNOTSUPP);
    EXPECT_EQ(r.why, "unknown request type");
    r = call(UROCE_MSG_CREATE_CQ, "x", 1);
    EXPECT_EQ(r.err, EINVAL);
    EXPECT_EQ(r.why, "message too short for its type");
    // A completion channel that is a pipe, not a Unix datagram socket.
    int p[2];
    ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
    r = call(UROCE_MSG_CREATE_CQ, &one, sizeof one, {p[1]});
    ::close(p[0]);
    ::close(p[1]);
    EXPECT_EQ(r.err, EINVAL);
    EXPECT_EQ(r.why, "a completion channel must be a Unix datagram socket");
    // An MR whose memfd is not sealed, and one the engine refuses after
    // its memory was mapped (REMOTE_WRITE without LOCAL_WRITE).
    uroce_reg_mr_msg mr{pd, IBV_ACCESS_LOCAL_WRITE, 0x10000, 65536, 0};
    const int unsealed = memfd(65536, false);
    r = call(UROCE_MSG_REG_MR, &mr, sizeof mr, {unsealed});
    ::close(unsealed);
    EXPECT_EQ(r.err, EINVAL);
    EXPECT_EQ(r.why, "the MR's memfd must be sealed against shrinking (F_SEAL_SHRINK)");
    mr.access = IBV_ACCESS_REMOTE_WRITE;
    const int sealed = memfd(65536, true);
    r = call(UROCE_MSG_REG_MR, &mr, sizeof mr, {sealed});
    ::close(sealed);
    EXPECT_EQ(r.err, EINVAL);
    EXPECT_EQ(r.why, "bad MR access flags or range");
    // Names that are not the session's.
    uroce_create_qp_msg qp{};
    qp.pd = 999;
    qp.send_cq = qp.recv_cq = cq;
    qp.qp_type = IBV_QPT_RC;
    r = call(UROCE_MSG_CREATE_QP, &qp, sizeof qp);
    EXPECT_EQ(r.err, EINVAL);
    EXPECT_EQ(r.why, "no such PD or CQ in this session");
    const uroce_destroy_msg d{UROCE_OBJ_CQ, 999};
    r = call(UROCE_MSG_DESTROY, &d, sizeof d);
    EXPECT_EQ(r.err, EINVAL);
    const uroce_resize_cq_msg rs{999, 64};
    r = call(UROCE_MSG_RESIZE_CQ, &rs, sizeof rs);
    EXPECT_EQ(r.err, EINVAL);
    EXPECT_EQ(r.why, "no such CQ in this session");
    if (round == 1) {
      EXPECT_EQ(open_fds(), fds_before) << "a refused request left a descriptor open in the daemon";
      EXPECT_EQ(mappings(), maps_before) << "a refused request left memory mapped in the daemon";
    }
  }
}

}  // namespace
}  // namespace uroce::control
