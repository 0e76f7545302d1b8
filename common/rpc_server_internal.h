/* rpc_server_internal: the server's private types, shared by rpc_server.c
 * (calls, workers, shutdown), rpc_stream.c (streaming calls) and
 * rpc_health.c (grpc.health.v1.Health).  Not for use outside common/rpc_*.c.
 */
#ifndef BLOOMGRID_RPC_SERVER_INTERNAL_H
#define BLOOMGRID_RPC_SERVER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include <grpc/grpc.h>
#include <grpc/support/time.h>

#include "rpc_server.h"

#define HEALTH_MAX 16

struct rpc_method {
    char *path;
    void *handle;          /* grpc_server_register_method */
    rpc_unary_fn unary;
    rpc_stream_fn stream;
    void *arg;
    const ProtobufCMessageDescriptor *input;  /* NULL: the handler checks */
};

enum slot_kind { SLOT_UNARY, SLOT_STREAM, SLOT_GENERIC };
enum slot_state { SLOT_REQUESTED, SLOT_REPLYING };

struct worker_cq {
    grpc_completion_queue *cq;
};

/* One posted request and, once it arrives, the call. */
struct slot {
    enum slot_kind kind;
    enum slot_state state;
    struct rpc_server *srv;
    struct rpc_method *m;        /* NULL for generic */
    int cqi;                     /* notification queue index */
    grpc_call *call;
    gpr_timespec deadline;
    grpc_metadata_array md;
    grpc_byte_buffer *payload;   /* unary request */
    grpc_call_details details;   /* generic */
    struct rpc_reply reply;
    grpc_slice status_details;
    bool has_status_details;
    grpc_metadata reason_md;     /* trailing "bloomgrid-reason" */
    grpc_byte_buffer *send_buf;
    int cancelled;
    /* streaming only */
    grpc_completion_queue *cq;   /* bound to the call */
    bool md_sent, finished;
    grpc_slice cur;              /* last message read */
    bool has_cur;
    /* A RECV_CLOSE_ON_SERVER posted early (health Watch) to learn when the
     * client goes away; its completion has the tag &close_tag. */
    bool close_posted, close_done;
    char close_tag;
    /* One message send may run while the handler reads (rpc_stream_send). */
    char write_tag;
    bool write_pending, write_failed;
    grpc_byte_buffer *write_buf;
    /* A message broke the string rule: the status the call ends with. */
    bool bad_request;
    char bad_msg[RPC_MSGLEN];
};

struct health_entry {
    char name[128];
    bool serving;
};

struct rpc_server {
    struct rpc_server_config cfg;
    grpc_server *server;
    int ncq;
    struct worker_cq *cqs;
    int nthreads;
    pthread_t *threads;
    struct rpc_method **methods;
    size_t nmethods;
    atomic_bool stopping;
    bool started, shut;
    pthread_mutex_t lock;        /* streams_active, health */
    pthread_cond_t cond;
    pthread_cond_t health_cond;  /* broadcast on every health change */
    int streams_active;
    struct health_entry health[HEALTH_MAX];
    int nhealth;
};

static inline gpr_timespec rpc_server__inf_future(void)
{
    return gpr_inf_future(GPR_CLOCK_REALTIME);
}

/* rpc_health.c: the Health service's handlers. */
void rpc_server__health_check(void *arg, const uint8_t *req, size_t len,
                              struct rpc_reply *reply);
void rpc_server__health_watch(void *arg, struct rpc_stream *st);

/* rpc_stream.c: account for a completion on a stream's queue that is not
 * the batch being waited for (a send started by rpc_stream_send, or an
 * early RECV_CLOSE_ON_SERVER). */
void rpc_server__stream_side_event(struct slot *s, const grpc_event *ev);

#endif
