/* bundle: shard bundles (see bundle.h and docs/FORMAT.md).
 *
 * One writer and one frame parser; everything else is built on them.  The
 * writer checksums each byte as it passes, so a bundle can be produced from
 * shards that are never in memory at once.  The parser checks the frame
 * completely (version before checksum, like filter files, so a later
 * version is named as such) before it hands out any entry.  Loading a
 * bundle holds the file in memory once, as bf_file_parse needs it.
 */
#include "errmsg.h"
#include "bundle.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define XXH_STATIC_LINKING_ONLY   /* XXH3_state_t on the stack */
#include <xxhash.h>

#include "durable.h"

#define BUNDLE_MIN_BYTES (BUNDLE_HEAD_BYTES + BUNDLE_TRAILER_BYTES)

static uint64_t get_le(const uint8_t *p, int n)
{
    uint64_t v = 0;

    for (int i = n - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static void put_le(uint8_t *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

bool bundle_is(const void *buf, size_t len)
{
    return len >= 8 && memcmp(buf, BUNDLE_MAGIC, 8) == 0;
}

bool bundle_file_is(const char *path)
{
    char head[8];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    bool is;

    if (fd < 0)
        return false;
    is = read(fd, head, sizeof head) == (ssize_t)sizeof head &&
         bundle_is(head, sizeof head);
    close(fd);
    return is;
}

/* ---- writer ----------------------------------------------------------- */

static int writer_put(struct bundle_writer *w, const void *buf, size_t len)
{
    int rc;

    XXH3_64bits_update(w->xx, buf, len);
    rc = w->write(w->ctx, buf, len);
    return rc > 0 ? 0 : rc;
}

int bundle_writer_begin(struct bundle_writer *w, uint32_t count,
                        bf_file_writer write, void *ctx)
{
    uint8_t head[BUNDLE_HEAD_BYTES];
    int rc;

    *w = (struct bundle_writer){.write = write, .ctx = ctx, .count = count};
    if (count == 0)
        return -EINVAL;
    if (!(w->xx = XXH3_createState()))
        return -ENOMEM;
    XXH3_64bits_reset(w->xx);
    memcpy(head, BUNDLE_MAGIC, 8);
    put_le(head + 8, BUNDLE_VERSION, 4);
    put_le(head + 12, count, 4);
    if ((rc = writer_put(w, head, sizeof head)) < 0)
        bundle_writer_abort(w);
    return rc;
}

int bundle_writer_entry(struct bundle_writer *w, uint32_t index, uint64_t len)
{
    uint8_t entry[BUNDLE_ENTRY_BYTES];

    if (!w->xx || w->left || index != w->entries || index >= w->count)
        return -EINVAL;
    put_le(entry, index, 4);
    put_le(entry + 4, len, 8);
    w->entries++;
    w->left = len;
    return writer_put(w, entry, sizeof entry);
}

int bundle_writer_data(void *ctx, const void *buf, size_t len)
{
    struct bundle_writer *w = ctx;

    if (!w->xx || len > w->left)
        return -EINVAL;
    w->left -= len;
    return len ? writer_put(w, buf, len) : 0;
}

int bundle_writer_end(struct bundle_writer *w)
{
    uint8_t sum[BUNDLE_TRAILER_BYTES];
    int rc = -EINVAL;

    if (w->xx && !w->left && w->entries == w->count) {
        put_le(sum, XXH3_64bits_digest(w->xx), 8);
        rc = w->write(w->ctx, sum, sizeof sum);
        rc = rc > 0 ? 0 : rc;
    }
    bundle_writer_abort(w);
    return rc;
}

void bundle_writer_abort(struct bundle_writer *w)
{
    XXH3_freeState(w->xx);
    w->xx = NULL;
}

/* ---- frame parser ----------------------------------------------------- */

/* Magic, size, version, checksum and a shard count that fits. */
static int parse_head(const uint8_t *p, size_t len, uint32_t *count,
                      char *err)
{
    uint32_t version, S;

    if (len < 8 ? len == 0 || memcmp(p, BUNDLE_MAGIC, len) != 0
                : memcmp(p, BUNDLE_MAGIC, 8) != 0) {
        errmsg_set(err, "bad magic: not a shard bundle");
        return -EBADMSG;
    }
    if (len < BUNDLE_MIN_BYTES + BUNDLE_ENTRY_BYTES) {
        errmsg_set(err, "truncated: %zu bytes, too few for a bundle of one "
                   "shard", len);
        return -EBADMSG;
    }
    version = (uint32_t)get_le(p + 8, 4);
    if (version != BUNDLE_VERSION) {
        errmsg_set(err, "unsupported version: bundle version %u (this build "
                   "reads version %d)", version, BUNDLE_VERSION);
        return -EPROTONOSUPPORT;
    }
    if (get_le(p + len - 8, 8) != XXH3_64bits(p, len - 8)) {
        errmsg_set(err, "checksum mismatch: the bundle is damaged or truncated");
        return -EBADMSG;
    }
    S = (uint32_t)get_le(p + 12, 4);
    if (S == 0 || S > (len - BUNDLE_MIN_BYTES) / BUNDLE_ENTRY_BYTES) {
        errmsg_set(err, "bad bundle: %u shards cannot be in %zu bytes", S, len);
        return -EBADMSG;
    }
    *count = S;
    return 0;
}

int bundle_layout_parse(const void *buf, size_t len, struct bundle_layout *out,
                        char *err)
{
    const uint8_t *p = buf, *end;
    int rc;

    out->count = 0;
    out->entry = NULL;
    if ((rc = parse_head(p, len, &out->count, err)) < 0)
        return rc;
    end = p + len - BUNDLE_TRAILER_BYTES;
    if (!(out->entry = calloc(out->count, sizeof *out->entry))) {
        errmsg_set(err, "out of memory");
        return -ENOMEM;
    }
    p += BUNDLE_HEAD_BYTES;
    for (uint32_t i = 0; i < out->count; i++) {
        uint64_t index, flen;
        if (end - p < BUNDLE_ENTRY_BYTES) {
            errmsg_set(err, "bad bundle: the entry of shard %u runs past the "
                       "end", i);
            goto fail;
        }
        index = get_le(p, 4);
        flen = get_le(p + 4, 8);
        p += BUNDLE_ENTRY_BYTES;
        if (index != i) {
            errmsg_set(err, "bad bundle: entry %u is for shard %llu (entries go "
                       "in shard order)", i, (unsigned long long)index);
            goto fail;
        }
        if (flen > (uint64_t)(end - p)) {
            errmsg_set(err, "bad bundle: shard %u is %llu bytes long, past the "
                       "end of the bundle", i, (unsigned long long)flen);
            goto fail;
        }
        out->entry[i] = (struct bundle_entry){.file = p, .len = flen};
        p += flen;
    }
    if (p != end) {
        errmsg_set(err, "bad bundle: %zu bytes after the last shard",
                   (size_t)(end - p));
        goto fail;
    }
    return 0;
fail:
    bundle_layout_deinit(out);
    return -EBADMSG;
}

static int pread_all(int fd, void *buf, size_t len, uint64_t at, char *err)
{
    uint8_t *p = buf;

    while (len > 0) {
        ssize_t n = pread(fd, p, len, (off_t)at);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            int rc = n < 0 ? -errno : -EBADMSG;
            errmsg_set(err, n < 0 ? "read failed: %s" : "truncated: %s",
                       n < 0 ? strerror(errno) : "the file shrank while it "
                       "was read");
            return rc;
        }
        p += n;
        at += (uint64_t)n;
        len -= (size_t)n;
    }
    return 0;
}

int bundle_file_entry(int fd, uint64_t size, uint32_t index, uint32_t *count,
                      uint64_t *off, uint64_t *len, char *err)
{
    uint8_t h[BUNDLE_HEAD_BYTES], e[BUNDLE_ENTRY_BYTES];
    uint64_t at = BUNDLE_HEAD_BYTES, end;
    uint32_t version, S;
    int rc;

    *count = 0;
    if (size < BUNDLE_MIN_BYTES + BUNDLE_ENTRY_BYTES) {
        errmsg_set(err, "truncated: %llu bytes, too few for a bundle of one "
                   "shard", (unsigned long long)size);
        return -EBADMSG;
    }
    if ((rc = pread_all(fd, h, sizeof h, 0, err)) < 0)
        return rc;
    if (memcmp(h, BUNDLE_MAGIC, 8) != 0) {
        errmsg_set(err, "bad magic: not a shard bundle");
        return -EBADMSG;
    }
    version = (uint32_t)get_le(h + 8, 4);
    if (version != BUNDLE_VERSION) {
        errmsg_set(err, "unsupported version: bundle version %u (this build "
                   "reads version %d)", version, BUNDLE_VERSION);
        return -EPROTONOSUPPORT;
    }
    S = (uint32_t)get_le(h + 12, 4);
    if (S == 0 || S > (size - BUNDLE_MIN_BYTES) / BUNDLE_ENTRY_BYTES) {
        errmsg_set(err, "bad bundle: %u shards cannot be in %llu bytes", S,
                   (unsigned long long)size);
        return -EBADMSG;
    }
    *count = S;
    end = size - BUNDLE_TRAILER_BYTES;
    for (uint32_t i = 0; i < S; i++) {
        if (end - at < BUNDLE_ENTRY_BYTES) {
            errmsg_set(err, "bad bundle: the entry of shard %u runs past the "
                       "end", i);
            return -EBADMSG;
        }
        if ((rc = pread_all(fd, e, sizeof e, at, err)) < 0)
            return rc;
        uint64_t ix = get_le(e, 4), flen = get_le(e + 4, 8);
        at += BUNDLE_ENTRY_BYTES;
        if (ix != i) {
            errmsg_set(err, "bad bundle: entry %u is for shard %llu (entries "
                       "go in shard order)", i, (unsigned long long)ix);
            return -EBADMSG;
        }
        if (flen > end - at) {
            errmsg_set(err, "bad bundle: shard %u is %llu bytes long, past the "
                       "end of the bundle", i, (unsigned long long)flen);
            return -EBADMSG;
        }
        if (i == index) {
            *off = at;
            *len = flen;
        }
        at += flen;
    }
    if (at != end) {
        errmsg_set(err, "bad bundle: %llu bytes after the last shard",
                   (unsigned long long)(end - at));
        return -EBADMSG;
    }
    if (index >= S) {
        errmsg_set(err, "bad bundle: no shard %u in a bundle of %u", index, S);
        return -ERANGE;
    }
    return 0;
}

void bundle_layout_deinit(struct bundle_layout *l)
{
    free(l->entry);
    l->entry = NULL;
    l->count = 0;
}

const char *bundle_shard_mismatch(const struct bf *f, uint32_t index,
                                  uint32_t count, const uint8_t *secret)
{
    if (memcmp(bf_secret(f), secret, BF_SECRET_LEN) != 0)
        return "secret";
    if (bf_shard_index(f) != index)
        return "shard_index";
    if (bf_shard_count(f) != count)
        return "shard_count";
    return NULL;
}

/* ---- parsed level ------------------------------------------------------ */

/* A shard bundle's fingerprint id, a shard at a time: shard ids in order
 * into fp_add, the id out of fp_end. */
static void fp_add(XXH3_state_t *xs, const struct bf *f)
{
    char id[17];

    bf_fingerprint_id(f, id);
    XXH3_64bits_update(xs, id, sizeof id);
}

static void fp_end(XXH3_state_t *xs, char out[17])
{
    snprintf(out, 17, "%016llx", (unsigned long long)XXH3_64bits_digest(xs));
}

void bundle_fingerprint_id(const struct bundle *b, char out[17])
{
    XXH3_state_t xs;

    if (b->plain) {
        bf_fingerprint_id(b->shard[0], out);
        return;
    }
    XXH3_64bits_reset(&xs);
    for (uint32_t i = 0; i < b->count; i++)
        fp_add(&xs, b->shard[i]);
    fp_end(&xs, out);
}

void bundle_destroy(struct bundle *b)
{
    if (!b)
        return;
    for (uint32_t i = 0; i < b->count; i++)
        bf_destroy(b->shard[i]);
    free(b->shard);
    free(b);
}

static struct bundle *bundle_alloc(uint32_t count, bool plain, char *err)
{
    struct bundle *b = calloc(1, sizeof *b);

    if (b && !(b->shard = calloc(count, sizeof *b->shard))) {
        free(b);
        b = NULL;
    }
    if (!b) {
        errmsg_set(err, "out of memory");
        return NULL;
    }
    b->count = count;
    b->plain = plain;
    return b;
}

struct bundle *bundle_of_filter(struct bf *f, char *err)
{
    struct bundle *b = bundle_alloc(1, true, err);

    if (!b) {
        bf_destroy(f);
        return NULL;
    }
    b->shard[0] = f;
    return b;
}

/* Parse shard i of a verified frame. */
static int parse_shard(struct bundle *b, const struct bundle_layout *l,
                       uint32_t i, char *err)
{
    char serr[BF_ERRLEN];
    const struct bf *f;
    const char *field;

    b->shard[i] = bf_file_parse(l->entry[i].file, l->entry[i].len, serr);
    if (!(f = b->shard[i])) {
        errmsg_set(err, "shard %u: %s", i, serr);
        return -EBADMSG;
    }
    field = bundle_shard_mismatch(f, i, l->count, bf_secret(b->shard[0]));
    if (field && strcmp(field, "secret") == 0) {
        errmsg_set(err, "bad bundle: shard %u has another secret than shard 0",
                   i);
        return -EBADMSG;
    }
    if (field) {
        errmsg_set(err, "bad bundle: entry %u holds shard %u of %u, not %u of %u",
                   i, bf_shard_index(f), bf_shard_count(f), i, l->count);
        return -EBADMSG;
    }
    return 0;
}

struct bundle *bundle_parse(const void *buf, size_t len, char *err)
{
    struct bundle_layout l;
    struct bundle *b = NULL;
    struct bf *f;

    if (!bundle_is(buf, len)) {
        f = bf_file_parse(buf, len, err);
        return f ? bundle_of_filter(f, err) : NULL;
    }
    if (bundle_layout_parse(buf, len, &l, err) < 0)
        return NULL;
    if (!(b = bundle_alloc(l.count, false, err)))
        goto out;
    for (uint32_t i = 0; i < l.count; i++)
        if (parse_shard(b, &l, i, err) < 0) {
            bundle_destroy(b);
            b = NULL;
            break;
        }
out:
    bundle_layout_deinit(&l);
    return b;
}

/* The whole file at path, malloc'd. */
static uint8_t *read_file(const char *path, size_t *len, char *err)
{
    struct stat st;
    uint8_t *buf = NULL;
    size_t got = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);

    if (fd < 0) {
        errmsg_set(err, "cannot open: %s", strerror(errno));
        return NULL;
    }
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        errmsg_set(err, "cannot open: not a regular file");
        goto fail;
    }
    if (!(buf = malloc(st.st_size ? (size_t)st.st_size : 1))) {
        errmsg_set(err, "out of memory");
        goto fail;
    }
    while (got < (size_t)st.st_size) {
        ssize_t n = read(fd, buf + got, (size_t)st.st_size - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            errmsg_set(err, "read failed: %s", n < 0 ? strerror(errno)
                       : "the file shrank");
            goto fail;
        }
        got += (size_t)n;
    }
    close(fd);
    *len = got;
    return buf;
fail:
    free(buf);
    close(fd);
    return NULL;
}

struct bundle *bundle_load(const char *path, char *err)
{
    struct bundle *b;
    uint8_t *buf;
    size_t len;

    /* A plain file streams into its filter: no second copy in memory. */
    if (!bundle_file_is(path)) {
        struct bf *f = bf_file_load(path, err, NULL);
        return f ? bundle_of_filter(f, err) : NULL;
    }
    if (!(buf = read_file(path, &len, err)))
        return NULL;
    b = bundle_parse(buf, len, err);
    free(buf);
    return b;
}

/* bundle_file_verify: each shard's meta is checked against its entry and
 * shard 0's secret as bundle_parse does (parse_shard). */
struct verify_shard {
    uint32_t index, count;
    uint8_t secret[BF_SECRET_LEN];
    bool plain;
    bundle_meta_fn fn;
    void *ctx;
    XXH3_state_t fp;
    char plain_fp[17];
    char *err;
};

/* The caller's fn, and the shard's share of the fingerprint id. */
static int describe_meta(struct verify_shard *v, const struct bf *f)
{
    int rc;

    if (v->plain)
        bf_fingerprint_id(f, v->plain_fp);
    else
        fp_add(&v->fp, f);
    if (v->fn && (rc = v->fn(v->ctx, v->index, v->count, f)) < 0)
        return rc;
    return 0;
}

static int verify_meta(void *ctx, const struct bf *f)
{
    struct verify_shard *v = ctx;
    const char *field;

    if (v->plain)
        return describe_meta(v, f);
    if (v->index == 0)
        memcpy(v->secret, bf_secret(f), BF_SECRET_LEN);
    field = bundle_shard_mismatch(f, v->index, v->count, v->secret);
    if (field && strcmp(field, "secret") == 0) {
        errmsg_set(v->err, "bad bundle: shard %u has another secret than shard 0",
                   v->index);
        return -EBADMSG;
    }
    if (field) {
        errmsg_set(v->err, "bad bundle: entry %u holds shard %u of %u, not %u of %u",
                   v->index, bf_shard_index(f), bf_shard_count(f), v->index, v->count);
        return -EBADMSG;
    }
    return describe_meta(v, f);
}

/* The trailer: an XXH3-64 of every byte before it, read a piece at a time. */
static int verify_trailer(int fd, uint64_t size, char *err)
{
    enum { PIECE = 1 << 20 };
    uint8_t *buf = malloc(PIECE), t[BUNDLE_TRAILER_BYTES];
    XXH3_state_t *xs = XXH3_createState();
    int rc = -ENOMEM;

    if (!buf || !xs) {
        errmsg_set(err, "out of memory");
        goto out;
    }
    XXH3_64bits_reset(xs);
    for (uint64_t at = 0; at < size - BUNDLE_TRAILER_BYTES;) {
        uint64_t left = size - BUNDLE_TRAILER_BYTES - at;
        size_t n = left < PIECE ? (size_t)left : PIECE;
        if ((rc = pread_all(fd, buf, n, at, err)) < 0)
            goto out;
        XXH3_64bits_update(xs, buf, n);
        at += n;
    }
    if ((rc = pread_all(fd, t, sizeof t, size - BUNDLE_TRAILER_BYTES, err)) < 0)
        goto out;
    rc = 0;
    if (get_le(t, 8) != XXH3_64bits_digest(xs)) {
        errmsg_set(err, "checksum mismatch: the bundle is damaged or truncated");
        rc = -EBADMSG;
    }
out:
    free(buf);
    if (xs)
        XXH3_freeState(xs);
    return rc;
}

int bundle_file_verify(const char *path, char *err)
{
    return bundle_file_describe(path, NULL, NULL, NULL, err);
}

int bundle_file_describe(const char *path, bundle_meta_fn fn, void *ctx,
                         char fp_out[17], char *err)
{
    char serr[BF_ERRLEN];
    struct verify_shard v = {.err = err, .fn = fn, .ctx = ctx};
    uint64_t size, off, len, at;
    struct stat sb;
    int fd, rc;

    if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0) {
        errmsg_set(err, "cannot open: %s", strerror(errno));
        return -errno;
    }
    if (fstat(fd, &sb) < 0) {
        rc = -errno;
        errmsg_set(err, "cannot stat: %s", strerror(errno));
        goto out;
    }
    size = (uint64_t)sb.st_size;
    XXH3_64bits_reset(&v.fp);
    if (!bundle_file_is(path)) {
        v.plain = true;
        v.count = 1;
        rc = bf_file_scan(fd, 0, size, verify_meta, NULL, &v, err);
        if (rc == 0 && fp_out)
            snprintf(fp_out, 17, "%s", v.plain_fp);
        goto out;
    }
    /* In bundle_parse's order: the header, the trailer, the frame (every
     * entry in order, nothing after the last), then each shard's file. */
    if (size < BUNDLE_MIN_BYTES + BUNDLE_ENTRY_BYTES) {
        errmsg_set(err, "truncated: %llu bytes, too few for a bundle of one "
                   "shard", (unsigned long long)size);
        rc = -EBADMSG;
        goto out;
    }
    uint8_t h[BUNDLE_HEAD_BYTES];
    if ((rc = pread_all(fd, h, sizeof h, 0, err)) < 0)
        goto out;
    if (get_le(h + 8, 4) != BUNDLE_VERSION) {
        errmsg_set(err, "unsupported version: bundle version %u (this build "
                   "reads version %d)", (uint32_t)get_le(h + 8, 4), BUNDLE_VERSION);
        rc = -EPROTONOSUPPORT;
        goto out;
    }
    if ((rc = verify_trailer(fd, size, err)) < 0 ||
        (rc = bundle_file_entry(fd, size, 0, &v.count, &off, &len, err)) < 0)
        goto out;
    at = off;
    for (v.index = 0; v.index < v.count; v.index++) {
        if (v.index > 0) {
            uint8_t e[BUNDLE_ENTRY_BYTES];
            if ((rc = pread_all(fd, e, sizeof e, at, err)) < 0)
                goto out;
            len = get_le(e + 4, 8);
            at += BUNDLE_ENTRY_BYTES;
        }
        serr[0] = '\0';
        if ((rc = bf_file_scan(fd, at, len, verify_meta, NULL, &v, serr)) < 0) {
            if (serr[0])
                errmsg_set(err, "shard %u: %s", v.index, serr);
            goto out;
        }
        at += len;
    }
    if (fp_out)
        fp_end(&v.fp, fp_out);
    rc = 0;
out:
    close(fd);
    return rc;
}

struct bundle *bundle_create_like(const struct bundle *tmpl, char *err)
{
    struct bundle *b = bundle_alloc(tmpl->count, tmpl->plain, err);

    if (!b)
        return NULL;
    for (uint32_t i = 0; i < b->count; i++) {
        if (!(b->shard[i] = bf_create_like(tmpl->shard[i], err))) {
            bundle_destroy(b);
            return NULL;
        }
    }
    return b;
}

int bundle_write(const struct bundle *b, bf_file_writer write, void *ctx)
{
    struct bundle_writer w;
    int rc;

    if (b->plain)
        return bf_file_write(b->shard[0], write, ctx);
    if ((rc = bundle_writer_begin(&w, b->count, write, ctx)) < 0)
        return rc;
    for (uint32_t i = 0; i < b->count; i++) {
        if ((rc = bundle_writer_entry(&w, i, bf_file_size(b->shard[i]))) < 0 ||
            (rc = bf_file_write(b->shard[i], bundle_writer_data, &w)) < 0) {
            bundle_writer_abort(&w);
            return rc;
        }
    }
    return bundle_writer_end(&w);
}

static int fd_write(void *ctx, const void *buf, size_t len)
{
    return durable_write_all(*(int *)ctx, buf, len);
}

static int fill_bundle(int fd, void *ctx)
{
    return bundle_write(ctx, fd_write, &fd);
}

int bundle_save(const struct bundle *b, const char *path, char *err)
{
    char derr[DURABLE_ERRLEN] = "";
    int rc;

    if (b->plain)
        return bf_file_save(b->shard[0], path, err);
    if ((rc = durable_write_with(path, fill_bundle, (void *)b, 0, derr)) < 0)
        errmsg_set(err, "%s", derr);
    return rc;
}

void bundle_set_exclusive(struct bundle *b, bool exclusive)
{
    for (uint32_t i = 0; i < b->count; i++)
        bf_set_exclusive(b->shard[i], exclusive);
}

/* Keys of a batch hashed before their shards are touched, and each
 * shard's block prefetched this many keys ahead of its add or query: the
 * misses of a large bundle then overlap (one key at a time, a 4 GiB bundle
 * built about 400 ns a key, nearly all of it waiting on memory).  The keys
 * are still added in their order, so the bits and counts are those of one
 * add after the other. */
#define BUNDLE_CHUNK 256
#define BUNDLE_AHEAD 16

static size_t hash_chunk(const struct bundle *b, const void *const *keys,
                         const size_t *lens, size_t n, struct bf_hash *h,
                         struct bf **sh)
{
    if (n > BUNDLE_CHUNK)
        n = BUNDLE_CHUNK;
    for (size_t i = 0; i < n; i++) {
        h[i] = bundle_hash(b, keys[i], lens[i]);
        sh[i] = bundle_shard_of(b, h[i]);
    }
    for (size_t i = 0; i < n && i < BUNDLE_AHEAD; i++)
        bf_prefetch_hash(sh[i], h[i]);
    return n;
}

void bundle_add_keys(struct bundle *b, const void *const *keys,
                     const size_t *lens, size_t n)
{
    struct bf_hash h[BUNDLE_CHUNK];
    struct bf *sh[BUNDLE_CHUNK];

    if (b->count == 1) {
        bf_add_keys(b->shard[0], keys, lens, n, NULL);
        return;
    }
    for (size_t at = 0; at < n;) {
        size_t m = hash_chunk(b, keys + at, lens + at, n - at, h, sh);
        for (size_t i = 0; i < m; i++) {
            if (i + BUNDLE_AHEAD < m)
                bf_prefetch_hash(sh[i + BUNDLE_AHEAD], h[i + BUNDLE_AHEAD]);
            bf_add_hash(sh[i], h[i]);
        }
        at += m;
    }
}

void bundle_may_contain_keys(const struct bundle *b, const void *const *keys,
                             const size_t *lens, size_t n, bool *out)
{
    struct bf_hash h[BUNDLE_CHUNK];
    struct bf *sh[BUNDLE_CHUNK];

    if (b->count == 1) {
        bf_may_contain_keys(b->shard[0], keys, lens, n, out);
        return;
    }
    for (size_t at = 0; at < n;) {
        size_t m = hash_chunk(b, keys + at, lens + at, n - at, h, sh);
        for (size_t i = 0; i < m; i++) {
            if (i + BUNDLE_AHEAD < m)
                bf_prefetch_hash(sh[i + BUNDLE_AHEAD], h[i + BUNDLE_AHEAD]);
            out[at + i] = bf_may_contain_hash(sh[i], h[i]);
        }
        at += m;
    }
}
