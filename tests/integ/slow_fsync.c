/* slow_fsync: an LD_PRELOAD library that holds fsync and fdatasync of the
 * files whose path contains SLOW_FSYNC_MATCH for as long as the file named
 * by SLOW_FSYNC_GATE exists, and creates "<gate>.held" once one is held, so
 * that a test can keep a process inside a write's fsync for as long as it
 * needs and know when it is.  Without the gate file every call goes through
 * at once.  While the file named by SLOW_FSYNC_FAIL exists, the same calls
 * fail with EIO instead (after creating "<fail>.hit").
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Is fd's file one to hold or fail (SLOW_FSYNC_MATCH)? */
static int matches(int fd)
{
    const char *match = getenv("SLOW_FSYNC_MATCH");
    char link[64], path[4096];
    ssize_t n;

    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    if ((n = readlink(link, path, sizeof path - 1)) < 0)
        return 0;
    path[n] = 0;
    return !match || strstr(path, match);
}

/* Should this call fail (SLOW_FSYNC_FAIL exists)?  Notes it in <fail>.hit. */
static int fails(int fd)
{
    const char *fail = getenv("SLOW_FSYNC_FAIL");
    char hit[4200];

    if (!fail || access(fail, F_OK) != 0 || !matches(fd))
        return 0;
    snprintf(hit, sizeof hit, "%s.hit", fail);
    int hf = open(hit, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (hf >= 0)
        close(hf);
    return 1;
}

/* Wait while the gate exists, if fd's file is one to hold. */
static void hold(int fd)
{
    const char *gate = getenv("SLOW_FSYNC_GATE");
    char held[4200];

    if (!gate || access(gate, F_OK) != 0 || !matches(fd))
        return;
    snprintf(held, sizeof held, "%s.held", gate);
    int hf = open(held, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (hf >= 0)
        close(hf);
    struct timespec ts = {.tv_sec = 0, .tv_nsec = 2 * 1000 * 1000};
    while (access(gate, F_OK) == 0)
        nanosleep(&ts, NULL);
}

int fsync(int fd)
{
    int (*real)(int) = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    hold(fd);
    if (fails(fd)) {
        errno = EIO;
        return -1;
    }
    return real(fd);
}

int fdatasync(int fd)
{
    int (*real)(int) = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    hold(fd);
    if (fails(fd)) {
        errno = EIO;
        return -1;
    }
    return real(fd);
}
