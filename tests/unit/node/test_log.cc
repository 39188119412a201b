// The node's log lines (control/node/log.h): logfmt as tools read it, the
// same line as one JSON object with its fields, values quoted when they
// need it, and the limit on lines a peer can set off.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "control/node/log.h"

namespace uroce::control {
namespace {

TEST(Log, TextIsLogfmtWithTheMessageQuoted) {
  EXPECT_EQ(format_log(LogFormat::kText, "2026-12-06T22:00:00.000001Z", 1, "neighbour learned", "ip=10.0.0.2 mac=02:00:00:00:00:01"),
            "ts=2026-12-06T22:00:00.000001Z level=info msg=\"neighbour learned\" ip=10.0.0.2 mac=02:00:00:00:00:01");
  EXPECT_EQ(format_log(LogFormat::kText, "T", 3, "a \"quoted\" word", ""), "ts=T level=error msg=\"a \\\"quoted\\\" word\"");
}

TEST(Log, JsonIsOneObjectWithTheFields) {
  const std::string line = format_log(LogFormat::kJson, "T", 2, "fault injection changed",
                                      "dir=rx config=" + log_value("drop=0.01,reorder=0.02") + " note=" +
                                          log_value("say \"hi\"") + " bare");
  const auto j = nlohmann::json::parse(line);
  EXPECT_EQ(j["ts"], "T");
  EXPECT_EQ(j["level"], "warn");
  EXPECT_EQ(j["msg"], "fault injection changed");
  EXPECT_EQ(j["dir"], "rx");
  EXPECT_EQ(j["config"], "drop=0.01,reorder=0.02");
  EXPECT_EQ(j["note"], "say \"hi\"");
  EXPECT_EQ(j["bare"], true);
  EXPECT_EQ(line.find('\n'), std::string::npos) << "one line";
  // A field never overwrites ts, level or msg.
  EXPECT_EQ(nlohmann::json::parse(format_log(LogFormat::kJson, "T", 1, "m", "msg=other"))["msg"], "m");
}

TEST(Log, ValuesAreQuotedOnlyWhenTheyNeedIt) {
  EXPECT_EQ(log_value("plain"), "plain");
  EXPECT_EQ(log_value(""), "\"\"");
  EXPECT_EQ(log_value("a b"), "\"a b\"");
  EXPECT_EQ(log_value("k=v"), "\"k=v\"");
  EXPECT_EQ(log_value("back\\slash\nline"), "\"back\\\\slash\\nline\"");
}

TEST(Log, ALimitLetsABurstThroughThenAFewASecondAndCountsTheRest) {
  LogLimit l(5, 20);
  std::uint64_t held = 0;
  int out = 0;
  const std::uint64_t s = 1'000'000'000;
  for (int i = 0; i < 1000; ++i) out += l.allow(s + i * 1000, &held);  // 1000 in 1 ms
  EXPECT_EQ(out, 20);
  // A second later: 5 more tokens; the first says how many were held back.
  EXPECT_TRUE(l.allow(2 * s + 1000, &held));
  EXPECT_EQ(held, 980u);
  out = 0;
  for (int i = 0; i < 100; ++i) out += l.allow(2 * s + 2000 + i, &held);
  EXPECT_EQ(out, 4);
  // Ten quiet seconds refill the burst, no more.
  out = 0;
  for (int i = 0; i < 100; ++i) out += l.allow(13 * s + i, &held);
  EXPECT_EQ(out, 20);
}

TEST(Log, ABucketSaysHowLongUntilItsNextToken) {
  TokenBucket b(10, 10);  // a uid's control requests (node.cc)
  const std::uint64_t s = 1'000'000'000;
  for (int i = 0; i < 10; ++i) EXPECT_EQ(b.take(s + i), 0u) << "the burst";
  EXPECT_FALSE(b.full(s + 10));
  const std::uint64_t wait = b.take(s + 10);
  EXPECT_GT(wait, 99'000'000u) << "a tenth of a second at 10 a second";
  EXPECT_LE(wait, 100'000'000u);
  EXPECT_NE(b.take(s + 10 + wait / 2), 0u) << "not yet, and nothing was taken";
  EXPECT_EQ(b.take(s + 10 + wait), 0u) << "then one";
  EXPECT_FALSE(b.full(s + s / 2));
  EXPECT_TRUE(b.full(3 * s)) << "quiet long enough: full again (and may be forgotten)";
}

}  // namespace
}  // namespace uroce::control
