/* store_ckfile: checkpoint page files and manifests (store_ckfile.h;
 * byte by byte in docs/FORMAT.md, "Checkpoint files").
 *
 * Page file: a header page, then groups: a directory page and its data
 * pages.  The header page (written last, at offset 0):
 *   0 "BGCKPAGE"  8 u32 version  12 u32 type  16 u64 incarnation id
 *   24 u64 from  32 u64 to  40 u64 data pages  48 u64 stream bytes
 *   56 u64 XXH64 of every directory page in order  64 u32 meta length M
 *   68 u32 0  72 M bytes of meta (the filter's header and descriptors)
 *   4088 u64 XXH64 of bytes 0..4087
 * A directory page: 255 entries {u32 layer, u32 page index, u64 XXH64 of
 * the data page}, then at 4080 u32 entries used, u32 the group's number,
 * 4088 u64 XXH64 of bytes 0..4087.  All little-endian.
 * Manifest (one page): 0 "BGCKMANI"  8 u32 version  12 u32 entries n
 *   16 u64 incarnation id  24 u64 seq  32..63 zero  64 n entries of 40
 *   bytes {u32 type, u32 0, u64 from, u64 to, u64 lsn, u64 bytes}
 *   4088 u64 XXH64 of bytes 0..4087.
 */
#include "store_ckfile.h"
#include "wal_format.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h>

#include "bf_file.h"
#include "durable.h"
#include "errmsg.h"

#define PAGE STORE_CKF_PAGE
#define VERSION 1u
#define PATH_LEN 4096

static const char page_magic[8] = {'B', 'G', 'C', 'K', 'P', 'A', 'G', 'E'};
static const char man_magic[8] = {'B', 'G', 'C', 'K', 'M', 'A', 'N', 'I'};

/* ---- hooks ---- */

static int sync_dir(const char *dir)
{
    return durable_fsync_dir(dir);
}

static int do_fsync(int fd)
{
    return fdatasync(fd) < 0 ? -errno : 0;
}

static int do_rename(const char *from, const char *to)
{
    return rename(from, to) < 0 ? -errno : 0;
}

struct store_ckpt_io store__ckpt_io = {pwrite, do_fsync, do_rename, sync_dir};
void (*store__ckpt_step)(int type, int step);

void store__ckpt_step_at(int type, int step)
{
    if (store__ckpt_step)
        store__ckpt_step(type, step);
}

/* Seal a page: XXH64 of its first 4088 bytes in its last 8. */
static void seal(uint8_t *p)
{
    wal__put64(p + PAGE - 8, XXH64(p, PAGE - 8, 0));
}

static bool sealed(const uint8_t *p)
{
    return wal__get64(p + PAGE - 8) == XXH64(p, PAGE - 8, 0);
}

static void dir_of(const char *path, char *dir, size_t len)
{
    snprintf(dir, len, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash)
        *slash = 0;
    else
        snprintf(dir, len, ".");
}

static int write_all(int fd, const void *buf, size_t len, off_t off)
{
    const uint8_t *p = buf;

    while (len) {
        ssize_t n = store__ckpt_io.pwrite(fd, p, len, off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return n < 0 ? -errno : -EIO;
        p += n;
        len -= (size_t)n;
        off += n;
    }
    return 0;
}

/* A temp file for final path path: "<path>.tmp.XXXXXX". */
static int tmp_open(const char *path, char *tmp, size_t len, char *err)
{
    if ((size_t)snprintf(tmp, len, "%s.tmp.XXXXXX", path) >= len) {
        errmsg_set(err, "path %.200s is too long", path);
        return -ENAMETOOLONG;
    }
    int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0) {
        int rc = -errno;
        errmsg_set(err, "cannot create %s: %s", tmp, strerror(-rc));
        return rc;
    }
    return fd;
}

/* fsync fd (the temp file tmp), close it, rename it to path, fsync the
 * directory, with the steps of type type (page file or manifest).  The
 * temp file is removed on failure. */
static int publish(int fd, const char *tmp, const char *path, int type,
                   bool manifest, char *err)
{
    char dir[PATH_LEN];
    int rc;

    store__ckpt_step_at(type, manifest ? STORE_STEP_MANIFEST_WRITTEN
                                       : STORE_STEP_FILE_WRITTEN);
    if ((rc = store__ckpt_io.fsync(fd)) < 0) {
        errmsg_set(err, "cannot fsync %s: %s", tmp, strerror(-rc));
        goto fail;
    }
    store__ckpt_step_at(type, manifest ? STORE_STEP_MANIFEST_SYNCED
                                       : STORE_STEP_FILE_SYNCED);
    if (close(fd) < 0) {
        fd = -1;
        rc = -errno;
        errmsg_set(err, "cannot close %s: %s", tmp, strerror(-rc));
        goto fail;
    }
    fd = -1;
    if ((rc = store__ckpt_io.rename(tmp, path)) < 0) {
        errmsg_set(err, "cannot rename %s: %s", tmp, strerror(-rc));
        goto fail;
    }
    store__ckpt_step_at(type, manifest ? STORE_STEP_MANIFEST_RENAMED
                                       : STORE_STEP_FILE_RENAMED);
    dir_of(path, dir, sizeof dir);
    if ((rc = store__ckpt_io.fsync_dir(dir)) < 0) {
        /* Renamed, but maybe not for good: the caller goes no further. */
        errmsg_set(err, "cannot fsync directory %s: %s", dir, strerror(-rc));
        return rc;
    }
    store__ckpt_step_at(type, manifest ? STORE_STEP_MANIFEST_DURABLE
                                       : STORE_STEP_FILE_DURABLE);
    return 0;
fail:
    if (fd >= 0)
        close(fd);
    unlink(tmp);
    return rc;
}

/* ---- page files: writing ---- */

struct store_ckw {
    int fd;
    int type;
    struct store_fname name;
    char tmp[PATH_LEN], path[PATH_LEN];
    uint8_t *grp;            /* a directory page, then its data pages */
    uint32_t ngrp;           /* data pages in the group */
    uint32_t group;          /* groups written */
    uint64_t pages;          /* data pages in all */
    uint64_t off;            /* where the group goes */
    uint64_t stream;         /* records: bytes of the stream */
    uint32_t spos;           /* records: bytes in the stream's open page */
    XXH64_state_t *chain;
};

int store__ckw_open(struct store_ckw **out, const char *dir,
                    const struct store_fname *n, int type, char *err)
{
    struct store_ckw *w = calloc(1, sizeof *w);

    *out = NULL;
    /* Only the directory page starts zeroed: every data page is filled
     * whole before it is written (store__ckw_page, store__ckw_stream), so
     * a small filter's checkpoint touches no more of the buffer than it
     * writes. */
    if (!w || !(w->grp = malloc((size_t)(1 + STORE_CKF_GROUP) * PAGE)) ||
        !(w->chain = XXH64_createState())) {
        if (w) {
            free(w->grp);
            free(w);
        }
        errmsg_set(err, "no memory for a checkpoint file's buffer");
        return -ENOMEM;
    }
    memset(w->grp, 0, PAGE);
    XXH64_reset(w->chain, 0);
    w->type = type;
    w->name = *n;
    w->off = PAGE;
    store__fname_path(w->path, sizeof w->path, dir, n);
    if ((w->fd = tmp_open(w->path, w->tmp, sizeof w->tmp, err)) < 0) {
        int rc = w->fd;
        XXH64_freeState(w->chain);
        free(w->grp);
        free(w);
        return rc;
    }
    *out = w;
    return 0;
}

static int group_flush(struct store_ckw *w, char *err)
{
    uint8_t *d = w->grp;
    size_t len = (size_t)(1 + w->ngrp) * PAGE;
    int rc;

    if (!w->ngrp)
        return 0;
    wal__put32(d + PAGE - 16, w->ngrp);
    wal__put32(d + PAGE - 12, w->group);
    seal(d);
    XXH64_update(w->chain, d, PAGE);
    if ((rc = write_all(w->fd, d, len, (off_t)w->off)) < 0) {
        errmsg_set(err, "cannot write %s: %s", w->tmp, strerror(-rc));
        return rc;
    }
    w->off += len;
    w->group++;
    w->ngrp = 0;
    memset(d, 0, PAGE);
    return 0;
}

/* The slot of the next data page (its bytes are the caller's to fill). */
static uint8_t *slot(struct store_ckw *w)
{
    return w->grp + (size_t)(1 + w->ngrp) * PAGE;
}

/* Enter the filled slot as data page (layer, index). */
static int slot_commit(struct store_ckw *w, uint32_t layer, uint32_t index,
                       char *err)
{
    uint8_t *e = w->grp + (size_t)w->ngrp * 16;

    wal__put32(e, layer);
    wal__put32(e + 4, index);
    wal__put64(e + 8, XXH64(slot(w), PAGE, 0));
    w->ngrp++;
    w->pages++;
    return w->ngrp == STORE_CKF_GROUP ? group_flush(w, err) : 0;
}

int store__ckw_page(struct store_ckw *w, uint32_t layer, uint32_t index,
                    const void *data, size_t len, char *err)
{
    uint8_t *p = slot(w);

    /* Copied first: the checksum is of these bytes, the file gets these. */
    memcpy(p, data, len);
    if (len < PAGE)
        memset(p + len, 0, PAGE - len);
    return slot_commit(w, layer, index, err);
}

int store__ckw_stream(struct store_ckw *w, const void *data, size_t len,
                      char *err)
{
    const uint8_t *q = data;
    int rc;

    while (len) {
        size_t n = PAGE - w->spos < len ? PAGE - w->spos : len;
        memcpy(slot(w) + w->spos, q, n);
        w->spos += (uint32_t)n;
        w->stream += n;
        q += n;
        len -= n;
        if (w->spos == PAGE) {
            w->spos = 0;
            if ((rc = slot_commit(w, STORE_CKF_STREAM, (uint32_t)w->pages,
                                  err)) < 0)
                return rc;
        }
    }
    return 0;
}

void store__ckw_abort(struct store_ckw *w)
{
    if (!w)
        return;
    if (w->fd >= 0) {
        close(w->fd);
        unlink(w->tmp);
    }
    XXH64_freeState(w->chain);
    free(w->grp);
    free(w);
}

int store__ckw_finish(struct store_ckw *w, const uint8_t *meta, size_t mlen,
                      uint64_t *bytes, char *err)
{
    uint8_t h[PAGE];
    int rc;

    if (w->spos) {
        memset(slot(w) + w->spos, 0, PAGE - w->spos);
        w->spos = 0;
        if ((rc = slot_commit(w, STORE_CKF_STREAM, (uint32_t)w->pages, err)) < 0)
            goto fail;
    }
    if ((rc = group_flush(w, err)) < 0)
        goto fail;
    if (mlen > PAGE - 80) {
        errmsg_set(err, "filter header of %zu bytes does not fit", mlen);
        rc = -EINVAL;
        goto fail;
    }
    memset(h, 0, sizeof h);
    memcpy(h, page_magic, 8);
    wal__put32(h + 8, VERSION);
    wal__put32(h + 12, (uint32_t)w->type);
    wal__put64(h + 16, w->name.id);
    wal__put64(h + 24, w->name.from);
    wal__put64(h + 32, w->name.seq);
    wal__put64(h + 40, w->pages);
    wal__put64(h + 48, w->stream);
    wal__put64(h + 56, XXH64_digest(w->chain));
    wal__put32(h + 64, (uint32_t)mlen);
    memcpy(h + 72, meta, mlen);
    seal(h);
    if ((rc = write_all(w->fd, h, PAGE, 0)) < 0) {
        errmsg_set(err, "cannot write %s: %s", w->tmp, strerror(-rc));
        goto fail;
    }
    if (bytes)
        *bytes = w->off;
    rc = publish(w->fd, w->tmp, w->path, w->type, false, err);
    w->fd = -1;   /* publish closed it (and removed it on failure) */
    store__ckw_abort(w);
    return rc;
fail:
    store__ckw_abort(w);
    return rc;
}

/* ---- page files: reading ---- */

struct store_ckr {
    int fd;
    char path[PATH_LEN];
    uint8_t hdr[PAGE];
    uint64_t pages, stream, chain_want;
    uint8_t *grp;
    uint32_t ngrp, pos, group;
    uint64_t read;           /* data pages handed out or in the group */
    uint64_t off;
    XXH64_state_t *chain;
};

static int refuse(char *why, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int refuse(char *why, const char *path, const char *fmt, ...)
{
    char msg[512];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    errmsg_set(why, "checkpoint file %s is unusable: %s", path, msg);
    return -EBADMSG;
}

static int read_all(int fd, void *buf, size_t len, off_t off)
{
    uint8_t *p = buf;

    while (len) {
        ssize_t n = pread(fd, p, len, off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        if (n == 0)
            return -EBADMSG;
        p += n;
        len -= (size_t)n;
        off += n;
    }
    return 0;
}

void store__ckr_close(struct store_ckr *r)
{
    if (!r)
        return;
    if (r->fd >= 0)
        close(r->fd);
    if (r->chain)
        XXH64_freeState(r->chain);
    free(r->grp);
    free(r);
}

int store__ckr_open(struct store_ckr **out, const char *path,
                    const struct store_fname *n, int type, char *why)
{
    struct store_ckr *r = calloc(1, sizeof *r);
    struct stat st;
    int rc;

    *out = NULL;
    if (!r || !(r->grp = malloc((size_t)(1 + STORE_CKF_GROUP) * PAGE)) ||
        !(r->chain = XXH64_createState())) {
        if (r)
            free(r->grp);
        free(r);
        errmsg_set(why, "no memory to read %s", path);
        return -ENOMEM;
    }
    XXH64_reset(r->chain, 0);
    snprintf(r->path, sizeof r->path, "%s", path);
    if ((r->fd = open(path, O_RDONLY | O_CLOEXEC)) < 0) {
        rc = -errno;
        errmsg_set(why, "cannot open checkpoint file %s: %s", path, strerror(-rc));
        goto fail;
    }
    (void)posix_fadvise(r->fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    if (fstat(r->fd, &st) < 0) {
        rc = -errno;
        errmsg_set(why, "cannot stat %s: %s", path, strerror(-rc));
        goto fail;
    }
    if (st.st_size < PAGE) {
        rc = refuse(why, path, "truncated: %lld bytes", (long long)st.st_size);
        goto fail;
    }
    if ((rc = read_all(r->fd, r->hdr, PAGE, 0)) < 0) {
        if (rc != -EBADMSG)
            errmsg_set(why, "cannot read %s: %s", path, strerror(-rc));
        else
            refuse(why, path, "truncated");
        goto fail;
    }
    const uint8_t *h = r->hdr;
    if (memcmp(h, page_magic, 8) != 0 || !sealed(h)) {
        rc = refuse(why, path, "its header page fails its checksum (a torn, "
                    "zeroed or foreign page)");
        goto fail;
    }
    if (wal__get32(h + 8) != VERSION) {
        errmsg_set(why, "checkpoint file %s has format version %u; this build "
                   "reads version %u", path, wal__get32(h + 8), VERSION);
        rc = -EPROTONOSUPPORT;
        goto fail;
    }
    r->pages = wal__get64(h + 40);
    r->stream = wal__get64(h + 48);
    r->chain_want = wal__get64(h + 56);
    uint64_t groups = (r->pages + STORE_CKF_GROUP - 1) / STORE_CKF_GROUP;
    if (wal__get32(h + 12) != (uint32_t)type || wal__get64(h + 16) != n->id ||
        wal__get64(h + 24) != n->from || wal__get64(h + 32) != n->seq ||
        wal__get32(h + 64) > PAGE - 80 || wal__get32(h + 68) != 0 ||
        (type == STORE_CKF_RECORDS ? r->stream > r->pages * PAGE
                                   : r->stream != 0)) {
        rc = refuse(why, path, "its header does not match its name or type");
        goto fail;
    }
    if ((uint64_t)st.st_size != (1 + groups + r->pages) * (uint64_t)PAGE) {
        rc = refuse(why, path, "%lld bytes, its header describes %" PRIu64,
                    (long long)st.st_size, (1 + groups + r->pages) * (uint64_t)PAGE);
        goto fail;
    }
    r->off = PAGE;
    *out = r;
    return 0;
fail:
    store__ckr_close(r);
    return rc;
}

const uint8_t *store__ckr_meta(struct store_ckr *r, size_t *len)
{
    *len = wal__get32(r->hdr + 64);
    return r->hdr + 72;
}

uint64_t store__ckr_stream_bytes(struct store_ckr *r)
{
    return r->stream;
}

uint64_t store__ckr_pages(struct store_ckr *r)
{
    return r->pages;
}

/* Read and check the next group. */
static int group_read(struct store_ckr *r, char *why)
{
    uint64_t left = r->pages - r->read;
    int rc;

    if ((rc = read_all(r->fd, r->grp, PAGE, (off_t)r->off)) < 0)
        goto ioerr;
    uint32_t n = wal__get32(r->grp + PAGE - 16);
    if (!sealed(r->grp) || n == 0 || n > STORE_CKF_GROUP || n > left ||
        (n < STORE_CKF_GROUP && n != left) ||
        wal__get32(r->grp + PAGE - 12) != r->group)
        return refuse(why, r->path, "directory page %u (offset %" PRIu64 ") "
                      "fails its checksum or is out of place (a torn, zeroed "
                      "or foreign page)", r->group, r->off);
    XXH64_update(r->chain, r->grp, PAGE);
    if ((rc = read_all(r->fd, r->grp + PAGE, (size_t)n * PAGE,
                       (off_t)(r->off + PAGE))) < 0)
        goto ioerr;
    r->off += (uint64_t)(1 + n) * PAGE;
    r->ngrp = n;
    r->pos = 0;
    r->group++;
    r->read += n;
    return 0;
ioerr:
    if (rc == -EBADMSG)
        return refuse(why, r->path, "truncated at offset %" PRIu64, r->off);
    errmsg_set(why, "cannot read %s: %s", r->path, strerror(-rc));
    return rc;
}

int store__ckr_next(struct store_ckr *r, uint32_t *layer, uint32_t *index,
                    const uint8_t **data, char *why)
{
    int rc;

    if (r->pos == r->ngrp) {
        if (r->read == r->pages) {
            if (XXH64_digest(r->chain) != r->chain_want)
                return refuse(why, r->path, "its directory pages do not hash "
                              "to what its header says (a page replaced)");
            return 0;
        }
        if ((rc = group_read(r, why)) < 0)
            return rc;
    }
    const uint8_t *e = r->grp + (size_t)r->pos * 16;
    const uint8_t *d = r->grp + (size_t)(1 + r->pos) * PAGE;
    if (XXH64(d, PAGE, 0) != wal__get64(e + 8))
        return refuse(why, r->path, "data page %" PRIu64 " (layer %u, page %u) "
                      "fails its checksum (a torn or zeroed page)",
                      r->read - r->ngrp + r->pos, wal__get32(e), wal__get32(e + 4));
    *layer = wal__get32(e);
    *index = wal__get32(e + 4);
    *data = d;
    r->pos++;
    return 1;
}

/* ---- manifests ---- */

void store__manifest_fname(const struct store_manifest *m, uint32_t i,
                           struct store_fname *out)
{
    memset(out, 0, sizeof *out);
    out->id = m->id;
    out->seq = m->e[i].to;
    if (m->e[i].type == STORE_CKF_BASE) {
        out->kind = STORE_FILE_BASE;
    } else {
        out->kind = STORE_FILE_DELTA;
        out->from = m->e[i].from;
    }
}

int store__manifest_write(const char *dir, const struct store_manifest *m,
                          uint64_t lsn, char *err)
{
    struct store_fname n = {.kind = STORE_FILE_MANIFEST, .id = m->id,
                            .seq = m->seq, .lsn = lsn};
    char path[PATH_LEN], tmp[PATH_LEN];
    uint8_t p[PAGE];
    int fd, rc;

    memset(p, 0, sizeof p);
    memcpy(p, man_magic, 8);
    wal__put32(p + 8, VERSION);
    wal__put32(p + 12, m->n);
    wal__put64(p + 16, m->id);
    wal__put64(p + 24, m->seq);
    for (uint32_t i = 0; i < m->n; i++) {
        uint8_t *e = p + 64 + (size_t)i * 40;
        wal__put32(e, m->e[i].type);
        wal__put64(e + 8, m->e[i].from);
        wal__put64(e + 16, m->e[i].to);
        wal__put64(e + 24, m->e[i].lsn);
        wal__put64(e + 32, m->e[i].bytes);
    }
    seal(p);
    store__fname_path(path, sizeof path, dir, &n);
    if ((fd = tmp_open(path, tmp, sizeof tmp, err)) < 0)
        return fd;
    if ((rc = write_all(fd, p, PAGE, 0)) < 0) {
        errmsg_set(err, "cannot write %s: %s", tmp, strerror(-rc));
        close(fd);
        unlink(tmp);
        return rc;
    }
    return publish(fd, tmp, path, 0, true, err);
}

int store__manifest_read(const char *path, const struct store_fname *n,
                         struct store_manifest *m, char *why)
{
    uint8_t p[PAGE];
    struct stat st;
    int fd, rc;

    if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0) {
        rc = -errno;
        errmsg_set(why, "cannot open manifest %s: %s", path, strerror(-rc));
        return rc;
    }
    if (fstat(fd, &st) < 0 || st.st_size != PAGE) {
        close(fd);
        errmsg_set(why, "manifest %s is unusable: %lld bytes, not %u", path,
                   (long long)st.st_size, PAGE);
        return -EBADMSG;
    }
    rc = read_all(fd, p, PAGE, 0);
    close(fd);
    if (rc < 0) {
        errmsg_set(why, "cannot read manifest %s: %s", path,
                   rc == -EBADMSG ? "truncated" : strerror(-rc));
        return rc == -EBADMSG ? rc : rc;
    }
    if (memcmp(p, man_magic, 8) != 0 || !sealed(p)) {
        errmsg_set(why, "manifest %s is unusable: it fails its checksum (a "
                   "torn, zeroed or foreign page)", path);
        return -EBADMSG;
    }
    if (wal__get32(p + 8) != VERSION) {
        errmsg_set(why, "manifest %s has format version %u; this build reads "
                   "version %u", path, wal__get32(p + 8), VERSION);
        return -EPROTONOSUPPORT;
    }
    memset(m, 0, sizeof *m);
    m->n = wal__get32(p + 12);
    m->id = wal__get64(p + 16);
    m->seq = wal__get64(p + 24);
    bool ok = m->n >= 1 && m->n <= STORE_MANIFEST_MAX && m->id == n->id &&
              m->seq == n->seq;
    for (uint32_t i = 0; ok && i < m->n; i++) {
        const uint8_t *e = p + 64 + (size_t)i * 40;
        struct store_manifest_ent *x = &m->e[i];
        x->type = wal__get32(e);
        x->from = wal__get64(e + 8);
        x->to = wal__get64(e + 16);
        x->lsn = wal__get64(e + 24);
        x->bytes = wal__get64(e + 32);
        if (i == 0)
            ok = x->type == STORE_CKF_BASE && x->from == 0;
        else
            ok = (x->type == STORE_CKF_PAGES || x->type == STORE_CKF_RECORDS) &&
                 x->from == m->e[i - 1].to && x->to > x->from;
        ok = ok && wal__get32(e + 4) == 0;
    }
    if (ok && m->e[m->n - 1].to != m->seq)
        ok = false;
    if (!ok) {
        errmsg_set(why, "manifest %s is unusable: its entries do not chain up "
                   "to seq %" PRIu64, path, n->seq);
        return -EBADMSG;
    }
    return 0;
}

int store__manifest_advance(const char *dir, uint64_t id, uint64_t seq,
                            uint64_t old, uint64_t lsn, char *err)
{
    struct store_fname a = {.kind = STORE_FILE_MANIFEST, .id = id, .seq = seq,
                            .lsn = old};
    struct store_fname b = a;
    char from[PATH_LEN], to[PATH_LEN];
    int rc;

    b.lsn = lsn;
    store__fname_path(from, sizeof from, dir, &a);
    store__fname_path(to, sizeof to, dir, &b);
    if ((rc = store__ckpt_io.rename(from, to)) < 0) {
        errmsg_set(err, "cannot rename %s: %s", from, strerror(-rc));
        return rc;
    }
    store__ckpt_step_at(0, STORE_STEP_MANIFEST_RENAMED);
    if ((rc = store__ckpt_io.fsync_dir(dir)) < 0) {
        errmsg_set(err, "cannot fsync directory %s: %s", dir, strerror(-rc));
        return rc;
    }
    store__ckpt_step_at(0, STORE_STEP_MANIFEST_DURABLE);
    return 0;
}
