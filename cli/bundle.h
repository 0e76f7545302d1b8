/* bundle: the shard bundle, one file holding every shard of a sharded filter,
 * as a router exports and imports it.
 *
 *   "BGSHARDS"  u32 version (1)  u32 S
 *   S times:    u32 shard index  u64 length L  L bytes: the shard's filter
 *               file (docs/FORMAT.md), in shard order 0..S-1
 *   u64 XXH3-64 (seed 0) of every byte before it
 *
 * all integers little-endian.  A key belongs to shard bf_hash_shard(h, S) of
 * its hash h under the filter's secret, which every shard shares, so the
 * offline commands can query a bundle and build partial bundles (--like)
 * that a router imports.  Single-threaded; errors as in bf_file.h (a
 * sentence in err, BF_ERRLEN bytes).
 */
#ifndef BLOOMGRID_BUNDLE_H
#define BLOOMGRID_BUNDLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bf.h"

#define BUNDLE_MAGIC "BGSHARDS"
#define BUNDLE_VERSION 1

struct bundle {
    uint32_t count;
    struct bf **shard;      /* count filters, shard i at index i */
};

/* True when the file at path (or the buffer) starts with the bundle magic. */
bool bundle_file_is(const char *path);
bool bundle_is(const void *buf, size_t len);

/* Parse and verify a whole bundle: layout, checksum, every shard file
 * (bf_file_parse), shard index i at position i, shard count S everywhere,
 * one secret.  Returns a bundle owned by the caller (bundle_destroy) or NULL
 * with err set. */
struct bundle *bundle_parse(const void *buf, size_t len, char *err);
struct bundle *bundle_load(const char *path, char *err);

/* An empty bundle with the geometry and secret of tmpl (as bf_create_like
 * for each shard).  NULL with err on failure. */
struct bundle *bundle_create_like(const struct bundle *tmpl, char *err);

/* Write atomically (temp file, fsync, rename, fsync of the directory).
 * Returns 0 or a negative errno with err set. */
int bundle_save(const struct bundle *b, const char *path, char *err);

void bundle_destroy(struct bundle *b);

/* The shard filter a key's hash belongs to. */
static inline struct bf *bundle_shard_of(const struct bundle *b,
                                         struct bf_hash h)
{
    return b->shard[bf_hash_shard(h, b->count)];
}

/* Hash a key (every shard has the same secret). */
static inline struct bf_hash bundle_hash(const struct bundle *b,
                                         const void *key, size_t len)
{
    return bf_hash_key(b->shard[0], key, len);
}

/* Add keys, each to its shard; query keys (out[i] as bf_may_contain). */
void bundle_add_keys(struct bundle *b, const void *const *keys,
                     const size_t *lens, size_t n);
void bundle_may_contain_keys(const struct bundle *b, const void *const *keys,
                             const size_t *lens, size_t n, bool *out);

#endif
