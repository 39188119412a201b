// Packetdrill-style scenario runner for the transport engine.
//
// One engine under test (the DUT) holds one real QP. The peer is the script
// itself: it injects hand-built frames into the DUT (Engine::rx) and states
// the exact frames the DUT must emit (Engine::drain_tx). Time is virtual and
// only moves on `wait`. Any frame or completion the script did not expect
// fails the test. The script format is described in tests/scenario/README.md.
#pragma once

#include <string>
#include <string_view>

namespace uroce::scenario {

struct Outcome {
  enum class Kind { kPass, kFail, kSkip };
  Kind kind = Kind::kPass;
  /// For kFail: "file:line: command" and what was expected and seen.
  /// For kSkip: the reason from the script's `# DISABLED:` line.
  std::string message;
};

/// Runs the script in the file at `path`.
Outcome run_file(const std::string& path);

/// Runs script text; `name` stands for the file name in messages.
Outcome run_script(std::string_view text, const std::string& name);

}  // namespace uroce::scenario
