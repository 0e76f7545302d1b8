/* unit_wal: where the records of a node log segment are, read from the file
 * with the layout of docs/STORAGE.md ("The node log"), independently of the
 * log's own reader, for the unit suites that damage log files on purpose;
 * and a torn write of the log's next append (unit_wal_torn_write).
 * Header-only.
 */
#ifndef BLOOMGRID_UNIT_WAL_H
#define BLOOMGRID_UNIT_WAL_H

#include <check.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#define UNIT_WAL_PAD 0xFFFFu

/* One record (or padding record) of a segment. */
struct unit_wal_rec {
    off_t off;
    uint64_t size;        /* header, name and payload */
    uint16_t type;        /* UNIT_WAL_PAD for padding */
    uint64_t lsn, commit, seq;
};

static inline uint64_t unit_wal__le(const unsigned char *p, int n)
{
    uint64_t v = 0;

    for (int i = n - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/* The segment's write unit (0 for version 1 or none). */
static inline uint32_t unit_wal_unit(const char *path)
{
    unsigned char h[32];
    int fd = open(path, O_RDONLY);

    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(pread(fd, h, 32, 0), 32);
    close(fd);
    ck_assert_int_eq(memcmp(h, "BGNODLOG", 8), 0);
    return unit_wal__le(h + 8, 4) == 1 ? 0 : (uint32_t)unit_wal__le(h + 12, 4);
}

/* The records of the segment at path in file order, up to the first bytes
 * that are not a record header (room, a tear); padding included when pad.
 * Returns how many (at most max are stored). */
static inline size_t unit_wal_records(const char *path, bool pad,
                                      struct unit_wal_rec *out, size_t max)
{
    uint32_t unit = unit_wal_unit(path);
    off_t off = unit ? unit : 32;
    unsigned char h[64];
    size_t n = 0;
    int fd = open(path, O_RDONLY);

    ck_assert_int_ge(fd, 0);
    while (pread(fd, h, 64, off) == 64 && memcmp(h, "BGWN", 4) == 0) {
        struct unit_wal_rec r = {
            .off = off,
            .size = 64 + unit_wal__le(h + 6, 2) + unit_wal__le(h + 8, 8),
            .type = (uint16_t)unit_wal__le(h + 4, 2),
            .lsn = unit_wal__le(h + 16, 8),
            .commit = unit_wal__le(h + 24, 8),
            .seq = unit_wal__le(h + 40, 8),
        };
        if (pad || r.type != UNIT_WAL_PAD) {
            if (n < max)
                out[n] = r;
            n++;
        }
        off += (off_t)r.size;
    }
    close(fd);
    return n;
}

/* The offset of the record of LSN lsn in the segment at path (fails the
 * test when there is none). */
static inline off_t unit_wal_offset(const char *path, uint64_t lsn)
{
    struct unit_wal_rec v[4096];
    size_t n = unit_wal_records(path, false, v, 4096);

    for (size_t i = 0; i < n && i < 4096; i++)
        if (v[i].lsn == lsn)
            return v[i].off;
    ck_abort_msg("no record of LSN %llu in %s", (unsigned long long)lsn, path);
    return -1;
}

/* Where the last record (padding included) of the segment ends. */
static inline off_t unit_wal_end(const char *path)
{
    struct unit_wal_rec v[4096];
    size_t n = unit_wal_records(path, true, v, 4096);
    uint32_t unit = unit_wal_unit(path);

    ck_assert_uint_le(n, 4096);
    return n ? v[n - 1].off + (off_t)v[n - 1].size : (unit ? unit : 32);
}

/* ---- torn writes ---- */

/* How a power loss on a device that writes a unit only in part may leave
 * one unit that a write in flight touches: all zeros, its first 512-byte
 * sector garbled, or half of it new and half as it was. */
enum { UNIT_WAL_TEAR_ZERO, UNIT_WAL_TEAR_GARBLE, UNIT_WAL_TEAR_HALF_NEW,
       UNIT_WAL_TEAR_HALF_OLD, UNIT_WAL_TEARS };

static inline const char *unit_wal_tear_name(int mode)
{
    static const char *const names[] = {"zeroed", "garbled",
                                        "first half new", "second half new"};
    return mode >= 0 && mode < UNIT_WAL_TEARS ? names[mode] : "?";
}

/* Which unit (0: the one holding the write's first byte) of u bytes, and
 * how (UNIT_WAL_TEAR_*), unit_wal_torn_write tears. */
static struct {
    int unit, mode;
    uint32_t u;
} unit_wal_tear;

static inline void unit_wal__pread(int fd, unsigned char *p, size_t len, off_t at)
{
    memset(p, 0, len);   /* past the end of the file: zeros */
    if (pread(fd, p, len, at) < 0)
        _exit(4);
}

/* A wal__write for the log's next append, in a child process that stands
 * for the machine: write it, tear unit unit_wal_tear.unit of the units it
 * touches, and lose power before the fsync (the process exits 0); exit 3
 * when the write touches fewer units. */
static inline ssize_t unit_wal_torn_write(int fd, const void *buf, size_t len)
{
    uint32_t tu = unit_wal_tear.u;
    char self[64];
    int rw;

    /* The log's descriptor may be write-only: read through another. */
    snprintf(self, sizeof(self), "/proc/self/fd/%d", fd);
    if ((rw = open(self, O_RDWR)) < 0)
        _exit(4);
    off_t at = lseek(fd, 0, SEEK_CUR);
    off_t first = at / tu * tu;
    off_t end = (at + (off_t)len + tu - 1) / tu * tu;
    off_t u = first + (off_t)unit_wal_tear.unit * tu;
    unsigned char *old = malloc(tu), *img = malloc(tu);
    size_t half = tu / 2;
    struct stat st;

    if (u >= end)
        _exit(3);
    if (!old || !img)
        _exit(4);
    unit_wal__pread(rw, old, tu, u);
    for (size_t done = 0; done < len;) {
        ssize_t n = write(fd, (const char *)buf + done, len - done);
        if (n <= 0)
            _exit(4);
        done += (size_t)n;
    }
    unit_wal__pread(rw, img, tu, u);
    switch (unit_wal_tear.mode) {
    case UNIT_WAL_TEAR_ZERO:
        memset(img, 0, tu);
        break;
    case UNIT_WAL_TEAR_GARBLE:
        for (size_t i = 0; i < 512; i++)
            img[i] = (unsigned char)(i * 131 + 17);
        break;
    case UNIT_WAL_TEAR_HALF_NEW:
        memcpy(img + half, old + half, half);
        break;
    case UNIT_WAL_TEAR_HALF_OLD:
        memcpy(img, old, half);
        break;
    }
    if (fstat(rw, &st) < 0 ||
        pwrite(rw, img, st.st_size - u < (off_t)tu ? (size_t)(st.st_size - u)
                                                   : tu, u) < 0)
        _exit(4);
    _exit(0);
}

#endif
