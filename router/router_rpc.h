/* router_rpc: the public bloomgrid.v1.BloomGrid handlers of bloomgrid-router
 * (router_rpc.c).  The handler argument is the struct router. */
#ifndef BLOOMGRID_ROUTER_RPC_H
#define BLOOMGRID_ROUTER_RPC_H

#include <stddef.h>

#include "rpc_server.h"

/* Handler table in descriptor order. */
extern const struct rpc_handler router_rpc_public[];
extern const size_t router_rpc_public_count;

#endif
