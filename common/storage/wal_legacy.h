/* wal_legacy: reading the per-filter write-ahead logs of earlier releases,
 * for the store's migration to the node log (docs/STORAGE.md, "Migration").
 *
 * Such a log is a filter directory's sequence of segments wal-<F>.log (F =
 * the first sequence number in it): a 32-byte header (magic "BGWALSEG",
 * version 1, F, XXH64 of the header) followed by records
 *
 *   0  u32 magic "BGWR"   4  u32 type     8  u64 payload length
 *   16 u64 seq            24 u64 commit   32 u64 XXH64(bytes 0..31, payload)
 *   40 payload
 *
 * with the record types of wal.h.  The torn-tail and corruption rules are
 * those of the node log, applied to one filter: a bad record with nothing
 * committed after it in the last segment is cut; any other damage, a gap
 * or a missing segment is refused.  Nothing here writes a legacy log.
 * Threads: any, on distinct directories.
 */
#ifndef BLOOMGRID_WAL_LEGACY_H
#define BLOOMGRID_WAL_LEGACY_H

#include <stdint.h>

#include "wal.h"

typedef int (*wal_legacy_fn)(void *ctx, uint32_t type, uint64_t seq,
                             const void *payload, uint64_t len);

struct wal_legacy_info {
    uint64_t next_seq;     /* seq the next record would have taken */
    uint64_t records;      /* records replayed (seq > after) */
    uint64_t truncated;    /* bytes of torn tail cut */
    uint32_t segments;     /* segments present */
};

/* Replay the legacy log in dir: fn for every record with seq > after, in
 * seq order; a torn tail of the last segment is cut (durably).  Returns 0;
 * -EBADMSG with file and offset in err for corruption, a gap or a missing
 * segment (no segment at all counts as missing); another negative errno
 * for I/O errors or fn's error. */
int wal_legacy_recover(const char *dir, uint64_t after, wal_legacy_fn fn,
                       void *ctx, struct wal_legacy_info *out, char *err);

/* Is name a legacy segment's file name (wal-<16 hex>.log)? */
bool wal_legacy_is_segment(const char *name);

#endif
