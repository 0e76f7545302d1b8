/* rpc_health: grpc.health.v1.Health on every server: Check answers from a
 * small table set with rpc_server_set_health (and, for names not in it, the
 * process's rpc_health_fn); Watch sends the status at once and then every
 * change, until the client goes away or the server stops.
 */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/byte_buffer_reader.h>
#include <grpc/support/time.h>

#include "log.h"
#include "rpc_server.h"
#include "rpc_server_internal.h"

#include "grpc/health/v1/health.pb-c.h"

void rpc_server_set_health(struct rpc_server *srv, const char *service,
                           bool serving)
{
    pthread_mutex_lock(&srv->lock);
    int i;
    for (i = 0; i < srv->nhealth; i++)
        if (strcmp(srv->health[i].name, service) == 0)
            break;
    if (i == srv->nhealth && srv->nhealth < HEALTH_MAX) {
        snprintf(srv->health[i].name, sizeof srv->health[i].name, "%s", service);
        srv->nhealth++;
    }
    if (i < srv->nhealth && srv->health[i].serving != serving) {
        srv->health[i].serving = serving;
        pthread_cond_broadcast(&srv->health_cond);
    }
    pthread_mutex_unlock(&srv->lock);
}

void rpc_server_set_health_fn(struct rpc_server *srv, rpc_health_fn fn, void *arg)
{
    srv->health_fn = fn;
    srv->health_arg = arg;
}

/* 1 SERVING, 0 NOT_SERVING, -1 unknown service.  Takes srv->lock for the
 * table; the function runs without it. */
static int health_lookup(struct rpc_server *srv, const char *service)
{
    int found = -1;
    pthread_mutex_lock(&srv->lock);
    for (int i = 0; i < srv->nhealth; i++)
        if (strcmp(srv->health[i].name, service) == 0)
            found = srv->health[i].serving ? 1 : 0;
    pthread_mutex_unlock(&srv->lock);
    if (found < 0 && srv->health_fn)
        found = srv->health_fn(srv->health_arg, service);
    return found;
}

void rpc_server__health_check(void *arg, const uint8_t *req, size_t len,
                         struct rpc_reply *reply)
{
    struct rpc_server *srv = arg;
    Grpc__Health__V1__HealthCheckRequest *rq =
        grpc__health__v1__health_check_request__unpack(NULL, len, req);
    if (!rq) {
        rpc_reply_error(reply, GRPC_STATUS_INVALID_ARGUMENT,
                        "HealthCheckRequest does not parse");
        return;
    }
    int found = health_lookup(srv, rq->service);
    if (found < 0) {
        rpc_reply_error(reply, GRPC_STATUS_NOT_FOUND,
                        "unknown service \"%.100s\"", rq->service);
    } else {
        Grpc__Health__V1__HealthCheckResponse resp =
            GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
        resp.status = found ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING
                            : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING;
        rpc_reply_pack(reply, &resp.base);
    }
    grpc__health__v1__health_check_request__free_unpacked(rq, NULL);
}

/* Watch: the current status at once, then every change, until the client
 * cancels or the server stops.  An unknown service is SERVICE_UNKNOWN. */
void rpc_server__health_watch(void *arg, struct rpc_stream *st)
{
    struct rpc_server *srv = arg;
    struct slot *s = (struct slot *)st;
    const uint8_t *buf;
    size_t len;
    char service[128];

    if (rpc_stream_read(st, &buf, &len) <= 0) {
        rpc_stream_finish(st, GRPC_STATUS_INVALID_ARGUMENT, "Watch needs a request");
        return;
    }
    Grpc__Health__V1__HealthCheckRequest *rq =
        grpc__health__v1__health_check_request__unpack(NULL, len, buf);
    if (!rq) {
        rpc_stream_finish(st, GRPC_STATUS_INVALID_ARGUMENT,
                          "HealthCheckRequest does not parse");
        return;
    }
    snprintf(service, sizeof service, "%s", rq->service);
    grpc__health__v1__health_check_request__free_unpacked(rq, NULL);

    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    op.data.recv_close_on_server.cancelled = &s->cancelled;
    if (rpc_server__stream_start(s, &op, 1, &s->close_tag) != GRPC_CALL_OK)
        return;
    s->close_posted = true;

    /* stopping is read before the status, so the change a server makes
     * just before it stops (NOT_SERVING) is still sent. */
    int last = -2;
    for (;;) {
        bool stop = atomic_load(&srv->stopping) || s->close_done;
        int now = health_lookup(srv, service);
        if (!stop && now == last) {
            pthread_mutex_lock(&srv->lock);
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 200 * 1000 * 1000;
            if (ts.tv_nsec >= 1000000000) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000;
            }
            pthread_cond_timedwait(&srv->health_cond, &srv->lock, &ts);
            pthread_mutex_unlock(&srv->lock);
            now = health_lookup(srv, service);
        }
        if (now != last && !s->close_done) {
            Grpc__Health__V1__HealthCheckResponse resp =
                GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
            resp.status =
                now < 0 ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVICE_UNKNOWN
                : now ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING
                      : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING;
            if (rpc_stream_write(st, &resp.base) < 0)
                break;
            last = now;
        }
        if (stop)
            break;
        /* Has the client gone away? */
        rpc_server__stream_next(s, gpr_time_0(GPR_CLOCK_REALTIME));
    }
    if (!s->close_done)
        rpc_stream_finish(st, GRPC_STATUS_UNAVAILABLE, "server shutting down");
    s->finished = true;
    /* Collect the early RECV_CLOSE_ON_SERVER before the queue is drained. */
    while (!s->close_done)
        if (rpc_server__stream_next(s, rpc_server__inf_future()).type != GRPC_OP_COMPLETE)
            break;
}

