/* bf: the Bloom-filter engine (blocked, classic, counting and scalable kinds).
 *
 * A struct bf owns one filter in memory: its parameters, its secret and one or
 * more layers of bits (counters for the counting kind).  Non-scalable kinds have
 * exactly one layer; the scalable kind grows a chain of blocked layers, each
 * with a larger capacity and a tighter error rate.
 *
 * Hashing: every key is hashed once with XXH3-128 keyed by the filter's secret,
 * giving a struct bf_hash {h1, h2}.  The bits are split so that the choices are
 * independent (docs/FORMAT.md has the exact formulas):
 *   - h1           picks the block (blocked) / the start position (classic,
 *                  counting), with a fast range reduction of its high bits;
 *   - low 32 of h2 is the double-hashing stride (and, with the low 32 bits of
 *                  h1, the in-block positions of the blocked kind);
 *   - high 32 of h2 are reserved for shard selection (bf_hash_shard) and are
 *                  never used to place bits.
 *
 * Concurrency: any number of threads may add and query one filter at once
 * without a lock (atomic ORs on 64-bit words, plain loads for queries), unless
 * the filter was switched to single-writer mode with bf_set_exclusive().  The
 * scalable kind takes a mutex only to append a layer.  bf_merge_from may
 * run while others add and query (it ORs atomically), but not alongside
 * another merge into the same filter; bf_destroy needs the caller to
 * exclude every other user.
 *
 * Memory: layer bodies are mmap'd anonymous memory with MADV_HUGEPAGE; they
 * are never copied in normal operation.
 *
 * Errors: functions return 0 or a negative errno; constructors return a
 * pointer or NULL and, where they take one, fill a caller's error buffer with
 * a sentence a person can act on.
 */
#ifndef BLOOMGRID_BF_H
#define BLOOMGRID_BF_H

#include "errmsg.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define BF_SECRET_LEN 32       /* bytes of per-filter secret */
#define BF_HASH_XXH3_128 1     /* the only hash id so far */
#define BF_MAX_LAYERS 48       /* scalable chain length limit */
#define BF_PLACEMENT_MAX 255u   /* bf_params.placement */
#define BF_GROWTH_MAX 16.0     /* scalable: largest growth factor (smallest 1),
                                  for bf_create and for every file read */
#define BF_BLOCK_BITS 512      /* one 64-byte cache line */
#define BF_COUNTER_BITS 4      /* counting kind: 4-bit saturating counters */
#define BF_COUNTER_MAX 15
#define BF_ERRLEN ERRMSG_LEN          /* size of error buffers */
#define BF_KEYS_UNCOUNTED UINT64_MAX  /* bf_keys_added: not every add counted */
#define BF_PAGE_SHIFT 12              /* page versions: pages of 4 KiB */
#define BF_PAGE_BYTES (1u << BF_PAGE_SHIFT)

enum bf_kind {
    BF_KIND_BLOCKED = 1,
    BF_KIND_CLASSIC = 2,
    BF_KIND_COUNTING = 3,
    BF_KIND_SCALABLE = 4,
};

struct bf_hash {
    uint64_t h1;
    uint64_t h2;
};

/* Creation parameters.  Zero fields take defaults (see bf_params_default). */
struct bf_params {
    enum bf_kind kind;
    uint64_t capacity;      /* n: keys the filter is sized for (> 0) */
    double error_rate;      /* p: target false-positive rate, in (0, 1) */
    uint32_t shard_index;   /* which shard this filter is (0 for unsharded) */
    uint32_t shard_count;   /* how many shards the logical filter has (>= 1) */
    double growth;          /* scalable: capacity factor per layer, 1..BF_GROWTH_MAX
                               (default 2) */
    double tightening;      /* scalable: error factor per layer (default 0.5) */
    const uint8_t *secret;  /* BF_SECRET_LEN bytes, or NULL for random */
    uint32_t placement;     /* the placement version of the sharded filter
                               this is a shard of (docs/TOPOLOGY.md), kept
                               with it but not part of the fingerprint; 0:
                               not recorded (rendezvous), at most
                               BF_PLACEMENT_MAX */
};

/* Geometry of one layer, as stored in a filter file. */
struct bf_layer_info {
    uint64_t capacity;    /* keys this layer is sized for */
    double error_rate;    /* this layer's target FPR */
    uint64_t m;           /* bits (counters for counting) */
    uint32_t k;           /* probes per key */
    uint64_t count;       /* adds that changed this layer ("added" == true) */
    uint64_t body_bytes;  /* size of the layer's body */
};

/* Everything that must be equal for two filters to be merged. */
struct bf_fingerprint {
    enum bf_kind kind;
    uint32_t hash_id;
    uint64_t m;           /* first layer */
    uint32_t k;           /* first layer */
    uint32_t shard_index;
    uint32_t shard_count;
    uint8_t secret[BF_SECRET_LEN];
};

/* Estimates computed by scanning the bits (O(m) time). */
struct bf_stats {
    uint64_t bits;            /* total bits (counters for counting) */
    uint64_t bytes;           /* total body bytes */
    uint64_t set;             /* bits set (counters > 0) */
    double fill_ratio;        /* set / bits */
    double estimated_count;   /* n-hat = -(m/k) ln(1 - X/m), summed per layer */
    double estimated_fpr;     /* current FPR estimate from the fill */
    double bits_per_key;      /* bits / capacity */
    bool over_capacity;       /* n-hat exceeds capacity, or FPR exceeds p */
    uint32_t layers;
};

struct bf;

/* Fill unset fields of *p with defaults: kind blocked, shard 0 of 1, growth 2,
 * tightening 0.5.  Does not touch capacity or error_rate. */
void bf_params_default(struct bf_params *p);

/* Check parameters without allocating anything.  Returns 0 or -EINVAL with a
 * message in err (BF_ERRLEN bytes, may be NULL). */
int bf_params_check(const struct bf_params *p, char *err);

/* Create an empty filter.  Returns NULL with a message in err on bad
 * parameters (-EINVAL) or when memory cannot be had. */
struct bf *bf_create(const struct bf_params *p, char *err);

/* Create an empty filter with the same kind, geometry and secret as tmpl (and
 * the same scalable layer chain parameters), so the two can be merged. */
struct bf *bf_create_like(const struct bf *tmpl, char *err);

/* Free a filter and its bodies.  NULL is allowed. */
void bf_destroy(struct bf *f);

/* Switch single-writer mode on or off.  In exclusive mode adds use plain
 * (relaxed atomic) stores instead of locked ORs, which is several times
 * faster: at most one thread may then add at a time (callers serialize adds,
 * e.g. with a mutex per filter, amortized over a batch), while any number of
 * threads may still query. */
void bf_set_exclusive(struct bf *f, bool exclusive);

/* Page versions: which pages of the bodies changed, and when.
 *
 * A tracked filter keeps, per BF_PAGE_BYTES page of each layer body, the
 * version of the last change to it: every change to the bits (add, remove,
 * merge, bf_stamp_range) stamps the pages it changed with the filter's
 * current version, which the one writer sets with bf_set_stamp before it
 * changes anything (a store sets the sequence number of the log record
 * the change goes into).  Versions a writer sets only grow, so a page
 * changed after a reader took version V (under the writer's lock) carries
 * a version above V from then on: a reader that next walks the pages whose
 * version is above V finds every change since, and any number of readers
 * can each keep their own V, with nothing ever cleared.  Costs 8 bytes per
 * page (1/512 of the bits) plus a bit per page.
 *
 * An add, remove or merge marks the pages it changes in a bitmap of one bit
 * per page (small enough to stay in the cache, where a store into the
 * versions would miss it on nearly every add of a large filter);
 * bf_fold_versions(f, V) writes version V into every marked page and
 * clears the marks.  Until then bf_page_version answers the writer's
 * current version for a marked page (never lower than that of its
 * change), so no reader misses a change whenever folds happen; a reader
 * that takes its cursor V under the writer's lock folds at V there, so
 * that pages changed before V read as V from then on, not as later
 * versions (which would make it take them again next time).
 *
 * bf_track_pages switches tracking on (versions 0, every layer, and every
 * layer a scalable filter appends later) or off; returns 0 or -ENOMEM.
 * Not alongside writers.  Filters are created untracked.  On a tracked
 * filter a page of version 0 is taken for zeros and not read by the
 * statistics (bf_stats, bf_stats_sampled), so that untouched bits stay
 * untouched: whoever switches tracking on over bits already set stamps
 * their pages (bf_stamp_range) before asking for statistics. */
int bf_track_pages(struct bf *f, bool on);
bool bf_tracked(const struct bf *f);
/* The version later changes stamp (the writer's; not alongside a change). */
void bf_set_stamp(struct bf *f, uint64_t version);
/* Pages of layer i (the last one may be short), and the version of page p
 * of it (0 when never changed since tracking started, or untracked). */
uint64_t bf_layer_pages(const struct bf *f, uint32_t i);
uint64_t bf_page_version(const struct bf *f, uint32_t i, uint64_t p);
/* True when page p of layer i is tracked and was never written (version 0,
 * not marked changed): its bits are zeros and need not be read.  False on
 * an untracked layer or past its end. */
bool bf_page_unwritten(const struct bf *f, uint32_t i, uint64_t p);
/* Write version into every page marked changed since the last fold and
 * clear the marks; returns the pages folded.  The writer's (not alongside
 * a change); version must be at least that of every change marked, e.g.
 * the log's last sequence number taken under the writer's lock. */
uint64_t bf_fold_versions(struct bf *f, uint64_t version);
/* Stamp the pages of bytes [off, off + len) of layer i as changed now (for
 * a caller that changed the bits through bf_layer_body). */
void bf_stamp_range(struct bf *f, uint32_t i, uint64_t off, uint64_t len);
/* Bytes the versions and marks take (about bf_bytes / 512 when tracked,
 * else 0). */
uint64_t bf_tracking_bytes(const struct bf *f);

/* Queries of blocked (and scalable) filters use AVX-512 when the CPU has
 * AVX-512F and DQ, unless BLOOMGRID_NO_AVX512 is set in the environment; the
 * answers are the same either way.  enable = 1 or 0 switches the vector
 * probes on (where supported) or off for the whole process, -1 only asks.
 * Returns whether they are in use. */
bool bf_vector_probes(int enable);

/* Hash a key with the filter's secret. */
struct bf_hash bf_hash_key(const struct bf *f, const void *key, size_t len);

/* The shard (0..shard_count-1) a hash belongs to: uses only the high 32 bits
 * of h2, which never place bits. */
static inline uint32_t bf_hash_shard(struct bf_hash h, uint32_t shard_count)
{
    return (uint32_t)(((h.h2 >> 32) * (uint64_t)shard_count) >> 32);
}

/* Single-key operations.  add returns true when the key was definitely absent
 * before (at least one bit/counter went from 0 to set). */
bool bf_add(struct bf *f, const void *key, size_t len);
bool bf_may_contain(const struct bf *f, const void *key, size_t len);
bool bf_add_hash(struct bf *f, struct bf_hash h);
bool bf_may_contain_hash(const struct bf *f, struct bf_hash h);

/* Batched operations; they prefetch ahead.  out may be NULL for adds.
 * keys[i] has lens[i] bytes. */
void bf_add_hashes(struct bf *f, const struct bf_hash *h, size_t n, bool *out);

/* bf_add_hashes for a long batch whose order does not matter to the caller
 * (recovery replaying the log): the blocked kind sorts h (in place, stably,
 * by the top 16 bits of each key's block) so that the adds walk
 * the bits front to back instead of missing the TLB on nearly every key;
 * the bits set and the count of keys added are those of bf_add_hashes in
 * the original order (keys of one block keep their order).  Other kinds
 * add in order.  tmp holds n hashes (scratch, the caller's).  Same threads
 * as bf_add_hashes. */
void bf_add_hashes_sweep(struct bf *f, struct bf_hash *h, size_t n,
                         struct bf_hash *tmp);
/* bf_add_hashes_sweep on up to threads threads (the caller's and up to
 * threads - 1 it starts and joins before it returns; at least 4096 hashes
 * each, at most 16): the blocked kind's sort is split by chunks of h and
 * its adds by ranges of blocks, so no two threads write one block.  The
 * same bits, page versions and counts as bf_add_hashes_sweep for any
 * number of threads.  A thread that cannot be started has its share run by
 * the caller; no error.  Threads as bf_add_hashes: an exclusive filter
 * (bf_set_exclusive) has no other writer meanwhile, the call's own threads
 * writing disjoint blocks. */
void bf_add_hashes_sweep_mt(struct bf *f, struct bf_hash *h, size_t n,
                            struct bf_hash *tmp, unsigned threads);
/* Start loading the first cache line h touches in f (for a caller that
 * spreads a batch over several filters, as a shard bundle does, and calls
 * the single-hash forms a few hashes behind).  Changes nothing. */
void bf_prefetch_hash(const struct bf *f, struct bf_hash h);
void bf_may_contain_hashes(const struct bf *f, const struct bf_hash *h, size_t n,
                           bool *out);
void bf_add_keys(struct bf *f, const void *const *keys, const size_t *lens,
                 size_t n, bool *out);
void bf_may_contain_keys(const struct bf *f, const void *const *keys,
                         const size_t *lens, size_t n, bool *out);

/* Counting kind only.  Returns 0 when the key's counters were decremented,
 * -ENOENT when the key is definitely absent (nothing changed), -EOPNOTSUPP
 * for other kinds.  Saturated counters (BF_COUNTER_MAX) never decrement. */
int bf_remove(struct bf *f, const void *key, size_t len);
int bf_remove_hash(struct bf *f, struct bf_hash h);

/* Accessors. */
enum bf_kind bf_kind(const struct bf *f);
uint64_t bf_capacity(const struct bf *f);
double bf_error_rate(const struct bf *f);
uint32_t bf_shard_index(const struct bf *f);
uint32_t bf_shard_count(const struct bf *f);
/* The placement version recorded with the filter (bf_params.placement; 0:
 * not recorded).  bf_create_like copies it; a merge keeps dst's. */
uint32_t bf_placement(const struct bf *f);
double bf_growth(const struct bf *f);
double bf_tightening(const struct bf *f);
/* Adds that returned true: keys that set at least one bit (new keys,
 * except those whose bits were already set: a false positive at add
 * time).  A merge adds the source's count. */
uint64_t bf_insert_count(const struct bf *f);
/* Keys added: every key of every add since the filter was created empty,
 * whether or not it set a bit (repeats and false positives included), so
 * a filter built from a list of N keys says N.  A merge adds the source's
 * count: merged partials say how many keys their builds read in all (a
 * key in two partials counts twice; estimated_count estimates the
 * distinct keys).  Removes do not lower it.  BF_KEYS_UNCOUNTED when some
 * adds were not counted: the filter, or one merged into it, was read from
 * a file of format version 1, which did not record it. */
uint64_t bf_keys_added(const struct bf *f);
const uint8_t *bf_secret(const struct bf *f);   /* BF_SECRET_LEN bytes */
void bf_fingerprint(const struct bf *f, struct bf_fingerprint *fp);
/* Short printable id of the fingerprint (hex of a hash of it; never reveals
 * the secret).  buf must hold 17 bytes. */
void bf_fingerprint_id(const struct bf *f, char buf[17]);

uint32_t bf_layer_count(const struct bf *f);
/* Scalable: the body bytes of the layers that n more adds could make the
 * filter append (each add assumed to be new; 0 when n fits in the newest
 * layer's room, and for every other kind).  For budgets checked before a
 * write. */
uint64_t bf_growth_bytes(const struct bf *f, uint64_t n);
int bf_layer_info(const struct bf *f, uint32_t i, struct bf_layer_info *out);
/* The body of layer i: body_bytes bytes of 64-bit little-endian words.  The
 * pointer stays owned by the filter. */
uint64_t *bf_layer_body(struct bf *f, uint32_t i);
const uint64_t *bf_layer_body_const(const struct bf *f, uint32_t i);
/* Bodies of less than 2 MiB are cut from chunks of 2 MiB shared by the
 * process's filters and advised for transparent huge pages, so that many
 * small filters or shards do not miss the TLB on every key; bigger ones are
 * mappings of their own in whole 2 MiB pages.  The chunks mapped now. */
size_t bf_body_chunks(void);

/* Scan the bits and compute estimates. */
void bf_stats(const struct bf *f, struct bf_stats *out);
/* The same from a sample: a layer of more than max_words words is read in
 * evenly spaced runs of 64 words, max_words in all, placed by seed, and
 * its set bits scaled up (the standard error of the fill is about
 * sqrt(fill (1 - fill) / (64 max_words)), a little more for blocked
 * filters, whose bits cluster in blocks).  Layers of at most max_words are
 * read whole, as bf_stats does.  For gauges kept without a full scan. */
void bf_stats_sampled(const struct bf *f, uint64_t max_words, uint64_t seed,
                      struct bf_stats *out);

/* The textbook / model FPR a layer geometry gives at n keys. */
double bf_model_fpr(enum bf_kind kind, uint64_t m, uint32_t k, double n);

/* Compare fingerprints.  Returns NULL when the filters may be merged, or the
 * name of the first mismatching field, checked in this order: "kind", "hash",
 * "secret", "shard_count", "shard_index", "growth" (scalable), then per layer
 * "bits" and "hashes".  Filters with different secrets never share a
 * template, so "secret" is reported before any geometry difference. */
const char *bf_mismatch(const struct bf *a, const struct bf *b);

/* Projection of merging src into dst, without changing anything. */
struct bf_merge_projection {
    double fill_ratio;
    double estimated_fpr;
    double estimated_count;
    bool over_target;     /* projected FPR above the filter's error rate */
};
int bf_merge_project(const struct bf *dst, const struct bf *src,
                     struct bf_merge_projection *out, char *err);

/* Sixteen 4-bit counters (a word of a counting layer's body) added to
 * sixteen others, each saturating at BF_COUNTER_MAX: how a merge combines
 * counting filters. */
uint64_t bf_counters_add(uint64_t a, uint64_t b);

/* OR src into dst (counting: saturating add).  Scalable: layers are merged
 * one by one and layers dst lacks are appended.  The insert count and the
 * keys added of src are added to dst's.  Returns -EINVAL with the
 * mismatching field named in err when the fingerprints differ; dst is then
 * untouched. */
int bf_merge_from(struct bf *dst, const struct bf *src, char *err);

/* bf_merge_from of a serialized filter file held in memory (len bytes,
 * nothing more), read a piece (1 MiB) at a time: the file is never
 * materialized as a filter, so the merge holds the file's bytes and one
 * piece.  *field (when field is not NULL) is the fingerprint's field that
 * differs (-EINVAL, dst untouched), else NULL.  The file is checked as it
 * is read (bf_file_scan_mem), its checksum at the end: a caller that must
 * not merge a bad file in part verifies buf first (bf_file_scan_mem with
 * no callbacks), as a failure after the first piece leaves the bits merged
 * so far in dst (the layers it would have appended are not). */
int bf_merge_file(struct bf *dst, const void *buf, size_t len, const char **field,
                  char *err);

/* The counts part of bf_merge_from alone, for a merge whose bits are ORed
 * in pieces (an Import applied a page at a time): inserts and keys (keys
 * BF_KEYS_UNCOUNTED: dst becomes uncounted) are added to dst's
 * (saturating), and each of the first nlayers layers of dst gets the larger
 * of its count and layer_counts[i] (the merged count is unknown; the
 * larger is a lower bound).  Not alongside adds to the same layers' counts
 * by another merge (the caller excludes merges, as for bf_merge_from). */
void bf_merge_counts(struct bf *dst, uint64_t inserts, uint64_t keys,
                     const uint64_t *layer_counts, uint32_t nlayers);

/* Build a filter from its stored parts (used by the file loader).  Layer
 * bodies are allocated empty; the caller fills bf_layer_body().  Returns NULL
 * with err on impossible geometry. */
struct bf *bf_assemble(const struct bf_params *p, uint32_t hash_id,
                       uint32_t nlayers, const struct bf_layer_info *layers,
                       char *err);

/* Set the insert counter, the keys added (BF_KEYS_UNCOUNTED allowed) and
 * the per-layer counts (file loader, copies).  Not alongside adds. */
void bf_set_counts(struct bf *f, uint64_t inserts, uint64_t keys,
                   const uint64_t *layer_counts);

/* The body bytes a filter created with p would have (bf_create makes the
 * same geometry), without allocating anything: 0, or -EINVAL when p cannot
 * make a filter. */
int bf_params_bytes(const struct bf_params *p, uint64_t *bytes);

/* Body bytes of every layer f has now (no scan). */
uint64_t bf_bytes(const struct bf *f);

/* The expected body size in bytes of a layer of the given kind and m. */
uint64_t bf_body_bytes(enum bf_kind kind, uint64_t m);

/* Geometry for (capacity, p) of a kind: m and k.  Returns 0 or -EINVAL. */
int bf_size_for(enum bf_kind kind, uint64_t capacity, double p, uint64_t *m,
                uint32_t *k);

/* Names. */
const char *bf_kind_name(enum bf_kind kind);
int bf_kind_parse(const char *name, enum bf_kind *out);

#endif
