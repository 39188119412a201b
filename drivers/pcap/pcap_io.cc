#include "drivers/pcap/pcap_io.h"

#include <pcap/pcap.h>

namespace uroce::pcapio {

Reader::~Reader() {
  if (handle_ != nullptr) pcap_close(handle_);
}

bool Reader::open(const std::string& path) {
  char errbuf[PCAP_ERRBUF_SIZE] = {};
  handle_ = pcap_open_offline(path.c_str(), errbuf);
  if (handle_ == nullptr) {
    error_ = errbuf;
    return false;
  }
  linktype_ = pcap_datalink(handle_);
  if (linktype_ != DLT_EN10MB) {
    error_ = "unsupported link type " + std::to_string(linktype_) + " (need Ethernet)";
    return false;
  }
  return true;
}

bool Reader::next(Frame& f) {
  if (handle_ == nullptr) return false;
  pcap_pkthdr* hdr = nullptr;
  const u_char* data = nullptr;
  const int rc = pcap_next_ex(handle_, &hdr, &data);
  if (rc == 1) {
    f.ts_sec = hdr->ts.tv_sec;
    f.ts_usec = hdr->ts.tv_usec;
    f.orig_len = hdr->len;
    f.data = wire::ConstBytes(data, hdr->caplen);
    return true;
  }
  if (rc == PCAP_ERROR) error_ = pcap_geterr(handle_);
  return false;
}

Writer::~Writer() { close(); }

bool Writer::open(const std::string& path, std::uint32_t snaplen) {
  dead_ = pcap_open_dead(DLT_EN10MB, static_cast<int>(snaplen));
  if (dead_ == nullptr) {
    error_ = "pcap_open_dead failed";
    return false;
  }
  dumper_ = pcap_dump_open(dead_, path.c_str());
  if (dumper_ == nullptr) {
    error_ = pcap_geterr(dead_);
    pcap_close(dead_);
    dead_ = nullptr;
    return false;
  }
  return true;
}

void Writer::write(wire::ConstBytes frame, std::int64_t ts_sec, std::int64_t ts_usec) {
  if (dumper_ == nullptr) return;
  pcap_pkthdr hdr{};
  hdr.ts.tv_sec = static_cast<time_t>(ts_sec);
  hdr.ts.tv_usec = static_cast<suseconds_t>(ts_usec);
  hdr.caplen = static_cast<bpf_u_int32>(frame.size());
  hdr.len = static_cast<bpf_u_int32>(frame.size());
  pcap_dump(reinterpret_cast<u_char*>(dumper_), &hdr, frame.data());
}

void Writer::flush() {
  if (dumper_ != nullptr) pcap_dump_flush(dumper_);
}

void Writer::close() {
  if (dumper_ != nullptr) {
    pcap_dump_close(dumper_);
    dumper_ = nullptr;
  }
  if (dead_ != nullptr) {
    pcap_close(dead_);
    dead_ = nullptr;
  }
}

}  // namespace uroce::pcapio
