// The status as Prometheus metrics (control/node/metrics.h): each family
// once, with its samples together, across pipelines; label values escaped;
// per-QP series capped, the rest counted; nothing made up for what the
// status lacks. (tests/integration/metrics.sh runs promtool and a parser
// on a live daemon's.)
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "control/node/metrics.h"

namespace uroce::control {
namespace {

using json = nlohmann::ordered_json;

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream is(text);
  for (std::string l; std::getline(is, l);) out.push_back(l);
  return out;
}

json two_pipelines() {
  json st;
  st["pipelines"] = 2;
  st["sessions"] = 1;
  st["pipeline"] = {{"port", "net_memif0"}, {"qps", 3}, {"quarantined_qpns", 0}};
  st["pipeline_1"] = {{"port", "we\"ird\\port"}, {"qps", 0}, {"quarantined_qpns", 0}};
  st["port"] = {{"rx_frames", 10}};
  st["port_1"] = {{"rx_frames", 20}};
  st["qp_totals"] = {{"completions", 7}, {"cnp_sent", 2}};
  st["qp_totals_1"] = {{"completions", 1}, {"cnp_sent", 0}};
  json qps = json::array();
  for (int q = 0; q < 3; ++q)
    qps.push_back({{"qpn", 17 + q}, {"type", "RC"}, {"state", "RTS"}, {"peer", "10.0.0.2"}, {"sq_depth", 0},
                   {"completions", q}, {"cc", {{"algorithm", "dcqcn"}, {"rate_bps", 8000}, {"rtt_p99_ns", 2000}}}});
  st["qp_list"] = qps;
  st["session_list"] = json::array({{{"uid", 1000}, {"qpns", json::array({17, 18, 19})}, {"mr_bytes", 4096}}});
  return st;
}

TEST(Metrics, EachFamilyOnceWithItsSamplesTogether) {
  const auto l = lines(render_metrics(two_pipelines(), {}));
  std::size_t help = 0, type = 0, first = 0, last = 0;
  for (std::size_t i = 0; i < l.size(); ++i) {
    help += l[i] == "# HELP uroce_port_rx_frames_total frames handed to the engine";
    type += l[i] == "# TYPE uroce_port_rx_frames_total counter";
    if (l[i].rfind("uroce_port_rx_frames_total{", 0) == 0) {
      if (!first) first = i;
      last = i;
    }
  }
  EXPECT_EQ(type, 1u);
  EXPECT_EQ(help, 1u);
  EXPECT_EQ(last, first + 1) << "pipeline 0's and pipeline 1's samples next to each other";
  EXPECT_EQ(l[first], "uroce_port_rx_frames_total{pipeline=\"0\",port=\"net_memif0\"} 10");
  // The label value's quote and backslash escaped.
  EXPECT_EQ(l[last], "uroce_port_rx_frames_total{pipeline=\"1\",port=\"we\\\"ird\\\\port\"} 20");
}

TEST(Metrics, Mlx5NamesAndTenants) {
  const std::string t = render_metrics(two_pipelines(), {});
  EXPECT_NE(t.find("uroce_hw_np_cnp_sent_total{pipeline=\"0\",port=\"net_memif0\"} 2\n"), std::string::npos);
  EXPECT_NE(t.find("uroce_tenant_qps{uid=\"1000\"} 3\n"), std::string::npos);
  EXPECT_NE(t.find("uroce_tenant_registered_bytes{uid=\"1000\"} 4096\n"), std::string::npos);
}

TEST(Metrics, PerQpSeriesOnlyWhenAskedAndCapped) {
  EXPECT_EQ(render_metrics(two_pipelines(), {}).find("uroce_per_qp_"), std::string::npos);
  const std::string t = render_metrics(two_pipelines(), {2});
  EXPECT_NE(t.find("uroce_per_qp_state{pipeline=\"0\",port=\"net_memif0\",qpn=\"17\",type=\"RC\",peer=\"10.0.0.2\"} 3\n"),
            std::string::npos);
  EXPECT_NE(t.find("qpn=\"18\""), std::string::npos);
  EXPECT_EQ(t.find("qpn=\"19\""), std::string::npos) << "past the cap";
  EXPECT_NE(t.find("uroce_per_qp_omitted{pipeline=\"0\",port=\"net_memif0\"} 1\n"), std::string::npos);
  // Base units: bytes per second, seconds.
  EXPECT_NE(t.find("uroce_per_qp_cc_rate_bytes_per_second{pipeline=\"0\",port=\"net_memif0\",qpn=\"17\",type=\"RC\","
                   "peer=\"10.0.0.2\",algorithm=\"dcqcn\"} 1000\n"),
            std::string::npos);
  EXPECT_NE(t.find("uroce_per_qp_rtt_p99_seconds{"), std::string::npos);
  EXPECT_NE(t.find("} 2e-06\n"), std::string::npos);
}

TEST(Metrics, NothingMadeUpForWhatTheStatusLacks) {
  EXPECT_EQ(render_metrics(json::object(), {}), "");
  json st;
  st["pipelines"] = 1;
  const std::string t = render_metrics(st, {});
  EXPECT_NE(t.find("uroce_pipelines 1\n"), std::string::npos);
  EXPECT_EQ(t.find("uroce_port_"), std::string::npos);
}

}  // namespace
}  // namespace uroce::control
