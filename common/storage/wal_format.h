/* wal_format: the byte layout of the node log's segments and records (see
 * wal.h), shared by the writer (wal.c) and the reader (wal_scan.c).  Not
 * part of the log's interface.
 */
#ifndef BLOOMGRID_WAL_FORMAT_H
#define BLOOMGRID_WAL_FORMAT_H

#include <endian.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "wal.h"

#define WAL_SEG_MAGIC "BGNODLOG"
/* Version 2 (written): the header names the segment's write unit; version 1
 * (read only): records follow the header, no unit, no padding. */
#define WAL_SEG_VERSION 2
#define WAL_SEG_VERSION_V1 1
#define WAL_REC_MAGIC UINT32_C(0x4E574742) /* "BGWN" little-endian */
#define WAL_PATH_LEN 4096
/* The room a segment is made with (wal.h) is a multiple of this: zeros at
 * the end of a segment of such a size are room, not a torn write. */
#define WAL_ROOM_UNIT (1u << 20)
/* Write units: a power of two in [WAL_UNIT_MIN, WAL_UNIT_MAX] (0 in a
 * segment's header: written without units, records right after it). */
#define WAL_UNIT_MIN 4096u
#define WAL_UNIT_MAX WAL_ROOM_UNIT
/* The padding record's type: no name, no stream, its payload not checked;
 * its LSN is that of the record after it, its commit stamp its group's. */
#define WAL_REC_PAD 0xFFFFu

/* Offsets inside a record header. */
enum {
    WAL_O_MAGIC = 0, WAL_O_TYPE = 4, WAL_O_NAMELEN = 6, WAL_O_LEN = 8,
    WAL_O_LSN = 16, WAL_O_COMMIT = 24, WAL_O_ID = 32, WAL_O_SEQ = 40,
    WAL_O_PSUM = 48, WAL_O_HSUM = 56,
};

static inline void wal__put16(uint8_t *p, uint16_t v)
{
    v = htole16(v);
    memcpy(p, &v, 2);
}

static inline void wal__put32(uint8_t *p, uint32_t v)
{
    v = htole32(v);
    memcpy(p, &v, 4);
}

static inline void wal__put64(uint8_t *p, uint64_t v)
{
    v = htole64(v);
    memcpy(p, &v, 8);
}

static inline uint16_t wal__get16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return le16toh(v);
}

static inline uint32_t wal__get32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return le32toh(v);
}

static inline uint64_t wal__get64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return le64toh(v);
}

/* The header checksum: bytes 0..55 chained into the name. */
static inline uint64_t wal__hdr_sum(const uint8_t *rec, size_t name_len)
{
    return XXH64(rec + WAL_REC_HDR, name_len, XXH64(rec, WAL_O_HSUM, 0));
}

static inline void wal__seg_name(char *buf, size_t len, uint64_t first)
{
    snprintf(buf, len, "wal-%016" PRIx64 ".log", first);
}

static inline bool wal__seg_parse_name(const char *name, uint64_t *first)
{
    char *end;

    if (strlen(name) != 24 || strncmp(name, "wal-", 4) != 0 ||
        strcmp(name + 20, ".log") != 0)
        return false;
    for (int i = 4; i < 20; i++)
        if (!strchr("0123456789abcdef", name[i]))
            return false;
    *first = strtoull(name + 4, &end, 16);
    return end == name + 20;
}

/* Where a segment's records start: after the header's unit (or right after
 * the header when it has none). */
static inline size_t wal__seg_start(uint32_t unit)
{
    return unit ? unit : WAL_SEG_HDR;
}

static inline void wal__seg_header(uint8_t *h, uint64_t first, uint32_t unit)
{
    memcpy(h, WAL_SEG_MAGIC, 8);
    wal__put32(h + 8, WAL_SEG_VERSION);
    wal__put32(h + 12, unit);
    wal__put64(h + 16, first);
    wal__put64(h + 24, XXH64(h, 24, 0));
}

/* A segment made over a spare (a discarded segment's file, wal.c) carries
 * a mark in its header's unit, after the 32-byte header (where a fresh
 * segment has zeros, and which readers of version 2 ignore): "BGREUSED"
 * and XXH64 of the unit's bytes 0..39, so that it holds only for this
 * header.  Its room after the last record may hold an earlier segment's
 * records (their LSNs below the segment's first) and the bytes of its
 * records from anywhere: wal_scan cuts that as room, not as a torn tail. */
#define WAL_REUSE_MAGIC "BGREUSED"
#define WAL_REUSE_END 48

static inline void wal__seg_reuse_mark(uint8_t *h, uint32_t unit)
{
    if (unit < WAL_REUSE_END)
        return;
    memcpy(h + WAL_SEG_HDR, WAL_REUSE_MAGIC, 8);
    wal__put64(h + WAL_SEG_HDR + 8, XXH64(h, WAL_SEG_HDR + 8, 0));
}

static inline bool wal__seg_reused(const uint8_t *m, size_t size,
                                   uint32_t unit)
{
    return unit >= WAL_REUSE_END && size >= WAL_REUSE_END &&
           memcmp(m + WAL_SEG_HDR, WAL_REUSE_MAGIC, 8) == 0 &&
           wal__get64(m + WAL_SEG_HDR + 8) == XXH64(m, WAL_SEG_HDR + 8, 0);
}

/* A segment file of a log directory (the node log's and the legacy
 * per-filter logs' names are the same). */
struct wal__seg {
    uint64_t first;
    char name[32];
};

/* The segments of dir sorted by first seq.  clean: remove leftover temp
 * files ".wal-*" (only when no log is open on dir).  A missing dir has
 * none.  0 or a negative errno; *out is malloc'd (may be NULL). */
int wal__seg_list(const char *dir, bool clean, struct wal__seg **out,
                  size_t *n);

/* Open a segment (for writing too when rw: a torn tail may be cut) and map
 * it read-only.  *fd is -1 and *m NULL when nothing is open; an empty file
 * maps to NULL.  0 or a negative errno with err naming the file. */
int wal__seg_map(const char *path, bool rw, int *fd, const uint8_t **m,
                 size_t *size, char *err);

/* Seek marks (wal.c): where a commit group's first record begins in a
 * segment, its LSN and offset, one every WAL_SEEK_STRIDE bytes or more
 * (the first that far past where the segment's records start), rising in
 * both.  A mark that finds no memory is left out (a scan then starts at
 * the mark before it, or at the segment's start). */
#define WAL_SEEK_STRIDE (256u << 10)

struct wal__seek {
    uint64_t lsn, off;
};

struct wal__marks {
    struct wal__seek *v;         /* malloc'd */
    size_t n, cap;
};

/* Keep a mark at the commit group that begins at off with LSN lsn in a
 * segment whose records start at start, when it is WAL_SEEK_STRIDE bytes
 * or more past the last mark (or start). */
static inline void wal__marks_add(struct wal__marks *m, uint64_t start,
                                  uint64_t lsn, uint64_t off)
{
    uint64_t prev = m->n ? m->v[m->n - 1].off : start;

    if (off < prev + WAL_SEEK_STRIDE)
        return;
    if (m->n == m->cap) {
        size_t cap = m->cap ? 2 * m->cap : 16;
        struct wal__seek *v = realloc(m->v, cap * sizeof(*v));
        if (!v)
            return;
        m->v = v;
        m->cap = cap;
    }
    m->v[m->n++] = (struct wal__seek){lsn, off};
}

/* What wal_open learns of a segment already there (wal__seg_read). */
struct wal__seg_info {
    uint64_t record_bytes;       /* records, padding not counted, and the
                                    32-byte header */
    uint64_t start;              /* where its records begin */
    struct wal__marks marks;     /* its seek marks (the caller frees v) */
};

/* Read the segment at path (size bytes, first LSN first) as wal_open
 * finds it: every record header, from its start up to the first bytes
 * that are no record of its own (a bad header, an LSN lower than the one
 * before: an earlier segment's, in one made over a spare).
 * record_bytes: for a segment that cannot be read, or from the first bad
 * record on, the file's bytes count.  marks: the seek marks of the
 * commit groups read, under the rule above, for records whose LSNs follow
 * one another from first on and are below below (where the next segment
 * or the log's next record begins: what recovery read as this segment's),
 * each at a record whose header and payload are intact; none after the
 * first record out of place or a bad header (scans there start at the
 * mark before, or at the segment's start), none for a segment whose
 * header is bad. */
void wal__seg_read(const char *path, uint64_t size, uint64_t first,
                   uint64_t below, struct wal__seg_info *out);

/* For wal_rescan: hold off discards; returns the durable LSN. */
uint64_t wal__rescan_begin(struct wal *w);
/* Where a rescan from LSN lsn may start in the segment that begins at
 * seg_first: the seek mark (wal.c) nearest before lsn, a record's LSN and
 * offset; false when that segment has none at or before lsn (lsn is in
 * its first stretch, or wal_open found no mark there: see wal__seg_read). */
bool wal__rescan_seek(struct wal *w, uint64_t seg_first, uint64_t lsn,
                      uint64_t *at_lsn, uint64_t *at_off);
void wal__rescan_end(struct wal *w, uint64_t read_bytes);

#endif
