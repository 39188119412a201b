// pcap and pcapng file I/O through libpcap, for the decoder, the daemon's
// --capture option and the tests.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "stack/wire/be.h"

struct pcap;
struct pcap_dumper;

namespace uroce::pcapio {

struct Frame {
  std::int64_t ts_sec = 0;
  std::int64_t ts_usec = 0;
  std::uint32_t orig_len = 0;  // length on the wire
  wire::ConstBytes data;       // captured bytes (may be shorter than orig_len)
};

/// Reads pcap or pcapng (libpcap detects which). Ethernet link type only.
class Reader {
 public:
  Reader() = default;
  ~Reader();
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;

  /// Opens `path`; on failure returns false and sets error().
  bool open(const std::string& path);
  /// Next frame, or false at end of file or on error (see error()).
  bool next(Frame& f);
  [[nodiscard]] const std::string& error() const { return error_; }
  [[nodiscard]] int linktype() const { return linktype_; }

 private:
  pcap* handle_ = nullptr;
  int linktype_ = -1;
  std::string error_;
};

/// Writes classic pcap (microsecond timestamps, Ethernet link type).
class Writer {
 public:
  Writer() = default;
  ~Writer();
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;

  bool open(const std::string& path, std::uint32_t snaplen = 65535);
  void write(wire::ConstBytes frame, std::int64_t ts_sec, std::int64_t ts_usec);
  void flush();
  void close();
  [[nodiscard]] const std::string& error() const { return error_; }

 private:
  pcap* dead_ = nullptr;
  pcap_dumper* dumper_ = nullptr;
  std::string error_;
};

}  // namespace uroce::pcapio
