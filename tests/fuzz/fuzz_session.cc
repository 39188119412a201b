// libFuzzer target for the session protocol, as a hostile local
// application speaks it: a real SessionServer (the one uroced runs) on a
// Unix socket, over an engine with no port. Each input is one connection:
// a valid HELLO first (unless the input's first byte says otherwise), then
// messages built from the input, each a type, a body of the input's bytes
// and, as the input chooses, descriptors passed with it (a sealed memfd, an
// unsealed one, a datagram socket, a pipe, two at once) or raw bytes with
// no header at all. Handles are small numbers, so requests reach the
// objects earlier ones made. The connection then closes.
//
// Asserted: the server survives every input; when the connection closes,
// its session is gone; and the process's open descriptors do not grow from
// input to input (every descriptor a request brought is closed, on every
// path). Built with -Dfuzz=true.
#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "control/node/sessions.h"
#include "stack/abi/fd_msg.h"
#include "stack/abi/session_proto.h"
#include "stack/abi/uroce_abi.h"
#include "stack/transport/engine.h"

namespace {

using namespace uroce;

[[noreturn]] void broken(const char* what) {
  std::fprintf(stderr, "fuzz_session: invariant broken: %s\n", what);
  std::abort();
}

/// Entries in /proc/self/fd, counted afresh on every call (procfs lists
/// the descriptor table as it is at the read). The directory stays open
/// from the first call on, rewound each time, so a count costs a seek and
/// the reads, not an open and close too; its own descriptor is in every
/// count alike, as the one a fresh opendir would hold was.
int open_fds() {
  static DIR* const d = ::opendir("/proc/self/fd");
  if (!d) return 0;
  ::rewinddir(d);
  int n = 0;
  while (::readdir(d)) ++n;
  return n;
}

struct Rig {
  boost::asio::io_context io;
  std::unique_ptr<transport::Engine> eng;
  std::unique_ptr<pipeline::Intake> intake;
  std::unique_ptr<control::SessionServer> srv;
  std::string path;
  int baseline_fds = -1;
  std::uint64_t inputs = 0;
  Rig() {
    transport::EngineConfig c;
    c.mac = {0x02, 0, 0, 0, 0, 0x0a};
    c.ip = wire::IpAddr::from_v4(10, 0, 0, 1);
    c.max_qps = 256;
    eng = std::make_unique<transport::Engine>(c);
    path = "/tmp/uroce-fuzz-session-" + std::to_string(::getpid()) + ".sock";
    control::SessionLimits lim;
    lim.max_qps = 16;
    lim.max_cqs = 16;
    lim.max_mrs = 16;
    lim.max_mr_bytes = 1 << 20;
    intake = std::make_unique<pipeline::Intake>(*eng);
    srv = std::make_unique<control::SessionServer>(io, path, 0600, *eng, *intake, lim);
  }
  /// The server's loop until it has nothing left to do (at most 4 passes):
  /// a Unix socket delivers at once, so one pass with work is the usual.
  /// io.poll() itself runs until the reactor has nothing ready (its last
  /// act is a zero-timeout epoll_wait after the handlers), so another pass
  /// is needed only when what ran after it (the server's step, the
  /// engine's transmit queue) did something: a pass whose only work was
  /// io.poll's would begin with a reactor that was just found idle, and
  /// nothing but step/engine (found idle too) could have made it busy.
  void turn() {
    for (int i = 0; i < 4; ++i) {
      (void)io.poll();
      std::size_t work = srv->step() + intake->run();
      eng->poll(1'000'000);
      work += eng->drain_tx([](const transport::TxFrame&) {});
      if (work == 0) break;
    }
  }
};

/// A descriptor of the kind `sel` asks for (-1: none); `owned` collects
/// what to close on our side after the send.
void make_fds(int sel, std::vector<int>& fds) {
  auto memfd = [](bool sealed) {
    const int fd = ::memfd_create("fuzz", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd >= 0 && ::ftruncate(fd, 65536) == 0 && sealed) (void)::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW);
    return fd;
  };
  switch (sel) {
    case 1: fds.push_back(memfd(true)); break;
    case 2: fds.push_back(memfd(false)); break;
    case 3: {
      int sv[2];
      if (::socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, sv) == 0) {
        fds.push_back(sv[0]);
        ::close(sv[1]);
      }
      break;
    }
    case 4: {
      int p[2];
      if (::pipe2(p, O_CLOEXEC) == 0) {
        fds.push_back(p[1]);
        ::close(p[0]);
      }
      break;
    }
    case 5:
      fds.push_back(memfd(true));
      fds.push_back(memfd(true));
      break;
    default: break;
  }
}

/// Reads whatever the server has answered, closing every descriptor it sent.
/// A stream recvmsg goes on from one queued reply to the next until the
/// buffer is full or the queue is empty, stopping early only after a reply
/// that carried descriptors; so a short read with none means the queue is
/// empty, and the read that would say EAGAIN is not needed.
void drain(int fd) {
  std::uint8_t buf[4096];
  for (;;) {
    bool fds = false;
    const ssize_t n = abi::recv_with_fds(fd, buf, sizeof buf, MSG_DONTWAIT, [&fds](int f) {
      fds = true;
      ::close(f);
    });
    if (n <= 0 || (static_cast<std::size_t>(n) < sizeof buf && !fds)) break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static Rig r;
  if (size == 0 || size > 8192) return 0;
  const int c = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::snprintf(a.sun_path, sizeof a.sun_path, "%s", r.path.c_str());
  if (c < 0 || ::connect(c, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) broken("cannot connect to the server");
  ::fcntl(c, F_SETFL, O_NONBLOCK);
  r.turn();
  std::uint32_t seq = 1;
  auto send_msg = [&](std::uint16_t type, const void* body, std::size_t len, const std::vector<int>& fds) {
    std::uint8_t buf[sizeof(uroce_msg_hdr) + 256];
    uroce_msg_hdr h{UROCE_MSG_MAGIC, UROCE_ABI_MAJOR, type, static_cast<std::uint32_t>(len), seq++};
    std::memcpy(buf, &h, sizeof h);
    std::memcpy(buf + sizeof h, body, len);
    (void)abi::send_with_fds(c, buf, sizeof h + len, fds.data(), fds.size());
  };
  std::size_t i = 0;
  if ((data[i++] & 1) == 0) {  // a proper hello first, so the fuzzer reaches the requests
    uroce_hello_msg hello{UROCE_ABI_MAJOR, UROCE_ABI_MINOR, static_cast<std::uint32_t>(::getpid())};
    send_msg(UROCE_MSG_HELLO, &hello, sizeof hello, {});
    r.turn();
    drain(c);
  }
  while (i + 2 <= size) {
    const std::uint8_t ctl = data[i++];
    const std::size_t blen = data[i++];
    std::uint8_t body[256] = {};
    const std::size_t have = std::min(blen, size - i);
    std::memcpy(body, data + i, have);
    i += have;
    const int sel = ctl >> 5;
    if (sel == 6) {
      (void)::send(c, body, blen, MSG_DONTWAIT | MSG_NOSIGNAL);  // no header: raw bytes
    } else {
      std::vector<int> fds;
      make_fds(sel, fds);
      send_msg(static_cast<std::uint16_t>(ctl & 31), body, blen, fds);
      for (int f : fds)
        if (f >= 0) ::close(f);  // ours; the server holds its own copies
    }
    r.turn();
    drain(c);
  }
  ::close(c);
  r.turn();
  if (r.srv->sessions() != 0) broken("a closed connection's session is still there");
  // Descriptors: the first inputs settle the baseline (the server's own,
  // libFuzzer's); after that, none may accumulate.
  const int now = open_fds();
  if (++r.inputs == 16) r.baseline_fds = now;
  if (r.baseline_fds >= 0 && now > r.baseline_fds + 8) broken("descriptors accumulate: one a request brought was not closed");
  return 0;
}
