/* router_pool: the router's threads for blocking work (see router_pool.h).
 * A ring of jobs under one mutex; threads sleep on a condition variable. */
#include "router_pool.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>

struct job {
    void (*fn)(void *);
    void *arg;
};

struct router_pool {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct job q[ROUTER_POOL_QUEUE];
    size_t head, len;
    pthread_t th[ROUTER_POOL_THREADS];
    int nthreads;
    bool closing;
};

struct router_pool *router_pool_create(void)
{
    struct router_pool *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    return p;
}

static void *pool_main(void *arg)
{
    struct router_pool *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->len && !p->closing)
            pthread_cond_wait(&p->cv, &p->mu);
        if (!p->len)
            break;
        struct job j = p->q[p->head];
        p->head = (p->head + 1) % ROUTER_POOL_QUEUE;
        p->len--;
        pthread_mutex_unlock(&p->mu);
        j.fn(j.arg);
        pthread_mutex_lock(&p->mu);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int router_pool_push(struct router_pool *p, void (*fn)(void *), void *arg)
{
    int rc = 0;
    pthread_mutex_lock(&p->mu);
    if (p->closing) {
        rc = -ECANCELED;
        goto out;
    }
    if (p->len == ROUTER_POOL_QUEUE) {
        rc = -EAGAIN;
        goto out;
    }
    while (p->nthreads < ROUTER_POOL_THREADS) {
        int e = pthread_create(&p->th[p->nthreads], NULL, pool_main, p);
        if (e != 0) {
            if (p->nthreads == 0) {
                rc = -e;
                goto out;
            }
            break;
        }
        p->nthreads++;
    }
    p->q[(p->head + p->len) % ROUTER_POOL_QUEUE] = (struct job){fn, arg};
    p->len++;
    pthread_cond_signal(&p->cv);
out:
    pthread_mutex_unlock(&p->mu);
    return rc;
}

void router_pool_stop(struct router_pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->closing = true;
    pthread_cond_broadcast(&p->cv);
    int n = p->nthreads;
    p->nthreads = 0;
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < n; i++)
        pthread_join(p->th[i], NULL);
}

void router_pool_destroy(struct router_pool *p)
{
    if (!p)
        return;
    router_pool_stop(p);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p);
}
