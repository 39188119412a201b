#include "drivers/sim/fabric.h"

#include <algorithm>
#include <cstring>
#include <deque>

#include "stack/wire/builder.h"

namespace uroce::sim {

namespace {
/// Preamble, start of frame and the inter-frame gap: what a frame costs a
/// link beyond its bytes.
constexpr std::uint64_t kWireOverhead = 20;
constexpr std::uint32_t kNone = UINT32_MAX;

/// The frame's layer-3 header, and which IP version (nullptr: not IP).
std::uint8_t* l3_of(std::uint8_t* f, std::uint32_t len, wire::IpVersion& v) {
  std::uint32_t off = 12;
  if (len < 14) return nullptr;
  std::uint16_t type = static_cast<std::uint16_t>(f[off] << 8 | f[off + 1]);
  if (type == 0x8100) {
    off += 4;
    if (len < off + 2) return nullptr;
    type = static_cast<std::uint16_t>(f[off] << 8 | f[off + 1]);
  }
  off += 2;
  if (type == 0x0800 && len >= off + 20) v = wire::IpVersion::kV4;
  else if (type == 0x86dd && len >= off + 40) v = wire::IpVersion::kV6;
  else return nullptr;
  return f + off;
}

unsigned ecn_of(const std::uint8_t* l3, wire::IpVersion v) {
  return v == wire::IpVersion::kV4 ? (l3[1] & 3u) : ((l3[1] >> 4) & 3u);
}
}  // namespace

Fabric::Fabric(std::uint64_t seed, std::uint32_t pool_frames, std::uint32_t max_frame)
    : pool_(new std::uint8_t[std::size_t{pool_frames} * max_frame]),
      frames_(pool_frames),
      max_frame_(max_frame),
      rng_(seed) {
  free_.reserve(pool_frames);
  for (std::uint32_t i = pool_frames; i-- > 0;) free_.push_back(i);
  heap_.reserve(std::size_t{pool_frames} * 2);
}

std::uint64_t Fabric::mac_key(const std::uint8_t* mac) {
  std::uint64_t k = 0;
  for (int i = 0; i < 6; ++i) k = k << 8 | mac[i];
  return k;
}

int Fabric::add_switch(const SwitchSpec& s) {
  Device n;
  n.spec = s;
  nodes_.push_back(std::move(n));
  return static_cast<int>(nodes_.size() - 1);
}

int Fabric::add_host(transport::Engine* e, int sw, const LinkSpec& l) {
  Device n;
  n.host = true;
  n.eng = e;
  nodes_.push_back(std::move(n));
  const int h = static_cast<int>(nodes_.size() - 1);
  connect(h, sw, l);  // the host's port 0
  hosts_.push_back(h);
  return static_cast<int>(hosts_.size() - 1);
}

void Fabric::connect(int na, int nb, const LinkSpec& l) {
  // A port on each node, each naming the other's, so a pause can travel back.
  Port a, b;
  a.node = b.peer = na;
  a.peer = b.node = nb;
  a.link = b.link = l;
  a.peer_port = static_cast<int>(nodes_[nb].ports.size());
  b.peer_port = static_cast<int>(nodes_[na].ports.size());
  nodes_[na].ports.push_back(a);
  nodes_[nb].ports.push_back(b);
}

void Fabric::finish() {
  // Per host, hop counts from it (BFS); each switch routes the host's MAC
  // to the lowest-numbered port whose peer is one hop nearer.
  for (const int h : hosts_) {
    std::vector<int> dist(nodes_.size(), -1);
    std::deque<int> q{h};
    dist[h] = 0;
    while (!q.empty()) {
      const int n = q.front();
      q.pop_front();
      for (const Port& p : nodes_[n].ports)
        if (dist[p.peer] < 0) {
          dist[p.peer] = dist[n] + 1;
          q.push_back(p.peer);
        }
    }
    const std::uint64_t key = mac_key(nodes_[h].eng->config().mac.data());
    for (std::size_t s = 0; s < nodes_.size(); ++s) {
      Device& n = nodes_[s];
      if (n.host || dist[s] < 0) continue;
      for (std::size_t k = 0; k < n.ports.size(); ++k)
        if (dist[n.ports[k].peer] == dist[s] - 1) {
          n.route[key] = static_cast<int>(k);
          break;
        }
    }
  }
  for (Device& n : nodes_) {
    n.ingress_bytes.assign(n.ports.size(), 0);
    n.pause_sent.assign(n.ports.size(), false);
    for (Port& p : n.ports) p.q.reserve(frames_.size());
  }
}

int Fabric::port_toward(int sw, int h) const {
  const auto it = nodes_[sw].route.find(mac_key(nodes_[hosts_[h]].eng->config().mac.data()));
  return it == nodes_[sw].route.end() ? -1 : it->second;
}
std::uint64_t Fabric::queue_bytes(int sw, int port) const { return nodes_[sw].ports[port].q_bytes; }
const PortStats& Fabric::port_stats(int sw, int port) const { return nodes_[sw].ports[port].st; }
const PortStats& Fabric::host_port_stats(int h) const { return nodes_[hosts_[h]].ports[0].st; }

void Fabric::push(Event e) {
  e.seq = seq_++;
  heap_.push_back(e);
  std::push_heap(heap_.begin(), heap_.end(), Later{});
}

std::uint32_t Fabric::alloc(const std::uint8_t* d, std::uint32_t len) {
  if (free_.empty() || len > max_frame_) {
    ++stats_.pool_exhausted;
    return kNone;
  }
  const std::uint32_t s = free_.back();
  free_.pop_back();
  std::memcpy(data(s), d, len);
  frames_[s] = Frame{len, -1};
  return s;
}

void Fabric::enqueue(int node, int port, std::uint32_t slot, int ingress) {
  Device& n = nodes_[node];
  Port& p = n.ports[port];
  Frame& f = frames_[slot];
  if (!n.host) {
    const SwitchSpec& s = n.spec;
    const bool lost = p.loss > 0 && std::uniform_real_distribution<double>(0, 1)(rng_) < p.loss;
    // Random loss; or tail drop, with PFC off (with it on the fabric is
    // lossless: the pauses bound each ingress's share instead).
    if (lost || (!s.pfc && p.q_bytes + f.len > s.buffer_bytes)) {
      ++p.st.dropped;
      ++stats_.dropped;
      free_.push_back(slot);
      return;
    }
    wire::IpVersion v{};
    std::uint8_t* l3 = s.ecn ? l3_of(data(slot), f.len, v) : nullptr;
    if (l3 && ecn_of(l3, v) != 0 && ecn_of(l3, v) != 3 && p.q_bytes > s.kmin_bytes) {
      // RED's ramp on the queue the frame joins (DCQCN's congestion point).
      const double prob = p.q_bytes >= s.kmax_bytes
                              ? 1.0
                              : s.pmax * static_cast<double>(p.q_bytes - s.kmin_bytes) /
                                    static_cast<double>(s.kmax_bytes - s.kmin_bytes);
      if (std::uniform_real_distribution<double>(0, 1)(rng_) < prob) {
        wire::mark_ce(l3, v);
        ++p.st.ce_marked;
        ++stats_.ce_marked;
      }
    }
    if (s.pfc && ingress >= 0) {
      f.ingress = ingress;
      n.ingress_bytes[ingress] += f.len;
      if (!n.pause_sent[ingress] && n.ingress_bytes[ingress] >= s.pfc_xoff_bytes) {
        n.pause_sent[ingress] = true;
        const Port& in = n.ports[ingress];
        push(Event{now_ + in.link.delay_ns, 0, Ev::kPause, in.peer, in.peer_port, kNone});
      }
    }
  }
  p.q.push_back(slot);
  p.q_bytes += f.len;
  p.st.max_queue_bytes = std::max(p.st.max_queue_bytes, p.q_bytes);
  if (!p.busy && !p.paused) start_tx(node, port);
}

void Fabric::start_tx(int node, int port) {
  Port& p = nodes_[node].ports[port];
  if (p.q_head == p.q.size()) return;
  p.busy = true;
  const std::uint64_t bits = (frames_[p.q[p.q_head]].len + kWireOverhead) * 8;
  const std::uint64_t ser = (bits * 1'000'000'000 + p.link.rate_bps - 1) / p.link.rate_bps;
  push(Event{now_ + ser, 0, Ev::kTxDone, node, port, kNone});
}

void Fabric::release_ingress(Device& sw, const Frame& f) {
  if (f.ingress < 0) return;
  sw.ingress_bytes[f.ingress] -= f.len;
  if (sw.pause_sent[f.ingress] && sw.ingress_bytes[f.ingress] <= sw.spec.pfc_xon_bytes) {
    sw.pause_sent[f.ingress] = false;
    const Port& in = sw.ports[f.ingress];
    push(Event{now_ + in.link.delay_ns, 0, Ev::kResume, in.peer, in.peer_port, kNone});
  }
}

void Fabric::tx_done(int node, int port) {
  Device& n = nodes_[node];
  Port& p = n.ports[port];
  const std::uint32_t slot = p.q[p.q_head++];
  if (p.q_head == p.q.size()) {  // empty: reuse the storage from the start
    p.q.clear();
    p.q_head = 0;
  }
  const Frame& f = frames_[slot];
  p.q_bytes -= f.len;
  ++p.st.tx_frames;
  p.st.tx_bytes += f.len;
  ++stats_.frames;
  if (!n.host) release_ingress(n, f);
  push(Event{now_ + p.link.delay_ns, 0, Ev::kArrive, p.peer, p.peer_port, slot});
  p.busy = false;
  if (n.host && p.q.size() - p.q_head < n.eng->config().tx_ring) n.dirty = true;  // room for more
  if (!p.paused) start_tx(node, port);
}

void Fabric::arrive(int node, int in_port, std::uint32_t slot) {
  Device& n = nodes_[node];
  const Frame& f = frames_[slot];
  if (n.host) {
    n.eng->rx(wire::ConstBytes(data(slot), f.len), now_);
    free_.push_back(slot);
    n.dirty = true;
    n.deadline = n.eng->next_deadline();
    return;
  }
  const auto it = f.len >= 6 ? n.route.find(mac_key(data(slot))) : n.route.end();
  if (it == n.route.end()) {
    ++stats_.unroutable;
    free_.push_back(slot);
    return;
  }
  enqueue(node, it->second, slot, in_port);
}

void Fabric::poll_host(int node) {
  Device& n = nodes_[node];
  n.dirty = false;
  n.eng->poll(now_);
  n.eng->drain_tx([&](const transport::TxFrame& tf) {
    std::uint8_t buf[transport::TxFrame::kMaxHdr + 2 * 4096 + 64];
    const std::size_t len = tf.copy_to(wire::Bytes(buf, sizeof buf));
    if (len == 0) return;
    const std::uint32_t s = alloc(buf, static_cast<std::uint32_t>(len));
    if (s != kNone) enqueue(node, 0, s, -1);
  });
}

bool Fabric::run_until(const std::function<bool()>& done, std::uint64_t max_ns) {
  const std::uint64_t end = now_ + max_ns;
  while (now_ <= end) {
    if (done()) return true;
    while (!heap_.empty() && heap_.front().t <= now_) {
      std::pop_heap(heap_.begin(), heap_.end(), Later{});
      const Event e = heap_.back();
      heap_.pop_back();
      ++stats_.events;
      switch (e.kind) {
        case Ev::kArrive: arrive(e.node, e.port, e.slot); break;
        case Ev::kTxDone: tx_done(e.node, e.port); break;
        case Ev::kPause: {
          Port& p = nodes_[e.node].ports[e.port];
          p.paused = true;
          ++p.st.pauses;
          break;
        }
        case Ev::kResume: {
          Port& p = nodes_[e.node].ports[e.port];
          p.paused = false;
          if (!p.busy) start_tx(e.node, e.port);
          break;
        }
      }
    }
    if (sample_ && now_ >= next_sample_) {
      sample_(now_);
      next_sample_ += sample_every_;
      for (const int h : hosts_) nodes_[h].dirty = true;  // it may have posted work
    }
    // Hosts: poll those that received, have NIC room again, or have a
    // timer due; note the earliest timer still ahead.
    std::uint64_t next = heap_.empty() ? UINT64_MAX : heap_.front().t;
    if (sample_) next = std::min(next, next_sample_);
    for (const int h : hosts_) {
      Device& n = nodes_[h];
      const Port& nic = n.ports[0];
      const bool room = nic.q.size() - nic.q_head < n.eng->config().tx_ring;
      if (!room) continue;  // tx_done marks it dirty
      // The engine's deadline changes only when it is touched (a frame in,
      // a poll, work posted from a sample): kept from then, not asked anew.
      if (n.dirty || (n.deadline != 0 && n.deadline <= now_)) {
        poll_host(h);
        n.deadline = n.eng->next_deadline();
      }
      if (n.deadline != 0) next = std::min(next, std::max(n.deadline, now_ + 1));
    }
    if (!heap_.empty() && heap_.front().t <= now_) continue;  // a poll queued work for now
    if (next == UINT64_MAX) return done();
    now_ = next;
  }
  return done();
}

}  // namespace uroce::sim
