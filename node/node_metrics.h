/* node_metrics: the node's sampled series (docs/METRICS.md): per filter
 * (shard) its bytes, inserts, capacity, target and model FPR and SYNCING
 * state, and the store's budget, read at each scrape from values the node
 * keeps (never a scan of a filter's bits).
 */
#ifndef BLOOMGRID_NODE_METRICS_H
#define BLOOMGRID_NODE_METRICS_H

struct node;

/* Add the node's sampler to the process registry (once, at start). */
void node_metrics_start(struct node *n);

#endif
