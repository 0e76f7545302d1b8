/* bundle: shard bundles (see bundle.h).  Reading holds the whole file in
 * memory once, like bf_file_parse; writing streams each shard through
 * bf_file_write into the temp file while a running XXH3-64 covers every
 * byte. */
#include "bundle.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h>

#include "bf_file.h"
#include "cli.h"

#define HEAD_BYTES 16
#define ENTRY_BYTES 12

static void set_err(char *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void set_err(char *err, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(err, BF_ERRLEN, fmt, ap);
    va_end(ap);
}

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
    bool is = false;

    if (fd < 0)
        return false;
    is = read(fd, head, sizeof head) == (ssize_t)sizeof head &&
         bundle_is(head, sizeof head);
    close(fd);
    return is;
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

static struct bundle *bundle_alloc(uint32_t count, char *err)
{
    struct bundle *b = calloc(1, sizeof *b);

    if (b)
        b->shard = calloc(count ? count : 1, sizeof *b->shard);
    if (!b || !b->shard) {
        free(b);
        set_err(err, "out of memory");
        return NULL;
    }
    b->count = count;
    return b;
}

/* Shard i of S must say so and share shard 0's secret. */
static int check_shard(const struct bundle *b, uint32_t i, char *err)
{
    const struct bf *f = b->shard[i];

    if (bf_shard_index(f) != i || bf_shard_count(f) != b->count) {
        set_err(err, "bad bundle: entry %u holds shard %u of %u, not %u of %u",
                i, bf_shard_index(f), bf_shard_count(f), i, b->count);
        return -1;
    }
    if (memcmp(bf_secret(f), bf_secret(b->shard[0]), BF_SECRET_LEN) != 0) {
        set_err(err, "bad bundle: shard %u has another secret than shard 0",
                i);
        return -1;
    }
    return 0;
}

struct bundle *bundle_parse(const void *buf, size_t len, char *err)
{
    const uint8_t *p = buf, *end = p + len;
    char serr[BF_ERRLEN];
    struct bundle *b;
    uint32_t count;

    if (len < HEAD_BYTES + 8 || !bundle_is(buf, len)) {
        set_err(err, "bad magic: not a shard bundle");
        return NULL;
    }
    if (get_le(end - 8, 8) != XXH3_64bits(p, len - 8)) {
        set_err(err, "checksum mismatch: the bundle is damaged or truncated");
        return NULL;
    }
    if (get_le(p + 8, 4) != BUNDLE_VERSION) {
        set_err(err, "unsupported version: bundle version %u (this tool "
                "reads %d)", (unsigned)get_le(p + 8, 4), BUNDLE_VERSION);
        return NULL;
    }
    count = (uint32_t)get_le(p + 12, 4);
    if (count == 0 || count > (len - HEAD_BYTES - 8) / ENTRY_BYTES) {
        set_err(err, "bad bundle: %u shards in %zu bytes", count, len);
        return NULL;
    }
    if (!(b = bundle_alloc(count, err)))
        return NULL;
    p += HEAD_BYTES;
    end -= 8;
    for (uint32_t i = 0; i < count; i++) {
        uint64_t flen;
        if (end - p < ENTRY_BYTES || get_le(p, 4) != i ||
            (flen = get_le(p + 4, 8)) > (uint64_t)(end - p - ENTRY_BYTES)) {
            set_err(err, "bad bundle: the entry of shard %u is malformed", i);
            goto fail;
        }
        b->shard[i] = bf_file_parse(p + ENTRY_BYTES, flen, serr);
        if (!b->shard[i]) {
            set_err(err, "shard %u: %s", i, serr);
            goto fail;
        }
        if (check_shard(b, i, err) < 0)
            goto fail;
        p += ENTRY_BYTES + flen;
    }
    if (p != end) {
        set_err(err, "bad bundle: %zu bytes after the last shard",
                (size_t)(end - p));
        goto fail;
    }
    return b;
fail:
    bundle_destroy(b);
    return NULL;
}

struct bundle *bundle_load(const char *path, char *err)
{
    struct bundle *b = NULL;
    struct stat st;
    uint8_t *buf = NULL;
    size_t got = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);

    if (fd < 0) {
        set_err(err, "cannot open: %s", strerror(errno));
        return NULL;
    }
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        set_err(err, "cannot open: not a regular file");
        goto out;
    }
    buf = malloc(st.st_size ? (size_t)st.st_size : 1);
    if (!buf) {
        set_err(err, "out of memory");
        goto out;
    }
    while (got < (size_t)st.st_size) {
        ssize_t n = read(fd, buf + got, (size_t)st.st_size - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            set_err(err, "read failed: %s", n < 0 ? strerror(errno)
                                                  : "file shrank");
            goto out;
        }
        got += (size_t)n;
    }
    b = bundle_parse(buf, got, err);
out:
    free(buf);
    close(fd);
    return b;
}

struct bundle *bundle_create_like(const struct bundle *tmpl, char *err)
{
    struct bundle *b = bundle_alloc(tmpl->count, err);

    if (!b)
        return NULL;
    for (uint32_t i = 0; i < b->count; i++) {
        b->shard[i] = bf_create_like(tmpl->shard[i], err);
        if (!b->shard[i]) {
            bundle_destroy(b);
            return NULL;
        }
    }
    return b;
}

void bundle_add_keys(struct bundle *b, const void *const *keys,
                     const size_t *lens, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        struct bf_hash h = bundle_hash(b, keys[i], lens[i]);
        bf_add_hash(bundle_shard_of(b, h), h);
    }
}

void bundle_may_contain_keys(const struct bundle *b, const void *const *keys,
                             const size_t *lens, size_t n, bool *out)
{
    for (size_t i = 0; i < n; i++) {
        struct bf_hash h = bundle_hash(b, keys[i], lens[i]);
        out[i] = bf_may_contain_hash(bundle_shard_of(b, h), h);
    }
}

/* ---- writing ---------------------------------------------------------- */

struct sink {
    int fd;
    XXH3_state_t *xx;
};

static int sink_write(void *ctx, const void *buf, size_t len)
{
    struct sink *s = ctx;
    const char *p = buf;

    XXH3_64bits_update(s->xx, buf, len);
    while (len) {
        ssize_t n = write(s->fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static int write_all(struct sink *s, const struct bundle *b)
{
    uint8_t head[HEAD_BYTES], entry[ENTRY_BYTES], sum[8];
    int rc;

    memcpy(head, BUNDLE_MAGIC, 8);
    put_le(head + 8, BUNDLE_VERSION, 4);
    put_le(head + 12, b->count, 4);
    if ((rc = sink_write(s, head, sizeof head)) < 0)
        return rc;
    for (uint32_t i = 0; i < b->count; i++) {
        put_le(entry, i, 4);
        put_le(entry + 4, bf_file_size(b->shard[i]), 8);
        if ((rc = sink_write(s, entry, sizeof entry)) < 0 ||
            (rc = bf_file_write(b->shard[i], sink_write, s)) < 0)
            return rc;
    }
    put_le(sum, XXH3_64bits_digest(s->xx), 8);
    return sink_write(s, sum, sizeof sum);
}

int bundle_save(const struct bundle *b, const char *path, char *err)
{
    struct sink s = {.fd = -1};
    char *tmp = NULL;
    int rc;

    if (asprintf(&tmp, "%s.tmp.XXXXXX", path) < 0 ||
        !(s.xx = XXH3_createState())) {
        if (tmp)
            free(tmp);
        set_err(err, "out of memory");
        return -ENOMEM;
    }
    XXH3_64bits_reset(s.xx);
    s.fd = mkostemp(tmp, O_CLOEXEC);
    if (s.fd < 0) {
        rc = -errno;
        set_err(err, "cannot create temp file %s: %s", tmp, strerror(errno));
        goto out;
    }
    (void)fchmod(s.fd, 0644);
    if ((rc = write_all(&s, b)) < 0) {
        set_err(err, "write failed: %s", strerror(-rc));
        goto fail;
    }
    if (fsync(s.fd) < 0 || close(s.fd) < 0) {
        rc = -errno;
        s.fd = -1;
        set_err(err, "fsync failed: %s", strerror(-rc));
        goto fail;
    }
    s.fd = -1;
    if (rename(tmp, path) < 0) {
        rc = -errno;
        set_err(err, "cannot rename %s to %s: %s", tmp, path, strerror(-rc));
        goto fail;
    }
    if ((rc = cli_fsync_parent(path)) < 0)
        set_err(err, "fsync of the directory of %s failed: %s", path,
                strerror(-rc));
    goto out;
fail:
    if (s.fd >= 0)
        close(s.fd);
    unlink(tmp);
out:
    XXH3_freeState(s.xx);
    free(tmp);
    return rc;
}
