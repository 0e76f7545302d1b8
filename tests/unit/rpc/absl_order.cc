/* Abseil mutexes for test_rpc_runtime.c (Abseil has no C API). */
#include "absl_order.h"

#include <absl/synchronization/mutex.h>

void absl_order_detect_abort(void)
{
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kAbort);
}

void absl_order_invert(void)
{
    static absl::Mutex a, b;
    a.Lock();
    b.Lock();
    b.Unlock();
    a.Unlock();
    b.Lock();
    a.Lock();     /* b before a: the opposite order */
    a.Unlock();
    b.Unlock();
}
