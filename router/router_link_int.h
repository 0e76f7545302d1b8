/* router_link_int: what the two halves of router_link share (router_link.c:
 * streams, queues, deadlines and submission; router_link_msg.c: building a
 * message from the queue and handing its answer back to the calls).  Not
 * for the rest of the router: router_link.h is the contract.
 *
 * Locking: the link's mutex guards the lanes, their queues, streams and
 * messages, the calls' private fields and the list of finished sets; the
 * functions below are called with it held.
 */
#ifndef BLOOMGRID_ROUTER_LINK_INT_H
#define BLOOMGRID_ROUTER_LINK_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <grpc/grpc.h>

#include "bloomgrid/v1/internal.pb-c.h"
#include "node_client.h"
#include "router_link.h"
#include "rpc_arena.h"
#include "rpc_server.h"

enum { LANE_READ, LANE_WRITE, LANES };

/* Write messages a lane keeps in flight: the second goes while the node
 * makes the first durable, and its writes join the node's next fsync
 * (node_batch_rpc.c applies as many before answering the first). */
#define LINK_WRITE_WINDOW 2
/* A lane sends a message with its answer's receive in one batch (lane_kick)
 * only when the message is at most LINK_JOIN_BYTES and went out alone:
 *   write lane: its last answer came within LINK_JOIN_NS of its send and
 *     found nothing else waiting.  A joined send's end is known only with
 *     its answer, so the lane's second message waits for it: under load,
 *     for big writes, and where a node's answers wait for an fsync, the
 *     write lane keeps its window.
 *   read lane: its last answer found no call queued and the message took
 *     every queued call.  Its window is one message, so a joined send holds
 *     nothing back.  A queue behind the message in flight keeps the
 *     receive posted by the thread that reads the answers, at once, and
 *     the next message sent from there.  (Many RESP clients on one loop
 *     mostly have no queue: a loop pass's commands are one call.) */
#define LINK_JOIN_BYTES (16u << 10)
#define LINK_JOIN_NS 300000

enum call_state { CALL_NEW, CALL_QUEUED, CALL_SENT, CALL_DONE };
/* TAG_SENDRECV: a message sent with the receive of the next answer in one
 * batch (router_link.c, lane_kick). */
enum tag_kind { TAG_SEND, TAG_RECV, TAG_STATUS, TAG_SENDRECV, TAGS };

/* The calls of one router_link_submit: done runs once pending reaches 0. */
struct link_set {
    atomic_size_t pending;
    router_link_done_fn done;
    void *arg;
    struct link_set *next;      /* on a link's fired list */
};

struct link_tag {
    struct rpc_loop_tag hdr;    /* first: the tag of a loop's queue */
    struct link_stream *s;
    enum tag_kind kind;
};

/* One Batches call.  Freed once every batch started on it has completed. */
struct link_stream {
    struct link_lane *lane;
    grpc_call *call;
    struct link_tag tags[TAGS];
    int ops;                    /* batches started and not completed */
    bool md_sent, sending, ended;
    bool receiving;             /* a RECV_MESSAGE is posted */
    bool stuck;                 /* cancelled: a message outlived a deadline */
    bool bad_answer;            /* cancelled: an answer that does not fit */
    grpc_byte_buffer *send_buf, *recv_buf;
    grpc_metadata_array md_initial, md_trailing;
    grpc_status_code status;
    grpc_slice details;
    const char *err_string;
};

/* Where a call entry's hashes sit in a message: its wire entry, its first
 * hash there, and its run (an entry of runs: each call entry is one). */
struct link_slot {
    uint32_t wire, off, run;
};

/* A message in flight (one allocation holding every array). */
struct link_msg {
    uint64_t id;
    int64_t sent_ns;            /* CLOCK_MONOTONIC, when it was sent */
    struct link_msg *next;      /* the lane's next message in flight */
    struct link_stream *s;
    size_t ncalls;
    struct router_link_call **calls;   /* NULL once its caller took it back */
    size_t *first;              /* per call: its first slot */
    struct link_slot *slots;    /* per call entry */
    size_t nwire;
    uint32_t *wire_n;           /* hashes per wire entry */
    uint32_t *wire_shard;       /* its shard (an entry of runs: the first's) */
    uint32_t *wire_runs;        /* its runs; 1: an entry of one shard */
};

struct link_lane {
    struct router_link *l;
    int kind;
    struct link_stream *cur;    /* NULL: open one on the next send */
    struct router_link_call *qhead, *qtail;
    /* Messages sent and not yet answered, oldest first (all on cur): at
     * most one on the read lane, LINK_WRITE_WINDOW on the write lane. */
    struct link_msg *ihead, *itail;
    unsigned ninflight;
    uint64_t next_id;
    /* Send the next message with the receive of its answer in one batch,
     * as LINK_JOIN_BYTES says (lane_kick); no receive is posted meanwhile. */
    bool joined;
};

/* Scratch for building messages, reused under the link's mutex. */
struct link_build {
    struct node_client_batch_entry *ent;   /* per wire entry */
    struct node_client_batch_scratch pack;
    struct router_link_call **wire_call;   /* the call that opened a wire entry */
    uint32_t *wire_start, *wire_n, *wire_shard;
    uint32_t *wire_runs, *wire_rstart;     /* runs, and the first's index */
    uint32_t *wire_fill;                   /* hashes of its runs placed */
    bool *wire_multi;                      /* keyed without its shard */
    uint32_t *run_shard, *run_count;       /* every wire entry's runs */
    /* Per run, in the order they opened: its wire entry, shard, hashes,
     * index in its wire entry and first hash there; rtable finds a run by
     * (wire entry, shard). */
    uint32_t *r_wire, *r_shard, *r_count, *r_local, *r_off;
    int32_t *rtable;
    uint64_t *wire_hash;
    size_t wcap;
    int32_t *table;
    size_t tcap;
    uint8_t *hb;
    size_t hcap;
};

struct router_link {
    char *addr;
    struct router_link_config cfg;
    struct rpc_channel *ch;
    void *method;               /* Batches, registered on the channel */
    grpc_completion_queue *cq;  /* a loop's (cfg.cq) or own_cq */
    bool own_cq;                /* read by thread, which also expires */
    pthread_t thread;           /* own_cq, or the deadlines only */
    pthread_mutex_t tmu;        /* the deadline thread's sleep */
    pthread_cond_t tcv;
    bool quit;                  /* under tmu: the deadline thread ends */
    pthread_mutex_t mu;
    pthread_cond_t idle;        /* a stream was freed */
    struct link_lane lane[LANES];
    size_t qbytes;              /* bytes of queued calls */
    int streams;                /* not yet freed */
    bool closing;
    _Atomic int64_t due;        /* no pending call's deadline is earlier
                                   (monotonic ns; INT64_MAX: none known) */
    struct link_set *fired;     /* sets whose last call ended: run their done
                                   once the mutex is let go */
    struct link_build b;
    /* The node refused an entry of runs as a node of an earlier release
     * does (WRONG_SHARD for the whole entry): one entry per shard since. */
    bool no_runs;
    struct rpc_arena arena;     /* answers; only the thread that reads cq */
    /* bloomgrid_router_node_calls_total{code="OK"} and the latency
     * histogram of the calls to this node (other codes: looked up). */
    struct metric *m_ok[LANES], *m_duration;
    /* bloomgrid_router_node_messages_total: messages sent per lane, [0]
     * apart from the receive of their answer, [1] joined with it. */
    struct metric *m_sent[LANES][2];
};

/* The call is done: count it off its set (which goes on l's fired list
 * when it was the last).  The call is not touched after this. */
void router_link__call_done(struct router_link *l, struct router_link_call *c);

/* Hashes of all entries of c. */
size_t router_link__call_hashes(const struct router_link_call *c);

/* A message of the calls at the lane's queue front, packed into *out.  The
 * calls taken leave the queue (CALL_SENT).  NULL when out of memory (the
 * calls then stay queued). */
struct link_msg *router_link__msg_build(struct link_lane *ln, grpc_byte_buffer **out);

/* Give every call of m its entries' outcomes from resp; each is then done. */
void router_link__msg_deliver(struct router_link *l, struct link_msg *m,
                              const Bloomgrid__V1__BatchResponse *resp);

/* Free the build scratch. */
void router_link__build_free(struct link_build *b);

#endif
