// The port's neighbour table: IP -> MAC, static entries from the
// configuration and entries learned from ARP/ND (pipeline::Neighbors) and from
// CM MADs on QP1. One table per engine, owned by it: the ARP/ND handler
// writes it, the engine reads it at RTR and for UD. Control path only.
//
// Beside it, the one wait for a neighbour: whoever needs a MAC the table
// lacks (an RTR or an address handle parked by the session server, a CM
// MAD) says until when it waits (want), and the engine asks at once, then
// again on a backoff (100 ms, doubling to 1 s, as the kernel's neighbour
// code retries) while anybody waits (due). One resolution per destination,
// however many wait for it; each waiter keeps its own work and looks the
// table up again.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>

#include "stack/wire/addr.h"
#include "stack/wire/headers.h"

namespace uroce::transport {

class NeighborTable {
 public:
  void add_static(const wire::IpAddr& ip, const wire::MacAddr& mac) { table_[ip] = {mac, true}; }
  /// A learned entry; a static one is never overwritten. True if it is new or changed.
  bool learn(const wire::IpAddr& ip, const wire::MacAddr& mac) {
    auto it = table_.find(ip);
    if (it != table_.end() && (it->second.is_static || it->second.mac == mac)) return false;
    table_[ip] = {mac, false};
    return true;
  }
  [[nodiscard]] std::optional<wire::MacAddr> lookup(const wire::IpAddr& ip) const {
    auto it = table_.find(ip);
    if (it == table_.end()) return std::nullopt;
    return it->second.mac;
  }
  [[nodiscard]] bool contains(const wire::IpAddr& ip) const { return table_.count(ip) != 0; }
  [[nodiscard]] std::size_t size() const { return table_.size(); }

  static constexpr std::uint64_t kFirstRetryNs = 100'000'000, kMaxRetryNs = 1'000'000'000;
  /// Someone waits for ip's MAC until `until` (ns, the caller's clock, as
  /// `now`). True when it is to be asked now: nobody waited for it yet, and
  /// it is not known.
  bool want(const wire::IpAddr& ip, std::uint64_t now, std::uint64_t until) {
    if (contains(ip)) return false;
    auto [it, fresh] = waits_.try_emplace(ip, Wait{now + kFirstRetryNs, kFirstRetryNs, until});
    if (!fresh) it->second.until = std::max(it->second.until, until);
    return fresh;
  }
  /// Calls ask(ip) for each destination due to be asked again; forgets the
  /// ones now known or no longer waited for.
  template <class F>
  void due(std::uint64_t now, F&& ask) {
    for (auto it = waits_.begin(); it != waits_.end();) {
      if (contains(it->first) || now >= it->second.until) {
        it = waits_.erase(it);
        continue;
      }
      if (now >= it->second.next) {
        ask(it->first);
        it->second.interval = std::min(it->second.interval * 2, kMaxRetryNs);
        it->second.next = now + it->second.interval;
      }
      ++it;
    }
  }
  [[nodiscard]] bool waiting() const { return !waits_.empty(); }
  [[nodiscard]] std::size_t waits() const { return waits_.size(); }

 private:
  struct Wait {
    std::uint64_t next, interval, until;
  };
  std::map<wire::IpAddr, Wait> waits_;
  struct Entry {
    wire::MacAddr mac;
    bool is_static;
  };
  std::map<wire::IpAddr, Entry> table_;
};

}  // namespace uroce::transport
