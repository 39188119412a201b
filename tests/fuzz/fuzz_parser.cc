// libFuzzer target for the frame parser (and, on frames it accepts, the
// decoder's summary code). Built with -Dfuzz=true under clang.
#include <cstddef>
#include <cstdint>

#include "stack/wire/parser.h"
#include "tools/pcap/decode.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  uroce::wire::Packet pkt;
  uroce::wire::ParseOptions opts;
  opts.verify_icrc = (size & 1) == 0;  // half the time look past the ICRC, to reach deeper checks
  const auto st = uroce::wire::parse_frame(uroce::wire::ConstBytes(data, size), opts, pkt);
  if (st.ok()) {
    volatile std::uint8_t sink = 0;
    for (auto b : pkt.payload()) sink = sink ^ b;
    (void)uroce::tools::describe(pkt);
    (void)uroce::tools::packet_json(pkt).dump();
  }
  static uroce::tools::Decoder dec(1024);
  (void)dec.add(uroce::wire::ConstBytes(data, size), pkt);
  return 0;
}
