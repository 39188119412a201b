// The transmit share between tenants (set_tenant): deficit round robin
// over the frame bytes each tenant's QPs queue. poll() runs the rounds;
// this is the share's bookkeeping and its checks on the requester's path.
#include <cerrno>

#include "stack/transport/engine.h"

namespace uroce::transport {

bool Engine::tx_share_left(Qp& qp) {
  Tenant& t = tenants_[qp.tenant];
  if (t.deficit > 0 || unmetered_ == qp.tenant) return true;
  t.backlog = true;
  ++t.throttled;
  qp_throttled_ = true;
  return false;
}

bool Engine::last_in_turn(const Qp& qp, std::uint32_t payload) const {
  if (tx_.size() + 1 >= tx_limit()) return true;
  if (!metered() || unmetered_ == qp.tenant) return false;
  return tenants_[qp.tenant].deficit <= static_cast<std::int64_t>(payload) + 128;  // its headers and trailer
}

void Engine::charge(const Qp& qp, std::uint32_t from) {
  std::uint64_t bytes = 0;
  const std::uint32_t end = tx_.tail();
  // The wire's bytes: the frame, its FCS, and the preamble and gap (24).
  for (std::uint32_t i = from; i != end; ++i) bytes += tx_.at(i).size() + 24;
  Tenant& t = tenants_[qp.tenant];
  t.deficit -= static_cast<std::int64_t>(bytes);
  t.tx_bytes += bytes;
  t.tx_frames += end - from;
  poll_bytes_ += bytes;
  poll_frames_ += end - from;
}

int Engine::set_tenant(Qp* qp, std::uint32_t uid, std::uint32_t weight) {
  if (qp == nullptr || qp->quarantine_until || weight == 0 || weight > kMaxWeight) return EINVAL;
  leave_tenant(*qp);
  // Its uid's entry, or a free one.
  std::uint16_t at = tenant_of(uid);
  if (at == 0) {
    for (std::size_t i = 1; i < tenants_.size() && at == 0; ++i)
      if (tenants_[i].qps == 0) at = static_cast<std::uint16_t>(i);
    if (at == 0) return ENOSPC;  // every entry held: it stays in entry 0
    static_cast<TenantReport&>(tenants_[at]) = TenantReport{uid, weight, 0, 0, 0, 0};
    tenants_[at].deficit = 0;
    live_.push_back(at);
  }
  Tenant& t = tenants_[at];
  t.weight = weight;
  ++t.qps;
  qp->tenant = static_cast<std::uint16_t>(at);
  return 0;
}

bool Engine::set_tenant_weight(std::uint32_t uid, std::uint32_t weight) {
  if (weight == 0 || weight > kMaxWeight) return false;
  const std::uint16_t at = tenant_of(uid);
  if (at == 0) return false;
  tenants_[at].weight = weight;
  return true;
}

std::uint16_t Engine::tenant_of(std::uint32_t uid) const {
  for (const std::uint16_t i : live_)
    if (tenants_[i].uid == uid) return i;
  return 0;
}

void Engine::leave_tenant(Qp& qp) {
  if (qp.tenant != 0 && --tenants_[qp.tenant].qps == 0) std::erase(live_, qp.tenant);
  qp.tenant = 0;
}

}  // namespace uroce::transport
