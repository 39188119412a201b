// One impairment at one rate, for the tests that run a matrix of them
// (test_impairments.cc for go-back-N, test_selective.cc for selective repeat).
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "drivers/sim/sim_wire.h"

namespace uroce::testing {

enum class Kind { kLoss, kDup, kReorder, kCorrupt };

struct Case {
  Kind kind;
  int percent;
  /// The wire's impairments for this case.
  [[nodiscard]] sim::Impairments impairments() const {
    sim::Impairments imp;
    const double p = percent / 100.0;
    switch (kind) {
      case Kind::kLoss: imp.loss = p; break;
      case Kind::kDup: imp.dup = p; break;
      case Kind::kReorder: imp.reorder = p; break;
      case Kind::kCorrupt: imp.corrupt = p; break;
    }
    return imp;
  }
};

/// The matrix both run: no impairment, then each kind at 1, 5 and 20%.
inline const std::vector<Case>& matrix() {
  static const std::vector<Case> m = {
      {Kind::kLoss, 0},     {Kind::kLoss, 1},     {Kind::kLoss, 5},      {Kind::kLoss, 20},    {Kind::kDup, 1},
      {Kind::kDup, 5},      {Kind::kDup, 20},     {Kind::kReorder, 1},   {Kind::kReorder, 5},  {Kind::kReorder, 20},
      {Kind::kCorrupt, 1},  {Kind::kCorrupt, 5},  {Kind::kCorrupt, 20},
  };
  return m;
}

inline std::string name(const ::testing::TestParamInfo<Case>& i) {
  const char* k[] = {"loss", "dup", "reorder", "corrupt"};
  return std::string(k[static_cast<int>(i.param.kind)]) + "_" + std::to_string(i.param.percent);
}

}  // namespace uroce::testing
