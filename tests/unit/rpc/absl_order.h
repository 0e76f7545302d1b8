/* Abseil mutexes for test_rpc_runtime.c. */
#ifndef BLOOMGRID_TEST_ABSL_ORDER_H
#define BLOOMGRID_TEST_ABSL_ORDER_H

#ifdef __cplusplus
extern "C" {
#endif

/* Make a lock-order cycle abort the process (Abseil's kAbort). */
void absl_order_detect_abort(void);
/* Take two absl::Mutex in one order, then in the other, on one thread
 * (never a deadlock, but a cycle in the order). */
void absl_order_invert(void);

#ifdef __cplusplus
}
#endif

#endif
