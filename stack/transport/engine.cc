// The engine's construction and what it says about itself: the names of
// verbs states and statuses, QPs by number, counter totals. The rest of
// Engine is split by concern, one file each (engine.h lists them).
#include <algorithm>

#include "stack/transport/engine.h"
#include "stack/abi/wc_status.h"

namespace uroce::transport {

const char* to_string(ibv_qp_state s) {
  switch (s) {
    case IBV_QPS_RESET: return "RESET";
    case IBV_QPS_INIT: return "INIT";
    case IBV_QPS_RTR: return "RTR";
    case IBV_QPS_RTS: return "RTS";
    case IBV_QPS_SQD: return "SQD";
    case IBV_QPS_SQE: return "SQE";
    case IBV_QPS_ERR: return "ERR";
    default: return "UNKNOWN";
  }
}

const char* to_string(ibv_wc_status s) { return uroce_wc_status_name(s); }

Engine::Engine(const EngineConfig& cfg) : cfg_(cfg), mrs_(cfg.max_mrs, cfg.seed), tx_(cfg.tx_ring) {
  if (cc::find(cfg_.cc) == nullptr) cfg_.cc = "none";  // callers check the name first (the daemon's options do)
  if (cfg_.qpns.shards == 0) cfg_.qpns.shards = 1;
  // The port's own address, for QPs connected on this device (loopback):
  // the driver turns frames to its own MAC around.
  if (cfg_.ip != wire::IpAddr{}) neighbors_.add_static(cfg_.ip, cfg_.mac);
  qps_.resize(cfg.max_qps);
  active_.reserve(cfg.max_qps + 1);  // and QP1
  still_active_.reserve(cfg.max_qps + 1);
  tenants_.resize(std::clamp<std::uint32_t>(cfg.max_tenants, 1, 65535) + 1);
  live_.reserve(tenants_.size());
  mcast_.reserve(cfg.max_mcast_attach);
  flows_.reserve(cfg.max_flows);
  mcast_loop_.resize(16384);
  ack_waiters_.reserve(cfg.max_qps);
}

Engine::~Engine() = default;

Qp* Engine::find_qp(std::uint32_t qpn) const {
  Qp* qp = slot_qp(qpn);
  return qp && !qp->quarantine_until ? qp : nullptr;
}

Qp* Engine::slot_qp(std::uint32_t qpn) const {
  if (qpn == kGsiQpn) return gsi_.get();
  std::uint32_t idx = 0;
  if (!cfg_.qpns.index(qpn, idx)) return nullptr;
  return idx < qps_.size() ? qps_[idx].get() : nullptr;
}

std::uint64_t Engine::qp_counter_total(QpCounter c) const {
  std::uint64_t n = dead_qp_ctr_[c];
  for (const auto& q : qps_)
    if (q) n += q->ctr[c];  // a quarantined QP's counters restarted at zero
  return n;
}

}  // namespace uroce::transport
