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
  if (const auto* h = pkt.xrceth()) appendf(s, " xrcsrq=0x%06x", h->srqn.get());
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

nlohmann::ordered_json packet_json(const wire::Packet& pkt) {
  nlohmann::ordered_json j;
  j["src"] = pkt.src.to_string();
  j["dst"] = pkt.dst.to_string();
  j["ipver"] = pkt.ipver == wire::IpVersion::kV4 ? 4 : 6;
  j["vlan"] = pkt.has_vlan ? static_cast<int>(pkt.vlan_tci) : -1;
  j["dscp"] = pkt.dscp;
  j["ecn"] = pkt.ecn;
  j["sport"] = pkt.sport;
  j["opcode"] = pkt.opcode;
  j["opcode_name"] = std::string(pkt.info->name);
  j["se"] = static_cast<int>(pkt.se);
  j["migreq"] = static_cast<int>(pkt.migreq);
  j["fecn"] = static_cast<int>(pkt.fecn);
  j["becn"] = static_cast<int>(pkt.becn);
  j["ackreq"] = static_cast<int>(pkt.ackreq);
  j["pkey"] = pkt.pkey;
  j["destqp"] = pkt.destqp;
  j["psn"] = pkt.psn.value();
  j["padcnt"] = pkt.padcnt;
  j["payload_len"] = pkt.payload_len;
  j["icrc"] = pkt.icrc;
  if (const auto* h = pkt.deth()) {
    j["deth_qkey"] = h->qkey.get();
    j["deth_src_qp"] = h->src_qp.get();
  }
  if (const auto* h = pkt.xrceth()) j["xrceth_srqn"] = h->srqn.get();
  if (const auto* h = pkt.feth()) j["feth"] = h->bits.get();
  if (const auto* h = pkt.reth()) {
    j["reth_va"] = h->va.get();
    j["reth_rkey"] = h->rkey.get();
    j["reth_len"] = h->dma_len.get();
  }
  if (const auto* h = pkt.atomic_eth()) {
    j["atomic_va"] = h->va.get();
    j["atomic_rkey"] = h->rkey.get();
    j["atomic_swap_add"] = h->swap_add.get();
    j["atomic_compare"] = h->compare.get();
  }
  if (const auto* h = pkt.aeth()) {
    j["aeth_syndrome"] = h->syndrome;
    j["aeth_msn"] = h->msn.get();
  }
  if (const auto* h = pkt.atomic_ack()) j["atomic_ack_orig"] = h->orig.get();
  if (const auto* h = pkt.immdt()) j["imm"] = h->imm.get();
  if (const auto* h = pkt.ieth()) j["ieth_rkey"] = h->rkey.get();
  return j;
}

nlohmann::ordered_json summary_json(const QpKey& key, const QpSummary& q) {
  nlohmann::ordered_json naks = nlohmann::ordered_json::object();
  for (unsigned c = 0; c < 5; ++c) naks[std::string(nak_name(c))] = q.naks[c];
  return {{"dst", key.dst.to_string()}, {"destqp", key.destqp},       {"packets", q.packets},
          {"payload_bytes", q.payload_bytes}, {"messages", q.messages}, {"psn_gaps", q.psn_gaps},
          {"psn_repeats", q.psn_repeats},     {"acks", q.acks},          {"naks", naks},
          {"rnr_naks", q.rnr_naks},           {"cnps", q.cnps},          {"ecn_ce", q.ecn_ce}};
}

}  // namespace uroce::tools
