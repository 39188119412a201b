// One impairment at one rate, for the tests that run a matrix of them
// (test_impairments.cc for go-back-N, test_selective.cc for selective repeat).
#pragma once

#include <gtest/gtest.h>

#include <string>

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

inline std::string name(const ::testing::TestParamInfo<Case>& i) {
  const char* k[] = {"loss", "dup", "reorder", "corrupt"};
  return std::string(k[static_cast<int>(i.param.kind)]) + "_" + std::to_string(i.param.percent);
}

}  // namespace uroce::testing
