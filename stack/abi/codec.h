// Completions from the ABI's uroce_cq_entry to rdma-core's ibv_wc: the one
// codec every consumer uses (liburoce's poll, and Cq::poll for a CQ in the
// engine's heap). The engine, the only producer, writes entries directly.
#pragma once

#include <infiniband/verbs.h>

#include "stack/abi/uroce_abi.h"

namespace uroce::abi {

inline ibv_wc to_wc(const uroce_cq_entry& e) {
  ibv_wc w{};
  w.wr_id = e.wr_id;
  w.status = static_cast<ibv_wc_status>(e.status);
  w.opcode = static_cast<ibv_wc_opcode>(e.opcode);
  w.vendor_err = e.vendor_err;
  w.byte_len = e.byte_len;
  w.imm_data = e.imm_or_inv;
  w.qp_num = e.qp_num;
  // A tag-matching completion carries its tag in src_qp and tag_hi and the
  // TMH's app_ctx in vendor_err (uroce_abi.h); an ibv_wc has no room for
  // them (ibv_wc_read_tm_info reads them), and shows neither.
  const bool tm = e.opcode >= IBV_WC_TM_ADD && e.opcode <= IBV_WC_TM_NO_TAG && e.status == IBV_WC_SUCCESS;
  w.src_qp = tm ? 0 : e.src_qp;
  if (tm) w.vendor_err = 0;
  w.wc_flags = e.wc_flags;
  w.pkey_index = e.pkey_index;
  return w;
}

}  // namespace uroce::abi
