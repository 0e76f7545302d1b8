/* fsync_spy: an LD_PRELOAD library that records, in the file named by
 * FSYNC_SPY_LOG, every fsync / fdatasync (with the path of the file or
 * directory synced), rename and mkdir of the process, one line each, in the
 * order they happened:
 *
 *     fsync /abs/path
 *     rename FROM TO
 *     mkdir PATH
 *
 * The merger's durability test reads it to check that every file the merger
 * publishes is synced before its rename and its directory after it.
 */
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void note(const char *what, const char *a, const char *b)
{
    const char *log = getenv("FSYNC_SPY_LOG");
    char line[8300];
    int fd, n;

    if (!log)
        return;
    n = snprintf(line, sizeof line, "%s %s%s%s\n", what, a, b ? " " : "",
                 b ? b : "");
    if (n <= 0 || (size_t)n >= sizeof line)
        return;
    if ((fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644)) < 0)
        return;
    if (write(fd, line, (size_t)n) < 0) {
        /* nothing to do: the test sees the line missing */
    }
    close(fd);
}

static void note_fd(int fd)
{
    char link[64], path[4096];
    ssize_t n;

    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    if ((n = readlink(link, path, sizeof path - 1)) < 0)
        return;
    path[n] = 0;
    note("fsync", path, NULL);
}

int fsync(int fd)
{
    int (*real)(int) = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    int rc = real(fd);

    if (rc == 0)
        note_fd(fd);
    return rc;
}

int fdatasync(int fd)
{
    int (*real)(int) = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    int rc = real(fd);

    if (rc == 0)
        note_fd(fd);
    return rc;
}

int rename(const char *from, const char *to)
{
    int (*real)(const char *, const char *) =
        (int (*)(const char *, const char *))dlsym(RTLD_NEXT, "rename");
    int rc = real(from, to);

    if (rc == 0)
        note("rename", from, to);
    return rc;
}

int mkdir(const char *path, mode_t mode)
{
    int (*real)(const char *, mode_t) =
        (int (*)(const char *, mode_t))dlsym(RTLD_NEXT, "mkdir");
    int rc = real(path, mode);

    if (rc == 0)
        note("mkdir", path, NULL);
    return rc;
}
