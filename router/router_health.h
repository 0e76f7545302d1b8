/* router_health: what the router's health service says, from a periodic
 * probe of every node.
 *
 * One thread asks every copy of the current topology for its readiness
 * (grpc.health.v1 Check of "bloomgrid.v1.BloomGrid", in parallel, each
 * bounded by health_probe_ms) once per health_probe_ms, and keeps per
 * group how many copies are SERVING.  A copy that does not answer, or
 * answers NOT_SERVING (SYNCING, not ready, stopping), does not count.  No
 * health call makes a call to a node: they read the last round.
 *
 * Health names (docs/ROUTER.md):
 *   ""                        SERVING while the router runs (liveness);
 *   "bloomgrid.v1.BloomGrid"  SERVING when every group has at least its
 *                             read quorum of serving copies (readiness);
 *   "bloomgrid.v1.BloomGrid/NAME"  SERVING when every shard of filter NAME
 *                             is on a group with at least its read quorum
 *                             of serving copies.  A filter this router has
 *                             not seen yet is judged by every group.
 * Before the first round ends every name is NOT_SERVING.
 */
#ifndef BLOOMGRID_ROUTER_HEALTH_H
#define BLOOMGRID_ROUTER_HEALTH_H

#include "router.h"

#define ROUTER_HEALTH_FILTER_PREFIX "bloomgrid.v1.BloomGrid/"

struct router_health;

/* Register the per-filter names on r->srv (before rpc_server_start) and
 * start the probe thread.  NULL when out of memory or no thread. */
struct router_health *router_health_start(struct router *r);

/* Stop and join the thread, set "bloomgrid.v1.BloomGrid" NOT_SERVING and
 * free h: after rpc_server_shutdown (no health call may be running).  NULL
 * is a no-op. */
void router_health_stop(struct router_health *h);

#endif
