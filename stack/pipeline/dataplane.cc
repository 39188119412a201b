#include "stack/pipeline/dataplane.h"

#include <time.h>

#include <algorithm>
#include <cstring>

namespace uroce::pipeline {

Dataplane::Dataplane(transport::Engine& eng, PortIo& port, Neighbors& neigh, std::uint64_t seed)
    : eng_(eng), port_(port), neigh_(neigh), rx_fault_(seed * 2 + 1), tx_fault_(seed * 2 + 2) {}

void Dataplane::dispatch(wire::ConstBytes frame, std::uint64_t now) {
  // af_packet and tap can hand us what we sent ourselves. (A frame to our
  // own MAC as well is one the port looped back, two QPs on this device:
  // never sent, so never echoed.)
  if (frame.size() >= 12 && std::memcmp(frame.data() + 6, port_.mac().data(), 6) == 0 &&
      std::memcmp(frame.data(), port_.mac().data(), 6) != 0) {
    inc(DpCounter::rx_own);
    return;
  }
  std::size_t reply_len = 0;
  switch (neigh_.handle(frame, wire::Bytes(reply_, sizeof reply_), reply_len)) {
    case Neighbors::Verdict::kReply:
      inc(frame.size() > 13 && frame[12] == 0x08 && frame[13] == 0x00 ? DpCounter::rx_icmp_echo
                                                                       : DpCounter::rx_arp_nd);
      send_raw(wire::ConstBytes(reply_, reply_len), now);
      inc(DpCounter::tx_replies);
      return;
    case Neighbors::Verdict::kHandled:
      inc(DpCounter::rx_arp_nd);
      if (host_) to_host(frame);  // learned here; the host answers
      return;
    case Neighbors::Verdict::kNotMine: break;
  }
  // Everything else goes to the transport, which parses it, drops another
  // VLAN's frames (only the port's VLAN is ours, or untagged frames without
  // one), counts RoCE frames it refuses by reason, steers non-RoCE frames a
  // flow rule matches to a raw packet QP, and counts the other non-RoCE
  // frames as rx_not_roce.
  if (capture_) capture_(capture_ctx_, frame, false, now);
  const transport::RxVerdict v = eng_.rx(frame, now);
  if (v == transport::RxVerdict::kWrongVlan) {
    inc(DpCounter::rx_other);
  } else if (v == transport::RxVerdict::kRaw) {
    // A flow rule steered it to a raw packet QP (counted there: rx_raw).
  } else if (v != transport::RxVerdict::kNotRoce) {
    inc(DpCounter::rx_roce);
  } else if (host_) {
    to_host(frame);
  } else {
    inc(DpCounter::rx_other);
  }
}

void Dataplane::to_host(wire::ConstBytes frame) {
  // The host's netdev is untagged: our VLAN's tag comes off on the way in
  // (and goes back on in from_host).
  if (frame.size() >= 18 && frame[12] == (wire::kEtherTypeVlan >> 8) && frame[13] == (wire::kEtherTypeVlan & 0xff)) {
    if (frame.size() - 4 > sizeof flat_) {
      inc(DpCounter::host_drops);
      return;
    }
    std::memcpy(flat_, frame.data(), 12);
    std::memcpy(flat_ + 12, frame.data() + 16, frame.size() - 16);
    frame = wire::ConstBytes(flat_, frame.size() - 4);
  }
  inc(host_->tx_raw(frame) ? DpCounter::rx_to_host : DpCounter::host_drops);
}

std::size_t Dataplane::from_host(std::uint64_t now) {
  host_polled_ = now;
  RxFrame burst[8];
  const std::uint16_t n = host_->rx_burst(burst, 8);
  const std::uint16_t tci = eng_.config().vlan_tci;
  for (std::uint16_t i = 0; i < n; ++i) {
    wire::ConstBytes f(burst[i].data, burst[i].len);
    if (f.size() < 14) {
      inc(DpCounter::host_drops);
      continue;
    }
    if (tci != 0) {  // onto our VLAN
      if (f.size() + 4 > sizeof flat_) {
        inc(DpCounter::host_drops);
        continue;
      }
      std::memcpy(flat_, f.data(), 12);
      flat_[12] = wire::kEtherTypeVlan >> 8;
      flat_[13] = wire::kEtherTypeVlan & 0xff;
      flat_[14] = static_cast<std::uint8_t>(tci >> 8);
      flat_[15] = static_cast<std::uint8_t>(tci);
      std::memcpy(flat_ + 16, f.data() + 12, f.size() - 12);
      f = wire::ConstBytes(flat_, f.size() + 4);
    }
    if (port_.tx_raw(f)) {
      inc(DpCounter::tx_from_host);
      inc(DpCounter::tx_frames);
    } else {
      inc(DpCounter::host_drops);
    }
  }
  host_->rx_done();
  return n;
}

void Dataplane::send_raw(wire::ConstBytes frame, std::uint64_t now) {
  (void)now;
  if (port_.tx_raw(frame)) inc(DpCounter::tx_frames);
}

void Dataplane::resolve(const wire::IpAddr& ip) {
  const std::size_t n = neigh_.build_request(ip, wire::Bytes(reply_, sizeof reply_));
  if (n && port_.tx_raw(wire::ConstBytes(reply_, n))) {
    inc(DpCounter::neigh_requests);
    inc(DpCounter::tx_frames);
  }
}

std::size_t Dataplane::iterate(std::uint64_t now) {
  std::size_t work = 0;
  // Stage 1: receive burst, 2: dispatch.
  RxFrame burst[32];
  const std::uint16_t n = port_.rx_burst(burst, 32);
  if (n) {
    inc(DpCounter::rx_bursts);
    inc(DpCounter::rx_frames, n);
    work += n;
    if (rx_fault_.active()) {
      for (std::uint16_t i = 0; i < n; ++i)
        rx_fault_.apply(wire::ConstBytes(burst[i].data, burst[i].len), now,
                        [&](wire::ConstBytes f) { dispatch(f, now); });
    } else {
      for (std::uint16_t i = 0; i < n; ++i) dispatch(wire::ConstBytes(burst[i].data, burst[i].len), now);
    }
  }
  port_.rx_done();
  // The host's frames for the wire: a read costs a system call, so at most
  // every poll tick while busy (and on the first pass after any sleep).
  if (host_ && now - host_polled_ >= std::uint64_t{idle_cfg_.tick_us} * 1000) work += from_host(now);
  if (rx_fault_.active()) rx_fault_.release(now, [&](wire::ConstBytes f) { dispatch(f, now); });
  // Stage 3: the application side (the control plane's own work: the CM
  // agent, parked requests; or a bench's stage), before the transport, so
  // what it posts goes out in this pass.
  if (app_) work += app_(app_ctx_, now);
  // Stage 4: the intake, what applications posted in their shared queues.
  if (intake_) work += intake_->run();
  // Stage 5: the transport (requester, timers), within what the port can
  // take (a full loopback ring holds frames back in their QPs instead of
  // dropping them). The completer and responder ran as frames came in.
  eng_.set_tx_room(port_.tx_room());
  eng_.poll(now);
  // Stage 6: transmit.
  const bool faulty = tx_fault_.active();
  work += eng_.drain_tx([&](const transport::TxFrame& f) {
    if (capture_ || faulty) {
      const std::size_t len = f.copy_to(wire::Bytes(flat_, sizeof flat_));
      if (capture_) capture_(capture_ctx_, wire::ConstBytes(flat_, len), true, now);
      if (faulty) {
        tx_fault_.apply(wire::ConstBytes(flat_, len), now, [&](wire::ConstBytes g) { send_raw(g, now); });
        return;
      }
    }
    if (port_.tx(f)) inc(DpCounter::tx_frames);
  });
  if (faulty) tx_fault_.release(now, [&](wire::ConstBytes g) { send_raw(g, now); });
  port_.tx_push();
  return work;
}

std::uint64_t Dataplane::idle_sleep_ns(std::size_t work, std::uint64_t now) {
  if (work != 0 || idle_cfg_.max_sleep_us == 0) {
    if (work != 0 && idle_since_ != 0 && now > idle_since_) spin_.gap(now - idle_since_);
    idle_since_ = 0;
    sleep_ns_ = 0;
    return 0;
  }
  if (idle_since_ == 0) idle_since_ = now;
  const std::uint64_t idle = now - idle_since_;
  if (idle < spin_.window_ns(std::uint64_t{idle_cfg_.spin_us} * 1000, now)) return 0;  // work comes back soon: keep polling
  const std::uint64_t tick = std::uint64_t{std::min(idle_cfg_.tick_us, idle_cfg_.max_sleep_us)} * 1000;
  if (rx_wakes_) {
    sleep_ns_ = std::uint64_t{idle_cfg_.max_sleep_us} * 1000;  // a frame ends the sleep: no tick to poll on
  } else if (idle < std::uint64_t{idle_cfg_.warm_ms} * 1'000'000) {
    sleep_ns_ = tick;
  } else {
    // Long idle: back off, doubling, so an idle daemon does not burn a core.
    sleep_ns_ = std::min(std::max(sleep_ns_, tick) * 2, std::uint64_t{idle_cfg_.max_sleep_us} * 1000);
  }
  // Never past the engine's next timer (retransmit, RNR wait): a long idle
  // backoff must not make a retry late.
  const std::uint64_t deadline = eng_.next_deadline();
  if (deadline != 0) {
    if (deadline <= now) return 0;
    if (deadline - now < sleep_ns_) {
      inc(DpCounter::idle_sleeps);
      return deadline - now;
    }
  }
  inc(DpCounter::idle_sleeps);
  return sleep_ns_;
}

void Dataplane::idle(std::size_t work) {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  const std::uint64_t t = static_cast<std::uint64_t>(now.tv_sec) * 1'000'000'000ull + static_cast<std::uint64_t>(now.tv_nsec);
  const std::uint64_t ns = idle_sleep_ns(work, t);
  if (ns == 0) return;
  timespec ts{static_cast<time_t>(ns / 1'000'000'000ull), static_cast<long>(ns % 1'000'000'000ull)};
  nanosleep(&ts, nullptr);
}

}  // namespace uroce::pipeline
