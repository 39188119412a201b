/* libmlx5.so.1 and libefa.so.1 for uroce: perftest and UCX's libuct_ib are
 * linked against both (BIND_NOW) and call them only for mlx5 and EFA
 * devices, so with uroce's libibverbs.so.1 first on LD_LIBRARY_PATH they
 * need these names to load. The system's copies would not load there
 * (they import rdma-core's private symbols). Every public symbol of
 * Debian's rdma-core 44 libmlx5.so.1 and libefa.so.1, each at its version
 * (libmlx5.map, libefa.map: objdump -T of those libraries), and each
 * refuses by the kind of value its prototype in <infiniband/mlx5dv.h> or
 * <infiniband/efadv.h> returns: a pointer is NULL with errno EOPNOTSUPP,
 * a number EOPNOTSUPP, a bool false (mlx5dv_is_supported: no device here
 * is an mlx5 device), and a void one does nothing. Built twice, one
 * library per -DUROCE_STUB_MLX5 / -DUROCE_STUB_EFA. */
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>

#define PTR_STUB(name) \
  void* name(void) {   \
    errno = EOPNOTSUPP; \
    return NULL;        \
  }
#define INT_STUB(name) \
  int name(void) {     \
    errno = EOPNOTSUPP; \
    return EOPNOTSUPP;  \
  }
#define VOID_STUB(name) \
  void name(void) {}
#define FALSE_STUB(name) \
  bool name(void) {      \
    return false;        \
  }

#ifdef UROCE_STUB_MLX5
INT_STUB(_mlx5dv_mkey_check)
INT_STUB(_mlx5dv_query_port)
PTR_STUB(mlx5dv_alloc_dm)
PTR_STUB(mlx5dv_alloc_var)
PTR_STUB(mlx5dv_create_cq)
PTR_STUB(mlx5dv_create_flow)
PTR_STUB(mlx5dv_create_flow_action_esp)
PTR_STUB(mlx5dv_create_flow_action_modify_header)
PTR_STUB(mlx5dv_create_flow_action_packet_reformat)
PTR_STUB(mlx5dv_create_flow_matcher)
PTR_STUB(mlx5dv_create_mkey)
PTR_STUB(mlx5dv_create_qp)
PTR_STUB(mlx5dv_create_steering_anchor)
PTR_STUB(mlx5dv_create_wq)
INT_STUB(mlx5dv_crypto_login)
PTR_STUB(mlx5dv_crypto_login_create)
INT_STUB(mlx5dv_crypto_login_destroy)
INT_STUB(mlx5dv_crypto_login_query)
INT_STUB(mlx5dv_crypto_login_query_state)
INT_STUB(mlx5dv_crypto_logout)
INT_STUB(mlx5dv_dci_stream_id_reset)
PTR_STUB(mlx5dv_dek_create)
INT_STUB(mlx5dv_dek_destroy)
INT_STUB(mlx5dv_dek_query)
INT_STUB(mlx5dv_destroy_flow_matcher)
INT_STUB(mlx5dv_destroy_mkey)
INT_STUB(mlx5dv_destroy_steering_anchor)
PTR_STUB(mlx5dv_devx_alloc_msi_vector)
PTR_STUB(mlx5dv_devx_alloc_uar)
INT_STUB(mlx5dv_devx_cq_modify)
INT_STUB(mlx5dv_devx_cq_query)
PTR_STUB(mlx5dv_devx_create_cmd_comp)
PTR_STUB(mlx5dv_devx_create_eq)
PTR_STUB(mlx5dv_devx_create_event_channel)
VOID_STUB(mlx5dv_devx_destroy_cmd_comp)
INT_STUB(mlx5dv_devx_destroy_eq)
VOID_STUB(mlx5dv_devx_destroy_event_channel)
INT_STUB(mlx5dv_devx_free_msi_vector)
VOID_STUB(mlx5dv_devx_free_uar)
INT_STUB(mlx5dv_devx_general_cmd)
INT_STUB(mlx5dv_devx_get_async_cmd_comp)
INT_STUB(mlx5dv_devx_get_event)
INT_STUB(mlx5dv_devx_ind_tbl_modify)
INT_STUB(mlx5dv_devx_ind_tbl_query)
PTR_STUB(mlx5dv_devx_obj_create)
INT_STUB(mlx5dv_devx_obj_destroy)
INT_STUB(mlx5dv_devx_obj_modify)
INT_STUB(mlx5dv_devx_obj_query)
INT_STUB(mlx5dv_devx_obj_query_async)
INT_STUB(mlx5dv_devx_qp_modify)
INT_STUB(mlx5dv_devx_qp_query)
INT_STUB(mlx5dv_devx_query_eqn)
INT_STUB(mlx5dv_devx_srq_modify)
INT_STUB(mlx5dv_devx_srq_query)
INT_STUB(mlx5dv_devx_subscribe_devx_event)
INT_STUB(mlx5dv_devx_subscribe_devx_event_fd)
INT_STUB(mlx5dv_devx_umem_dereg)
PTR_STUB(mlx5dv_devx_umem_reg)
PTR_STUB(mlx5dv_devx_umem_reg_ex)
INT_STUB(mlx5dv_devx_wq_modify)
INT_STUB(mlx5dv_devx_wq_query)
PTR_STUB(mlx5dv_dm_map_op_addr)
PTR_STUB(mlx5dv_dr_action_create_aso)
PTR_STUB(mlx5dv_dr_action_create_default_miss)
PTR_STUB(mlx5dv_dr_action_create_dest_array)
PTR_STUB(mlx5dv_dr_action_create_dest_devx_tir)
PTR_STUB(mlx5dv_dr_action_create_dest_ib_port)
PTR_STUB(mlx5dv_dr_action_create_dest_ibv_qp)
PTR_STUB(mlx5dv_dr_action_create_dest_root_table)
PTR_STUB(mlx5dv_dr_action_create_dest_table)
PTR_STUB(mlx5dv_dr_action_create_dest_vport)
PTR_STUB(mlx5dv_dr_action_create_drop)
PTR_STUB(mlx5dv_dr_action_create_flow_counter)
PTR_STUB(mlx5dv_dr_action_create_flow_meter)
PTR_STUB(mlx5dv_dr_action_create_flow_sampler)
PTR_STUB(mlx5dv_dr_action_create_modify_header)
PTR_STUB(mlx5dv_dr_action_create_packet_reformat)
PTR_STUB(mlx5dv_dr_action_create_pop_vlan)
PTR_STUB(mlx5dv_dr_action_create_push_vlan)
PTR_STUB(mlx5dv_dr_action_create_tag)
INT_STUB(mlx5dv_dr_action_destroy)
INT_STUB(mlx5dv_dr_action_modify_aso)
INT_STUB(mlx5dv_dr_action_modify_flow_meter)
INT_STUB(mlx5dv_dr_aso_other_domain_link)
INT_STUB(mlx5dv_dr_aso_other_domain_unlink)
VOID_STUB(mlx5dv_dr_domain_allow_duplicate_rules)
PTR_STUB(mlx5dv_dr_domain_create)
INT_STUB(mlx5dv_dr_domain_destroy)
VOID_STUB(mlx5dv_dr_domain_set_reclaim_device_memory)
INT_STUB(mlx5dv_dr_domain_sync)
PTR_STUB(mlx5dv_dr_matcher_create)
INT_STUB(mlx5dv_dr_matcher_destroy)
INT_STUB(mlx5dv_dr_matcher_set_layout)
PTR_STUB(mlx5dv_dr_rule_create)
INT_STUB(mlx5dv_dr_rule_destroy)
PTR_STUB(mlx5dv_dr_table_create)
INT_STUB(mlx5dv_dr_table_destroy)
INT_STUB(mlx5dv_dump_dr_domain)
INT_STUB(mlx5dv_dump_dr_matcher)
INT_STUB(mlx5dv_dump_dr_rule)
INT_STUB(mlx5dv_dump_dr_table)
VOID_STUB(mlx5dv_free_var)
INT_STUB(mlx5dv_get_clock_info)
PTR_STUB(mlx5dv_get_vfio_device_list)
INT_STUB(mlx5dv_init_obj)
FALSE_STUB(mlx5dv_is_supported)
INT_STUB(mlx5dv_map_ah_to_qp)
INT_STUB(mlx5dv_modify_qp_lag_port)
INT_STUB(mlx5dv_modify_qp_sched_elem)
INT_STUB(mlx5dv_modify_qp_udp_sport)
PTR_STUB(mlx5dv_open_device)
PTR_STUB(mlx5dv_pp_alloc)
VOID_STUB(mlx5dv_pp_free)
INT_STUB(mlx5dv_qp_cancel_posted_send_wrs)
PTR_STUB(mlx5dv_qp_ex_from_ibv_qp_ex)
INT_STUB(mlx5dv_query_device)
INT_STUB(mlx5dv_query_qp_lag_port)
INT_STUB(mlx5dv_reserved_qpn_alloc)
INT_STUB(mlx5dv_reserved_qpn_dealloc)
PTR_STUB(mlx5dv_sched_leaf_create)
INT_STUB(mlx5dv_sched_leaf_destroy)
INT_STUB(mlx5dv_sched_leaf_modify)
PTR_STUB(mlx5dv_sched_node_create)
INT_STUB(mlx5dv_sched_node_destroy)
INT_STUB(mlx5dv_sched_node_modify)
INT_STUB(mlx5dv_set_context_attr)
INT_STUB(mlx5dv_vfio_get_events_fd)
INT_STUB(mlx5dv_vfio_process_events)
#endif

#ifdef UROCE_STUB_EFA
PTR_STUB(efadv_cq_from_ibv_cq_ex)
PTR_STUB(efadv_create_cq)
PTR_STUB(efadv_create_driver_qp)
PTR_STUB(efadv_create_qp_ex)
INT_STUB(efadv_query_ah)
INT_STUB(efadv_query_device)
#endif
