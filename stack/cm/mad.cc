#include "stack/cm/mad.h"

namespace uroce::cm {

const char* to_string(Attr a) {
  switch (a) {
    case Attr::kReq: return "REQ";
    case Attr::kMra: return "MRA";
    case Attr::kRej: return "REJ";
    case Attr::kRep: return "REP";
    case Attr::kRtu: return "RTU";
    case Attr::kDreq: return "DREQ";
    case Attr::kDrep: return "DREP";
    case Attr::kSidrReq: return "SIDR_REQ";
    case Attr::kSidrRep: return "SIDR_REP";
  }
  return "?";
}

const char* to_string(MadError e) {
  switch (e) {
    case MadError::kOk: return "ok";
    case MadError::kShort: return "shorter than 256 bytes";
    case MadError::kBaseVersion: return "base version is not 1";
    case MadError::kClass: return "not the CM management class";
    case MadError::kClassVersion: return "CM class version is not 2";
    case MadError::kMethod: return "method is not Send";
    case MadError::kAttr: return "attribute is not a connection message";
  }
  return "?";
}

Mad Mad::make(Attr a, std::uint64_t tid) {
  Mad m{};
  m.hdr.base_version = kBaseVersion;
  m.hdr.mgmt_class = kMgmtClassCm;
  m.hdr.class_version = kCmClassVersion;
  m.hdr.method = kMethodSend;
  m.hdr.tid.set(tid);
  m.hdr.attr_id.set(static_cast<std::uint16_t>(a));
  return m;
}

MadError parse_mad(const std::uint8_t* p, std::size_t len, Mad& out) {
  if (len < kMadBytes) return MadError::kShort;
  std::memcpy(&out, p, kMadBytes);
  if (out.hdr.base_version != kBaseVersion) return MadError::kBaseVersion;
  if (out.hdr.mgmt_class != kMgmtClassCm) return MadError::kClass;
  if (out.hdr.class_version != kCmClassVersion) return MadError::kClassVersion;
  if (out.hdr.method != kMethodSend) return MadError::kMethod;
  const std::uint16_t a = out.hdr.attr_id.get();
  if (a < static_cast<std::uint16_t>(Attr::kReq) || a > static_cast<std::uint16_t>(Attr::kSidrRep))
    return MadError::kAttr;
  return MadError::kOk;
}

wire::IpAddr ip_from_gid(const std::uint8_t* gid) { return wire::IpAddr::from_v6_bytes(gid); }

void cma_addr(const wire::IpAddr& ip, std::uint8_t out[16]) {
  std::memset(out, 0, 16);
  if (ip.is_v4_mapped()) std::memcpy(out + 12, ip.v4(), 4);
  else std::memcpy(out, ip.b.data(), 16);
}

wire::IpAddr ip_from_cma(const std::uint8_t* a, std::uint8_t ip_version) {
  return (ip_version >> 4) == 4 ? wire::IpAddr::from_v4_bytes(a + 12) : wire::IpAddr::from_v6_bytes(a);
}

}  // namespace uroce::cm
