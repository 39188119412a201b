#include "stack/wire/psn.h"

#include <gtest/gtest.h>

#include "stack/wire/be.h"

namespace uroce::wire {
namespace {

TEST(Psn, MasksTo24Bits) {
  EXPECT_EQ(Psn(0x1234567).value(), 0x234567u);
  EXPECT_EQ((Psn(0xffffff) + 1).value(), 0u);
  EXPECT_EQ((Psn(0) - 1).value(), 0xffffffu);
}

TEST(Psn, DistanceAcrossWrap) {
  for (std::uint32_t base : {0u, 1u, 0x7fffffu, 0x800000u, 0xfffff0u, 0xffffffu}) {
    const Psn a(base);
    for (std::int32_t d : {-0x800000, -100, -1, 0, 1, 100, 0x7fffff}) {
      const Psn b = a + static_cast<std::uint32_t>(d);
      EXPECT_EQ(distance(a, b), d) << "base " << base << " d " << d;
      EXPECT_EQ(is_before(a, b), d > 0);
    }
  }
}

TEST(Psn, Window) {
  EXPECT_TRUE(in_window(Psn(0xffffff), Psn(0xfffffe), 2));
  EXPECT_FALSE(in_window(Psn(0), Psn(0xfffffe), 2));
  EXPECT_TRUE(in_window(Psn(0), Psn(0xfffffe), 3));
  EXPECT_FALSE(in_window(Psn(0xfffffd), Psn(0xfffffe), 3));
}

TEST(Be, RoundTripsAndByteOrder) {
  be32 v = be32::from(0x01020304);
  EXPECT_EQ(v.b[0], 1);
  EXPECT_EQ(v.b[3], 4);
  EXPECT_EQ(v.get(), 0x01020304u);
  be64 w = be64::from(0x0102030405060708ull);
  EXPECT_EQ(w.b[0], 1);
  EXPECT_EQ(w.b[7], 8);
  be24 x{};
  x.set(0xabcdef);
  EXPECT_EQ(x.b[0], 0xab);
  EXPECT_EQ(x.get(), 0xabcdefu);
}

}  // namespace
}  // namespace uroce::wire
