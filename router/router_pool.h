/* router_pool: a few threads of the router for the work that may block
 * and must not run on a loop or a link's thread (router_link.h): a key
 * batch started on a loop whose filter is not cached (its secret must be
 * fetched first), and one that has to fetch its filter's secret again and
 * run once more.
 *
 * The threads (ROUTER_POOL_THREADS) start with the first job, so that they
 * inherit the signal mask of the thread that submits it (the RPC threads
 * block SIGINT, SIGTERM and SIGHUP); the queue holds at most
 * ROUTER_POOL_QUEUE jobs.  Every function may be called from any thread.
 */
#ifndef BLOOMGRID_ROUTER_POOL_H
#define BLOOMGRID_ROUTER_POOL_H

#include <stddef.h>

#define ROUTER_POOL_THREADS 4
#define ROUTER_POOL_QUEUE 1024

struct router_pool;

/* A pool with no thread yet.  NULL when out of memory. */
struct router_pool *router_pool_create(void);

/* Run fn(arg) on a pool thread.  Returns 0, -EAGAIN when the queue is full
 * (ROUTER_POOL_QUEUE jobs wait), -ECANCELED after router_pool_destroy began,
 * or -ENOMEM / -EAGAIN when no thread could be started; fn is then not run
 * and arg stays the caller's. */
int router_pool_push(struct router_pool *p, void (*fn)(void *), void *arg);

/* Refuse new jobs from now on, run those queued and join the threads.
 * Jobs may still push while it runs (they are refused).  Idempotent; NULL
 * is a no-op. */
void router_pool_stop(struct router_pool *p);

/* Stop if needed and free.  Nothing may push any more.  NULL is a no-op. */
void router_pool_destroy(struct router_pool *p);

#endif
