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
#include "proc_malloc.h"
#include "rules.h"
#include "store.h"

/* What one filter (a shard, on a node) shows, read under its shared lock,
 * with its last sample; v[] in the order of fam[], < 0 where it has none. */
enum { F_BYTES, F_INSERTS, F_CAPACITY, F_TARGET, F_MODEL, F_SYNCING,
       F_FILL, F_NHAT, F_EFPR, F_N };
struct filter_facts {
    const char *name;           /* the store name: "<filter>.shard-<i>" or "<filter>" */
    size_t flen;                /* the filter's name: name[0, flen) */
    unsigned shard;             /* its index (0 unsharded) */
    bool ready;
    double v[F_N];
};

/* The per-filter families: how metrics_shards = filter folds the shards
 * a node holds of one filter (a sum, or the largest: the worst shard). */
static const struct {
    const char *name, *help;
    enum metric_type type;
    bool sum;
} fam[F_N] = {
    [F_BYTES] = {"bloomgrid_filter_bytes", "bytes of the filter's bits", METRIC_GAUGE, true},
    [F_INSERTS] = {"bloomgrid_filter_inserts_total",
                   "adds that set a bit (keys not seen before, bar false positives)",
                   METRIC_COUNTER, true},
    [F_CAPACITY] = {"bloomgrid_filter_capacity",
                    "keys the filter is sized for (scalable: its first layer)",
                    METRIC_GAUGE, true},
    [F_TARGET] = {"bloomgrid_filter_target_fpr",
                  "the false positive rate the filter was created for", METRIC_GAUGE, false},
    [F_MODEL] = {"bloomgrid_filter_model_fpr",
                 "false positive rate its geometry gives at its insert count "
                 "(no scan of the bits)", METRIC_GAUGE, false},
    [F_SYNCING] = {"bloomgrid_shard_syncing",
                   "1 while this copy of the shard is SYNCING (reads refused)",
                   METRIC_GAUGE, false},
    [F_FILL] = {"bloomgrid_filter_fill_ratio", "bits set / bits, from the last sample",
                METRIC_GAUGE, false},
    [F_NHAT] = {"bloomgrid_filter_estimated_keys",
                "n-hat, the distinct keys the fill says the filter holds (last sample)",
                METRIC_GAUGE, true},
    [F_EFPR] = {"bloomgrid_filter_estimated_fpr",
                "false positive rate the fill gives (last sample; bits from Import "
                "and merged pages included)", METRIC_GAUGE, false},
};

/* The FPR the layers' geometry gives at the adds each one counted: cheap
 * (a few layers), and what the filter's fill would show for distinct keys. */
static void facts_read(const struct bf *f, void *ctx)
{
    struct filter_facts *ff = ctx;
    struct bf_layer_info li;
    double miss = 1.0;

    ff->v[F_BYTES] = (double)bf_bytes(f);
    ff->v[F_INSERTS] = (double)bf_insert_count(f);
    ff->v[F_CAPACITY] = (double)bf_capacity(f);
    ff->v[F_TARGET] = bf_error_rate(f);
    for (uint32_t i = 0; i < bf_layer_count(f); i++)
        if (bf_layer_info(f, i, &li) == 0)
            miss *= 1.0 - bf_model_fpr(bf_kind(f), li.m, li.k, (double)li.count);
    ff->v[F_MODEL] = 1.0 - miss;
    ff->ready = true;
}

/* ---- sampled fill ----------------------------------------------------- */

/* Words read per pass over all filters, and per filter (at least 256, at
 * most 64 Ki: a 512 KiB sample, a fill error of about 2.5e-4). */
#define SAMPLE_PASS_WORDS (16u << 20)
#define SAMPLE_MIN_WORDS 256u
#define SAMPLE_MAX_WORDS 65536u

/* The gauges of one sample: fam[F_FILL + S_...]. */
enum { S_FILL, S_NHAT, S_FPR, S_N };

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

static bool same_filter(const struct filter_facts *x, const struct filter_facts *y)
{
    return x->flen == y->flen && memcmp(x->name, y->name, x->flen) == 0;
}

static int by_filter_shard(const void *a, const void *b)
{
    const struct filter_facts *x = a, *y = b;
    int c = memcmp(x->name, y->name, x->flen < y->flen ? x->flen : y->flen);
    if (!c)
        c = x->flen < y->flen ? -1 : x->flen > y->flen;
    return c ? c : x->shard < y->shard ? -1 : x->shard > y->shard;
}

/* Fold ff[from, to) (the ready shards of one filter) into one value of
 * family f: a sum or the largest; < 0 when a shard has none. */
static double fold(const struct filter_facts *ff, size_t from, size_t to, int f)
{
    double acc = 0;
    for (size_t i = from; i < to; i++) {
        if (ff[i].v[f] < 0)
            return -1;
        acc = fam[f].sum ? acc + ff[i].v[f] : (i == from || ff[i].v[f] > acc ? ff[i].v[f] : acc);
    }
    return acc;
}

/* Every family of the ready filters ff[0, n) (sorted by filter, shard):
 * one series per shard ({filter, shard}), or with per_filter one per
 * filter ({filter}), its shards folded. */
static void emit_filters(struct metrics_out *out, const struct filter_facts *ff, size_t n,
                         bool per_filter)
{
    char shard[12], filter[RULES_STORE_NAME_MAX + 1];
    for (int f = 0; f < F_N; f++) {
        for (size_t i = 0, j; i < n; i = j) {
            j = i + 1;
            snprintf(filter, sizeof filter, "%.*s", (int)ff[i].flen, ff[i].name);
            if (!per_filter) {
                if (ff[i].v[f] < 0)
                    continue;
                snprintf(shard, sizeof shard, "%u", ff[i].shard);
                metrics_emit(out, fam[f].type, fam[f].name, fam[f].help,
                             (const char *const[]){"filter", filter, "shard", shard, NULL},
                             ff[i].v[f]);
                continue;
            }
            while (j < n && same_filter(&ff[j], &ff[i]))
                j++;
            double v = fold(ff, i, j, f);
            if (v >= 0)
                metrics_emit(out, fam[f].type, fam[f].name, fam[f].help,
                             (const char *const[]){"filter", filter, NULL}, v);
        }
    }
}

static void node_sampler(void *arg, struct metrics_out *out)
{
    struct node *n = arg;
    struct store *s = node_store(n);
    char **names = NULL;
    size_t nn = 0, k = 0;

    if (!s || store_list(s, &names, &nn) < 0)
        return;
    struct filter_facts *ff = calloc(nn ? nn : 1, sizeof *ff);
    if (!ff)
        goto done;
    for (size_t i = 0; i < nn; i++) {
        struct filter_facts *x = &ff[k];
        struct store_filter *sf = store_get(s, names[i]);
        if (!sf)
            continue;
        x->name = names[i];
        store_filter_inspect(sf, facts_read, x);
        if (x->ready)
            x->v[F_SYNCING] = node_rpc__shard_syncing(sf);
        store_put(sf);
        if (!x->ready)
            continue;
        char filter[RULES_STORE_NAME_MAX + 1];
        rules_shard_split(names[i], filter, sizeof filter, &x->shard);
        x->flen = strlen(filter);
        /* The last sample of the bits (metrics_sample_s), where there is one. */
        pthread_mutex_lock(&fs.mu);
        const struct sampled *sm = sampled_find(names[i]);
        for (int f = 0; f < S_N; f++)
            x->v[F_FILL + f] = sm ? sm->v[f] : -1;
        pthread_mutex_unlock(&fs.mu);
        k++;
    }
    qsort(ff, k, sizeof *ff, by_filter_shard);
    emit_filters(out, ff, k, strcmp(n->cfg.metrics_shards, "filter") == 0);

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
    struct proc_malloc_stats ms;
    proc_malloc_stats(&ms);
    metrics_emit(out, METRIC_GAUGE, "bloomgrid_process_malloc_held_bytes",
                 "bytes the allocator holds from the system (its heaps and its "
                 "own mappings; filters' bits are mapped apart and not in it)",
                 NULL, (double)ms.held);
    metrics_emit(out, METRIC_GAUGE, "bloomgrid_process_malloc_free_bytes",
                 "of bloomgrid_process_malloc_held_bytes, the bytes free in the "
                 "allocator's heaps (kept for reuse)", NULL, (double)ms.free);
    free(ff);
done:
    store_list_free(names, nn);
}

void node_metrics_start(struct node *n)
{
    struct metrics *m = metrics_registry();
    /* Counters are served from the start, at 0 (docs/METRICS.md). */
    store_metrics_register();
    node_rpc__pull_bytes_register();
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
