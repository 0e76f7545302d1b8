/* bf_merge.c: estimates from the fill, fingerprint comparison and merging.
 *
 * A Bloom filter is a grow-only set and OR is its join: idempotent,
 * commutative and associative, so partial filters built anywhere with the
 * same fingerprint merge in any order, any number of times.  Counting filters
 * merge by saturating addition of their 4-bit counters (a saturated counter
 * never decrements again, so no key is ever lost).
 *
 * The distinct-count estimate is n^ = -(m/k) ln(1 - X/m) with X the bits set
 * (Swamidass and Baldi); the current FPR estimate is the kind's model
 * evaluated at n^.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "bf_file.h"
#include "bf_internal.h"

/* Bits set (counters above zero for the counting kind) in words
 * [from, to) of one layer, every word read. */
static uint64_t words_set_read(enum bf_kind kind, const struct bf_layer *l, uint64_t from,
                               uint64_t to)
{
    uint64_t set = 0;

    if (kind != BF_KIND_COUNTING) {
        for (uint64_t i = from; i < to; i++)
            set += (uint64_t)__builtin_popcountll(
                __atomic_load_n(&l->body[i], __ATOMIC_RELAXED));
        return set;
    }
    for (uint64_t i = from; i < to; i++) {
        uint64_t w = __atomic_load_n(&l->body[i], __ATOMIC_RELAXED);
        /* One bit per nonzero nibble. */
        uint64_t nz = (w | w >> 1 | w >> 2 | w >> 3) & 0x1111111111111111ULL;
        set += (uint64_t)__builtin_popcountll(nz);
    }
    return set;
}

/* Bits set in words [from, to) of one layer.  A tracked layer's page of
 * version 0 that is not marked changed was never written (every change
 * marks its page, and a fold gives it a version: bf_internal.h): it is all
 * zeros and is not read, so that an
 * untouched part of the body stays untouched (not resident: on kernels
 * that back a read fault of anonymous memory with a new page rather than
 * the zero page, and with huge pages, a read would cost 2 MiB). */
static uint64_t words_set(enum bf_kind kind, const struct bf_layer *l, uint64_t from,
                          uint64_t to)
{
    const uint64_t *v = __atomic_load_n(&l->pver, __ATOMIC_ACQUIRE);
    const uint64_t per = BF_PAGE_BYTES / 8;   /* words a page */
    uint64_t set = 0;

    if (!v)
        return words_set_read(kind, l, from, to);
    while (from < to) {
        uint64_t p = from / per, end = (p + 1) * per < to ? (p + 1) * per : to;
        if (p >= l->npages || __atomic_load_n(&v[p], __ATOMIC_RELAXED) != 0 ||
            (__atomic_load_n(&l->dirty[p >> 6], __ATOMIC_RELAXED) >> (p & 63) & 1))
            set += words_set_read(kind, l, from, end);
        from = end;
    }
    return set;
}

/* Runs of this many words are read together when sampling (cache lines). */
#define SAMPLE_RUN 64

/* Bits set in one layer: every word when it has at most max_words, else
 * max_words of them in evenly spaced runs starting at offset seed, scaled
 * to the layer. */
static uint64_t layer_set(enum bf_kind kind, const struct bf_layer *l, uint64_t max_words,
                          uint64_t seed)
{
    if (l->words <= max_words)
        return words_set(kind, l, 0, l->words);
    uint64_t runs = max_words / SAMPLE_RUN ? max_words / SAMPLE_RUN : 1;
    uint64_t stride = l->words / runs, read = 0, set = 0;
    uint64_t off = stride > SAMPLE_RUN ? seed % (stride - SAMPLE_RUN) : 0;
    for (uint64_t r = 0; r < runs; r++) {
        uint64_t from = r * stride + off, to = from + SAMPLE_RUN;
        if (to > l->words)
            to = l->words;
        set += words_set(kind, l, from, to);
        read += to - from;
    }
    double per_word = read ? (double)set / (double)read : 0.0;
    double est = per_word * (double)l->words;
    return est >= (double)l->m ? l->m : (uint64_t)llround(est);
}

static double estimate_count(uint64_t m, uint32_t k, uint64_t set)
{
    if (set >= m)
        return INFINITY;
    return -((double)m / (double)k) * log(1.0 - (double)set / (double)m);
}

/* Combine per-layer FPRs: a query is a false positive when any layer says yes. */
static double combine_fpr(double acc_not, double fpr)
{
    return acc_not * (1.0 - fpr);
}

void bf_stats(const struct bf *f, struct bf_stats *out)
{
    bf_stats_sampled(f, UINT64_MAX, 0, out);
}

void bf_stats_sampled(const struct bf *f, uint64_t max_words, uint64_t seed,
                      struct bf_stats *out)
{
    uint32_t n = bf__nlayers(f);
    double not_fp = 1.0;

    memset(out, 0, sizeof(*out));
    out->layers = n;
    for (uint32_t i = 0; i < n; i++) {
        const struct bf_layer *l = &f->layers[i];
        uint64_t set = layer_set(f->kind, l, max_words, seed);
        double est = estimate_count(l->m, l->k, set);
        double fpr = set >= l->m ? 1.0 : bf_model_fpr(f->kind, l->m, l->k, est);
        if (f->kind != BF_KIND_BLOCKED && f->kind != BF_KIND_SCALABLE && set < l->m)
            fpr = pow((double)set / (double)l->m, (double)l->k);
        out->bits += l->m;
        out->bytes += l->words * 8;
        out->set += set;
        out->estimated_count += est;
        not_fp = combine_fpr(not_fp, fpr);
    }
    out->fill_ratio = out->bits ? (double)out->set / (double)out->bits : 0.0;
    out->estimated_fpr = 1.0 - not_fp;
    out->bits_per_key = (double)out->bits / (double)f->capacity;
    if (f->kind == BF_KIND_SCALABLE)
        out->over_capacity = out->estimated_fpr > f->error_rate ||
                             (n == BF_MAX_LAYERS &&
                              f->layers[n - 1].count >= f->layers[n - 1].capacity);
    else
        out->over_capacity = out->estimated_count > (double)f->capacity ||
                             out->estimated_fpr > f->error_rate;
}

const char *bf_mismatch(const struct bf *a, const struct bf *b)
{
    if (a->kind != b->kind)
        return "kind";
    if (a->hash_id != b->hash_id)
        return "hash";
    if (memcmp(a->secret, b->secret, BF_SECRET_LEN) != 0)
        return "secret";
    if (a->shard_count != b->shard_count)
        return "shard_count";
    if (a->shard_index != b->shard_index)
        return "shard_index";
    if (a->kind == BF_KIND_SCALABLE &&
        (a->growth != b->growth || a->tightening != b->tightening))
        return "growth";
    uint32_t n = bf__nlayers(a) < bf__nlayers(b) ? bf__nlayers(a) : bf__nlayers(b);
    for (uint32_t i = 0; i < n; i++) {
        if (a->layers[i].m != b->layers[i].m)
            return "bits";
        if (a->layers[i].k != b->layers[i].k)
            return "hashes";
    }
    return NULL;
}

static int check_mergeable(const struct bf *dst, const struct bf *src, char *err)
{
    const char *field = bf_mismatch(dst, src);

    if (!field)
        return 0;
    if (err)
        snprintf(err, BF_ERRLEN,
                 "filters are not compatible: %s differs (both must come from one "
                 "template, e.g. create --like)", field);
    return -EINVAL;
}

uint64_t bf_counters_add(uint64_t a, uint64_t b)
{
    uint64_t r = 0;

    for (int s = 0; s < 64; s += 4) {
        unsigned x = (unsigned)(a >> s & 15) + (unsigned)(b >> s & 15);
        r |= (uint64_t)(x > BF_COUNTER_MAX ? BF_COUNTER_MAX : x) << s;
    }
    return r;
}

/* Merge n words from src (unaligned bytes) into words [w0, w0 + n) of layer
 * d: OR, or for the counting kind saturating addition of the counters.
 * Words that add nothing are not written, and the rest are changed
 * atomically, so adds and queries may run meanwhile. */
static void merge_words(const struct bf *f, struct bf_layer *d, uint64_t w0,
                        const void *src, uint64_t n)
{
    const uint8_t *p = src;

    for (uint64_t j = 0; j < n; j++) {
        uint64_t sv, w = w0 + j;
        memcpy(&sv, p + 8 * j, 8);
        if (!sv)
            continue;
        if (f->kind == BF_KIND_COUNTING) {
            bf__stamp_word(f, d, w);
            uint64_t old = __atomic_load_n(&d->body[w], __ATOMIC_RELAXED);
            while (!__atomic_compare_exchange_n(&d->body[w], &old, bf_counters_add(old, sv),
                                                true, __ATOMIC_RELEASE, __ATOMIC_RELAXED))
                ;
        } else if (sv & ~__atomic_load_n(&d->body[w], __ATOMIC_RELAXED)) {
            bf__stamp_word(f, d, w);
            __atomic_fetch_or(&d->body[w], sv, __ATOMIC_RELEASE);
        }
    }
}

int bf_merge_project(const struct bf *dst, const struct bf *src,
                     struct bf_merge_projection *out, char *err)
{
    int rc = check_mergeable(dst, src, err);
    uint32_t nd = bf__nlayers(dst), ns = bf__nlayers(src);
    uint32_t n = nd > ns ? nd : ns;
    uint64_t bits = 0, set = 0;
    double not_fp = 1.0, count = 0.0;

    if (rc < 0)
        return rc;
    for (uint32_t i = 0; i < n; i++) {
        const struct bf_layer *a = i < nd ? &dst->layers[i] : NULL;
        const struct bf_layer *b = i < ns ? &src->layers[i] : NULL;
        const struct bf_layer *g = a ? a : b;
        uint64_t s = 0;
        for (uint64_t w = 0; w < g->words; w++) {
            uint64_t x = (a ? a->body[w] : 0) | (b ? b->body[w] : 0);
            if (dst->kind == BF_KIND_COUNTING)
                x = (x | x >> 1 | x >> 2 | x >> 3) & 0x1111111111111111ULL;
            s += (uint64_t)__builtin_popcountll(x);
        }
        double est = estimate_count(g->m, g->k, s);
        double fpr = s >= g->m ? 1.0 : bf_model_fpr(dst->kind, g->m, g->k, est);
        bits += g->m;
        set += s;
        count += est;
        not_fp *= 1.0 - fpr;
    }
    out->fill_ratio = bits ? (double)set / (double)bits : 0.0;
    out->estimated_fpr = 1.0 - not_fp;
    out->estimated_count = count;
    out->over_target = out->estimated_fpr > dst->error_rate;
    return 0;
}

int bf_merge_from(struct bf *dst, const struct bf *src, char *err)
{
    int rc = check_mergeable(dst, src, err);
    uint32_t nd = bf__nlayers(dst), ns = bf__nlayers(src);

    if (rc < 0)
        return rc;
    for (uint32_t i = 0; i < ns; i++) {
        const struct bf_layer *s = &src->layers[i];
        if (i >= nd) {
            /* A layer only the source has grown: append a copy. */
            struct bf_layer *d = &dst->layers[i];
            rc = bf__layer_init(d, dst->kind, s->capacity, s->error_rate, s->m, s->k, err);
            if (rc == 0 && dst->track && (rc = bf__layer_track(d)) < 0) {
                bf__layer_deinit(d);
                errmsg_set(err, "out of memory for the page versions of a layer");
            }
            if (rc < 0)
                return rc;
            memcpy(d->body, s->body, s->words * 8);
            for (uint64_t p = 0; p < d->npages; p++)
                d->pver[p] = dst->stamp;
            d->count = s->count;
            __atomic_store_n(&dst->nlayers, i + 1, __ATOMIC_RELEASE);
            continue;
        }
        struct bf_layer *d = &dst->layers[i];
        merge_words(dst, d, 0, s->body, d->words);
        /* The merged count is unknown; the larger one is a lower bound. */
        if (s->count > d->count)
            d->count = s->count;
    }
    bf_merge_counts(dst, src->inserts, bf_keys_added(src), NULL, 0);
    return 0;
}

/* bf_merge_file's scan: the file's counts, and the layers it appends. */
struct merge_file {
    struct bf *dst;
    uint32_t nd, ns;            /* dst's layers before, the file's */
    bool added;                 /* layers nd..ns-1 initialized */
    const char *field;          /* the fingerprint's field that differs */
    char *err;
    uint64_t inserts, keys, counts[BF_MAX_LAYERS];
};

static int merge_file_meta(void *ctx, const struct bf *f)
{
    struct merge_file *m = ctx;
    struct bf *dst = m->dst;

    if ((m->field = bf_mismatch(dst, f))) {
        check_mergeable(dst, f, m->err);
        return -EINVAL;
    }
    m->ns = bf__nlayers(f);
    m->inserts = f->inserts;
    m->keys = bf_keys_added(f);
    for (uint32_t i = 0; i < m->ns; i++)
        m->counts[i] = f->layers[i].count;
    /* Layers only the file has grown: made (not yet visible) before a bit
     * changes, so that memory running short changes nothing. */
    for (uint32_t i = m->nd; i < m->ns; i++) {
        const struct bf_layer *s = &f->layers[i];
        struct bf_layer *d = &dst->layers[i];
        int rc = bf__layer_init(d, dst->kind, s->capacity, s->error_rate, s->m, s->k,
                                m->err);
        if (rc == 0 && dst->track && (rc = bf__layer_track(d)) < 0) {
            bf__layer_deinit(d);
            errmsg_set(m->err, "out of memory for the page versions of a layer");
        }
        if (rc < 0) {
            while (i-- > m->nd)
                bf__layer_deinit(&dst->layers[i]);
            return rc;
        }
    }
    m->added = true;
    return 0;
}

static int merge_file_body(void *ctx, uint32_t layer, uint64_t offset,
                           const void *data, size_t len)
{
    struct merge_file *m = ctx;
    struct bf *dst = m->dst;
    struct bf_layer *d = &dst->layers[layer];

    if (layer >= m->nd)
        memcpy((uint8_t *)d->body + offset, data, len);
    else
        merge_words(dst, d, offset / 8, data, len / 8);
    return 0;
}

int bf_merge_file(struct bf *dst, const void *buf, size_t len, const char **field,
                  char *err)
{
    struct merge_file m = {.dst = dst, .nd = bf__nlayers(dst), .err = err};
    int rc = bf_file_scan_mem(buf, len, merge_file_meta, merge_file_body, &m, err);

    if (field)
        *field = m.field;
    if (rc < 0) {
        /* Only when buf was not verified first: the layers made for it go;
         * bits already merged into dst's own layers stay. */
        if (m.added)
            for (uint32_t i = m.nd; i < m.ns; i++)
                bf__layer_deinit(&dst->layers[i]);
        return rc;
    }
    for (uint32_t i = m.nd; i < m.ns; i++) {
        struct bf_layer *d = &dst->layers[i];
        for (uint64_t p = 0; d->pver && p < d->npages; p++)
            d->pver[p] = dst->stamp;
        d->count = m.counts[i];
        __atomic_store_n(&dst->nlayers, i + 1, __ATOMIC_RELEASE);
    }
    for (uint32_t i = 0; i < m.nd && i < m.ns; i++)
        if (m.counts[i] > dst->layers[i].count)
            dst->layers[i].count = m.counts[i];
    bf_merge_counts(dst, m.inserts, m.keys, NULL, 0);
    return 0;
}

void bf_merge_counts(struct bf *dst, uint64_t inserts, uint64_t keys,
                     const uint64_t *layer_counts, uint32_t nlayers)
{
    uint32_t nd = bf__nlayers(dst);

    for (uint32_t i = 0; i < nlayers && i < nd; i++)
        if (layer_counts[i] > dst->layers[i].count)
            dst->layers[i].count = layer_counts[i];
    /* inserts counts add operations, so the merge of partials built from
     * separate slices has the sum of theirs (saturating). */
    dst->inserts = dst->inserts > UINT64_MAX - inserts ? UINT64_MAX
                                                       : dst->inserts + inserts;
    /* So does the count of keys added (saturating; a file may claim any
     * count); an uncounted source leaves dst uncounted. */
    uint64_t dk = bf_keys_added(dst);
    if (keys != BF_KEYS_UNCOUNTED && dk != BF_KEYS_UNCOUNTED && keys > BF_KEYS_UNCOUNTED - 1 - dk)
        keys = BF_KEYS_UNCOUNTED - 1 - dk;
    bf__keys_add(dst, keys);
}
