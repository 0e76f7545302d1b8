/* proc_accept: see proc_accept.h. */
#include "proc_accept.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "metrics.h"

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int reserve = -1;               /* under mu */
static _Atomic uint64_t refused;
static _Atomic int64_t warned_s;       /* last warning (monotonic seconds) */
static struct metric *m_refused;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void register_metric(void)
{
    m_refused = metrics_counter(metrics_registry(), "bloomgrid_connections_refused_total",
                                "connections closed as soon as accepted because the "
                                "process had no descriptor left (RLIMIT_NOFILE)", NULL);
}

int proc_accept_guard(void)
{
    int rc = 0;

    pthread_once(&once, register_metric);
    pthread_mutex_lock(&mu);
    if (reserve < 0 && (reserve = open("/dev/null", O_RDONLY | O_CLOEXEC)) < 0)
        rc = -errno;
    pthread_mutex_unlock(&mu);
    return rc;
}

static void warn_refused(void)
{
    struct timespec ts;
    struct rlimit rl = {0};

    clock_gettime(CLOCK_MONOTONIC, &ts);
    int64_t now = (int64_t)ts.tv_sec, was = atomic_load(&warned_s);
    if (now == was || !atomic_compare_exchange_strong(&warned_s, &was, now))
        return;
    getrlimit(RLIMIT_NOFILE, &rl);
    log_warn("no file descriptor left (limit %llu): new connections are refused "
             "until some close (%llu so far)", (unsigned long long)rl.rlim_cur,
             (unsigned long long)atomic_load(&refused));
}

/* Take one pending connection on the reserve descriptor and close it.
 * Returns 1 when one was refused, 0 when none is pending (or there is no
 * reserve), with errno that of the failed accept. */
static int refuse_one(int fd)
{
    int c, e;

    pthread_mutex_lock(&mu);
    if (reserve < 0) {
        /* Lost to another thread at the last reopen: try to get it back. */
        reserve = open("/dev/null", O_RDONLY | O_CLOEXEC);
        pthread_mutex_unlock(&mu);
        errno = EMFILE;
        return 0;
    }
    close(reserve);
    c = (int)syscall(SYS_accept4, fd, NULL, NULL, SOCK_CLOEXEC);
    e = errno;
    if (c >= 0)
        close(c);
    reserve = open("/dev/null", O_RDONLY | O_CLOEXEC);
    pthread_mutex_unlock(&mu);
    if (c < 0) {
        errno = e;
        return 0;
    }
    atomic_fetch_add(&refused, 1);
    pthread_once(&once, register_metric);
    metric_add(m_refused, 1);
    warn_refused();
    return 1;
}

int accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags)
{
    for (;;) {
        int c = (int)syscall(SYS_accept4, fd, addr, len, flags);
        if (c >= 0 || (errno != EMFILE && errno != ENFILE))
            return c;
        if (!refuse_one(fd)) {
            /* Nothing pending any more: the queue is empty, as far as the
             * listener needs to know.  Without a reserve, EMFILE stays. */
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                errno = EAGAIN;
            return -1;
        }
    }
}
