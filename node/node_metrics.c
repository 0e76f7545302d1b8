/* node_metrics: the node's sampled series (see node_metrics.h). */
#include "node_metrics.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bf.h"
#include "log.h"
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

/* ---- sampled fill ----------------------------------------------------- */

/* Words read per pass over all filters, and per filter (at least 256, at
 * most 64 Ki: a 512 KiB sample, a fill error of about 2.5e-4). */
#define SAMPLE_PASS_WORDS (16u << 20)
#define SAMPLE_MIN_WORDS 256u
#define SAMPLE_MAX_WORDS 65536u

/* The gauges of one sample, in the order of sampled_fam. */
enum { S_FILL, S_NHAT, S_FPR, S_N };
static const char *const sampled_fam[S_N][2] = {
    {"bloomgrid_filter_fill_ratio", "bits set / bits, from the last sample"},
    {"bloomgrid_filter_estimated_keys",
     "n-hat, the distinct keys the fill says the filter holds (last sample)"},
    {"bloomgrid_filter_estimated_fpr",
     "false positive rate the fill gives (last sample; bits from Import and "
     "merged pages included)"}};

struct sampled {
    char *name;
    double v[S_N];   /* < 0: none (n-hat of a full filter) */
};

static struct {
    pthread_mutex_t mu;        /* v, n */
    struct sampled *v;         /* sorted by name */
    size_t n;
    pthread_mutex_t wait_mu;
    pthread_cond_t wait_cv;
    atomic_bool stop;
    bool running;
    pthread_t th;
} fs = {.mu = PTHREAD_MUTEX_INITIALIZER, .wait_mu = PTHREAD_MUTEX_INITIALIZER,
        .wait_cv = PTHREAD_COND_INITIALIZER};

struct sample_job {
    uint64_t max_words, seed;
    struct sampled *out;
    bool done;
};

static void sample_read(const struct bf *f, void *ctx)
{
    struct sample_job *j = ctx;
    struct bf_stats st;

    bf_stats_sampled(f, j->max_words, j->seed, &st);
    j->out->v[S_FILL] = st.fill_ratio;
    j->out->v[S_NHAT] = isfinite(st.estimated_count) ? st.estimated_count : -1.0;
    j->out->v[S_FPR] = st.estimated_fpr;
    j->done = true;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(((const struct sampled *)a)->name, ((const struct sampled *)b)->name);
}

static void sampled_free(struct sampled *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(v[i].name);
    free(v);
}

/* One pass: every READY filter, read under its shared lock. */
static void sample_pass(struct node *n, uint64_t seed)
{
    struct store *s = node_store(n);
    char **names = NULL;
    size_t nn = 0, k = 0;

    if (!s || store_list(s, &names, &nn) < 0)
        return;
    struct sampled *v = calloc(nn ? nn : 1, sizeof *v);
    uint64_t per = nn ? SAMPLE_PASS_WORDS / nn : SAMPLE_MAX_WORDS;
    per = per < SAMPLE_MIN_WORDS ? SAMPLE_MIN_WORDS
          : per > SAMPLE_MAX_WORDS ? SAMPLE_MAX_WORDS : per;
    for (size_t i = 0; v && i < nn && !atomic_load(&fs.stop); i++) {
        struct store_filter *sf = store_get(s, names[i]);
        if (!sf)
            continue;
        struct sample_job j = {.max_words = per, .seed = seed + i, .out = &v[k]};
        store_filter_inspect(sf, sample_read, &j);
        store_put(sf);
        if (j.done && (v[k].name = strdup(names[i])))
            k++;
    }
    store_list_free(names, nn);
    if (!v)
        return;
    qsort(v, k, sizeof *v, by_name);
    pthread_mutex_lock(&fs.mu);
    struct sampled *old = fs.v;
    size_t oldn = fs.n;
    fs.v = v;
    fs.n = k;
    pthread_mutex_unlock(&fs.mu);
    sampled_free(old, oldn);
}

static void *sample_main(void *arg)
{
    struct node *n = arg;
    uint64_t seed = (uint64_t)time(NULL);

    while (!atomic_load(&fs.stop)) {
        sample_pass(n, seed);
        seed += 0x9e3779b97f4a7c15ULL;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += (time_t)n->cfg.metrics_sample_s;
        pthread_mutex_lock(&fs.wait_mu);
        while (!atomic_load(&fs.stop) &&
               pthread_cond_timedwait(&fs.wait_cv, &fs.wait_mu, &ts) == 0)
            ;
        pthread_mutex_unlock(&fs.wait_mu);
    }
    return NULL;
}

/* The last sample of name, or NULL; fs.mu held. */
static const struct sampled *sampled_find(const char *name)
{
    struct sampled key = {.name = (char *)name};
    return fs.n ? bsearch(&key, fs.v, fs.n, sizeof key, by_name) : NULL;
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
    /* The last sample of the bits (metrics_sample_s), for the filters that
     * have one. */
    pthread_mutex_lock(&fs.mu);
    for (int f = 0; f < S_N; f++)
        for (size_t i = 0; i < nn; i++) {
            const struct sampled *sm = ff[i].ready ? sampled_find(ff[i].name) : NULL;
            if (sm && sm->v[f] >= 0)
                metrics_emit(out, METRIC_GAUGE, sampled_fam[f][0], sampled_fam[f][1],
                             (const char *const[]){"filter", ff[i].name, NULL},
                             sm->v[f]);
        }
    pthread_mutex_unlock(&fs.mu);

    struct store_budget b;
    store_budget(s, &b);
    metrics_emit(out, METRIC_GAUGE, "bloomgrid_node_memory_charged_bytes",
                 "memory charged to the filters held", NULL, (double)b.charged_bytes);
    metrics_emit(out, METRIC_GAUGE, "bloomgrid_node_memory_max_bytes",
                 "max_memory_mb in bytes (0: none)", NULL, (double)b.max_memory_bytes);
    metrics_emit(out, METRIC_GAUGE, "bloomgrid_node_filters", "filters (shards) held",
                 NULL, (double)b.filters);
    metrics_emit(out, METRIC_GAUGE, "bloomgrid_wal_bytes",
                 "bytes of write-ahead log records not yet checkpointed away "
                 "(what snapshot_wal_mb bounds)", NULL,
                 (double)store_log_bytes(s));
    metrics_emit(out, METRIC_GAUGE, "bloomgrid_wal_file_bytes",
                 "bytes of the write-ahead log's files, padding to write "
                 "units included", NULL, (double)store_log_file_bytes(s));
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

int node_metrics_sample_start(struct node *n)
{
    atomic_store(&fs.stop, false);
    if (pthread_create(&fs.th, NULL, sample_main, n) != 0) {
        log_warn("no thread for the fill gauges: they are not served");
        return -1;
    }
    fs.running = true;
    return 0;
}

void node_metrics_sample_stop(void)
{
    if (!fs.running)
        return;
    pthread_mutex_lock(&fs.wait_mu);
    atomic_store(&fs.stop, true);
    pthread_cond_broadcast(&fs.wait_cv);
    pthread_mutex_unlock(&fs.wait_mu);
    pthread_join(fs.th, NULL);
    fs.running = false;
    pthread_mutex_lock(&fs.mu);
    sampled_free(fs.v, fs.n);
    fs.v = NULL;
    fs.n = 0;
    pthread_mutex_unlock(&fs.mu);
}
