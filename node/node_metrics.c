/* node_metrics: the node's sampled series (see node_metrics.h). */
#include "node_metrics.h"

#include <math.h>
#include <stdlib.h>

#include "bf.h"
#include "metrics.h"
#include "node.h"
#include "node_rpc.h"
#include "store.h"

/* What one filter shows, read under its shared lock. */
struct filter_facts {
    const char *name;
    bool ready, syncing;
    double bytes, inserts, capacity, target_fpr, model_fpr;
};

/* The FPR the layers' geometry gives at the adds each one counted: cheap
 * (a few layers), and what the filter's fill would show for distinct keys. */
static void facts_read(const struct bf *f, void *ctx)
{
    struct filter_facts *ff = ctx;
    struct bf_layer_info li;
    double miss = 1.0;

    ff->bytes = (double)bf_bytes(f);
    ff->inserts = (double)bf_insert_count(f);
    ff->capacity = (double)bf_capacity(f);
    ff->target_fpr = bf_error_rate(f);
    for (uint32_t i = 0; i < bf_layer_count(f); i++)
        if (bf_layer_info(f, i, &li) == 0)
            miss *= 1.0 - bf_model_fpr(bf_kind(f), li.m, li.k, (double)li.count);
    ff->model_fpr = 1.0 - miss;
    ff->ready = true;
}

#define EMIT(type, family, help, field)                                        \
    for (size_t i = 0; i < nn; i++)                                            \
        if (ff[i].ready)                                                       \
            metrics_emit(out, type, family, help,                              \
                         (const char *const[]){"filter", ff[i].name, NULL},    \
                         ff[i].field)

static void node_sampler(void *arg, struct metrics_out *out)
{
    struct node *n = arg;
    struct store *s = node_store(n);
    char **names = NULL;
    size_t nn = 0;

    if (!s || store_list(s, &names, &nn) < 0)
        return;
    struct filter_facts *ff = calloc(nn ? nn : 1, sizeof *ff);
    if (!ff)
        goto done;
    for (size_t i = 0; i < nn; i++) {
        struct store_filter *sf = store_get(s, names[i]);
        ff[i].name = names[i];
        if (!sf)
            continue;
        store_filter_inspect(sf, facts_read, &ff[i]);
        ff[i].syncing = ff[i].ready && node_rpc__shard_syncing(sf);
        store_put(sf);
    }
    EMIT(METRIC_GAUGE, "bloomgrid_filter_bytes", "bytes of the filter's bits", bytes);
    EMIT(METRIC_COUNTER, "bloomgrid_filter_inserts_total",
         "adds that set a bit (keys not seen before, bar false positives)", inserts);
    EMIT(METRIC_GAUGE, "bloomgrid_filter_capacity",
         "keys the filter is sized for (scalable: its first layer)", capacity);
    EMIT(METRIC_GAUGE, "bloomgrid_filter_target_fpr",
         "the false positive rate the filter was created for", target_fpr);
    EMIT(METRIC_GAUGE, "bloomgrid_filter_model_fpr",
         "false positive rate its geometry gives at its insert count "
         "(no scan of the bits)", model_fpr);
    EMIT(METRIC_GAUGE, "bloomgrid_shard_syncing",
         "1 while this copy of the shard is SYNCING (reads refused)", syncing);

    struct store_budget b;
    store_budget(s, &b);
    metrics_emit(out, METRIC_GAUGE, "bloomgrid_node_memory_charged_bytes",
                 "memory charged to the filters held", NULL, (double)b.charged_bytes);
    metrics_emit(out, METRIC_GAUGE, "bloomgrid_node_memory_max_bytes",
                 "max_memory_mb in bytes (0: none)", NULL, (double)b.max_memory_bytes);
    metrics_emit(out, METRIC_GAUGE, "bloomgrid_node_filters", "filters (shards) held",
                 NULL, (double)b.filters);
    metrics_emit(out, METRIC_GAUGE, "bloomgrid_wal_bytes",
                 "bytes of write-ahead log not yet checkpointed away", NULL,
                 (double)store_log_bytes(s));
    free(ff);
done:
    store_list_free(names, nn);
}

void node_metrics_start(struct node *n)
{
    struct metrics *m = metrics_registry();
    if (m)
        metrics_add_sampler(m, node_sampler, n);
}
