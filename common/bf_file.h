/* bf_file: the bloomgrid filter file format (docs/FORMAT.md), save and load.
 *
 * A filter file is a little-endian header, one layer descriptor and body per
 * layer, and an XXH64 checksum over every byte before it.  Saving is atomic
 * (temp file in the same directory, fsync, rename, fsync of the directory).
 * Loading verifies magic, version, geometry, sizes and checksum before
 * returning anything: a bad file is refused whole, never loaded in part.
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

/* Exact size in bytes of the serialized form of f. */
uint64_t bf_file_size(const struct bf *f);

/* Write f to path atomically.  On error the old file at path, if any, is
 * unchanged and no temp file is left behind. */
int bf_file_save(const struct bf *f, const char *path, char *err);

/* Load and verify a file.  Returns NULL with err set (and errno-style code in
 * *code when code is non-NULL) on any failed check. */
struct bf *bf_file_load(const char *path, char *err, int *code);

/* Serialize f by calling write(ctx, buf, len) for consecutive pieces; stops
 * and returns the first negative value write returns. */
typedef int (*bf_file_writer)(void *ctx, const void *buf, size_t len);
int bf_file_write(const struct bf *f, bf_file_writer write, void *ctx);

/* Parse and verify a complete serialized file held in memory. */
struct bf *bf_file_parse(const void *buf, size_t len, char *err);

#endif
