/* node_metrics: the node's sampled series (docs/METRICS.md): per shard
 * held (labels filter, the filter's name, and shard, its index) its bytes,
 * inserts, capacity, target and model FPR and SYNCING state, and the
 * store's budget and the allocator's held and free bytes (proc_malloc.h),
 * read at each scrape from values the node keeps (never a
 * scan of a filter's bits); and its fill, n-hat and estimated FPR from a
 * bounded sample of its bits that one thread takes every metrics_sample_s
 * (bf_stats_sampled), served as last sampled.  With metrics_shards =
 * filter, one series per filter instead (label filter), its shards folded:
 * a sum or the largest value.
 */
#ifndef BLOOMGRID_NODE_METRICS_H
#define BLOOMGRID_NODE_METRICS_H

struct node;

/* Add the node's sampler to the process registry and make the store's
 * counters at 0 (once, at start). */
void node_metrics_start(struct node *n);
/* The sampling thread, when metrics are served: start once, stop before
 * the store closes.  start: 0 or -1 (no thread; the fill gauges are then
 * absent). */
int node_metrics_sample_start(struct node *n);
void node_metrics_sample_stop(void);

#endif
