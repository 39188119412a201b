// Prometheus metrics from the node's status (Prometheus' text exposition
// format, 0.0.4): what the control socket's `status` shows, as counters
// (`_total`) and gauges with labels, per pipeline, per port, per tenant
// (a Unix uid) and, opted in and capped, per QP with its congestion
// control. Counters that rdma-core's mlx5 provider has under another name
// are also given under that name (`uroce_hw_*`), so dashboards built for
// ConnectX read them. Pure: a status in, text out (metrics_server.h serves it).
#pragma once

#include <cstddef>
#include <string>

#include <nlohmann/json.hpp>

namespace uroce::control {

struct MetricsOptions {
  std::size_t max_qps = 0;  // per-QP series for at most this many QPs per pipeline (0: none)
};

std::string render_metrics(const nlohmann::ordered_json& status, const MetricsOptions& opts);

}  // namespace uroce::control
