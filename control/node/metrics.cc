#include "control/node/metrics.h"

#include <charconv>
#include <cmath>
#include <map>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "stack/pipeline/dataplane.h"
#include "stack/transport/counters.h"

namespace uroce::control {

namespace {

using json = nlohmann::ordered_json;

/// Families in the order first seen, each with its samples together (the
/// format wants a family's samples contiguous, after one HELP and TYPE).
class Families {
 public:
  void add(const std::string& name, const char* type, std::string_view help, const std::string& labels,
           const json& value) {
    if (!value.is_number()) return;  // what the status lacks is left out, never made up
    auto [it, fresh] = index_.try_emplace(name, fams_.size());
    if (fresh) fams_.push_back({name, type, std::string(help), {}});
    Family& f = fams_[it->second];
    std::string line = name;
    if (!labels.empty()) line += "{" + labels + "}";
    line += ' ';
    line += number(value);
    f.samples.push_back(std::move(line));
  }
  void counter(const std::string& name, std::string_view help, const std::string& labels, const json& v) {
    add(name, "counter", help, labels, v);
  }
  void gauge(const std::string& name, std::string_view help, const std::string& labels, const json& v) {
    add(name, "gauge", help, labels, v);
  }
  std::string text() const {
    std::string out;
    for (const Family& f : fams_) {
      out += "# HELP " + f.name + " " + escape_help(f.help) + "\n";
      out += "# TYPE " + f.name + " " + f.type + "\n";
      for (const std::string& s : f.samples) out += s + "\n";
    }
    return out;
  }

 private:
  struct Family {
    std::string name, type, help;
    std::vector<std::string> samples;
  };
  static std::string number(const json& v) {
    if (v.is_number_unsigned()) return std::to_string(v.get<std::uint64_t>());
    if (v.is_number_integer()) return std::to_string(v.get<std::int64_t>());
    const double d = v.get<double>();
    if (std::isnan(d)) return "NaN";
    if (std::isinf(d)) return d > 0 ? "+Inf" : "-Inf";
    char buf[64];
    const auto r = std::to_chars(buf, buf + sizeof buf, d);
    return std::string(buf, r.ptr);
  }
  static std::string escape_help(const std::string& s) {
    std::string o;
    for (char c : s) {
      if (c == '\\') o += "\\\\";
      else if (c == '\n') o += "\\n";
      else o += c;
    }
    return o;
  }
  std::vector<Family> fams_;
  std::unordered_map<std::string, std::size_t> index_;
};

/// name="value", the value escaped as the format asks.
std::string label(std::string_view name, const std::string& value) {
  std::string o(name);
  o += "=\"";
  for (char c : value) {
    if (c == '\\') o += "\\\\";
    else if (c == '"') o += "\\\"";
    else if (c == '\n') o += "\\n";
    else o += c;
  }
  return o + "\"";
}

std::string str(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number()) return v.dump();
  return "";
}

const json kNull;

/// A count from the status: a non-negative integer, else 0.
std::uint64_t count(const json& v) {
  if (v.is_number_unsigned()) return v.get<std::uint64_t>();
  if (v.is_number_integer() && v.get<std::int64_t>() > 0) return static_cast<std::uint64_t>(v.get<std::int64_t>());
  return 0;
}
const json& at(const json& o, const std::string& k) {
  if (!o.is_object()) return kNull;
  const auto it = o.find(k);
  return it == o.end() ? kNull : *it;
}

/// rdma-core's mlx5 hardware counters (as `rdma statistic` and the
/// hw_counters folder name them) and the uroce counter each one is:
/// {mlx5 name, group ("qp" totals or "port"), uroce name}.
struct HwName {
  const char* mlx5;
  const char* group;
  const char* ours;
};
constexpr HwName kHw[] = {
    {"out_of_sequence", "qp", "out_of_sequence"},
    {"duplicate_request", "qp", "duplicate_request"},
    {"packet_seq_err", "qp", "rcvd_seq_err"},
    {"local_ack_timeout_err", "qp", "timeouts"},
    {"rnr_nak_retry_err", "qp", "rcvd_rnr_err"},
    {"out_of_buffer", "qp", "send_rnr_err"},
    {"implied_nak_seq_err", "qp", "completer_retry_err"},
    {"resp_remote_access_errors", "qp", "remote_access_err"},
    {"np_cnp_sent", "qp", "cnp_sent"},
    {"rp_cnp_handled", "qp", "cnp_received"},
    {"np_ecn_marked_roce_packets", "qp", "ce_marked"},
    {"rx_icrc_encapsulated", "port", "rx_icrc_err"},
};

int qp_state_number(const std::string& s) {
  static const std::map<std::string, int> k = {{"RESET", 0}, {"INIT", 1}, {"RTR", 2}, {"RTS", 3},
                                                {"SQD", 4},   {"SQE", 5},  {"ERR", 6}};
  const auto it = k.find(s);
  return it == k.end() ? -1 : it->second;
}

void node_wide(Families& f, const json& st) {
  f.gauge("uroce_pipelines", "pipelines (an engine on an lcore each)", "", at(st, "pipelines"));
  f.gauge("uroce_sessions", "application sessions open", "", at(st, "sessions"));
  const json& w = at(st, "wait");
  f.counter("uroce_wait_doorbells_total", "doorbells rung by applications that posted while the main lcore slept", "",
            at(w, "doorbells"));
  f.counter("uroce_wait_cq_notifies_total", "completion channels rung for applications that blocked on their CQs", "",
            at(w, "cq_notifies"));
  f.counter("uroce_wait_late_yields_total",
            "yields of the main lcore's core, between empty polls, that came back late: another process used the core",
            "", at(w, "late_yields"));
  f.counter("uroce_wait_rx_wakes_total", "sleeps the port's RX interrupt ended", "", at(w, "rx_wakes"));
  f.counter("uroce_wait_host_wakes_total", "sleeps the host netdev ended", "", at(w, "host_wakes"));
  const json& in = at(st, "intake");
  f.counter("uroce_intake_names_total", "queues applications named in their sessions' work rings", "", at(in, "names"));
  f.counter("uroce_intake_foreign_names_total", "work-ring names that were not the session's own queues, ignored", "",
            at(in, "foreign"));
  f.counter("uroce_intake_overflows_total", "full work rings (every queue of the session looked at once)", "",
            at(in, "overflows"));
  f.counter("uroce_intake_looks_total", "queues the intake handed to the engine", "", at(in, "looks"));
  f.counter("uroce_intake_scans_total", "looks at every queue of a session (older ABI, overflow)", "", at(in, "scans"));
  if (at(st, "cm").is_object())
    for (const auto& [k, v] : at(st, "cm").items()) {
      if (k == "connections")
        f.gauge("uroce_cm_connections", "RDMA CM connections the agent holds", "", v);
      else
        f.counter("uroce_cm_" + k + "_total", "RDMA CM agent: " + k, "", v);
    }
  const json& h = at(st, "host_netdev");
  const std::string hl = h.is_object() ? label("netdev", str(at(h, "name"))) : "";
  f.counter("uroce_host_netdev_from_kernel_frames_total", "frames the kernel sent through the host netdev", hl,
            at(h, "from_kernel"));
  f.counter("uroce_host_netdev_to_kernel_frames_total", "frames handed to the kernel through the host netdev", hl,
            at(h, "to_kernel"));
  f.counter("uroce_host_netdev_to_kernel_dropped_total", "frames for the kernel the host netdev refused", hl,
            at(h, "to_kernel_dropped"));
  const json& lim = at(st, "limits");
  if (lim.is_object())
    for (const auto& [k, v] : lim.items()) {
      if (!v.is_number()) continue;
      // Prometheus' conventions: base units (seconds), and no _total on a gauge.
      std::string name = k;
      json value = v;
      if (name.size() > 3 && name.ends_with("_ms")) {
        name = name.substr(0, name.size() - 3) + "_seconds";
        value = v.get<double>() / 1e3;
      } else if (name.ends_with("_total")) {
        name = name.substr(0, name.size() - 6) + "_all";
      }
      f.gauge("uroce_limit_" + name, "the daemon's bound " + k, "", value);
    }
  if (at(lim, "refused").is_object())
    for (const auto& [k, v] : at(lim, "refused").items())
      f.counter("uroce_refused_" + k + "_total", "requests or connections refused: " + k, "", v);
  if (at(lim, "delayed").is_object())
    for (const auto& [k, v] : at(lim, "delayed").items())
      f.counter("uroce_delayed_" + k + "_total", "requests that waited for their uid's rate: " + k, "", v);
  if (at(lim, "closed").is_object())
    for (const auto& [k, v] : at(lim, "closed").items())
      f.counter("uroce_sessions_closed_" + k + "_total", "sessions the daemon closed: " + k, "", v);
}

void tenants(Families& f, const json& st) {
  struct Sums {
    std::uint64_t sessions = 0, qps = 0, pds = 0, mrs = 0, mws = 0, cqs = 0, srqs = 0, mr_bytes = 0, doorbells = 0;
  };
  std::map<std::uint64_t, Sums> by_uid;
  const json& list = at(st, "session_list");
  if (!list.is_array()) return;
  const auto num = [](const json& v) { return count(v); };
  for (const json& s : list) {
    Sums& t = by_uid[num(at(s, "uid"))];
    ++t.sessions;
    t.qps += at(s, "qpns").is_array() ? at(s, "qpns").size() : 0;
    t.pds += num(at(s, "pds"));
    t.mrs += num(at(s, "mrs"));
    t.mws += num(at(s, "mws"));
    t.cqs += num(at(s, "cqs"));
    t.srqs += num(at(s, "srqs"));
    t.mr_bytes += num(at(s, "mr_bytes"));
    t.doorbells += num(at(s, "doorbells"));
  }
  for (const auto& [uid, t] : by_uid) {
    const std::string l = label("uid", std::to_string(uid));
    f.gauge("uroce_tenant_sessions", "sessions of the tenant (a Unix uid)", l, t.sessions);
    f.gauge("uroce_tenant_qps", "QPs the tenant holds", l, t.qps);
    f.gauge("uroce_tenant_pds", "PDs the tenant holds", l, t.pds);
    f.gauge("uroce_tenant_mrs", "MRs the tenant holds", l, t.mrs);
    f.gauge("uroce_tenant_mws", "memory windows the tenant holds", l, t.mws);
    f.gauge("uroce_tenant_cqs", "CQs the tenant holds", l, t.cqs);
    f.gauge("uroce_tenant_srqs", "SRQs the tenant holds", l, t.srqs);
    f.gauge("uroce_tenant_registered_bytes", "bytes the tenant has registered", l, t.mr_bytes);
    f.counter("uroce_tenant_doorbells_total", "doorbells the tenant's open sessions rang", l, t.doorbells);
  }
  // The transmit share (deficit round robin between uids), as the engine
  // counts it while two or more tenants hold QPs.
  const json& share = at(at(at(st, "limits"), "tx_share"), "tenants");
  if (!share.is_array()) return;
  for (const json& t : share) {
    const std::string l = label("uid", std::to_string(count(at(t, "uid"))));
    f.gauge("uroce_tenant_tx_weight", "the tenant's weight in the transmit share", l, at(t, "weight"));
    f.counter("uroce_tenant_tx_bytes_total", "wire bytes the tenant's QPs sent while the share was metered", l,
              at(t, "tx_bytes"));
    f.counter("uroce_tenant_tx_frames_total", "frames the tenant's QPs sent while the share was metered", l,
              at(t, "tx_frames"));
    f.counter("uroce_tenant_tx_throttled_total", "times one of the tenant's QPs waited for its share", l,
              at(t, "throttled"));
  }
}

void per_qp(Families& f, const json& q, const std::string& pl) {
  const std::string l = pl + "," + label("qpn", str(at(q, "qpn"))) + "," + label("type", str(at(q, "type"))) + "," +
                        label("peer", str(at(q, "peer")));
  f.gauge("uroce_per_qp_state", "the QP's state (ibv_qp_state: 0 RESET, 1 INIT, 2 RTR, 3 RTS, 4 SQD, 5 SQE, 6 ERR)", l,
          qp_state_number(str(at(q, "state"))));
  f.gauge("uroce_per_qp_sq_depth", "work requests in the QP's send queue", l, at(q, "sq_depth"));
  for (std::size_t i = 0; i < transport::kQpCounterNames.size(); ++i) {
    const std::string n(transport::kQpCounterNames[i]);
    f.counter("uroce_per_qp_" + n + "_total", transport::kQpCounterHelp[i], l, at(q, n));
  }
  const json& cc = at(q, "cc");
  const std::string cl = l + "," + label("algorithm", str(at(cc, "algorithm")));
  // Rates in bytes per second, Prometheus' base unit (the status has bits).
  const auto bytes = [](const json& bps) { return bps.is_number() ? json(bps.get<double>() / 8) : json(); };
  f.gauge("uroce_per_qp_cc_rate_bytes_per_second", "the congestion control's current rate", cl, bytes(at(cc, "rate_bps")));
  f.gauge("uroce_per_qp_cc_target_bytes_per_second", "the congestion control's target rate (DCQCN)", cl,
          bytes(at(cc, "target_bps")));
  f.gauge("uroce_per_qp_pace_bytes_per_second", "the pacer's rate (0: unpaced)", cl, bytes(at(cc, "pace_bps")));
  f.gauge("uroce_per_qp_cc_alpha", "DCQCN's alpha (the congestion estimate)", cl, at(cc, "alpha"));
  f.gauge("uroce_per_qp_cc_window_packets", "the congestion window (Swift)", cl, at(cc, "cwnd"));
  f.gauge("uroce_per_qp_window_packets", "packets the QP may have unacknowledged", cl, at(cc, "window"));
  f.counter("uroce_per_qp_rtt_samples_total", "round-trip samples taken", cl, at(cc, "rtt_samples"));
  const auto secs = [](const json& ns) { return ns.is_number() ? json(ns.get<double>() / 1e9) : json(); };
  f.gauge("uroce_per_qp_rtt_min_seconds", "the smallest round trip measured", cl, secs(at(cc, "rtt_min_ns")));
  f.gauge("uroce_per_qp_rtt_mean_seconds", "the mean round trip measured", cl, secs(at(cc, "rtt_mean_ns")));
  f.gauge("uroce_per_qp_rtt_p99_seconds", "the 99th percentile of the round trips measured", cl,
          secs(at(cc, "rtt_p99_ns")));
}

void pipelines(Families& f, const json& st, const MetricsOptions& o) {
  const std::size_t n = count(at(st, "pipelines"));
  for (std::size_t k = 0; k < n; ++k) {
    const std::string pre = k == 0 ? "" : "_" + std::to_string(k);
    const json& p = at(st, "pipeline" + pre);
    const std::string l = label("pipeline", std::to_string(k)) + "," + label("port", str(at(p, "port")));
    f.gauge("uroce_qps", "QPs on the pipeline", l, at(p, "qps"));
    f.gauge("uroce_quarantined_qpns", "QP numbers held back after their QP was destroyed", l,
            at(p, "quarantined_qpns"));
    const json& port = at(st, "port" + pre);
    for (std::size_t i = 0; i < transport::kPortCounterNames.size(); ++i) {
      const std::string c(transport::kPortCounterNames[i]);
      f.counter("uroce_port_" + c + "_total", transport::kPortCounterHelp[i], l, at(port, c));
    }
    const json& dp = at(st, "dataplane" + pre);
    for (std::size_t i = 0; i < static_cast<std::size_t>(pipeline::DpCounter::kCount); ++i) {
      const std::string c(pipeline::kDpCounterNames[i]);
      f.counter("uroce_dataplane_" + c + "_total", pipeline::kDpCounterHelp[i], l, at(dp, c));
    }
    const json& tot = at(st, "qp_totals" + pre);
    for (std::size_t i = 0; i < transport::kQpCounterNames.size(); ++i) {
      const std::string c(transport::kQpCounterNames[i]);
      f.counter("uroce_qp_" + c + "_total", std::string(transport::kQpCounterHelp[i]) + " (all the pipeline's QPs, destroyed ones too)", l,
                at(tot, c));
    }
    for (const HwName& h : kHw)
      f.counter(std::string("uroce_hw_") + h.mlx5 + "_total",
                std::string("rdma-core's mlx5 hardware counter ") + h.mlx5 + ": uroce's " + h.ours, l,
                at(std::string(h.group) == "qp" ? tot : port, h.ours));
    for (const char* dir : {"rx", "tx"}) {
      const json& fa = at(st, std::string("fault_") + dir + pre);
      if (!fa.is_object()) continue;
      const std::string fl = l + "," + label("direction", dir);
      for (const auto& [k, v] : fa.items())
        if (v.is_number()) f.counter("uroce_fault_" + k + "_total", "fault injection (--fault-rx, --fault-tx): " + k, fl, v);
    }
    const json& qps = at(st, "qp_list" + pre);
    std::size_t shown = 0, omitted = 0;
    if (qps.is_array())
      for (const json& q : qps) {
        if (shown < o.max_qps) {
          per_qp(f, q, l);
          ++shown;
        } else {
          ++omitted;
        }
      }
    if (o.max_qps) f.gauge("uroce_per_qp_omitted", "QPs past --metrics-qps, which have no per-QP series", l, omitted);
  }
  for (std::size_t k = 0;; ++k) {
    const json& e = at(st, "ethdev" + (k ? "_" + std::to_string(k) : std::string()));
    if (!e.is_object()) break;
    const std::string l = label("ethdev", std::to_string(k));
    f.counter("uroce_ethdev_rx_frames_total", "frames the DPDK port received", l, at(e, "rx"));
    f.counter("uroce_ethdev_tx_frames_total", "frames the DPDK port sent", l, at(e, "tx"));
    f.counter("uroce_ethdev_tx_dropped_total", "frames the DPDK port refused to send", l, at(e, "tx_dropped"));
    f.counter("uroce_ethdev_tx_zero_copy_total", "frames sent with their payload attached, not copied", l,
              at(e, "tx_zero_copy"));
    f.counter("uroce_ethdev_tx_copied_total", "frames sent with their payload copied", l, at(e, "tx_copied"));
    f.counter("uroce_ethdev_tx_looped_total", "frames to the port's own address, looped back without the wire", l,
              at(e, "tx_looped"));
    f.counter("uroce_ethdev_rx_missed_total", "frames the NIC dropped for want of room (imissed)", l, at(e, "imissed"));
    f.counter("uroce_ethdev_dispatch_drops_total", "frames a full shard ring dropped", l, at(e, "dispatch_drops"));
  }
}

}  // namespace

std::string render_metrics(const json& st, const MetricsOptions& o) {
  Families f;
  node_wide(f, st);
  pipelines(f, st, o);
  tenants(f, st);
  return f.text();
}

}  // namespace uroce::control
