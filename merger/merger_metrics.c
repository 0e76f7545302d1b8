/* merger_metrics: a round's report as series (see merger_metrics.h). */
#include "merger_metrics.h"

#include <pthread.h>
#include <stdio.h>

#include "merger.h"
#include "metrics.h"

static struct {
    struct metric *rounds, *failed, *errors, *duration;
    struct metric *pages_pulled, *pages_pushed, *bytes_pulled, *bytes_pushed;
    struct metric *keys_pulled, *keys_pushed;
    struct metric *uncovered;
} mm;
static pthread_once_t mm_once = PTHREAD_ONCE_INIT;

static const double round_bounds[] = {0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60,
                                      300, 900};

static void mm_register(void)
{
    struct metrics *m = metrics_registry();
    mm.rounds = metrics_counter(m, "bloomgrid_merger_rounds_total", "rounds run", NULL);
    mm.failed = metrics_counter(m, "bloomgrid_merger_rounds_failed_total",
                                "rounds with at least one error", NULL);
    mm.errors = metrics_counter(m, "bloomgrid_merger_errors_total",
                                "errors of every round (a source not pulled, a "
                                "copy not pushed)", NULL);
    mm.duration = metrics_histogram(m, "bloomgrid_merger_round_duration_seconds",
                                    "time a round took", NULL, round_bounds,
                                    sizeof round_bounds / sizeof round_bounds[0]);
    mm.pages_pulled = metrics_counter(m, "bloomgrid_merger_pages_pulled_total",
                                      "pages pulled from the copies", NULL);
    mm.pages_pushed = metrics_counter(m, "bloomgrid_merger_pages_pushed_total",
                                      "pages pushed to the copies", NULL);
    mm.bytes_pulled = metrics_counter(m, "bloomgrid_merger_pulled_bytes_total",
                                      "bytes pulled: pages, and keys' hashes "
                                      "(16 bytes each)", NULL);
    mm.keys_pulled = metrics_counter(m, "bloomgrid_merger_keys_pulled_total",
                                     "keys' hashes pulled from the copies "
                                     "instead of pages", NULL);
    mm.bytes_pushed = metrics_counter(m, "bloomgrid_merger_pushed_bytes_total",
                                      "bytes pushed: pages, and keys' hashes "
                                      "(16 bytes each)", NULL);
    mm.keys_pushed = metrics_counter(m, "bloomgrid_merger_keys_pushed_total",
                                     "keys' hashes pushed to the copies "
                                     "instead of pages", NULL);
    mm.uncovered = metrics_gauge(m, "bloomgrid_merger_uncovered_pulls",
                                 "pulls of the last round short of the read quorum "
                                 "of in-sync copies", NULL);
}

void merger_metrics_register(void)
{
    pthread_once(&mm_once, mm_register);
}

void merger_metrics_round(const struct mg_report *rep)
{
    pthread_once(&mm_once, mm_register);
    metric_add(mm.rounds, 1);
    metric_add(mm.failed, rep->errors > 0);
    metric_add(mm.errors, rep->errors);
    metric_observe(mm.duration, (double)rep->duration_ms / 1000.0);
    metric_add(mm.pages_pulled, rep->pages_pulled);
    metric_add(mm.pages_pushed, rep->pages_pushed);
    metric_add(mm.bytes_pulled, rep->bytes_pulled);
    metric_add(mm.keys_pulled, rep->keys_pulled);
    metric_add(mm.bytes_pushed, rep->bytes_pushed);
    metric_add(mm.keys_pushed, rep->keys_pushed);
    metric_set(mm.uncovered, rep->uncovered);
    /* A copy's series is made the first round that sees it and keeps the
     * last value known. */
    for (size_t i = 0; i < rep->nlag; i++) {
        const struct mg_lag *l = &rep->lag[i];
        char shard[16];
        snprintf(shard, sizeof shard, "%u", l->shard);
        const char *labels[] = {"filter", l->filter, "shard", shard, "datacenter",
                                l->dc, "node", l->node, NULL};
        metric_set(metrics_gauge(metrics_registry(), "bloomgrid_merger_copy_lag_seconds",
                                 "age of the data a copy is known to hold, at the "
                                 "last round (0: not known)", labels),
                   (double)l->lag_ms / 1000.0);
    }
}
