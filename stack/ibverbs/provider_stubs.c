/* libmlx5.so.1 and libefa.so.1 for uroce: perftest is linked against both
 * (BIND_NOW) and calls them only for mlx5 and EFA devices, so with uroce's
 * libibverbs.so.1 first on LD_LIBRARY_PATH it needs these names to load.
 * The system's copies would not load there (they import rdma-core's
 * private symbols). Each symbol perftest imports, with its version; each
 * refuses: NULL with errno EOPNOTSUPP, or EOPNOTSUPP. Built twice, one
 * library per -DUROCE_STUB_MLX5 / -DUROCE_STUB_EFA. */
#include <errno.h>
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

#ifdef UROCE_STUB_MLX5
PTR_STUB(mlx5dv_open_device)
PTR_STUB(mlx5dv_create_qp)
PTR_STUB(mlx5dv_qp_ex_from_ibv_qp_ex)
PTR_STUB(mlx5dv_create_mkey)
INT_STUB(mlx5dv_destroy_mkey)
INT_STUB(mlx5dv_devx_general_cmd)
PTR_STUB(mlx5dv_dek_create)
INT_STUB(mlx5dv_dek_destroy)
INT_STUB(mlx5dv_crypto_login)
/* no device is an mlx5 device here */
int mlx5dv_is_supported(void* device) {
  (void)device;
  return 0;
}
#endif

#ifdef UROCE_STUB_EFA
INT_STUB(efadv_query_device)
PTR_STUB(efadv_create_qp_ex)
#endif
