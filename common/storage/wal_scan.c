/* wal_scan: reading the node log (see wal.h): records in LSN order, torn
 * tails cut, damage reported with what it may have cost.
 *
 * Segments are read oldest first; a segment ends where the next one
 * begins.  Padding records are skipped.  In a segment, bad bytes are one
 * of:
 *   - harmless: the next intact header carries the LSN expected, so they
 *     hid no record (a damaged padding record): skipped;
 *   - a torn tail: in the last segment, with no intact record after them
 *     whose commit stamp is at or past the LSN expected there (no record
 *     written once that one was durable): the commit group a crash
 *     interrupted, never acknowledged, so it and everything after it are
 *     cut (zeros at the end are the room the segment was made with, cut
 *     without counting as torn; so are the bytes after the records of a
 *     segment made over a spare when no header of this segment's, LSN
 *     expected or later, is among them: an earlier segment's);
 *   - a damaged record whose header is intact: its owner is known, the
 *     damage is reported for that stream and the scan goes on after it;
 *   - a damaged header: the scan looks for the next intact header and
 *     reports the LSNs in between as lost, owners unknown (the store finds
 *     whose they were from the gaps in each stream's seqs).
 * Outside a torn tail every record was acknowledged (a later commit stamp
 * vouches for it, or its segment was closed), so what is reported is
 * acknowledged records lost.  LSNs missing between segments are reported
 * the same way.
 */
#include "wal.h"
#include "wal_format.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

struct scan {
    const char *dir;
    const struct wal_scan_ops *ops;
    void *ctx;
    struct wal_scan_info *out;
    bool live;          /* wal_rescan: read up to limit, cut nothing */
    uint64_t limit;     /* live: the last LSN to read */
    uint64_t from;      /* live: segments wholly before it are skipped */
    uint64_t expect;    /* LSN of the next record */
    char *err;
    struct wal *w;      /* live: the log (its seek marks) */
};

static int seg_cmp(const void *a, const void *b)
{
    const struct wal__seg *x = a, *y = b;

    return x->first < y->first ? -1 : x->first > y->first;
}

int wal__seg_list(const char *dir, bool clean, struct wal__seg **out,
                  size_t *n)
{
    DIR *d = opendir(dir);
    struct wal__seg *v = NULL;
    size_t len = 0, cap = 0;
    struct dirent *de;

    *out = NULL;
    *n = 0;
    if (!d)
        return errno == ENOENT ? 0 : -errno;
    while ((de = readdir(d))) {
        uint64_t first;
        if (clean && strncmp(de->d_name, ".wal-", 5) == 0) {
            unlinkat(dirfd(d), de->d_name, 0);   /* never published */
            continue;
        }
        if (!wal__seg_parse_name(de->d_name, &first))
            continue;
        if (len == cap) {
            cap = cap ? 2 * cap : 16;
            struct wal__seg *nv = realloc(v, cap * sizeof(*v));
            if (!nv) {
                free(v);
                closedir(d);
                return -ENOMEM;
            }
            v = nv;
        }
        v[len].first = first;
        memcpy(v[len].name, de->d_name, 25);   /* 24 chars, checked */
        len++;
    }
    closedir(d);
    if (len)
        qsort(v, len, sizeof(*v), seg_cmp);
    *out = v;
    *n = len;
    return 0;
}

int wal__seg_map(const char *path, bool rw, int *fd, const uint8_t **m,
                 size_t *size, char *err)
{
    struct stat st;
    int rc;

    *m = NULL;
    *size = 0;
    *fd = open(path, rw ? O_RDWR | O_CLOEXEC : O_RDONLY | O_CLOEXEC);
    if (*fd < 0 || fstat(*fd, &st) < 0) {
        rc = -errno;
        errmsg_set(err, "cannot open %s: %s", path, strerror(-rc));
        return rc;
    }
    *size = (size_t)st.st_size;
    if (*size == 0)
        return 0;
    void *p = mmap(NULL, *size, PROT_READ, MAP_PRIVATE, *fd, 0);
    if (p == MAP_FAILED) {
        rc = -errno;
        errmsg_set(err, "cannot map %s: %s", path, strerror(-rc));
        return rc;
    }
    *m = p;
    return 0;
}

/* Does the record header (a padding record's too) at p have the shape of
 * one: its magic, and lengths that fit in avail?  Its checksum is not
 * checked.  Fills *size (whole record). */
static bool hdr_shaped(const uint8_t *p, size_t avail, size_t *size)
{
    uint64_t len;
    size_t nlen;

    if (avail < WAL_REC_HDR || wal__get32(p + WAL_O_MAGIC) != WAL_REC_MAGIC)
        return false;
    nlen = wal__get16(p + WAL_O_NAMELEN);
    len = wal__get64(p + WAL_O_LEN);
    if ((nlen == 0) != (wal__get16(p + WAL_O_TYPE) == WAL_REC_PAD) ||
        nlen > avail - WAL_REC_HDR || len > WAL_MAX_PAYLOAD ||
        len > avail - WAL_REC_HDR - nlen)
        return false;
    *size = WAL_REC_HDR + nlen + (size_t)len;
    return true;
}

/* Does the checksum of the header at p (of the shape of one) hold? */
static bool hdr_sum_ok(const uint8_t *p)
{
    return wal__hdr_sum(p, wal__get16(p + WAL_O_NAMELEN)) == wal__get64(p + WAL_O_HSUM);
}

/* Is there an intact record header (a padding record's too) at p?  Fills
 * *size (whole record). */
static bool hdr_valid(const uint8_t *p, size_t avail, size_t *size)
{
    return hdr_shaped(p, avail, size) && hdr_sum_ok(p);
}

/* The record whose header is at p (LSN lsn), as record gets it: its
 * payload and length as the header says, not checked here. */
static struct wal_record record_at(const uint8_t *p, uint64_t lsn)
{
    struct wal_record r = {
        .lsn = lsn,
        .id = wal__get64(p + WAL_O_ID),
        .seq = wal__get64(p + WAL_O_SEQ),
        .type = wal__get16(p + WAL_O_TYPE),
        .name = (const char *)p + WAL_REC_HDR,
        .name_len = wal__get16(p + WAL_O_NAMELEN),
        .len = wal__get64(p + WAL_O_LEN),
    };

    r.payload = p + WAL_REC_HDR + r.name_len;
    return r;
}

static bool payload_valid(const uint8_t *p)
{
    size_t nlen = wal__get16(p + WAL_O_NAMELEN);
    uint64_t len = wal__get64(p + WAL_O_LEN);

    return XXH64(p + WAL_REC_HDR + nlen, (size_t)len, 0) ==
           wal__get64(p + WAL_O_PSUM);
}

static bool is_pad(const uint8_t *p)
{
    return wal__get16(p + WAL_O_TYPE) == WAL_REC_PAD;
}

/* Is the record at p (not a padding record) intact to its last byte:
 * header and payload checksums?  Fills *sz (whole record). */
static bool intact_record(const uint8_t *m, size_t size, size_t p, size_t *sz)
{
    return hdr_valid(m + p, size - p, sz) && !is_pad(m + p) && payload_valid(m + p);
}

/* The first intact header after off: with commit >= expect when
 * committed (a record written once LSN expect was durable), else with
 * LSN >= expect.  Returns its offset or 0.  A record found intact to its
 * last byte (the one at off, or an older segment's in one made over a
 * spare) is passed over whole: no later header begins inside it, since
 * writing one would have changed its bytes; and what its payload holds (a
 * client's bytes, which may look like a header) is never taken for a
 * record. */
static size_t next_header(const uint8_t *m, size_t size, size_t off,
                          uint64_t expect, bool committed)
{
    size_t sz, p = off + 1;

    if (off + WAL_REC_HDR <= size && intact_record(m, size, off, &sz))
        p = off + sz;   /* the record at off itself */
    for (; p + WAL_REC_HDR <= size; p++) {
        if (m[p] != 0x42 || !hdr_valid(m + p, size - p, &sz))
            continue;
        if (committed ? wal__get64(m + p + WAL_O_COMMIT) >= expect
                      : wal__get64(m + p + WAL_O_LSN) >= expect)
            return p;
        if (!is_pad(m + p) && payload_valid(m + p))
            p += sz - 1;   /* intact: its header was checked above */
    }
    return 0;
}

/* The unit in a segment's header, or false when the header is not one of
 * a version this reader knows. */
static bool seg_header_ok(const uint8_t *m, size_t size, uint64_t first,
                          uint32_t *unit)
{
    uint32_t version, u;

    if (size < WAL_SEG_HDR || memcmp(m, WAL_SEG_MAGIC, 8) != 0 ||
        wal__get64(m + 24) != XXH64(m, 24, 0) || wal__get64(m + 16) != first)
        return false;
    version = wal__get32(m + 8);
    u = wal__get32(m + 12);
    if (version == WAL_SEG_VERSION_V1)
        u = 0;
    else if (version != WAL_SEG_VERSION ||
             (u && (u < WAL_UNIT_MIN || u > WAL_UNIT_MAX || (u & (u - 1)))))
        return false;
    *unit = u;
    return true;
}

void wal__seg_read(const char *path, uint64_t size, uint64_t first,
                   uint64_t below, struct wal__seg_info *out)
{
    char err[WAL_ERRLEN];
    const uint8_t *m;
    size_t msize, sz, off;
    uint32_t unit;
    uint64_t pad = 0;
    int fd;

    memset(out, 0, sizeof(*out));
    out->start = WAL_SEG_HDR;
    if (wal__seg_map(path, false, &fd, &m, &msize, err) < 0 || !m ||
        msize < WAL_SEG_HDR ||
        !seg_header_ok(m, msize, wal__get64(m + 16), &unit))
        goto out;
    out->start = wal__seg_start(unit);
    pad = out->start - WAL_SEG_HDR;
    /* Up to the first bytes that are no record of this segment (an earlier
     * segment's, in one made over a spare, have lower LSNs).  Marks: at
     * the records of LSNs first, first + 1 ... below that begin a commit
     * group (the first of the segment, or a commit stamp other than the
     * record before's: every record of a group carries the group's, and
     * each group's is higher than the last's, the durable LSN having moved
     * past that group). */
    uint64_t lsn = wal__get64(m + 16), expect = first, commit = 0;
    bool marking = lsn == first;   /* else recovery read none of it */
    for (off = out->start; off < msize &&
         hdr_valid(m + off, msize - off, &sz) &&
         wal__get64(m + off + WAL_O_LSN) >= lsn; off += sz) {
        lsn = wal__get64(m + off + WAL_O_LSN);
        if (is_pad(m + off)) {
            pad += sz;
            continue;
        }
        if (!marking)
            continue;
        if (lsn != expect || lsn >= below) {
            marking = false;
            continue;
        }
        uint64_t c = wal__get64(m + off + WAL_O_COMMIT);
        if ((lsn == first || c != commit) &&
            off >= (out->marks.n ? out->marks.v[out->marks.n - 1].off
                                 : out->start) + WAL_SEEK_STRIDE &&
            payload_valid(m + off))
            wal__marks_add(&out->marks, out->start, lsn, off);
        commit = c;
        expect++;
    }
    if (off < msize && wal__seg_reused(m, msize, unit))
        pad += msize - off;   /* room that may hold an earlier segment's */
out:
    if (m)
        munmap((void *)m, msize);
    if (fd >= 0)
        close(fd);
    out->record_bytes = size > pad ? size - pad : size;
}

static void report_lost(struct scan *sc, uint64_t from, uint64_t to,
                        const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void report_lost(struct scan *sc, uint64_t from, uint64_t to,
                        const char *fmt, ...)
{
    struct wal_damage d = {.from = from, .to = to};
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(d.where, sizeof(d.where), fmt, ap);
    va_end(ap);
    sc->ops->damage(sc->ctx, &d);
}

/* Replay one segment; next_first: where the next segment begins (0: this
 * is the last one). */
static int seg_replay(struct scan *sc, const struct wal__seg *e,
                      uint64_t next_first)
{
    char path[WAL_PATH_LEN];
    const uint8_t *m = NULL;
    bool last = next_first == 0;
    size_t size = 0, mapped = 0, off;
    uint32_t unit = 0;
    int fd, rc = 0;

    snprintf(path, sizeof(path), "%s/%s", sc->dir, e->name);
    if ((rc = wal__seg_map(path, last && !sc->live, &fd, &m, &size,
                           sc->err)) < 0)
        goto out;
    mapped = size;
    sc->out->bytes += size;
    if (!seg_header_ok(m, size, e->first, &unit)) {
        if (last && size <= WAL_SEG_HDR && !sc->live) {
            /* A segment whose creation a crash cut short holds nothing. */
            goto out;
        }
        report_lost(sc, sc->expect, next_first ? next_first : UINT64_MAX,
                    "%s: bad segment header at offset 0", path);
        if (next_first)
            sc->expect = next_first;
        goto out;
    }
    bool reused = wal__seg_reused(m, size, unit);
    off = wal__seg_start(unit);
    if (sc->live && sc->from > sc->expect) {
        /* Start at the log's seek mark nearest before from, when the
         * record it names is there (else at the segment's start). */
        uint64_t al, ao;
        size_t sz;
        if (wal__rescan_seek(sc->w, e->first, sc->from, &al, &ao) &&
            al > sc->expect && ao < size &&
            hdr_valid(m + ao, size - ao, &sz) && !is_pad(m + ao) &&
            wal__get64(m + ao + WAL_O_LSN) == al) {
            off = (size_t)ao;
            sc->expect = al;
        }
    }
    for (; off < size;) {
        size_t sz, at;
        if ((next_first && sc->expect >= next_first) ||
            (sc->live && sc->expect > sc->limit))
            break;   /* superseded by the next segment, or not durable */
        bool shaped = hdr_shaped(m + off, size - off, &sz);
        if (sc->live && shaped && (sc->from > sc->expect || sc->ops->skip) &&
            !is_pad(m + off) && wal__get64(m + off + WAL_O_LSN) == sc->expect) {
            /* Passed over by its header, its payload not read: before
             * from, or a record the caller does not want.  Its header's
             * checksum is checked only when the record is read: a record
             * passed over because of a damaged id or seq is missed, which
             * the caller sees as a gap in its stream's seqs (wal.h,
             * skip); a damaged length leads to bytes that are not the
             * next header, handled below as any bad bytes are (the LSNs
             * up to the next intact header reported lost). */
            uint64_t lsn = sc->expect;
            bool pass = lsn < sc->from;
            if (!pass && sc->ops->skip) {
                struct wal_record h = record_at(m + off, lsn);
                h.payload = NULL;   /* not read yet (wal.h) */
                pass = sc->ops->skip(sc->ctx, &h);
            }
            if (pass) {
                sc->out->read_bytes += WAL_REC_HDR +
                                       wal__get16(m + off + WAL_O_NAMELEN);
                sc->expect++;
                off += sz;
                continue;
            }
        }
        bool hv = shaped && hdr_sum_ok(m + off);
        bool pad = hv && is_pad(m + off);
        uint64_t lsn = hv ? wal__get64(m + off + WAL_O_LSN) : 0;
        if (pad && lsn == sc->expect) {
            sc->out->read_bytes += WAL_REC_HDR;
            off += sz;   /* padding up to the next unit */
            continue;
        }
        if (!hv || lsn < sc->expect) {
            /* Bad bytes that hid no record (a damaged padding record, say):
             * the next intact header is the one expected. */
            at = next_header(m, size, off, sc->expect, false);
            if (at && wal__get64(m + at + WAL_O_LSN) == sc->expect) {
                off = at;
                continue;
            }
        }
        if (hv)
            sc->out->read_bytes += WAL_REC_HDR +
                                   wal__get16(m + off + WAL_O_NAMELEN);
        bool pv = hv && !pad && lsn == sc->expect && payload_valid(m + off);
        if (hv && !pad && lsn == sc->expect)
            sc->out->read_bytes += wal__get64(m + off + WAL_O_LEN);
        if (pv) {
            struct wal_record r = record_at(m + off, lsn);
            if ((rc = sc->ops->record(sc->ctx, &r)) < 0) {
                errmsg_set(sc->err, "%s: cannot apply record LSN %" PRIu64
                           " at offset %zu: %s", path, lsn, off,
                           strerror(-rc));
                goto out;
            }
            sc->out->records++;
            sc->expect++;
            off += sz;
            continue;
        }
        if (last && !sc->live &&
            !next_header(m, size, off, sc->expect, true)) {
            /* A torn write that was never acknowledged: cut it off.  Zeros
             * at the end are the segment's room, not a torn write.  In a
             * segment without units the write may have reached back into
             * acknowledged records. */
            size_t end = size;
            while (size % WAL_ROOM_UNIT == 0 && end > off && m[end - 1] == 0)
                end--;
            /* In a segment made over a spare, bytes after the records that
             * hold no header of this segment's (the expected LSN or later)
             * are the spare's: room too. */
            if (reused && !(hv && lsn >= sc->expect) &&
                !next_header(m, size, off, sc->expect, false))
                end = off;
            if (ftruncate(fd, (off_t)off) < 0 || fdatasync(fd) < 0) {
                rc = -errno;
                errmsg_set(sc->err, "cannot truncate the torn tail of %s at "
                           "offset %zu: %s", path, off, strerror(-rc));
                goto out;
            }
            sc->out->truncated += end - off;
            if (end > off && !unit)
                sc->out->truncated_shared = true;
            size = off;
            break;
        }
        if (hv && !pad && lsn == sc->expect) {
            /* The header names the owner: only its stream is hit. */
            struct wal_damage d = {
                .id = wal__get64(m + off + WAL_O_ID),
                .seq = wal__get64(m + off + WAL_O_SEQ),
                .lsn = lsn, .from = lsn, .to = lsn + 1,
            };
            errmsg_set(d.where, "%s: corrupt record at offset %zu (LSN %"
                       PRIu64 ", %s)", path, off, lsn,
                       last ? "followed by records written after it was "
                              "durable" : "in a closed segment");
            sc->ops->damage(sc->ctx, &d);
            sc->expect++;
            off += sz;
            continue;
        }
        if (hv && lsn > sc->expect) {
            report_lost(sc, sc->expect, lsn, "%s: record at offset %zu has "
                        "LSN %" PRIu64 ", expected %" PRIu64 " (records "
                        "missing)", path, off, lsn, sc->expect);
            sc->expect = lsn;
            continue;
        }
        /* A damaged header (or a record out of place): go on from the
         * next intact record; the LSNs between are lost. */
        at = next_header(m, size, off, sc->expect, false);
        uint64_t to = at ? wal__get64(m + at + WAL_O_LSN)
                         : next_first ? next_first : UINT64_MAX;
        if (next_first && to > next_first)
            to = next_first;
        report_lost(sc, sc->expect, to, "%s: corrupt record at offset %zu "
                    "(LSN %" PRIu64 ", %s)", path, off, sc->expect,
                    last ? "followed by records written after it was durable"
                         : "in a closed segment");
        if (!at)
            break;   /* a later segment, if any, goes on from its start */
        sc->expect = to;
        off = at;
    }
    /* Records replayed from the page cache after a failed fsync must be
     * on disk before new segments are built on top of them. */
    if (last && !sc->live && fdatasync(fd) < 0) {
        rc = -errno;
        errmsg_set(sc->err, "cannot fdatasync %s: %s", path, strerror(-rc));
    }
out:
    if (m)
        munmap((void *)m, mapped);
    if (fd >= 0)
        close(fd);
    return rc;
}

static int scan_dir(struct scan *sc, bool clean)
{
    struct wal__seg *v = NULL;
    size_t n;
    int rc;

    memset(sc->out, 0, sizeof(*sc->out));
    if ((rc = wal__seg_list(sc->dir, clean, &v, &n)) < 0) {
        errmsg_set(sc->err, "cannot list the write-ahead log in %s: %s",
                   sc->dir, strerror(-rc));
        return rc;
    }
    sc->out->segments = (uint32_t)n;
    sc->expect = n ? v[0].first : 1;
    sc->out->first_lsn = sc->expect;
    for (size_t i = 0; i < n; i++) {
        uint64_t next = i + 1 < n ? v[i + 1].first : 0;
        if (sc->live && v[i].first > sc->limit + 1)
            break;   /* started after the call */
        if (sc->live && i + 1 < n && next <= sc->from) {
            sc->expect = next;   /* wholly before what the caller wants */
            continue;
        }
        if (v[i].first > sc->expect)
            report_lost(sc, sc->expect, v[i].first, "%s/%s: segment starts "
                        "at LSN %" PRIu64 ", expected %" PRIu64 " (records "
                        "missing)", sc->dir, v[i].name, v[i].first,
                        sc->expect);
        sc->expect = v[i].first;
        if (sc->live && i + 1 < n && next > sc->limit + 1)
            next = 0;   /* the last one as of the call */
        if ((rc = seg_replay(sc, &v[i], next)) < 0)
            break;
    }
    sc->out->next_lsn = sc->expect;
    free(v);
    return rc;
}

int wal_scan(const char *dir, const struct wal_scan_ops *ops, void *ctx,
             struct wal_scan_info *out, char *err)
{
    struct scan sc = {dir, ops, ctx, out, false, 0, 0, 0, err, NULL};

    if (strlen(dir) > 3800) {
        errmsg_set(err, "write-ahead log directory path is too long");
        return -ENAMETOOLONG;
    }
    return scan_dir(&sc, true);
}

int wal_rescan(struct wal *w, const struct wal_scan_ops *ops, void *ctx,
               struct wal_scan_info *out, char *err)
{
    return wal_rescan_from(w, 0, ops, ctx, out, err);
}

int wal_rescan_from(struct wal *w, uint64_t from, const struct wal_scan_ops *ops,
                    void *ctx, struct wal_scan_info *out, char *err)
{
    struct scan sc = {wal_dir(w), ops, ctx, out, true, 0, from, 0, err, w};
    int rc;

    sc.limit = wal__rescan_begin(w);
    rc = scan_dir(&sc, false);
    wal__rescan_end(w, out->read_bytes);
    return rc;
}
