/* Router test "limits": the router's own budgets (docs/SECURITY.md, "The
 * router's budgets"; docs/ROUTER.md, "Memory and other budgets") hold
 * against clients that try to make it spend memory, streams and
 * connections.
 *
 * usage: test_router_limits NODE_BIN ROUTER_BIN CASE
 *   flood       at once, against a router in front of three nodes: 30
 *               concurrent MayContain calls of 8 MB each, each on a
 *               connection of its own (a read token's worth of work), 12
 *               Imports of a filter's own bundle (8.9 MB, 64 shards), each
 *               sent but for its last message and then held open, and 400
 *               idle TCP connections (half of them silent, half past the
 *               HTTP/2 preface), with max_memory_mb = 64.  The router's peak
 *               RSS (VmHWM, started over before the flood) stays within its
 *               RSS before, its budget and 128 MiB; every big call is
 *               answered OK or RESOURCE_EXHAUSTED naming max_memory_mb;
 *               every held Import is ended RESOURCE_EXHAUSTED naming
 *               stream_idle_ms (or max_memory_mb); every idle connection is
 *               closed; and another client reading one key every 10 ms gets
 *               every answer, and "maybe" (its p50, p99 and worst latency
 *               are printed, not asserted).
 *   flood_full  the same at full size with the default budget (512 MiB):
 *               30 calls of 60 MB, 24 Imports of 60 MiB, 2 000 connections;
 *               peak RSS at most 1 GiB.  Not in the suite (about a minute,
 *               2 GB of memory for the clients): `make flood-router`.
 *   conn        conn_idle_ms: a silent TCP connection and an idle HTTP/2
 *               connection are closed by the router.
 *   streams     max_streams: with four Imports held open, a fifth Import
 *               and a MayContainStream are refused RESOURCE_EXHAUSTED
 *               naming max_streams while unary calls go on; one ended
 *               makes room.
 *   idle        stream_idle_ms: an Import that stops sending is ended with
 *               RESOURCE_EXHAUSTED naming stream_idle_ms, changes nothing,
 *               and gives its stream back (max_streams = 1).
 *   import      an Import is streamed to the nodes shard by shard: the
 *               router's peak RSS grows by less than half of a 38 MB
 *               bundle; keys removed come back; a bundle damaged in its
 *               last shard is refused, saying that shards 0..14 were
 *               merged, with every key of those shards back and the last
 *               shard's not.
 */
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <grpc/byte_buffer.h>
#include <grpc/grpc.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "bf.h"
#include "bundle.h"
#include "cluster.h"

#define M_MAY_CONTAIN "/bloomgrid.v1.BloomGrid/MayContain"
#define M_IMPORT "/bloomgrid.v1.BloomGrid/Import"
#define BIG_KEY 4000           /* bytes of each key of a big call */
#define BIG_DEADLINE_MS 120000
/* A held Import the router does not end is given up by its client then. */
#define HOLD_DEADLINE_MS 40000
#define PROBE_DEADLINE_MS 60000

/* ---- what the test reads of the router ---- */

/* A line "NAME: N kB" of /proc/PID/status. */
static uint64_t status_kb(pid_t pid, const char *name)
{
    char path[64], line[256], want[64];
    unsigned long long kb = 0;
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    snprintf(want, sizeof want, "%s: %%llu kB", name);
    FILE *f = fopen(path, "r");
    CHECK(f != NULL, "cannot read %s", path);
    while (fgets(line, sizeof line, f))
        if (sscanf(line, want, &kb) == 1)
            break;
    fclose(f);
    return kb;
}

/* Start the peak RSS (VmHWM) of pid over from its RSS now (clear_refs,
 * Linux 4.0 and later), so that the flood's peak is what is measured. */
static void hwm_reset(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/clear_refs", (int)pid);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL && fputs("5", f) >= 0 && fclose(f) == 0,
          "cannot reset the peak RSS of %d through %s", (int)pid, path);
}

static void expect_exhausted(int code, const char *msg, const char *budget,
                             const char *what)
{
    CHECK(code == GRPC_STATUS_RESOURCE_EXHAUSTED, "%s: want RESOURCE_EXHAUSTED, got "
          "%d: %s", what, code, msg);
    CHECK(strstr(msg, budget) != NULL, "%s: message does not name %s: %s", what,
          budget, msg);
}

/* ---- big unary calls, all sending one shared message ---- */

struct big {
    pthread_t th;
    const char *addr;
    grpc_slice body;           /* shared, packed once */
    int code;
    char msg[RPC_MSGLEN];
    int reconnects;            /* calls made again (big_run) */
};

/* One unary call on a connection of its own (a client of its own), sending
 * body without copying it. */
static void big_once(struct big *b)
{
    grpc_channel_args args;
    grpc_arg a[2];
    a[0].type = GRPC_ARG_INTEGER;
    a[0].key = GRPC_ARG_MAX_SEND_MESSAGE_LENGTH;
    a[0].value.integer = 1 << 30;
    /* One connection per caller, not one shared by every channel. */
    a[1].type = GRPC_ARG_INTEGER;
    a[1].key = GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL;
    a[1].value.integer = 1;
    args.num_args = 2;
    args.args = a;
    grpc_channel_credentials *creds = grpc_insecure_credentials_create();
    grpc_channel *ch = grpc_channel_create(b->addr, creds, &args);
    grpc_channel_credentials_release(creds);
    grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
    gpr_timespec deadline = gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                         gpr_time_from_millis(BIG_DEADLINE_MS,
                                                              GPR_TIMESPAN));
    grpc_slice method = grpc_slice_from_static_string(M_MAY_CONTAIN);
    grpc_call *call = grpc_channel_create_call(ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq,
                                               method, NULL, deadline, NULL);
    grpc_byte_buffer *send = grpc_raw_byte_buffer_create(&b->body, 1);
    grpc_byte_buffer *recv = NULL;
    grpc_metadata_array mi, mt;
    grpc_status_code code = GRPC_STATUS_UNKNOWN;
    grpc_slice details = grpc_empty_slice();
    grpc_metadata_array_init(&mi);
    grpc_metadata_array_init(&mt);
    grpc_op ops[6];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = send;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &mi;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &recv;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &mt;
    ops[5].data.recv_status_on_client.status = &code;
    ops[5].data.recv_status_on_client.status_details = &details;
    CHECK(grpc_call_start_batch(call, ops, 6, ops, NULL) == GRPC_CALL_OK, "big call");
    grpc_event ev = grpc_completion_queue_pluck(cq, ops, gpr_inf_future(GPR_CLOCK_REALTIME),
                                                NULL);
    CHECK(ev.type == GRPC_OP_COMPLETE, "big call batch");
    b->code = (int)code;
    char *d = grpc_slice_to_c_string(details);
    snprintf(b->msg, sizeof b->msg, "%s", d);
    gpr_free(d);
    if (recv)
        grpc_byte_buffer_destroy(recv);
    grpc_byte_buffer_destroy(send);
    grpc_slice_unref(details);
    grpc_metadata_array_destroy(&mi);
    grpc_metadata_array_destroy(&mt);
    grpc_call_unref(call);
    grpc_completion_queue_shutdown(cq);
    while (grpc_completion_queue_pluck(cq, NULL, gpr_inf_future(GPR_CLOCK_REALTIME),
                                       NULL).type != GRPC_QUEUE_SHUTDOWN)
        ;
    grpc_completion_queue_destroy(cq);
    grpc_channel_destroy(ch);
}

/* big_once, made once more when its connection could not be made at all.
 * About one run in twelve, one of the 30 channels opened at once beside
 * the 400 held connections fails its connect on the client's side
 * (UNAVAILABLE "failed to connect to all addresses ... No such file or
 * directory") while the router logs nothing of it; the same with ca9b4f3's
 * router. No byte of that call reached the router, and what the flood
 * checks is how the router answers calls that do. */
static void *big_run(void *p)
{
    struct big *b = p;

    big_once(b);
    if (b->code == GRPC_STATUS_UNAVAILABLE && strstr(b->msg, "failed to connect")) {
        b->reconnects++;
        big_once(b);
    }
    return NULL;
}

/* A MayContainRequest of about mb megabytes (keys of BIG_KEY bytes). */
static grpc_slice big_body(const char *filter, size_t mb)
{
    size_t n = mb * 1000000 / BIG_KEY;
    ProtobufCBinaryData *kd = calloc(n, sizeof *kd);
    uint8_t *keys = malloc(n * BIG_KEY);
    CHECK(kd && keys, "out of memory");
    for (size_t i = 0; i < n; i++) {
        memset(keys + i * BIG_KEY, 'a' + (int)(i % 26), BIG_KEY);
        snprintf((char *)keys + i * BIG_KEY, 32, "big-%zu-", i);
        kd[i].data = keys + i * BIG_KEY;
        kd[i].len = BIG_KEY;
    }
    Bloomgrid__V1__MayContainRequest rq = BLOOMGRID__V1__MAY_CONTAIN_REQUEST__INIT;
    rq.filter = (char *)filter;
    rq.n_keys = n;
    rq.keys = kd;
    size_t len = protobuf_c_message_get_packed_size(&rq.base);
    grpc_slice s = grpc_slice_malloc(len);
    protobuf_c_message_pack(&rq.base, GRPC_SLICE_START_PTR(s));
    free(keys);
    free(kd);
    return s;
}

/* ---- the small client: one key every 10 ms ---- */

struct prober {
    pthread_t th;
    struct rpc_channel *ch;
    atomic_bool stop;
    size_t calls, failed;
    char first_failure[RPC_MSGLEN + 32];
    double *lat;               /* seconds, one per call */
    size_t cap;
};

/* A 1-key MayContain of "probe-key" on filter f: 0 with *present, or the
 * status code.  Its deadline is generous (a busy test machine is no
 * failure of the router's); its latency is measured, not asserted. */
static int probe_call(struct rpc_channel *ch, bool *present, struct rpc_status *st)
{
    Bloomgrid__V1__MayContainRequest rq = BLOOMGRID__V1__MAY_CONTAIN_REQUEST__INIT;
    ProtobufCBinaryData key = {.data = (uint8_t *)"probe-key", .len = 9};
    Bloomgrid__V1__MayContainResponse *resp = NULL;
    rq.filter = "f";
    rq.n_keys = 1;
    rq.keys = &key;
    if (rpc_call(ch, M_MAY_CONTAIN, &rq.base, &bloomgrid__v1__may_contain_response__descriptor,
                 (ProtobufCMessage **)&resp, PROBE_DEADLINE_MS, st) < 0)
        return st->code;
    CHECK(resp->n_present == 1, "%zu answers for 1 key", resp->n_present);
    *present = resp->present[0];
    bloomgrid__v1__may_contain_response__free_unpacked(resp, NULL);
    return 0;
}

static void *probe_run(void *p)
{
    struct prober *pr = p;
    while (!atomic_load(&pr->stop)) {
        bool out[1] = {false};
        struct rpc_status st;
        double t0 = harness_now_s();
        int rc = probe_call(pr->ch, out, &st);
        double dt = harness_now_s() - t0;
        if (pr->calls == pr->cap) {
            pr->cap = pr->cap ? 2 * pr->cap : 4096;
            pr->lat = realloc(pr->lat, pr->cap * sizeof *pr->lat);
            CHECK(pr->lat, "out of memory");
        }
        pr->lat[pr->calls++] = dt;
        if (rc != 0 || !out[0]) {
            if (!pr->failed++)
                snprintf(pr->first_failure, sizeof pr->first_failure, "%d %s", rc,
                         rc ? st.message : "said absent");
        }
        harness_sleep_ms(10);
    }
    return NULL;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* ---- Imports held open ---- */

struct holder {
    pthread_t th;
    struct rpc_channel *ch;
    const uint8_t *bundle;
    size_t len;
    size_t sent;
    int code;
    char msg[RPC_MSGLEN];
};

#define IMPORT_CHUNK (1u << 20)

/* Send every message of the bundle but the last, then wait for the router
 * to end the call. */
static void *hold_run(void *p)
{
    struct holder *h = p;
    struct rpc_status st;
    struct rpc_cstream *cs = rpc_cstream_open(h->ch, M_IMPORT, HOLD_DEADLINE_MS);
    CHECK(cs, "open Import");
    for (size_t off = 0; off + IMPORT_CHUNK < h->len; off += IMPORT_CHUNK) {
        Bloomgrid__V1__ImportRequest rq = BLOOMGRID__V1__IMPORT_REQUEST__INIT;
        rq.filter = off == 0 ? "imp" : "";
        rq.data.data = (uint8_t *)h->bundle + off;
        rq.data.len = IMPORT_CHUNK;
        if (rpc_cstream_write_msg(cs, &rq.base) < 0)
            break;
        h->sent = off + IMPORT_CHUNK;
    }
    grpc_slice sl;
    while (rpc_cstream_read(cs, &sl) == 1)
        grpc_slice_unref(sl);
    h->code = rpc_cstream_finish(cs, &st) < 0 ? (int)st.code : 0;
    snprintf(h->msg, sizeof h->msg, "%s", st.message);
    return NULL;
}

/* ---- idle connections ---- */

static int conn_open(int port, bool preface)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(fd >= 0, "socket: %s", strerror(errno));
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    CHECK(connect(fd, (struct sockaddr *)&a, sizeof a) == 0, "connect: %s",
          strerror(errno));
    if (preface) {
        /* The client preface and an empty SETTINGS frame: a connection
         * that then makes no call. */
        static const char p[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
                                "\x00\x00\x00\x04\x00\x00\x00\x00\x00";
        CHECK(send(fd, p, sizeof p - 1, 0) == (ssize_t)(sizeof p - 1), "preface");
    }
    return fd;
}

/* Wait until the router has closed every one of fds[0, n) (reading and
 * dropping what it sends first: settings, GOAWAY), at most timeout_s. */
static void conns_wait_closed(int *fds, int n, double timeout_s)
{
    double until = harness_now_s() + timeout_s;
    int open = n;
    struct pollfd *pf = calloc((size_t)n, sizeof *pf);
    CHECK(pf, "out of memory");
    while (open > 0) {
        int left = (int)((until - harness_now_s()) * 1000);
        CHECK(left > 0, "%d of %d idle connections still open after %.0f s", open, n,
              timeout_s);
        for (int i = 0; i < n; i++) {
            pf[i].fd = fds[i];
            pf[i].events = POLLIN;
        }
        CHECK(poll(pf, (nfds_t)n, left) >= 0, "poll: %s", strerror(errno));
        for (int i = 0; i < n; i++) {
            if (fds[i] < 0 || !(pf[i].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            char b[4096];
            ssize_t r = recv(fds[i], b, sizeof b, MSG_DONTWAIT);
            if (r == 0 || (r < 0 && errno != EAGAIN)) {
                close(fds[i]);
                fds[i] = -1;
                open--;
            }
        }
    }
    free(pf);
}

/* The bundle of filter name (t_export with a deadline for a big filter on a
 * busy machine); dies on failure. */
static uint8_t *export_all(struct rpc_channel *ch, const char *name, size_t *len)
{
    struct rpc_status st;
    Bloomgrid__V1__ExportRequest rq = BLOOMGRID__V1__EXPORT_REQUEST__INIT;
    rq.filter = (char *)name;
    rq.chunk_size = 1u << 20;
    struct rpc_cstream *cs = rpc_cstream_open(ch, "/bloomgrid.v1.BloomGrid/Export",
                                              BIG_DEADLINE_MS);
    CHECK(cs && rpc_cstream_write_msg(cs, &rq.base) == 0 &&
          rpc_cstream_close_send(cs) == 0, "send ExportRequest");
    uint8_t *buf = NULL;
    size_t got = 0, cap = 0;
    uint64_t total = 0;
    grpc_slice sl;
    while (rpc_cstream_read(cs, &sl) == 1) {
        Bloomgrid__V1__FileChunk *fc = bloomgrid__v1__file_chunk__unpack(
            NULL, GRPC_SLICE_LENGTH(sl), GRPC_SLICE_START_PTR(sl));
        /* total_size 0: not known yet; the last chunk says it. */
        CHECK(fc && fc->offset == got && (!fc->total_size ||
              fc->offset + fc->data.len <= fc->total_size), "chunk at %zu", got);
        if (fc->total_size)
            total = fc->total_size;
        if (got + fc->data.len > cap) {
            cap = cap ? cap : 1u << 20;
            while (cap < got + fc->data.len)
                cap *= 2;
            CHECK((buf = realloc(buf, cap)) != NULL, "out of memory");
        }
        memcpy(buf + got, fc->data.data, fc->data.len);
        got += fc->data.len;
        bloomgrid__v1__file_chunk__free_unpacked(fc, NULL);
        grpc_slice_unref(sl);
    }
    CHECK(rpc_cstream_finish(cs, &st) == 0, "Export of %s: %s", name, st.message);
    CHECK(total == got, "Export of %s: %zu bytes, the last chunk says %llu", name, got,
          (unsigned long long)total);
    *len = got;
    return buf;
}

/* ---- the flood ---- */

struct flood {
    int calls;
    size_t call_mb;
    int imports;
    size_t filter_capacity;    /* of the imported filter: its bundle's size */
    int conns;
    uint64_t budget_mb;        /* the router's max_memory_mb */
    uint64_t slack_mb;         /* peak RSS allowed past the budget and the
                                  RSS before: what the router holds outside
                                  it (held Imports' messages and gRPC's
                                  buffers, idle connections, the heap) */
    const char *const *router_flags;
};

static void flood_run(const struct flood *fl)
{
    struct cluster c;
    struct rpc_status st;
    cluster_init(&c, "router-flood", "none");
    for (int i = 0; i < 3; i++)
        cluster_node_start(&c, i, 0, NULL);
    cluster_write_topo(&c, 3, false, NULL);
    c.router_flags = fl->router_flags;
    cluster_router_start(&c, 0, NULL);
    struct node_proc *rp = &c.router[0];

    /* The probe's filter, and the one the Imports fill (its own bundle). */
    CHECK(t_create_sharded(rp->ch, "f", 100000, 0.01, 0, 8, NULL, &st) == 0,
          "create f: %s", st.message);
    char *key[1] = {"probe-key"};
    bool out[1];
    CHECK(t_keys(rp->ch, "Add", "f", key, 1, out, &st) == 0, "add: %s", st.message);
    CHECK(t_create_sharded(rp->ch, "imp", fl->filter_capacity, 0.01, 0, 64, NULL,
                           &st) == 0, "create imp: %s", st.message);
    size_t blen;
    uint8_t *bundle = export_all(rp->ch, "imp", &blen);
    grpc_slice body = big_body("f", fl->call_mb);

    hwm_reset(rp->pid);
    uint64_t rss0 = status_kb(rp->pid, "VmRSS");
    printf("router before the flood: VmRSS %llu kB, VmHWM %llu kB; bundle %zu bytes, "
           "big message %zu bytes\n", (unsigned long long)rss0,
           (unsigned long long)status_kb(rp->pid, "VmHWM"), blen,
           GRPC_SLICE_LENGTH(body));

    int *fds = calloc((size_t)fl->conns, sizeof *fds);
    CHECK(fds, "out of memory");
    for (int i = 0; i < fl->conns; i++)
        fds[i] = conn_open(rp->port, i % 2);

    struct prober pr = {.ch = rpc_channel_create(rp->addr, 0)};
    atomic_init(&pr.stop, false);

    CHECK(pthread_create(&pr.th, NULL, probe_run, &pr) == 0, "thread");
    harness_sleep_ms(200);

    double t0 = harness_now_s();
    struct holder *h = calloc((size_t)fl->imports, sizeof *h);
    struct big *b = calloc((size_t)fl->calls, sizeof *b);
    CHECK(h && b, "out of memory");
    for (int i = 0; i < fl->imports; i++) {
        h[i].ch = rpc_channel_create(rp->addr, 0);
        h[i].bundle = bundle;
        h[i].len = blen;
        CHECK(pthread_create(&h[i].th, NULL, hold_run, &h[i]) == 0, "thread");
    }
    for (int i = 0; i < fl->calls; i++) {
        b[i].addr = rp->addr;
        b[i].body = body;
        CHECK(pthread_create(&b[i].th, NULL, big_run, &b[i]) == 0, "thread");
    }
    int ok = 0, refused = 0, other = 0, again = 0;
    for (int i = 0; i < fl->calls; i++) {
        pthread_join(b[i].th, NULL);
        again += b[i].reconnects;
        if (b[i].code == 0) {
            ok++;
        } else if (b[i].code == GRPC_STATUS_RESOURCE_EXHAUSTED &&
                   strstr(b[i].msg, "max_memory_mb")) {
            if (!refused++)
                printf("big call refused: %s\n", b[i].msg);
        } else if (!other++) {
            printf("big call failed: %d %s\n", b[i].code, b[i].msg);
        }
    }
    printf("%d big calls: %d OK, %d RESOURCE_EXHAUSTED, %d otherwise, in %.1f s "
           "(%d made again after a failed connect)\n",
           fl->calls, ok, refused, other, harness_now_s() - t0, again);
    int idled = 0;
    for (int i = 0; i < fl->imports; i++) {
        pthread_join(h[i].th, NULL);
        rpc_channel_destroy(h[i].ch);
        if (i == 0 || h[i].code != GRPC_STATUS_RESOURCE_EXHAUSTED)
            printf("held Import %d (%zu of %zu bytes sent): %d %s\n", i, h[i].sent,
                   blen, h[i].code, h[i].msg);
        idled += h[i].code == GRPC_STATUS_RESOURCE_EXHAUSTED &&
                 strstr(h[i].msg, "stream_idle_ms") != NULL;
    }
    printf("%d held Imports ended: %d by stream_idle_ms, %.1f s from the start\n",
           fl->imports, idled, harness_now_s() - t0);
    atomic_store(&pr.stop, true);
    pthread_join(pr.th, NULL);

    uint64_t hwm = status_kb(rp->pid, "VmHWM");
    qsort(pr.lat, pr.calls, sizeof *pr.lat, cmp_double);
    printf("small client: %zu calls, %zu failed; latency p50 %.1f ms, p99 %.1f ms, "
           "worst %.1f ms\n", pr.calls, pr.failed, 1e3 * pr.lat[pr.calls / 2],
           1e3 * pr.lat[pr.calls * 99 / 100], 1e3 * pr.lat[pr.calls - 1]);
    if (pr.failed)
        printf("small client's first failure: %s\n", pr.first_failure);
    printf("router peak RSS (VmHWM) %llu kB, before the flood %llu kB, budget %llu MiB\n",
           (unsigned long long)hwm, (unsigned long long)rss0,
           (unsigned long long)fl->budget_mb);
    CHECK(other == 0, "%d big calls failed otherwise than RESOURCE_EXHAUSTED naming "
          "max_memory_mb", other);
    for (int i = 0; i < fl->imports; i++) {
        CHECK(h[i].code == GRPC_STATUS_RESOURCE_EXHAUSTED,
              "held Import %d: want RESOURCE_EXHAUSTED, got %d: %s", i, h[i].code,
              h[i].msg);
        CHECK(strstr(h[i].msg, "stream_idle_ms") || strstr(h[i].msg, "max_memory_mb"),
              "held Import %d: message names no budget: %s", i, h[i].msg);
    }
    CHECK(pr.failed == 0, "%zu of %zu small calls failed, the first: %s", pr.failed,
          pr.calls, pr.first_failure);
    CHECK(hwm <= rss0 + (fl->budget_mb + fl->slack_mb) * 1024 && hwm <= 1024 * 1024,
          "router peak RSS %llu kB: more than 1 GiB or than its %llu kB before, its "
          "budget of %llu MiB and %llu MiB of slack", (unsigned long long)hwm,
          (unsigned long long)rss0, (unsigned long long)fl->budget_mb,
          (unsigned long long)fl->slack_mb);

    conns_wait_closed(fds, fl->conns, 60);
    printf("%d idle connections closed %.1f s from the start\n", fl->conns,
           harness_now_s() - t0);
    /* The router still serves, and the filter still has its key. */
    CHECK(t_keys(rp->ch, "MayContain", "f", key, 1, out, &st) == 0 && out[0],
          "after the flood: %s", st.message);
    rpc_channel_destroy(pr.ch);
    free(pr.lat);
    free(h);
    free(b);
    free(fds);
    free(bundle);
    grpc_slice_unref(body);
    cluster_stop(&c);
}

/* The routers of the floods wait up to 10 s for a node (the default is 5):
 * on a test machine busy with other work, creating the imported filter's
 * 64 shards can take longer than the cluster's 3 s. */
static void case_flood(void)
{
    /* A budget of 64 MiB, with messages of up to 16 MiB so that large ones
     * can be admitted at all (max_memory_mb must be 8/7 of it). */
    const char *flags[] = {"--max-memory-mb", "64", "--max-message-size", "16777216",
                           "--stream-idle-ms", "3000", "--conn-idle-ms", "3000",
                           "--node-timeout-ms", "10000", NULL};
    struct flood fl = {.calls = 30, .call_mb = 8, .imports = 12,
                       .filter_capacity = 7000000, .conns = 400, .budget_mb = 64,
                       .slack_mb = 128, .router_flags = flags};
    flood_run(&fl);
}

static void case_flood_full(void)
{
    /* The default max_memory_mb (512). */
    const char *flags[] = {"--stream-idle-ms", "5000", "--conn-idle-ms", "5000",
                           "--node-timeout-ms", "10000", NULL};
    struct flood fl = {.calls = 30, .call_mb = 60, .imports = 24,
                       .filter_capacity = 52000000, .conns = 2000, .budget_mb = 512,
                       .slack_mb = 480, .router_flags = flags};
    flood_run(&fl);
}

/* ---- conn_idle_ms ---- */

static void case_conn(void)
{
    struct cluster c;
    const char *flags[] = {"--conn-idle-ms", "500", NULL};
    cluster_start_flags(&c, "router-conn", 1, 1, "none", flags);
    /* One connection that never begins its handshake, one past it (the
     * HTTP/2 preface and settings) that makes no call: both are closed
     * (gRPC's own defaults keep the first 120 s and the second for ever).
     * The 30 s bound is generous, not a timing. */
    int fds[2] = {conn_open(c.router[0].port, false), conn_open(c.router[0].port, true)};
    conns_wait_closed(fds, 2, 30);
    CHECK(node_health(&c.router[0], "") == 1, "router not serving after closing them");
    cluster_stop(&c);
}

/* ---- max_streams ---- */

/* Open an Import of filter and send its first message, holding the stream
 * (the bundle's first 100 bytes: no shard's file is whole). */
static struct rpc_cstream *import_hold(struct rpc_channel *ch, const char *filter,
                                       const uint8_t *bundle)
{
    Bloomgrid__V1__ImportRequest rq = BLOOMGRID__V1__IMPORT_REQUEST__INIT;
    struct rpc_cstream *cs = rpc_cstream_open(ch, M_IMPORT, HOLD_DEADLINE_MS);
    CHECK(cs, "open Import");
    rq.filter = (char *)filter;
    rq.data.data = (uint8_t *)bundle;
    rq.data.len = 100;
    /* A stream refused at once fails here: its status is the finish's. */
    rpc_cstream_write_msg(cs, &rq.base);
    return cs;
}

/* Import the whole bundle in messages of chunk bytes: 0 or the status. */
static int import_all(struct rpc_channel *ch, const char *filter, const uint8_t *bundle,
                      size_t len, size_t chunk, struct rpc_status *st)
{
    struct rpc_cstream *cs = t_import_send(ch, filter, false, 0, bundle, len, chunk,
                                           BIG_DEADLINE_MS);
    rpc_cstream_close_send(cs);
    return t_import_answer(cs, len, NULL, st);
}

/* Import until the router has a stream for it (the one just ended gives
 * its thread back once its handler is gone), at most 10 s. */
static int import_retry(struct rpc_channel *ch, const char *filter, const uint8_t *bundle,
                        size_t len, struct rpc_status *st)
{
    int rc;
    for (int i = 0; i < 100; i++) {
        rc = import_all(ch, filter, bundle, len, 65536, st);
        if (rc != GRPC_STATUS_RESOURCE_EXHAUSTED || !strstr(st->message, "max_streams"))
            break;
        harness_sleep_ms(100);
    }
    return rc;
}

static void case_streams(void)
{
    struct cluster c;
    struct rpc_status st;
    const char *flags[] = {"--max-streams", "4", NULL};
    cluster_start_flags(&c, "router-streams", 2, 1, "none", flags);
    struct rpc_channel *r = c.router[0].ch;
    CHECK(t_create_sharded(r, "f", 10000, 0.01, 0, 4, NULL, &st) == 0, "create: %s",
          st.message);
    size_t blen;
    uint8_t *bundle = export_all(r, "f", &blen);

    /* Four Imports that sent a first message and wait take every stream.
     * A MayContain made after them on the same connection may be answered
     * before the router has taken them all: streams and unary calls
     * arrive on different queues, served by different threads.  A held
     * Import the router comes to after the fifth is refused, and the fifth
     * gets its stream; that round is ended, the refusal checked, and the
     * four held again. */
    struct rpc_cstream *held[4];
    char **k = keys_make("k", 0, 10);
    bool out[10];
    int rc = 0;
    for (int round = 0;; round++) {
        for (int i = 0; i < 4; i++)
            held[i] = import_hold(r, "f", bundle);
        CHECK(t_keys(r, "MayContain", "f", k, 10, out, &st) == 0, "MayContain: %s",
              st.message);
        /* A fifth stream is refused, naming the setting. */
        rc = import_all(r, "f", bundle, blen, 65536, &st);
        if (rc == GRPC_STATUS_RESOURCE_EXHAUSTED || round == 20)
            break;
        CHECK(rc == 0, "a fifth Import: %d %s", rc, st.message);
        /* It was admitted: one of the four must have been refused. */
        int refused = 0;
        for (int i = 0; i < 4; i++) {
            struct rpc_status hs;
            grpc_slice sl;
            rpc_cstream_close_send(held[i]);
            while (rpc_cstream_read(held[i], &sl) == 1)
                grpc_slice_unref(sl);
            if (rpc_cstream_finish(held[i], &hs) < 0 &&
                hs.code == GRPC_STATUS_RESOURCE_EXHAUSTED && strstr(hs.message, "max_streams"))
                refused++;
        }
        CHECK(refused > 0, "a fifth Import was admitted beside four held ones");
        printf("round %d: %d of the four held Imports refused, the fifth admitted; "
               "again\n", round, refused);
        harness_sleep_ms(200);
    }
    expect_exhausted(rc, st.message, "max_streams", "a fifth Import");
    printf("fifth stream: %s\n", st.message);
    /* A key stream alike; unary calls go on. */
    rc = t_stream_keys(r, "MayContainStream", "f", k, 10, 1, out, &st);
    expect_exhausted(rc, st.message, "max_streams", "a MayContainStream");
    CHECK(t_keys(r, "MayContain", "f", k, 10, out, &st) == 0, "MayContain beside full "
          "streams: %s", st.message);

    /* One of them ended: an Import gets its stream and completes. */
    rpc_cstream_cancel(held[0]);
    rpc_cstream_finish(held[0], &st);
    CHECK(import_retry(r, "f", bundle, blen, &st) == 0, "Import after one ended: %d %s",
          st.code, st.message);
    for (int i = 1; i < 4; i++) {
        rpc_cstream_cancel(held[i]);
        rpc_cstream_finish(held[i], &st);
    }
    keys_free(k, 10);
    free(bundle);
    cluster_stop(&c);
}

/* ---- stream_idle_ms ---- */

static void case_idle(void)
{
    struct cluster c;
    struct rpc_status st;
    /* One stream at a time: the next Import gets one only if the idle
     * one's was given back. */
    const char *flags[] = {"--stream-idle-ms", "500", "--max-streams", "1", NULL};
    cluster_start_flags(&c, "router-idle", 2, 1, "none", flags);
    struct rpc_channel *r = c.router[0].ch;
    const int counting = BLOOMGRID__V1__FILTER_KIND__FILTER_KIND_COUNTING;
    CHECK(t_create_sharded(r, "cnt", 20000, 0.01, counting, 4, NULL, &st) == 0,
          "create: %s", st.message);
    const size_t N = 2000;
    char **k = keys_make("idle", 0, N);
    keys_call(r, "Add", "cnt", k, N, 1000, NULL);
    size_t blen;
    uint8_t *bundle = export_all(r, "cnt", &blen);
    keys_call(r, "Remove", "cnt", k, N, 1000, NULL);
    CHECK(keys_present(r, "cnt", k, N, NULL) < N / 10, "keys present after Remove");

    /* An Import that sends the bundle's first bytes and stops is ended,
     * says why, and changes nothing. */
    for (int round = 0; round < 2; round++) {
        int rc;
        /* The second may come before the first one's thread is back. */
        for (int tries = 0; tries < 100; tries++) {
            struct rpc_cstream *cs = import_hold(r, "cnt", bundle);
            grpc_slice sl;
            while (rpc_cstream_read(cs, &sl) == 1)
                grpc_slice_unref(sl);
            rc = rpc_cstream_finish(cs, &st) < 0 ? (int)st.code : 0;
            if (rc != GRPC_STATUS_RESOURCE_EXHAUSTED || !strstr(st.message, "max_streams"))
                break;
            harness_sleep_ms(100);
        }
        expect_exhausted(rc, st.message, "stream_idle_ms", "an idle Import");
        if (round == 0)
            printf("idle Import: %s\n", st.message);
    }
    CHECK(keys_present(r, "cnt", k, N, NULL) < N / 10, "an idle Import changed the filter");
    /* Its stream is free again: a whole Import completes. */
    CHECK(import_retry(r, "cnt", bundle, blen, &st) == 0, "Import: %d %s", st.code,
          st.message);
    CHECK(keys_present(r, "cnt", k, N, NULL) == N, "keys missing after the Import");
    keys_free(k, N);
    free(bundle);
    cluster_stop(&c);
}

/* ---- Import, shard by shard ---- */

static void case_import(void)
{
    struct cluster c;
    struct rpc_status st;
    const char *flags[] = {"--node-timeout-ms", "10000", NULL};
    cluster_start_flags(&c, "router-import", 3, 1, "none", flags);
    struct node_proc *rp = &c.router[0];

    /* About 36 MB of bits in 64 shards: the router holds no more than a few
     * messages of it at a time (it used to collect the whole bundle). */
    CHECK(t_create_sharded(rp->ch, "big", 30000000, 0.01, 0, 64, NULL, &st) == 0,
          "create big: %s", st.message);
    size_t blen;
    uint8_t *big = export_all(rp->ch, "big", &blen);
    hwm_reset(rp->pid);
    uint64_t rss0 = status_kb(rp->pid, "VmRSS");
    CHECK(import_all(rp->ch, "big", big, blen, 1u << 20, &st) == 0, "Import big: %s",
          st.message);
    uint64_t hwm = status_kb(rp->pid, "VmHWM");
    printf("Import of %zu bytes: router peak RSS %llu kB, %llu kB before\n", blen,
           (unsigned long long)hwm, (unsigned long long)rss0);
    CHECK(hwm < rss0 + blen / 1024 / 2, "the router's RSS grew by %llu kB for an "
          "Import of %zu bytes", (unsigned long long)(hwm - rss0), blen);
    free(big);

    /* Keys come back; a bundle damaged in its last shard is refused, with
     * every shard before it merged and the last not. */
    const int counting = BLOOMGRID__V1__FILTER_KIND__FILTER_KIND_COUNTING;
    CHECK(t_create_sharded(rp->ch, "cnt", 20000, 0.01, counting, 16, NULL, &st) == 0,
          "create cnt: %s", st.message);
    const size_t N = 2000;
    char **k = keys_make("imp", 0, N);
    bool *present = calloc(N, sizeof *present);
    CHECK(present, "out of memory");
    keys_call(rp->ch, "Add", "cnt", k, N, 1000, NULL);
    uint8_t *bundle = export_all(rp->ch, "cnt", &blen);
    char err[BF_ERRLEN];
    struct bundle *parsed = bundle_parse(bundle, blen, err);
    CHECK(parsed && parsed->count == 16, "the export does not parse: %s", err);
    struct bundle_layout l;
    CHECK(bundle_layout_parse(bundle, blen, &l, err) == 0, "layout: %s", err);
    size_t last = (size_t)(l.entry[15].file - bundle) + l.entry[15].len / 2;
    bundle_layout_deinit(&l);
    keys_call(rp->ch, "Remove", "cnt", k, N, 1000, NULL);
    CHECK(keys_present(rp->ch, "cnt", k, N, NULL) < N / 10, "keys present after Remove");

    bundle[last] ^= 0x40;
    int rc = import_all(rp->ch, "cnt", bundle, blen, 4096, &st);
    printf("damaged last shard: %s\n", st.message);
    CHECK(rc == GRPC_STATUS_INVALID_ARGUMENT && strstr(st.message, "shards 0..14 were "
          "merged"), "damaged last shard: %d %s", rc, st.message);
    keys_present(rp->ch, "cnt", k, N, present);
    size_t in15 = 0, back15 = 0;
    for (size_t i = 0; i < N; i++) {
        struct bf_hash h = bundle_hash(parsed, k[i], strlen(k[i]));
        if (bf_hash_shard(h, 16) == 15) {
            in15++;
            back15 += present[i];
        } else {
            CHECK(present[i], "key %s of shard %u is not back", k[i], bf_hash_shard(h, 16));
        }
    }
    CHECK(in15 > 0 && back15 < in15 / 5 + 1, "%zu of the %zu keys of the damaged shard "
          "are back", back15, in15);
    bundle[last] ^= 0x40;
    CHECK(import_all(rp->ch, "cnt", bundle, blen, 4096, &st) == 0, "Import: %s",
          st.message);
    CHECK(keys_present(rp->ch, "cnt", k, N, NULL) == N, "keys missing after the Import");
    bundle_destroy(parsed);
    free(present);
    free(bundle);
    keys_free(k, N);
    cluster_stop(&c);
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s NODE_BIN ROUTER_BIN "
                "flood|flood_full|conn|streams|idle|import\n", argv[0]);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    harness_node_bin = argv[1];
    harness_router_bin = argv[2];
    grpc_init();
    const char *c = argv[3];
    if (!strcmp(c, "flood"))
        case_flood();
    else if (!strcmp(c, "flood_full"))
        case_flood_full();
    else if (!strcmp(c, "conn"))
        case_conn();
    else if (!strcmp(c, "streams"))
        case_streams();
    else if (!strcmp(c, "idle"))
        case_idle();
    else if (!strcmp(c, "import"))
        case_import();
    else {
        fprintf(stderr, "unknown case %s\n", c);
        return 2;
    }
    grpc_shutdown();
    printf("ok\n");
    return 0;
}
