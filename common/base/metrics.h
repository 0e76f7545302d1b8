/* metrics: a process's Prometheus metrics, rendered in the text exposition
 * format (version 0.0.4) for GET /metrics (metrics_http.h).
 *
 * Two kinds of series:
 *
 *  - Registered series (counters, gauges, histograms) are created once, at
 *    start or the first time a label set is seen, and updated on the hot
 *    path with one relaxed atomic operation (a histogram: two, plus a
 *    compare-and-swap loop for its sum).  Registration takes a lock;
 *    updates never do.  A series lives as long as its registry.
 *
 *  - Sampled series come from samplers: functions run at each scrape that
 *    emit values the process already keeps (a filter's inserts counter, the
 *    bytes a node holds, the process's RSS).  A sampler must not compute
 *    anything expensive (never a scan of a filter's bits); it emits every
 *    series of one family together, and its family names must differ from
 *    the registered ones.
 *
 * Names are Prometheus metric names ([a-zA-Z_:][a-zA-Z0-9_:]*), checked at
 * registration; label values are escaped when rendered.  Labels are given
 * as a NULL-terminated array of name, value pairs ({"method", "Add",
 * "code", "OK", NULL}); NULL means none.
 *
 * Thread-safety: every function may be called from any thread.
 */
#ifndef BLOOMGRID_METRICS_H
#define BLOOMGRID_METRICS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum metric_type { METRIC_COUNTER, METRIC_GAUGE, METRIC_HISTOGRAM };

struct metrics;
struct metric;
struct metrics_out;

struct metrics *metrics_create(void);
/* The process's registry: created on first use, never freed (NULL only
 * when out of memory then).  The RPC server and the store count there;
 * metrics_listen serves it (rpc_metrics.h). */
struct metrics *metrics_registry(void);
/* Free the registry and every series (no update may be running). */
void metrics_destroy(struct metrics *m);

/* The series of family name with these labels, created on first use (the
 * same pointer for the same name and labels afterwards).  help is kept for
 * the family's first series.  bounds (histograms only): nb upper bounds in
 * increasing order, the +Inf bucket is implied; the family's first series
 * fixes them.  Returns NULL when the name or a label name is malformed, the
 * family exists with another type, or out of memory. */
struct metric *metrics_counter(struct metrics *m, const char *name,
                               const char *help, const char *const *labels);
struct metric *metrics_gauge(struct metrics *m, const char *name,
                             const char *help, const char *const *labels);
struct metric *metrics_histogram(struct metrics *m, const char *name,
                                 const char *help, const char *const *labels,
                                 const double *bounds, size_t nb);

/* Updates (NULL metric: no-op, so a failed registration costs nothing). */
void metric_add(struct metric *c, uint64_t n);          /* counter */
void metric_set(struct metric *g, double v);            /* gauge */
void metric_gauge_add(struct metric *g, double d);      /* gauge */
void metric_observe(struct metric *h, double v);        /* histogram */

/* Read back (tests, and a process's own status pages). */
uint64_t metric_count(const struct metric *c);          /* counter; histogram: observations */
double metric_value(const struct metric *g);            /* gauge; histogram: sum */

/* Samplers: fn(arg, out) runs at every scrape, in registration order, after
 * the registered series, and emits with metrics_emit.  It runs outside the
 * registry's lock, so it may take locks of its own (and register series).
 * At most METRICS_MAX_SAMPLERS.  Returns 0, -EINVAL or -ENOSPC. */
#define METRICS_MAX_SAMPLERS 16
int metrics_add_sampler(struct metrics *m,
                        void (*fn)(void *arg, struct metrics_out *out),
                        void *arg);
/* Emit one sampled series (counter or gauge).  Consecutive calls with the
 * same name share one HELP/TYPE header. */
void metrics_emit(struct metrics_out *out, enum metric_type type,
                  const char *name, const char *help,
                  const char *const *labels, double value);

/* The process sampler: process_resident_memory_bytes,
 * process_open_fds, process_max_fds, process_threads,
 * process_start_time_seconds, process_cpu_seconds_total (from /proc/self). */
void metrics_process_sampler(void *arg, struct metrics_out *out);

/* Render everything to f.  Returns 0 or -EIO. */
int metrics_render(struct metrics *m, FILE *f);
/* Render into a malloc'ed string (*len bytes, NUL-terminated): 0 or -ENOMEM. */
int metrics_render_string(struct metrics *m, char **text, size_t *len);

/* Histogram bounds for call latencies in seconds, 50 µs .. 10 s. */
extern const double metrics_latency_bounds[];
extern const size_t metrics_latency_nbounds;

#endif
