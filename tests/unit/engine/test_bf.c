/* Unit tests of the filter engine: hashing, placement, kinds, concurrency,
 * measured false-positive rates, estimates and merging. */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bf.h"
#include "bf_file.h"

static const uint8_t fixed_secret[BF_SECRET_LEN] = {
    0,  1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15,
    16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31};

/* Sanitizer builds run the statistical tests on smaller samples. */
static bool fast_mode(void)
{
    const char *v = getenv("BLOOMGRID_FAST_TESTS");
    return v && *v && strcmp(v, "0") != 0;
}

static struct bf *make(enum bf_kind kind, uint64_t n, double p, const uint8_t *secret)
{
    struct bf_params pr = {.kind = kind, .capacity = n, .error_rate = p, .secret = secret};
    char err[BF_ERRLEN];
    struct bf *f = bf_create(&pr, err);

    ck_assert_msg(f != NULL, "bf_create: %s", err);
    return f;
}

static size_t key_of(char *buf, const char *prefix, uint64_t i)
{
    return (size_t)snprintf(buf, 48, "%s%llu", prefix, (unsigned long long)i);
}

/* ---- the memory of bodies ---- */

#define HUGE ((uintptr_t)2 << 20)

static uint64_t body_bytes_of(const struct bf *f)
{
    struct bf_layer_info li;
    ck_assert_int_eq(bf_layer_info(f, 0, &li), 0);
    return li.body_bytes;
}

/* The VmFlags of the mapping of /proc/self/smaps that holds p. */
static void flags_of(const void *p, char *out, size_t len)
{
    FILE *fp = fopen("/proc/self/smaps", "r");
    char line[512];
    bool in = false;
    out[0] = 0;
    ck_assert_ptr_nonnull(fp);
    while (fgets(line, sizeof line, fp)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' '))
            in = (uintptr_t)p >= lo && (uintptr_t)p < hi;
        else if (in && strncmp(line, "VmFlags:", 8) == 0) {
            snprintf(out, len, "%s", line + 8);
            break;
        }
    }
    fclose(fp);
}

/* Small bodies share 2 MiB chunks advised for huge pages, none crosses a
 * chunk's edge or another body, each keeps its own bits, and the chunks go
 * when their bodies do; a body of 2 MiB or more is a mapping of its own. */
START_TEST(small_bodies_share_huge_page_chunks)
{
    enum { N = 12, KEYS = 2000 };
    size_t c0 = bf_body_chunks();
    bool thp_built = access("/sys/kernel/mm/transparent_hugepage", F_OK) == 0;
    struct bf *f[N];
    char key[48];
    for (int i = 0; i < N; i++)
        f[i] = make(BF_KIND_BLOCKED, 300000, 0.01, NULL);
    uint64_t bytes = body_bytes_of(f[0]);
    ck_assert_uint_lt(bytes, HUGE);
    ck_assert_uint_gt(bytes, HUGE / 8);
    uint64_t units = (bytes + 4095) / 4096, per = 512 / units;
    /* At most as many new chunks as N bodies need packed. */
    ck_assert_uint_le(bf_body_chunks() - c0, (N + per - 1) / per);
    ck_assert_uint_ge(bf_body_chunks(), c0 + 1);
    for (int i = 0; i < N; i++) {
        uintptr_t a = (uintptr_t)bf_layer_body_const(f[i], 0);
        ck_assert_uint_eq(a % 4096, 0);
        ck_assert_msg(a / HUGE == (a + bytes - 1) / HUGE, "body %d crosses a chunk's edge", i);
        for (int j = 0; j < i; j++) {
            uintptr_t b = (uintptr_t)bf_layer_body_const(f[j], 0);
            ck_assert_msg(a + bytes <= b || b + bytes <= a, "bodies %d and %d overlap", i, j);
        }
        /* (A kernel without transparent huge pages takes no such advice.) */
        char fl[512];
        flags_of((const void *)a, fl, sizeof fl);
        ck_assert_msg(strstr(fl, " hg") != NULL || !thp_built, "body %d: no huge page "
                      "advice: %s", i, fl);
    }
    /* Keys in every other filter only: the others stay empty. */
    for (int i = 0; i < N; i += 2)
        for (uint64_t k = 0; k < KEYS; k++)
            bf_add(f[i], key, key_of(key, "m", k));
    for (int i = 0; i < N; i++) {
        struct bf_stats st;
        bf_stats(f[i], &st);
        if (i % 2) {
            ck_assert_uint_eq(st.set, 0);
            continue;
        }
        ck_assert_uint_gt(st.set, 0);
        for (uint64_t k = 0; k < KEYS; k++)
            ck_assert(bf_may_contain(f[i], key, key_of(key, "m", k)));
    }
    for (int i = 0; i < N; i++)
        bf_destroy(f[i]);
    ck_assert_uint_eq(bf_body_chunks(), c0);

    /* A body of 2 MiB or more takes no chunk. */
    struct bf *big = make(BF_KIND_BLOCKED, 4000000, 0.01, NULL);
    ck_assert_uint_ge(body_bytes_of(big), HUGE);
    ck_assert_uint_eq(bf_body_chunks(), c0);
    bf_add(big, "x", 1);
    ck_assert(bf_may_contain(big, "x", 1));
    bf_destroy(big);
}
END_TEST

/* Threads making and freeing small filters at once: each new body reads
 * as zeros (no two filters share units) and keeps its keys, and every
 * chunk is gone at the end. */
struct bodies_run {
    int t;
    int bad;              /* filters made dirty, keys lost, creates failed */
};

static void *bodies_thread(void *arg)
{
    struct bodies_run *r = arg;
    char key[48], prefix[16], err[BF_ERRLEN];
    uint64_t x = 0x9e3779b97f4a7c15ULL * (uint64_t)(r->t + 1);
    for (int it = 0; it < 60; it++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        struct bf_params pr = {.kind = BF_KIND_BLOCKED, .capacity = 1000 + x % 200000,
                               .error_rate = 0.01};
        struct bf *f = bf_create(&pr, err);
        if (!f) {
            r->bad++;
            continue;
        }
        struct bf_stats st;
        bf_stats(f, &st);
        r->bad += st.set != 0;
        snprintf(prefix, sizeof prefix, "t%d.%d.", r->t, it);
        for (uint64_t k = 0; k < 200; k++)
            bf_add(f, key, key_of(key, prefix, k));
        for (uint64_t k = 0; k < 200; k++)
            r->bad += !bf_may_contain(f, key, key_of(key, prefix, k));
        bf_destroy(f);
    }
    return NULL;
}

START_TEST(bodies_made_and_freed_from_many_threads)
{
    enum { T = 4 };
    size_t c0 = bf_body_chunks();
    pthread_t th[T];
    struct bodies_run r[T];
    for (int t = 0; t < T; t++) {
        r[t] = (struct bodies_run){.t = t};
        ck_assert_int_eq(pthread_create(&th[t], NULL, bodies_thread, &r[t]), 0);
    }
    for (int t = 0; t < T; t++) {
        pthread_join(th[t], NULL);
        ck_assert_msg(r[t].bad == 0, "thread %d: %d bad filters or keys", t, r[t].bad);
    }
    ck_assert_uint_eq(bf_body_chunks(), c0);
}
END_TEST

/* A freed body's units, cut again for a new filter while another body
 * keeps their chunk, read as zeros. */
START_TEST(a_body_cut_again_reads_zero)
{
    char key[48];
    struct bf *keep = make(BF_KIND_BLOCKED, 300000, 0.01, NULL);
    struct bf *a = make(BF_KIND_COUNTING, 50000, 0.01, NULL);
    const void *where = bf_layer_body_const(a, 0);
    uint64_t bytes = body_bytes_of(a);
    for (uint64_t k = 0; k < 20000; k++)
        bf_add(a, key, key_of(key, "z", k));
    bf_destroy(a);
    struct bf *b = make(BF_KIND_COUNTING, 50000, 0.01, NULL);
    ck_assert_ptr_eq(bf_layer_body_const(b, 0), where);
    const uint64_t *w = bf_layer_body_const(b, 0);
    for (uint64_t i = 0; i < bytes / 8; i++)
        ck_assert_msg(w[i] == 0, "word %llu of a body cut again is %llx",
                      (unsigned long long)i, (unsigned long long)w[i]);
    bf_destroy(b);
    bf_destroy(keep);
}
END_TEST

START_TEST(hash_known_answers)
{
    struct bf *f = make(BF_KIND_BLOCKED, 1000, 0.01, fixed_secret);
    struct bf_hash h = bf_hash_key(f, "hello", 5);
    struct bf_hash e = bf_hash_key(f, "", 0);

    /* Pinned: a change here silently relocates every key in every file. */
    ck_assert_uint_eq(h.h1, 0x2e21c5aad7f7f42cULL);
    ck_assert_uint_eq(h.h2, 0xdc81c3d78a701285ULL);
    ck_assert_uint_eq(e.h1, 0x43db5bb2756287ebULL);
    ck_assert_uint_eq(e.h2, 0x51ff867e424bb5f5ULL);
    bf_destroy(f);
}
END_TEST

START_TEST(shard_selection_known_answers)
{
    struct bf_hash h = {.h1 = 0xffffffffffffffffULL, .h2 = 0x00000000ffffffffULL};

    /* Only the high 32 bits of h2 choose the shard. */
    ck_assert_uint_eq(bf_hash_shard(h, 64), 0);
    h.h2 = 0x8000000000000000ULL;
    ck_assert_uint_eq(bf_hash_shard(h, 64), 32);
    h.h2 = 0xffffffff00000000ULL;
    ck_assert_uint_eq(bf_hash_shard(h, 64), 63);
    ck_assert_uint_eq(bf_hash_shard(h, 1), 0);
    h.h2 = 0x5555555600000000ULL;
    ck_assert_uint_eq(bf_hash_shard(h, 3), 1);
    h.h2 = 0x5555555500000000ULL;
    ck_assert_uint_eq(bf_hash_shard(h, 3), 0);

    struct bf *f = make(BF_KIND_BLOCKED, 1000, 0.01, fixed_secret);
    ck_assert_uint_eq(bf_hash_shard(bf_hash_key(f, "hello", 5), 64), 55);
    ck_assert_uint_eq(bf_hash_shard(bf_hash_key(f, "slug-42", 7), 64), 60);
    bf_destroy(f);
}
END_TEST

/* Which words of a fresh filter a single key sets, as (index, value) pairs. */
static int set_words(struct bf *f, uint64_t *idx, uint64_t *val, int max)
{
    struct bf_layer_info li;
    const uint64_t *body = bf_layer_body_const(f, 0);
    int n = 0;

    bf_layer_info(f, 0, &li);
    for (uint64_t i = 0; i < li.body_bytes / 8; i++) {
        if (body[i] && n < max) {
            idx[n] = i;
            val[n] = body[i];
            n++;
        }
    }
    return n;
}

START_TEST(placement_known_answers)
{
    static const uint64_t blocked_idx[] = {2848, 2849, 2852, 2853, 2854};
    static const uint64_t blocked_val[] = {0x0000000000000100ULL, 0x0000000400000000ULL,
                                           0x1000010000000000ULL, 0x0000001000000000ULL,
                                           0x0000800000020000ULL};
    static const uint64_t classic_idx[] = {2698, 3369, 4039, 7914, 8585, 13130, 13800};
    static const uint64_t classic_val[] = {
        0x0200000000000000ULL, 0x0000000000010000ULL, 0x0000010000000000ULL,
        0x0000080000000000ULL, 0x0000000000000008ULL, 0x0000000040000000ULL,
        0x0020000000000000ULL};
    uint64_t idx[16], val[16];
    struct bf *f = make(BF_KIND_BLOCKED, 100000, 0.01, fixed_secret);
    struct bf_layer_info li;

    bf_layer_info(f, 0, &li);
    ck_assert_uint_eq(li.m, 1012224);
    ck_assert_uint_eq(li.k, 7);
    bf_add(f, "hello", 5);
    int n = set_words(f, idx, val, 16);
    ck_assert_int_eq(n, 5);
    for (int i = 0; i < n; i++) {
        /* All probes inside one 64-byte block. */
        ck_assert_uint_eq(idx[i] / 8, 2848 / 8);
        ck_assert_uint_eq(idx[i], blocked_idx[i]);
        ck_assert_uint_eq(val[i], blocked_val[i]);
    }
    bf_destroy(f);

    f = make(BF_KIND_CLASSIC, 100000, 0.01, fixed_secret);
    bf_layer_info(f, 0, &li);
    ck_assert_uint_eq(li.m, 958528);
    ck_assert_uint_eq(li.k, 7);
    bf_add(f, "hello", 5);
    n = set_words(f, idx, val, 16);
    ck_assert_int_eq(n, 7);
    for (int i = 0; i < n; i++) {
        ck_assert_uint_eq(idx[i], classic_idx[i]);
        ck_assert_uint_eq(val[i], classic_val[i]);
    }
    bf_destroy(f);
}
END_TEST

/* The AVX-512 query of blocked layers must answer exactly like the portable
 * one, for every k (one and several vector steps, partial last steps), on
 * filters from nearly empty to nearly full. */
START_TEST(vector_probes_match_scalar)
{
    static const uint32_t ks[] = {1, 2, 3, 5, 7, 8, 9, 10, 15, 16, 17, 23, 24, 33, 64};
    enum { N = 20000 };
    static struct bf_hash hs[N];
    static bool scalar[N], vec[N];
    bool had = bf_vector_probes(-1);
    uint64_t seed = 0x1234567;

    if (!bf_vector_probes(1)) {
        /* Switching on must be refused on a CPU without AVX-512. */
        ck_assert(!bf_vector_probes(-1));
        fprintf(stderr, "vector_probes_match_scalar: no AVX-512 here, portable path only\n");
        return;
    }
    for (size_t ki = 0; ki < sizeof(ks) / sizeof(ks[0]); ki++) {
        for (int fill = 0; fill < 3; fill++) {
            struct bf_params p = {.kind = BF_KIND_BLOCKED, .capacity = 1000,
                                  .error_rate = 0.01, .shard_count = 1,
                                  .secret = fixed_secret};
            struct bf_layer_info li = {.capacity = 1000, .error_rate = 0.01,
                                       .m = 64 * 512, .k = ks[ki]};
            char err[BF_ERRLEN];
            struct bf *f = bf_assemble(&p, BF_HASH_XXH3_128, 1, &li, err);
            ck_assert_msg(f != NULL, "bf_assemble: %s", err);
            /* 0, 300 or 3000 keys' worth of bits over 64 blocks. */
            uint64_t adds = fill == 0 ? 0 : fill == 1 ? 300 / ks[ki] + 1 : 3000 / ks[ki] + 1;
            for (int i = 0; i < N; i++) {
                seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
                hs[i].h1 = seed;
                seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
                hs[i].h2 = seed ^ (seed >> 29);
            }
            for (uint64_t i = 0; i < adds; i++)
                bf_add_hash(f, hs[i % N]);
            bf_vector_probes(0);
            bf_may_contain_hashes(f, hs, N, scalar);
            bf_vector_probes(1);
            bf_may_contain_hashes(f, hs, N, vec);
            int yes = 0;
            for (int i = 0; i < N; i++) {
                ck_assert_msg(scalar[i] == vec[i], "k=%u fill=%d hash %d: scalar %d, vector %d",
                              ks[ki], fill, i, scalar[i], vec[i]);
                ck_assert(bf_may_contain_hash(f, hs[i]) == scalar[i]);
                yes += scalar[i];
            }
            /* Every added hash answers yes; the empty filter answers no. */
            ck_assert_int_ge(yes, (int)(adds < N ? adds : N));
            if (fill == 0)
                ck_assert_int_eq(yes, 0);
            bf_destroy(f);
        }
    }
    bf_vector_probes(had);
}
END_TEST

/* The AVX-512 add sets exactly the bits the portable add sets and reports
 * the same "was new" answers, for every k, in both writer modes, through
 * every add entry point, re-adds included. */
static struct bf *assemble_blocked(uint32_t k)
{
    struct bf_params p = {.kind = BF_KIND_BLOCKED, .capacity = 1000, .error_rate = 0.01,
                          .shard_count = 1, .secret = fixed_secret};
    struct bf_layer_info li = {.capacity = 1000, .error_rate = 0.01, .m = 64 * 512, .k = k};
    char err[BF_ERRLEN];
    struct bf *f = bf_assemble(&p, BF_HASH_XXH3_128, 1, &li, err);

    ck_assert_msg(f != NULL, "bf_assemble: %s", err);
    return f;
}

/* Adds hs[0..n) through entry point `how` (0 single, 1 hashes, 2 keys). */
static void add_via(struct bf *f, int how, const struct bf_hash *hs, const uint64_t *keys,
                    size_t n, bool *out)
{
    if (how == 0) {
        for (size_t i = 0; i < n; i++)
            out[i] = bf_add_hash(f, hs[i]);
    } else if (how == 1) {
        bf_add_hashes(f, hs, n, out);
    } else {
        static const void *ptr[4096];
        static size_t len[4096];
        for (size_t i = 0; i < n; i++) {
            ptr[i] = &keys[i];
            len[i] = sizeof(keys[i]);
        }
        bf_add_keys(f, ptr, len, n, out);
    }
}

START_TEST(vector_adds_match_scalar)
{
    static const uint32_t ks[] = {1, 2, 3, 5, 7, 8, 9, 10, 15, 16, 17, 23, 33, 64};
    enum { N = 4096 };
    static struct bf_hash hs[N];
    static uint64_t keys[N];
    static bool a_out[N], b_out[N];
    bool had = bf_vector_probes(-1);
    uint64_t seed = 0x9abcdef;

    if (!bf_vector_probes(1)) {
        fprintf(stderr, "vector_adds_match_scalar: no AVX-512 here, portable path only\n");
        return;
    }
    for (size_t ki = 0; ki < sizeof(ks) / sizeof(ks[0]); ki++) {
        for (int mode = 0; mode < 2; mode++) {
            for (int how = 0; how < 3; how++) {
                struct bf *a = assemble_blocked(ks[ki]), *b = assemble_blocked(ks[ki]);
                bf_set_exclusive(a, mode);
                bf_set_exclusive(b, mode);
                /* Three rounds over 64 blocks: the last repeats the first
                 * round's keys, so re-adds are covered. */
                for (int round = 0; round < 3; round++) {
                    uint64_t s = round == 2 ? 0x9abcdef : seed;
                    for (int i = 0; i < N; i++) {
                        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
                        keys[i] = s;
                    }
                    if (round < 2)
                        seed = s;
                    for (int i = 0; i < N; i++)
                        hs[i] = bf_hash_key(a, &keys[i], sizeof(keys[i]));
                    size_t n = (size_t)(100 + round * 700) / ks[ki] + 1;
                    bf_vector_probes(0);
                    add_via(a, how, hs, keys, n, a_out);
                    bf_vector_probes(1);
                    add_via(b, how, hs, keys, n, b_out);
                    for (size_t i = 0; i < n; i++)
                        ck_assert_msg(a_out[i] == b_out[i],
                                      "k=%u %s how=%d round %d add %zu: portable %d, vector %d",
                                      ks[ki], mode ? "exclusive" : "atomic", how, round, i,
                                      a_out[i], b_out[i]);
                    ck_assert_msg(memcmp(bf_layer_body_const(a, 0), bf_layer_body_const(b, 0),
                                         64 * 64) == 0,
                                  "k=%u %s how=%d round %d: the bodies differ", ks[ki],
                                  mode ? "exclusive" : "atomic", how, round);
                    ck_assert_uint_eq(bf_insert_count(a), bf_insert_count(b));
                }
                bf_destroy(a);
                bf_destroy(b);
            }
        }
    }
    bf_vector_probes(had);
}
END_TEST

/* bf_may_contain takes a separate path for keys over 16 bytes (and XXH3
 * has its own for 0, 1-3, 4-8, 9-16, 17-128, 129-240 and longer): every
 * length answers as the hash-based query does, with and without AVX-512. */
START_TEST(single_query_every_key_length)
{
    static unsigned char buf[400];
    bool had = bf_vector_probes(-1);
    struct bf *f = make(BF_KIND_BLOCKED, 2000, 0.01, fixed_secret);

    for (size_t i = 0; i < sizeof(buf); i++)
        buf[i] = (unsigned char)(i * 131 + 7);
    /* Keys are prefixes of buf; the even lengths are added. */
    for (size_t len = 0; len <= 300; len += 2)
        bf_add(f, buf, len);
    for (int vec = 0; vec < 2; vec++) {
        bf_vector_probes(vec);
        for (size_t len = 0; len <= 300; len++) {
            bool want = bf_may_contain_hash(f, bf_hash_key(f, buf, len));
            ck_assert_msg(bf_may_contain(f, buf, len) == want, "length %zu, vector %d", len,
                          vec);
            if (len % 2 == 0)
                ck_assert_msg(want, "length %zu added but not found", len);
        }
    }
    bf_vector_probes(had);
    bf_destroy(f);
}
END_TEST

static void check_no_false_negatives(enum bf_kind kind)
{
    uint64_t n = fast_mode() ? 100000 : 1000000;
    struct bf *f = make(kind, n, 0.01, NULL);
    uint64_t *keys = malloc(n * sizeof(*keys));
    FILE *ur = fopen("/dev/urandom", "rb");

    ck_assert_ptr_nonnull(ur);
    ck_assert_uint_eq(fread(keys, sizeof(*keys), n, ur), n);
    fclose(ur);
    for (uint64_t i = 0; i < n; i++)
        bf_add(f, &keys[i], sizeof(keys[i]));
    for (uint64_t i = 0; i < n; i++)
        ck_assert_msg(bf_may_contain(f, &keys[i], sizeof(keys[i])),
                      "%s: key %llu lost", bf_kind_name(kind), (unsigned long long)i);
    free(keys);
    bf_destroy(f);
}

START_TEST(no_false_negatives_blocked) { check_no_false_negatives(BF_KIND_BLOCKED); }
END_TEST
START_TEST(no_false_negatives_classic) { check_no_false_negatives(BF_KIND_CLASSIC); }
END_TEST
START_TEST(no_false_negatives_counting) { check_no_false_negatives(BF_KIND_COUNTING); }
END_TEST
START_TEST(no_false_negatives_scalable) { check_no_false_negatives(BF_KIND_SCALABLE); }
END_TEST

struct conc {
    struct bf *f;
    int id;
    uint64_t n;
    uint64_t published;   /* keys [0, published) of each writer are acknowledged */
    struct conc *writers;
    int nwriters;
    uint64_t misses;
};

static void *writer_main(void *arg)
{
    struct conc *c = arg;
    char key[48];

    for (uint64_t i = 0; i < c->n; i++) {
        size_t len = (size_t)snprintf(key, sizeof(key), "w%d-%llu", c->id, (unsigned long long)i);
        bf_add(c->f, key, len);
        __atomic_store_n(&c->published, i + 1, __ATOMIC_RELEASE);
    }
    return NULL;
}

static void *reader_main(void *arg)
{
    struct conc *c = arg;
    char key[48];
    bool done = false;

    while (!done) {
        done = true;
        for (int w = 0; w < c->nwriters; w++) {
            uint64_t upto = __atomic_load_n(&c->writers[w].published, __ATOMIC_ACQUIRE);
            if (upto < c->writers[w].n)
                done = false;
            /* Check a sliding window of the newest acknowledged keys. */
            for (uint64_t i = upto > 2000 ? upto - 2000 : 0; i < upto; i++) {
                size_t len = (size_t)snprintf(key, sizeof(key), "w%d-%llu", w,
                                              (unsigned long long)i);
                if (!bf_may_contain(c->f, key, len))
                    c->misses++;
            }
        }
    }
    return NULL;
}

static void check_concurrent(enum bf_kind kind)
{
    uint64_t n = fast_mode() ? 50000 : 400000;
    struct bf *f = make(kind, 2 * n, 0.01, NULL);
    struct conc w[2], r[2];
    pthread_t tw[2], tr[2];

    for (int i = 0; i < 2; i++)
        w[i] = (struct conc){.f = f, .id = i, .n = n};
    for (int i = 0; i < 2; i++) {
        r[i] = (struct conc){.f = f, .writers = w, .nwriters = 2};
        pthread_create(&tr[i], NULL, reader_main, &r[i]);
    }
    for (int i = 0; i < 2; i++)
        pthread_create(&tw[i], NULL, writer_main, &w[i]);
    for (int i = 0; i < 2; i++) {
        pthread_join(tw[i], NULL);
        pthread_join(tr[i], NULL);
    }
    ck_assert_uint_eq(r[0].misses + r[1].misses, 0);
    ck_assert_uint_eq(bf_keys_added(f), 2 * n);   /* every add counted, concurrently */
    char key[48];
    for (int id = 0; id < 2; id++)
        for (uint64_t i = 0; i < n; i++) {
            size_t len = (size_t)snprintf(key, sizeof(key), "w%d-%llu", id, (unsigned long long)i);
            ck_assert(bf_may_contain(f, key, len));
        }
    bf_destroy(f);
}

START_TEST(concurrent_adds_and_queries_blocked) { check_concurrent(BF_KIND_BLOCKED); }
END_TEST
START_TEST(concurrent_adds_and_queries_counting) { check_concurrent(BF_KIND_COUNTING); }
END_TEST
START_TEST(concurrent_adds_and_queries_scalable) { check_concurrent(BF_KIND_SCALABLE); }
END_TEST

/* Add n keys, probe `probes` absent keys; returns the measured FPR. */
static double measure_fpr(struct bf *f, uint64_t n, uint64_t probes)
{
    char key[48];
    uint64_t fp = 0;

    for (uint64_t i = 0; i < n; i++)
        bf_add(f, key, key_of(key, "present-", i));
    for (uint64_t i = 0; i < probes; i++)
        fp += bf_may_contain(f, key, key_of(key, "absent-", i));
    return (double)fp / (double)probes;
}

static void check_blocked_fpr(double p)
{
    uint64_t n = fast_mode() ? 200000 : 1000000;
    uint64_t probes = fast_mode() ? 2000000 : 10000000;
    struct bf *f = make(BF_KIND_BLOCKED, n, p, NULL);
    double fpr = measure_fpr(f, n, probes);
    struct bf_stats st;

    bf_stats(f, &st);
    ck_assert_msg(fpr <= 1.1 * p, "blocked p=%g measured %g", p, fpr);
    /* And not absurdly oversized: within a factor 2 below the target. */
    ck_assert_msg(fpr >= 0.5 * p, "blocked p=%g measured %g (oversized?)", p, fpr);
    if (p == 0.01)
        ck_assert_msg(st.bits_per_key <= 10.5, "bits/key %g", st.bits_per_key);
    bf_destroy(f);
}

START_TEST(blocked_fpr_at_capacity_1pct) { check_blocked_fpr(0.01); }
END_TEST
START_TEST(blocked_fpr_at_capacity_01pct) { check_blocked_fpr(0.001); }
END_TEST

static void check_classic_fpr(double p)
{
    uint64_t n = fast_mode() ? 200000 : 1000000;
    uint64_t probes = fast_mode() ? 2000000 : 10000000;
    struct bf *f = make(BF_KIND_CLASSIC, n, p, NULL);
    struct bf_layer_info li;

    bf_layer_info(f, 0, &li);
    double fpr = measure_fpr(f, n, probes);
    double model = pow(1.0 - exp(-(double)li.k * (double)n / (double)li.m), li.k);
    ck_assert_msg(fabs(fpr - model) <= 0.1 * model, "classic p=%g measured %g model %g", p,
                  fpr, model);
    bf_destroy(f);
}

START_TEST(classic_fpr_matches_textbook_1pct) { check_classic_fpr(0.01); }
END_TEST
START_TEST(classic_fpr_matches_textbook_01pct) { check_classic_fpr(0.001); }
END_TEST

static void check_scalable_fpr(double p)
{
    uint64_t n0 = fast_mode() ? 2000 : 10000;
    uint64_t probes = fast_mode() ? 2000000 : 10000000;
    struct bf *f = make(BF_KIND_SCALABLE, n0, p, NULL);
    double fpr = measure_fpr(f, 100 * n0, probes);

    ck_assert_uint_gt(bf_layer_count(f), 5);
    /* The layers' targets sum to p (1 - r^L), a hair under p, so the
     * compound rate sits at the target: the bound is p plus five standard
     * errors of the measurement, not p itself. */
    double bound = p + 5.0 * sqrt(p / (double)probes);
    ck_assert_msg(fpr <= bound, "scalable p=%g after 100x: measured %g (bound %g)", p, fpr,
                  bound);
    bf_destroy(f);
}

START_TEST(scalable_fpr_after_100x_1pct) { check_scalable_fpr(0.01); }
END_TEST
START_TEST(scalable_fpr_after_100x_01pct) { check_scalable_fpr(0.001); }
END_TEST

START_TEST(add_reports_new_keys)
{
    enum bf_kind kinds[] = {BF_KIND_BLOCKED, BF_KIND_CLASSIC, BF_KIND_COUNTING,
                            BF_KIND_SCALABLE};
    for (size_t i = 0; i < 4; i++) {
        struct bf *f = make(kinds[i], 1000, 0.01, NULL);
        ck_assert(bf_add(f, "slug", 4));
        ck_assert(!bf_add(f, "slug", 4));
        ck_assert(bf_may_contain(f, "slug", 4));
        ck_assert_uint_eq(bf_insert_count(f), 1);
        bf_destroy(f);
    }
}
END_TEST

/* Keys added count every add, through every entry point and in both
 * writer modes: a repeat ("a, b, a") and a key whose bits were already set
 * (a filter far past its capacity) count, though they set no bit; inserts
 * count only the adds that did. */
START_TEST(keys_added_counts_every_add)
{
    enum bf_kind kinds[] = {BF_KIND_BLOCKED, BF_KIND_CLASSIC, BF_KIND_COUNTING,
                            BF_KIND_SCALABLE};
    enum { N = 3000 };
    static char store[N][24];
    const void *keys[N];
    size_t lens[N];
    struct bf_hash hs[N];

    for (int i = 0; i < N; i++) {
        lens[i] = (size_t)snprintf(store[i], sizeof(store[i]), "many-%d", i);
        keys[i] = store[i];
    }
    for (size_t k = 0; k < 4; k++)
        for (int how = 0; how < 6; how++) {
            struct bf *f = make(kinds[k], 100, 0.2, fixed_secret);
            const void *aba[3] = {"a", "b", "a"};
            size_t aba_len[3] = {1, 1, 1};
            bf_set_exclusive(f, how >= 3);
            ck_assert_uint_eq(bf_keys_added(f), 0);
            if (how % 3 == 0) {
                for (int i = 0; i < 3; i++)
                    bf_add(f, aba[i], 1);
                for (int i = 0; i < N; i++)
                    bf_add(f, keys[i], lens[i]);
            } else if (how % 3 == 1) {
                bf_add_keys(f, aba, aba_len, 3, NULL);
                bf_add_keys(f, keys, lens, N, NULL);
            } else {
                for (int i = 0; i < 3; i++)
                    hs[i] = bf_hash_key(f, aba[i], 1);
                bf_add_hashes(f, hs, 3, NULL);
                for (int i = 0; i < N; i++)
                    hs[i] = bf_hash_key(f, keys[i], lens[i]);
                bf_add_hashes(f, hs, N, NULL);
            }
            ck_assert_msg(bf_keys_added(f) == N + 3, "%s, entry %d: %llu keys added",
                          bf_kind_name(kinds[k]), how, (unsigned long long)bf_keys_added(f));
            ck_assert_msg(bf_insert_count(f) < N + 2, "%s, entry %d: %llu inserts of %d "
                          "unique keys past capacity: no false positive",
                          bf_kind_name(kinds[k]), how,
                          (unsigned long long)bf_insert_count(f), N + 2);
            if (kinds[k] == BF_KIND_COUNTING) {
                ck_assert_int_eq(bf_remove(f, "b", 1), 0);
                ck_assert_uint_eq(bf_keys_added(f), N + 3);   /* removes do not lower it */
            }
            bf_destroy(f);
        }
}
END_TEST

START_TEST(batched_forms_match_single)
{
    enum bf_kind kinds[] = {BF_KIND_BLOCKED, BF_KIND_CLASSIC, BF_KIND_COUNTING,
                            BF_KIND_SCALABLE};
    enum { N = 5000 };
    static char store[N][24];
    const void *keys[N];
    size_t lens[N];
    bool out[N], out2[N];
    struct bf_hash hs[N];

    for (int i = 0; i < N; i++) {
        lens[i] = (size_t)snprintf(store[i], sizeof(store[i]), "batch-%d", i);
        keys[i] = store[i];
    }
    for (size_t k = 0; k < 4; k++) {
        struct bf *a = make(kinds[k], N, 0.01, fixed_secret);
        struct bf *b = make(kinds[k], N, 0.01, fixed_secret);
        bf_add_keys(a, keys, lens, N / 2, out);
        for (int i = 0; i < N / 2; i++) {
            ck_assert(out[i] == bf_add(b, keys[i], lens[i]) || kinds[k] == BF_KIND_SCALABLE);
            hs[i] = bf_hash_key(a, keys[i], lens[i]);
        }
        bf_may_contain_keys(a, keys, lens, N, out);
        for (int i = N / 2; i < N; i++)
            hs[i] = bf_hash_key(a, keys[i], lens[i]);
        bf_may_contain_hashes(b, hs, N, out2);
        for (int i = 0; i < N; i++) {
            ck_assert(out[i] == out2[i]);
            if (i < N / 2)
                ck_assert(out[i]);
        }
        bf_add_hashes(b, hs + N / 2, N / 2, NULL);
        bf_may_contain_hashes(b, hs, N, out2);
        for (int i = 0; i < N; i++)
            ck_assert(out2[i]);
        bf_destroy(a);
        bf_destroy(b);
    }
}
END_TEST

START_TEST(counting_remove)
{
    struct bf *f = make(BF_KIND_COUNTING, 10000, 0.01, NULL);
    char key[48];

    ck_assert_int_eq(bf_remove(f, "ghost", 5), -ENOENT);
    bf_add(f, "slug", 4);
    bf_add(f, "slug", 4);
    ck_assert_int_eq(bf_remove(f, "slug", 4), 0);
    ck_assert(bf_may_contain(f, "slug", 4));
    ck_assert_int_eq(bf_remove(f, "slug", 4), 0);
    ck_assert(!bf_may_contain(f, "slug", 4));
    /* Removing some keys never loses the others. */
    for (int i = 0; i < 5000; i++)
        bf_add(f, key, key_of(key, "k", (uint64_t)i));
    for (int i = 0; i < 5000; i += 2)
        ck_assert_int_eq(bf_remove(f, key, key_of(key, "k", (uint64_t)i)), 0);
    for (int i = 1; i < 5000; i += 2)
        ck_assert(bf_may_contain(f, key, key_of(key, "k", (uint64_t)i)));
    bf_destroy(f);

    f = make(BF_KIND_BLOCKED, 1000, 0.01, NULL);
    bf_add(f, "slug", 4);
    ck_assert_int_eq(bf_remove(f, "slug", 4), -EOPNOTSUPP);
    ck_assert(bf_may_contain(f, "slug", 4));
    bf_destroy(f);
}
END_TEST

START_TEST(counting_saturated_counter_never_decrements)
{
    struct bf *f = make(BF_KIND_COUNTING, 100, 0.01, NULL);

    for (int i = 0; i < 40; i++)
        bf_add(f, "hot", 3);
    /* 40 adds saturate every counter at 15; 40 removes cannot empty them. */
    for (int i = 0; i < 40; i++)
        bf_remove(f, "hot", 3);
    ck_assert(bf_may_contain(f, "hot", 3));
    bf_destroy(f);
}
END_TEST

START_TEST(estimates_track_count)
{
    enum bf_kind kinds[] = {BF_KIND_BLOCKED, BF_KIND_CLASSIC, BF_KIND_COUNTING};
    char key[48];

    for (size_t k = 0; k < 3; k++) {
        struct bf *f = make(kinds[k], 100000, 0.01, NULL);
        struct bf_stats st;
        bf_stats(f, &st);
        ck_assert_uint_eq(st.set, 0);
        ck_assert(!st.over_capacity);
        for (uint64_t i = 0; i < 50000; i++)
            bf_add(f, key, key_of(key, "e", i));
        bf_stats(f, &st);
        ck_assert_msg(fabs(st.estimated_count - 50000) < 0.03 * 50000, "%s n^=%g",
                      bf_kind_name(kinds[k]), st.estimated_count);
        ck_assert(st.fill_ratio > 0.2 && st.fill_ratio < 0.6);
        ck_assert(st.estimated_fpr < 0.01);
        ck_assert(!st.over_capacity);
        for (uint64_t i = 50000; i < 250000; i++)
            bf_add(f, key, key_of(key, "e", i));
        bf_stats(f, &st);
        ck_assert(st.over_capacity);
        ck_assert(st.estimated_fpr > 0.01);
        bf_destroy(f);
    }
}
END_TEST

static void fill_range(struct bf *f, const char *prefix, uint64_t from, uint64_t to)
{
    char key[48];

    for (uint64_t i = from; i < to; i++)
        bf_add(f, key, key_of(key, prefix, i));
}

static bool same_bits(struct bf *a, struct bf *b)
{
    if (bf_layer_count(a) != bf_layer_count(b))
        return false;
    for (uint32_t i = 0; i < bf_layer_count(a); i++) {
        struct bf_layer_info la, lb;
        bf_layer_info(a, i, &la);
        bf_layer_info(b, i, &lb);
        if (la.body_bytes != lb.body_bytes ||
            memcmp(bf_layer_body_const(a, i), bf_layer_body_const(b, i), la.body_bytes))
            return false;
    }
    return true;
}

START_TEST(merge_equals_union_bit_for_bit)
{
    enum bf_kind kinds[] = {BF_KIND_BLOCKED, BF_KIND_CLASSIC, BF_KIND_COUNTING};
    char err[BF_ERRLEN];

    for (size_t k = 0; k < 3; k++) {
        struct bf *a = make(kinds[k], 100000, 0.01, NULL);
        struct bf *b = bf_create_like(a, err);
        struct bf *u = bf_create_like(a, err);
        ck_assert_ptr_nonnull(b);
        ck_assert_ptr_nonnull(u);
        fill_range(a, "x", 0, 30000);
        fill_range(b, "x", 20000, 60000);
        fill_range(u, "x", 0, 60000);
        if (kinds[k] == BF_KIND_COUNTING) {
            /* Counters add: the union of multisets, so build u the same way. */
            bf_destroy(u);
            u = bf_create_like(a, err);
            fill_range(u, "x", 0, 30000);
            fill_range(u, "x", 20000, 60000);
        }
        struct bf_merge_projection pj;
        ck_assert_int_eq(bf_merge_project(a, b, &pj, err), 0);
        ck_assert_int_eq(bf_merge_from(a, b, err), 0);
        ck_assert_msg(same_bits(a, u), "%s merge differs from union", bf_kind_name(kinds[k]));
        struct bf_stats st;
        bf_stats(a, &st);
        ck_assert(fabs(st.fill_ratio - pj.fill_ratio) < 1e-12);
        ck_assert(fabs(st.estimated_fpr - pj.estimated_fpr) < 1e-9);
        /* OR is idempotent: merging again changes nothing (counters add). */
        if (kinds[k] != BF_KIND_COUNTING) {
            ck_assert_int_eq(bf_merge_from(a, b, err), 0);
            ck_assert(same_bits(a, u));
        }
        bf_destroy(a);
        bf_destroy(b);
        bf_destroy(u);
    }
}
END_TEST

/* A merge adds the source's keys added (and inserts); a filter with an
 * uncounted past (a version-1 file) makes the merge uncounted, and adds
 * leave it so. */
START_TEST(merge_adds_keys_added)
{
    char err[BF_ERRLEN];
    struct bf *a = make(BF_KIND_BLOCKED, 1000, 0.01, NULL);
    struct bf *b = bf_create_like(a, err), *old = bf_create_like(a, err);

    ck_assert_ptr_nonnull(b);
    ck_assert_ptr_nonnull(old);
    fill_range(a, "k", 0, 3);
    fill_range(b, "k", 1, 6);                    /* two keys in both */
    ck_assert_int_eq(bf_merge_from(a, b, err), 0);
    ck_assert_uint_eq(bf_keys_added(a), 8);
    ck_assert_uint_eq(bf_insert_count(a), 8);   /* each was new where added */
    ck_assert_uint_eq(bf_keys_added(b), 5);
    fill_range(a, "k", 0, 2);
    ck_assert_uint_eq(bf_keys_added(a), 10);
    ck_assert_uint_eq(bf_insert_count(a), 8);

    /* A count near the top saturates below "uncounted". */
    struct bf *big = bf_create_like(a, err);
    ck_assert_ptr_nonnull(big);
    bf_set_counts(big, 0, BF_KEYS_UNCOUNTED - 2, NULL);
    ck_assert_int_eq(bf_merge_from(big, b, err), 0);
    ck_assert_uint_eq(bf_keys_added(big), BF_KEYS_UNCOUNTED - 1);
    ck_assert_int_eq(bf_merge_from(big, b, err), 0);
    ck_assert_uint_eq(bf_keys_added(big), BF_KEYS_UNCOUNTED - 1);
    bf_destroy(big);

    bf_set_counts(old, 7, BF_KEYS_UNCOUNTED, NULL);
    ck_assert_uint_eq(bf_keys_added(old), BF_KEYS_UNCOUNTED);
    ck_assert_int_eq(bf_merge_from(a, old, err), 0);
    ck_assert_uint_eq(bf_keys_added(a), BF_KEYS_UNCOUNTED);
    ck_assert_uint_eq(bf_insert_count(a), 15);
    fill_range(a, "new", 0, 10);
    ck_assert_uint_eq(bf_keys_added(a), BF_KEYS_UNCOUNTED);
    bf_set_exclusive(a, true);
    fill_range(a, "newer", 0, 10);
    ck_assert_uint_eq(bf_keys_added(a), BF_KEYS_UNCOUNTED);
    /* ... and into a counted one, the same. */
    ck_assert_int_eq(bf_merge_from(b, a, err), 0);
    ck_assert_uint_eq(bf_keys_added(b), BF_KEYS_UNCOUNTED);
    bf_destroy(a);
    bf_destroy(b);
    bf_destroy(old);
}
END_TEST

START_TEST(merge_scalable_appends_layers)
{
    char err[BF_ERRLEN];
    struct bf *a = make(BF_KIND_SCALABLE, 1000, 0.01, NULL);
    struct bf *b = bf_create_like(a, err);

    fill_range(a, "a", 0, 500);
    fill_range(b, "b", 0, 10000);
    ck_assert_uint_eq(bf_layer_count(a), 1);
    ck_assert_uint_gt(bf_layer_count(b), 1);
    ck_assert_int_eq(bf_merge_from(a, b, err), 0);
    ck_assert_uint_eq(bf_layer_count(a), bf_layer_count(b));
    char key[48];
    for (uint64_t i = 0; i < 500; i++)
        ck_assert(bf_may_contain(a, key, key_of(key, "a", i)));
    for (uint64_t i = 0; i < 10000; i++)
        ck_assert(bf_may_contain(a, key, key_of(key, "b", i)));
    bf_destroy(a);
    bf_destroy(b);
}
END_TEST

static void expect_refused(struct bf *a, struct bf *b, const char *field)
{
    char err[BF_ERRLEN] = "";
    struct bf_merge_projection pj;
    struct bf_layer_info li;

    bf_layer_info(a, 0, &li);
    uint64_t *copy = malloc(li.body_bytes);
    memcpy(copy, bf_layer_body_const(a, 0), li.body_bytes);
    ck_assert_str_eq(bf_mismatch(a, b), field);
    ck_assert_int_eq(bf_merge_from(a, b, err), -EINVAL);
    ck_assert_msg(strstr(err, field) != NULL, "message '%s' lacks '%s'", err, field);
    ck_assert_int_eq(bf_merge_project(a, b, &pj, err), -EINVAL);
    ck_assert(memcmp(copy, bf_layer_body_const(a, 0), li.body_bytes) == 0);
    free(copy);
}

START_TEST(merge_refuses_every_mismatch)
{
    struct bf *a = make(BF_KIND_BLOCKED, 10000, 0.01, fixed_secret);
    uint8_t other_secret[BF_SECRET_LEN] = {9};
    struct bf_params p = {.kind = BF_KIND_BLOCKED, .capacity = 10000, .error_rate = 0.01,
                          .secret = fixed_secret, .shard_count = 1};
    struct bf_layer_info li;
    char err[BF_ERRLEN];

    fill_range(a, "m", 0, 100);
    struct bf *b = make(BF_KIND_CLASSIC, 10000, 0.01, fixed_secret);
    expect_refused(a, b, "kind");
    bf_destroy(b);

    b = make(BF_KIND_BLOCKED, 10000, 0.01, other_secret);
    expect_refused(a, b, "secret");
    bf_destroy(b);

    b = make(BF_KIND_BLOCKED, 20000, 0.01, fixed_secret);
    expect_refused(a, b, "bits");
    bf_destroy(b);

    bf_layer_info(a, 0, &li);
    li.k += 1;
    li.count = 0;
    b = bf_assemble(&p, BF_HASH_XXH3_128, 1, &li, err);
    ck_assert_ptr_nonnull(b);
    expect_refused(a, b, "hashes");
    bf_destroy(b);

    p.shard_count = 4;
    p.shard_index = 0;
    b = bf_create(&p, err);
    expect_refused(a, b, "shard_count");
    bf_destroy(b);

    struct bf *s0 = bf_create(&p, err);
    p.shard_index = 1;
    b = bf_create(&p, err);
    expect_refused(s0, b, "shard_index");
    bf_destroy(b);
    bf_destroy(s0);

    struct bf_params sp = {.kind = BF_KIND_SCALABLE, .capacity = 1000, .error_rate = 0.01,
                           .secret = fixed_secret, .growth = 2};
    struct bf *x = bf_create(&sp, err);
    sp.growth = 4;
    b = bf_create(&sp, err);
    expect_refused(x, b, "growth");
    bf_destroy(b);
    bf_destroy(x);
    bf_destroy(a);
}
END_TEST

START_TEST(params_are_checked)
{
    char err[BF_ERRLEN];
    struct bf_params p = {.kind = BF_KIND_BLOCKED, .capacity = 0, .error_rate = 0.01};

    ck_assert_ptr_null(bf_create(&p, err));
    ck_assert(strstr(err, "capacity") != NULL);
    p.capacity = 10;
    double bad[] = {0.0, 1.0, -0.5, 2.0, NAN};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        p.error_rate = bad[i];
        ck_assert_ptr_null(bf_create(&p, err));
        ck_assert(strstr(err, "error rate") != NULL);
    }
    p.error_rate = 0.01;
    p.kind = (enum bf_kind)9;
    ck_assert_ptr_null(bf_create(&p, err));
    ck_assert(strstr(err, "kind") != NULL);
    p.kind = BF_KIND_BLOCKED;
    p.shard_count = 4;
    p.shard_index = 4;
    ck_assert_ptr_null(bf_create(&p, err));
    ck_assert(strstr(err, "shard") != NULL);

    enum bf_kind k;
    ck_assert_int_eq(bf_kind_parse("counting", &k), 0);
    ck_assert_int_eq(k, BF_KIND_COUNTING);
    ck_assert_int_eq(bf_kind_parse("cuckoo", &k), -EINVAL);
}
END_TEST

START_TEST(like_shares_fingerprint)
{
    char err[BF_ERRLEN], id1[17], id2[17], id3[17];
    struct bf *a = make(BF_KIND_COUNTING, 5000, 0.02, NULL);
    struct bf *b = bf_create_like(a, err);
    struct bf *c = make(BF_KIND_COUNTING, 5000, 0.02, NULL);

    ck_assert_ptr_null(bf_mismatch(a, b));
    bf_fingerprint_id(a, id1);
    bf_fingerprint_id(b, id2);
    bf_fingerprint_id(c, id3);
    ck_assert_str_eq(id1, id2);
    ck_assert_str_ne(id1, id3);
    ck_assert(memcmp(bf_secret(a), bf_secret(b), BF_SECRET_LEN) == 0);
    bf_destroy(a);
    bf_destroy(b);
    bf_destroy(c);
}
END_TEST

/* Sampled stats: equal to the full scan for a layer within the sample,
 * and within many standard errors of it for a large one (64 Ki words of
 * 12 MB: the fill's standard error is about 2.5e-4, the bound 5e-3). */
START_TEST(sampled_stats_track_the_scan)
{
    static const enum bf_kind kinds[] = {BF_KIND_BLOCKED, BF_KIND_CLASSIC,
                                         BF_KIND_COUNTING};
    uint64_t n = fast_mode() ? 1000000 : 10000000;
    for (size_t ki = 0; ki < sizeof kinds / sizeof kinds[0]; ki++) {
        struct bf *f = make(kinds[ki], n, 0.01, NULL);
        char key[48];
        for (uint64_t i = 0; i < n / 2; i++)
            bf_add(f, key, key_of(key, "s", i));
        struct bf_stats full, part, whole;
        bf_stats(f, &full);
        bf_stats_sampled(f, UINT64_MAX, 7, &whole);
        ck_assert_uint_eq(whole.set, full.set);
        for (uint64_t seed = 0; seed < 3; seed++) {
            bf_stats_sampled(f, 65536, seed * 977, &part);
            ck_assert_msg(fabs(part.fill_ratio - full.fill_ratio) < 5e-3,
                          "kind %d: sampled fill %.5f, scan %.5f", kinds[ki],
                          part.fill_ratio, full.fill_ratio);
            ck_assert_msg(fabs(part.estimated_count - full.estimated_count) <
                              0.02 * full.estimated_count,
                          "kind %d: sampled n-hat %.0f, scan %.0f", kinds[ki],
                          part.estimated_count, full.estimated_count);
        }
        bf_destroy(f);
    }
}
END_TEST

/* bf_add_hashes_sweep sets the bits bf_add_hashes sets and counts the same
 * keys added (the keys of one block keep their order), past capacity where
 * the order of keys decides which of them were new, for every kind; the
 * blocked kind's hashes come back in block order. */
START_TEST(sweep_adds_match_ordered_adds)
{
    static const enum bf_kind kinds[] = {BF_KIND_BLOCKED, BF_KIND_CLASSIC,
                                         BF_KIND_COUNTING, BF_KIND_SCALABLE};
    enum { N = 60000 };
    static struct bf_hash hs[N], sw[N], tmp[N];

    for (size_t k = 0; k < 4; k++) {
        struct bf *a = make(kinds[k], 20000, 0.05, fixed_secret);
        struct bf *b = make(kinds[k], 20000, 0.05, fixed_secret);
        for (uint64_t i = 0; i < N; i++) {
            uint64_t key = i % 45000;   /* re-adds, too */
            hs[i] = bf_hash_key(a, &key, sizeof(key));
        }
        memcpy(sw, hs, sizeof(hs));
        bf_add_hashes(a, hs, N, NULL);
        bf_add_hashes_sweep(b, sw, N, tmp);
        ck_assert_uint_eq(bf_layer_count(a), bf_layer_count(b));
        for (uint32_t l = 0; l < bf_layer_count(a); l++) {
            struct bf_layer_info li;
            ck_assert_int_eq(bf_layer_info(a, l, &li), 0);
            ck_assert_msg(memcmp(bf_layer_body_const(a, l), bf_layer_body_const(b, l),
                                 li.body_bytes) == 0,
                          "%s: layer %u differs", bf_kind_name(kinds[k]), l);
        }
        ck_assert_msg(bf_keys_added(a) == bf_keys_added(b), "%s: %llu keys added in order, "
                      "%llu swept", bf_kind_name(kinds[k]),
                      (unsigned long long)bf_keys_added(a),
                      (unsigned long long)bf_keys_added(b));
        ck_assert_uint_eq(bf_insert_count(a), bf_insert_count(b));
        if (kinds[k] == BF_KIND_BLOCKED) {
            struct bf_layer_info li;
            ck_assert_int_eq(bf_layer_info(b, 0, &li), 0);
            uint64_t nb = li.m / BF_BLOCK_BITS, prev = 0;
            for (size_t i = 0; i < N; i++) {
                uint64_t blk = (uint64_t)(((unsigned __int128)sw[i].h1 * nb) >> 64);
                ck_assert_msg(blk >= prev || (prev - blk) * 65536 < nb,
                              "hash %zu: block %llu after block %llu", i,
                              (unsigned long long)blk, (unsigned long long)prev);
                prev = blk > prev ? blk : prev;
            }
        }
        bf_destroy(a);
        bf_destroy(b);
    }
}
END_TEST

struct membuf {
    uint8_t *p;
    size_t len, cap;
};

static int membuf_write(void *ctx, const void *buf, size_t len)
{
    struct membuf *m = ctx;

    if (m->len + len > m->cap) {
        size_t cap = m->cap ? m->cap : 1 << 16;
        while (cap < m->len + len)
            cap *= 2;
        uint8_t *np = realloc(m->p, cap);
        if (!np)
            return -ENOMEM;
        m->p = np;
        m->cap = cap;
    }
    memcpy(m->p + m->len, buf, len);
    m->len += len;
    return 0;
}

/* bf_add_hashes_sweep_mt on 1, 2, 3, 5 and 16 threads (14 at most for
 * these 60 000 hashes), shared and exclusive, leaves every kind exactly as
 * adding in order does: the export byte for byte (bits, keys added, the
 * adds that were new, every layer's count), and every page's version.  The
 * blocked kind twice: past its capacity (45 000 keys into 40 000: which
 * keys of a block are new depends on their order) over 15 of the sort's
 * buckets, and below it over all 256. */
START_TEST(sweep_threads_match_ordered_adds)
{
    static const struct {
        enum bf_kind kind;
        uint64_t cap;
        double p;
    } cfg[] = {{BF_KIND_BLOCKED, 40000, 0.05}, {BF_KIND_BLOCKED, 2000000, 0.0001},
               {BF_KIND_CLASSIC, 20000, 0.05}, {BF_KIND_COUNTING, 20000, 0.05},
               {BF_KIND_SCALABLE, 20000, 0.05}};
    static const unsigned threads[] = {1, 2, 3, 5, 16};
    enum { N = 60000 };
    static struct bf_hash hs[N], sw[N], tmp[N];

    for (size_t k = 0; k < sizeof cfg / sizeof *cfg; k++) {
        for (size_t t = 0; t < sizeof threads / sizeof *threads; t++) {
            struct bf *a = make(cfg[k].kind, cfg[k].cap, cfg[k].p, fixed_secret);
            struct bf *b = make(cfg[k].kind, cfg[k].cap, cfg[k].p, fixed_secret);
            ck_assert_int_eq(bf_track_pages(a, true), 0);
            ck_assert_int_eq(bf_track_pages(b, true), 0);
            bf_set_stamp(a, 7);
            bf_set_stamp(b, 7);
            bf_set_exclusive(b, t % 2 == 1);
            for (uint64_t i = 0; i < N; i++) {
                uint64_t key = (i * 7919) % 45000;   /* re-adds, too */
                hs[i] = bf_hash_key(a, &key, sizeof(key));
            }
            memcpy(sw, hs, sizeof(hs));
            bf_add_hashes(a, hs, N, NULL);
            bf_add_hashes_sweep_mt(b, sw, N, tmp, threads[t]);
            bf_set_exclusive(b, false);

            struct membuf ea = {0}, eb = {0};
            ck_assert_int_eq(bf_file_write(a, membuf_write, &ea), 0);
            ck_assert_int_eq(bf_file_write(b, membuf_write, &eb), 0);
            ck_assert_msg(ea.len == eb.len && memcmp(ea.p, eb.p, ea.len) == 0,
                          "%s of %llu, %u threads: the export differs",
                          bf_kind_name(cfg[k].kind), (unsigned long long)cfg[k].cap,
                          threads[t]);
            ck_assert_uint_eq(bf_keys_added(a), bf_keys_added(b));
            ck_assert_uint_eq(bf_insert_count(a), bf_insert_count(b));
            ck_assert_uint_eq(bf_layer_count(a), bf_layer_count(b));
            uint64_t stamped = 0;
            for (uint32_t l = 0; l < bf_layer_count(a); l++) {
                ck_assert_uint_eq(bf_layer_pages(a, l), bf_layer_pages(b, l));
                for (uint64_t p = 0; p < bf_layer_pages(a, l); p++) {
                    ck_assert_msg(bf_page_version(a, l, p) == bf_page_version(b, l, p),
                                  "%s, %u threads: page %llu of layer %u",
                                  bf_kind_name(cfg[k].kind), threads[t],
                                  (unsigned long long)p, l);
                    stamped += bf_page_version(a, l, p) == 7;
                }
            }
            ck_assert_uint_gt(stamped, 0);
            free(ea.p);
            free(eb.p);
            bf_destroy(a);
            bf_destroy(b);
        }
    }
}
END_TEST

Suite *bf_suite(void)
{
    Suite *s = suite_create("bf");
    TCase *tc = tcase_create("core");

    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, hash_known_answers);
    tcase_add_test(tc, shard_selection_known_answers);
    tcase_add_test(tc, placement_known_answers);
    tcase_add_test(tc, vector_probes_match_scalar);
    tcase_add_test(tc, vector_adds_match_scalar);
    tcase_add_test(tc, sweep_adds_match_ordered_adds);
    tcase_add_test(tc, sweep_threads_match_ordered_adds);
    tcase_add_test(tc, single_query_every_key_length);
    tcase_add_test(tc, add_reports_new_keys);
    tcase_add_test(tc, batched_forms_match_single);
    tcase_add_test(tc, keys_added_counts_every_add);
    tcase_add_test(tc, merge_adds_keys_added);
    tcase_add_test(tc, counting_remove);
    tcase_add_test(tc, counting_saturated_counter_never_decrements);
    tcase_add_test(tc, estimates_track_count);
    tcase_add_test(tc, sampled_stats_track_the_scan);
    tcase_add_test(tc, merge_equals_union_bit_for_bit);
    tcase_add_test(tc, merge_scalable_appends_layers);
    tcase_add_test(tc, merge_refuses_every_mismatch);
    tcase_add_test(tc, params_are_checked);
    tcase_add_test(tc, like_shares_fingerprint);
    tcase_add_test(tc, small_bodies_share_huge_page_chunks);
    tcase_add_test(tc, a_body_cut_again_reads_zero);
    tcase_add_test(tc, bodies_made_and_freed_from_many_threads);
    tcase_add_test(tc, no_false_negatives_blocked);
    tcase_add_test(tc, no_false_negatives_classic);
    tcase_add_test(tc, no_false_negatives_counting);
    tcase_add_test(tc, no_false_negatives_scalable);
    tcase_add_test(tc, concurrent_adds_and_queries_blocked);
    tcase_add_test(tc, concurrent_adds_and_queries_counting);
    tcase_add_test(tc, concurrent_adds_and_queries_scalable);
    suite_add_tcase(s, tc);

    TCase *st = tcase_create("fpr");
    tcase_set_timeout(st, 900);
    tcase_add_test(st, blocked_fpr_at_capacity_1pct);
    tcase_add_test(st, blocked_fpr_at_capacity_01pct);
    tcase_add_test(st, classic_fpr_matches_textbook_1pct);
    tcase_add_test(st, classic_fpr_matches_textbook_01pct);
    tcase_add_test(st, scalable_fpr_after_100x_1pct);
    tcase_add_test(st, scalable_fpr_after_100x_01pct);
    suite_add_tcase(s, st);
    return s;
}
