/* rpc_deferred: unary replies sent after their handler has returned (see
 * rpc_server.h, "Deferred unary replies").
 *
 * A deferred call is its slot, handed to the caller as the handle.  Each
 * server keeps its deferred slots on a defer_book: the bound, and the list
 * that shutdown walks to cancel what is left.  The book is reference
 * counted (the server and each deferred slot), so that a finish after
 * rpc_server_destroy still finds its lock; shutdown releases a cancelled
 * slot's call and marks it orphaned, and its finish then only frees it.  A
 * finish that is not orphaned takes its slot off the list under the book's
 * lock, so shutdown no longer sees the call, and starts the reply batch
 * after letting the lock go; the batch's completion frees the slot.
 */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>

#include <grpc/grpc.h>

#include "log.h"
#include "rpc_server.h"
#include "rpc_server_internal.h"

_Thread_local struct rpc_unary_run *rpc_server__current_run;

struct defer_book *rpc_server__book_create(int max)
{
    struct defer_book *b = calloc(1, sizeof *b);
    if (!b)
        return NULL;
    pthread_mutex_init(&b->lock, NULL);
    b->refs = 1;
    b->max = max;
    return b;
}

void rpc_server__book_unref_unlock(struct defer_book *b)
{
    bool last = --b->refs == 0;
    pthread_mutex_unlock(&b->lock);
    if (last) {
        pthread_mutex_destroy(&b->lock);
        free(b);
    }
}

static void book_unlink_locked(struct defer_book *b, struct slot *s)
{
    if (s->dprev)
        s->dprev->dnext = s->dnext;
    else
        b->head = s->dnext;
    if (s->dnext)
        s->dnext->dprev = s->dprev;
    s->dprev = s->dnext = NULL;
    b->count--;
}

void rpc_server__book_close(struct defer_book *b)
{
    pthread_mutex_lock(&b->lock);
    b->closed = true;
    while (b->head) {
        struct slot *s = b->head;
        book_unlink_locked(b, s);
        s->orphaned = true;
        /* Its finish may come after the server is gone. */
        rpc_server__budget_drop(s);
        grpc_call_unref(s->call);
        s->call = NULL;
    }
    pthread_mutex_unlock(&b->lock);
}

struct rpc_deferred *rpc_reply_defer(struct rpc_reply *r)
{
    struct rpc_unary_run *run = rpc_server__current_run;
    if (run && &run->s->reply == r && run->deferred) {
        /* The reply already belongs to the first handle. */
        log_error("%s: a reply deferred twice", run->s->m->path);
        return NULL;
    }
    if (!run || &run->s->reply != r) {
        rpc_reply_error(r, GRPC_STATUS_INTERNAL,
                        "server error: a reply that is not its unary handler's "
                        "own was deferred");
        return NULL;
    }
    struct slot *s = run->s;
    struct defer_book *b = s->srv->book;
    pthread_mutex_lock(&b->lock);
    if (b->closed || b->count >= b->max) {
        bool closed = b->closed;
        pthread_mutex_unlock(&b->lock);
        if (closed)
            rpc_reply_error(r, GRPC_STATUS_UNAVAILABLE,
                            "server shutting down; retry on another server");
        else
            rpc_reply_error(r, GRPC_STATUS_RESOURCE_EXHAUSTED,
                            "server has %d calls waiting for their answer, its "
                            "limit (max_deferred); retry later", b->max);
        return NULL;
    }
    b->count++;
    b->refs++;
    s->book = b;
    s->dnext = b->head;
    if (b->head)
        b->head->dprev = s;
    b->head = s;
    pthread_mutex_unlock(&b->lock);
    run->deferred = true;
    return (struct rpc_deferred *)s;
}

struct rpc_reply *rpc_deferred_reply(struct rpc_deferred *d)
{
    return &((struct slot *)d)->reply;
}

int rpc_deferred_finish(struct rpc_deferred *d)
{
    struct slot *s = (struct slot *)d;
    struct defer_book *b = s->book;

    pthread_mutex_lock(&b->lock);
    bool orphaned = s->orphaned;
    /* Off the list, the call is the slot's alone: shutdown releases only
     * the calls it finds there.  So the reply starts after the lock is let
     * go, and the loop that defers the next calls does not wait for it. */
    if (!orphaned)
        book_unlink_locked(b, s);
    rpc_server__book_unref_unlock(b);
    if (orphaned) {
        rpc_server__slot_free(s);
        return -ECANCELED;
    }
    return rpc_server__send_reply(s);   /* its completion frees the slot */
}
