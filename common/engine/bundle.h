/* bundle: the shard bundle, one file holding every shard of a sharded
 * filter, as a router exports and imports it and the offline tool reads and
 * writes it.  The layout is documented once, in docs/FORMAT.md ("Shard
 * bundle"): "BGSHARDS", u32 version, u32 shard count S, then per shard a u32
 * index, a u64 length L and L bytes of that shard's filter file, in shard
 * order, and an XXH3-64 of every byte before it; integers little-endian.
 *
 * Two levels.  The layout level knows the frame and nothing of the filters
 * inside: a writer emits header, entries and trailer through a callback
 * while it checksums (a router streams each shard's bytes in as a node sends
 * them), and bundle_layout_parse verifies a buffer and hands out each shard's
 * bytes without parsing them (a router forwards them to the nodes).  The
 * parsed level, struct bundle, holds every shard as a filter (the offline
 * commands).  At that level a plain filter file is a bundle of one shard; the
 * bundle remembers the form it was read in, and saving writes that form
 * again, so a plain file stays a plain file and a bundle stays a bundle.
 *
 * Threads: no shared state; one thread at a time per object.  Errors: 0 or a
 * negative errno (NULL for constructors) and a sentence in err (BF_ERRLEN
 * bytes) that starts with the check that failed: "bad magic", "truncated",
 * "unsupported version", "checksum mismatch", "bad bundle", "shard N: <the
 * filter file's own reason>", or the failing step of a load or save.
 */
#ifndef BLOOMGRID_BUNDLE_H
#define BLOOMGRID_BUNDLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bf.h"
#include "bf_file.h"

#define BUNDLE_MAGIC "BGSHARDS"      /* first 8 bytes, no terminator */
#define BUNDLE_VERSION 1
#define BUNDLE_HEAD_BYTES 16         /* magic, version, S */
#define BUNDLE_ENTRY_BYTES 12        /* index, length */
#define BUNDLE_TRAILER_BYTES 8       /* XXH3-64 */

/* True when the buffer (the file at path) starts with the bundle magic.  A
 * file that cannot be read is not a bundle. */
bool bundle_is(const void *buf, size_t len);
bool bundle_file_is(const char *path);

/* ---- layout level: writing ------------------------------------------- */

struct XXH3_state_s;

/* Writes one bundle through write(ctx, ...) and refuses to write a bundle
 * that would not parse: entries must come in shard order, each followed by
 * exactly the bytes it announced. */
struct bundle_writer {
    bf_file_writer write;
    void *ctx;
    struct XXH3_state_s *xx;   /* running checksum of every byte written */
    uint32_t count;            /* S, from the header */
    uint32_t entries;          /* entries begun */
    uint64_t left;             /* bytes the current entry still needs */
};

/* Write the header of a bundle of count (> 0) shards.  Returns 0, -EINVAL,
 * -ENOMEM or what write returned; on error nothing needs freeing. */
int bundle_writer_begin(struct bundle_writer *w, uint32_t count,
                        bf_file_writer write, void *ctx);

/* Begin the entry of shard index, len bytes long.  -EINVAL unless index is
 * the next shard and the previous entry got all its bytes. */
int bundle_writer_entry(struct bundle_writer *w, uint32_t index, uint64_t len);

/* Bytes of the current entry (ctx is the writer: a bf_file_writer, so
 * bf_file_write can serialize a shard straight in).  -EINVAL for more bytes
 * than the entry announced. */
int bundle_writer_data(void *ctx, const void *buf, size_t len);

/* Write the trailer.  -EINVAL if an entry is missing or incomplete.  The
 * writer is finished either way (no bundle_writer_abort needed). */
int bundle_writer_end(struct bundle_writer *w);

/* Give up on a bundle begun (after a failed write); safe after _end. */
void bundle_writer_abort(struct bundle_writer *w);

/* ---- layout level: reading ------------------------------------------- */

/* Shard i's filter file: len bytes at file, inside the parsed buffer. */
struct bundle_entry {
    const uint8_t *file;
    uint64_t len;
};

struct bundle_layout {
    uint32_t count;                 /* S */
    struct bundle_entry *entry;     /* S entries, shard i at i */
};

/* Verify the frame of the bundle in buf (len bytes, nothing more): magic,
 * size, version, checksum, a shard count that fits, every entry's index (in
 * order) and length (inside the bundle), no bytes after the last shard.
 * The shard files are not parsed.  Returns 0 and fills out (entries point
 * into buf; free with bundle_layout_deinit), or -EBADMSG (damaged, truncated
 * or not a bundle), -EPROTONOSUPPORT (another version) or -ENOMEM, with err
 * set. */
int bundle_layout_parse(const void *buf, size_t len, struct bundle_layout *out,
                        char *err);
void bundle_layout_deinit(struct bundle_layout *l);

/* Where shard index's filter file lies in the bundle file fd of size
 * bytes, found without reading the shards' bytes: the frame's magic,
 * version, shard count and every entry header up to it (in order, each
 * inside the bundle) are checked as bundle_layout_parse does, and the
 * entries after it too (no bytes after the last one), but NOT the
 * bundle's trailer (an XXH3-64 of the whole file, which only a read of
 * every shard can check): the shard's own file checksum (bf_file_scan)
 * covers its bytes.  Reads with pread.  Returns 0 with *count (S), *off
 * and *len; -ERANGE when index >= S (*count set); or -EBADMSG /
 * -EPROTONOSUPPORT / the errno of a failed read, with err set. */
int bundle_file_entry(int fd, uint64_t size, uint32_t index, uint32_t *count,
                      uint64_t *off, uint64_t *len, char *err);

/* Verify the file at path as bundle_load would (a shard bundle: its frame,
 * its trailer checksum, each shard's file and its index, count and secret;
 * a plain filter file: as bf_file_load) without loading it: reads it a
 * piece at a time (1 MiB), holding no filter's bits.  Returns 0, or a
 * negative errno with err set (bundle_load's messages). */
int bundle_file_verify(const char *path, char *err);

/* bundle_file_verify, with each shard described on the way: fn(ctx, index,
 * count, f) for shard index of count (a plain filter file: index 0 of 1)
 * with an empty filter of its geometry, secret and counts (bf_file_scan's
 * meta: its bodies never written, valid during the call only; the file's
 * checksums are checked after it, so what fn keeps is true only when the
 * call returns 0), and fp_out (may be NULL) gets the whole file's
 * fingerprint id, as bundle_fingerprint_id of the loaded file.  fn may be
 * NULL; its negative return stops the read and is returned.  Returns 0, or
 * a negative errno with err set (bundle_load's messages). */
typedef int (*bundle_meta_fn)(void *ctx, uint32_t index, uint32_t count,
                              const struct bf *f);
int bundle_file_describe(const char *path, bundle_meta_fn fn, void *ctx,
                         char fp_out[17], char *err);

/* The first field in which the parsed shard file f is not shard index of
 * count with this secret: "secret", "shard_index", "shard_count"; NULL when
 * it is.  The rule every reader of a bundle applies to each shard. */
const char *bundle_shard_mismatch(const struct bf *f, uint32_t index,
                                  uint32_t count, const uint8_t *secret);

/* ---- parsed level ----------------------------------------------------- */

struct bundle {
    uint32_t count;         /* shards; 1 for a plain filter file */
    bool plain;             /* read as (and saved as) one filter file */
    struct bf **shard;      /* count filters, shard i at i */
};

/* Parse and verify a bundle, or a plain filter file (a bundle of one,
 * plain).  A bundle's shards must each parse (bf_file_parse) and pass
 * bundle_shard_mismatch with shard 0's secret.  Returns a bundle owned by
 * the caller (bundle_destroy), or NULL with err set; the buffer stays the
 * caller's. */
struct bundle *bundle_parse(const void *buf, size_t len, char *err);

/* bundle_parse of the file at path.  A plain file is read by bf_file_load
 * (same messages, "cannot open: ..." for a missing file). */
struct bundle *bundle_load(const char *path, char *err);

/* A plain bundle of one filter.  Takes f (destroyed on failure, too). */
struct bundle *bundle_of_filter(struct bf *f, char *err);

/* An empty bundle of the same form, geometry and secret as tmpl (as
 * bf_create_like for each shard). */
struct bundle *bundle_create_like(const struct bundle *tmpl, char *err);

/* Serialize in the bundle's form: a plain bundle as its filter file
 * (bf_file_write), otherwise the whole shard bundle.  0, -ENOMEM or the
 * first error write returns. */
int bundle_write(const struct bundle *b, bf_file_writer write, void *ctx);

/* Write to path atomically (common/base/durable.h: temp file, fsync, rename,
 * directory fsync); a plain bundle is exactly bf_file_save of its filter.
 * The file keeps the mode of the one it replaces (0644 when new).  Returns
 * 0 or a negative errno with err set; on error an existing file at path is
 * unchanged. */
int bundle_save(const struct bundle *b, const char *path, char *err);

void bundle_destroy(struct bundle *b);

/* The fingerprint id of the whole filter, as its server's FilterInfo shows
 * it: a plain bundle's is its filter's bf_fingerprint_id (a node's); a
 * shard bundle's is the XXH3-64 (seed 0) of every shard's id with its NUL,
 * in shard order, in 16 hex digits (a router's, router_rpc.c). */
void bundle_fingerprint_id(const struct bundle *b, char out[17]);

/* bf_set_exclusive for every shard. */
void bundle_set_exclusive(struct bundle *b, bool exclusive);

/* Hash a key (every shard has the same secret). */
static inline struct bf_hash bundle_hash(const struct bundle *b,
                                         const void *key, size_t len)
{
    return bf_hash_key(b->shard[0], key, len);
}

/* The shard filter a key's hash belongs to (bf_hash_shard of the count). */
static inline struct bf *bundle_shard_of(const struct bundle *b,
                                         struct bf_hash h)
{
    return b->shard[bf_hash_shard(h, b->count)];
}

/* Add keys, each to its shard; query keys (out[i] as bf_may_contain).  A
 * bundle of one shard takes the batched, prefetching filter calls. */
void bundle_add_keys(struct bundle *b, const void *const *keys,
                     const size_t *lens, size_t n);
void bundle_may_contain_keys(const struct bundle *b, const void *const *keys,
                             const size_t *lens, size_t n, bool *out);

#endif
