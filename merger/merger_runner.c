/* merger_runner: the round thread of bloomgrid-merger (see merger_runner.h).
 *
 * Rounds are counted under one mutex: `started` and `finished` number them,
 * so a caller that asks at round count c waits for finished >= c + 1, a
 * round that began after its ask.
 */
#include "merger_runner.h"
#include "merger_metrics.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

struct merger_runner {
    struct merger *m;
    uint64_t interval_ms;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool want, running, stop;     /* under mu */
    bool joined;                  /* by the thread that stops it */
    uint64_t started, finished;   /* under mu */
};

static void *runner_main(void *arg)
{
    struct merger_runner *r = arg;

    pthread_mutex_lock(&r->mu);
    while (!r->stop) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += (time_t)(r->interval_ms / 1000);
        while (!r->stop && !r->want)
            if (pthread_cond_timedwait(&r->cv, &r->mu, &until) == ETIMEDOUT)
                break;
        if (r->stop)
            break;
        r->want = false;
        r->running = true;
        uint64_t id = ++r->started;
        pthread_mutex_unlock(&r->mu);
        struct mg_report rep;
        merger_round(r->m, &rep);
        mg_report_log(&rep);
        merger_metrics_round(&rep);
        mg_report_free(&rep);
        pthread_mutex_lock(&r->mu);
        r->running = false;
        r->finished = id;
        pthread_cond_broadcast(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

struct merger_runner *merger_runner_start(struct merger *m,
                                          uint64_t interval_ms)
{
    struct merger_runner *r = calloc(1, sizeof *r);

    if (!r)
        return NULL;
    r->m = m;
    r->interval_ms = interval_ms;
    r->want = true;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    if (pthread_create(&r->thread, NULL, runner_main, r) != 0) {
        pthread_cond_destroy(&r->cv);
        pthread_mutex_destroy(&r->mu);
        free(r);
        return NULL;
    }
    return r;
}

void merger_runner_ask(struct merger_runner *r)
{
    pthread_mutex_lock(&r->mu);
    r->want = true;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

int merger_runner_wait(struct merger_runner *r)
{
    pthread_mutex_lock(&r->mu);
    uint64_t need = r->started + 1;
    r->want = true;
    pthread_cond_broadcast(&r->cv);
    while (!r->stop && r->finished < need)
        pthread_cond_wait(&r->cv, &r->mu);
    bool done = r->finished >= need;
    pthread_mutex_unlock(&r->mu);
    return done ? 0 : -ECANCELED;
}

bool merger_runner_busy(struct merger_runner *r)
{
    pthread_mutex_lock(&r->mu);
    bool busy = r->running;
    pthread_mutex_unlock(&r->mu);
    return busy;
}

void merger_runner_stop(struct merger_runner *r)
{
    pthread_mutex_lock(&r->mu);
    r->stop = true;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    if (!r->joined)
        pthread_join(r->thread, NULL);
    r->joined = true;
}

void merger_runner_destroy(struct merger_runner *r)
{
    if (!r)
        return;
    merger_runner_stop(r);
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
    free(r);
}
