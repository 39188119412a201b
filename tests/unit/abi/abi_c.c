/* The ABI header is C: this file compiles it as C (its static asserts run
 * here too) and reports the layout the C compiler produced. */
#include <stddef.h>

#include "stack/abi/uroce_abi.h"

size_t uroce_abi_c_layout(int which) {
  switch (which) {
    case 0: return sizeof(struct uroce_ring_header);
    case 1: return sizeof(struct uroce_send_entry);
    case 2: return sizeof(struct uroce_recv_entry);
    case 3: return sizeof(struct uroce_cq_entry);
    case 4: return offsetof(struct uroce_send_entry, sg_list);
    default: return 0;
  }
}
