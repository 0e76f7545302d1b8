/* slow_fsync: an LD_PRELOAD library that holds fsync and fdatasync of the
 * files whose path contains SLOW_FSYNC_MATCH for as long as the file named
 * by SLOW_FSYNC_GATE exists, and creates "<gate>.held" once one is held, so
 * that a test can keep a process inside a write's fsync for as long as it
 * needs and know when it is.  Without the gate file every call goes through
 * at once.
 */
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Wait while the gate exists, if fd's file is one to hold. */
static void hold(int fd)
{
    const char *gate = getenv("SLOW_FSYNC_GATE");
    const char *match = getenv("SLOW_FSYNC_MATCH");
    char link[64], path[4096], held[4200];
    ssize_t n;

    if (!gate || access(gate, F_OK) != 0)
        return;
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    if ((n = readlink(link, path, sizeof path - 1)) < 0)
        return;
    path[n] = 0;
    if (match && !strstr(path, match))
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
    return real(fd);
}

int fdatasync(int fd)
{
    int (*real)(int) = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    hold(fd);
    return real(fd);
}
