// Counters, generated from one list so names and slots cannot drift apart.
// The first group is rxe's set (same names, as `rdma statistic` shows them);
// the rest are ours. They exist per QP and, summed, per engine (port).
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace uroce::transport {

#define UROCE_QP_COUNTERS(X)                                                   \
  X(sent_pkts, "packets sent, including retransmissions and ACKs")           \
  X(rcvd_pkts, "packets received and accepted for processing")               \
  X(completions, "completions written")                                      \
  X(ack_deferred, "ACKs coalesced into a later one")                         \
  X(duplicate_request, "requests received with a PSN already seen")          \
  X(out_of_sequence, "requests received ahead of the expected PSN")          \
  X(rcvd_rnr_err, "RNR NAKs received")                                       \
  X(send_rnr_err, "RNR NAKs sent")                                           \
  X(rcvd_seq_err, "PSN sequence error NAKs received")                        \
  X(retry_exceeded_err, "WQEs failed with RETRY_EXC_ERR")                    \
  X(retry_rnr_exceeded_err, "WQEs failed with RNR_RETRY_EXC_ERR")            \
  X(completer_retry_err, "go-back-N retries started by the completer")      \
  X(sent_naks, "NAKs sent (all codes)")                                      \
  X(sent_seq_naks, "PSN sequence error NAKs sent")                           \
  X(rcvd_naks, "NAKs received other than sequence and RNR")                  \
  X(retransmitted_pkts, "packets sent again by go-back-N")                   \
  X(retransmitted_bytes, "frame bytes of the packets sent again by go-back-N") \
  X(timeouts, "retransmit timer expiries")                                   \
  X(ghost_acks, "ACKs/NAKs for PSNs never sent, dropped")                    \
  X(duplicate_acks, "ACKs for PSNs already acknowledged")                    \
  X(unexpected_resp, "responses that match no outstanding request, dropped") \
  X(read_replays, "duplicate READs answered from the replay cache")          \
  X(atomic_replays, "duplicate atomics answered from the replay cache")      \
  X(replay_miss, "duplicate READ/atomic not in the replay cache, dropped")   \
  X(uc_dropped, "UC packets dropped while resynchronising")                  \
  X(qkey_err, "UD packets with a wrong Q_Key, dropped")                      \
  X(ud_no_recv, "UD datagrams that found no receive posted, dropped (UD has no RNR)") \
  X(bad_opcode_seq, "requests out of opcode sequence")                       \
  X(remote_access_err, "requests refused for rkey, bounds or permission")    \
  X(ce_marked, "packets received with ECN CE (congestion experienced)")      \
  X(cnp_sent, "CNPs sent to the peer QP for CE-marked packets")             \
  X(cnp_received, "CNPs received from the peer QP")

#define UROCE_PORT_COUNTERS(X)                                        \
  X(rx_frames, "frames handed to the engine")                        \
  X(rx_not_roce, "frames that are not RoCEv2, dropped")              \
  X(rx_wrong_vlan, "frames of another VLAN than the port's (or tagged where it is untagged), dropped") \
  X(rx_raw, "frames a flow rule steered to a raw packet QP")         \
  X(rx_raw_no_recv, "frames for a raw packet QP with no receive posted, dropped") \
  X(rx_malformed, "malformed RoCEv2 frames, dropped")                \
  X(rx_icrc_err, "RoCEv2 frames with a bad ICRC, dropped")           \
  X(rx_unknown_qp, "frames for a QP that does not exist, dropped")   \
  X(rx_bad_state, "frames for a QP not in a receiving state, dropped") \
  X(rx_wrong_dst, "RoCE frames addressed to an IP that is not this port's, dropped (IBTA 9.6.1.1)") \
  X(rx_bad_pkey, "frames whose P_Key does not match the QP's partition, dropped (IBTA 9.6.1.1)") \
  X(rx_quarantined, "frames for a destroyed RC QP still in quarantine, other than retries it re-ACKs, dropped") \
  X(quarantine_acks, "retries of a destroyed RC QP's last messages answered from quarantine") \
  X(rx_wrong_peer, "frames from an address other than the QP's peer") \
  X(rx_wrong_transport, "frames whose opcode is of another transport than the QP's (RC, UC, UD), dropped (IBTA 9.6.1.1)") \
  X(rx_cnp, "CNPs received for a live RC or UC QP from its peer (counted per QP too)") \
  X(rx_cnp_dropped, "CNPs for no live RC or UC QP, or from another address than its peer, dropped") \
  X(cq_overflows, "CQs that overflowed (IBV_EVENT_CQ_ERR raised, their QPs moved to ERR)") \
  X(cqe_dropped, "completions dropped because their CQ had overflowed") \
  X(bad_wqe, "work requests taken from a ring malformed, or posted in a state that takes none, completed with LOC_QP_OP_ERR") \
  X(tx_frames, "frames queued for transmission")                    \
  X(tx_ring_full, "times the TX ring was full and sending paused")   \
  X(tx_unbuilt, "frames whose headers the builder refused (an engine bug: an opcode or a length it cannot build), not sent")

enum class QpCounter : std::uint8_t {
#define UROCE_X(name, help) name,
  UROCE_QP_COUNTERS(UROCE_X)
#undef UROCE_X
      kCount
};
enum class PortCounter : std::uint8_t {
#define UROCE_X(name, help) name,
  UROCE_PORT_COUNTERS(UROCE_X)
#undef UROCE_X
      kCount
};

inline constexpr std::array<std::string_view, static_cast<std::size_t>(QpCounter::kCount)> kQpCounterNames = {
#define UROCE_X(name, help) #name,
    UROCE_QP_COUNTERS(UROCE_X)
#undef UROCE_X
};
inline constexpr std::array<std::string_view, static_cast<std::size_t>(PortCounter::kCount)> kPortCounterNames = {
#define UROCE_X(name, help) #name,
    UROCE_PORT_COUNTERS(UROCE_X)
#undef UROCE_X
};
// What each counts (the metrics' HELP lines).
inline constexpr std::array<std::string_view, static_cast<std::size_t>(QpCounter::kCount)> kQpCounterHelp = {
#define UROCE_X(name, help) help,
    UROCE_QP_COUNTERS(UROCE_X)
#undef UROCE_X
};
inline constexpr std::array<std::string_view, static_cast<std::size_t>(PortCounter::kCount)> kPortCounterHelp = {
#define UROCE_X(name, help) help,
    UROCE_PORT_COUNTERS(UROCE_X)
#undef UROCE_X
};

template <typename E>
struct CounterSet {
  std::array<std::uint64_t, static_cast<std::size_t>(E::kCount)> v{};
  void inc(E c, std::uint64_t n = 1) { v[static_cast<std::size_t>(c)] += n; }
  [[nodiscard]] std::uint64_t operator[](E c) const { return v[static_cast<std::size_t>(c)]; }
};
using QpCounters = CounterSet<QpCounter>;
using PortCounters = CounterSet<PortCounter>;

}  // namespace uroce::transport
