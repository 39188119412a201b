/* Names of ibv_wc_status values, shared by the engine and liburoce (which
 * does not link libibverbs, so ibv_wc_status_str is not there). */
#ifndef UROCE_WC_STATUS_H
#define UROCE_WC_STATUS_H

#include <infiniband/verbs.h>

static inline const char* uroce_wc_status_name(enum ibv_wc_status s) {
  switch (s) {
    case IBV_WC_SUCCESS: return "SUCCESS";
    case IBV_WC_LOC_LEN_ERR: return "LOC_LEN_ERR";
    case IBV_WC_LOC_QP_OP_ERR: return "LOC_QP_OP_ERR";
    case IBV_WC_LOC_PROT_ERR: return "LOC_PROT_ERR";
    case IBV_WC_WR_FLUSH_ERR: return "WR_FLUSH_ERR";
    case IBV_WC_REM_INV_REQ_ERR: return "REM_INV_REQ_ERR";
    case IBV_WC_REM_ACCESS_ERR: return "REM_ACCESS_ERR";
    case IBV_WC_REM_OP_ERR: return "REM_OP_ERR";
    case IBV_WC_RETRY_EXC_ERR: return "RETRY_EXC_ERR";
    case IBV_WC_RNR_RETRY_EXC_ERR: return "RNR_RETRY_EXC_ERR";
    case IBV_WC_REM_INV_RD_REQ_ERR: return "REM_INV_RD_REQ_ERR";
    default: return "OTHER_ERR";
  }
}

#endif /* UROCE_WC_STATUS_H */
