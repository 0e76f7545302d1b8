/* bf_file: the bloomgrid filter file format (docs/FORMAT.md), save and load.
 *
 * A filter file is a little-endian header, one layer descriptor and body per
 * layer, and an XXH64 checksum over every byte before it.  Saving is atomic
 * (temp file in the same directory, fsync, rename, fsync of the directory).
 * Loading verifies magic, version, geometry, sizes, checksum and the zero
 * padding past m before returning anything: a bad file is refused whole, never loaded in part.
 * Files are read from format version BF_FILE_VERSION_MIN to
 * BF_FILE_VERSION: a version-1 file loads with its keys added
 * BF_KEYS_UNCOUNTED (bf.h), as that version did not record them.  A filter
 * that records a placement version (bf_placement, shards of filters placed
 * by a rule after rendezvous) is written in version 3, every other one in
 * version 2, which readers of version 2 still read.
 *
 * The same bytes can be produced into / parsed from memory or a stream, for
 * Export and Import over the network.
 *
 * Thread safety: saving or serializing reads the filter with plain loads; a
 * caller that needs a consistent point-in-time image must stop adds first or
 * work from a copy.  Errors: 0 or negative errno, and a sentence in err
 * (BF_ERRLEN bytes) naming the check that failed.
 */
#ifndef BLOOMGRID_BF_FILE_H
#define BLOOMGRID_BF_FILE_H

#include <stddef.h>
#include <stdint.h>

#include "bf.h"

#define BF_FILE_MAGIC "BLOOMGRD"     /* first 8 bytes, no terminator */
#define BF_FILE_VERSION 3         /* newest read and written; 2 added the
                                     keys-added count, 3 the placement */
#define BF_FILE_VERSION_PLAIN 2   /* written for filters without a placement */
#define BF_FILE_VERSION_MIN 1     /* oldest read (keys added: uncounted) */
#define BF_FILE_HEADER_BYTES 128     /* fixed header */
#define BF_FILE_LAYER_BYTES 48       /* one layer descriptor */

/* Exact size in bytes of the serialized form of f. */
uint64_t bf_file_size(const struct bf *f);

/* Write f to path atomically: a temp file "<path>.tmp.XXXXXX" in the same
 * directory, fsync, rename over path, fsync of the directory.  The new file
 * keeps the mode of the one it replaces (0644 when new).  On error the old
 * file at path, if any, is unchanged and no temp file is left behind; an
 * error in the final directory fsync is reported although the rename took
 * place. */
int bf_file_save(const struct bf *f, const char *path, char *err);

/* Load and verify a file.  Returns a new filter owned by the caller
 * (bf_destroy), or NULL with err set (and a negative errno in *code when code
 * is non-NULL) on any failed check.  The message starts with the check that
 * failed: "cannot open", "truncated", "bad size", "bad magic", "unsupported
 * version", "bad geometry", "checksum mismatch", "bad padding" or "read
 * failed".  Codes:
 * -EBADMSG for a corrupt or truncated file, -EPROTONOSUPPORT for another
 * format version, or the errno of a failed system call. */
struct bf *bf_file_load(const char *path, char *err, int *code);

/* Serialize f by calling write(ctx, buf, len) for consecutive pieces of at
 * most 8 MiB; buf is only valid during the call.  Returns 0, -ENOMEM, or the
 * first negative value write returns (serializing stops there).  The bytes
 * checksummed are exactly the bytes passed to write, so the output verifies
 * even when adds run concurrently (it is then not a point-in-time image). */
typedef int (*bf_file_writer)(void *ctx, const void *buf, size_t len);
int bf_file_write(const struct bf *f, bf_file_writer write, void *ctx);

/* bf_file_write for a filter that nothing changes during the call (a
 * private copy): the bodies are handed to write where they lie, without
 * the 8 MiB buffer that bf_file_write copies each piece into first. */
int bf_file_write_stable(const struct bf *f, bf_file_writer write, void *ctx);

/* The header and layer descriptors of f's file (BF_FILE_HEADER_BYTES +
 * nlayers * BF_FILE_LAYER_BYTES bytes, at most BF_FILE_META_MAX) into buf,
 * with nlayers <= bf_layer_count(f) (a scalable filter may grow meanwhile:
 * the caller counts once and then writes that many bodies).  Returns the
 * bytes written.  For writers that read the bodies themselves (a store
 * serializing its live filter a page at a time): the file is then these
 * bytes, the bodies of layers 0..nlayers-1, and the XXH64 (seed 0) of
 * everything before it, little-endian. */
#define BF_FILE_META_MAX (BF_FILE_HEADER_BYTES + BF_MAX_LAYERS * BF_FILE_LAYER_BYTES)
size_t bf_file_meta_encode(const struct bf *f, uint32_t nlayers, uint8_t *buf);

/* The counterpart: an empty filter (bodies zero) of the geometry, secret
 * and counts of the meta bytes buf (len bytes: a header and its layer
 * descriptors, as bf_file_meta_encode writes them; anything after them is
 * ignored), after the checks of a file's header and descriptors
 * (docs/FORMAT.md, checks 1-6 and 8).  *used (may be NULL) gets the bytes
 * read.  NULL with err on a failed check or no memory. */
struct bf *bf_file_meta_parse(const void *buf, size_t len, size_t *used,
                              char *err);

/* Read the filter file of len bytes at offset off of the open file fd (a
 * plain file: off 0 and its size; or one shard's entry of a shard bundle,
 * bundle_file_entry) a piece at a time, holding at most one piece of its
 * bodies (1 MiB), with every check of bf_file_load: meta(ctx, f) first
 * with an empty filter of its geometry, secret and counts (its bodies
 * never written, so not resident; valid during the call only), then
 * body(ctx, layer, offset, data, n) for consecutive pieces of each layer
 * body in order (data valid during the call only).  The checksum is
 * checked only at the end: the pieces are NOT verified when body gets
 * them, so a caller keeps them aside (a temp file) and uses them only once
 * the call returned 0.  A negative return of meta or body stops the scan
 * and is returned.  Returns 0, or a negative errno with err set as
 * bf_file_load.  Reads with pread: the file offset is not used. */
typedef int (*bf_file_meta_fn)(void *ctx, const struct bf *f);
typedef int (*bf_file_body_fn)(void *ctx, uint32_t layer, uint64_t offset,
                               const void *data, size_t len);
int bf_file_scan(int fd, uint64_t off, uint64_t len, bf_file_meta_fn meta,
                 bf_file_body_fn body, void *ctx, char *err);

/* bf_file_scan of a complete file held in memory (len bytes, nothing
 * more): the pieces are copied out of buf one at a time; meta and body may
 * be NULL (buf only verified). */
int bf_file_scan_mem(const void *buf, size_t len, bf_file_meta_fn meta,
                     bf_file_body_fn body, void *ctx, char *err);

/* Parse and verify a complete serialized file held in memory (len bytes,
 * nothing more).  Same checks and messages as bf_file_load; the buffer stays
 * the caller's and the returned filter is the caller's (bf_destroy). */
struct bf *bf_file_parse(const void *buf, size_t len, char *err);

#endif
