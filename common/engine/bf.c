/* bf.c: filter lifecycle, parameters, sizing and accessors.
 *
 * Sizing.  The classic and counting kinds use the textbook optimum
 * m = -n ln p / (ln 2)^2 and k = round((m/n) ln 2).  The blocked kind puts all
 * k probes in one 512-bit block, so its false-positive rate is not the
 * textbook one: the number of keys that land in a block varies (Poisson with
 * mean n/blocks), and overloaded blocks dominate.  Its rate is the mixture
 *     FPR = sum_l Poisson(l; n/blocks) * sum_d P(d | k) * (1 - (1 - 1/512)^(k l))^d,
 * where P(d | k) is the chance that a query's k probes fall on d distinct
 * bits; bf_model_fpr evaluates it.  bf_size_for searches, for every k, the
 * smallest number of blocks whose modelled rate is at most p (minus a small
 * margin for the in-block double hashing), and keeps the smallest filter.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "errmsg.h"
#include "bf_internal.h"

/* The blocked kind is sized for p * BF_BLOCKED_MARGIN by the model so that the
 * measured rate stays below p: double hashing inside a block is slightly
 * worse than independent probes. */
#define BF_BLOCKED_MARGIN 0.94
#define BF_MAX_BITS (1ULL << 46)   /* 8 TiB of bits: refuse anything larger */

const char *bf_kind_name(enum bf_kind kind)
{
    switch (kind) {
    case BF_KIND_BLOCKED: return "blocked";
    case BF_KIND_CLASSIC: return "classic";
    case BF_KIND_COUNTING: return "counting";
    case BF_KIND_SCALABLE: return "scalable";
    }
    return "unknown";
}

int bf_kind_parse(const char *name, enum bf_kind *out)
{
    static const enum bf_kind kinds[] = {BF_KIND_BLOCKED, BF_KIND_CLASSIC,
                                         BF_KIND_COUNTING, BF_KIND_SCALABLE};

    for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
        if (strcmp(name, bf_kind_name(kinds[i])) == 0) {
            *out = kinds[i];
            return 0;
        }
    }
    return -EINVAL;
}

void bf_params_default(struct bf_params *p)
{
    if (!p->kind)
        p->kind = BF_KIND_BLOCKED;
    if (!p->shard_count)
        p->shard_count = 1;
    if (p->growth == 0)
        p->growth = 2.0;
    if (p->tightening == 0)
        p->tightening = 0.5;
}

int bf_params_check(const struct bf_params *p, char *err)
{
    if (p->kind < BF_KIND_BLOCKED || p->kind > BF_KIND_SCALABLE) {
        errmsg_set(err, "unknown filter kind %d (expected blocked, classic, counting or scalable)",
                   (int)p->kind);
        return -EINVAL;
    }
    if (p->capacity == 0) {
        errmsg_set(err, "capacity must be at least 1 key");
        return -EINVAL;
    }
    if (!(p->error_rate > 0.0 && p->error_rate < 1.0)) {
        errmsg_set(err, "error rate must be strictly between 0 and 1 (got %g)", p->error_rate);
        return -EINVAL;
    }
    if (p->error_rate < 1e-12) {
        errmsg_set(err, "error rate %g is below the supported minimum 1e-12", p->error_rate);
        return -EINVAL;
    }
    if (p->shard_count == 0 || p->shard_index >= p->shard_count) {
        errmsg_set(err, "shard index %u must be below shard count %u", p->shard_index,
                   p->shard_count);
        return -EINVAL;
    }
    if (p->placement > BF_PLACEMENT_MAX) {
        errmsg_set(err, "placement version %u is above %u", p->placement,
                   BF_PLACEMENT_MAX);
        return -EINVAL;
    }
    if (p->kind == BF_KIND_SCALABLE) {
        if (!(p->growth >= 1.0 && p->growth <= BF_GROWTH_MAX)) {
            errmsg_set(err, "growth factor must be between 1 and %g (got %g)", BF_GROWTH_MAX,
                       p->growth);
            return -EINVAL;
        }
        if (!(p->tightening > 0.0 && p->tightening < 1.0)) {
            errmsg_set(err, "tightening ratio must be strictly between 0 and 1 (got %g)",
                       p->tightening);
            return -EINVAL;
        }
    }
    return 0;
}

/* P(a query's k probes hit exactly d distinct bits of a block), d = 0..k:
 * duplicate probes check fewer bits, which matters at high k. */
static void distinct_probes(uint32_t k, double *pd)
{
    double next[65];

    memset(pd, 0, (k + 1) * sizeof(double));
    pd[0] = 1.0;
    for (uint32_t j = 0; j < k; j++) {
        memset(next, 0, (k + 1) * sizeof(double));
        for (uint32_t d = 0; d <= j; d++) {
            next[d] += pd[d] * (double)d / BF_BLOCK_BITS;
            next[d + 1] += pd[d] * (double)(BF_BLOCK_BITS - d) / BF_BLOCK_BITS;
        }
        memcpy(pd, next, (k + 1) * sizeof(double));
    }
}

static double probe_fpr(const double *pd, uint32_t k, double fill)
{
    double sum = 0.0, q = 1.0;

    for (uint32_t d = 1; d <= k; d++) {
        q *= fill;
        sum += pd[d] * q;
    }
    return sum;
}

/* Poisson mixture over block loads; see the comment at the top of the file. */
static double blocked_fpr(uint64_t nblocks, uint32_t k, double n)
{
    double pd[65];
    double lambda = n / (double)nblocks;
    double keep = 1.0 - 1.0 / BF_BLOCK_BITS;
    double hi = lambda + 12.0 * sqrt(lambda) + 32.0;
    double sum = 0.0, weight = 0.0;
    /* Start from the mode and walk both ways to avoid underflow of e^-lambda. */
    uint64_t mode = (uint64_t)lambda;
    double logp_mode = -lambda + (double)mode * log(lambda > 0 ? lambda : 1) -
                       lgamma((double)mode + 1.0);
    double pm = exp(logp_mode);
    double pl = pm;

    if (lambda <= 0 || k > 64)
        return 0.0;
    distinct_probes(k, pd);
    for (uint64_t l = mode; (double)l <= hi; l++) {
        double fill = 1.0 - pow(keep, (double)k * (double)l);
        sum += pl * probe_fpr(pd, k, fill);
        weight += pl;
        pl *= lambda / (double)(l + 1);
    }
    pl = pm;
    double lo = lambda - 12.0 * sqrt(lambda) - 32.0;
    for (uint64_t l = mode; l > 0 && (double)l > lo; l--) {
        pl *= (double)l / lambda;
        double fill = 1.0 - pow(keep, (double)k * (double)(l - 1));
        sum += pl * probe_fpr(pd, k, fill);
        weight += pl;
    }
    return weight > 0 ? sum / weight : sum;
}

double bf_model_fpr(enum bf_kind kind, uint64_t m, uint32_t k, double n)
{
    if (m == 0 || k == 0)
        return 1.0;
    if (n <= 0)
        return 0.0;
    if (kind == BF_KIND_BLOCKED || kind == BF_KIND_SCALABLE)
        return blocked_fpr(m / BF_BLOCK_BITS, k, n);
    return pow(1.0 - exp(-(double)k * n / (double)m), (double)k);
}

static int size_blocked(uint64_t n, double p, uint64_t *m_out, uint32_t *k_out)
{
    double target = p * BF_BLOCKED_MARGIN;
    uint64_t best_blocks = 0;
    uint32_t best_k = 0;

    /* A blocked filter never needs fewer bits than the textbook optimum, so
     * the search starts there (and the mixture stays short: ~50 keys/block). */
    double ln2 = log(2.0);
    uint64_t floor_blocks = (uint64_t)(-(double)n * log(p) / (ln2 * ln2) / BF_BLOCK_BITS);

    if (floor_blocks < 1)
        floor_blocks = 1;
    for (uint32_t k = 1; k <= 24; k++) {
        /* Binary search the smallest block count meeting the target. */
        uint64_t lo = floor_blocks, hi = floor_blocks;
        while (blocked_fpr(hi, k, (double)n) > target) {
            if (hi > BF_MAX_BITS / BF_BLOCK_BITS)
                break;
            lo = hi;
            hi *= 2;
        }
        if (blocked_fpr(hi, k, (double)n) > target)
            continue;
        while (lo < hi) {
            uint64_t mid = lo + (hi - lo) / 2;
            if (blocked_fpr(mid, k, (double)n) <= target)
                hi = mid;
            else
                lo = mid + 1;
        }
        if (!best_blocks || hi < best_blocks) {
            best_blocks = hi;
            best_k = k;
        }
    }
    if (!best_blocks)
        return -EINVAL;
    *m_out = best_blocks * BF_BLOCK_BITS;
    *k_out = best_k;
    return 0;
}

int bf_size_for(enum bf_kind kind, uint64_t capacity, double p, uint64_t *m,
                uint32_t *k)
{
    if (capacity == 0 || !(p > 0 && p < 1))
        return -EINVAL;
    if (kind == BF_KIND_BLOCKED || kind == BF_KIND_SCALABLE)
        return size_blocked(capacity, p, m, k);

    double ln2 = log(2.0);
    double bits = ceil(-(double)capacity * log(p) / (ln2 * ln2));
    if (bits > (double)BF_MAX_BITS)
        return -EINVAL;
    uint64_t mm = ((uint64_t)bits + 63) & ~63ULL;
    long kk = lround((double)mm / (double)capacity * ln2);
    *m = mm;
    *k = (uint32_t)(kk < 1 ? 1 : kk > 32 ? 32 : kk);
    return 0;
}

uint64_t bf_body_bytes(enum bf_kind kind, uint64_t m)
{
    uint64_t bits = kind == BF_KIND_COUNTING ? m * BF_COUNTER_BITS : m;
    return ((bits + 511) / 512) * 64;
}

int bf__layer_init(struct bf_layer *l, enum bf_kind kind, uint64_t capacity,
                   double p, uint64_t m, uint32_t k, char *err)
{
    memset(l, 0, sizeof(*l));
    if (m == 0 && bf_size_for(kind, capacity, p, &m, &k) < 0) {
        errmsg_set(err, "cannot size a %s filter for %llu keys at error rate %g: too large",
                   bf_kind_name(kind), (unsigned long long)capacity, p);
        return -EINVAL;
    }
    if (m == 0 || m > BF_MAX_BITS || k == 0 || k > 64) {
        errmsg_set(err, "impossible geometry: %llu bits, %u hashes", (unsigned long long)m, k);
        return -EINVAL;
    }
    if ((kind == BF_KIND_BLOCKED || kind == BF_KIND_SCALABLE) && m % BF_BLOCK_BITS) {
        errmsg_set(err, "impossible geometry: %llu bits is not a whole number of 512-bit blocks",
                   (unsigned long long)m);
        return -EINVAL;
    }
    l->capacity = capacity;
    l->error_rate = p;
    l->m = m;
    l->k = k;
    l->kmask = (uint8_t)(k >= 8 ? 0xff : (1u << k) - 1);
    l->nblocks = m / BF_BLOCK_BITS;
    uint64_t bytes = bf_body_bytes(kind, m);
    l->words = bytes / 8;
    int rc = bf__body_alloc(l, bytes);
    if (rc < 0) {
        errmsg_set(err, "cannot allocate %llu bytes for the filter: %s",
                   (unsigned long long)bytes, strerror(-rc));
        return -ENOMEM;
    }
    return 0;
}

void bf__layer_deinit(struct bf_layer *l)
{
    bf__layer_untrack(l);
    bf__body_free(l);
}

static void layer_params(uint64_t capacity, double p, double growth, double tightening,
                         uint32_t i, uint64_t *cap_out, double *p_out)
{
    double cap = (double)capacity * pow(growth, (double)i);
    *cap_out = cap > 1e18 ? (uint64_t)1e18 : (uint64_t)ceil(cap);
    /* Errors p(1-r), p(1-r)r, p(1-r)r^2, ... sum to at most p. */
    *p_out = p * (1.0 - tightening) * pow(tightening, (double)i);
}

void bf__scalable_layer_params(const struct bf *f, uint32_t i, uint64_t *capacity,
                               double *error_rate)
{
    layer_params(f->capacity, f->error_rate, f->growth, f->tightening, i, capacity,
                 error_rate);
}

uint64_t bf_growth_bytes(const struct bf *f, uint64_t n)
{
    if (f->kind != BF_KIND_SCALABLE || n == 0)
        return 0;
    uint32_t i = bf__nlayers(f);
    const struct bf_layer *last = &f->layers[i - 1];
    uint64_t count = __atomic_load_n(&last->count, __ATOMIC_RELAXED);
    uint64_t room = last->capacity > count ? last->capacity - count : 0;
    uint64_t bytes = 0;

    /* A layer is appended as soon as the newest one reaches its capacity:
     * the add that fills it already grows the filter. */
    if (n < room)
        return 0;
    uint64_t left = n - room;
    for (; i < BF_MAX_LAYERS; i++) {
        uint64_t cap, m;
        double rate;
        uint32_t k;
        bf__scalable_layer_params(f, i, &cap, &rate);
        if (bf_size_for(f->kind, cap, rate, &m, &k) < 0)
            break;
        bytes += bf_body_bytes(f->kind, m);
        if (left < cap)
            break;
        left -= cap;
    }
    return bytes;
}

int bf_params_bytes(const struct bf_params *params, uint64_t *bytes)
{
    struct bf_params p = *params;
    uint64_t cap, m;
    double rate;
    uint32_t k;

    bf_params_default(&p);
    if (bf_params_check(&p, NULL) < 0)
        return -EINVAL;
    cap = p.capacity;
    rate = p.error_rate;
    if (p.kind == BF_KIND_SCALABLE)
        layer_params(p.capacity, p.error_rate, p.growth, p.tightening, 0, &cap, &rate);
    if (bf_size_for(p.kind, cap, rate, &m, &k) < 0 || m > BF_MAX_BITS)
        return -EINVAL;
    *bytes = bf_body_bytes(p.kind, m);
    return 0;
}

uint64_t bf_bytes(const struct bf *f)
{
    uint64_t total = 0;

    uint32_t n = bf__nlayers(f);

    for (uint32_t i = 0; i < n; i++)
        total += f->layers[i].words * 8;
    return total;
}

static struct bf *bf_alloc(const struct bf_params *p, uint32_t hash_id, char *err)
{
    struct bf *f;

    if (bf_params_check(p, err) < 0)
        return NULL;
    if (hash_id != BF_HASH_XXH3_128) {
        errmsg_set(err, "unknown hash id %u", hash_id);
        return NULL;
    }
    if (posix_memalign((void **)&f, 64, sizeof(*f)) != 0) {
        errmsg_set(err, "out of memory");
        return NULL;
    }
    memset(f, 0, sizeof(*f));
    f->kind = p->kind;
    f->hash_id = hash_id;
    f->capacity = p->capacity;
    f->error_rate = p->error_rate;
    f->shard_index = p->shard_index;
    f->shard_count = p->shard_count;
    f->placement = p->placement;
    f->growth = p->kind == BF_KIND_SCALABLE ? p->growth : 0;
    f->tightening = p->kind == BF_KIND_SCALABLE ? p->tightening : 0;
    if (p->secret) {
        memcpy(f->secret, p->secret, BF_SECRET_LEN);
    } else if (getrandom(f->secret, BF_SECRET_LEN, 0) != BF_SECRET_LEN) {
        errmsg_set(err, "cannot read random bytes for the secret: %s", strerror(errno));
        free(f);
        return NULL;
    }
    XXH3_generateSecret(f->xsecret, BF_XSECRET_LEN, f->secret, BF_SECRET_LEN);
    pthread_mutex_init(&f->grow_lock, NULL);
    return f;
}

struct bf *bf_create(const struct bf_params *params, char *err)
{
    struct bf_params p = *params;
    struct bf *f;
    uint64_t cap;
    double rate;

    bf_params_default(&p);
    f = bf_alloc(&p, BF_HASH_XXH3_128, err);
    if (!f)
        return NULL;
    cap = f->capacity;
    rate = f->error_rate;
    if (f->kind == BF_KIND_SCALABLE)
        bf__scalable_layer_params(f, 0, &cap, &rate);
    if (bf__layer_init(&f->layers[0], f->kind, cap, rate, 0, 0, err) < 0)
        goto fail;
    f->nlayers = 1;
    return f;
fail:
    bf_destroy(f);
    return NULL;
}

static void bf_params_of(const struct bf *f, struct bf_params *p)
{
    memset(p, 0, sizeof(*p));
    p->kind = f->kind;
    p->capacity = f->capacity;
    p->error_rate = f->error_rate;
    p->shard_index = f->shard_index;
    p->shard_count = f->shard_count;
    p->placement = f->placement;
    p->growth = f->growth;
    p->tightening = f->tightening;
    p->secret = f->secret;
}

struct bf *bf_create_like(const struct bf *tmpl, char *err)
{
    struct bf_params p;
    struct bf_layer_info li;

    bf_params_of(tmpl, &p);
    bf_layer_info(tmpl, 0, &li);
    li.count = 0;
    return bf_assemble(&p, tmpl->hash_id, 1, &li, err);
}

struct bf *bf_assemble(const struct bf_params *p, uint32_t hash_id, uint32_t nlayers,
                       const struct bf_layer_info *layers, char *err)
{
    struct bf *f;

    if (nlayers == 0 || nlayers > BF_MAX_LAYERS ||
        (p->kind != BF_KIND_SCALABLE && nlayers != 1)) {
        errmsg_set(err, "impossible geometry: %u layers for a %s filter", nlayers,
                   bf_kind_name(p->kind));
        return NULL;
    }
    f = bf_alloc(p, hash_id, err);
    if (!f)
        return NULL;
    for (uint32_t i = 0; i < nlayers; i++) {
        const struct bf_layer_info *li = &layers[i];
        if (li->m == 0 || li->k == 0) {
            errmsg_set(err, "impossible geometry: layer %u has %llu bits and %u hashes", i,
                       (unsigned long long)li->m, li->k);
            goto fail;
        }
        if (li->body_bytes && li->body_bytes != bf_body_bytes(p->kind, li->m)) {
            errmsg_set(err, "impossible geometry: layer %u body is %llu bytes, %llu bits need %llu",
                       i, (unsigned long long)li->body_bytes, (unsigned long long)li->m,
                       (unsigned long long)bf_body_bytes(p->kind, li->m));
            goto fail;
        }
        if (bf__layer_init(&f->layers[i], f->kind, li->capacity, li->error_rate, li->m,
                           li->k, err) < 0)
            goto fail;
        f->layers[i].count = li->count;
        f->nlayers = i + 1;
    }
    return f;
fail:
    bf_destroy(f);
    return NULL;
}

void bf_set_counts(struct bf *f, uint64_t inserts, uint64_t keys,
                   const uint64_t *layer_counts)
{
    f->inserts = inserts;
    f->keys = keys == BF_KEYS_UNCOUNTED ? 0 : keys;
    f->keys_uncounted = keys == BF_KEYS_UNCOUNTED;
    for (uint32_t i = 0; layer_counts && i < f->nlayers; i++)
        f->layers[i].count = layer_counts[i];
}

void bf_destroy(struct bf *f)
{
    if (!f)
        return;
    for (uint32_t i = 0; i < BF_MAX_LAYERS; i++)
        bf__layer_deinit(&f->layers[i]);
    pthread_mutex_destroy(&f->grow_lock);
    free(f);
}

void bf_set_exclusive(struct bf *f, bool exclusive)
{
    f->exclusive = exclusive;
}

enum bf_kind bf_kind(const struct bf *f) { return f->kind; }
uint64_t bf_capacity(const struct bf *f) { return f->capacity; }
double bf_error_rate(const struct bf *f) { return f->error_rate; }
uint32_t bf_shard_index(const struct bf *f) { return f->shard_index; }
uint32_t bf_shard_count(const struct bf *f) { return f->shard_count; }
uint32_t bf_placement(const struct bf *f) { return f->placement; }
double bf_growth(const struct bf *f) { return f->growth; }
double bf_tightening(const struct bf *f) { return f->tightening; }
const uint8_t *bf_secret(const struct bf *f) { return f->secret; }
uint32_t bf_layer_count(const struct bf *f) { return bf__nlayers(f); }

uint64_t bf_insert_count(const struct bf *f)
{
    return __atomic_load_n(&f->inserts, __ATOMIC_RELAXED);
}

uint64_t bf_keys_added(const struct bf *f)
{
    uint64_t k = __atomic_load_n(&f->keys, __ATOMIC_RELAXED);

    if (__atomic_load_n(&f->keys_uncounted, __ATOMIC_RELAXED))
        return BF_KEYS_UNCOUNTED;
    return k < BF_KEYS_UNCOUNTED ? k : BF_KEYS_UNCOUNTED - 1;
}

void bf__keys_add(struct bf *f, uint64_t n)
{
    if (n == BF_KEYS_UNCOUNTED)
        __atomic_store_n(&f->keys_uncounted, true, __ATOMIC_RELAXED);
    else if (f->exclusive)
        f->keys += n;
    else
        __atomic_add_fetch(&f->keys, n, __ATOMIC_RELAXED);
}

void bf_fingerprint(const struct bf *f, struct bf_fingerprint *fp)
{
    memset(fp, 0, sizeof(*fp));
    fp->kind = f->kind;
    fp->hash_id = f->hash_id;
    fp->m = f->layers[0].m;
    fp->k = f->layers[0].k;
    fp->shard_index = f->shard_index;
    fp->shard_count = f->shard_count;
    memcpy(fp->secret, f->secret, BF_SECRET_LEN);
}

void bf_fingerprint_id(const struct bf *f, char buf[17])
{
    struct bf_fingerprint fp;

    bf_fingerprint(f, &fp);
    /* A one-way hash: the id can be shown and compared, the secret stays hidden. */
    uint64_t id = XXH3_64bits_withSeed(&fp, sizeof(fp), 0x626c6f6f6d677269ULL);
    snprintf(buf, 17, "%016llx", (unsigned long long)id);
}

int bf_layer_info(const struct bf *f, uint32_t i, struct bf_layer_info *out)
{
    if (i >= bf__nlayers(f))
        return -ERANGE;
    const struct bf_layer *l = &f->layers[i];
    out->capacity = l->capacity;
    out->error_rate = l->error_rate;
    out->m = l->m;
    out->k = l->k;
    out->count = __atomic_load_n(&l->count, __ATOMIC_RELAXED);
    out->body_bytes = l->words * 8;
    return 0;
}

uint64_t *bf_layer_body(struct bf *f, uint32_t i)
{
    return i < bf__nlayers(f) ? f->layers[i].body : NULL;
}

const uint64_t *bf_layer_body_const(const struct bf *f, uint32_t i)
{
    return i < bf__nlayers(f) ? f->layers[i].body : NULL;
}
