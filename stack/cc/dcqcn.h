// DCQCN's reaction point (Zhu et al., "Congestion Control for Large-Scale
// RDMA Deployments", SIGCOMM 2015, section 3.1 and figure 5): a rate-based
// algorithm driven by CNPs. A CNP cuts the current rate by alpha/2 and
// remembers the rate before as the target; alpha rises on every CNP and
// decays each alpha period without one. Between CNPs the rate climbs back
// toward the target in stages counted by a timer and a byte counter: fast
// recovery (halfway to the target) for the first F stages, then additive
// increase (the target grows by R_AI), then hyper increase (by i x R_HAI)
// once both counters are past F.
#pragma once

#include "stack/cc/cc.h"

namespace uroce::cc {

/// Each default names where it comes from. "The paper" is Zhu et al. 2015;
/// its parameter set (g, K, T, B, F, R_AI) is the one its fluid model and
/// its first author's ns-3 simulator (github.com/bobzhuyb/ns3-rdma,
/// mix/config.txt) use. "mlx5" is the firmware default that ConnectX-4 and
/// later NICs report (NVIDIA's "DCQCN CC Parameters" page, and `mlxconfig
/// query` on a ConnectX-5, firmware 16.27). Where the two differ, the other
/// value is named too, so a researcher can set it.
struct DcqcnParams {
  /// g, alpha's gain: 1/256 (the paper). mlx5's dce_tcp_g (1019 of 1024) is
  /// not the same quantity, so it is not used.
  double g = 1.0 / 256;
  /// Alpha's initial value: 1 (the paper; mlx5's initial_alpha_value 1023 of 1023).
  double initial_alpha = 1.0;
  /// K, the alpha update period: 55 us (the paper; mlx5's dce_tcp_rtt is 1 us).
  std::uint64_t alpha_period_ns = 55'000;
  /// T, the rate-increase timer: 55 us (the paper; mlx5's rpg_time_reset is 300 us).
  std::uint64_t increase_period_ns = 55'000;
  /// B, the byte counter: 10 MB (the paper; mlx5's rpg_byte_reset is 32,767 bytes).
  std::uint64_t byte_counter = 10'000'000;
  /// F, the fast recovery stages: 5 (the paper; mlx5's rpg_threshold is 1).
  std::uint32_t fast_recovery = 5;
  /// R_AI: 40 Mb/s (the paper; mlx5's rpg_ai_rate is 5 Mb/s).
  double ai_bps = 40e6;
  /// R_HAI: 50 Mb/s (mlx5's rpg_hai_rate). The paper defines hyper increase
  /// but gives no figure for it; its first author's simulator config uses 200 Mb/s.
  double hai_bps = 50e6;
  /// At most one cut per 4 us (mlx5's rate_reduce_monitor_period).
  std::uint64_t reduce_period_ns = 4'000;
  /// The rate never falls below 1 Mb/s (mlx5's rpg_min_rate).
  double min_rate_bps = 1e6;
};

class Dcqcn final : public Algorithm {
 public:
  Dcqcn(const Path& path, const DcqcnParams& p = {});
  [[nodiscard]] std::string_view name() const override { return "dcqcn"; }
  void on_cnp(std::uint64_t now) override;
  void on_tx(std::uint64_t now, std::uint32_t bytes) override;
  void on_timer(std::uint64_t now) override;
  [[nodiscard]] std::uint64_t next_timer() const override;
  [[nodiscard]] State state() const override { return {rc_, rt_, alpha_, 0}; }

  // For tests and telemetry.
  [[nodiscard]] std::uint32_t timer_stage() const { return t_stage_; }
  [[nodiscard]] std::uint32_t byte_stage() const { return b_stage_; }
  [[nodiscard]] std::uint64_t cnps_ignored() const { return ignored_; }

 private:
  void increase();
  void publish();
  DcqcnParams p_;
  double line_;
  double rc_, rt_, alpha_;
  std::uint64_t last_cut_ = 0;      // when the rate was last cut (0: never)
  std::uint64_t alpha_next_ = 0;    // the alpha timer (0: off)
  std::uint64_t increase_next_ = 0; // the rate-increase timer (0: off)
  std::uint64_t bytes_ = 0;         // toward the byte counter
  std::uint32_t t_stage_ = 0, b_stage_ = 0;
  std::uint64_t ignored_ = 0;       // CNPs within reduce_period of a cut
};

}  // namespace uroce::cc
