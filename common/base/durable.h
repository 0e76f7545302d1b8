/* durable: files that appear whole or not at all, and renames that survive a
 * crash.
 *
 * Every writer of a file another process or a restart reads (snapshots, WAL
 * segments, filter and bundle files, exports, the merger's state) goes
 * through this one sequence:
 *
 *   durable_open     a temp file in the directory of the final path
 *                    ("<path>.tmp.XXXXXX", or a name the caller fixes);
 *   write to df.fd   (durable_write_all helps);
 *   durable_commit   fsync the file, close it, rename it over the final
 *                    path, fsync the directory so the rename is durable.
 *
 * On any error before the rename the temp file is removed and an existing
 * file at the final path is unchanged.  An error of the directory fsync is
 * reported although the rename took place (the new file may not survive a
 * power loss).  durable_abort throws the temp file away.
 *
 * Threads: a struct durable_file belongs to one thread.  Errors: 0 or a
 * negative errno, and a sentence in err (DURABLE_ERRLEN bytes, may be NULL)
 * that names the file and the step that failed.
 */
#ifndef BLOOMGRID_DURABLE_H
#define BLOOMGRID_DURABLE_H

#include "errmsg.h"
#include <stddef.h>
#include <sys/types.h>

#define DURABLE_PATH_MAX 4096
#define DURABLE_ERRLEN ERRMSG_LEN

struct durable_file {
    int fd;                          /* open for writing; -1 when closed */
    char tmp[DURABLE_PATH_MAX];      /* the temp file */
    char path[DURABLE_PATH_MAX];     /* where it goes */
    int (*sync)(int fd);             /* fsync unless the caller sets another
                                        (fault injection in tests) */
};

/* Create the temp file for path.  tmp_name NULL: "<path>.tmp.XXXXXX"
 * (unique); otherwise that name in path's directory, truncated if it exists
 * (for writers that sweep one fixed name).  mode: the new file's mode; 0
 * keeps the mode of the file it replaces (0644 when there is none).  Fills
 * df; returns 0 or a negative errno. */
int durable_open(struct durable_file *df, const char *path,
                 const char *tmp_name, mode_t mode, char *err);

/* fsync, rename over the final path, fsync the directory; the fd stays
 * open (a WAL segment goes on being appended to).  On failure before the
 * rename the temp file is removed and df->fd closed. */
int durable_publish(struct durable_file *df, char *err);

/* durable_publish, then close.  df->fd is -1 afterwards in every case. */
int durable_commit(struct durable_file *df, char *err);

/* Close and remove the temp file (nothing published).  Safe after a failed
 * durable_open / durable_commit, and twice. */
void durable_abort(struct durable_file *df);

/* Write all len bytes (retrying short writes and EINTR).  0 or -errno. */
int durable_write_all(int fd, const void *buf, size_t len);

/* Write buf as the whole new content of path (open, write, commit). */
int durable_write_file(const char *path, const void *buf, size_t len,
                       mode_t mode, char *err);

/* Write the whole new content of path with fill(fd, ctx), which returns 0
 * or a negative errno (then nothing is published and err says "write
 * failed: ..."). */
int durable_write_with(const char *path, int (*fill)(int fd, void *ctx),
                       void *ctx, mode_t mode, char *err);

/* fsync a directory / the directory holding path.  0 or -errno. */
/* The reading side: the whole file at path, at most max bytes, in a
 * malloc'd buffer with a NUL after its len bytes (len may be NULL).  NULL
 * with "PATH: cannot open: ...", "PATH: cannot read: ...", "PATH: larger
 * than MAX bytes" or "PATH: out of memory" in err (errlen bytes). */
char *durable_read_all(const char *path, size_t max, size_t *len, char *err,
                       size_t errlen);

int durable_fsync_dir(const char *dir);
int durable_fsync_parent(const char *path);

/* rename(from, to), then fsync the directory of to (and of from when it is
 * another one).  0 or -errno. */
int durable_rename(const char *from, const char *to);

#endif
