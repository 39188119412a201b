// Completions between the ABI's uroce_cq_entry and rdma-core's ibv_wc: the
// one codec the engine (producer) and liburoce (consumer) both use.
#pragma once

#include <infiniband/verbs.h>

#include "stack/abi/uroce_abi.h"

namespace uroce::abi {

inline uroce_cq_entry to_cqe(const ibv_wc& w) {
  uroce_cq_entry e{};
  e.wr_id = w.wr_id;
  e.status = w.status;
  e.opcode = w.opcode;
  e.vendor_err = w.vendor_err;
  e.byte_len = w.byte_len;
  e.imm_or_inv = w.imm_data;  // a union with invalidated_rkey in ibv_wc
  e.qp_num = w.qp_num;
  e.src_qp = w.src_qp;
  e.wc_flags = w.wc_flags;
  e.pkey_index = w.pkey_index;
  return e;
}

inline ibv_wc to_wc(const uroce_cq_entry& e) {
  ibv_wc w{};
  w.wr_id = e.wr_id;
  w.status = static_cast<ibv_wc_status>(e.status);
  w.opcode = static_cast<ibv_wc_opcode>(e.opcode);
  w.vendor_err = e.vendor_err;
  w.byte_len = e.byte_len;
  w.imm_data = e.imm_or_inv;
  w.qp_num = e.qp_num;
  w.src_qp = e.src_qp;
  w.wc_flags = e.wc_flags;
  w.pkey_index = e.pkey_index;
  return w;
}

}  // namespace uroce::abi
