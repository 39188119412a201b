#include "tools/traffic/app.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <random>
#include <sstream>

namespace uroce::traffic {

namespace {
constexpr unsigned kAccess = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
}  // namespace

using namespace transport;

namespace {

constexpr int kExchangeTimeoutMs = 5000;
constexpr std::uint32_t kDoneMagic = 0x444f4e45;    // "DONE"
constexpr std::uint32_t kResultMagic = 0x52534c54;  // "RSLT"
constexpr std::uint64_t kStaticId = 1'000'000;       // pattern ids of the server's READ region
constexpr std::uint64_t kSendId = 1ull << 40;         // pattern ids of SEND payloads

void set_nonblocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

const char* op_name(ibv_wr_opcode op) {
  switch (op) {
    case IBV_WR_SEND: return "send";
    case IBV_WR_RDMA_WRITE: return "write";
    case IBV_WR_RDMA_READ: return "read";
    case IBV_WR_ATOMIC_FETCH_AND_ADD: return "atomic";
    default: return "?";
  }
}

}  // namespace

bool parse_ops(const std::string& s, std::vector<ibv_wr_opcode>& out, std::string& err) {
  out.clear();
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item == "send") out.push_back(IBV_WR_SEND);
    else if (item == "write") out.push_back(IBV_WR_RDMA_WRITE);
    else if (item == "read") out.push_back(IBV_WR_RDMA_READ);
    else if (item == "atomic") out.push_back(IBV_WR_ATOMIC_FETCH_AND_ADD);
    else {
      err = "unknown operation '" + item + "' (send, write, read, atomic)";
      return false;
    }
  }
  if (out.empty()) {
    err = "no operations given";
    return false;
  }
  return true;
}

TrafficApp::TrafficApp(Engine& eng, pipeline::Dataplane& dp, const AppOptions& o)
    : eng_(eng), dp_(dp), o_(o) {
  state_ = o_.role == AppOptions::Role::kServer ? State::kListen : State::kConnecting;
  const std::size_t region = std::size_t{o_.depth} * o_.size;
  mem_.assign(3 * region + 64, 0);
  pd_ = eng_.alloc_pd();
  cq_ = eng_.create_cq(4 * o_.depth + 64);
  mr_ = eng_.reg_mr(pd_, mem_.data(), mem_.size(),
                    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                        IBV_ACCESS_REMOTE_ATOMIC);
  for (std::size_t i = 0; i < region; ++i) mem_[2 * region + i] = pattern(kStaticId + i / o_.size, i % o_.size);
  slots_.resize(o_.depth);
  psn_ = std::random_device{}() & 0xffffff;
  started_ = std::chrono::steady_clock::now();
  if (o_.role == AppOptions::Role::kServer && !open_listener()) fail("cannot listen on TCP port " + std::to_string(o_.port));
  deadline_ = std::chrono::steady_clock::now() + std::chrono::seconds(30);
}

TrafficApp::~TrafficApp() {
  if (fd_ >= 0) ::close(fd_);
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

bool TrafficApp::open_listener() {
  listen_fd_ = ::socket(AF_INET6, SOCK_STREAM, 0);
  if (listen_fd_ < 0) return false;
  int one = 1, zero = 0;
  ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  ::setsockopt(listen_fd_, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
  sockaddr_in6 a{};
  a.sin6_family = AF_INET6;
  a.sin6_port = htons(o_.port);
  a.sin6_addr = in6addr_any;
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(listen_fd_, 4) != 0) return false;
  set_nonblocking(listen_fd_);
  return true;
}

void TrafficApp::fail(const std::string& why) {
  failed_ = true;
  summary_ = "uroce-traffic FAILED: " + why;
  state_ = State::kDone;  // step() publishes done_ once everything is written
}

bool TrafficApp::exchange() {
  // Client speaks first, as perftest's client does.
  PeerInfo me;
  me.qpn = qp_->qpn;
  me.psn = psn_;
  me.gid = eng_.config().ip;
  me.rkey = mr_->rkey;
  me.va = reinterpret_cast<std::uint64_t>(mem_.data());
  me.len = mem_.size();
  me.mtu = mtu_bytes(o_.mtu);
  std::uint8_t out[kExchangeBytes], in[kExchangeBytes];
  encode(me, out);
  const bool client = o_.role == AppOptions::Role::kClient;
  std::string err;
  if (client && !send_all(fd_, out, sizeof out, kExchangeTimeoutMs)) return fail("exchange: send failed"), false;
  if (!recv_all(fd_, in, sizeof in, kExchangeTimeoutMs)) return fail("exchange: peer did not answer"), false;
  if (!decode(in, peer_, err)) return fail(err), false;
  if (!client && !send_all(fd_, out, sizeof out, kExchangeTimeoutMs)) return fail("exchange: send failed"), false;
  if (peer_.mtu != me.mtu) return fail("exchange: peer MTU " + std::to_string(peer_.mtu) + " differs from ours"), false;
  if (peer_.len < mem_.size())
    return fail("exchange: the peer's buffers (" + std::to_string(peer_.len) + " bytes) are smaller than ours (" +
                std::to_string(mem_.size()) + "): start both sides with the same --app-size and --app-depth"),
           false;
  return true;
}

bool TrafficApp::connect_qp() {
  abi::Connect k;
  k.access = kAccess;
  k.path_mtu = o_.mtu;
  k.dest_qp_num = peer_.qpn;
  k.rq_psn = peer_.psn;
  k.sq_psn = psn_;
  std::memcpy(k.dgid.raw, peer_.gid.b.data(), 16);
  k.max_rd_atomic = k.max_dest_rd_atomic = 16;
  k.timeout = o_.timeout;
  k.retry_cnt = o_.retry_cnt;
  k.rnr_retry = o_.rnr_retry;
  const ModifyResult r = eng_.bring_up(qp_, k);  // from INIT, where the exchange left it
  if (!r) return fail(std::string("RTR/RTS: ") + r.why), false;
  return true;
}

void TrafficApp::post_recvs() {
  for (std::uint32_t k = 0; k < o_.depth; ++k) {
    Sge s{reinterpret_cast<std::uint64_t>(mem_.data() + std::size_t{k} * o_.size), o_.size, mr_->lkey};
    eng_.post_recv(qp_, RecvWr{k, {&s, 1}});
  }
}

std::size_t TrafficApp::step(std::uint64_t now) {
  if (stop_requested_.exchange(false, std::memory_order_acq_rel)) shutdown();
  if (state_ == State::kDone) {
    done_.store(true, std::memory_order_release);
    return 0;
  }
  switch (state_) {
    case State::kListen: {
      const int fd = ::accept(listen_fd_, nullptr, nullptr);
      if (fd < 0) return 0;
      fd_ = fd;
      state_ = State::kExchange;
      return 1;
    }
    case State::kConnecting: {
      if (std::chrono::steady_clock::now() > deadline_) return fail("cannot reach the server's exchange at " + o_.peer_host), 0;
      addrinfo hints{}, *res = nullptr;
      hints.ai_socktype = SOCK_STREAM;
      if (::getaddrinfo(o_.peer_host.c_str(), std::to_string(o_.port).c_str(), &hints, &res) != 0 || !res)
        return fail("cannot resolve " + o_.peer_host), 0;
      const int fd = ::socket(res->ai_family, SOCK_STREAM, 0);
      const int rc = ::connect(fd, res->ai_addr, res->ai_addrlen);
      ::freeaddrinfo(res);
      if (rc != 0) {
        ::close(fd);
        ::usleep(20000);  // the server may not be up yet
        return 0;
      }
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      fd_ = fd;
      state_ = State::kExchange;
      return 1;
    }
    case State::kExchange: {
      QpInitAttr ia;
      ia.send_cq = ia.recv_cq = cq_;
      ia.cap.max_send_wr = 2 * o_.depth + 8;
      ia.cap.max_recv_wr = o_.depth + 8;
      qp_ = eng_.create_qp(pd_, ia);
      if (!qp_) return fail("cannot create a QP"), 0;
      if (o_.selective_repeat && eng_.set_selective_repeat(qp_, true) != 0) return fail("cannot set selective repeat"), 0;
      abi::Connect k;
      k.access = kAccess;
      const abi::Step init = abi::bring_up_steps(k)[0];  // the first step of the one bring-up
      if (!eng_.modify_qp(qp_, init.attr, init.mask)) return fail("INIT failed"), 0;
      if (!exchange()) return 0;
      if (o_.role == AppOptions::Role::kServer) post_recvs();
      state_ = State::kResolve;
      deadline_ = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      return 1;
    }
    case State::kResolve: {
      if (!eng_.neighbors().lookup(peer_.gid)) {
        const auto t = std::chrono::steady_clock::now();
        if (t > deadline_) return fail("no ARP/ND answer for " + peer_.gid.to_string()), 0;
        if (t - last_resolve_ > std::chrono::milliseconds(100)) {
          dp_.resolve(peer_.gid);
          last_resolve_ = t;
        }
        return 0;
      }
      if (!connect_qp()) return 0;
      started_ = std::chrono::steady_clock::now();
      state_ = State::kRun;
      return 1;
    }
    case State::kRun: return o_.role == AppOptions::Role::kClient ? run_client(now) : run_server();
    case State::kFinish: {
      // Deliver what the stop flushed: every outstanding WR completes (with
      // WR_FLUSH_ERR) before the app reports.
      ibv_wc wc[32];
      int n;
      while ((n = eng_.poll_cq(cq_, wc)) > 0)
        for (int i = 0; i < n; ++i) flushed_ += wc[i].status == IBV_WC_WR_FLUSH_ERR;
      finish();
      return 1;
    }
    case State::kDone: return 0;
  }
  return 0;
}

std::size_t TrafficApp::run_client(std::uint64_t /*now*/) {
  std::size_t work = 0;
  const std::size_t region = std::size_t{o_.depth} * o_.size;
  // Completions.
  ibv_wc wc[32];
  int n;
  while ((n = eng_.poll_cq(cq_, wc)) > 0) {
    for (int i = 0; i < n; ++i) {
      ++work;
      const std::uint32_t k = static_cast<std::uint32_t>(wc[i].wr_id >> 2);
      if (wc[i].status != IBV_WC_SUCCESS) {
        ++errors_;
        std::ostringstream m;
        m << op_name(slots_[k].op) << " message " << slots_[k].id << " completed with " << to_string(wc[i].status)
          << " after " << completed_ << " messages";
        fail(m.str());
        finish();
        return work;
      }
      Slot& s = slots_[k];
      if (--s.pending > 0) continue;
      std::uint8_t* local = mem_.data() + region + std::size_t{k} * o_.size;
      bool ok = true;
      switch (s.op) {
        case IBV_WR_RDMA_WRITE:
          for (std::uint32_t j = 0; j < o_.size && ok; ++j) ok = local[j] == pattern(s.id, j);
          break;
        case IBV_WR_RDMA_READ:
          for (std::uint32_t j = 0; j < o_.size && ok; ++j) ok = local[j] == pattern(kStaticId + k, j);
          break;
        case IBV_WR_ATOMIC_FETCH_AND_ADD: {
          std::uint64_t orig;
          std::memcpy(&orig, local, 8);
          ok = orig == s.expect;
          break;
        }
        default: break;
      }
      if (!ok) {
        ++errors_;
        fail(std::string(op_name(s.op)) + " message " + std::to_string(s.id) + ": data did not verify");
        finish();
        return work;
      }
      s.busy = false;
      ++completed_;
      sends_ok_ += s.op == IBV_WR_SEND ? 1 : 0;
      bytes_ += s.op == IBV_WR_ATOMIC_FETCH_AND_ADD ? 8 : o_.size;
    }
  }
  // New work.
  for (std::uint32_t k = 0; k < o_.depth && next_ < o_.messages; ++k) {
    Slot& s = slots_[k];
    if (s.busy) continue;
    const std::uint64_t id = next_++;
    const ibv_wr_opcode op = o_.ops[id % o_.ops.size()];
    s = Slot{true, op, id, 0, 1};
    std::uint8_t* src = mem_.data() + std::size_t{k} * o_.size;
    std::uint8_t* local = mem_.data() + region + std::size_t{k} * o_.size;
    Sge ssge{reinterpret_cast<std::uint64_t>(src), o_.size, mr_->lkey};
    Sge lsge{reinterpret_cast<std::uint64_t>(local), o_.size, mr_->lkey};
    SendWr wr;
    wr.wr_id = std::uint64_t{k} << 2;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.rkey = peer_.rkey;
    wr.opcode = op;
    switch (op) {
      case IBV_WR_SEND:
        // Bytes 0..7: the SEND's sequence number; the rest: its pattern. The
        // server checks both, so order and content are verified.
        for (std::uint32_t j = 0; j < o_.size; ++j) src[j] = pattern(kSendId + sends_, j);
        std::memcpy(src, &sends_, 8);
        ++sends_;
        wr.sg_list = {&ssge, 1};
        break;
      case IBV_WR_RDMA_WRITE: {
        for (std::uint32_t j = 0; j < o_.size; ++j) src[j] = pattern(id, j);
        std::memset(local, 0, o_.size);
        wr.sg_list = {&ssge, 1};
        wr.remote_addr = peer_.va + region + std::size_t{k} * o_.size;
        if (eng_.post_send(qp_, wr) != 0) return fail("post_send refused"), work;
        // Read it back, fenced, to check what landed.
        wr.opcode = IBV_WR_RDMA_READ;
        wr.send_flags |= IBV_SEND_FENCE;
        wr.sg_list = {&lsge, 1};
        wr.wr_id |= 1;
        s.pending = 2;
        break;
      }
      case IBV_WR_RDMA_READ:
        std::memset(local, 0, o_.size);
        wr.sg_list = {&lsge, 1};
        wr.remote_addr = peer_.va + 2 * region + std::size_t{k} * o_.size;
        break;
      case IBV_WR_ATOMIC_FETCH_AND_ADD:
        lsge.length = 8;
        wr.sg_list = {&lsge, 1};
        wr.remote_addr = peer_.va + 3 * region;
        wr.compare_add = 1;
        s.expect = atomics_++;
        break;
      default: break;
    }
    if (eng_.post_send(qp_, wr) != 0) return fail("post_send refused"), work;
    ++work;
  }
  if (completed_ == o_.messages) {
    // Ask the server what it verified.
    std::uint8_t msg[16];
    wire::be32 m = wire::be32::from(kDoneMagic);
    wire::be64 c = wire::be64::from(sends_);
    std::memcpy(msg, m.b, 4);
    std::memcpy(msg + 4, c.b, 8);
    std::memset(msg + 12, 0, 4);
    std::uint8_t in[24];
    if (!send_all(fd_, msg, sizeof msg, kExchangeTimeoutMs) || !recv_all(fd_, in, sizeof in, kExchangeTimeoutMs))
      return fail("the server did not report its result"), work;
    wire::be32 rm;
    wire::be64 ok, bad;
    std::memcpy(rm.b, in, 4);
    std::memcpy(ok.b, in + 4, 8);
    std::memcpy(bad.b, in + 12, 8);
    if (rm.get() != kResultMagic) return fail("bad result message from the server"), work;
    if (ok.get() != sends_ || bad.get() != 0)
      return fail("server verified " + std::to_string(ok.get()) + " of " + std::to_string(sends_) + " SENDs, " +
                  std::to_string(bad.get()) + " bad"),
             work;
    finish();
  }
  return work;
}

std::size_t TrafficApp::run_server() {
  std::size_t work = 0;
  ibv_wc wc[32];
  int n;
  while ((n = eng_.poll_cq(cq_, wc)) > 0) {
    for (int i = 0; i < n; ++i) {
      ++work;
      const std::uint32_t k = static_cast<std::uint32_t>(wc[i].wr_id);
      if (wc[i].status != IBV_WC_SUCCESS) {
        fail(std::string("receive completed with ") + to_string(wc[i].status));
        finish();
        return work;
      }
      const std::uint8_t* buf = mem_.data() + std::size_t{k} * o_.size;
      std::uint64_t sid;
      std::memcpy(&sid, buf, 8);
      bool ok = wc[i].byte_len == o_.size && sid == next_send_id_;
      for (std::uint32_t j = 8; j < o_.size && ok; ++j) ok = buf[j] == pattern(kSendId + sid, j);
      ++next_send_id_;
      if (ok) ++recv_ok_;
      else ++recv_bad_;
      Sge s{reinterpret_cast<std::uint64_t>(buf), o_.size, mr_->lkey};
      eng_.post_recv(qp_, RecvWr{k, {&s, 1}});
    }
  }
  // The client's "done": answer with what we verified.
  pollfd pfd{fd_, POLLIN, 0};
  if (::poll(&pfd, 1, 0) == 1) {
    std::uint8_t msg[16];
    if (!recv_all(fd_, msg, sizeof msg, kExchangeTimeoutMs)) {
      // The client went away: its QP is gone too.
      summary_ = "uroce-traffic: client disconnected after " + std::to_string(recv_ok_) + " SENDs";
      finish();
      return work;
    }
    std::uint8_t out[24];
    wire::be32 m = wire::be32::from(kResultMagic);
    wire::be64 ok = wire::be64::from(recv_ok_), bad = wire::be64::from(recv_bad_);
    std::memcpy(out, m.b, 4);
    std::memcpy(out + 4, ok.b, 8);
    std::memcpy(out + 12, bad.b, 8);
    std::memset(out + 20, 0, 4);
    send_all(fd_, out, sizeof out, kExchangeTimeoutMs);
    failed_ = recv_bad_ != 0;
    finish();
  }
  return work;
}

void TrafficApp::shutdown() {
  if (qp_ && qp_->state != IBV_QPS_ERR && qp_->state != IBV_QPS_RESET) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_ERR;
    eng_.modify_qp(qp_, a, IBV_QP_STATE);
  }
  if (state_ != State::kDone) {
    stopped_ = true;
    state_ = State::kFinish;
  }
}

void TrafficApp::finish() {
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
  std::ostringstream s;
  if (o_.role == AppOptions::Role::kClient) {
    const std::uint64_t retx = qp_ ? qp_->ctr[QpCounter::retransmitted_pkts] : 0;
    if (stopped_) s << "uroce-traffic: stopped by signal; " << flushed_ << " outstanding WRs flushed and delivered; ";
    else if (!failed_) s << "uroce-traffic: OK ";
    else s << summary_ << "\n  ";
    // Only a run that ends with the exchange has the server's word on its
    // SENDs; a stopped one reports what completed, and says it is unverified
    // (SENDs flushed by the stop were never delivered).
    if (stopped_) s << completed_ << " messages (" << sends_ok_ << " SENDs completed, not verified by the server: stopped before the final exchange), " << bytes_ << " bytes verified, ";
    else s << completed_ << " messages (" << (sends_) << " SENDs verified by the server), " << bytes_ << " bytes verified, ";
    s
      << retx << " retransmissions (" << (qp_ ? qp_->ctr[QpCounter::retransmitted_bytes] : 0) << " bytes), "
      << (qp_ ? qp_->ctr[QpCounter::timeouts] : 0) << " timeouts, " << secs << " s, "
      << (secs > 0 ? bytes_ / secs / 1e6 : 0) << " MB/s, " << (secs > 0 ? completed_ / secs : 0) << " msg/s";
  } else {
    if (!summary_.empty() && failed_) s << summary_ << "\n  ";
    if (qp_ != nullptr) {  // a client was being served
      ++clients_;
      total_ok_ += recv_ok_;
    }
    s << "uroce-traffic server: " << recv_ok_ << " SENDs verified, " << recv_bad_ << " bad";
    if (o_.forever) s << " (" << clients_ << " clients served, " << total_ok_ << " SENDs verified in all)";
    if (stopped_) s << "; stopped by signal, " << flushed_ << " posted receives flushed and delivered";
  }
  summary_ = s.str();
  state_ = State::kDone;
  const bool serve_again = o_.forever && o_.role == AppOptions::Role::kServer && !failed_ && !stopped_;
  if (!serve_again) done_.store(true, std::memory_order_release);
  if (serve_again) {
    // Ready for the next client.
    if (qp_) eng_.destroy_qp(qp_);
    qp_ = nullptr;
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    recv_ok_ = recv_bad_ = next_send_id_ = 0;
    state_ = State::kListen;
  }
}

}  // namespace uroce::traffic
