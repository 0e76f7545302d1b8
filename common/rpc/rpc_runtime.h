/*
 * rpc_runtime: settings of the libraries under the gRPC core that its C API
 * does not reach.
 *
 * Debian's Abseil is built without NDEBUG, so its debug defaults are on in
 * every process that loads the gRPC core: each absl::Mutex the core takes
 * (its calls, combiners, completion queues and pollers) records the order
 * in which locks are taken in one graph for the whole process, to report a
 * possible deadlock.  Under pipelined single keys through a router that
 * bookkeeping was about 5 % of the router's and the node's CPU
 * (bench/README.md, "Abseil's deadlock detection").  An Abseil built with
 * NDEBUG has it off by default; the processes here run as they would with
 * one.
 */
#ifndef BLOOMGRID_RPC_RUNTIME_H
#define BLOOMGRID_RPC_RUNTIME_H

#ifdef __cplusplus
extern "C" {
#endif

/* Turn Abseil's lock-order (deadlock) detection off for the process.  Call
 * once, before grpc_init() and before any thread is created. */
void rpc_runtime_init(void);

#ifdef __cplusplus
}
#endif

#endif
