// Communication Management MADs (IBTA 12.6) as RoCEv2 carries them: 256-byte
// management datagrams in UD SENDs between QP1s (Q_Key 0x80010000), with the
// IP-based private data header of RDMA CM (IBTA Annex A11 / RoCE service IDs).
//
// Views are byte-exact structs of bytes and big-endian fields, like the wire
// headers in stack/wire; sub-byte fields have accessors. Every size is pinned
// by a static_assert.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <optional>

#include "stack/wire/addr.h"
#include "stack/wire/be.h"

namespace uroce::cm {

using wire::be16;
using wire::be24;
using wire::be32;
using wire::be64;

inline constexpr std::size_t kMadBytes = 256;
inline constexpr std::uint8_t kBaseVersion = 1;
inline constexpr std::uint8_t kMgmtClassCm = 0x07;
inline constexpr std::uint8_t kCmClassVersion = 2;
inline constexpr std::uint8_t kMethodSend = 0x03;

enum class Attr : std::uint16_t {
  kReq = 0x0010,
  kMra = 0x0011,
  kRej = 0x0012,
  kRep = 0x0013,
  kRtu = 0x0014,
  kDreq = 0x0015,
  kDrep = 0x0016,
  kSidrReq = 0x0017,  // service ID resolution (IBTA 12.11): UD, rdma_cm's RDMA_PS_UDP
  kSidrRep = 0x0018,
};
const char* to_string(Attr a);

/// Reject reasons (IBTA 12.6.7.2, table 112) that uroce sends or names.
enum RejReason : std::uint16_t {
  kRejNoQp = 1,
  kRejNoResources = 3,
  kRejTimeout = 4,
  kRejInvalidCommId = 6,
  kRejInvalidServiceId = 8,
  kRejInvalidTransport = 9,
  kRejStaleConn = 10,
  kRejInvalidGid = 12,
  kRejInvalidMtu = 26,
  kRejConsumer = 28,
};

/// The common MAD header (IBTA 13.4.3), 24 bytes.
struct MadHdr {
  std::uint8_t base_version;
  std::uint8_t mgmt_class;
  std::uint8_t class_version;
  std::uint8_t method;
  be16 status;
  be16 class_specific;
  be64 tid;
  be16 attr_id;
  be16 reserved;
  be32 attr_mod;
};
static_assert(sizeof(MadHdr) == 24);

/// A path in a REQ (primary or alternate), 44 bytes.
struct CmPath {
  be16 local_lid, remote_lid;
  std::uint8_t local_gid[16];
  std::uint8_t remote_gid[16];
  be32 flow_label_rate;  // flow label (20) | reserved (6) | packet rate (6)
  std::uint8_t traffic_class;
  std::uint8_t hop_limit;
  std::uint8_t sl_subnet;    // SL (4) | subnet local (1) | reserved (3)
  std::uint8_t ack_timeout;  // local ACK timeout (5) | reserved (3)
};
static_assert(sizeof(CmPath) == 44);

/// ConnectRequest (IBTA 12.6.5).
struct Req {
  be32 local_comm_id;
  be32 reserved0;
  be64 service_id;
  be64 local_ca_guid;
  be32 reserved1;
  be32 local_qkey;
  be24 local_qpn;
  std::uint8_t responder_resources;
  be24 local_eecn;
  std::uint8_t initiator_depth;
  be24 remote_eecn;
  std::uint8_t b43;  // remote CM response timeout (5) | transport service type (2) | end-to-end flow control (1)
  be24 starting_psn;
  std::uint8_t b47;  // local CM response timeout (5) | retry count (3)
  be16 pkey;
  std::uint8_t b50;  // path MTU (4) | RDC exists (1) | RNR retry count (3)
  std::uint8_t b51;  // max CM retries (4) | SRQ (1) | extended transport type (3)
  CmPath primary;
  CmPath alternate;
  std::uint8_t private_data[92];

  [[nodiscard]] std::uint8_t remote_cm_timeout() const { return b43 >> 3; }
  [[nodiscard]] std::uint8_t transport() const { return (b43 >> 1) & 3; }  // 0 RC, 1 UC, 3 XRC
  [[nodiscard]] std::uint8_t local_cm_timeout() const { return b47 >> 3; }
  [[nodiscard]] std::uint8_t retry_count() const { return b47 & 7; }
  [[nodiscard]] std::uint8_t path_mtu() const { return b50 >> 4; }
  [[nodiscard]] std::uint8_t rnr_retry() const { return b50 & 7; }
  [[nodiscard]] std::uint8_t max_cm_retries() const { return b51 >> 4; }
  [[nodiscard]] bool srq() const { return (b51 >> 3) & 1; }
};
static_assert(sizeof(Req) == 232);

/// ConnectReply (IBTA 12.6.8).
struct Rep {
  be32 local_comm_id;
  be32 remote_comm_id;
  be32 local_qkey;
  be24 local_qpn;
  std::uint8_t reserved0;
  be24 local_eecn;
  std::uint8_t reserved1;
  be24 starting_psn;
  std::uint8_t reserved2;
  std::uint8_t responder_resources;
  std::uint8_t initiator_depth;
  std::uint8_t b26;  // target ACK delay (5) | failover accepted (2) | end-to-end flow control (1)
  std::uint8_t b27;  // RNR retry count (3) | SRQ (1) | reserved (4)
  be64 local_ca_guid;
  std::uint8_t private_data[196];

  [[nodiscard]] std::uint8_t target_ack_delay() const { return b26 >> 3; }
  [[nodiscard]] std::uint8_t rnr_retry() const { return b27 >> 5; }
  [[nodiscard]] bool srq() const { return (b27 >> 4) & 1; }
};
static_assert(sizeof(Rep) == 232);

/// ReadyToUse, DisconnectReply (IBTA 12.6.9, 12.6.11): the comm IDs and private data.
struct Rtu {
  be32 local_comm_id;
  be32 remote_comm_id;
  std::uint8_t private_data[224];
};
static_assert(sizeof(Rtu) == 232);
using Drep = Rtu;

/// ServiceIDResolutionRequest (IBTA 12.6.13): which QP serves this service ID?
struct SidrReq {
  be32 request_id;
  be16 pkey;
  be16 reserved;
  be64 service_id;
  std::uint8_t private_data[216];  // RDMA CM's header, then the application's
};
static_assert(sizeof(SidrReq) == 232);

/// SIDR_REP's status (IBTA 12.6.14, table 121).
enum SidrStatus : std::uint8_t {
  kSidrOk = 0,               // the QP and Q_Key are valid
  kSidrNoService = 1,        // service ID not supported (nobody listens)
  kSidrRejected = 2,         // the service provider rejected the request
  kSidrNoQp = 3,
};

/// ServiceIDResolutionResponse (IBTA 12.6.14).
struct SidrRep {
  be32 request_id;
  std::uint8_t status;
  std::uint8_t info_len;
  be16 reserved;
  be24 qpn;
  std::uint8_t reserved1;
  be64 service_id;
  be32 qkey;
  std::uint8_t info[72];  // ClassPortInfo when redirecting
  std::uint8_t private_data[136];
};
static_assert(sizeof(SidrRep) == 232);

/// ConnectReject (IBTA 12.6.7).
struct Rej {
  be32 local_comm_id;
  be32 remote_comm_id;
  std::uint8_t b8;  // message rejected (2): 0 REQ, 1 REP, 2 other | reserved (6)
  std::uint8_t b9;  // reject info length (7) | reserved (1)
  be16 reason;
  std::uint8_t ari[72];
  std::uint8_t private_data[148];

  [[nodiscard]] std::uint8_t msg_rejected() const { return b8 >> 6; }
};
static_assert(sizeof(Rej) == 232);

/// DisconnectRequest (IBTA 12.6.10).
struct Dreq {
  be32 local_comm_id;
  be32 remote_comm_id;
  be24 remote_qpn;
  std::uint8_t reserved;
  std::uint8_t private_data[220];
};
static_assert(sizeof(Dreq) == 232);

/// MessageReceiptAcknowledgement (IBTA 12.6.6).
struct Mra {
  be32 local_comm_id;
  be32 remote_comm_id;
  std::uint8_t b8;  // message MRAed (2) | reserved (6)
  std::uint8_t b9;  // service timeout (5) | reserved (3)
  std::uint8_t private_data[222];

  [[nodiscard]] std::uint8_t service_timeout() const { return b9 >> 3; }
};
static_assert(sizeof(Mra) == 232);

/// RDMA CM's header at the start of a REQ's private data (Annex A11.6):
/// version, IP version, the active side's port, then both addresses (IPv4
/// in the last four bytes of each 16).
struct CmaHdr {
  std::uint8_t cma_version;  // 0
  std::uint8_t ip_version;   // IP version (4 or 6) in the high nibble
  be16 src_port;
  std::uint8_t src_addr[16];
  std::uint8_t dst_addr[16];
};
static_assert(sizeof(CmaHdr) == 36);
inline constexpr std::size_t kReqUserPrivate = sizeof(Req::private_data) - sizeof(CmaHdr);  // 56

/// RoCE/IP service IDs (Annex A11): 0x0000000001 | port space | port.
inline constexpr std::uint64_t kServiceIdPrefix = 0x0000000001000000ull;
inline constexpr std::uint8_t kPortSpaceTcp = 0x06;  // RDMA_PS_TCP: RC connections
inline constexpr std::uint8_t kPortSpaceUdp = 0x11;  // RDMA_PS_UDP: UD, through SIDR
inline constexpr std::size_t kSidrUserPrivate = sizeof(SidrReq::private_data) - 36;  // 180, after RDMA CM's header
constexpr std::uint64_t service_id(std::uint8_t ps, std::uint16_t port) {
  return kServiceIdPrefix | (std::uint64_t{ps} << 16) | port;
}

/// A whole MAD: header plus one message.
struct Mad {
  MadHdr hdr;
  std::uint8_t data[232];

  template <typename M>
  M& as() {
    static_assert(sizeof(M) == sizeof(data));
    return *reinterpret_cast<M*>(data);
  }
  template <typename M>
  const M& as() const {
    static_assert(sizeof(M) == sizeof(data));
    return *reinterpret_cast<const M*>(data);
  }
  [[nodiscard]] Attr attr() const { return static_cast<Attr>(hdr.attr_id.get()); }
  /// A CM Send MAD with this attribute and transaction ID, all else zero.
  static Mad make(Attr a, std::uint64_t tid);
};
static_assert(sizeof(Mad) == kMadBytes);

/// Why a datagram on QP1 is not a CM MAD we act on.
enum class MadError : std::uint8_t { kOk, kShort, kBaseVersion, kClass, kClassVersion, kMethod, kAttr };
const char* to_string(MadError e);

/// Checks a received MAD and copies it out (the receive buffer is reused).
MadError parse_mad(const std::uint8_t* p, std::size_t len, Mad& out);

/// The IP address in a 16-byte GID or CM address field (IPv4-mapped or IPv6).
wire::IpAddr ip_from_gid(const std::uint8_t* gid);
/// The CmaHdr address form: IPv4 in the last four bytes, zeros before.
void cma_addr(const wire::IpAddr& ip, std::uint8_t out[16]);
wire::IpAddr ip_from_cma(const std::uint8_t* a, std::uint8_t ip_version);

}  // namespace uroce::cm
