/* wal_legacy: the reader of earlier releases' per-filter logs (see
 * wal_legacy.h), kept as those releases wrote and read them.
 */
#include "wal_legacy.h"
#include "wal_format.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define SEG_MAGIC "BGWALSEG"
#define SEG_VERSION 1
#define SEG_HDR 32
#define REC_HDR 40
#define REC_MAGIC UINT32_C(0x52574742) /* "BGWR" little-endian */

#define get32 wal__get32
#define get64 wal__get64

bool wal_legacy_is_segment(const char *name)
{
    uint64_t first;

    return wal__seg_parse_name(name, &first);
}

static uint64_t rec_sum(const uint8_t *rec, uint64_t len)
{
    return XXH64(rec + REC_HDR, (size_t)len, XXH64(rec, 32, 0));
}

/* Is there a complete record with a good checksum at p? */
static bool rec_valid(const uint8_t *p, size_t avail, uint64_t *len)
{
    uint64_t l;

    if (avail < REC_HDR || get32(p) != REC_MAGIC)
        return false;
    l = get64(p + 8);
    if (l > WAL_MAX_PAYLOAD || l > avail - REC_HDR)
        return false;
    if (rec_sum(p, l) != get64(p + 32))
        return false;
    *len = l;
    return true;
}

/* After a bad record at off (which should have had seq expect), look for any
 * intact record that was written after expect was durable.  Its presence
 * means the bad record had been acknowledged: corruption, not a torn write. */
static bool committed_after(const uint8_t *m, size_t size, size_t off,
                            uint64_t expect, size_t *at, uint64_t *seq)
{
    for (size_t p = off + 1; p + REC_HDR <= size; p++) {
        uint64_t l;
        if (m[p] != 0x42 || !rec_valid(m + p, size - p, &l))
            continue;
        if (get64(m + p + 24) >= expect) {
            *at = p;
            *seq = get64(m + p + 16);
            return true;
        }
    }
    return false;
}

struct replay {
    const char *dir;
    uint64_t after;
    wal_legacy_fn fn;
    void *ctx;
    struct wal_legacy_info *out;
    uint64_t expect;
    char *err;
};

/* Replay one segment.  last: it is the newest one, where a torn tail is
 * allowed. */
static int seg_replay(struct replay *r, const struct wal__seg *e, bool last)
{
    char path[4096];
    const uint8_t *m = NULL;
    size_t size, off;
    int fd, rc = 0;

    snprintf(path, sizeof(path), "%s/%s", r->dir, e->name);
    if ((rc = wal__seg_map(path, last, &fd, &m, &size, r->err)) < 0)
        goto out;
    if (size < SEG_HDR || memcmp(m, SEG_MAGIC, 8) != 0 ||
        get64(m + 24) != XXH64(m, 24, 0) || get32(m + 8) != SEG_VERSION ||
        get64(m + 16) != e->first) {
        rc = -EBADMSG;
        errmsg_set(r->err, "%s: bad segment header at offset 0", path);
        goto out;
    }
    for (off = SEG_HDR; off < size;) {
        uint64_t len, seq;
        size_t at;
        if (!rec_valid(m + off, size - off, &len)) {
            if (!last) {
                rc = -EBADMSG;
                errmsg_set(r->err, "%s: corrupt record at offset %zu (seq %" PRIu64
                       ") in a closed segment", path, off, r->expect);
                goto out;
            }
            if (committed_after(m, size, off, r->expect, &at, &seq)) {
                rc = -EBADMSG;
                errmsg_set(r->err, "%s: corrupt record at offset %zu (seq %" PRIu64
                       "), followed by record seq %" PRIu64 " at offset %zu "
                       "written after it was durable", path, off, r->expect,
                       seq, at);
                goto out;
            }
            /* A torn write that was never acknowledged: cut it off. */
            if (ftruncate(fd, (off_t)off) < 0 || fdatasync(fd) < 0) {
                rc = -errno;
                errmsg_set(r->err, "cannot truncate torn tail of %s at offset "
                       "%zu: %s", path, off, strerror(-rc));
                goto out;
            }
            r->out->truncated += size - off;
            break;
        }
        seq = get64(m + off + 16);
        if (seq != r->expect) {
            rc = -EBADMSG;
            errmsg_set(r->err, "%s: record at offset %zu has seq %" PRIu64
                   ", expected %" PRIu64 " (records missing)", path, off, seq,
                   r->expect);
            goto out;
        }
        if (seq > r->after) {
            rc = r->fn(r->ctx, get32(m + off + 4), seq, m + off + REC_HDR,
                       len);
            if (rc < 0) {
                errmsg_set(r->err, "%s: cannot apply record seq %" PRIu64
                       " at offset %zu: %s", path, seq, off, strerror(-rc));
                goto out;
            }
            r->out->records++;
        }
        r->expect++;
        off += REC_HDR + (size_t)len;
    }
    /* Records replayed from the page cache after a failed fsync must be on
     * disk before new segments are built on top of them. */
    if (last && fdatasync(fd) < 0) {
        rc = -errno;
        errmsg_set(r->err, "cannot fdatasync %s: %s", path, strerror(-rc));
    }
out:
    if (m)
        munmap((void *)m, size);
    if (fd >= 0)
        close(fd);
    return rc;
}

int wal_legacy_recover(const char *dir, uint64_t after, wal_legacy_fn fn, void *ctx,
                struct wal_legacy_info *out, char *err)
{
    struct replay r = {dir, after, fn, ctx, out, 0, err};
    struct wal__seg *v = NULL;
    size_t n = 0, start = 0;
    int rc;

    memset(out, 0, sizeof(*out));
    if (strlen(dir) > 3800) {
        errmsg_set(err, "WAL directory path is too long");
        return -ENAMETOOLONG;
    }
    if ((rc = wal__seg_list(dir, false, &v, &n)) < 0) {
        errmsg_set(err, "cannot list WAL segments in %s: %s", dir, strerror(-rc));
        return rc;
    }
    out->segments = (uint32_t)n;
    if (n == 0) {
        errmsg_set(err, "%s: no WAL segment (records after seq %" PRIu64
               " may be missing)", dir, after);
        rc = -EBADMSG;
        goto out;
    }
    /* Segments wholly covered by the snapshot are skipped unread. */
    while (start + 1 < n && v[start + 1].first <= after + 1)
        start++;
    if (v[start].first > after + 1) {
        errmsg_set(err, "%s/%s: WAL starts at seq %" PRIu64 " but the snapshot "
               "covers only up to %" PRIu64 " (records missing)", dir,
               v[start].name, v[start].first, after);
        rc = -EBADMSG;
        goto out;
    }
    r.expect = v[start].first;
    for (size_t i = start; i < n; i++) {
        if (v[i].first != r.expect) {
            errmsg_set(err, "%s/%s: segment starts at seq %" PRIu64 ", expected %"
                   PRIu64 " (records missing)", dir, v[i].name, v[i].first,
                   r.expect);
            rc = -EBADMSG;
            goto out;
        }
        if ((rc = seg_replay(&r, &v[i], i + 1 == n)) < 0)
            goto out;
    }
    out->next_seq = r.expect > after + 1 ? r.expect : after + 1;
out:
    free(v);
    return rc;
}
