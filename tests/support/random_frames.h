// Random valid RoCEv2 frame specs across every opcode in the table, for the
// conformance generator and the robustness tests.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "stack/wire/builder.h"

namespace uroce::testing {

struct RandomFrame {
  wire::FrameSpec spec;
  std::vector<std::uint8_t> payload;
};

/// All valid opcodes in the table, in numeric order.
std::vector<std::uint8_t> valid_opcodes();

/// A random frame for `opcode`: random addresses, VLAN (half the time when
/// `allow_vlan`), DSCP/ECN, BTH fields and extension header values, and a
/// payload of 0..max_payload bytes when the opcode carries one.
RandomFrame random_frame(std::mt19937_64& rng, std::uint8_t opcode, wire::IpVersion ipver, bool allow_vlan,
                         std::uint32_t max_payload = 4096);

}  // namespace uroce::testing
