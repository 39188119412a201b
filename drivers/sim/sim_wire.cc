#include "drivers/sim/sim_wire.h"

#include <algorithm>
#include <cstring>

namespace uroce::sim {

SimWire::SimWire(std::uint64_t seed, std::uint32_t pool_frames)
    : pool_(std::size_t{pool_frames} * kSlot), rng_(seed) {
  free_.reserve(pool_frames);
  for (std::uint32_t i = pool_frames; i-- > 0;) free_.push_back(i);
  heap_.reserve(pool_frames);
  engines_.reserve(16);
}

void SimWire::attach(transport::Engine* e) { engines_.push_back(e); }

void SimWire::schedule(const std::uint8_t* data, std::uint32_t len, std::uint64_t when) {
  if (free_.empty() || len > kSlot) {
    ++stats_.pool_exhausted;
    return;
  }
  const std::uint32_t slot = free_.back();
  free_.pop_back();
  std::memcpy(&pool_[std::size_t{slot} * kSlot], data, len);
  heap_.push_back(Event{when, seq_++, slot, len});
  std::push_heap(heap_.begin(), heap_.end(), Later{});
}

void SimWire::inject(wire::ConstBytes frame) {
  schedule(frame.data(), static_cast<std::uint32_t>(frame.size()), now_ + imp_.delay_ns);
}

void SimWire::send(const transport::TxFrame& f) {
  std::uint8_t buf[kSlot];
  const std::size_t n = f.copy_to(wire::Bytes(buf, sizeof buf));
  if (n == 0) return;
  ++stats_.sent;
  if (tap) tap(wire::ConstBytes(buf, n), now_);
  const bool impair = !imp_.filter || imp_.filter(f);
  if (impair && chance(imp_.loss)) {
    ++stats_.dropped;
    return;
  }
  if (impair && chance(imp_.ce)) {
    wire::Packet pkt;
    wire::ParseOptions o;
    o.verify_icrc = false;
    if (wire::parse_frame(wire::ConstBytes(buf, n), o, pkt).ok()) {
      wire::mark_ce(buf + pkt.l3_off, pkt.ipver);
      ++stats_.ce_marked;
    }
  }
  if (impair && chance(imp_.corrupt)) {
    const std::size_t byte = std::uniform_int_distribution<std::size_t>(0, n - 1)(rng_);
    buf[byte] ^= static_cast<std::uint8_t>(1u << std::uniform_int_distribution<int>(0, 7)(rng_));
    ++stats_.corrupted;
  }
  std::uint64_t when = now_ + imp_.delay_ns;
  if (impair && chance(imp_.reorder)) {
    when += std::uniform_int_distribution<std::uint64_t>(1, imp_.reorder_ns)(rng_);
    ++stats_.reordered;
  }
  schedule(buf, static_cast<std::uint32_t>(n), when);
  if (impair && chance(imp_.dup)) {
    schedule(buf, static_cast<std::uint32_t>(n), when + std::uniform_int_distribution<std::uint64_t>(0, 3000)(rng_));
    ++stats_.duplicated;
  }
}

bool SimWire::step() {
  bool busy = false;
  for (transport::Engine* e : engines_) {
    e->poll(now_);
    if (e->drain_tx([this](const transport::TxFrame& f) { send(f); }) != 0) busy = true;
  }
  while (!heap_.empty() && heap_.front().t <= now_) {
    std::pop_heap(heap_.begin(), heap_.end(), Later{});
    const Event ev = heap_.back();
    heap_.pop_back();
    const std::uint8_t* data = &pool_[std::size_t{ev.slot} * kSlot];
    // Deliver by destination MAC, like a switch; unknown MACs are lost, and
    // a group's (multicast, broadcast) frame floods every port but the
    // sender's.
    bool found = false;
    const bool group = ev.len >= 12 && (data[0] & 1) != 0;
    for (transport::Engine* e : engines_) {
      if (group && std::memcmp(data + 6, e->config().mac.data(), 6) != 0) {
        if (deliver_tap) deliver_tap(e, wire::ConstBytes(data, ev.len), now_);
        e->rx(wire::ConstBytes(data, ev.len), now_);
        found = true;
        continue;
      }
      if (!group && ev.len >= 6 && std::memcmp(data, e->config().mac.data(), 6) == 0) {
        if (deliver_tap) deliver_tap(e, wire::ConstBytes(data, ev.len), now_);
        e->rx(wire::ConstBytes(data, ev.len), now_);
        found = true;
        break;
      }
    }
    if (found) ++stats_.delivered;
    else ++stats_.no_such_host;
    free_.push_back(ev.slot);
    busy = true;
  }
  return busy;
}

bool SimWire::run_until(const std::function<bool()>& done, std::uint64_t max_ns) {
  const std::uint64_t end = now_ + max_ns;
  while (now_ < end) {
    if (done()) return true;
    if (step()) {
      now_ += 50;  // things are moving: small steps
      continue;
    }
    // Idle: jump to the next event or timer.
    std::uint64_t next = heap_.empty() ? UINT64_MAX : heap_.front().t;
    for (const transport::Engine* e : engines_) {
      const std::uint64_t d = e->next_deadline();
      if (d != 0) next = std::min(next, d);
    }
    if (next_timer) {
      const std::uint64_t d = next_timer();
      if (d != 0) next = std::min(next, d);
    }
    if (next == UINT64_MAX) {
      // Nothing scheduled: one last look, since `done()` may post work
      // (a test's pump), which the next step then starts.
      if (done()) return true;
      if (step()) {
        now_ += 50;
        continue;
      }
      return false;
    }
    now_ = std::max(now_ + 1, std::min(next, end));
  }
  return done();
}

void SimWire::run_idle(std::uint64_t max_ns) {
  run_until([] { return false; }, max_ns);
}

}  // namespace uroce::sim
