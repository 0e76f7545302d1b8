/* Unit tests of rpc_runtime: Abseil's lock-order detection is off after
 * rpc_runtime_init().  Check forks each test, so each sets the mode in its
 * own process. */
#include <check.h>
#include <signal.h>

#include "absl_order.h"
#include "rpc_runtime.h"

/* The detector is there and aborts on a cycle when on: what the next test
 * turns off. */
START_TEST(an_order_cycle_aborts_while_detection_is_on)
{
    absl_order_detect_abort();
    absl_order_invert();
    ck_abort_msg("the lock-order cycle was not detected");
}
END_TEST

START_TEST(rpc_runtime_init_turns_detection_off)
{
    absl_order_detect_abort();
    rpc_runtime_init();
    absl_order_invert();
    absl_order_invert();
}
END_TEST

Suite *rpc_runtime_suite(void)
{
    Suite *s = suite_create("rpc_runtime");
    TCase *tc = tcase_create("core");
    tcase_add_test_raise_signal(tc, an_order_cycle_aborts_while_detection_is_on, SIGABRT);
    tcase_add_test(tc, rpc_runtime_init_turns_detection_off);
    suite_add_tcase(s, tc);
    return s;
}
