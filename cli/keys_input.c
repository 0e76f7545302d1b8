/* keys_input: batched line splitting over large reads (see keys_input.h).
 *
 * The buffer holds [start, end) of unread input.  Complete lines are cut
 * out with memchr and their addresses queued in a batch; the batch is
 * handed on when full and always before the buffer is refilled, because a
 * refill moves the leftover partial line to the front.
 */
#include "keys_input.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

#define BUF_BYTES (4u << 20)

struct reader {
    int fd;
    const char *name;
    char *buf;
    size_t start, end;
    unsigned long long line;
    bool eof;
    const void *keys[KEYS_BATCH];
    size_t lens[KEYS_BATCH];
    size_t n;
    keys_batch_fn fn;
    void *ctx;
};

static int reader_flush(struct reader *r)
{
    int rc = 0;

    if (r->n)
        rc = r->fn(r->ctx, r->keys, r->lens, r->n);
    r->n = 0;
    return rc;
}

/* Queue one line (without its "\n"). */
static int reader_key(struct reader *r, char *p, size_t len)
{
    r->line++;
    if (len && p[len - 1] == '\r')
        len--;
    if (len == 0)
        return cli_fail("%s:%llu: empty key (keys cannot be empty)", r->name,
                        r->line);
    r->keys[r->n] = p;
    r->lens[r->n] = len;
    if (++r->n == KEYS_BATCH)
        return reader_flush(r);
    return 0;
}

static int reader_fill(struct reader *r)
{
    ssize_t got;

    memmove(r->buf, r->buf + r->start, r->end - r->start);
    r->end -= r->start;
    r->start = 0;
    if (r->end == BUF_BYTES)
        return cli_fail("%s:%llu: line longer than %u bytes", r->name,
                        r->line + 1, BUF_BYTES);
    do
        got = read(r->fd, r->buf + r->end, BUF_BYTES - r->end);
    while (got < 0 && errno == EINTR);
    if (got < 0)
        return cli_fail("%s: cannot read: %s", r->name, strerror(errno));
    r->eof = got == 0;
    r->end += (size_t)got;
    return 0;
}

/* Cut every complete line out of the buffer. */
static int reader_split(struct reader *r)
{
    char *p = r->buf + r->start, *stop = r->buf + r->end, *nl;
    int rc = 0;

    while (rc == 0 && (nl = memchr(p, '\n', (size_t)(stop - p)))) {
        rc = reader_key(r, p, (size_t)(nl - p));
        p = nl + 1;
    }
    r->start = (size_t)(p - r->buf);
    return rc;
}

static int reader_run(struct reader *r)
{
    int rc = 0;

    while (rc == 0 && !r->eof) {
        rc = reader_flush(r);
        if (rc == 0)
            rc = reader_fill(r);
        if (rc == 0)
            rc = reader_split(r);
    }
    /* A last line without "\n" is still a key. */
    if (rc == 0 && r->start < r->end)
        rc = reader_key(r, r->buf + r->start, r->end - r->start);
    if (rc == 0)
        rc = reader_flush(r);
    return rc;
}

int keys_read_path(const char *path, keys_batch_fn fn, void *ctx)
{
    struct reader *r = calloc(1, sizeof *r);
    bool is_stdin = strcmp(path, "-") == 0;
    int rc = CLI_ERR;

    if (!r || !(r->buf = malloc(BUF_BYTES))) {
        cli_fail("out of memory");
        goto out;
    }
    r->name = is_stdin ? "<stdin>" : path;
    r->fd = is_stdin ? STDIN_FILENO : open(path, O_RDONLY | O_CLOEXEC);
    if (r->fd < 0) {
        cli_fail("%s: cannot open input: %s", path, strerror(errno));
        goto out;
    }
    (void)posix_fadvise(r->fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    r->fn = fn;
    r->ctx = ctx;
    rc = reader_run(r);
    if (!is_stdin)
        close(r->fd);
out:
    if (r)
        free(r->buf);
    free(r);
    return rc;
}

int keys_read_paths(char *const *paths, int n, keys_batch_fn fn, void *ctx)
{
    int rc = 0;

    if (n == 0)
        return keys_read_path("-", fn, ctx);
    for (int i = 0; i < n && rc == 0; i++)
        rc = keys_read_path(paths[i], fn, ctx);
    return rc;
}

int keys_from_args(char *const *args, int n, keys_batch_fn fn, void *ctx)
{
    const void *keys[KEYS_BATCH];
    size_t lens[KEYS_BATCH];
    int rc = 0;

    for (int i = 0; i < n; i++)
        if (args[i][0] == '\0')
            return cli_fail("empty key (argument %d); keys cannot be empty",
                            i + 1);
    for (int i = 0; i < n && rc == 0; i += KEYS_BATCH) {
        size_t m = (size_t)(n - i) < KEYS_BATCH ? (size_t)(n - i) : KEYS_BATCH;
        for (size_t j = 0; j < m; j++) {
            keys[j] = args[i + j];
            lens[j] = strlen(args[i + j]);
        }
        rc = fn(ctx, keys, lens, m);
    }
    return rc;
}
