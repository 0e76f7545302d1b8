/* Router test "async": key calls through a router never keep a worker
 * thread waiting for the nodes (router/router_rpc.c, router_nodes.h),
 * scenario by scenario, each with a router of one worker thread:
 *
 *   inflight      32 concurrent single-key MayContain calls and one
 *                 MayContainStream of 32 one-key messages sent before any
 *                 answer is read: every answer right and in order, and the
 *                 node gets each group in fewer messages than calls (the
 *                 NodeInfo counters), so they were with the node together
 *                 (one worker thread waiting per call, or a stream handled
 *                 message by message, sends one message per call).
 *   inflight_no_loops  the same with loops = 0 (the worker thread serves
 *                 key calls, each link reads its answers on its own thread).
 *   stream_error  a key stream whose third message names a dropped filter,
 *                 or holds an empty key: the answers of the first two, then
 *                 the status a node gives (NOT_FOUND / INVALID_ARGUMENT, same
 *                 message), and on AddStream nothing after the bad message
 *                 is added.
 *   stopped       a node stopped with SIGSTOP: calls to its filter fail
 *                 UNAVAILABLE naming the missed deadline once node_timeout_ms
 *                 passed, while calls to a filter on the other node are
 *                 answered meanwhile (before any of the stuck calls ends).
 *   uncached      the same with a second router that has not seen the
 *                 stopped node's filter: its calls must fetch the secret
 *                 from that node, which does not answer, and calls to the
 *                 filter it has cached are answered meanwhile (the fetch
 *                 waits on the router's pool, never on the event loop that
 *                 serves every key call).
 *
 * usage: test_router_async NODE_BIN ROUTER_BIN SCENARIO
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/grpc.h>

#include "cluster.h"

static const char *const one_thread[] = {"--threads", "1", NULL};

/* ---- inflight ---- */

#define IF_CALLERS 32
#define IF_KEYS 16          /* per caller; even ones are added first */

struct caller {
    struct rpc_channel *ch;
    int id;
    char **keys;
    char err[RPC_CLIENT_MSGLEN + 64];
};

static void *caller_main(void *arg)
{
    struct caller *c = arg;
    struct rpc_status st;
    for (int j = 0; j < IF_KEYS && !c->err[0]; j++) {
        bool out;
        if (t_keys(c->ch, "MayContain", "if", &c->keys[j], 1, &out, &st) != 0)
            snprintf(c->err, sizeof c->err, "caller %d key %d: %s: %s", c->id, j,
                     rpc_status_name(st.code), st.message);
        else if (j % 2 == 0 && !out)
            snprintf(c->err, sizeof c->err, "caller %d: added key %s answered no",
                     c->id, c->keys[j]);
    }
    return NULL;
}

/* flags: the router's (one worker thread, and the loops to test). */
static void test_inflight(const char *const *flags)
{
    struct cluster c;
    struct rpc_status st;
    cluster_start_flags(&c, "router-async-inflight", 1, 1, "none", flags);
    struct rpc_channel *r = c.router[0].ch;
    CHECK(t_create_sharded(r, "if", 100000, 0.0001, 0, 8, NULL, &st) == 0, "create: %s",
          st.message);

    static struct caller cl[IF_CALLERS];
    for (int i = 0; i < IF_CALLERS; i++) {
        char prefix[32];
        snprintf(prefix, sizeof prefix, "if-%d", i);
        cl[i] = (struct caller){.ch = r, .id = i, .keys = keys_make(prefix, 0, IF_KEYS)};
        char *even[IF_KEYS / 2];
        bool added[IF_KEYS / 2];
        for (int j = 0; j < IF_KEYS / 2; j++)
            even[j] = cl[i].keys[2 * j];
        CHECK(t_keys(r, "Add", "if", even, IF_KEYS / 2, added, &st) == 0, "Add: %s",
              st.message);
    }

    /* Single keys from 32 callers at once. */
    struct node_info before, after;
    t_node_info(c.node[0].ch, &before);
    pthread_t th[IF_CALLERS];
    for (int i = 0; i < IF_CALLERS; i++)
        pthread_create(&th[i], NULL, caller_main, &cl[i]);
    for (int i = 0; i < IF_CALLERS; i++) {
        pthread_join(th[i], NULL);
        CHECK(!cl[i].err[0], "%s", cl[i].err);
    }
    t_node_info(c.node[0].ch, &after);
    uint64_t msgs = after.messages - before.messages;
    printf("%d single-key calls on one worker thread reached the node in %llu "
           "messages\n", IF_CALLERS * IF_KEYS, (unsigned long long)msgs);
    CHECK(msgs < IF_CALLERS * IF_KEYS, "%llu messages for %d calls: the calls waited "
          "for each other", (unsigned long long)msgs, IF_CALLERS * IF_KEYS);

    /* One stream, 32 one-key messages in flight: keys of caller 0..31, the
     * even ones present. */
    char *sk[IF_CALLERS];
    bool sout[IF_CALLERS];
    for (int i = 0; i < IF_CALLERS; i++)
        sk[i] = cl[i].keys[i % IF_KEYS];
    t_node_info(c.node[0].ch, &before);
    CHECK(t_stream_keys(r, "MayContainStream", "if", sk, 1, IF_CALLERS, sout, &st) == 0,
          "MayContainStream: %s: %s", rpc_status_name(st.code), st.message);
    t_node_info(c.node[0].ch, &after);
    for (int i = 0; i < IF_CALLERS; i++) {
        bool alone;
        CHECK(t_keys(r, "MayContain", "if", &sk[i], 1, &alone, &st) == 0, "MayContain: %s",
              st.message);
        CHECK(sout[i] == alone && (i % 2 || sout[i]), "stream answer %d for %s: %d, "
              "alone %d", i, sk[i], sout[i], alone);
    }
    msgs = after.messages - before.messages;
    printf("a stream of %d messages reached the node in %llu messages\n", IF_CALLERS,
           (unsigned long long)msgs);
    CHECK(msgs < IF_CALLERS, "%llu node messages for %d stream messages: the stream "
          "was handled one message at a time", (unsigned long long)msgs, IF_CALLERS);
    for (int i = 0; i < IF_CALLERS; i++)
        keys_free(cl[i].keys, IF_KEYS);
    cluster_stop(&c);
}

/* ---- stream_error ---- */

/* Send msgs (keys[m] one key each, filter[m] named or "") on method, all
 * before reading; returns the status code, the answers read go to out and
 * their count to *answers. */
static int stream_run(struct rpc_channel *ch, const char *method, char **keys,
                      const char *const *filter, size_t msgs, bool *out,
                      size_t *answers, struct rpc_status *st)
{
    char path[128];
    snprintf(path, sizeof path, "/bloomgrid.v1.BloomGrid/%s", method);
    struct rpc_cstream *cs = rpc_cstream_open(ch, path, 10000);
    CHECK(cs, "open %s", method);
    for (size_t m = 0; m < msgs; m++) {
        Bloomgrid__V1__AddRequest rq = BLOOMGRID__V1__ADD_REQUEST__INIT;
        ProtobufCBinaryData kd = {.len = strlen(keys[m]), .data = (uint8_t *)keys[m]};
        rq.filter = (char *)filter[m];
        rq.n_keys = 1;
        rq.keys = &kd;
        if (rpc_cstream_write_msg(cs, &rq.base) != 0)
            break;      /* the server ended the call: see the status */
    }
    rpc_cstream_close_send(cs);
    grpc_slice sl;
    *answers = 0;
    while (rpc_cstream_read(cs, &sl) == 1) {
        Bloomgrid__V1__AddResponse *resp = bloomgrid__v1__add_response__unpack(
            NULL, GRPC_SLICE_LENGTH(sl), GRPC_SLICE_START_PTR(sl));
        CHECK(resp && resp->n_added == 1 && *answers < msgs, "stream answer %zu",
              *answers);
        out[(*answers)++] = resp->added[0];
        bloomgrid__v1__add_response__free_unpacked(resp, NULL);
        grpc_slice_unref(sl);
    }
    if (rpc_cstream_finish(cs, st) < 0)
        return st->code;
    return 0;
}

static void test_stream_error(void)
{
    struct cluster c;
    struct rpc_status st, nst;
    cluster_start_flags(&c, "router-async-stream-error", 1, 1, "none", one_thread);
    struct rpc_channel *r = c.router[0].ch, *n = c.node[0].ch;
    CHECK(t_create_sharded(r, "se", 100000, 0.0001, 0, 4, NULL, &st) == 0, "create: %s",
          st.message);
    CHECK(t_create_sharded(r, "gone", 1000, 0.01, 0, 2, NULL, &st) == 0, "create: %s",
          st.message);
    char *present[] = {"se-present"};
    bool out[8];
    CHECK(t_keys(r, "Add", "se", present, 1, out, &st) == 0, "Add: %s", st.message);
    /* The router knows "gone" (its secret is cached), then it is dropped. */
    CHECK(t_keys(r, "MayContain", "gone", present, 1, out, &st) == 0, "MayContain: %s",
          st.message);
    CHECK(t_drop(r, "gone", &st) == 0, "drop: %s", st.message);
    /* What a node says for a filter that does not exist. */
    CHECK(t_keys(n, "MayContain", "gone", present, 1, out, &nst) == GRPC_STATUS_NOT_FOUND,
          "node MayContain of a dropped filter: %s", nst.message);

    /* Third message names the dropped filter. */
    char *k1[] = {"se-present", "se-absent", "se-x", "se-y", "se-z"};
    const char *f1[] = {"se", "", "gone", "se", ""};
    size_t got;
    int code = stream_run(r, "MayContainStream", k1, f1, 5, out, &got, &st);
    printf("stream naming a dropped filter: %zu answers, %s: %s\n", got,
           rpc_status_name(code), st.message);
    CHECK(code == GRPC_STATUS_NOT_FOUND && strcmp(st.message, nst.message) == 0,
          "status %s: %s (a node says %s)", rpc_status_name(code), st.message, nst.message);
    CHECK(got == 2 && out[0] && !out[1], "%zu answers before the error (%d %d)", got,
          out[0], out[1]);

    /* Third message holds an empty key: AddStream adds the first two and
     * nothing after. */
    char *k2[] = {"se-a0", "se-a1", "", "se-a3", "se-a4"};
    const char *f2[] = {"se", "", "", "", ""};
    code = stream_run(r, "AddStream", k2, f2, 5, out, &got, &st);
    printf("stream with an empty key: %zu answers, %s: %s\n", got, rpc_status_name(code),
           st.message);
    char *empty[] = {""};
    t_keys(n, "Add", "se", empty, 1, out, &nst);
    CHECK(code == GRPC_STATUS_INVALID_ARGUMENT && strcmp(st.message, nst.message) == 0,
          "status %s: %s (a node says %s)", rpc_status_name(code), st.message, nst.message);
    CHECK(got == 2, "%zu answers before the error", got);
    char *check[] = {"se-a0", "se-a1", "se-a3", "se-a4"};
    CHECK(t_keys(r, "MayContain", "se", check, 4, out, &st) == 0, "MayContain: %s",
          st.message);
    CHECK(out[0] && out[1] && !out[2] && !out[3], "after the failed stream: %d %d %d %d "
          "(the keys after the bad message must not be added)", out[0], out[1], out[2],
          out[3]);
    cluster_stop(&c);
}

/* ---- stopped ---- */

#define SP_STUCK 8

struct stuck_call {
    struct rpc_channel *ch;
    char filter[32];
    atomic_int *ended;
    int code;
    char msg[RPC_CLIENT_MSGLEN];
};

static void *stuck_main(void *arg)
{
    struct stuck_call *s = arg;
    struct rpc_status st;
    char *k[] = {"sp-key"};
    bool out[1];
    s->code = t_keys(s->ch, "MayContain", s->filter, k, 1, out, &st);
    snprintf(s->msg, sizeof s->msg, "%s", st.message);
    atomic_fetch_add(s->ended, 1);
    return NULL;
}

/* A one-shard filter through r placed on node addr (new names until one
 * lands there); its name goes to name. */
static void filter_on(struct cluster *c, const char *addr, char *name, size_t len)
{
    struct rpc_status st;
    static int next;
    for (int i = 0; i < 200; i++) {
        Bloomgrid__V1__FilterInfo *fi = NULL;
        snprintf(name, len, "sp-%d", next++);
        CHECK(t_create_sharded(c->router[0].ch, name, 1000, 0.01, 0, 1, &fi, &st) == 0,
              "create: %s", st.message);
        bool here = fi->n_shard_info == 1 && strcmp(fi->shard_info[0]->node, addr) == 0;
        bloomgrid__v1__filter_info__free_unpacked(fi, NULL);
        if (here)
            return;
        CHECK(t_drop(c->router[0].ch, name, &st) == 0, "drop: %s", st.message);
    }
    CHECK(false, "no one-shard filter landed on %s", addr);
}

/* Stop node 1 and send SP_STUCK single-key reads of filter stuck through r
 * (each on its own thread, outcomes in sc), then 20 reads of filter live,
 * which must all be answered; then wait for the stuck calls and let the
 * node go on.  Returns how many stuck calls had ended before the 20 reads
 * were answered. */
static int reads_while_stuck(struct cluster *c, struct rpc_channel *r, const char *live,
                             const char *stuck, struct stuck_call *sc)
{
    struct rpc_status st;
    char *k[] = {"sp-key"};
    bool out[1];
    CHECK(harness_sigstop(c->node[1].pid) == 0, "SIGSTOP node 1");
    atomic_int ended = 0;
    pthread_t th[SP_STUCK];
    for (int i = 0; i < SP_STUCK; i++) {
        sc[i] = (struct stuck_call){.ch = r, .ended = &ended};
        snprintf(sc[i].filter, sizeof sc[i].filter, "%s", stuck);
        pthread_create(&th[i], NULL, stuck_main, &sc[i]);
    }
    harness_sleep_ms(300);      /* let them reach the router first */
    for (int served = 0; served < 20; served++)
        CHECK(t_keys(r, "MayContain", live, k, 1, out, &st) == 0 && out[0],
              "read of %s while calls to %s wait for the stopped node: %s: %s", live,
              stuck, rpc_status_name(st.code), st.message);
    int ended_meanwhile = atomic_load(&ended);
    for (int i = 0; i < SP_STUCK; i++)
        pthread_join(th[i], NULL);
    kill(c->node[1].pid, SIGCONT);
    return ended_meanwhile;
}

static void test_stopped(void)
{
    struct cluster c;
    struct rpc_status st;
    static const char *const rflags[] = {"--threads", "1", "--node-timeout-ms", "5000",
                                         NULL};
    cluster_start_flags(&c, "router-async-stopped", 2, 1, "none", rflags);
    struct rpc_channel *r = c.router[0].ch;
    char live[32], stuck[32];
    filter_on(&c, c.node[0].addr, live, sizeof live);
    filter_on(&c, c.node[1].addr, stuck, sizeof stuck);
    char *k[] = {"sp-key"};
    bool out[1];
    CHECK(t_keys(r, "Add", live, k, 1, out, &st) == 0, "Add: %s", st.message);
    CHECK(t_keys(r, "Add", stuck, k, 1, out, &st) == 0, "Add: %s", st.message);

    /* The other node's filter is served while those wait for the stopped
     * one (one thread serves key calls: none of them holds it). */
    struct stuck_call sc[SP_STUCK];
    int served = 20, ended_meanwhile = reads_while_stuck(&c, r, live, stuck, sc);
    printf("%d reads served while %d calls waited for the stopped node (%d of them "
           "ended meanwhile); those: %s: %s\n", served, SP_STUCK, ended_meanwhile,
           rpc_status_name(sc[0].code), sc[0].msg);
    CHECK(ended_meanwhile == 0, "%d calls to the stopped node ended before 20 reads of "
          "the live one were answered: the reads waited for them", ended_meanwhile);
    for (int i = 0; i < SP_STUCK; i++)
        CHECK(sc[i].code == GRPC_STATUS_UNAVAILABLE && strstr(sc[i].msg, "DEADLINE_EXCEEDED") &&
              (strstr(sc[i].msg, "no answer within") || strstr(sc[i].msg, "not sent within")),
              "call %d to the stopped node: %s: %s", i, rpc_status_name(sc[i].code),
              sc[i].msg);
    /* After SIGCONT the router serves that node again. */
    CHECK(t_keys(r, "MayContain", stuck, k, 1, out, &st) == 0 && out[0],
          "read after SIGCONT: %s: %s", rpc_status_name(st.code), st.message);
    cluster_stop(&c);
}

static void test_uncached(void)
{
    struct cluster c;
    struct rpc_status st;
    static const char *const rflags[] = {"--threads", "1", "--loops", "1",
                                         "--node-timeout-ms", "5000", NULL};
    cluster_start_flags(&c, "router-async-uncached", 2, 2, "none", rflags);
    struct rpc_channel *r = c.router[1].ch;
    char live[32], cold[32];
    filter_on(&c, c.node[0].addr, live, sizeof live);
    filter_on(&c, c.node[1].addr, cold, sizeof cold);
    char *k[] = {"sp-key"};
    bool out[1];
    /* The second router learns the live filter only. */
    CHECK(t_keys(r, "Add", live, k, 1, out, &st) == 0, "Add: %s", st.message);

    struct stuck_call sc[SP_STUCK];
    int served = 20, ended_meanwhile = reads_while_stuck(&c, r, live, cold, sc);
    printf("%d reads served while %d calls waited for the secret from the stopped "
           "node (%d of them ended meanwhile); those: %s: %s\n", served, SP_STUCK,
           ended_meanwhile, rpc_status_name(sc[0].code), sc[0].msg);
    CHECK(ended_meanwhile == 0, "%d calls that fetch a secret from the stopped node "
          "ended before 20 reads of a cached filter were answered: the reads waited "
          "for the fetch", ended_meanwhile);
    for (int i = 0; i < SP_STUCK; i++)
        CHECK(sc[i].code != 0, "call %d to the stopped node's filter succeeded", i);
    CHECK(t_keys(r, "MayContain", cold, k, 1, out, &st) == 0 && !out[0],
          "read after SIGCONT: %s: %s", rpc_status_name(st.code), st.message);
    cluster_stop(&c);
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: %s NODE_BIN ROUTER_BIN SCENARIO\n", argv[0]);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    harness_node_bin = argv[1];
    harness_router_bin = argv[2];
    grpc_init();
    static const char *const no_loops[] = {"--threads", "1", "--loops", "0", NULL};
    if (strcmp(argv[3], "inflight") == 0)
        test_inflight(one_thread);
    else if (strcmp(argv[3], "inflight_no_loops") == 0)
        test_inflight(no_loops);
    else if (strcmp(argv[3], "stream_error") == 0)
        test_stream_error();
    else if (strcmp(argv[3], "stopped") == 0)
        test_stopped();
    else if (strcmp(argv[3], "uncached") == 0)
        test_uncached();
    else {
        fprintf(stderr, "unknown scenario %s\n", argv[3]);
        return 2;
    }
    grpc_shutdown();
    printf("ok\n");
    return 0;
}
