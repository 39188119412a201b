// Runs every packetdrill-style script in tests/scenario/ (one test per
// file), and checks that the runner itself catches what it must catch.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/scenario/runner.h"

#ifndef UROCE_SCENARIO_DIR
#error "UROCE_SCENARIO_DIR must name the directory of the .pkt scripts"
#endif

namespace uroce::scenario {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> scripts() {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(UROCE_SCENARIO_DIR))
    if (e.is_regular_file() && e.path().extension() == ".pkt") out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::string test_name(const ::testing::TestParamInfo<std::string>& i) {
  std::string n = fs::path(i.param).stem().string();
  for (char& c : n)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return n;
}

class Scenario : public ::testing::TestWithParam<std::string> {};

TEST_P(Scenario, Passes) {
  const Outcome o = run_file(GetParam());
  if (o.kind == Outcome::Kind::kSkip) GTEST_SKIP() << o.message;
  EXPECT_TRUE(o.kind == Outcome::Kind::kPass) << o.message;
}

INSTANTIATE_TEST_SUITE_P(Scripts, Scenario, ::testing::ValuesIn(scripts()), test_name);

TEST(ScenarioDir, HasScripts) { EXPECT_GE(scripts().size(), 11u); }

// ---- The runner catches mistakes, and says where.

constexpr const char* kSendSetup = R"(
qp rc mtu=1024 sq_psn=0x100
post_send op=SEND len=100 signaled wr_id=1
)";

Outcome run(const std::string& body) { return run_script(std::string(kSendSetup) + body, "self.pkt"); }

TEST(ScenarioRunner, PassesACorrectScript) {
  const Outcome o = run(R"(
expect RC_SEND_ONLY psn=0x100 ackreq len=100 at=0us
inject RC_ACKNOWLEDGE psn=0x100
expect_wc status=SUCCESS opcode=SEND wr_id=1
)");
  EXPECT_EQ(o.kind, Outcome::Kind::kPass) << o.message;
}

TEST(ScenarioRunner, WrongFieldFailsWithLineAndBothSides) {
  const Outcome o = run("expect RC_SEND_ONLY psn=0x100 len=99\n");
  ASSERT_EQ(o.kind, Outcome::Kind::kFail);
  EXPECT_NE(o.message.find("self.pkt:4: expect RC_SEND_ONLY psn=0x100 len=99"), std::string::npos) << o.message;
  EXPECT_NE(o.message.find("RC_SEND_ONLY dqp=0x000099 psn=256"), std::string::npos) << o.message;  // describe()
  EXPECT_NE(o.message.find("len (saw 0x64)"), std::string::npos) << o.message;
}

TEST(ScenarioRunner, WrongOpcodeOrPsnFails) {
  EXPECT_EQ(run("expect RC_SEND_FIRST psn=0x100\n").kind, Outcome::Kind::kFail);
  EXPECT_EQ(run("expect RC_SEND_ONLY psn=0x101\n").kind, Outcome::Kind::kFail);
}

TEST(ScenarioRunner, UnexpectedFrameFails) {
  const Outcome o = run("expect_none\n");
  ASSERT_EQ(o.kind, Outcome::Kind::kFail);
  EXPECT_NE(o.message.find("self.pkt:4: expect_none"), std::string::npos) << o.message;
}

TEST(ScenarioRunner, LeftoverFrameOrCompletionFailsAtTheEnd) {
  EXPECT_EQ(run("").kind, Outcome::Kind::kFail);
  const Outcome o = run("expect RC_SEND_ONLY psn=0x100\ninject RC_ACKNOWLEDGE psn=0x100\n");
  ASSERT_EQ(o.kind, Outcome::Kind::kFail);
  EXPECT_NE(o.message.find("completions the script did not expect"), std::string::npos) << o.message;
}

TEST(ScenarioRunner, MissingFrameFails) {
  const Outcome o = run("expect RC_SEND_ONLY psn=0x100\nexpect RC_SEND_ONLY psn=0x101\n");
  ASSERT_EQ(o.kind, Outcome::Kind::kFail);
  EXPECT_NE(o.message.find("self.pkt:5:"), std::string::npos) << o.message;
  EXPECT_NE(o.message.find("the DUT sent nothing"), std::string::npos) << o.message;
}

TEST(ScenarioRunner, TimersFireOnTheNanosecond) {
  // timeout=8: 4.096 us * 2^8 = 1048.576 us.
  const Outcome o = run(R"(
expect RC_SEND_ONLY psn=0x100
wait 1048us
expect_none
wait 1us
expect RC_SEND_ONLY psn=0x100 at=1048.576us
inject RC_ACKNOWLEDGE psn=0x100
expect_wc status=SUCCESS
)");
  EXPECT_EQ(o.kind, Outcome::Kind::kPass) << o.message;
}

TEST(ScenarioRunner, TyposAreErrors) {
  EXPECT_EQ(run("expect RC_SEND_ONLY psn=0x100 lenn=100\n").kind, Outcome::Kind::kFail);
  EXPECT_EQ(run("expect RC_SEND_ONY psn=0x100\n").kind, Outcome::Kind::kFail);
  EXPECT_EQ(run("frobnicate\n").kind, Outcome::Kind::kFail);
  EXPECT_EQ(run("wait 5 us\n").kind, Outcome::Kind::kFail);
}

TEST(ScenarioRunner, DisabledScriptIsSkippedWithItsReason) {
  const Outcome o = run_script("# DISABLED: engine bug 42\nqp rc\n", "self.pkt");
  EXPECT_EQ(o.kind, Outcome::Kind::kSkip);
  EXPECT_NE(o.message.find("engine bug 42"), std::string::npos);
}

}  // namespace
}  // namespace uroce::scenario
