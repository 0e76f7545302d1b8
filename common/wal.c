/* wal: write-ahead log segments, group commit and recovery (see wal.h).
 *
 * Group commit is the classic leader/follower scheme: records are framed
 * into an in-memory batch under a mutex; a thread that needs durability and
 * finds no I/O in progress takes the batch, seals it (commit stamp and
 * checksums), writes it with one write() and one fdatasync() with the mutex
 * released, then publishes the new durable sequence number and wakes every
 * waiter.  While it does I/O, appenders fill the next batch, so the cost of
 * one fdatasync is shared by every record submitted during the previous one.
 */
#include "errmsg.h"
#include "durable.h"
#include "wal.h"

#include <dirent.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#define SEG_MAGIC "BGWALSEG"
#define SEG_VERSION 1
#define REC_MAGIC UINT32_C(0x52574742) /* "BGWR" little-endian */
#define BUF_KEEP (16u << 20)           /* larger batch buffers are freed */

int (*wal__fdatasync)(int fd) = fdatasync;
ssize_t (*wal__write)(int fd, const void *buf, size_t len) = write;

struct wal_buf {
    uint8_t *p;
    size_t len;
    size_t cap;
};

struct wal {
    char *dir;
    int durability;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_mutex_t rotate_mu;   /* one rotation at a time */
    int fd;                      /* current segment, written only by the
                                    thread that set busy */
    uint64_t seg_first;
    struct wal_buf cur;          /* batch being filled (under mu) */
    struct wal_buf spare;        /* the other buffer, reused */
    uint64_t next_seq;
    uint64_t durable_seq;
    uint64_t bytes;
    bool busy;                   /* a leader or a rotation is doing I/O */
    int err;
    char errtext[WAL_ERRLEN];
};

struct seg_ent {
    uint64_t first;
    char name[32];
};

static void put32(uint8_t *p, uint32_t v)
{
    v = htole32(v);
    memcpy(p, &v, 4);
}

static void put64(uint8_t *p, uint64_t v)
{
    v = htole64(v);
    memcpy(p, &v, 8);
}

static uint32_t get32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return le32toh(v);
}

static uint64_t get64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return le64toh(v);
}

/* snprintf that may truncate: messages are cut, and paths cannot be too
 * long because the directory length is checked when it is first given. */
static void strfmt(char *buf, size_t size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void strfmt(char *buf, size_t size, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(buf, size, fmt, ap);
    va_end(ap);
}

/* Checksum of a record: header bytes 0..31 chained into the payload. */
static uint64_t rec_sum(const uint8_t *rec, uint64_t len)
{
    return XXH64(rec + WAL_REC_HDR, (size_t)len, XXH64(rec, 32, 0));
}

static int write_all(int fd, const void *buf, size_t len)
{
    const uint8_t *p = buf;

    while (len) {
        ssize_t n = wal__write(fd, p, len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (n == 0)
            return -EIO;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}


static void seg_name(char *buf, size_t len, uint64_t first)
{
    strfmt(buf, len, "wal-%016" PRIx64 ".log", first);
}

static bool seg_parse_name(const char *name, uint64_t *first)
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

static int seg_cmp(const void *a, const void *b)
{
    const struct seg_ent *x = a, *y = b;

    return x->first < y->first ? -1 : x->first > y->first;
}

/* The segments of dir sorted by first seq.  clean: remove leftover temp
 * files (only when no WAL is open on dir). */
static int seg_list(const char *dir, bool clean, struct seg_ent **out,
                    size_t *n)
{
    DIR *d = opendir(dir);
    struct seg_ent *v = NULL;
    size_t len = 0, cap = 0;
    struct dirent *de;

    if (!d)
        return -errno;
    while ((de = readdir(d))) {
        uint64_t first;
        if (clean && strncmp(de->d_name, ".wal-", 5) == 0) {
            /* A segment creation that did not finish: never visible. */
            unlinkat(dirfd(d), de->d_name, 0);
            continue;
        }
        if (!seg_parse_name(de->d_name, &first))
            continue;
        if (len == cap) {
            cap = cap ? 2 * cap : 8;
            struct seg_ent *nv = realloc(v, cap * sizeof(*v));
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

static void seg_header(uint8_t *h, uint64_t first)
{
    memcpy(h, SEG_MAGIC, 8);
    put32(h + 8, SEG_VERSION);
    put32(h + 12, 0);
    put64(h + 16, first);
    put64(h + 24, XXH64(h, 24, 0));
}

/* Give the open temp segment fd its header for first, make it durable and
 * rename it to its final name.  Segments only ever appear complete. */
static int seg_publish(const char *dir, int fd, const char *tmp, uint64_t first,
                       char *err)
{
    uint8_t h[WAL_SEG_HDR];
    char name[32], path[4096];
    int rc;

    seg_header(h, first);
    seg_name(name, sizeof(name), first);
    strfmt(path, sizeof(path), "%s/%s", dir, name);
    rc = write_all(fd, h, sizeof(h));
    if (rc == 0 && wal__fdatasync(fd) < 0)
        rc = errno ? -errno : -EIO;
    if (rc < 0) {
        errmsg_set(err, "cannot write WAL segment header in %s: %s", dir,
               strerror(-rc));
        return rc;
    }
    if ((rc = durable_rename(tmp, path)) < 0) {
        errmsg_set(err, "cannot publish WAL segment %s: %s", path, strerror(-rc));
        return rc;
    }
    return 0;
}

static int seg_tmp_open(const char *dir, char *tmp, size_t len, char *err)
{
    int fd;

    strfmt(tmp, len, "%s/.wal-new.tmp", dir);
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        int rc = -errno;
        errmsg_set(err, "cannot create WAL segment in %s: %s", dir, strerror(-rc));
        return rc;
    }
    return fd;
}

/* ---- appending ---- */

struct wal *wal_open(const char *dir, uint64_t next_seq, int durability,
                     char *err)
{
    struct wal *w = calloc(1, sizeof(*w));
    char tmp[4096];

    if (!w) {
        errmsg_set(err, "out of memory");
        return NULL;
    }
    w->fd = -1;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    pthread_mutex_init(&w->rotate_mu, NULL);
    if (strlen(dir) > 3800) {
        errmsg_set(err, "WAL directory path is too long");
        goto fail;
    }
    if (!(w->dir = strdup(dir))) {
        errmsg_set(err, "out of memory");
        goto fail;
    }
    if (next_seq == 0)
        next_seq = 1;
    w->durability = durability;
    w->next_seq = next_seq;
    w->durable_seq = next_seq - 1;
    w->seg_first = next_seq;
    if ((w->fd = seg_tmp_open(dir, tmp, sizeof(tmp), err)) < 0)
        goto fail;
    if (seg_publish(dir, w->fd, tmp, next_seq, err) < 0) {
        unlink(tmp);
        goto fail;
    }
    return w;
fail:
    wal_close(w);
    return NULL;
}

static void wal_fail(struct wal *w, int rc, const char *what)
{
    char name[32];

    seg_name(name, sizeof(name), w->seg_first);
    if (!w->err) {
        w->err = -EIO;
        strfmt(w->errtext, sizeof(w->errtext), "%s of %s/%s failed: %s",
                 what, w->dir, name, strerror(-rc));
    }
}

/* Fill in the commit stamp and the checksum of every record of a batch. */
static void batch_seal(uint8_t *b, size_t len, uint64_t commit)
{
    size_t off = 0;

    while (off < len) {
        uint8_t *r = b + off;
        uint64_t plen = get64(r + 8);
        put64(r + 24, commit);
        put64(r + 32, rec_sum(r, plen));
        off += WAL_REC_HDR + plen;
    }
}

static void buf_recycle(struct wal *w, struct wal_buf *b)
{
    b->len = 0;
    if (b->cap > BUF_KEEP) {
        free(b->p);
        b->p = NULL;
        b->cap = 0;
    }
    w->spare = *b;
}

/* Write the current batch as leader.  Called and returns with mu held and
 * busy clear; drops mu for the I/O. */
static void wal_lead(struct wal *w)
{
    struct wal_buf b = w->cur;
    uint64_t last = w->next_seq - 1, commit = w->durable_seq;
    int rc;

    w->cur = w->spare;
    w->spare = (struct wal_buf){0};
    w->busy = true;
    pthread_mutex_unlock(&w->mu);

    batch_seal(b.p, b.len, commit);
    rc = write_all(w->fd, b.p, b.len);
    if (rc == 0 && w->durability == WAL_SYNC_FSYNC &&
        wal__fdatasync(w->fd) < 0)
        rc = errno ? -errno : -EIO;

    pthread_mutex_lock(&w->mu);
    if (rc < 0)
        wal_fail(w, rc, w->durability == WAL_SYNC_FSYNC ? "write/fdatasync"
                                                         : "write");
    else {
        w->durable_seq = last;
        w->bytes += b.len;
    }
    buf_recycle(w, &b);
    w->busy = false;
    pthread_cond_broadcast(&w->cv);
}

int wal_submit(struct wal *w, uint32_t type, const void *payload, uint64_t len,
               uint64_t *seq)
{
    size_t need;
    uint8_t *r;

    if (len > WAL_MAX_PAYLOAD || len > SIZE_MAX - WAL_REC_HDR)
        return -EINVAL;
    pthread_mutex_lock(&w->mu);
    if (w->err) {
        pthread_mutex_unlock(&w->mu);
        return -EIO;
    }
    need = w->cur.len + WAL_REC_HDR + (size_t)len;
    if (need > w->cur.cap) {
        size_t cap = w->cur.cap ? w->cur.cap : 64 * 1024;
        while (cap < need)
            cap *= 2;
        uint8_t *p = realloc(w->cur.p, cap);
        if (!p) {
            pthread_mutex_unlock(&w->mu);
            return -ENOMEM;
        }
        w->cur.p = p;
        w->cur.cap = cap;
    }
    r = w->cur.p + w->cur.len;
    put32(r, REC_MAGIC);
    put32(r + 4, type);
    put64(r + 8, len);
    put64(r + 16, w->next_seq);
    put64(r + 24, 0);   /* commit and checksum: sealed by the leader */
    put64(r + 32, 0);
    if (len)
        memcpy(r + WAL_REC_HDR, payload, (size_t)len);
    w->cur.len = need;
    *seq = w->next_seq++;
    pthread_mutex_unlock(&w->mu);
    return 0;
}

int wal_wait(struct wal *w, uint64_t seq)
{
    int rc = 0;

    pthread_mutex_lock(&w->mu);
    if (seq >= w->next_seq) {
        /* Never submitted: waiting would never end. */
        pthread_mutex_unlock(&w->mu);
        return -EINVAL;
    }
    while (w->durable_seq < seq) {
        if (w->err) {
            rc = -EIO;
            break;
        }
        if (!w->busy)
            wal_lead(w);
        else
            pthread_cond_wait(&w->cv, &w->mu);
    }
    pthread_mutex_unlock(&w->mu);
    return rc;
}

int wal_append(struct wal *w, uint32_t type, const void *payload, uint64_t len,
               uint64_t *seq)
{
    uint64_t s;
    int rc = wal_submit(w, type, payload, len, &s);

    if (rc == 0)
        rc = wal_wait(w, s);
    if (rc == 0 && seq)
        *seq = s;
    return rc;
}

int wal_rotate(struct wal *w, uint64_t *upto, char *err)
{
    char tmp[4096];
    struct wal_buf b;
    uint64_t last, commit;
    int fd, rc = 0, old;

    pthread_mutex_lock(&w->rotate_mu);
    /* Create the next file first so that running out of space here fails
     * the rotation but not the WAL. */
    if ((fd = seg_tmp_open(w->dir, tmp, sizeof(tmp), err)) < 0) {
        pthread_mutex_unlock(&w->rotate_mu);
        return fd;
    }
    pthread_mutex_lock(&w->mu);
    while (w->busy && !w->err)
        pthread_cond_wait(&w->cv, &w->mu);
    if (w->err) {
        errmsg_set(err, "%s", w->errtext);
        pthread_mutex_unlock(&w->mu);
        rc = -EIO;
        goto out;
    }
    if (w->cur.len == 0 && w->next_seq == w->seg_first) {
        /* The current segment is empty: it already starts at the cut. */
        *upto = w->next_seq - 1;
        pthread_mutex_unlock(&w->mu);
        close(fd);
        unlink(tmp);
        pthread_mutex_unlock(&w->rotate_mu);
        return 0;
    }
    /* The cut: everything submitted so far goes to the old segment. */
    b = w->cur;
    last = w->next_seq - 1;
    commit = w->durable_seq;
    w->cur = w->spare;
    w->spare = (struct wal_buf){0};
    w->busy = true;
    pthread_mutex_unlock(&w->mu);

    batch_seal(b.p, b.len, commit);
    if ((rc = write_all(w->fd, b.p, b.len)) == 0 && wal__fdatasync(w->fd) < 0)
        rc = errno ? -errno : -EIO;
    if (rc == 0)
        rc = seg_publish(w->dir, fd, tmp, last + 1, err);

    pthread_mutex_lock(&w->mu);
    if (rc < 0) {
        wal_fail(w, rc, "rotation");
        errmsg_set(err, "%s", w->errtext);
        old = fd;
    } else {
        old = w->fd;
        w->fd = fd;
        w->seg_first = last + 1;
        w->durable_seq = last;
        w->bytes = 0;
        *upto = last;
    }
    buf_recycle(w, &b);
    w->busy = false;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    fd = old;
    if (rc < 0)
        rc = -EIO;
out:
    if (fd >= 0)
        close(fd);
    unlink(tmp);   /* no-op once published */
    pthread_mutex_unlock(&w->rotate_mu);
    return rc;
}

void wal_close(struct wal *w)
{
    if (!w)
        return;
    pthread_mutex_lock(&w->mu);
    while (w->busy)
        pthread_cond_wait(&w->cv, &w->mu);
    if (!w->err && w->cur.len && w->fd >= 0)
        wal_lead(w);
    pthread_mutex_unlock(&w->mu);
    if (w->fd >= 0)
        close(w->fd);
    free(w->cur.p);
    free(w->spare.p);
    free(w->dir);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->rotate_mu);
    free(w);
}

uint64_t wal_last_seq(struct wal *w)
{
    pthread_mutex_lock(&w->mu);
    uint64_t v = w->next_seq - 1;
    pthread_mutex_unlock(&w->mu);
    return v;
}

uint64_t wal_durable_seq(struct wal *w)
{
    pthread_mutex_lock(&w->mu);
    uint64_t v = w->durable_seq;
    pthread_mutex_unlock(&w->mu);
    return v;
}

uint64_t wal_bytes(struct wal *w)
{
    pthread_mutex_lock(&w->mu);
    uint64_t v = w->bytes + w->cur.len;
    pthread_mutex_unlock(&w->mu);
    return v;
}

int wal_error(struct wal *w)
{
    pthread_mutex_lock(&w->mu);
    int v = w->err;
    pthread_mutex_unlock(&w->mu);
    return v;
}

const char *wal_error_text(struct wal *w)
{
    /* errtext is written once, before err is set, and never again. */
    return wal_error(w) ? w->errtext : "";
}

int wal_discard(const char *dir, uint64_t upto)
{
    struct seg_ent *v;
    size_t n;
    int rc = seg_list(dir, false, &v, &n), removed = 0;

    if (rc < 0)
        return rc;
    for (size_t i = 0; i + 1 < n; i++) {
        char path[4096];
        if (v[i + 1].first > upto + 1)
            break;
        strfmt(path, sizeof(path), "%s/%s", dir, v[i].name);
        if (unlink(path) < 0 && errno != ENOENT) {
            rc = -errno;
            break;
        }
        removed++;
    }
    free(v);
    if (removed) {
        int r2 = durable_fsync_dir(dir);
        if (rc == 0)
            rc = r2;
    }
    return rc;
}

/* ---- recovery ---- */

/* Is there a complete record with a good checksum at p? */
static bool rec_valid(const uint8_t *p, size_t avail, uint64_t *len)
{
    uint64_t l;

    if (avail < WAL_REC_HDR || get32(p) != REC_MAGIC)
        return false;
    l = get64(p + 8);
    if (l > WAL_MAX_PAYLOAD || l > avail - WAL_REC_HDR)
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
    for (size_t p = off + 1; p + WAL_REC_HDR <= size; p++) {
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
    wal_replay_fn fn;
    void *ctx;
    struct wal_recovery *out;
    uint64_t expect;
    char *err;
};

/* Replay one segment.  last: it is the newest one, where a torn tail is
 * allowed. */
static int seg_replay(struct replay *r, const struct seg_ent *e, bool last)
{
    char path[4096];
    const uint8_t *m = NULL;
    struct stat st;
    size_t size, off;
    int fd, rc = 0;

    strfmt(path, sizeof(path), "%s/%s", r->dir, e->name);
    fd = open(path, last ? O_RDWR | O_CLOEXEC : O_RDONLY | O_CLOEXEC);
    if (fd < 0 || fstat(fd, &st) < 0) {
        rc = -errno;
        errmsg_set(r->err, "cannot open %s: %s", path, strerror(-rc));
        goto out;
    }
    size = (size_t)st.st_size;
    if (size > 0) {
        m = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            m = NULL;
            rc = -errno;
            errmsg_set(r->err, "cannot map %s: %s", path, strerror(-rc));
            goto out;
        }
    }
    if (size < WAL_SEG_HDR || memcmp(m, SEG_MAGIC, 8) != 0 ||
        get64(m + 24) != XXH64(m, 24, 0) || get32(m + 8) != SEG_VERSION ||
        get64(m + 16) != e->first) {
        rc = -EBADMSG;
        errmsg_set(r->err, "%s: bad segment header at offset 0", path);
        goto out;
    }
    r->out->bytes += size;
    for (off = WAL_SEG_HDR; off < size;) {
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
            rc = r->fn(r->ctx, get32(m + off + 4), seq, m + off + WAL_REC_HDR,
                       len);
            if (rc < 0) {
                errmsg_set(r->err, "%s: cannot apply record seq %" PRIu64
                       " at offset %zu: %s", path, seq, off, strerror(-rc));
                goto out;
            }
            r->out->records++;
        }
        r->expect++;
        off += WAL_REC_HDR + (size_t)len;
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

int wal_recover(const char *dir, uint64_t after, wal_replay_fn fn, void *ctx,
                struct wal_recovery *out, char *err)
{
    struct replay r = {dir, after, fn, ctx, out, 0, err};
    struct seg_ent *v = NULL;
    size_t n, start = 0;
    int rc;

    memset(out, 0, sizeof(*out));
    if (strlen(dir) > 3800) {
        errmsg_set(err, "WAL directory path is too long");
        return -ENAMETOOLONG;
    }
    if ((rc = seg_list(dir, true, &v, &n)) < 0) {
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
