// perftest's key message, as perftest 6.06 formats it (KEY_PRINT_FMT_GID:
// fixed-width lower-case hex fields, ':' after each, a NUL, 108 bytes).
#include <gtest/gtest.h>

#include <cstring>

#include "tools/perf/perftest_oob.h"

namespace uroce::perf {
namespace {

Dest sample() {
  Dest d;
  d.lid = 0;
  d.out_reads = 1;
  d.qpn = 0x11;
  d.psn = 0xabcdef;
  d.rkey = 0x1234;
  d.vaddr = 0x7f0000001000ull;
  const std::uint8_t gid[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1};
  std::memcpy(d.gid.data(), gid, 16);
  return d;
}

TEST(PerftestKeys, FormatIsPerftests) {
  const auto m = format_keys(sample());
  EXPECT_STREQ(m.data(),
               "0000:0001:000011:abcdef:00001234:00007f0000001000:"
               "00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:00:01:00000000:");
  EXPECT_EQ(std::strlen(m.data()), 107u);
  EXPECT_EQ(m.size(), 108u);
}

TEST(PerftestKeys, ParseRoundTrip) {
  const Dest d = sample();
  const auto m = format_keys(d);
  Dest back;
  ASSERT_TRUE(parse_keys(m.data(), m.size(), back));
  EXPECT_EQ(back, d);
}

TEST(PerftestKeys, ParseRefusesWhatPerftestWouldNotSend) {
  auto m = format_keys(sample());
  Dest out;
  EXPECT_FALSE(parse_keys(m.data(), 59, out));  // the non-GID size
  auto upper = m;
  upper[10] = 'A';  // hex is lower case
  EXPECT_FALSE(parse_keys(upper.data(), upper.size(), out));
  auto no_colon = m;
  no_colon[106] = '0';  // the trailing ':' after srqn
  EXPECT_FALSE(parse_keys(no_colon.data(), no_colon.size(), out));
  auto no_nul = m;
  no_nul[107] = 'x';
  EXPECT_FALSE(parse_keys(no_nul.data(), no_nul.size(), out));
}

}  // namespace
}  // namespace uroce::perf
