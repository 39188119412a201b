// An rsocket's endpoint, for both kinds (rsocket.cc, rsocket_dgram.cc):
// a PD, a non-blocking completion channel, one CQ for sends and receives,
// and a QP of rdma_cm's on the id, every send signaled; and the arming and
// wake-up of its CQ. Internal to
// uroce's librdmacm.
#ifndef UROCE_RDMACM_RSOCKET_QP_H
#define UROCE_RDMACM_RSOCKET_QP_H

#include <fcntl.h>
#include <rdma/rdma_cma.h>

#include <cerrno>
#include <cstdint>

namespace uroce::rsockets {

struct Endpoint {
  ibv_pd* pd = nullptr;
  ibv_comp_channel* cc = nullptr;
  ibv_cq* cq = nullptr;
};

/// Makes `ep` and the id's QP: 0, or -1 with errno (what was made stays in
/// `ep` for the caller to free). `inline_size` comes back as granted.
inline int make_endpoint(rdma_cm_id* id, void* context, ibv_qp_type type, std::uint16_t sq, std::uint16_t rq,
                         std::uint32_t send_sge, std::uint32_t recv_sge, std::uint32_t& inline_size, Endpoint& ep) {
  if (!id->verbs) {
    errno = ENODEV;  // not bound to a uroce device's address
    return -1;
  }
  if (!(ep.pd = ibv_alloc_pd(id->verbs)) || !(ep.cc = ibv_create_comp_channel(id->verbs))) return -1;
  (void)::fcntl(ep.cc->fd, F_SETFL, ::fcntl(ep.cc->fd, F_GETFL) | O_NONBLOCK);
  if (!(ep.cq = ibv_create_cq(id->verbs, sq + rq, context, ep.cc, 0))) return -1;
  ibv_qp_init_attr qa{};
  qa.qp_context = context;
  qa.send_cq = qa.recv_cq = ep.cq;
  qa.qp_type = type;
  qa.sq_sig_all = 1;
  qa.cap.max_send_wr = sq;
  qa.cap.max_recv_wr = rq;
  qa.cap.max_send_sge = send_sge;
  qa.cap.max_recv_sge = recv_sge;
  qa.cap.max_inline_data = inline_size;
  if (rdma_create_qp(id, ep.pd, &qa) != 0) return -1;
  inline_size = qa.cap.max_inline_data;
  return 0;
}

/// Arms the CQ for its next completion unless it is armed: true when it
/// armed it now (what completed before must then be looked at again).
inline bool arm(ibv_cq* cq, bool& armed) {
  if (armed) return false;
  ibv_req_notify_cq(cq, 0);
  return armed = true;
}

/// Takes, without waiting, the completion events a wake-up left, and
/// acknowledges them: the CQ is then to be armed again.
inline void take_events(ibv_comp_channel* cc, ibv_cq* cq, bool& armed) {
  ibv_cq* from = nullptr;
  void* context = nullptr;
  unsigned n = 0;
  while (ibv_get_cq_event(cc, &from, &context) == 0) ++n;
  if (n == 0) return;
  ibv_ack_cq_events(cq, n);
  armed = false;
}

}  // namespace uroce::rsockets

#endif
