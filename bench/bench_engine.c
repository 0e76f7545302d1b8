/* bench_engine: one core, 16-byte keys, hashing included.  Prints ns/key for
 * add, query-present and query-absent, single and batched, with bits/key and
 * the measured false-positive rate, for the blocked and classic kinds and for
 * Debian's libbloom side by side, on a filter that fits in cache and on one
 * far larger than the last-level cache.
 *
 * Keys are generated into a buffer before each timed chunk, so key
 * generation is not timed.  Add is timed in four quarters of the fill:
 * single/batched, each with atomic ORs (the service's mode) and in exclusive
 * single-writer mode (the offline tool's mode).
 */
#include <bloom.h>
#include <getopt.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "bf.h"

#define CHUNK 4096

struct keybuf {
    uint64_t k[CHUNK][2];
    const void *ptr[CHUNK];
    size_t len[CHUNK];
};

static uint64_t splitmix(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ULL;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

/* Keys [from, from+n) of a stream; stream 0 is added, stream 1 is absent. */
static void gen(struct keybuf *b, int stream, uint64_t from, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t x = (from + i) * 2 + (uint64_t)stream;
        b->k[i][0] = splitmix(x);
        b->k[i][1] = splitmix(x ^ 0x5bd1e995ULL);
        b->ptr[i] = b->k[i];
        b->len[i] = 16;
    }
}

/* The clock of every measurement: wall time, or (--tracking-cost) the
 * thread's CPU time, which time spent waiting for the cores of a shared
 * machine does not count. */
static clockid_t bench_clock = CLOCK_MONOTONIC;

static double now_ns(void)
{
    struct timespec ts;

    clock_gettime(bench_clock, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

enum op { OP_ADD, OP_ADD_BATCH, OP_QUERY, OP_QUERY_BATCH };

/* The thing being measured: our filter or libbloom. */
struct target {
    const char *name;
    struct bf *f;
    struct bloom *lb;
    uint64_t capacity;
    double bits_per_key;
};

/* Run op over keys [from, from+n) of stream; returns ns and counts hits. */
static double run(struct target *t, enum op op, int stream, uint64_t from, uint64_t n,
                  uint64_t *hits)
{
    static struct keybuf b;
    static bool out[CHUNK];
    double ns = 0;

    for (uint64_t done = 0; done < n;) {
        size_t c = n - done < CHUNK ? (size_t)(n - done) : CHUNK;
        gen(&b, stream, from + done, c);
        double t0 = now_ns();
        uint64_t h = 0;
        if (t->lb) {
            for (size_t i = 0; i < c; i++) {
                if (op == OP_ADD || op == OP_ADD_BATCH)
                    bloom_add(t->lb, b.k[i], 16);
                else
                    h += bloom_check(t->lb, b.k[i], 16) == 1;
            }
        } else {
            switch (op) {
            case OP_ADD:
                for (size_t i = 0; i < c; i++)
                    bf_add(t->f, b.k[i], 16);
                break;
            case OP_ADD_BATCH:
                bf_add_keys(t->f, b.ptr, b.len, c, NULL);
                break;
            case OP_QUERY:
                for (size_t i = 0; i < c; i++)
                    h += bf_may_contain(t->f, b.k[i], 16);
                break;
            case OP_QUERY_BATCH:
                bf_may_contain_keys(t->f, b.ptr, b.len, c, out);
                for (size_t i = 0; i < c; i++)
                    h += out[i];
                break;
            }
        }
        ns += now_ns() - t0;
        if (hits)
            *hits += h;
        done += c;
    }
    return ns;
}

struct result {
    double add[4];            /* single atomic, batch atomic, single excl, batch excl */
    double qp, qp_batch, qa, qa_batch;
    double fpr;
    uint64_t present_hits, present_n;
};

static void print_row(const char *size, struct target *t, const struct result *r)
{
    char add[64], addx[64], qpb[16], qab[16];

    if (t->lb) {
        snprintf(add, sizeof(add), "%6.1f      -", r->add[0]);
        snprintf(addx, sizeof(addx), "     -      -");
        snprintf(qpb, sizeof(qpb), "     -");
        snprintf(qab, sizeof(qab), "     -");
    } else {
        snprintf(add, sizeof(add), "%6.1f %6.1f", r->add[0], r->add[1]);
        snprintf(addx, sizeof(addx), "%6.1f %6.1f", r->add[2], r->add[3]);
        snprintf(qpb, sizeof(qpb), "%6.1f", r->qp_batch);
        snprintf(qab, sizeof(qab), "%6.1f", r->qa_batch);
    }
    printf("| %-7s | %-9s | %s | %s | %6.1f %s | %6.1f %s | %6.2f | %.4f%% |\n", size,
           t->name, add, addx, r->qp, qpb, r->qa, qab, t->bits_per_key, r->fpr * 100.0);
    fflush(stdout);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return x < y ? -1 : x > y;
}

/* Query keys [from, from+n) of stream `reps` times, timing SEGMENTS equal
 * slices of each pass; returns the median ns/key over the slices.  The median
 * keeps a burst of work from other tenants of a shared machine out of the
 * figure without picking the luckiest slice. */
#define SEGMENTS 16
static double query_rate(struct target *t, enum op op, int stream, uint64_t from, uint64_t n,
                         int reps, uint64_t *hits)
{
    double *rate = malloc(sizeof(double) * SEGMENTS * (size_t)reps);
    uint64_t seg = n / SEGMENTS;
    int m = 0;

    for (int r = 0; r < reps; r++) {
        for (int s = 0; s < SEGMENTS; s++) {
            uint64_t lo = from + (uint64_t)s * seg;
            uint64_t len = s == SEGMENTS - 1 ? n - (uint64_t)s * seg : seg;
            rate[m++] = run(t, op, stream, lo, len, hits) / (double)len;
        }
    }
    qsort(rate, (size_t)m, sizeof(double), cmp_double);
    double med = rate[m / 2];
    free(rate);
    return med;
}

static void measure(struct target *t, uint64_t probes, int rounds, struct result *r)
{
    uint64_t n = t->capacity, q = n / 4, hits = 0;

    memset(r, 0, sizeof(*r));
    if (t->lb) {
        r->add[0] = run(t, OP_ADD, 0, 0, n, NULL) / (double)n;
    } else {
        bf_set_exclusive(t->f, false);
        r->add[0] = run(t, OP_ADD, 0, 0, q, NULL) / (double)q;
        r->add[1] = run(t, OP_ADD_BATCH, 0, q, q, NULL) / (double)q;
        bf_set_exclusive(t->f, true);
        r->add[2] = run(t, OP_ADD, 0, 2 * q, q, NULL) / (double)q;
        r->add[3] = run(t, OP_ADD_BATCH, 0, 3 * q, n - 3 * q, NULL) / (double)(n - 3 * q);
        bf_set_exclusive(t->f, false);
    }
    /* Present keys: cycle over what was added, `rounds` times for small filters. */
    uint64_t pn = probes < n ? probes : n;
    r->qp = query_rate(t, OP_QUERY, 0, 0, pn, rounds, &hits);
    if (!t->lb)
        r->qp_batch = query_rate(t, OP_QUERY_BATCH, 0, 0, pn, rounds, &hits);
    r->present_hits = hits;
    r->present_n = pn * (uint64_t)rounds * (t->lb ? 1 : 2);
    hits = 0;
    r->qa = query_rate(t, OP_QUERY, 1, 0, probes, 1, &hits);
    if (!t->lb)
        r->qa_batch = query_rate(t, OP_QUERY_BATCH, 1, probes, probes, 1, &hits);
    r->fpr = (double)hits / (double)(t->lb ? probes : 2 * probes);
}

/* Whole measurements per row (--repeat); the row prints the median of each
 * figure over them, or with --best the lowest time (the run least disturbed
 * by other work on the machine; the FPR is still the median). */
static int repeat = 1;
static bool track;       /* --track */
static bool blocked_only;   /* --blocked-only */
static bool best;

static double median_of(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static double min_of(const double *v, int n)
{
    double m = v[0];

    for (int i = 1; i < n; i++)
        m = v[i] < m ? v[i] : m;
    return m;
}

static void combine_results(const struct result *rs, int n, struct result *out)
{
    double v[64];
    size_t fields[] = {offsetof(struct result, add[0]), offsetof(struct result, add[1]),
                       offsetof(struct result, add[2]), offsetof(struct result, add[3]),
                       offsetof(struct result, qp),     offsetof(struct result, qp_batch),
                       offsetof(struct result, qa),     offsetof(struct result, qa_batch),
                       offsetof(struct result, fpr)};

    *out = rs[0];
    for (size_t f = 0; f < sizeof(fields) / sizeof(fields[0]); f++) {
        for (int i = 0; i < n; i++)
            v[i] = *(const double *)((const char *)&rs[i] + fields[f]);
        bool is_time = fields[f] != offsetof(struct result, fpr);
        *(double *)((char *)out + fields[f]) = best && is_time ? min_of(v, n) : median_of(v, n);
    }
}

static int bench_ours(const char *size, enum bf_kind kind, uint64_t n, uint64_t probes,
                      int rounds)
{
    struct bf_params p = {.kind = kind, .capacity = n, .error_rate = 0.01};
    char err[BF_ERRLEN];
    struct target t = {.name = bf_kind_name(kind), .capacity = n};
    struct result rs[64], r;
    struct bf_stats st;

    for (int i = 0; i < repeat; i++) {
        t.f = bf_create(&p, err);
        if (!t.f) {
            fprintf(stderr, "bench_engine: %s\n", err);
            return -1;
        }
        if (track) {
            /* As a store keeps them: a version per 4 KiB page, stamped by
             * every add that changes a page. */
            if (bf_track_pages(t.f, true) < 0) {
                fprintf(stderr, "bench_engine: no memory for page versions\n");
                return -1;
            }
            bf_set_stamp(t.f, 1);
        }
        bf_stats(t.f, &st);
        t.bits_per_key = (double)st.bits / (double)n;
        measure(&t, probes, rounds, &rs[i]);
        bf_destroy(t.f);
        if (rs[i].present_hits != rs[i].present_n) {
            fprintf(stderr, "bench_engine: FALSE NEGATIVES in %s\n", t.name);
            return -1;
        }
    }
    combine_results(rs, repeat, &r);
    print_row(size, &t, &r);
    return 0;
}

static int bench_libbloom(const char *size, uint64_t n, uint64_t probes, int rounds)
{
    struct bloom lb;
    struct target t = {.name = "libbloom", .capacity = n, .lb = &lb};
    struct result rs[64], r;

    for (int i = 0; i < repeat; i++) {
        if (bloom_init(&lb, (int)n, 0.01) != 0) {
            fprintf(stderr, "bench_engine: libbloom cannot hold %llu entries\n",
                    (unsigned long long)n);
            return -1;
        }
        t.bits_per_key = (double)lb.bits / (double)n;
        measure(&t, probes, rounds, &rs[i]);
        bloom_free(&lb);
    }
    combine_results(rs, repeat, &r);
    print_row(size, &t, &r);
    return 0;
}

/* --tracking-cost N: batched adds (exclusive writer, as a node's) of N keys
 * into two fresh blocked filters of large_mb, their pages faulted in
 * first, page versions off in one and on in the other.  The two take the
 * same keys in turn, TRACK_SLICE keys at a time (which goes first
 * alternates), so that whatever else the machine does falls on both alike;
 * repeat times, with fresh filters each time, the one made first tracked
 * in every other run.  Prints each run's CPU time per key of both and
 * their difference, the medians, and the median over pairs of runs. */
#define TRACK_SLICE (1u << 18)

static int tracking_cost(uint64_t large_mb, uint64_t n)
{
    uint64_t cap = (uint64_t)((double)large_mb * 1024 * 1024 * 8 / 10.2);
    struct bf_params p = {.kind = BF_KIND_BLOCKED, .capacity = cap, .error_rate = 0.01};
    double v[3][64];
    char err[BF_ERRLEN];

    bench_clock = CLOCK_THREAD_CPUTIME_ID;
    printf("batched adds (exclusive) of %llu keys into two blocked filters of %llu MiB, "
           "page versions off in one and on in the other, the same keys in turn %u at a "
           "time, CPU time\n", (unsigned long long)n, (unsigned long long)large_mb,
           TRACK_SLICE);
    for (int i = 0; i < repeat; i++) {
        struct target t[2];
        double ns[2] = {0, 0};
        /* Which filter is made first, and so where each lies in memory,
         * alternates between runs. */
        for (int m = 0; m < 2; m++) {
            int on = m ^ (i & 1);
            struct bf_layer_info li;
            t[on] = (struct target){.name = "blocked", .capacity = cap};
            if (!(t[on].f = bf_create(&p, err))) {
                fprintf(stderr, "bench_engine: %s\n", err);
                return -1;
            }
            bf_layer_info(t[on].f, 0, &li);
            memset(bf_layer_body(t[on].f, 0), 0, li.body_bytes);   /* fault it in */
            if (on) {
                if (bf_track_pages(t[on].f, true) < 0)
                    return -1;
                bf_set_stamp(t[on].f, 1);
            }
            bf_set_exclusive(t[on].f, true);
        }
        for (uint64_t done = 0, k = 0; done < n; k++) {
            uint64_t c = n - done < TRACK_SLICE ? n - done : TRACK_SLICE;
            for (int j = 0; j < 2; j++) {
                int on = (int)((k + (uint64_t)j) & 1);
                ns[on] += run(&t[on], OP_ADD_BATCH, 0, (uint64_t)i * n + done, c, NULL);
            }
            done += c;
        }
        for (int on = 0; on < 2; on++) {
            v[on][i] = ns[on] / (double)n;
            bf_destroy(t[on].f);
        }
        v[2][i] = v[1][i] - v[0][i];
        printf("run %d off %.2f ns/key on %.2f ns/key tracking %+.2f ns/key\n", i + 1,
               v[0][i], v[1][i], v[2][i]);
        fflush(stdout);
    }
    /* Where a filter lies in memory can cost more than the tracking (a few
     * ns/key either way on a VM): a pair of runs, one with each placement,
     * cancels it. */
    double pm[32];
    int np = repeat / 2;
    for (int j = 0; j < np; j++) {
        pm[j] = (v[2][2 * j] + v[2][2 * j + 1]) / 2;
        printf("pair %d (runs %d, %d) tracking %+.2f ns/key\n", j + 1, 2 * j + 1, 2 * j + 2,
               pm[j]);
    }
    printf("median off %.2f ns/key, on %.2f ns/key, tracking (median of the runs' "
           "differences) %+.2f ns/key\n", median_of(v[0], repeat), median_of(v[1], repeat),
           median_of(v[2], repeat));
    if (np)
        printf("tracking, median of %d pairs: %+.2f ns/key\n", np, median_of(pm, np));
    return 0;
}

static double cpu_s(void)
{
    struct rusage ru;

    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
}

/* --sweep N: a recovery's adds: N hashes added to a fresh blocked filter of
 * large_mb (exclusive, page versions on, its pages faulted in first) in
 * batches of a replay's buffer (one hash per 512 bytes of bits, at most
 * 2^21), in arrival order (bf_add_hashes), sorted on one thread
 * (bf_add_hashes_sweep) and on `threads` (bf_add_hashes_sweep_mt), in
 * turn, repeat times each; wall and CPU seconds of each and the medians. */
static int sweep_cost(uint64_t large_mb, uint64_t n, unsigned threads)
{
    uint64_t cap = (uint64_t)((double)large_mb * 1024 * 1024 * 8 / 10.2);
    struct bf_params p = {.kind = BF_KIND_BLOCKED, .capacity = cap, .error_rate = 0.01};
    static const char *const names[3] = {"in order", "sweep 1", "sweep N"};
    double wall[3][64], cpu[3][64];
    char err[BF_ERRLEN];

    printf("%llu hashes replayed into a blocked filter of %llu MiB: in order, sorted "
           "on 1 thread, sorted on %u threads, in turn\n", (unsigned long long)n,
           (unsigned long long)large_mb, threads);
    for (int i = 0; i < repeat; i++) {
        for (int m = 0; m < 3; m++) {
            struct bf *f = bf_create(&p, err);
            struct bf_layer_info li;
            if (!f) {
                fprintf(stderr, "bench_engine: %s\n", err);
                return -1;
            }
            bf_layer_info(f, 0, &li);
            memset(bf_layer_body(f, 0), 0, li.body_bytes);   /* fault it in */
            if (bf_track_pages(f, true) < 0)
                return -1;
            bf_set_stamp(f, 1);
            bf_set_exclusive(f, true);
            size_t batch = li.body_bytes / 512;
            batch = batch < 4096 ? 4096 : batch > (1u << 21) ? (1u << 21) : batch;
            struct bf_hash *h = malloc(2 * batch * sizeof *h);
            if (!h)
                return -1;
            double w = 0, c = 0;
            for (uint64_t done = 0; done < n;) {
                size_t k = n - done < batch ? (size_t)(n - done) : batch;
                for (size_t j = 0; j < k; j++) {
                    uint64_t x = splitmix((uint64_t)i << 40 | (done + j));
                    h[j] = bf_hash_key(f, &x, sizeof x);
                }
                double w0 = now_ns(), c0 = cpu_s();
                if (m == 0)
                    bf_add_hashes(f, h, k, NULL);
                else if (m == 1)
                    bf_add_hashes_sweep(f, h, k, h + batch);
                else
                    bf_add_hashes_sweep_mt(f, h, k, h + batch, threads);
                w += (now_ns() - w0) * 1e-9;
                c += cpu_s() - c0;
                done += k;
            }
            wall[m][i] = w;
            cpu[m][i] = c;
            printf("run %d %-8s wall %.3f s cpu %.3f s (%.1f ns/key)\n", i + 1, names[m],
                   w, c, w * 1e9 / (double)n);
            fflush(stdout);
            free(h);
            bf_destroy(f);
        }
    }
    for (int m = 0; m < 3; m++)
        printf("median %-8s wall %.3f s cpu %.3f s\n", names[m], median_of(wall[m], repeat),
               median_of(cpu[m], repeat));
    return 0;
}

static void usage(FILE *out)
{
    fprintf(out,
            "usage: bench_engine [--large-mb N] [--small-kb N] [--probes N] [--repeat N]\n"
            "                    [--best] [--skip-large] [--track] [--blocked-only]\n"
            "                    [--tracking-cost N] [--sweep N [--threads T]]\n"
            "  --large-mb N   size of the out-of-cache blocked/classic filters (default 1024)\n"
            "  --small-kb N   size of the in-cache filters (default 1024)\n"
            "  --probes N     queries per measurement (default 20000000)\n"
            "  --skip-large   only the in-cache filters (a quick run)\n"
            "  --repeat N     measure every row N times (fresh filters) and print the\n"
            "                 median of each figure (default 1; at most 64): steadier\n"
            "                 figures on a machine shared with other work\n"
            "  --best         with --repeat, print each time's lowest value over the N\n"
            "                 runs instead of the median (the run least disturbed by\n"
            "                 other work); the FPR column stays the median\n"
            "  --blocked-only the blocked kind alone (no classic, no libbloom): a few\n"
            "                 minutes rather than half an hour\n"
            "  --tracking-cost N  only this: N batched adds (exclusive writer) into\n"
            "                 two fresh blocked filters of --large-mb, page versions\n"
            "                 off in one and on in the other, the same keys in turn\n"
            "                 262144 at a time; --repeat runs (an even number: the\n"
            "                 filter made first is tracked in every other run), each\n"
            "                 run's difference, the medians, and the median over\n"
            "                 pairs of runs; the thread's CPU time (time spent\n"
            "                 waiting for a core of a busy machine is not counted)\n"
            "  --sweep N      only this: a recovery's adds of N hashes into a fresh\n"
            "                 blocked filter of --large-mb in a replay's batches: in\n"
            "                 order, sorted on 1 thread, sorted on --threads T (default\n"
            "                 2), --repeat times each; wall and CPU seconds, medians\n"
            "  --track        keep page versions on our filters (bf_track_pages), as a\n"
            "                 node does: the cost of dirty tracking, against a run\n"
            "                 without it\n"
            "All filters target a 1%% false-positive rate and are filled to capacity.\n"
            "libbloom stores its bit count in an int, so its large filter is capped\n"
            "at 2^31 bits (256 MB).\n");
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"large-mb", required_argument, 0, 'L'}, {"small-kb", required_argument, 0, 'S'},
        {"probes", required_argument, 0, 'P'},   {"skip-large", no_argument, 0, 'x'},
        {"repeat", required_argument, 0, 'R'},  {"best", no_argument, 0, 'B'},
        {"track", no_argument, 0, 'T'},         {"blocked-only", no_argument, 0, 'K'},
        {"tracking-cost", required_argument, 0, 'C'},         {"help", no_argument, 0, 'h'},
        {"sweep", required_argument, 0, 'W'},    {"threads", required_argument, 0, 'N'},
        {0, 0, 0, 0}};
    uint64_t large_mb = 1024, small_kb = 1024, probes = 20000000;
    bool skip_large = false;
    uint64_t cost_keys = 0, sweep_keys = 0;
    unsigned threads = 2;
    int c;

    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'L': large_mb = strtoull(optarg, NULL, 10); break;
        case 'S': small_kb = strtoull(optarg, NULL, 10); break;
        case 'P': probes = strtoull(optarg, NULL, 10); break;
        case 'x': skip_large = true; break;
        case 'R': repeat = atoi(optarg); break;
        case 'B': best = true; break;
        case 'T': track = true; break;
        case 'K': blocked_only = true; break;
        case 'C': cost_keys = strtoull(optarg, NULL, 10); break;
        case 'W': sweep_keys = strtoull(optarg, NULL, 10); break;
        case 'N': threads = (unsigned)strtoul(optarg, NULL, 10); break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (!large_mb || !small_kb || !probes || repeat < 1 || repeat > 64) {
        usage(stderr);
        return 2;
    }
    if (!threads || threads > 16) {
        usage(stderr);
        return 2;
    }
    if (cost_keys)
        return tracking_cost(large_mb, cost_keys) < 0;
    if (sweep_keys)
        return sweep_cost(large_mb, sweep_keys, threads) < 0;
    printf("ns/key, one core, 16-byte keys, hashing included; p = 1%%, filled to capacity.\n"
           "add: single / batched, atomic ORs | exclusive writer; q+ present, q- absent.\n");
    if (repeat > 1)
        printf("each time: the %s of %d runs with fresh filters; FPR: their median.\n",
               best ? "lowest" : "median", repeat);
    printf("\n");
    printf("| size    | kind      | add atomic    | add exclusive | q+ single batch | "
           "q- single batch | bits/key | FPR |\n");
    printf("|---|---|---|---|---|---|---|---|\n");

    /* Capacity for a body of the given bytes at ~10.1 bits/key (blocked). */
    uint64_t small_n = small_kb * 1024 * 8 / 10.2;
    int rounds = (int)(probes / small_n) + 1;
    char label[32];
    snprintf(label, sizeof(label), "%lluK", (unsigned long long)small_kb);
    if (bench_ours(label, BF_KIND_BLOCKED, small_n, probes, rounds) < 0 ||
        (!blocked_only &&
         (bench_ours(label, BF_KIND_CLASSIC, small_n, probes, rounds) < 0 ||
          bench_libbloom(label, small_n, probes, rounds) < 0)))
        return 1;
    if (skip_large)
        return 0;
    uint64_t large_n = (uint64_t)((double)large_mb * 1024 * 1024 * 8 / 10.2);
    snprintf(label, sizeof(label), "%lluM", (unsigned long long)large_mb);
    if (bench_ours(label, BF_KIND_BLOCKED, large_n, probes, 1) < 0 ||
        (!blocked_only && bench_ours(label, BF_KIND_CLASSIC, large_n, probes, 1) < 0))
        return 1;
    if (blocked_only)
        return 0;
    /* libbloom's int bit count caps it near 2^31 bits. */
    uint64_t lb_n = (uint64_t)((double)INT_MAX / 9.6);
    snprintf(label, sizeof(label), "%lluM", (unsigned long long)(lb_n * 9.6 / 8 / 1048576));
    if (bench_libbloom(label, lb_n, probes, 1) < 0)
        return 1;
    return 0;
}
