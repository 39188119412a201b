// The port's neighbour table: IP -> MAC, static entries from the
// configuration and entries learned from ARP/ND (pipeline::Neighbors) and from
// CM MADs on QP1. One table per engine, owned by it: the ARP/ND handler
// writes it, the engine reads it at RTR and for UD. Control path only.
#pragma once

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

 private:
  struct Entry {
    wire::MacAddr mac;
    bool is_static;
  };
  std::map<wire::IpAddr, Entry> table_;
};

}  // namespace uroce::transport
