// Helpers that more than one of the engine's files needs (engine_*.cc):
// internal to the transport, not part of the engine's interface.
#pragma once

#include <infiniband/verbs.h>

namespace uroce::transport::detail {

inline bool can_post_send(ibv_qp_state s) {
  // Verbs: a send WR may be posted in RTS, SQD and SQE; in ERR it is flushed.
  return s == IBV_QPS_RTS || s == IBV_QPS_SQD || s == IBV_QPS_SQE || s == IBV_QPS_ERR;
}

}  // namespace uroce::transport::detail
