// libFuzzer target for the operator's input: uroced's options as one
// command line (a device spec in embedded mode is the same), or, when the
// first byte is odd, the rest as a config file's contents. Every input must
// parse or be refused with a reason; never crash, hang or throw. Built with
// -Dfuzz=true.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "control/node/options.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  using uroce::control::NodeOptions;
  using uroce::control::ParseResult;
  const std::string rest(reinterpret_cast<const char*>(data + 1), size - 1);
  NodeOptions o;
  std::string text;
  ParseResult r;
  if (data[0] & 1) {
    // A config file: written to a memfd, read back through its /proc path.
    static const int fd = ::memfd_create("fuzz.conf", MFD_CLOEXEC);
    if (fd < 0) std::abort();
    if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, rest.data(), rest.size(), 0) != static_cast<ssize_t>(rest.size()))
      std::abort();
    r = uroce::control::parse_options("--config /proc/self/fd/" + std::to_string(fd), o, text);
  } else {
    r = uroce::control::parse_options(rest, o, text);
  }
  if (r != ParseResult::kOk && text.empty()) std::abort();  // a refusal always says why
  return 0;
}
