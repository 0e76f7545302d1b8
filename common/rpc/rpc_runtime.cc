/* rpc_runtime: settings of the libraries under the gRPC core (rpc_runtime.h). */
#include "rpc_runtime.h"

#include <absl/synchronization/mutex.h>

void rpc_runtime_init(void)
{
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}
