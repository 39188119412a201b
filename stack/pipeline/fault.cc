#include "stack/pipeline/fault.h"

#include <cstdlib>
#include <cstring>
#include <sstream>

#include "stack/wire/builder.h"
#include "stack/wire/parser.h"

namespace uroce::pipeline {

namespace {

bool parse_prob(const std::string& v, double& out) {
  char* end = nullptr;
  out = std::strtod(v.c_str(), &end);
  return end != v.c_str() && *end == '\0' && out >= 0 && out <= 1;
}

bool parse_uint(const std::string& v, std::uint32_t& out) {
  char* end = nullptr;
  const unsigned long x = std::strtoul(v.c_str(), &end, 0);
  if (end == v.c_str() || *end != '\0' || x > 0xffffffffu) return false;
  out = static_cast<std::uint32_t>(x);
  return true;
}

}  // namespace

bool FaultConfig::parse(const std::string& text, FaultConfig& out, std::string& err) {
  FaultConfig c;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    const auto eq = item.find('=');
    if (eq == std::string::npos) {
      err = "fault item '" + item + "' is not key=value";
      return false;
    }
    const std::string k = item.substr(0, eq), v = item.substr(eq + 1);
    bool ok = true;
    if (k == "drop") ok = parse_prob(v, c.drop);
    else if (k == "dup") ok = parse_prob(v, c.dup);
    else if (k == "reorder") ok = parse_prob(v, c.reorder);
    else if (k == "corrupt") ok = parse_prob(v, c.corrupt);
    else if (k == "ecn") ok = parse_prob(v, c.ecn);
    else if (k == "delay_us") ok = parse_uint(v, c.delay_us);
    else if (k == "reorder_us") ok = parse_uint(v, c.reorder_us);
    else if (k == "rule") {
      // action:qpn:psn[:times]
      std::stringstream rs(v);
      std::string a, q, p, t;
      std::getline(rs, a, ':');
      std::getline(rs, q, ':');
      std::getline(rs, p, ':');
      std::getline(rs, t, ':');
      FaultRule r;
      if (a == "drop") r.action = FaultRule::Action::kDrop;
      else if (a == "dup") r.action = FaultRule::Action::kDup;
      else if (a == "corrupt") r.action = FaultRule::Action::kCorrupt;
      else if (a == "ecn") r.action = FaultRule::Action::kEcn;
      else if (a == "delay") r.action = FaultRule::Action::kDelay;
      else {
        err = "fault rule action '" + a + "' is not drop, dup, corrupt, ecn or delay";
        return false;
      }
      r.any_qpn = q == "*";
      ok = (r.any_qpn || parse_uint(q, r.qpn)) && parse_uint(p, r.psn) && (t.empty() || parse_uint(t, r.times));
      ok = ok && r.qpn <= 0xffffff && r.psn <= 0xffffff;
      if (ok) c.rules.push_back(r);
    } else {
      err = "unknown fault key '" + k + "' (drop, dup, reorder, corrupt, ecn, delay_us, reorder_us, rule)";
      return false;
    }
    if (!ok) {
      err = "bad value for fault key '" + k + "': '" + v + "' (probabilities are 0..1; rule=action:qpn|*:psn[:times])";
      return false;
    }
  }
  out = c;
  return true;
}

std::string FaultConfig::to_string() const {
  std::ostringstream o;
  o << "drop=" << drop << ",dup=" << dup << ",reorder=" << reorder << ",corrupt=" << corrupt << ",ecn=" << ecn
    << ",delay_us=" << delay_us << ",rules=" << rules.size();
  return o.str();
}

FaultInjector::FaultInjector(std::uint64_t seed, std::uint32_t slots)
    : rng_(seed), scratch_(kSlot), pool_(std::size_t{slots} * kSlot) {
  held_.reserve(slots);
  free_.reserve(slots);
  for (std::uint32_t i = slots; i-- > 0;) free_.push_back(i);
}

void FaultInjector::configure(const FaultConfig& c) {
  cfg_ = c;
  active_ = c.active();
}

bool FaultInjector::hold(const std::uint8_t* data, std::size_t len, std::uint64_t until) {
  if (free_.empty() || len > kSlot) {
    ++st_.delay_full;
    return false;
  }
  const std::uint32_t slot = free_.back();
  free_.pop_back();
  std::memcpy(&pool_[std::size_t{slot} * kSlot], data, len);
  held_.push_back(Held{until, slot, static_cast<std::uint32_t>(len)});
  return true;
}

FaultInjector::Fate FaultInjector::decide(wire::ConstBytes frame, std::uint64_t now, std::uint8_t*& data,
                                          std::uint64_t& until) {
  data = const_cast<std::uint8_t*>(frame.data());
  wire::Packet pkt;
  wire::ParseOptions o;
  o.verify_icrc = false;
  if (!wire::parse_frame(frame, o, pkt).ok() || frame.size() > kSlot) return Fate::kPass;  // only RoCE frames
  ++st_.seen;
  // Work on a copy: the original may be a driver's receive buffer.
  std::memcpy(scratch_.data(), frame.data(), frame.size());
  data = scratch_.data();
  auto mark_ecn = [&] {
    wire::mark_ce(data + pkt.l3_off, pkt.ipver);
    ++st_.ecn_marked;
  };
  auto corrupt = [&] {
    const std::size_t i = std::uniform_int_distribution<std::size_t>(pkt.l3_off, frame.size() - 1)(rng_);
    data[i] ^= static_cast<std::uint8_t>(1u << std::uniform_int_distribution<int>(0, 7)(rng_));
    ++st_.corrupted;
  };
  for (FaultRule& r : cfg_.rules) {
    if (r.times == 0 || (!r.any_qpn && r.qpn != pkt.destqp) || r.psn != pkt.psn.value()) continue;
    --r.times;
    ++st_.rule_hits;
    switch (r.action) {
      case FaultRule::Action::kDrop: ++st_.dropped; return Fate::kDrop;
      case FaultRule::Action::kDup: ++st_.duplicated; return Fate::kDup;
      case FaultRule::Action::kCorrupt: corrupt(); return Fate::kPass;
      case FaultRule::Action::kEcn: mark_ecn(); return Fate::kPass;
      case FaultRule::Action::kDelay:
        ++st_.delayed;
        until = now + 1000ull * (cfg_.delay_us ? cfg_.delay_us : 100);
        return Fate::kHold;
    }
  }
  if (chance(cfg_.drop)) {
    ++st_.dropped;
    return Fate::kDrop;
  }
  if (chance(cfg_.corrupt)) corrupt();
  if (chance(cfg_.ecn)) mark_ecn();
  std::uint64_t hold_ns = 1000ull * cfg_.delay_us;
  if (chance(cfg_.reorder)) {
    hold_ns += 1000ull * std::uniform_int_distribution<std::uint32_t>(1, std::max(1u, cfg_.reorder_us))(rng_);
    ++st_.reordered;
  }
  const bool dup = chance(cfg_.dup);
  if (dup) ++st_.duplicated;
  if (hold_ns > 0) {
    ++st_.delayed;
    until = now + hold_ns;
    if (dup) hold(data, frame.size(), until + 1000);
    return Fate::kHold;
  }
  return dup ? Fate::kDup : Fate::kPass;
}

}  // namespace uroce::pipeline
