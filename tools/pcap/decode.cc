#include "tools/pcap/decode.h"

#include <cinttypes>
#include <cstdio>

namespace uroce::tools {

using wire::AethKind;
using wire::OpcodeInfo;

namespace {

void appendf(std::string& s, const char* fmt, auto... args) {
  char buf[128];
  const int n = std::snprintf(buf, sizeof(buf), fmt, args...);
  if (n > 0) s.append(buf, static_cast<std::size_t>(n < static_cast<int>(sizeof(buf)) ? n : sizeof(buf) - 1));
}

}  // namespace

std::string_view nak_name(unsigned code) {
  switch (code) {
    case 0: return "psn_seq_error";
    case 1: return "invalid_request";
    case 2: return "remote_access_error";
    case 3: return "remote_operational_error";
    case 4: return "invalid_rd_request";
    default: return "reserved";
  }
}

wire::ParseStatus Decoder::add(wire::ConstBytes frame, wire::Packet& pkt) {
  ++totals_.frames;
  const wire::ParseStatus st = wire::parse_frame(frame, wire::ParseOptions{}, pkt);
  if (!st.ok() && !st.roce) {
    ++totals_.non_roce;
    return st;
  }
  ++totals_.roce;
  if (!st.ok()) {
    ++totals_.malformed;
    if (st.reject == wire::Reject::kBadIcrc) ++totals_.bad_icrc;
    return st;
  }
  account(pkt);
  return st;
}

void Decoder::account(const wire::Packet& pkt) {
  QpSummary& s = qps_[QpKey{pkt.dst, pkt.destqp}];
  const OpcodeInfo& info = *pkt.info;
  ++s.packets;
  s.payload_bytes += pkt.payload_len;
  if (pkt.ecn == 3) ++s.ecn_ce;
  if (info.has(wire::kOpCnp)) ++s.cnps;
  if (const auto* aeth = pkt.aeth()) {
    switch (wire::aeth_kind(aeth->syndrome)) {
      case AethKind::kAck: ++s.acks; break;
      case AethKind::kRnrNak: ++s.rnr_naks; break;
      case AethKind::kNak: {
        const unsigned code = aeth->syndrome & 0x1f;
        if (code < 5) ++s.naks[code];
        break;
      }
      case AethKind::kReserved: break;
    }
  }
  if (!info.has(wire::kOpRequest)) return;
  if (info.has(wire::kOpEnd)) ++s.messages;
  if (s.have_expected) {
    const std::int32_t d = distance(s.expected, pkt.psn);
    if (d > 0) ++s.psn_gaps;
    if (d < 0) ++s.psn_repeats;
  }
  if (info.has(wire::kOpRead)) {
    // A READ consumes one PSN per response packet (IBTA 9.7.1.1.2), which a
    // passive observer can only predict from the path MTU.
    s.have_expected = mtu_ != 0;
    if (s.have_expected) {
      const std::uint32_t len = pkt.reth()->dma_len.get();
      const std::uint32_t n = len == 0 ? 1 : (len + mtu_ - 1) / mtu_;
      s.expected = pkt.psn + n;
    }
  } else {
    s.have_expected = true;
    s.expected = pkt.psn + 1;
  }
}

std::string describe(const wire::Packet& pkt) {
  std::string s(pkt.info->name);
  appendf(s, " dqp=0x%06x psn=%u A=%d", pkt.destqp, pkt.psn.value(), pkt.ackreq ? 1 : 0);
  if (pkt.se) s += " SE";
  if (pkt.padcnt) appendf(s, " pad=%u", pkt.padcnt);
  if (pkt.becn) s += " BECN";
  if (const auto* h = pkt.deth()) appendf(s, " qkey=0x%08x sqp=0x%06x", h->qkey.get(), h->src_qp.get());
  if (const auto* h = pkt.feth()) appendf(s, " sel=%u plt=%u", h->selectivity(), h->placement_type());
  if (const auto* h = pkt.reth())
    appendf(s, " va=0x%" PRIx64 " rkey=0x%08x len=%u", h->va.get(), h->rkey.get(), h->dma_len.get());
  if (const auto* h = pkt.atomic_eth())
    appendf(s, " va=0x%" PRIx64 " rkey=0x%08x swap_add=0x%" PRIx64 " cmp=0x%" PRIx64, h->va.get(), h->rkey.get(),
            h->swap_add.get(), h->compare.get());
  if (const auto* h = pkt.aeth()) {
    const auto kind = wire::aeth_kind(h->syndrome);
    const unsigned low = h->syndrome & 0x1f;
    if (kind == AethKind::kAck) appendf(s, " ACK credits=%u", low);
    if (kind == AethKind::kRnrNak) appendf(s, " RNR-NAK timer=%u", low);
    if (kind == AethKind::kNak) appendf(s, " NAK %s", std::string(nak_name(low)).c_str());
    appendf(s, " msn=%u", h->msn.get());
  }
  if (const auto* h = pkt.atomic_ack()) appendf(s, " orig=0x%" PRIx64, h->orig.get());
  if (const auto* h = pkt.immdt()) appendf(s, " imm=0x%08x", h->imm.get());
  if (const auto* h = pkt.ieth()) appendf(s, " inv_rkey=0x%08x", h->rkey.get());
  if (pkt.info->has(wire::kOpPayload)) appendf(s, " payload=%u", pkt.payload_len);
  return s;
}

std::string packet_json_fields(const wire::Packet& pkt) {
  std::string s;
  appendf(s, "\"src\": \"%s\", \"dst\": \"%s\", ", pkt.src.to_string().c_str(), pkt.dst.to_string().c_str());
  appendf(s, "\"ipver\": %d, \"vlan\": %d, \"dscp\": %u, \"ecn\": %u, \"sport\": %u, ",
          pkt.ipver == wire::IpVersion::kV4 ? 4 : 6, pkt.has_vlan ? static_cast<int>(pkt.vlan_tci) : -1,
          pkt.dscp, pkt.ecn, pkt.sport);
  appendf(s, "\"opcode\": %u, \"opcode_name\": \"%.*s\", ", pkt.opcode, static_cast<int>(pkt.info->name.size()),
          pkt.info->name.data());
  appendf(s, "\"se\": %d, \"migreq\": %d, \"fecn\": %d, \"becn\": %d, \"ackreq\": %d, ", pkt.se, pkt.migreq,
          pkt.fecn, pkt.becn, pkt.ackreq);
  appendf(s, "\"pkey\": %u, \"destqp\": %u, \"psn\": %u, \"padcnt\": %u, \"payload_len\": %u, \"icrc\": %u",
          pkt.pkey, pkt.destqp, pkt.psn.value(), pkt.padcnt, pkt.payload_len, pkt.icrc);
  if (const auto* h = pkt.deth()) appendf(s, ", \"deth_qkey\": %u, \"deth_src_qp\": %u", h->qkey.get(), h->src_qp.get());
  if (const auto* h = pkt.feth()) appendf(s, ", \"feth\": %u", h->bits.get());
  if (const auto* h = pkt.reth())
    appendf(s, ", \"reth_va\": %" PRIu64 ", \"reth_rkey\": %u, \"reth_len\": %u", h->va.get(), h->rkey.get(),
            h->dma_len.get());
  if (const auto* h = pkt.atomic_eth()) {
    appendf(s, ", \"atomic_va\": %" PRIu64 ", \"atomic_rkey\": %u", h->va.get(), h->rkey.get());
    appendf(s, ", \"atomic_swap_add\": %" PRIu64 ", \"atomic_compare\": %" PRIu64, h->swap_add.get(),
            h->compare.get());
  }
  if (const auto* h = pkt.aeth()) appendf(s, ", \"aeth_syndrome\": %u, \"aeth_msn\": %u", h->syndrome, h->msn.get());
  if (const auto* h = pkt.atomic_ack()) appendf(s, ", \"atomic_ack_orig\": %" PRIu64, h->orig.get());
  if (const auto* h = pkt.immdt()) appendf(s, ", \"imm\": %u", h->imm.get());
  if (const auto* h = pkt.ieth()) appendf(s, ", \"ieth_rkey\": %u", h->rkey.get());
  return s;
}

std::string summary_json(const QpKey& key, const QpSummary& q) {
  std::string s;
  appendf(s, "{\"dst\": \"%s\", \"destqp\": %u, ", key.dst.to_string().c_str(), key.destqp);
  appendf(s, "\"packets\": %" PRIu64 ", \"payload_bytes\": %" PRIu64 ", \"messages\": %" PRIu64 ", ", q.packets,
          q.payload_bytes, q.messages);
  appendf(s, "\"psn_gaps\": %" PRIu64 ", \"psn_repeats\": %" PRIu64 ", \"acks\": %" PRIu64 ", \"naks\": {",
          q.psn_gaps, q.psn_repeats, q.acks);
  for (unsigned c = 0; c < 5; ++c)
    appendf(s, "%s\"%s\": %" PRIu64, c ? ", " : "", std::string(nak_name(c)).c_str(), q.naks[c]);
  appendf(s, "}, \"rnr_naks\": %" PRIu64 ", \"cnps\": %" PRIu64 ", \"ecn_ce\": %" PRIu64 "}", q.rnr_naks, q.cnps,
          q.ecn_ce);
  return s;
}

}  // namespace uroce::tools
