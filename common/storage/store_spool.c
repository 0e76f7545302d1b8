/* store_spool: an Import's file held on disk as it arrives, verified a
 * piece at a time, then applied a piece at a time (store.h, "Imports
 * spooled to disk and applied in pieces"). */
#include "store.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <xxhash.h>

#include "store_internal.h"
#include "store_names.h"

struct store_spool {
    struct store *s;
    int fd;
    uint64_t len, max;       /* bytes written; the most accepted */
};

int store_spool_new(struct store *s, uint64_t max, struct store_spool **out,
                    char *err)
{
    char path[STORE_PATH_LEN];
    struct store_spool *sp;
    int rc;

    *out = NULL;
    if (!(sp = calloc(1, sizeof(*sp)))) {
        errmsg_set(err, "out of memory");
        return -ENOMEM;
    }
    store__strfmt(path, sizeof(path), "%s/%sXXXXXX", s->dir, STORE_SPOOL_PREFIX);
    if ((sp->fd = mkostemp(path, O_CLOEXEC)) < 0) {
        rc = -errno;
        errmsg_set(err, "cannot make the Import's spool file in %s: %s", s->dir,
                   strerror(-rc));
        free(sp);
        return rc;
    }
    /* Nameless from here on: its blocks go with the last descriptor, so a
     * crash leaves nothing behind (store_scan removes one left between
     * mkostemp and this unlink). */
    if (unlink(path) < 0) {
        rc = -errno;
        errmsg_set(err, "cannot unlink the Import's spool file %s: %s", path,
                   strerror(-rc));
        close(sp->fd);
        free(sp);
        return rc;
    }
    sp->s = s;
    sp->max = max;
    *out = sp;
    return 0;
}

/* Take len more bytes of the store's spool bound; -EDQUOT when over. */
static int spool_charge(struct store *s, uint64_t len, char *err)
{
    uint64_t cur = atomic_load(&s->spooled);

    do {
        if (s->max_memory && (len > s->max_memory || cur > s->max_memory - len)) {
            errmsg_set(err, "the Import refused: %.1f MiB more of files waiting "
                       "on disk would take the node's Imports in flight past "
                       "max_memory_mb = %" PRIu64 " (%.1f MiB waiting)",
                       (double)len / 1048576.0, s->max_memory >> 20,
                       (double)cur / 1048576.0);
            return -EDQUOT;
        }
    } while (!atomic_compare_exchange_weak(&s->spooled, &cur, cur + len));
    return 0;
}

int store_spool_write(struct store_spool *sp, const void *buf, size_t len,
                      char *err)
{
    const uint8_t *p = buf;
    struct statvfs vfs;
    int rc;

    if (len > sp->max - sp->len) {
        errmsg_set(err, "the Import's file is larger than %" PRIu64 " bytes",
                   sp->max);
        return -E2BIG;
    }
    if (fstatvfs(sp->fd, &vfs) == 0 &&
        (uint64_t)vfs.f_bavail * vfs.f_frsize < STORE_SPOOL_FREE_MIN + len) {
        errmsg_set(err, "the Import refused: its file would leave less than "
                   "%" PRIu64 " MiB free on the file system of %s",
                   STORE_SPOOL_FREE_MIN >> 20, sp->s->dir);
        return -ENOSPC;
    }
    if ((rc = spool_charge(sp->s, len, err)) < 0)
        return rc;
    for (size_t done = 0; done < len;) {
        ssize_t w = pwrite(sp->fd, p + done, len - done, (off_t)(sp->len + done));
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            rc = w < 0 ? -errno : -EIO;
            errmsg_set(err, "cannot write the Import's spool file in %s: %s",
                       sp->s->dir, strerror(-rc));
            /* What was written of this piece is cut off again. */
            if (ftruncate(sp->fd, (off_t)sp->len) < 0) {
                /* the spool is thrown away by its caller anyway */
            }
            atomic_fetch_sub(&sp->s->spooled, len);
            return rc;
        }
        done += (size_t)w;
    }
    sp->len += len;
    return 0;
}

uint64_t store_spool_len(const struct store_spool *sp)
{
    return sp->len;
}

int store_spool_read(struct store_spool *sp, uint64_t at, void *buf, size_t len,
                     char *err)
{
    uint8_t *p = buf;

    if (at > sp->len || len > sp->len - at) {
        errmsg_set(err, "a read of %zu bytes at %" PRIu64 " past the %" PRIu64
                   " bytes spooled", len, at, sp->len);
        return -EINVAL;
    }
    for (size_t done = 0; done < len;) {
        ssize_t r = pread(sp->fd, p + done, len - done, (off_t)(at + done));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            int rc = r < 0 ? -errno : -EIO;
            errmsg_set(err, "cannot read the spool file in %s: %s", sp->s->dir,
                       strerror(-rc));
            return rc;
        }
        done += (size_t)r;
    }
    return 0;
}

void store_spool_free(struct store_spool *sp)
{
    if (!sp)
        return;
    close(sp->fd);
    atomic_fetch_sub(&sp->s->spooled, sp->len);
    free(sp);
}

/* ---- verifying and applying ---- */

/* One pass of bf_file_scan over the spool. */
struct import_pass {
    struct store_filter *sf;
    store_import_check_fn check;
    void *ctx;
    bool apply;                  /* the second pass */
    /* first pass: the file's kind and counts, the hash of each piece */
    enum bf_kind kind;
    struct store_import_counts counts;
    uint64_t *sums;
    size_t nsums, cap;
    /* second pass: the pages of the piece being filled */
    size_t at;                   /* the next piece's index */
    uint8_t *buf;                /* STORE_IMPORT_PIECE bytes */
    struct store_page *pages;    /* STORE_IMPORT_PIECE / RULES_PAGE_BYTES */
    size_t npages, used;
    char *err;
};

#define IMPORT_PAGES (STORE_IMPORT_PIECE / RULES_PAGE_BYTES)

static int pass_meta(void *ctx, const struct bf *f)
{
    struct import_pass *ip = ctx;
    int rc;

    if (ip->apply) {
        if (bf_kind(f) == ip->kind)
            return 0;
        errmsg_set(ip->err, "the Import's spooled file changed on disk after "
                   "it was checked (its header): not applied");
        return -EIO;
    }
    ip->kind = bf_kind(f);
    ip->counts.inserts = bf_insert_count(f);
    ip->counts.keys = bf_keys_added(f);
    ip->counts.nlayers = bf_layer_count(f);
    for (uint32_t i = 0; i < ip->counts.nlayers && i < BF_MAX_LAYERS; i++) {
        struct bf_layer_info li;
        ip->counts.layer_counts[i] = bf_layer_info(f, i, &li) == 0 ? li.count : 0;
    }
    if (ip->check && (rc = ip->check(ip->ctx, f)) < 0)
        return rc;
    return 0;
}

/* OR in the pages held: one durable record.  Returns 0 or the store's
 * error. */
static int pass_flush(struct import_pass *ip)
{
    int rc = 0;

    if (ip->npages)
        rc = store_or_pages(ip->sf, ip->pages, ip->npages, ip->err);
    ip->npages = 0;
    ip->used = 0;
    return rc;
}

static int pass_body(void *ctx, uint32_t layer, uint64_t off, const void *data,
                     size_t n)
{
    struct import_pass *ip = ctx;
    uint64_t sum = XXH64(data, n, 0);

    if (!ip->apply) {
        if (ip->nsums == ip->cap) {
            size_t cap = ip->cap ? 2 * ip->cap : 256;
            uint64_t *v = realloc(ip->sums, cap * sizeof(*v));
            if (!v)
                return -ENOMEM;
            ip->sums = v;
            ip->cap = cap;
        }
        ip->sums[ip->nsums++] = sum;
        return 0;
    }
    if (ip->at >= ip->nsums || ip->sums[ip->at] != sum) {
        errmsg_set(ip->err, "the Import's spooled file changed on disk after it "
                   "was checked (piece %zu): not applied further", ip->at);
        return -EIO;
    }
    ip->at++;
    /* Into the piece buffer as pages of RULES_PAGE_BYTES (the scan's pieces
     * start at page boundaries of their layer). */
    for (size_t done = 0; done < n;) {
        if (ip->npages == IMPORT_PAGES ||
            (ip->npages && ip->pages[0].layer != layer)) {
            int rc = pass_flush(ip);
            if (rc < 0)
                return rc;
        }
        size_t len = n - done < RULES_PAGE_BYTES ? n - done : RULES_PAGE_BYTES;
        uint8_t *q = ip->buf + ip->used;
        memcpy(q, (const uint8_t *)data + done, len);
        ip->pages[ip->npages++] = (struct store_page){
            .layer = layer, .offset = off + done, .data = q, .len = len};
        ip->used += len;
        done += len;
    }
    return 0;
}

static void project(const struct bf *f, void *ctx)
{
    /* The merge is done: the projection of merging nothing more. */
    bf_merge_project(f, f, ctx, NULL);
}

/* The file whole into one import record, merged as store_import_file: the
 * kinds whose merge is not an OR of pages. */
static int import_whole(struct store_filter *sf, struct store_spool *sp,
                        char *err)
{
    struct store_import_file *file;
    char what[STORE_NAME_MAX + 32];
    /* The file in its log record, and the piece it is read by as it is
     * checked and merged (the log writes it from the record). */
    uint64_t len = sp->len, hold = len + (2u << 20);
    int rc;

    store__strfmt(what, sizeof(what), "the import into '%s'", sf->name);
    if ((rc = store_reserve(sf->s, hold, what, err)) < 0)
        return rc;
    if (!(file = store_import_file_new(NULL, (size_t)len, err))) {
        store_release(sf->s, hold);
        return -ENOMEM;
    }
    uint8_t *p = (uint8_t *)store_import_file_bytes(file);
    for (uint64_t done = 0; done < len;) {
        ssize_t r = pread(sp->fd, p + done, (size_t)(len - done), (off_t)done);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            rc = r < 0 ? -errno : -EIO;
            errmsg_set(err, "cannot read the Import's spool file: %s",
                       strerror(-rc));
            store_import_file_free(file);
            store_release(sf->s, hold);
            return rc;
        }
        done += (uint64_t)r;
    }
    char berr[BF_ERRLEN] = "";
    if (bf_file_scan_mem(p, (size_t)len, NULL, NULL, NULL, berr) < 0) {
        errmsg_set(err, "the Import's spooled file changed on disk after it was "
                   "checked: %s", berr);
        store_import_file_free(file);
        store_release(sf->s, hold);
        return -EIO;
    }
    rc = store_import_file(sf, file, err);   /* takes it */
    store_release(sf->s, hold);
    return rc;
}

int store_import_spool(struct store_filter *sf, struct store_spool *sp,
                       store_import_check_fn check, void *ctx,
                       struct bf_merge_projection *proj, char *err)
{
    struct import_pass ip = {.sf = sf, .check = check, .ctx = ctx, .err = err};
    char berr[BF_ERRLEN] = "", what[STORE_NAME_MAX + 32];
    uint64_t hold = 0;
    int rc;

    /* What the call holds, from the check on: the 1 MiB the file is read
     * by, then a piece's pages and their log record (which the log writes
     * from where it is, not from a copy in its buffer). */
    hold = 2 * (uint64_t)STORE_IMPORT_PIECE + (1u << 20);
    store__strfmt(what, sizeof(what), "the import into '%s'", sf->name);
    if ((rc = store_reserve(sf->s, hold, what, err)) < 0) {
        hold = 0;
        goto out;
    }
    /* The whole file checked before anything is applied. */
    rc = bf_file_scan(sp->fd, 0, sp->len, pass_meta, pass_body, &ip, berr);
    if (rc < 0) {
        if (rc == -ENOMEM && !berr[0])
            errmsg_set(err, "out of memory");
        else if (berr[0])
            errmsg_set(err, "%s", berr);
        goto out;
    }
    if (ip.kind != BF_KIND_BLOCKED && ip.kind != BF_KIND_CLASSIC) {
        store_release(sf->s, hold);   /* import_whole counts its own */
        hold = 0;
        rc = import_whole(sf, sp, err);
        goto done;
    }
    ip.buf = malloc(STORE_IMPORT_PIECE);
    ip.pages = malloc(IMPORT_PAGES * sizeof(*ip.pages));
    if (!ip.buf || !ip.pages) {
        errmsg_set(err, "out of memory");
        rc = -ENOMEM;
        goto out;
    }
    ip.apply = true;
    berr[0] = '\0';
    rc = bf_file_scan(sp->fd, 0, sp->len, pass_meta, pass_body, &ip, berr);
    if (rc == 0)
        rc = pass_flush(&ip);
    if (rc < 0) {
        if (berr[0] && err && !err[0])
            errmsg_set(err, "%s", berr);
        goto out;
    }
    if ((rc = store_import_counts(sf, &ip.counts, err)) < 0)
        goto out;
done:
    if (rc == 0 && proj) {
        memset(proj, 0, sizeof(*proj));
        (void)store_filter_inspect(sf, project, proj);
    }
out:
    if (hold)
        store_release(sf->s, hold);
    free(ip.buf);
    free(ip.pages);
    free(ip.sums);
    return rc;
}
