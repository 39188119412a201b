// The scenario runner: parses a script line by line and drives one engine.
// See runner.h for the model and README.md for the script format.
#include "tests/scenario/runner.h"

#include <algorithm>
#include <cctype>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <vector>

#include "stack/transport/engine.h"
#include "tools/pcap/decode.h"

namespace uroce::scenario {
namespace {

using namespace uroce::transport;
namespace w = uroce::wire;

// The fixed addressing of the DUT and of the scripted peer.
constexpr w::MacAddr kDutMac{0x02, 0, 0, 0, 0, 0x0a};
constexpr w::MacAddr kPeerMac{0x02, 0, 0, 0, 0, 0x0b};
const w::IpAddr kDutIp = w::IpAddr::from_v4(10, 0, 0, 1);
const w::IpAddr kPeerIp = w::IpAddr::from_v4(10, 0, 0, 2);

constexpr std::size_t kMemBytes = 4u << 20;
constexpr std::uint64_t kAutoMemStart = 1u << 20;  // below: for explicit off= and $mr targets
constexpr std::uint64_t kWaitStepNs = 1000;        // polls at least every microsecond during `wait`

/// Thrown by a command; the runner adds the file, line and command text.
struct Failure {
  std::string msg;
};

std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string format(const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return buf;
}

[[noreturn]] void fail(const std::string& msg) { throw Failure{msg}; }

std::string fmt_time(std::uint64_t ns) {
  if (ns % 1000 == 0) return format("%" PRIu64 "us", ns / 1000);
  return format("%" PRIu64 ".%03" PRIu64 "us", ns / 1000, ns % 1000);
}

/// "1048.576us", "2ms", "500ns", "1s" -> ns. The value must be exact in ns.
std::uint64_t parse_time(const std::string& s) {
  std::size_t i = 0;
  std::uint64_t whole = 0, frac = 0, frac_div = 1;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) whole = whole * 10 + (s[i++] - '0');
  if (i == 0) fail("bad time '" + s + "' (want e.g. 500us, 1.5ms)");
  if (i < s.size() && s[i] == '.') {
    ++i;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) {
      frac = frac * 10 + (s[i++] - '0');
      frac_div *= 10;
    }
  }
  const std::string unit = s.substr(i);
  std::uint64_t mult;
  if (unit == "ns") mult = 1;
  else if (unit == "us") mult = 1000;
  else if (unit == "ms") mult = 1000'000;
  else if (unit == "s") mult = 1000'000'000;
  else fail("bad time unit in '" + s + "' (ns, us, ms or s)");
  if ((frac * mult) % frac_div != 0) fail("time '" + s + "' is not a whole number of ns");
  return whole * mult + frac * mult / frac_div;
}

/// One command line: the command, an optional positional word, key=value
/// arguments (a bare word counts as key=1).
struct Line {
  int no = 0;
  std::string text;
  std::string cmd;
  std::string positional;
  std::map<std::string, std::string> kv;
  std::vector<std::string> order;  // keys in the order written
};

class Runner {
 public:
  explicit Runner(std::string name) : name_(std::move(name)) {}
  Outcome run(std::string_view text);

 private:
  void exec(const Line& l);
  // Commands.
  void cmd_engine(const Line& l);
  void cmd_qp(const Line& l);
  void cmd_post_send(const Line& l);
  void cmd_post_recv(const Line& l);
  void cmd_inject(const Line& l);
  void cmd_expect(const Line& l);
  void cmd_expect_none(const Line& l);
  void cmd_wait(const Line& l);
  void cmd_expect_wc(const Line& l);
  void cmd_expect_no_wc(const Line& l);
  void cmd_expect_state(const Line& l);
  void cmd_expect_counter(const Line& l);
  void cmd_mem(const Line& l, bool check);

  // Engine driving.
  void poll();
  void need_qp(const Line& l) const;
  std::string queued_frames() const;
  std::string pending_wcs();

  // Arguments.
  static void allow(const Line& l, std::initializer_list<const char*> keys);
  std::uint64_t value(const std::string& text) const;
  std::uint64_t num(const Line& l, const char* key, std::uint64_t def) const;
  std::optional<std::uint64_t> opt(const Line& l, const char* key) const;
  std::pair<wire::Psn, std::uint32_t> psn_range(const std::string& text) const;
  std::uint64_t alloc(std::uint64_t len);
  std::uint8_t* mem_at(std::uint64_t off, std::uint64_t len);

  struct Captured {
    std::vector<std::uint8_t> bytes;
    std::uint64_t t = 0;
  };

  std::string name_;
  EngineConfig cfg_;
  std::unique_ptr<Engine> eng_;
  Pd* pd_ = nullptr;
  Cq* cq_ = nullptr;
  Mr* mr_ = nullptr;
  Qp* qp_ = nullptr;
  std::uint32_t peer_qpn_ = 0x99;
  std::vector<std::uint8_t> mem_;
  std::uint64_t next_auto_ = kAutoMemStart;
  std::uint64_t now_ = 0;
  std::deque<Captured> frames_;   // emitted by the DUT, not yet expected
  std::deque<ibv_wc> wcs_;        // polled from the CQ, not yet expected
  bool last_was_inject_ = false;
};

// ------------------------------------------------------------------ parsing

std::vector<Line> parse(std::string_view text, std::string* disabled) {
  std::vector<Line> out;
  std::istringstream in{std::string(text)};
  std::string raw;
  int no = 0;
  while (std::getline(in, raw)) {
    ++no;
    const auto hash = raw.find('#');
    if (hash != std::string::npos) {
      // `# DISABLED: reason` before the first command disables the script.
      const std::string comment = raw.substr(hash + 1);
      const auto p = comment.find_first_not_of(' ');
      if (out.empty() && p != std::string::npos && comment.compare(p, 9, "DISABLED:") == 0) {
        const auto r = comment.find_first_not_of(' ', p + 9);
        *disabled = r == std::string::npos ? "disabled" : comment.substr(r);
      }
      raw.resize(hash);
    }
    std::istringstream words(raw);
    std::string word;
    Line l;
    l.no = no;
    while (words >> word) {
      if (l.cmd.empty()) {
        l.cmd = word;
        continue;
      }
      const auto eq = word.find('=');
      if (eq == std::string::npos && l.positional.empty() && l.kv.empty()) {
        l.positional = word;
        continue;
      }
      const std::string key = eq == std::string::npos ? word : word.substr(0, eq);
      l.kv[key] = eq == std::string::npos ? "1" : word.substr(eq + 1);
      l.order.push_back(key);
    }
    if (l.cmd.empty()) continue;
    // The command as written, without the comment and extra blanks.
    std::istringstream again(raw);
    while (again >> word) l.text += (l.text.empty() ? "" : " ") + word;
    out.push_back(std::move(l));
  }
  return out;
}

void Runner::allow(const Line& l, std::initializer_list<const char*> keys) {
  for (const auto& [k, v] : l.kv) {
    bool ok = false;
    for (const char* a : keys) ok = ok || k == a;
    if (!ok) {
      std::string list;
      for (const char* a : keys) list += std::string(list.empty() ? "" : ", ") + a;
      fail("unknown argument '" + k + "' for " + l.cmd + " (allowed: " + (list.empty() ? "none" : list) + ")");
    }
  }
}

/// A number (decimal or 0x hex) or a symbol ($mr, $rkey, $lkey, $qpn,
/// $peer), or a sum/difference of them: "$mr+0x400".
std::uint64_t Runner::value(const std::string& text) const {
  std::uint64_t total = 0;
  std::size_t i = 0;
  bool neg = false;
  if (text.empty()) fail("empty value");
  while (i <= text.size()) {
    std::size_t j = i;
    while (j < text.size() && text[j] != '+' && text[j] != '-') ++j;
    const std::string term = text.substr(i, j - i);
    std::uint64_t v = 0;
    if (term.empty()) fail("bad value '" + text + "'");
    if (term[0] == '$') {
      if (term == "$qpn" || term == "$peer") {
        if (term == "$peer") v = peer_qpn_;
        else if (qp_) v = qp_->qpn;
        else fail("$qpn before the qp line");
      } else {
        if (mr_ == nullptr) fail(term + " before the qp line");
        if (term == "$mr") v = mr_->iova;
        else if (term == "$rkey") v = mr_->rkey;
        else if (term == "$lkey") v = mr_->lkey;
        else fail("unknown symbol '" + term + "' ($mr, $rkey, $lkey, $qpn, $peer)");
      }
    } else {
      const bool hex = term.size() > 2 && term[0] == '0' && (term[1] == 'x' || term[1] == 'X');
      const std::string digits = hex ? term.substr(2) : term;
      if (digits.empty()) fail("bad number '" + term + "'");
      for (char c : digits) {
        const int d = std::isdigit(static_cast<unsigned char>(c)) ? c - '0'
                      : hex && std::isxdigit(static_cast<unsigned char>(c))
                          ? std::tolower(static_cast<unsigned char>(c)) - 'a' + 10
                          : -1;
        if (d < 0) fail("bad number '" + term + "'");
        v = v * (hex ? 16 : 10) + static_cast<std::uint64_t>(d);
      }
    }
    total = neg ? total - v : total + v;
    if (j >= text.size()) break;
    neg = text[j] == '-';
    i = j + 1;
  }
  return total;
}

std::optional<std::uint64_t> Runner::opt(const Line& l, const char* key) const {
  auto it = l.kv.find(key);
  if (it == l.kv.end()) return std::nullopt;
  return value(it->second);
}

std::uint64_t Runner::num(const Line& l, const char* key, std::uint64_t def) const {
  return opt(l, key).value_or(def);
}

std::uint64_t Runner::alloc(std::uint64_t len) {
  const std::uint64_t off = next_auto_;
  next_auto_ += (std::max<std::uint64_t>(len, 1) + 63) & ~std::uint64_t{63};
  if (next_auto_ > kMemBytes) fail("out of DUT memory for buffers");
  return off;
}

std::uint8_t* Runner::mem_at(std::uint64_t off, std::uint64_t len) {
  if (mem_.empty()) fail("no DUT memory before the qp line");
  if (off > kMemBytes || len > kMemBytes - off) fail(format("off=0x%" PRIx64 " len=%" PRIu64 " outside DUT memory", off, len));
  return mem_.data() + off;
}

// ------------------------------------------------------------ engine driving

void Runner::poll() {
  if (!eng_) return;
  eng_->poll(now_);
  eng_->drain_tx([&](const TxFrame& f) {
    Captured c;
    c.bytes.resize(f.size());
    f.copy_to(c.bytes);
    c.t = now_;
    frames_.push_back(std::move(c));
  });
  if (cq_) {
    ibv_wc wc[16];
    int n;
    while ((n = eng_->poll_cq(cq_, wc)) > 0) wcs_.insert(wcs_.end(), wc, wc + n);
  }
}

void Runner::need_qp(const Line& l) const {
  if (qp_ == nullptr) fail(l.cmd + " before the qp line");
}

std::string describe_bytes(const std::vector<std::uint8_t>& b) {
  w::Packet pkt;
  const w::ParseStatus st = w::parse_frame(b, w::ParseOptions{}, pkt);
  if (!st.ok()) return "unparseable frame (" + st.to_string() + ")";
  return tools::describe(pkt) + format(" [psn=0x%x]", pkt.psn.value());
}

std::string Runner::queued_frames() const {
  std::string s;
  for (const Captured& c : frames_) s += "\n    t=" + fmt_time(c.t) + ": " + describe_bytes(c.bytes);
  return s;
}

const std::map<std::string, ibv_wc_opcode>& wc_opcodes() {
  static const std::map<std::string, ibv_wc_opcode> kOps = {
      {"SEND", IBV_WC_SEND},           {"RDMA_WRITE", IBV_WC_RDMA_WRITE}, {"RDMA_READ", IBV_WC_RDMA_READ},
      {"COMP_SWAP", IBV_WC_COMP_SWAP}, {"FETCH_ADD", IBV_WC_FETCH_ADD},   {"RECV", IBV_WC_RECV},
      {"RECV_RDMA_WITH_IMM", IBV_WC_RECV_RDMA_WITH_IMM}};
  return kOps;
}

std::string wc_opcode_name(ibv_wc_opcode op) {
  for (const auto& [name, v] : wc_opcodes())
    if (v == op) return name;
  return std::to_string(static_cast<int>(op));
}

std::string wc_text(const ibv_wc& wc) {
  std::string flags;
  if (wc.wc_flags & IBV_WC_GRH) flags += "GRH|";
  if (wc.wc_flags & IBV_WC_WITH_IMM) flags += "IMM|";
  if (wc.wc_flags & IBV_WC_WITH_INV) flags += "INV|";
  flags = flags.empty() ? "0" : flags.substr(0, flags.size() - 1);
  std::string s = format("wc status=%s opcode=%s wr_id=%" PRIu64 " byte_len=%u flags=%s qp=0x%x src_qp=0x%x",
                         to_string(wc.status), wc_opcode_name(wc.opcode).c_str(), wc.wr_id, wc.byte_len, flags.c_str(),
                         wc.qp_num, wc.src_qp);
  if (wc.wc_flags & IBV_WC_WITH_IMM) s += format(" imm=0x%08x", __builtin_bswap32(wc.imm_data));
  return s;
}

std::string Runner::pending_wcs() {
  std::string s;
  for (const ibv_wc& wc : wcs_) s += "\n    " + wc_text(wc);
  return s;
}

// ------------------------------------------------------------------ commands

Outcome Runner::run(std::string_view text) {
  std::string disabled;
  const std::vector<Line> lines = parse(text, &disabled);
  if (!disabled.empty()) return {Outcome::Kind::kSkip, name_ + ": DISABLED: " + disabled};
  const Line* cur = nullptr;
  try {
    for (const Line& l : lines) {
      cur = &l;
      exec(l);
    }
    cur = nullptr;
    // At the end, nothing may be left unexpected.
    poll();
    if (!frames_.empty()) fail("end of script: the DUT sent frames the script did not expect:" + queued_frames());
    if (!wcs_.empty()) fail("end of script: completions the script did not expect:" + pending_wcs());
  } catch (const Failure& f) {
    std::string where = cur ? format("%s:%d: %s", name_.c_str(), cur->no, cur->text.c_str()) : name_ + ": (end)";
    return {Outcome::Kind::kFail, where + "\n  " + f.msg + format("\n  (virtual time %s)", fmt_time(now_).c_str())};
  }
  return {};
}

void Runner::exec(const Line& line) {
  // Only these commands take a leading word; elsewhere a bare word is a flag.
  static const std::set<std::string> kPositional = {"qp", "inject", "expect", "wait", "expect_state"};
  Line l = line;
  if (!l.positional.empty() && !kPositional.contains(l.cmd)) {
    l.kv[l.positional] = "1";
    l.order.insert(l.order.begin(), l.positional);
    l.positional.clear();
  }
  // The DUT runs its loop (one poll at the current time) before every
  // command, except between consecutive injects: those form one receive
  // burst, as a driver's rx burst would.
  const bool inject = l.cmd == "inject";
  if (!(inject && last_was_inject_)) poll();
  last_was_inject_ = inject;
  if (l.cmd == "engine") cmd_engine(l);
  else if (l.cmd == "qp") cmd_qp(l);
  else if (l.cmd == "post_send") cmd_post_send(l);
  else if (l.cmd == "post_recv") cmd_post_recv(l);
  else if (l.cmd == "inject") cmd_inject(l);
  else if (l.cmd == "expect") cmd_expect(l);
  else if (l.cmd == "expect_none") cmd_expect_none(l);
  else if (l.cmd == "wait") cmd_wait(l);
  else if (l.cmd == "expect_wc") cmd_expect_wc(l);
  else if (l.cmd == "expect_no_wc") cmd_expect_no_wc(l);
  else if (l.cmd == "expect_state") cmd_expect_state(l);
  else if (l.cmd == "expect_counter") cmd_expect_counter(l);
  else if (l.cmd == "mem") cmd_mem(l, false);
  else if (l.cmd == "expect_mem") cmd_mem(l, true);
  else fail("unknown command '" + l.cmd + "'");
}

void Runner::cmd_engine(const Line& l) {
  allow(l, {"ackreq_every", "send_window", "tx_ring"});
  if (eng_) fail("engine must come before the qp line");
  cfg_.ackreq_every = static_cast<std::uint32_t>(num(l, "ackreq_every", cfg_.ackreq_every));
  cfg_.send_window = static_cast<std::uint32_t>(num(l, "send_window", cfg_.send_window));
  cfg_.tx_ring = static_cast<std::uint32_t>(num(l, "tx_ring", cfg_.tx_ring));
}

ibv_mtu mtu_enum(std::uint64_t bytes) {
  switch (bytes) {
    case 256: return IBV_MTU_256;
    case 512: return IBV_MTU_512;
    case 1024: return IBV_MTU_1024;
    case 2048: return IBV_MTU_2048;
    case 4096: return IBV_MTU_4096;
    default: fail(format("mtu=%" PRIu64 ": want 256, 512, 1024, 2048 or 4096", bytes));
  }
}

void Runner::cmd_qp(const Line& l) {
  allow(l, {"mtu", "sq_psn", "rq_psn", "timeout", "retry_cnt", "rnr_retry", "min_rnr_timer", "rd_atomic", "qkey",
            "peer", "sig_all", "access"});
  if (qp_) fail("only one qp per script");
  ibv_qp_type type;
  if (l.positional == "rc") type = IBV_QPT_RC;
  else if (l.positional == "uc") type = IBV_QPT_UC;
  else if (l.positional == "ud") type = IBV_QPT_UD;
  else fail("qp wants a type first: rc, uc or ud");
  peer_qpn_ = static_cast<std::uint32_t>(num(l, "peer", 0x99));

  cfg_.mac = kDutMac;
  cfg_.ip = kDutIp;
  cfg_.max_qps = 4;
  eng_ = std::make_unique<Engine>(cfg_);
  eng_->set_neighbor(kPeerIp, kPeerMac);
  pd_ = eng_->alloc_pd();
  cq_ = eng_->create_cq(4096);
  mem_.assign(kMemBytes, 0);
  const unsigned all = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                       IBV_ACCESS_REMOTE_ATOMIC;
  mr_ = eng_->reg_mr(pd_, mem_.data(), mem_.size(), all);
  QpInitAttr ia;
  ia.qp_type = type;
  ia.send_cq = ia.recv_cq = cq_;
  ia.sq_sig_all = num(l, "sig_all", 0) != 0;
  Qp* q = eng_->create_qp(pd_, ia);
  if (q == nullptr) fail("create_qp failed");

  abi::Connect k;
  k.type = type;
  k.access = static_cast<unsigned>(num(l, "access", all));
  k.qkey = static_cast<std::uint32_t>(num(l, "qkey", 0x11111111));
  k.path_mtu = mtu_enum(num(l, "mtu", 1024));
  k.dest_qp_num = peer_qpn_;
  k.rq_psn = static_cast<std::uint32_t>(num(l, "rq_psn", 0x200));
  k.sq_psn = static_cast<std::uint32_t>(num(l, "sq_psn", 0x100));
  k.max_rd_atomic = k.max_dest_rd_atomic = static_cast<std::uint8_t>(num(l, "rd_atomic", 4));
  k.min_rnr_timer = static_cast<std::uint8_t>(num(l, "min_rnr_timer", 1));
  k.timeout = static_cast<std::uint8_t>(num(l, "timeout", 8));
  k.retry_cnt = static_cast<std::uint8_t>(num(l, "retry_cnt", 7));
  k.rnr_retry = static_cast<std::uint8_t>(num(l, "rnr_retry", 7));
  std::memcpy(k.dgid.raw, kPeerIp.b.data(), 16);
  if (const ModifyResult r = eng_->bring_up(q, k); !r) fail(format("bringing the QP up failed: %s", r.why));
  qp_ = q;
}

void Runner::cmd_post_send(const Line& l) {
  need_qp(l);
  allow(l, {"op", "len", "off", "fill", "wr_id", "signaled", "solicited", "fence", "inline", "imm", "inv_rkey",
            "raddr", "rkey", "add", "cmp", "swap", "dqpn", "qkey"});
  static const std::map<std::string, ibv_wr_opcode> kOps = {
      {"SEND", IBV_WR_SEND},       {"SEND_IMM", IBV_WR_SEND_WITH_IMM},   {"SEND_INV", IBV_WR_SEND_WITH_INV},
      {"WRITE", IBV_WR_RDMA_WRITE}, {"WRITE_IMM", IBV_WR_RDMA_WRITE_WITH_IMM}, {"READ", IBV_WR_RDMA_READ},
      {"CMP_SWAP", IBV_WR_ATOMIC_CMP_AND_SWP}, {"FETCH_ADD", IBV_WR_ATOMIC_FETCH_AND_ADD}};
  auto it = l.kv.find("op");
  if (it == l.kv.end() || !kOps.contains(it->second))
    fail("post_send wants op=SEND|SEND_IMM|SEND_INV|WRITE|WRITE_IMM|READ|CMP_SWAP|FETCH_ADD");
  SendWr wr;
  wr.opcode = kOps.at(it->second);
  const bool atomic = wr.opcode == IBV_WR_ATOMIC_CMP_AND_SWP || wr.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD;
  const std::uint64_t len = num(l, "len", atomic ? 8 : 0);
  const std::uint64_t off = l.kv.contains("off") ? num(l, "off", 0) : alloc(len);
  std::uint8_t* p = mem_at(off, len);
  if (auto fill = opt(l, "fill")) std::memset(p, static_cast<int>(*fill), len);
  Sge sge{reinterpret_cast<std::uint64_t>(p), static_cast<std::uint32_t>(len), mr_->lkey};
  wr.sg_list = {&sge, len ? 1u : 0u};
  wr.wr_id = num(l, "wr_id", 0);
  if (num(l, "signaled", 0)) wr.send_flags |= IBV_SEND_SIGNALED;
  if (num(l, "solicited", 0)) wr.send_flags |= IBV_SEND_SOLICITED;
  if (num(l, "fence", 0)) wr.send_flags |= IBV_SEND_FENCE;
  if (num(l, "inline", 0)) wr.send_flags |= IBV_SEND_INLINE;
  wr.imm_data = static_cast<std::uint32_t>(num(l, "imm", 0));
  wr.invalidate_rkey = static_cast<std::uint32_t>(num(l, "inv_rkey", 0));
  wr.remote_addr = num(l, "raddr", 0);
  wr.rkey = static_cast<std::uint32_t>(num(l, "rkey", 0));
  wr.compare_add = wr.opcode == IBV_WR_ATOMIC_CMP_AND_SWP ? num(l, "cmp", 0) : num(l, "add", 0);
  wr.swap = num(l, "swap", 0);
  Ah ah{kPeerIp, kPeerMac, 0};
  if (qp_->type == IBV_QPT_UD) {
    wr.ah = &ah;
    wr.remote_qpn = static_cast<std::uint32_t>(num(l, "dqpn", peer_qpn_));
    wr.remote_qkey = static_cast<std::uint32_t>(num(l, "qkey", qp_->qkey));
  }
  const int err = eng_->post_send(qp_, wr);
  if (err) fail(format("post_send returned %d (%s)", err, std::strerror(err)));
}

void Runner::cmd_post_recv(const Line& l) {
  need_qp(l);
  allow(l, {"len", "off", "wr_id"});
  const std::uint64_t len = num(l, "len", 4096);
  const std::uint64_t off = l.kv.contains("off") ? num(l, "off", 0) : alloc(len);
  Sge sge{reinterpret_cast<std::uint64_t>(mem_at(off, len)), static_cast<std::uint32_t>(len), mr_->lkey};
  const int err = eng_->post_recv(qp_, RecvWr{num(l, "wr_id", 0), {&sge, 1}});
  if (err) fail(format("post_recv returned %d (%s)", err, std::strerror(err)));
}

// ------------------------------------------------------------ frame fields

std::uint8_t opcode_by_name(const std::string& name) {
  for (unsigned i = 0; i < 256; ++i)
    if (w::kOpcodeTable[i].valid() && w::kOpcodeTable[i].name == name) return static_cast<std::uint8_t>(i);
  fail("unknown opcode '" + name + "' (use the names of wire/opcode.h, e.g. RC_SEND_FIRST, RC_ACKNOWLEDGE)");
}

/// "0x100" or "0x100..0x103" (inclusive, may cross the 2^24 wrap).
std::pair<w::Psn, std::uint32_t> Runner::psn_range(const std::string& text) const {
  const auto dots = text.find("..");
  const w::Psn first(value(text.substr(0, dots)));
  if (dots == std::string::npos) return {first, 1};
  const w::Psn last(value(text.substr(dots + 2)));
  const std::int32_t n = distance(first, last);
  if (n < 0 || n > 4096) fail("bad PSN range '" + text + "'");
  return {first, static_cast<std::uint32_t>(n) + 1};
}

/// The frame fields a script can name, read from a parsed packet. nullopt:
/// the packet does not carry the header that holds the field.
std::optional<std::uint64_t> field_of(const w::Packet& p, const std::string& key) {
  if (key == "psn") return p.psn.value();
  if (key == "ackreq") return p.ackreq;
  if (key == "se") return p.se;
  if (key == "dqp") return p.destqp;
  if (key == "len") return p.payload_len;
  if (key == "ecn") return p.ecn;
  if (key == "syndrome" || key == "msn") {
    if (!p.aeth()) return std::nullopt;
    return key == "syndrome" ? std::uint64_t{p.aeth()->syndrome} : std::uint64_t{p.aeth()->msn.get()};
  }
  if (key == "va" || key == "rkey") {
    if (p.reth()) return key == "va" ? p.reth()->va.get() : std::uint64_t{p.reth()->rkey.get()};
    if (p.atomic_eth()) return key == "va" ? p.atomic_eth()->va.get() : std::uint64_t{p.atomic_eth()->rkey.get()};
    return std::nullopt;
  }
  if (key == "dmalen") return p.reth() ? std::optional<std::uint64_t>(p.reth()->dma_len.get()) : std::nullopt;
  if (key == "swap" || key == "add")
    return p.atomic_eth() ? std::optional<std::uint64_t>(p.atomic_eth()->swap_add.get()) : std::nullopt;
  if (key == "cmp") return p.atomic_eth() ? std::optional<std::uint64_t>(p.atomic_eth()->compare.get()) : std::nullopt;
  if (key == "orig") return p.atomic_ack() ? std::optional<std::uint64_t>(p.atomic_ack()->orig.get()) : std::nullopt;
  if (key == "imm") return p.immdt() ? std::optional<std::uint64_t>(p.immdt()->imm.get()) : std::nullopt;
  if (key == "inv_rkey") return p.ieth() ? std::optional<std::uint64_t>(p.ieth()->rkey.get()) : std::nullopt;
  if (key == "qkey" || key == "sqp") {
    if (!p.deth()) return std::nullopt;
    return key == "qkey" ? std::uint64_t{p.deth()->qkey.get()} : std::uint64_t{p.deth()->src_qp.get()};
  }
  fail("unknown frame field '" + key + "'");
}

#define FRAME_FIELDS                                                                                              \
  "psn", "ackreq", "se", "dqp", "len", "ecn", "syndrome", "msn", "va", "rkey", "dmalen", "swap", "add", "cmp", \
      "orig", "imm", "inv_rkey", "qkey", "sqp", "fill"

/// An IPv4 address given as a 32-bit number (0x0a000002 is 10.0.0.2).
w::IpAddr ipv4_of(std::uint64_t v) {
  if (v > 0xffffffffull) fail("an IPv4 address is a 32-bit number");
  return w::IpAddr::from_v4(static_cast<std::uint8_t>(v >> 24), static_cast<std::uint8_t>(v >> 16),
                            static_cast<std::uint8_t>(v >> 8), static_cast<std::uint8_t>(v));
}

void Runner::cmd_inject(const Line& l) {
  need_qp(l);
  allow(l, {FRAME_FIELDS, "pkey", "src_ip", "dst_ip"});
  const std::uint8_t opc = opcode_by_name(l.positional);
  if (!l.kv.contains("psn")) fail("inject needs psn=");
  const auto [first, count] = psn_range(l.kv.at("psn"));
  for (std::uint32_t i = 0; i < count; ++i) {
    w::FrameSpec s;
    s.eth_dst = kDutMac;
    s.eth_src = kPeerMac;
    s.src = l.kv.contains("src_ip") ? ipv4_of(num(l, "src_ip", 0)) : kPeerIp;
    s.dst = l.kv.contains("dst_ip") ? ipv4_of(num(l, "dst_ip", 0)) : kDutIp;
    s.pkey = static_cast<std::uint16_t>(num(l, "pkey", 0xffff));
    s.udp_sport = w::udp_sport_for(peer_qpn_, qp_->qpn);
    s.opcode = opc;
    s.psn = first + i;
    s.destqp = static_cast<std::uint32_t>(num(l, "dqp", qp_->qpn));
    s.ackreq = num(l, "ackreq", 0) != 0;
    s.se = num(l, "se", 0) != 0;
    s.ecn = static_cast<std::uint8_t>(num(l, "ecn", 0));
    w::ExtFields& e = s.ext;
    e.reth_va = e.atomic_va = num(l, "va", 0);
    e.reth_rkey = e.atomic_rkey = static_cast<std::uint32_t>(num(l, "rkey", 0));
    e.reth_len = static_cast<std::uint32_t>(num(l, "dmalen", 0));
    e.atomic_swap_add = l.kv.contains("add") ? num(l, "add", 0) : num(l, "swap", 0);
    e.atomic_compare = num(l, "cmp", 0);
    e.aeth_syndrome = static_cast<std::uint8_t>(num(l, "syndrome", 0x1f));
    e.aeth_msn = static_cast<std::uint32_t>(num(l, "msn", 0));
    e.atomic_ack_orig = num(l, "orig", 0);
    e.imm = static_cast<std::uint32_t>(num(l, "imm", 0));
    e.ieth_rkey = static_cast<std::uint32_t>(num(l, "inv_rkey", 0));
    e.deth_qkey = static_cast<std::uint32_t>(num(l, "qkey", qp_->qkey));
    e.deth_src_qp = static_cast<std::uint32_t>(num(l, "sqp", peer_qpn_));
    // Payload: fill= bytes, by default the low byte of the PSN.
    std::vector<std::uint8_t> payload(num(l, "len", 0), static_cast<std::uint8_t>(num(l, "fill", s.psn.value())));
    std::vector<std::uint8_t> frame(payload.size() + 256);
    const std::size_t n = w::build_frame(frame, s, payload);
    if (n == 0) fail("cannot build this frame (payload on an opcode without one?)");
    frame.resize(n);
    eng_->rx(frame, now_);
  }
}

void Runner::cmd_expect(const Line& l) {
  need_qp(l);
  allow(l, {FRAME_FIELDS, "at"});
  const std::uint8_t opc = opcode_by_name(l.positional);
  if (!l.kv.contains("psn")) fail("expect needs psn=");
  const auto [first, count] = psn_range(l.kv.at("psn"));
  const bool ud = qp_->type == IBV_QPT_UD;
  for (std::uint32_t i = 0; i < count; ++i) {
    const w::Psn psn = first + i;
    // What we wait for, as text: the opcode, the PSN, then the other fields.
    std::string want = l.positional + format(" psn=0x%x", psn.value());
    for (const std::string& k : l.order)
      if (k != "psn") want += " " + k + "=" + l.kv.at(k);
    if (frames_.empty()) fail("expected " + want + "\n  but the DUT sent nothing");
    const Captured c = std::move(frames_.front());
    frames_.pop_front();
    w::Packet p;
    const w::ParseStatus st = w::parse_frame(c.bytes, w::ParseOptions{}, p);
    if (!st.ok()) fail("expected " + want + "\n  but the DUT sent a frame that does not parse: " + st.to_string());
    std::vector<std::string> bad;
    if (p.opcode != opc) bad.push_back("opcode");
    // Addressing is always checked: the DUT must talk to its peer.
    if (p.eth_src != kDutMac || (!ud && p.eth_dst != kPeerMac)) bad.push_back("MAC addresses");
    if (!(p.src == kDutIp) || (!ud && !(p.dst == kPeerIp))) bad.push_back("IP addresses");
    if (!l.kv.contains("dqp") && !ud && p.destqp != peer_qpn_) bad.push_back(format("dqp (want 0x%x)", peer_qpn_));
    if (p.psn != psn) bad.push_back("psn");
    for (const std::string& k : l.order) {
      const std::string& v = l.kv.at(k);
      if (k == "psn") continue;
      if (k == "at") {
        if (c.t != parse_time(v)) bad.push_back("at (sent at " + fmt_time(c.t) + ")");
        continue;
      }
      if (k == "fill") {
        const auto want_byte = static_cast<std::uint8_t>(value(v));
        bool ok = true;
        for (std::uint8_t b : p.payload()) ok = ok && b == want_byte;
        if (!ok) bad.push_back("fill (payload bytes)");
        continue;
      }
      const std::optional<std::uint64_t> got = field_of(p, k);
      if (!got) bad.push_back(k + " (the frame has no header carrying it)");
      else if (*got != value(v)) bad.push_back(format("%s (saw 0x%" PRIx64 ")", k.c_str(), *got));
    }
    if (!bad.empty()) {
      std::string why;
      for (const auto& b : bad) why += (why.empty() ? "" : ", ") + b;
      fail("expected " + want + "\n  seen     t=" + fmt_time(c.t) + ": " + describe_bytes(c.bytes) +
           "\n  mismatch: " + why + (frames_.empty() ? "" : "\n  queued after it:" + queued_frames()));
    }
  }
}

void Runner::cmd_expect_none(const Line& l) {
  allow(l, {});
  if (!frames_.empty()) fail("expected no frame from the DUT, but it sent:" + queued_frames());
}

void Runner::cmd_wait(const Line& l) {
  allow(l, {});
  if (l.positional.empty()) fail("wait wants a duration, e.g. wait 500us");
  const std::uint64_t target = now_ + parse_time(l.positional);
  // Poll at least every microsecond, and exactly at each timer deadline, so
  // a timer fires at the time it is due (to the ns).
  while (now_ < target) {
    std::uint64_t next = std::min(target, now_ + kWaitStepNs);
    if (eng_) {
      const std::uint64_t d = eng_->next_deadline();
      if (d > now_ && d < next) next = d;
    }
    now_ = next;
    poll();
  }
}

// ------------------------------------------------------------- completions

void Runner::cmd_expect_wc(const Line& l) {
  need_qp(l);
  allow(l, {"status", "opcode", "wr_id", "byte_len", "imm", "flags", "src_qp", "qp"});
  if (wcs_.empty()) fail("expected a completion, but the CQ is empty");
  const ibv_wc wc = wcs_.front();
  wcs_.pop_front();
  std::vector<std::string> bad;
  for (const std::string& k : l.order) {
    const std::string& v = l.kv.at(k);
    if (k == "status") {
      int s = -1;
      for (int i = 0; i <= IBV_WC_GENERAL_ERR && s < 0; ++i)
        if (v == to_string(static_cast<ibv_wc_status>(i))) s = i;
      if (s < 0) fail("unknown status '" + v + "' (SUCCESS, RETRY_EXC_ERR, WR_FLUSH_ERR, ...)");
      if (static_cast<int>(wc.status) != s) bad.push_back("status");
    } else if (k == "opcode") {
      const auto& kOps = wc_opcodes();
      if (!kOps.contains(v)) fail("unknown wc opcode '" + v + "'");
      if (wc.opcode != kOps.at(v)) bad.push_back("opcode");
    } else if (k == "flags") {
      unsigned want = 0;
      std::string rest = v;
      while (!rest.empty() && rest != "0") {
        const auto bar = rest.find('|');
        const std::string f = rest.substr(0, bar);
        if (f == "GRH") want |= IBV_WC_GRH;
        else if (f == "IMM") want |= IBV_WC_WITH_IMM;
        else if (f == "INV") want |= IBV_WC_WITH_INV;
        else fail("unknown wc flag '" + f + "' (GRH, IMM, INV, or 0)");
        rest = bar == std::string::npos ? "" : rest.substr(bar + 1);
      }
      if (wc.wc_flags != want) bad.push_back("flags");
    } else {
      std::uint64_t got = 0;
      if (k == "wr_id") got = wc.wr_id;
      else if (k == "byte_len") got = wc.byte_len;
      else if (k == "imm") got = __builtin_bswap32(wc.imm_data);  // imm_data is in network order
      else if (k == "src_qp") got = wc.src_qp;
      else if (k == "qp") got = wc.qp_num;
      if (got != value(v)) bad.push_back(k);
    }
  }
  if (!bad.empty()) {
    std::string why;
    for (const auto& b : bad) why += (why.empty() ? "" : ", ") + b;
    fail("expected " + l.text + "\n  seen     " + wc_text(wc) + "\n  mismatch: " + why);
  }
}

void Runner::cmd_expect_no_wc(const Line& l) {
  allow(l, {});
  if (!wcs_.empty()) fail("expected no completion, but the CQ holds:" + pending_wcs());
}

void Runner::cmd_expect_state(const Line& l) {
  need_qp(l);
  allow(l, {});
  if (l.positional != to_string(qp_->state))
    fail("expected QP state " + l.positional + ", but it is " + to_string(qp_->state));
}

void Runner::cmd_expect_counter(const Line& l) {
  need_qp(l);
  if (l.kv.empty()) fail("expect_counter wants name=value ...");
  std::vector<std::string> bad;
  for (const std::string& k : l.order) {
    std::optional<std::uint64_t> got;
    for (std::size_t i = 0; i < kQpCounterNames.size(); ++i)
      if (kQpCounterNames[i] == k) got = qp_->ctr[static_cast<QpCounter>(i)];
    for (std::size_t i = 0; i < kPortCounterNames.size(); ++i)
      if (kPortCounterNames[i] == k) got = eng_->counters()[static_cast<PortCounter>(i)];
    if (!got) fail("unknown counter '" + k + "' (see stack/transport/counters.h)");
    if (*got != value(l.kv.at(k))) bad.push_back(format("%s=%" PRIu64, k.c_str(), *got));
  }
  if (!bad.empty()) {
    std::string why;
    for (const auto& b : bad) why += (why.empty() ? "" : ", ") + b;
    fail("counter mismatch, saw: " + why);
  }
}

void Runner::cmd_mem(const Line& l, bool check) {
  need_qp(l);
  allow(l, {"off", "len", "fill", "u64"});
  const std::uint64_t off = num(l, "off", 0);
  if (auto v = opt(l, "u64")) {
    std::uint8_t* p = mem_at(off, 8);
    std::uint64_t cur;
    std::memcpy(&cur, p, 8);
    if (!check) std::memcpy(p, &*v, 8);
    else if (cur != *v) fail(format("memory at off=0x%" PRIx64 ": expected u64 %" PRIu64 ", saw %" PRIu64, off, *v, cur));
    return;
  }
  const auto fill = opt(l, "fill");
  if (!fill) fail(l.cmd + " wants fill= (with len=) or u64=");
  const std::uint64_t len = num(l, "len", 1);
  std::uint8_t* p = mem_at(off, len);
  if (!check) {
    std::memset(p, static_cast<int>(*fill), len);
    return;
  }
  for (std::uint64_t i = 0; i < len; ++i)
    if (p[i] != static_cast<std::uint8_t>(*fill))
      fail(format("memory at off=0x%" PRIx64 ": expected 0x%02x, saw 0x%02x", off + i,
                  static_cast<unsigned>(*fill & 0xff), p[i]));
}

}  // namespace

Outcome run_script(std::string_view text, const std::string& name) { return Runner(name).run(text); }

Outcome run_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return {Outcome::Kind::kFail, path + ": cannot open"};
  std::stringstream ss;
  ss << in.rdbuf();
  return run_script(ss.str(), path);
}

}  // namespace uroce::scenario
