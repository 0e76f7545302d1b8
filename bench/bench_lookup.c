/* bench_lookup: the cost of finding a filter by name, as every data call
 * does (a node's store_get + store_put, a router's filter cache), at
 * 10 / 1 000 / 4 300 / 100 000 names, with 1 and 2 threads at once.
 *
 *   table  the two ways side by side, on names alone (no filters): the
 *          linear catalog (one mutex, strcmp over an array: what the
 *          store and the router did) and name_index (uthash stripes
 *          behind read-write locks); each lookup takes and drops a
 *          reference, as store_get / store_put do;
 *   store  store_get + store_put on a real store holding that many
 *          filters (10 / 1 000 / 4 300: each filter maps its own bits,
 *          and a process may hold ~65 000 maps), in a temporary
 *          directory (TMPDIR, else /tmp; /dev/shm keeps creation quick).
 *          It uses only store.h, so the same file built against an
 *          older tree measures that tree's store ("before").
 *
 * usage: bench_lookup [table|store|all] [--seconds S]   (default all, 0.5 s
 * per row).  Prints one markdown row per measurement: ns per lookup,
 * the median of 3 runs.  Figures are for reading side by side in one run,
 * never asserted.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "store.h"

#ifdef BENCH_LOOKUP_TABLE
#include "name_index.h"
#endif

static double seconds = 0.5;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static char **names_make(size_t n)
{
    char **v = malloc(n * sizeof *v);
    for (size_t i = 0; v && i < n; i++) {
        char buf[64];
        snprintf(buf, sizeof buf, "filter%zu.shard-%zu", i / 64, i % 64);
        v[i] = strdup(buf);
    }
    return v;
}

static void names_free(char **v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(v[i]);
    free(v);
}

/* One measurement: threads call op(ctx, name) on random names for the
 * given time; returns ns per call (wall time / calls per thread). */
struct run {
    void *(*op)(void *ctx, const char *name);
    void *ctx;
    char **names;
    size_t n;
    atomic_bool go, stop;
    atomic_ullong calls;
};

static void *runner(void *arg)
{
    struct run *r = arg;
    uint64_t x = (uint64_t)(uintptr_t)&x ^ 0x9e3779b97f4a7c15ULL;
    unsigned long long calls = 0;
    while (!atomic_load(&r->go))
        ;
    while (!atomic_load_explicit(&r->stop, memory_order_relaxed)) {
        for (int k = 0; k < 64; k++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if (!r->op(r->ctx, r->names[x % r->n]))
                abort();
        }
        calls += 64;
    }
    atomic_fetch_add(&r->calls, calls);
    return NULL;
}

static double measure1(struct run *r, int threads)
{
    pthread_t th[2];
    atomic_store(&r->go, false);
    atomic_store(&r->stop, false);
    atomic_store(&r->calls, 0);
    for (int i = 0; i < threads; i++)
        pthread_create(&th[i], NULL, runner, r);
    double t0 = now_s();
    atomic_store(&r->go, true);
    usleep((useconds_t)(seconds * 1e6));
    atomic_store(&r->stop, true);
    for (int i = 0; i < threads; i++)
        pthread_join(th[i], NULL);
    double dt = now_s() - t0;
    return dt * 1e9 * threads / (double)atomic_load(&r->calls);
}

static int dcmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double measure(struct run *r, int threads)
{
    double v[3];
    for (int i = 0; i < 3; i++)
        v[i] = measure1(r, threads);
    qsort(v, 3, sizeof v[0], dcmp);
    return v[1];
}

#ifdef BENCH_LOOKUP_TABLE
/* ---- table: the linear catalog beside name_index ---- */

struct item {
    const char *name;
    atomic_int refs;
};

struct linear {
    pthread_mutex_t mu;
    struct item **v;
    size_t n;
};

static void *linear_get(void *ctx, const char *name)
{
    struct linear *l = ctx;
    struct item *it = NULL;
    pthread_mutex_lock(&l->mu);
    for (size_t i = 0; i < l->n; i++)
        if (strcmp(l->v[i]->name, name) == 0) {
            it = l->v[i];
            break;
        }
    if (it)
        atomic_fetch_add(&it->refs, 1);
    pthread_mutex_unlock(&l->mu);
    if (it)
        atomic_fetch_sub(&it->refs, 1);
    return it;
}

static void take(void *value, void *ctx)
{
    (void)ctx;
    atomic_fetch_add(&((struct item *)value)->refs, 1);
}

static void *index_get(void *ctx, const char *name)
{
    struct item *it = name_index_get(ctx, name, take, NULL);
    if (it)
        atomic_fetch_sub(&it->refs, 1);
    return it;
}

static void bench_table(void)
{
    static const size_t sizes[] = {10, 1000, 4300, 100000};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t n = sizes[k];
        char **names = names_make(n);
        struct item *items = calloc(n, sizeof *items);
        struct linear lin = {.v = malloc(n * sizeof *lin.v), .n = n};
        struct name_index *ix = name_index_create();
        pthread_mutex_init(&lin.mu, NULL);
        for (size_t i = 0; i < n; i++) {
            items[i].name = names[i];
            lin.v[i] = &items[i];
            name_index_add(ix, names[i], &items[i]);
        }
        for (int threads = 1; threads <= 2; threads++) {
            struct run a = {.op = linear_get, .ctx = &lin, .names = names, .n = n};
            struct run b = {.op = index_get, .ctx = ix, .names = names, .n = n};
            double la = measure(&a, threads), lb = measure(&b, threads);
            printf("| table | %zu | %d | linear, one mutex | %.0f |\n", n, threads, la);
            printf("| table | %zu | %d | name_index | %.0f |\n", n, threads, lb);
            fflush(stdout);
        }
        name_index_destroy(ix);
        pthread_mutex_destroy(&lin.mu);
        free(lin.v);
        free(items);
        names_free(names, n);
    }
}
#endif

/* ---- store: store_get + store_put on a real store ---- */

static void *store_op(void *ctx, const char *name)
{
    struct store_filter *sf = store_get(ctx, name);
    if (sf)
        store_put(sf);
    return sf;
}

static void bench_store(const char *label)
{
    static const size_t sizes[] = {10, 1000, 4300};
    const char *tmp = getenv("TMPDIR");
    char dir[512], err[STORE_ERRLEN], cmd[600];

    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t n = sizes[k];
        snprintf(dir, sizeof dir, "%s/bench-lookup-XXXXXX", tmp && *tmp ? tmp : "/tmp");
        if (!mkdtemp(dir)) {
            perror("mkdtemp");
            exit(1);
        }
        struct store_options o = {.dir = dir, .durability = STORE_DURABLE_NONE,
                                  .snapshot_interval_ms = 3600000};
        struct store *s = store_open(&o, err);
        if (!s) {
            fprintf(stderr, "store_open: %s\n", err);
            exit(1);
        }
        char **names = names_make(n);
        struct bf_params p = {.kind = BF_KIND_BLOCKED, .capacity = 1, .error_rate = 0.5,
                              .shard_count = 1};
        for (size_t i = 0; i < n; i++)
            if (store_create(s, names[i], &p, err) < 0) {
                fprintf(stderr, "create %s: %s\n", names[i], err);
                exit(1);
            }
        for (int threads = 1; threads <= 2; threads++) {
            struct run r = {.op = store_op, .ctx = s, .names = names, .n = n};
            printf("| store | %zu | %d | %s | %.0f |\n", n, threads, label,
                   measure(&r, threads));
            fflush(stdout);
        }
        store_close(s);
        names_free(names, n);
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        if (system(cmd) != 0)
            fprintf(stderr, "cannot remove %s\n", dir);
    }
}

int main(int argc, char **argv)
{
    const char *what = "all";
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--seconds") == 0 && i + 1 < argc)
            seconds = atof(argv[++i]);
        else if (argv[i][0] != '-')
            what = argv[i];
        else {
            fprintf(stderr, "usage: %s [table|store|all] [--seconds S]\n", argv[0]);
            return 2;
        }
    }
    if (seconds <= 0)
        seconds = 0.5;
    printf("| part | names | threads | lookup | ns per lookup |\n|---|---:|---:|---|---:|\n");
#ifdef BENCH_LOOKUP_TABLE
    if (strcmp(what, "table") == 0 || strcmp(what, "all") == 0)
        bench_table();
#endif
    if (strcmp(what, "store") == 0 || strcmp(what, "all") == 0)
        bench_store(getenv("BENCH_LOOKUP_LABEL") ? getenv("BENCH_LOOKUP_LABEL")
                                                  : "store_get + store_put");
    return 0;
}
