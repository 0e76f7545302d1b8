/* bf_ops.c: the hot paths: add, query and remove, single and batched.
 *
 * Bit placement (docs/FORMAT.md, "Hashing and bit placement"):
 *   blocked:  block = (h1 * blocks) >> 64; inside the block, enhanced
 *             double hashing (Dillinger and Manolios) on the 64-bit circle:
 *             with a = low 32 bits of h1 and b = low 32 bits of h2,
 *             g_0 = a << 32 | b, y_0 = b * phi64 | 1, z = a * c64,
 *             g_{i+1} = g_i + y_i, y_{i+1} = y_i + z, bit_i = g_i >> 55.
 *             Plain double hashing (without z) in a 512-bit block measured
 *             10-50 % above the model's false-positive rate; this variant
 *             measures as well as independent probes.
 *   classic / counting: Kirsch-Mitzenmacher double hashing on the 64-bit
 *             circle, g_i = h1 + i*y with y = (low 32 bits of h2) * phi64 | 1,
 *             and position (g_i * m) >> 64.
 * The high 32 bits of h2 are never used here: they choose the shard.
 *
 * Adds are atomic ORs (fetch-or tells whether a bit was new); a word whose
 * bits are all set already is not written at all, which keeps re-adds cheap
 * and cache lines shared.  In exclusive (single-writer) mode adds are
 * branch-free load/OR/store sequences instead.  With AVX-512 a blocked add
 * gathers its k bits into a register image of the block first, then writes
 * only the words that gain a bit: one masked store (exclusive) or one atomic
 * OR per such word.  Queries use relaxed atomic loads (plain moves on
 * x86-64).  Batched forms hash a chunk of keys first, prefetching each block
 * as soon as its hash is known, then probe the chunk.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "bf_internal.h"

#ifndef BF_CHUNK
#define BF_CHUNK 64
#endif
#ifndef BF_AHEAD
#define BF_AHEAD 8
#endif
#define PHI64 0x9E3779B97F4A7C15ULL
#define C64 0xC2B2AE3D27D4EB4FULL

static inline uint64_t fastrange64(uint64_t x, uint64_t n)
{
    return (uint64_t)(((unsigned __int128)x * n) >> 64);
}

static inline uint64_t classic_stride(struct bf_hash h)
{
    return ((uint64_t)(uint32_t)h.h2 * PHI64) | 1;
}

/* The in-block probe sequence; see the comment at the top of the file. */
struct probe {
    uint64_t g, y, z;
};

static inline struct probe probe_start(struct bf_hash h)
{
    struct probe p;

    p.g = ((uint64_t)(uint32_t)h.h1 << 32) | (uint32_t)h.h2;
    p.y = ((uint64_t)(uint32_t)h.h2 * PHI64) | 1;
    p.z = (uint64_t)(uint32_t)h.h1 * C64;
    return p;
}

static inline unsigned probe_next(struct probe *p)
{
    unsigned bit = (unsigned)(p->g >> 55);

    p->g += p->y;
    p->y += p->z;
    return bit;
}

static inline uint64_t *blocked_block(const struct bf_layer *l, struct bf_hash h)
{
    return l->body + fastrange64(h.h1, l->nblocks) * 8;
}

static inline bool blocked_add(const struct bf *f, struct bf_layer *l, struct bf_hash h)
{
    uint64_t *blk = blocked_block(l, h);
    struct probe p = probe_start(h);
    uint64_t missing = 0;

    if (f->exclusive) {
        /* Branch-free: a data-dependent branch per probe mispredicts half
         * the time on a filling filter. */
        for (uint32_t i = 0; i < l->k; i++) {
            unsigned bit = probe_next(&p);
            uint64_t *w = &blk[bit >> 6];
            uint64_t b = 1ULL << (bit & 63);
            uint64_t cur = __atomic_load_n(w, __ATOMIC_RELAXED);
            missing |= b & ~cur;
            __atomic_store_n(w, cur | b, __ATOMIC_RELAXED);
        }
        if (missing)
            bf__stamp_word(f, l, (uint64_t)(blk - l->body));
        return missing != 0;
    }
    for (uint32_t i = 0; i < l->k; i++) {
        unsigned bit = probe_next(&p);
        uint64_t *w = &blk[bit >> 6];
        uint64_t b = 1ULL << (bit & 63);
        /* Skip the locked OR when the bit is there already. */
        if (__atomic_load_n(w, __ATOMIC_RELAXED) & b)
            continue;
        missing |= b & ~__atomic_fetch_or(w, b, __ATOMIC_RELEASE);
    }
    if (missing)
        bf__stamp_word(f, l, (uint64_t)(blk - l->body));
    return missing != 0;
}

/* Branch-free: every probe reads the same cache line, so checking all k
 * costs less than the mispredicted early exit that absent keys would take. */
static inline bool blocked_test(const struct bf_layer *l, struct bf_hash h)
{
    const uint64_t *blk = blocked_block(l, h);
    struct probe p = probe_start(h);
    uint64_t missing = 0;

    for (uint32_t i = 0; i < l->k; i++) {
        unsigned bit = probe_next(&p);
        missing |= (1ULL << (bit & 63)) & ~__atomic_load_n(&blk[bit >> 6], __ATOMIC_RELAXED);
    }
    return missing == 0;
}

/* The same test with AVX-512, eight probes per step: lane i computes g_i in
 * closed form, g_i = g_0 + i*y_0 + (i*(i-1)/2)*z, picks its word of the
 * block (held in one register) with a permute and tests its bit against a
 * rotated 1.  Answers exactly as blocked_test (the unit tests compare the two);
 * about half the instructions.  Used when the CPU has AVX-512F and DQ. */
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define BF_HAVE_VEC 1
#define BF_VEC_TARGET __attribute__((target("avx512f,avx512dq")))

BF_VEC_TARGET static inline bool blocked_test_vec(const struct bf_layer *l, struct bf_hash h)
{
    const uint64_t *blk = blocked_block(l, h);
    struct probe p = probe_start(h);
    const __m512i lane = _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0);
    const __m512i tri = _mm512_set_epi64(21, 15, 10, 6, 3, 1, 0, 0);
    __m512i z = _mm512_set1_epi64((long long)p.z);
    __m512i g = _mm512_add_epi64(_mm512_set1_epi64((long long)p.g),
                                 _mm512_add_epi64(_mm512_mullo_epi64(lane, _mm512_set1_epi64((long long)p.y)),
                                                  _mm512_mullo_epi64(tri, z)));
    __m512i block = _mm512_loadu_si512(blk);
    /* Word bit >> 6 = g >> 61 of the block, tested against 1 << (bit & 63):
     * a rotate of 1 by bit, as rotation counts are taken mod 64. */
    const __m512i one = _mm512_set1_epi64(1);
    __m512i word = _mm512_permutexvar_epi64(_mm512_srli_epi64(g, 61), block);
    __m512i b = _mm512_rolv_epi64(one, _mm512_srli_epi64(g, 55));
    unsigned kmask = l->kmask;
    unsigned bad = kmask & ~(unsigned)_mm512_mask_test_epi64_mask((__mmask8)kmask, word, b);

    for (uint32_t left = l->k, i = 0; left > 8; i += 8) {
        left -= 8;
        /* Eight steps on: g_{j+8} = g_j + 8*y_j + 28*z, where
         * y_j = y_0 + j*z for lane j's current probe index. */
        __m512i idx = _mm512_add_epi64(lane, _mm512_set1_epi64((long long)i));
        __m512i y = _mm512_add_epi64(_mm512_set1_epi64((long long)p.y), _mm512_mullo_epi64(idx, z));
        g = _mm512_add_epi64(g, _mm512_add_epi64(_mm512_slli_epi64(y, 3),
                                                 _mm512_mullo_epi64(_mm512_set1_epi64(28), z)));
        __mmask8 want = left >= 8 ? (__mmask8)0xff : (__mmask8)((1u << left) - 1);
        word = _mm512_permutexvar_epi64(_mm512_srli_epi64(g, 61), block);
        b = _mm512_rolv_epi64(one, _mm512_srli_epi64(g, 55));
        bad |= (unsigned)want & ~(unsigned)_mm512_mask_test_epi64_mask(want, word, b);
    }
    return bad == 0;
}

/* The add with AVX-512: the k probes are OR-ed into a register image of the
 * block (lane w of bf_word_lane[w] picks word w), then compared with the block
 * in one load.  Exclusive mode writes back only the words that gain a bit
 * (one masked store, none for a re-add); atomic mode does one atomic OR per
 * such word instead of one per probe.  Sets exactly the bits blocked_add
 * sets (the unit tests compare the two). */
static const uint64_t bf_word_lane[8][8] __attribute__((aligned(64))) = {
    {~0ULL, 0, 0, 0, 0, 0, 0, 0}, {0, ~0ULL, 0, 0, 0, 0, 0, 0},
    {0, 0, ~0ULL, 0, 0, 0, 0, 0}, {0, 0, 0, ~0ULL, 0, 0, 0, 0},
    {0, 0, 0, 0, ~0ULL, 0, 0, 0}, {0, 0, 0, 0, 0, ~0ULL, 0, 0},
    {0, 0, 0, 0, 0, 0, ~0ULL, 0}, {0, 0, 0, 0, 0, 0, 0, ~0ULL}};

BF_VEC_TARGET static inline bool blocked_add_vec(const struct bf *f, struct bf_layer *l,
                                                 struct bf_hash h)
{
    uint64_t *blk = blocked_block(l, h);
    struct probe p = probe_start(h);
    __m512i set = _mm512_setzero_si512();

    for (uint32_t i = 0; i < l->k; i++) {
        unsigned bit = probe_next(&p);
        __m512i b = _mm512_set1_epi64((long long)(1ULL << (bit & 63)));
        /* set |= b & lane(bit >> 6) */
        set = _mm512_ternarylogic_epi64(set, b, _mm512_load_si512(bf_word_lane[bit >> 6]), 0xF8);
    }
    __m512i cur = _mm512_loadu_si512(blk);
    __m512i miss = _mm512_andnot_si512(cur, set);
    __mmask8 need = _mm512_test_epi64_mask(miss, miss);

    if (need)
        bf__stamp_word(f, l, (uint64_t)(blk - l->body));
    if (f->exclusive) {
        _mm512_mask_storeu_epi64(blk, need, _mm512_or_si512(cur, set));
        return need != 0;
    }
    if (!need)
        return false;
    uint64_t words[8] __attribute__((aligned(64)));
    uint64_t missing = 0;
    _mm512_store_si512(words, set);
    for (unsigned w = need; w; w &= w - 1) {
        unsigned j = (unsigned)__builtin_ctz(w);
        missing |= words[j] & ~__atomic_fetch_or(&blk[j], words[j], __ATOMIC_RELEASE);
    }
    return missing != 0;
}

static bool vec_enabled;

static void vec_init(void) __attribute__((constructor));
static void vec_init(void)
{
    const char *off = getenv("BLOOMGRID_NO_AVX512");

    __builtin_cpu_init();
    vec_enabled = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
                  !(off && *off && strcmp(off, "0") != 0);
}

static inline bool blocked_query(const struct bf_layer *l, struct bf_hash h)
{
    if (vec_enabled)
        return blocked_test_vec(l, h);
    return blocked_test(l, h);
}

bool bf_vector_probes(int enable)
{
    if (enable >= 0) {
        bool can = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
        vec_enabled = enable && can;
    }
    return vec_enabled;
}
#else
static inline bool blocked_query(const struct bf_layer *l, struct bf_hash h)
{
    return blocked_test(l, h);
}

bool bf_vector_probes(int enable)
{
    (void)enable;
    return false;
}
#endif

static inline bool classic_add(const struct bf *f, struct bf_layer *l, struct bf_hash h)
{
    uint64_t g = h.h1, y = classic_stride(h);
    uint64_t missing = 0;

    for (uint32_t i = 0; i < l->k; i++, g += y) {
        uint64_t pos = fastrange64(g, l->m);
        uint64_t b = 1ULL << (pos & 63);
        uint64_t *w = &l->body[pos >> 6];
        uint64_t cur = __atomic_load_n(w, __ATOMIC_RELAXED);
        if (cur & b)
            continue;
        bf__stamp_word(f, l, pos >> 6);
        if (f->exclusive) {
            missing |= b;
            __atomic_store_n(w, cur | b, __ATOMIC_RELAXED);
        } else {
            missing |= b & ~__atomic_fetch_or(w, b, __ATOMIC_RELEASE);
        }
    }
    return missing != 0;
}

static inline bool classic_test(const struct bf_layer *l, struct bf_hash h)
{
    uint64_t g = h.h1, y = classic_stride(h);

    for (uint32_t i = 0; i < l->k; i++, g += y) {
        uint64_t pos = fastrange64(g, l->m);
        if (!(__atomic_load_n(&l->body[pos >> 6], __ATOMIC_RELAXED) & (1ULL << (pos & 63))))
            return false;
    }
    return true;
}

static inline unsigned counter_get(uint64_t word, uint64_t pos)
{
    return (unsigned)(word >> ((pos & 15) * 4)) & 15u;
}

/* Add delta (+1 or -1) to one 4-bit counter; saturated counters stay put.
 * Returns the counter's previous value. */
static unsigned counter_step(const struct bf *f, uint64_t *w, uint64_t pos, int delta)
{
    unsigned shift = (unsigned)(pos & 15) * 4;
    uint64_t old = __atomic_load_n(w, __ATOMIC_RELAXED);

    for (;;) {
        unsigned c = (unsigned)(old >> shift) & 15u;
        if (c == BF_COUNTER_MAX || (delta < 0 && c == 0))
            return c;
        uint64_t nw = delta > 0 ? old + (1ULL << shift) : old - (1ULL << shift);
        if (f->exclusive) {
            __atomic_store_n(w, nw, __ATOMIC_RELAXED);
            return c;
        }
        if (__atomic_compare_exchange_n(w, &old, nw, true, __ATOMIC_RELEASE,
                                        __ATOMIC_RELAXED))
            return c;
    }
}

static bool counting_add(const struct bf *f, struct bf_layer *l, struct bf_hash h)
{
    uint64_t g = h.h1, y = classic_stride(h);
    bool added = false;

    for (uint32_t i = 0; i < l->k; i++, g += y) {
        uint64_t pos = fastrange64(g, l->m);
        bf__stamp_word(f, l, pos >> 4);
        added |= counter_step(f, &l->body[pos >> 4], pos, +1) == 0;
    }
    return added;
}

static bool counting_test(const struct bf_layer *l, struct bf_hash h)
{
    uint64_t g = h.h1, y = classic_stride(h);

    for (uint32_t i = 0; i < l->k; i++, g += y) {
        uint64_t pos = fastrange64(g, l->m);
        if (!counter_get(__atomic_load_n(&l->body[pos >> 4], __ATOMIC_RELAXED), pos))
            return false;
    }
    return true;
}

static inline bool layer_add(const struct bf *f, struct bf_layer *l, struct bf_hash h)
{
    switch (f->kind) {
    case BF_KIND_BLOCKED:
    case BF_KIND_SCALABLE:
        return blocked_add(f, l, h);
    case BF_KIND_CLASSIC:
        return classic_add(f, l, h);
    case BF_KIND_COUNTING:
        return counting_add(f, l, h);
    }
    return false;
}

static inline bool layer_test(const struct bf *f, const struct bf_layer *l, struct bf_hash h)
{
    switch (f->kind) {
    case BF_KIND_BLOCKED:
    case BF_KIND_SCALABLE:
        return blocked_test(l, h);
    case BF_KIND_CLASSIC:
        return classic_test(l, h);
    case BF_KIND_COUNTING:
        return counting_test(l, h);
    }
    return false;
}

/* Append a layer once the newest one is full.  Keys added meanwhile to the
 * older layer stay there: queries check every layer. */
static void scalable_grow(struct bf *f, uint32_t seen)
{
    pthread_mutex_lock(&f->grow_lock);
    if (f->nlayers == seen && seen < BF_MAX_LAYERS) {
        uint64_t cap;
        double rate;
        bf__scalable_layer_params(f, seen, &cap, &rate);
        if (bf__layer_init(&f->layers[seen], f->kind, cap, rate, 0, 0, NULL) == 0) {
            if (f->track && bf__layer_track(&f->layers[seen]) < 0)
                bf__layer_deinit(&f->layers[seen]);   /* full: no growth */
            else
                __atomic_store_n(&f->nlayers, seen + 1, __ATOMIC_RELEASE);
        }
    }
    pthread_mutex_unlock(&f->grow_lock);
}

static bool scalable_add(struct bf *f, struct bf_hash h)
{
    uint32_t n = bf__nlayers(f);

    for (uint32_t i = 0; i < n; i++)
        if (blocked_query(&f->layers[i], h))
            return false;
    struct bf_layer *last = &f->layers[n - 1];
    if (!blocked_add(f, last, h))
        return false;
    uint64_t c = __atomic_add_fetch(&last->count, 1, __ATOMIC_RELAXED);
    if (c >= last->capacity)
        scalable_grow(f, n);
    return true;
}

/* Add without touching the counters; callers count the adds (n) and those
 * that returned true (added) with count_adds, once per batch, to keep
 * atomic increments off the per-key path.  The scalable kind counts its
 * layer itself: it grows on it. */
static inline bool add_hash(struct bf *f, struct bf_hash h)
{
    if (f->kind == BF_KIND_SCALABLE)
        return scalable_add(f, h);
    return layer_add(f, &f->layers[0], h);
}

static void count_adds(struct bf *f, uint64_t added, uint64_t n)
{
    if (n)
        bf__keys_add(f, n);
    if (!added)
        return;
    if (f->exclusive) {
        f->inserts += added;
        if (f->kind != BF_KIND_SCALABLE)
            f->layers[0].count += added;
        return;
    }
    __atomic_add_fetch(&f->inserts, added, __ATOMIC_RELAXED);
    if (f->kind != BF_KIND_SCALABLE)
        __atomic_add_fetch(&f->layers[0].count, added, __ATOMIC_RELAXED);
}

static inline bool test_hash(const struct bf *f, struct bf_hash h)
{
    if (f->kind != BF_KIND_SCALABLE)
        return layer_test(f, &f->layers[0], h);
    uint32_t n = bf__nlayers(f);
    for (uint32_t i = 0; i < n; i++)
        if (blocked_query(&f->layers[i], h))
            return true;
    return false;
}

static inline struct bf_hash hash_key(const struct bf *f, const void *key, size_t len)
{
    XXH128_hash_t x = XXH3_128bits_withSecret(key, len, f->xsecret, BF_XSECRET_LEN);
    struct bf_hash h = {x.low64, x.high64};
    return h;
}

struct bf_hash bf_hash_key(const struct bf *f, const void *key, size_t len)
{
    return hash_key(f, key, len);
}


/* Prefetch the first cache line a hash touches in the first layer. */
static inline void prefetch_hash(const struct bf *f, struct bf_hash h, int write)
{
    const struct bf_layer *l = &f->layers[0];
    const void *p;

    switch (f->kind) {
    case BF_KIND_BLOCKED:
        p = blocked_block(l, h);
        if (write && l->dirty) {
            /* The page's mark too: the map is small but the blocks' lines
             * push it out of the nearest cache. */
            uint64_t pg = ((uint64_t)((const uint64_t *)p - l->body)) >> (BF_PAGE_SHIFT - 3);
            __asm__ volatile("prefetcht0 %0" : : "m"(l->dirty[pg >> 6]));
        }
        break;
    case BF_KIND_COUNTING:
        p = &l->body[fastrange64(h.h1, l->m) >> 4];
        break;
    case BF_KIND_CLASSIC:
        p = &l->body[fastrange64(h.h1, l->m) >> 6];
        break;
    default:
        return;
    }
    (void)write;
    /* An asm statement, not __builtin_prefetch: GCC 12 dropped the builtin
     * from these loops as a side-effect-free computation. */
    __asm__ volatile("prefetcht0 %0" : : "m"(*(const char *)p));
}

void bf_prefetch_hash(const struct bf *f, struct bf_hash h)
{
    prefetch_hash(f, h, 1);
}

/* The batched loops are written once (always inlined) and built twice on
 * x86-64: as they are, and inside functions compiled for AVX-512 where the
 * add and test of a blocked filter are blocked_add_vec and blocked_test_vec.
 * Entry points pick the build once per call. */
typedef bool (*test_fn)(const struct bf *f, struct bf_hash h);
typedef bool (*add_fn)(struct bf *f, struct bf_hash h);

#define BF_INLINE static inline __attribute__((always_inline))

BF_INLINE uint64_t add_hashes_loop(struct bf *f, const struct bf_hash *h, size_t n, bool *out,
                                   add_fn add)
{
    const size_t ahead = BF_AHEAD;
    uint64_t added = 0;

    for (size_t i = 0; i < n && i < ahead; i++)
        prefetch_hash(f, h[i], 1);
    for (size_t i = 0; i < n; i++) {
        if (i + ahead < n)
            prefetch_hash(f, h[i + ahead], 1);
        bool a = add(f, h[i]);
        added += a;
        if (out)
            out[i] = a;
    }
    return added;
}

BF_INLINE uint64_t add_keys_loop(struct bf *f, const void *const *keys, const size_t *lens,
                                 size_t n, bool *out, add_fn add)
{
    struct bf_hash hs[BF_CHUNK];
    uint64_t added = 0;

    for (size_t base = 0; base < n; base += BF_CHUNK) {
        size_t c = n - base < BF_CHUNK ? n - base : BF_CHUNK;
        for (size_t i = 0; i < c; i++) {
            hs[i] = hash_key(f, keys[base + i], lens[base + i]);
            prefetch_hash(f, hs[i], 1);
        }
        for (size_t i = 0; i < c; i++) {
            bool a = add(f, hs[i]);
            added += a;
            if (out)
                out[base + i] = a;
        }
    }
    return added;
}

BF_INLINE void hashes_loop(const struct bf *f, const struct bf_hash *h, size_t n, bool *out,
                           test_fn test)
{
    const size_t ahead = BF_AHEAD;

    for (size_t i = 0; i < n && i < ahead; i++)
        prefetch_hash(f, h[i], 0);
    for (size_t i = 0; i < n; i++) {
        if (i + ahead < n)
            prefetch_hash(f, h[i + ahead], 0);
        out[i] = test(f, h[i]);
    }
}

BF_INLINE void keys_loop(const struct bf *f, const void *const *keys, const size_t *lens,
                         size_t n, bool *out, test_fn test)
{
    struct bf_hash hs[BF_CHUNK];

    for (size_t base = 0; base < n; base += BF_CHUNK) {
        size_t c = n - base < BF_CHUNK ? n - base : BF_CHUNK;
        for (size_t i = 0; i < c; i++) {
            hs[i] = hash_key(f, keys[base + i], lens[base + i]);
            prefetch_hash(f, hs[i], 0);
        }
        for (size_t i = 0; i < c; i++)
            out[base + i] = test(f, hs[i]);
    }
}

#ifdef BF_HAVE_VEC
/* Blocked kind only (one layer). */
BF_VEC_TARGET static inline bool test_blocked_vec(const struct bf *f, struct bf_hash h)
{
    return blocked_test_vec(&f->layers[0], h);
}

BF_VEC_TARGET static inline bool add_blocked_vec(struct bf *f, struct bf_hash h)
{
    return blocked_add_vec(f, &f->layers[0], h);
}

BF_VEC_TARGET static bool add_hash_vec(struct bf *f, struct bf_hash h)
{
    return add_blocked_vec(f, h);
}

BF_VEC_TARGET static uint64_t add_hashes_vec(struct bf *f, const struct bf_hash *h, size_t n,
                                             bool *out)
{
    return add_hashes_loop(f, h, n, out, add_blocked_vec);
}

BF_VEC_TARGET static uint64_t add_keys_vec(struct bf *f, const void *const *keys,
                                           const size_t *lens, size_t n, bool *out)
{
    return add_keys_loop(f, keys, lens, n, out, add_blocked_vec);
}

BF_VEC_TARGET __attribute__((flatten, noinline)) static bool
may_contain_vec_long(const struct bf *f, const void *key, size_t len)
{
    return test_blocked_vec(f, hash_key(f, key, len));
}

/* Keys of up to 16 bytes hash without XXH3's long-input state, so this path
 * needs no stack frame; longer keys go to may_contain_vec_long. */
BF_VEC_TARGET __attribute__((flatten)) static bool may_contain_vec(const struct bf *f,
                                                                   const void *key, size_t len)
{
    if (len > 16)
        return may_contain_vec_long(f, key, len);
    return test_blocked_vec(f, hash_key(f, key, len));
}

BF_VEC_TARGET static void hashes_vec(const struct bf *f, const struct bf_hash *h, size_t n,
                                     bool *out)
{
    hashes_loop(f, h, n, out, test_blocked_vec);
}

BF_VEC_TARGET static void keys_vec(const struct bf *f, const void *const *keys,
                                   const size_t *lens, size_t n, bool *out)
{
    keys_loop(f, keys, lens, n, out, test_blocked_vec);
}

#define USE_VEC(f) (vec_enabled && (f)->kind == BF_KIND_BLOCKED)
#endif

bool bf_add_hash(struct bf *f, struct bf_hash h)
{
    bool added;

#ifdef BF_HAVE_VEC
    if (USE_VEC(f))
        added = add_hash_vec(f, h);
    else
#endif
        added = add_hash(f, h);
    count_adds(f, added, 1);
    return added;
}

bool bf_add(struct bf *f, const void *key, size_t len)
{
    return bf_add_hash(f, hash_key(f, key, len));
}

void bf_add_hashes(struct bf *f, const struct bf_hash *h, size_t n, bool *out)
{
#ifdef BF_HAVE_VEC
    if (USE_VEC(f)) {
        count_adds(f, add_hashes_vec(f, h, n, out), n);
        return;
    }
#endif
    count_adds(f, add_hashes_loop(f, h, n, out, add_hash), n);
}

/* The sweep (bf_add_hashes_sweep_mt): a stable sort of the hashes by the
 * top 16 bits of their block index, most significant byte first, then the
 * adds in that order.
 *   1. each thread counts the high bytes of its share of h (a contiguous
 *      chunk in arrival order);
 *   2. each scatters its chunk into tmp at its place in its bucket: chunk
 *      t's hashes of bucket b after those of chunks < t (stable);
 *   3. the 256 buckets are split between the threads by count; each sorts
 *      its buckets by the low byte from tmp back into h (stable) and adds
 *      them.
 * A bucket is a range of blocks, so the threads of step 3 write disjoint
 * blocks; two of them may mark one page at a bucket's edge as changed (an
 * atomic OR, bf__stamp_word).  The order is that of a stable
 * sort by the 16 bits whatever the number of threads, so the bits and the
 * count of adds that returned true are too.  Phases are separated by
 * joining the threads (no barrier to unwind when one cannot start). */
#define SWEEP_THREADS_MAX 16

struct sweep_job {
    struct bf *f;
    struct bf_hash *h, *tmp;
    size_t n;
    uint64_t nb;
    unsigned shift;                  /* of the low byte */
    unsigned threads;
    size_t cnt[SWEEP_THREADS_MAX][256];   /* high-byte counts of each chunk */
    size_t bstart[257];              /* where each bucket starts in tmp */
    unsigned first[SWEEP_THREADS_MAX + 1];   /* buckets of each thread */
    uint64_t added[SWEEP_THREADS_MAX];
};

struct sweep_task {
    struct sweep_job *j;
    unsigned t;
    int phase;
};

static inline unsigned sweep_key(const struct sweep_job *j, struct bf_hash h)
{
    return (unsigned)(fastrange64(h.h1, j->nb) >> j->shift) & 0xffff;
}

static uint64_t add_hashes_uncounted(struct bf *f, const struct bf_hash *h, size_t n)
{
#ifdef BF_HAVE_VEC
    if (USE_VEC(f))
        return add_hashes_vec(f, h, n, NULL);
#endif
    return add_hashes_loop(f, h, n, NULL, add_hash);
}

static void sweep_count(struct sweep_job *j, unsigned t)
{
    size_t a = j->n * t / j->threads, b = j->n * (t + 1) / j->threads;
    size_t *c = j->cnt[t];

    memset(c, 0, sizeof j->cnt[t]);
    for (size_t i = a; i < b; i++)
        c[sweep_key(j, j->h[i]) >> 8]++;
}

static void sweep_scatter(struct sweep_job *j, unsigned t)
{
    size_t a = j->n * t / j->threads, b = j->n * (t + 1) / j->threads;
    size_t pos[256];

    for (unsigned k = 0; k < 256; k++) {
        pos[k] = j->bstart[k];
        for (unsigned u = 0; u < t; u++)
            pos[k] += j->cnt[u][k];
    }
    for (size_t i = a; i < b; i++)
        j->tmp[pos[sweep_key(j, j->h[i]) >> 8]++] = j->h[i];
}

static void sweep_add(struct sweep_job *j, unsigned t)
{
    size_t a = j->bstart[j->first[t]], b = j->bstart[j->first[t + 1]];

    for (unsigned k = j->first[t]; k < j->first[t + 1]; k++) {
        size_t lo = j->bstart[k], hi = j->bstart[k + 1], pos[256] = {0};
        for (size_t i = lo; i < hi; i++)
            pos[sweep_key(j, j->tmp[i]) & 0xff]++;
        for (size_t v = 0, sum = lo; v < 256; v++) {
            size_t c = pos[v];
            pos[v] = sum;
            sum += c;
        }
        for (size_t i = lo; i < hi; i++)
            j->h[pos[sweep_key(j, j->tmp[i]) & 0xff]++] = j->tmp[i];
    }
    j->added[t] = add_hashes_uncounted(j->f, j->h + a, b - a);
}

static void *sweep_run(void *arg)
{
    struct sweep_task *k = arg;

    if (k->phase == 0)
        sweep_count(k->j, k->t);
    else if (k->phase == 1)
        sweep_scatter(k->j, k->t);
    else
        sweep_add(k->j, k->t);
    return NULL;
}

/* Run phase on every thread of j: threads 1.. on their own threads (or on
 * this one when one cannot be started), 0 on this one. */
static void sweep_phase(struct sweep_job *j, int phase)
{
    struct sweep_task task[SWEEP_THREADS_MAX];
    pthread_t tid[SWEEP_THREADS_MAX];
    bool started[SWEEP_THREADS_MAX] = {false};

    for (unsigned t = 0; t < j->threads; t++)
        task[t] = (struct sweep_task){j, t, phase};
    for (unsigned t = 1; t < j->threads; t++)
        started[t] = pthread_create(&tid[t], NULL, sweep_run, &task[t]) == 0;
    sweep_run(&task[0]);
    for (unsigned t = 1; t < j->threads; t++) {
        if (started[t])
            pthread_join(tid[t], NULL);
        else
            sweep_run(&task[t]);
    }
}

void bf_add_hashes_sweep_mt(struct bf *f, struct bf_hash *h, size_t n,
                            struct bf_hash *tmp, unsigned threads)
{
    if (f->kind != BF_KIND_BLOCKED || n < 4096) {
        bf_add_hashes(f, h, n, NULL);
        return;
    }
    struct sweep_job *j = malloc(sizeof *j);
    if (!j) {
        bf_add_hashes(f, h, n, NULL);   /* the same bits, slower */
        return;
    }
    uint64_t nb = f->layers[0].nblocks;
    unsigned bits = 64 - (unsigned)__builtin_clzll(nb | 1);
    j->f = f;
    j->h = h;
    j->tmp = tmp;
    j->n = n;
    j->nb = nb;
    j->shift = bits > 16 ? bits - 16 : 0;
    j->threads = threads < 1 ? 1 : threads > SWEEP_THREADS_MAX ? SWEEP_THREADS_MAX
                 : threads;
    if (n / j->threads < 4096)
        j->threads = (unsigned)(n / 4096);   /* >= 1: n >= 4096 */
    sweep_phase(j, 0);
    /* Where each bucket starts, and the buckets of each thread: about
     * n / threads hashes each. */
    size_t sum = 0;
    unsigned t = 1;
    j->first[0] = 0;
    for (unsigned k = 0; k < 256; k++) {
        j->bstart[k] = sum;
        while (t < j->threads && sum >= n * t / j->threads)
            j->first[t++] = k;
        for (unsigned u = 0; u < j->threads; u++)
            sum += j->cnt[u][k];
    }
    j->bstart[256] = sum;
    while (t <= j->threads)
        j->first[t++] = 256;
    sweep_phase(j, 1);
    sweep_phase(j, 2);
    uint64_t added = 0;
    for (unsigned u = 0; u < j->threads; u++)
        added += j->added[u];
    count_adds(f, added, n);
    free(j);
}

void bf_add_hashes_sweep(struct bf *f, struct bf_hash *h, size_t n,
                         struct bf_hash *tmp)
{
    bf_add_hashes_sweep_mt(f, h, n, tmp, 1);
}

void bf_add_keys(struct bf *f, const void *const *keys, const size_t *lens, size_t n,
                 bool *out)
{
#ifdef BF_HAVE_VEC
    if (USE_VEC(f)) {
        count_adds(f, add_keys_vec(f, keys, lens, n, out), n);
        return;
    }
#endif
    count_adds(f, add_keys_loop(f, keys, lens, n, out, add_hash), n);
}

bool bf_may_contain_hash(const struct bf *f, struct bf_hash h)
{
#ifdef BF_HAVE_VEC
    if (USE_VEC(f))
        return test_blocked_vec(f, h);
#endif
    return test_hash(f, h);
}

/* Out of line, so that bf_may_contain is two tail calls and needs no frame. */
static __attribute__((noinline)) bool may_contain_any(const struct bf *f, const void *key,
                                                      size_t len)
{
    return test_hash(f, hash_key(f, key, len));
}

bool bf_may_contain(const struct bf *f, const void *key, size_t len)
{
#ifdef BF_HAVE_VEC
    if (USE_VEC(f))
        return may_contain_vec(f, key, len);
#endif
    return may_contain_any(f, key, len);
}

void bf_may_contain_hashes(const struct bf *f, const struct bf_hash *h, size_t n, bool *out)
{
#ifdef BF_HAVE_VEC
    if (USE_VEC(f)) {
        hashes_vec(f, h, n, out);
        return;
    }
#endif
    hashes_loop(f, h, n, out, test_hash);
}

void bf_may_contain_keys(const struct bf *f, const void *const *keys, const size_t *lens,
                         size_t n, bool *out)
{
#ifdef BF_HAVE_VEC
    if (USE_VEC(f)) {
        keys_vec(f, keys, lens, n, out);
        return;
    }
#endif
    keys_loop(f, keys, lens, n, out, test_hash);
}

int bf_remove_hash(struct bf *f, struct bf_hash h)
{
    struct bf_layer *l = &f->layers[0];

    if (f->kind != BF_KIND_COUNTING)
        return -EOPNOTSUPP;
    if (!counting_test(l, h))
        return -ENOENT;
    uint64_t g = h.h1, y = classic_stride(h);
    for (uint32_t i = 0; i < l->k; i++, g += y) {
        uint64_t pos = fastrange64(g, l->m);
        bf__stamp_word(f, l, pos >> 4);
        counter_step(f, &l->body[pos >> 4], pos, -1);
    }
    return 0;
}

int bf_remove(struct bf *f, const void *key, size_t len)
{
    return bf_remove_hash(f, hash_key(f, key, len));
}
