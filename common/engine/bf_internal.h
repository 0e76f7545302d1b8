/* bf_internal: the layout of struct bf, shared by the engine's own files only
 * (bf.c, bf_ops.c, bf_merge.c).  Everyone else goes through bf.h. */
#ifndef BLOOMGRID_BF_INTERNAL_H
#define BLOOMGRID_BF_INTERNAL_H

#include <pthread.h>

#include "bf.h"

#define BF_XSECRET_LEN 192   /* XXH3 secret derived from the filter secret */

struct bf_layer {
    uint64_t capacity;
    double error_rate;
    uint64_t m;          /* bits, or counters for the counting kind */
    uint32_t k;
    uint8_t kmask;       /* one bit per probe among the first 8 (vector test) */
    uint64_t nblocks;    /* blocked kind: m / BF_BLOCK_BITS */
    uint64_t words;      /* 64-bit words in body */
    uint64_t *body;      /* bf__body_alloc's, map_bytes long */
    size_t map_bytes;
    bool cut;            /* cut from a shared chunk (bf_mem.c) */
    uint64_t count;      /* adds that changed this layer; atomic */
    uint64_t *pver;      /* page versions (bf_track_pages): one per
                            BF_PAGE_BYTES of body, mmap'd; NULL when the
                            filter is not tracked */
    uint64_t npages;     /* entries of pver */
    uint64_t *dirty;     /* one bit per page of pver: changed since the
                            last bf_fold_versions, its version not yet
                            written (calloc'd with pver) */
};

struct bf {
    unsigned char xsecret[BF_XSECRET_LEN] __attribute__((aligned(64)));
    enum bf_kind kind;
    uint32_t hash_id;
    uint64_t capacity;
    double error_rate;
    uint32_t shard_index;
    uint32_t shard_count;
    uint32_t placement;  /* bf_placement */
    double growth;
    double tightening;
    uint8_t secret[BF_SECRET_LEN];
    bool exclusive;
    bool track;          /* page versions kept (bf_track_pages) */
    uint64_t stamp;      /* the version later changes stamp; set by the
                            writer (bf_set_stamp) */
    uint32_t nlayers;    /* atomic: the scalable kind appends layers */
    uint64_t inserts;    /* adds that returned true; atomic */
    uint64_t keys;       /* every add (bf_keys_added); atomic */
    bool keys_uncounted; /* some adds were not counted; atomic, only ever
                            set (bf_set_counts may clear it) */
    pthread_mutex_t grow_lock;
    struct bf_layer layers[BF_MAX_LAYERS];
};

/* bf_mem.c: l->body (zeroed), l->map_bytes and l->cut for a body of
 * bytes: 0 or -errno; and its release (nothing without a body). */
int bf__body_alloc(struct bf_layer *l, uint64_t bytes);
void bf__body_free(struct bf_layer *l);

/* Geometry of scalable layer i of a filter with these parameters. */
void bf__scalable_layer_params(const struct bf *f, uint32_t i, uint64_t *capacity,
                               double *error_rate);

/* Allocate layer storage for (capacity, p) or for a given (m, k). */
int bf__layer_init(struct bf_layer *l, enum bf_kind kind, uint64_t capacity,
                   double p, uint64_t m, uint32_t k, char *err);
void bf__layer_deinit(struct bf_layer *l);


/* Count n more keys added: an atomic add unless f is exclusive (one locked
 * instruction, as for inserts; the uncounted state is a flag beside it).
 * n = BF_KEYS_UNCOUNTED makes the filter uncounted for good. */
void bf__keys_add(struct bf *f, uint64_t n);

/* Page versions (bf_pages.c): give layer l its version array (0 or
 * -ENOMEM), free it. */
int bf__layer_track(struct bf_layer *l);
void bf__layer_untrack(struct bf_layer *l);

/* Mark the page holding 64-bit word w of layer l as changed, when the
 * layer is tracked: one bit in a map of 1/32768 of the bits, which stays in
 * the cache where the versions (1/512) would not; bf_fold_versions writes
 * the versions of the marked pages later.  Readers of the versions
 * (checkpoints, page pulls) synchronize through the writer's lock. */
static inline void bf__stamp_word(const struct bf *f, struct bf_layer *l, uint64_t w)
{
    (void)f;
    if (l->dirty) {
        uint64_t p = w >> (BF_PAGE_SHIFT - 3);
        uint64_t *d = &l->dirty[p >> 6], b = 1ULL << (p & 63);
        /* An atomic OR even for an exclusive writer (a threaded replay's
         * threads share the words at the edges of their ranges); it runs
         * once per page between folds, every later add only reads. */
        if (!(__atomic_load_n(d, __ATOMIC_RELAXED) & b))
            __atomic_fetch_or(d, b, __ATOMIC_RELAXED);
    }
}

static inline uint32_t bf__nlayers(const struct bf *f)
{
    return __atomic_load_n(&f->nlayers, __ATOMIC_ACQUIRE);
}

#endif
