/* durable: atomic file replacement (see durable.h). */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "errmsg.h"
#include "durable.h"

/* dirname() of a copy: buf receives the directory of path. */
static void dir_of(const char *path, char *buf, size_t len)
{
    snprintf(buf, len, "%s", path);
    char *d = dirname(buf);
    if (d != buf)
        memmove(buf, d, strlen(d) + 1);
}

int durable_fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int rc = 0;

    if (fd < 0)
        return -errno;
    if (fsync(fd) < 0)
        rc = -errno;
    close(fd);
    return rc;
}

int durable_fsync_parent(const char *path)
{
    char dir[DURABLE_PATH_MAX];

    dir_of(path, dir, sizeof dir);
    return durable_fsync_dir(dir);
}

int durable_rename(const char *from, const char *to)
{
    char d1[DURABLE_PATH_MAX], d2[DURABLE_PATH_MAX];
    int rc;

    if (rename(from, to) < 0)
        return -errno;
    dir_of(to, d2, sizeof d2);
    if ((rc = durable_fsync_dir(d2)) < 0)
        return rc;
    dir_of(from, d1, sizeof d1);
    if (strcmp(d1, d2) != 0)
        rc = durable_fsync_dir(d1);
    return rc;
}

int durable_write_all(int fd, const void *buf, size_t len)
{
    const unsigned char *p = buf;

    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        if (n == 0)
            return -EIO;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

int durable_open(struct durable_file *df, const char *path,
                 const char *tmp_name, mode_t mode, char *err)
{
    size_t len = path ? strlen(path) : 0;
    int n;

    df->fd = -1;
    df->tmp[0] = 0;
    df->path[0] = 0;
    df->sync = fsync;
    if (len == 0) {
        errmsg_set(err, "cannot create temp file: empty path");
        return -EINVAL;
    }
    if (len >= sizeof df->path - 16) {
        errmsg_set(err, "path too long: %.64s...", path);
        return -ENAMETOOLONG;
    }
    memcpy(df->path, path, len + 1);
    if (tmp_name) {
        char dir[DURABLE_PATH_MAX];
        dir_of(path, dir, sizeof dir);
        n = snprintf(df->tmp, sizeof df->tmp, "%s/%s", dir, tmp_name);
        if (n < 0 || (size_t)n >= sizeof df->tmp) {
            errmsg_set(err, "path too long: %.64s...", path);
            df->tmp[0] = 0;
            return -ENAMETOOLONG;
        }
        df->fd = open(df->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC,
                      mode ? mode : 0644);
    } else {
        snprintf(df->tmp, sizeof df->tmp, "%s.tmp.XXXXXX", path);
        df->fd = mkostemp(df->tmp, O_CLOEXEC);
    }
    if (df->fd < 0) {
        int rc = -errno;
        errmsg_set(err, "cannot create temp file %s: %s", df->tmp, strerror(-rc));
        df->tmp[0] = 0;
        return rc;
    }
    if (mode == 0) {
        struct stat st;
        mode = 0644;
        if (stat(path, &st) == 0)
            mode = st.st_mode & 07777;
    }
    (void)fchmod(df->fd, mode);
    return 0;
}

void durable_abort(struct durable_file *df)
{
    if (df->fd >= 0)
        close(df->fd);
    df->fd = -1;
    if (df->tmp[0])
        unlink(df->tmp);
    df->tmp[0] = 0;
}

int durable_publish(struct durable_file *df, char *err)
{
    int rc;

    if (df->fd < 0 || !df->tmp[0]) {
        errmsg_set(err, "%s: no temp file open", df->path);
        return -EBADF;
    }
    if (df->sync(df->fd) < 0) {
        rc = errno ? -errno : -EIO;
        errmsg_set(err, "fsync of %s failed: %s", df->tmp, strerror(-rc));
        durable_abort(df);
        return rc;
    }
    if (rename(df->tmp, df->path) < 0) {
        rc = -errno;
        errmsg_set(err, "cannot rename %s to %s: %s", df->tmp, df->path,
                   strerror(-rc));
        durable_abort(df);
        return rc;
    }
    df->tmp[0] = 0;
    if ((rc = durable_fsync_parent(df->path)) < 0)
        errmsg_set(err, "fsync of the directory of %s failed: %s", df->path,
                   strerror(-rc));
    return rc;
}

int durable_commit(struct durable_file *df, char *err)
{
    int rc = durable_publish(df, err);

    if (df->fd >= 0 && close(df->fd) < 0 && rc == 0) {
        rc = -errno;
        errmsg_set(err, "close of %s failed: %s", df->path, strerror(-rc));
    }
    df->fd = -1;
    return rc;
}

int durable_write_with(const char *path, int (*fill)(int fd, void *ctx),
                       void *ctx, mode_t mode, char *err)
{
    struct durable_file df;
    int rc = durable_open(&df, path, NULL, mode, err);

    if (rc < 0)
        return rc;
    if ((rc = fill(df.fd, ctx)) < 0) {
        errmsg_set(err, "write failed: %s (%s)", strerror(-rc), df.tmp);
        durable_abort(&df);
        return rc;
    }
    return durable_commit(&df, err);
}

struct buf_ctx {
    const void *buf;
    size_t len;
};

static int fill_buf(int fd, void *ctx)
{
    const struct buf_ctx *b = ctx;
    return durable_write_all(fd, b->buf, b->len);
}

int durable_write_file(const char *path, const void *buf, size_t len,
                       mode_t mode, char *err)
{
    struct buf_ctx b = {buf, len};
    return durable_write_with(path, fill_buf, &b, mode, err);
}

char *durable_read_all(const char *path, size_t max, size_t *len, char *err,
                       size_t errlen)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    char *buf = NULL;
    size_t n = 0, cap = 0;

    if (fd < 0) {
        snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    for (;;) {
        if (n == cap) {
            if (cap > max)
                break;
            cap = cap ? cap * 2 : 4096;
            char *nb = realloc(buf, cap + 1);
            if (!nb) {
                snprintf(err, errlen, "%s: out of memory", path);
                goto fail;
            }
            buf = nb;
        }
        ssize_t r = read(fd, buf + n, cap - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            snprintf(err, errlen, "%s: cannot read: %s", path, strerror(errno));
            goto fail;
        }
        if (r == 0)
            break;
        n += (size_t)r;
    }
    if (n > max) {
        snprintf(err, errlen, "%s: larger than %zu bytes", path, max);
        goto fail;
    }
    if (!buf && !(buf = malloc(1))) {
        snprintf(err, errlen, "%s: out of memory", path);
        goto fail;
    }
    close(fd);
    buf[n] = 0;
    if (len)
        *len = n;
    return buf;
fail:
    close(fd);
    free(buf);
    return NULL;
}
