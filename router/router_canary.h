/* router_canary: the router's own canary (canary_filter), the check of the
 * service's promise that runs where Prometheus can see it.
 *
 * One thread, every canary_interval_ms: add canary key SEQ (common/cluster/canary.h:
 * "bloomgrid-canary/NAME/SEQ") to canary_filter through the router's key
 * path (router_keys_start, as a client's Add would go), and once it is
 * acknowledged ask the same path for the earlier keys (all, or at most
 * canary_check_keys of them: canary_pick).  A key the router had
 * acknowledged that now reads "no" is a false negative: logged as an error
 * naming key and filter, and counted.  A call that fails is an error,
 * counted apart (it proves nothing either way).  The thread waits for each
 * batch itself: no request thread ever does canary work.
 *
 * The next SEQ lives in canary_state_file when it is set (written through
 * durable.h after each acknowledged add; a restarted router checks the keys
 * of its earlier runs), else in memory (a restarted router starts again at
 * key 0, adding again keys that are already there, and checks only what it
 * added since).
 *
 * Metrics (docs/METRICS.md), label filter, registered at start at 0:
 * bloomgrid_canary_adds_total, bloomgrid_canary_checks_total,
 * bloomgrid_canary_false_negatives_total, bloomgrid_canary_errors_total.
 */
#ifndef BLOOMGRID_ROUTER_CANARY_H
#define BLOOMGRID_ROUTER_CANARY_H

#include "canary.h"
#include "router.h"

struct router_canary;

/* Load the state (a state file of another filter or canary, or one that
 * does not parse, is refused), register the metrics and start the thread.
 * With canary_filter "" nothing starts and *out is NULL.  Returns 0, or -1
 * with err (CANARY_ERRLEN) saying why. */
int router_canary_start(struct router *r, struct router_canary **out, char *err);

/* Stop and join the thread (after the batch in progress, bounded by
 * node_timeout_ms) and free c: before router_deinit.  NULL is a no-op. */
void router_canary_stop(struct router_canary *c);

#endif
