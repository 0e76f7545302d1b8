/* keyscan_bench: what a keyed pull (store_keys_since, a pull that accepts
 * keys' hashes) costs on a node whose log holds a large import of every
 * shard, then live adds: the case of a node of a scale run once the
 * routers' adds start after an offline build was imported.
 *
 * A store with S shards of one filter (BITS MiB of bits in all), each given
 * an import of a filled filter (one record of its bits' size each, all in
 * the log: the log's bound is set above them), then a cursor per shard as
 * a puller takes it (a page pull); then ROUNDS rounds, each adding KEYS
 * keys to every shard (records of 100) and pulling every shard since its
 * cursor with keys accepted, as a merger round does.  Prints, per round,
 * the time of the round's S pulls, how many answered with keys, and the
 * keys; then the median and spread.  No figure is checked.
 *
 * usage: keyscan_bench DIR [BITS_MIB (256)] [SHARDS (32)] [ROUNDS (5)]
 *        [KEYS (2000)]
 * DIR: a new directory (left in place: remove it after).  The store's
 * durability is none (the log is written, not synced), as the scale runs'
 * nodes with durability none; BLOOMGRID_DURABILITY=fsync for fsync.
 *
 * KEYSCAN_CRASH=1: the import and the rounds run in a child process,
 * which checkpoints every shard after round ROUNDS / 2 + 1 and ends
 * without closing the store (a node killed: no final checkpoint, the
 * log's segments left as they are); the store is then opened again (a
 * restart: recovery), and each shard gets a new cursor (a page pull, its
 * epoch new), 8 pulls of other pullers after 100 keys each (the cursor's
 * scan mark falls out of the 8 kept), KEYS keys and a keyed pull since the
 * cursor, which reads the log from the shard's checkpoint on: in the
 * segments the killed run wrote.  Prints what those pulls read of the log
 * (bloomgrid_wal_rescan_bytes_total) and took.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <sys/wait.h>
#include <unistd.h>

#include "bf.h"
#include "log.h"
#include "metrics.h"
#include "rules.h"
#include "store.h"

static double now_s(void)
{
    struct timespec t;

    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static const uint8_t secret[BF_SECRET_LEN] = {7, 7, 7};

static struct bf_params params(uint64_t capacity)
{
    struct bf_params p = {.kind = BF_KIND_BLOCKED, .capacity = capacity,
                          .error_rate = 0.01, .secret = secret};
    bf_params_default(&p);
    return p;
}

/* A key's hashes (splitmix64 of a counter). */
static struct bf_hash hash_of(uint64_t k)
{
    uint64_t z = k * 0x9E3779B97F4A7C15ull + 1;
    struct bf_hash h;

    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    h.h1 = z ^ (z >> 31);
    z = h.h1 * 0x9E3779B97F4A7C15ull + 7;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    h.h2 = z ^ (z >> 31);
    return h;
}

static int count_keys(void *ctx, const struct bf_hash *h, size_t n)
{
    (void)h;
    *(uint64_t *)ctx += n;
    return 0;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return x < y ? -1 : x > y;
}

static uint64_t rescan_bytes(void)
{
    return metric_count(metrics_counter(metrics_registry(),
                                        "bloomgrid_wal_rescan_bytes_total",
                                        "", NULL));
}

/* KEYSCAN_CRASH: the store opened again after the child was killed. */
static int after_crash(const struct store_options *o, unsigned shards,
                       uint64_t keys)
{
    char err[STORE_ERRLEN];
    struct bf_hash h[100];
    uint64_t k = UINT64_C(1) << 40, got = 0, bytes = 0, keyed = 0, pages = 0;
    double t0 = now_s(), took = 0;
    struct store *s = store_open(o, err);

    if (!s) {
        fprintf(stderr, "keyscan_bench: %s\n", err);
        return 1;
    }
    printf("restart after the kill: opened in %.2f s; the log holds %" PRIu64
           " bytes\n", now_s() - t0, store_log_bytes(s));
    for (unsigned i = 0; i < shards; i++) {
        char name[64];
        struct store_pages_mark cur, m;
        snprintf(name, sizeof name, "f.%u", i);
        struct store_filter *sf = store_get(s, name);
        if (!sf || store_pages_since(sf, 0, 0, NULL, NULL, &cur, err) < 0)
            return 1;
        for (int p = 0; p <= 8; p++) {
            uint64_t n = p < 8 ? 100 : keys;
            for (uint64_t j = 0; j < n; j += 100) {
                size_t c = n - j < 100 ? (size_t)(n - j) : 100;
                for (size_t x = 0; x < c; x++)
                    h[x] = hash_of(k++);
                if (store_add_hashes(sf, h, c, NULL, err) < 0)
                    return 1;
            }
            if (p < 8 && store_pages_since(sf, 0, 0, NULL, NULL, &m, err) < 0)
                return 1;
        }
        uint64_t b0 = rescan_bytes();
        double a = now_s();
        int rc = store_keys_since(sf, cur.epoch, cur.version, count_keys,
                                  &got, &m, err);
        took += now_s() - a;
        bytes += rescan_bytes() - b0;
        if (rc == 1) {   /* what the node sends instead: the pages */
            if (store_pages_since(sf, cur.epoch, cur.version, NULL, NULL, &m,
                                  err) < 0)
                return 1;
            pages += m.bytes;
        }
        if (rc < 0)
            return 1;
        keyed += rc == 0;
        store_put(sf);
    }
    printf("after the restart: %u pulls since a cursor with no scan mark "
           "(from the checkpoint): %" PRIu64 " keyed (%" PRIu64 " keys), "
           "%" PRIu64 " bytes of pages for the others; they read %" PRIu64
           " bytes of the log (bloomgrid_wal_rescan_bytes_total) in %.3f s\n",
           shards, keyed, got, pages, bytes, took);
    store_close(s);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0) {
        fprintf(stderr, "usage: keyscan_bench DIR [BITS_MIB (256)] "
                "[SHARDS (32)] [ROUNDS (5)] [KEYS (2000)]\n");
        return argc < 2 ? 2 : 0;
    }
    const char *dir = argv[1];
    uint64_t mib = argc > 2 ? strtoull(argv[2], NULL, 10) : 256;
    unsigned shards = argc > 3 ? (unsigned)atoi(argv[3]) : 32;
    unsigned rounds = argc > 4 ? (unsigned)atoi(argv[4]) : 5;
    uint64_t keys = argc > 5 ? strtoull(argv[5], NULL, 10) : 2000;
    const char *dur = getenv("BLOOMGRID_DURABILITY");
    char err[STORE_ERRLEN];

    if (!mib || !shards || shards > 1024 || !rounds || rounds > 1000) {
        fprintf(stderr, "keyscan_bench: bad arguments\n");
        return 2;
    }
    log_set_level(LOG_LEVEL_WARN);
    /* A blocked filter at 1 % holds about 9.6 bits a key. */
    uint64_t cap = mib * (UINT64_C(1) << 20) * 8 / 96 * 10 / shards;
    struct store_options o = {
        .dir = dir,
        .durability = dur && strcmp(dur, "fsync") == 0 ? STORE_DURABLE_FSYNC
                                                       : STORE_DURABLE_NONE,
        .snapshot_interval_ms = 3600000,
        .snapshot_wal_bytes = mib * (UINT64_C(4) << 20),
        .checkpoint_log_percent = 1000,
    };
    const char *crash = getenv("KEYSCAN_CRASH");
    bool crashing = crash && strcmp(crash, "1") == 0;
    if (crashing) {
        fflush(stdout);
        pid_t pid = fork();
        int st;
        if (pid < 0)
            return 1;
        if (pid > 0)
            return waitpid(pid, &st, 0) != pid || !WIFEXITED(st) ||
                           WEXITSTATUS(st) != 0
                       ? 1 : after_crash(&o, shards, keys);
    }
    struct store *s = store_open(&o, err);
    if (!s) {
        fprintf(stderr, "keyscan_bench: %s\n", err);
        return 1;
    }
    struct store_filter **sf = calloc(shards, sizeof *sf);
    struct store_pages_mark *cur = calloc(shards, sizeof *cur);
    double *took = calloc(rounds, sizeof *took);
    struct bf_hash *h = malloc(100 * sizeof *h);
    if (!sf || !cur || !took || !h)
        return 1;
    struct bf_params p = params(cap);
    uint64_t k = 0, bits = 0;
    double t0 = now_s();
    for (unsigned i = 0; i < shards; i++) {
        char name[64];
        snprintf(name, sizeof name, "f.%u", i);
        if (store_create(s, name, &p, err) < 0 ||
            !(sf[i] = store_get(s, name))) {
            fprintf(stderr, "keyscan_bench: create %s: %s\n", name, err);
            return 1;
        }
        /* The import: a filter filled to half its capacity. */
        struct bf *src = bf_create(&p, NULL);
        if (!src)
            return 1;
        for (uint64_t j = 0; j < cap / 2; j += 100) {
            for (int x = 0; x < 100; x++)
                h[x] = hash_of(k++);
            bf_add_hashes(src, h, 100, NULL);
        }
        bits += bf_bytes(src);
        if (store_import(sf[i], src, err) < 0) {
            fprintf(stderr, "keyscan_bench: import: %s\n", err);
            return 1;
        }
        bf_destroy(src);
        if (store_pages_since(sf[i], 0, 0, NULL, NULL, &cur[i], err) < 0) {
            fprintf(stderr, "keyscan_bench: pull: %s\n", err);
            return 1;
        }
    }
    printf("%u shards of %" PRIu64 " keys' capacity, %" PRIu64 " bytes of "
           "bits, imported in %.1f s; the log holds %" PRIu64 " bytes\n",
           shards, cap, bits, now_s() - t0, store_log_bytes(s));
    for (unsigned r = 0; r < rounds; r++) {
        for (unsigned i = 0; i < shards; i++)
            for (uint64_t j = 0; j < keys; j += 100) {
                size_t n = keys - j < 100 ? (size_t)(keys - j) : 100;
                for (size_t x = 0; x < n; x++)
                    h[x] = hash_of(k++);
                if (store_add_hashes(sf[i], h, n, NULL, err) < 0) {
                    fprintf(stderr, "keyscan_bench: add: %s\n", err);
                    return 1;
                }
            }
        unsigned keyed = 0;
        uint64_t got = 0, pages_bytes = 0;
        double a = now_s();
        for (unsigned i = 0; i < shards; i++) {
            struct store_pages_mark m;
            int rc = store_keys_since(sf[i], cur[i].epoch, cur[i].version,
                                      count_keys, &got, &m, err);
            if (rc == 1) {
                /* What the node sends instead: the pages (counted). */
                rc = store_pages_since(sf[i], cur[i].epoch, cur[i].version,
                                       NULL, NULL, &m, err);
                pages_bytes += m.bytes;
            } else if (rc == 0) {
                keyed++;
            }
            if (rc < 0) {
                fprintf(stderr, "keyscan_bench: pull: %s\n", err);
                return 1;
            }
            cur[i] = m;
        }
        took[r] = now_s() - a;
        if (crashing && r == rounds / 2 && store_snapshot_now(s, err) < 0) {
            fprintf(stderr, "keyscan_bench: checkpoint: %s\n", err);
            return 1;
        }
        printf("round %u: %u pulls in %.3f s (%.2f ms each): %u keyed, %"
               PRIu64 " keys; %" PRIu64 " bytes of pages; log %" PRIu64
               " bytes\n", r + 1, shards, took[r], took[r] * 1e3 / shards,
               keyed, got, pages_bytes, store_log_bytes(s));
        fflush(stdout);
    }
    qsort(took, rounds, sizeof *took, cmp_d);
    printf("round of %u pulls: median %.3f s, min %.3f s, max %.3f s\n",
           shards, took[rounds / 2], took[0], took[rounds - 1]);
    if (crashing) {
        fflush(stdout);
        _exit(0);   /* killed: no final checkpoint */
    }
    for (unsigned i = 0; i < shards; i++)
        store_put(sf[i]);
    store_close(s);
    free(sf);
    free(cur);
    free(took);
    free(h);
    return 0;
}
