/* merger_rpc: the bloomgrid.v1.Merger handlers of bloomgrid-merger (Status,
 * RunRound), the only place that converts the merger's wire messages.
 *
 * The handler argument is a struct merger_rpc that outlives the server.
 * Handlers run on the RPC server's threads; RunRound blocks until a round
 * that started after the call has finished.
 */
#ifndef BLOOMGRID_MERGER_RPC_H
#define BLOOMGRID_MERGER_RPC_H

#include <stddef.h>

#include "merger.h"
#include "merger_runner.h"
#include "rpc_server.h"

struct merger_rpc {
    struct merger *m;
    struct merger_runner *run;
};

/* Handler table in the order of bloomgrid__v1__merger__descriptor. */
extern const struct rpc_handler merger_rpc_handlers[];
extern const size_t merger_rpc_handler_count;

#endif
