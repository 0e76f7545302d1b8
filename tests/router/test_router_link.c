/* Router test "link": the router's batch streams to its nodes
 * (router/router_link.h), scenario by scenario:
 *
 *   coalesce    32 concurrent callers asking single keys (and a few
 *               three-key batches) through a router reach the node in fewer
 *               messages than calls (the node's NodeInfo counters), every
 *               hash exactly once, and each caller gets its own answers in
 *               its own order (distinct keys, half present); reads and
 *               writes never share a stream.
 *   restart     16 concurrent writers while the node is SIGKILLed and
 *               restarted: calls fail loudly (UNAVAILABLE or
 *               DEADLINE_EXCEEDED) while it is down, the router reconnects
 *               by itself, and no acknowledged key is lost.
 *   slow_fsync  a write held inside the node's WAL fsync (an LD_PRELOAD
 *               library, slow_fsync.c) does not hold up reads through the
 *               same router: they are answered while the write still waits.
 *   pipelined   while a write is held inside the fsync, a second write
 *               through the same router reaches the node and is applied
 *               (its key reads "maybe", the node counts two write messages)
 *               before the first is answered: the write stream keeps two
 *               messages in flight and the node applies the second while
 *               the first waits; both are answered once the fsync goes.
 *   stalled     a stopped node (SIGSTOP): calls fail once node_timeout_ms
 *               passed, sent or still queued, a call past node_queue_mb gets
 *               RESOURCE_EXHAUSTED, and after SIGCONT the router serves
 *               again on a new stream.
 *   joined      lone calls (each write sent with its answer's receive in
 *               one batch) alternating with bursts of concurrent writes
 *               (the write stream then sends on its own, two in flight):
 *               every call is one message and gets its own answers; a
 *               lone read and a lone write to a stopped node fail past
 *               node_timeout_ms with nothing acknowledged, and after
 *               SIGCONT both lanes serve again and every acknowledged key
 *               reads "maybe".
 *
 * usage: test_router_link NODE_BIN ROUTER_BIN SCENARIO [SLOW_FSYNC_SO]
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <grpc/grpc.h>

#include "cluster.h"

/* ---- coalesce ---- */

#define CO_CALLERS 32
#define CO_KEYS 64          /* per caller; even ones are added first */
#define CO_ROUNDS 4

struct caller {
    struct rpc_channel *ch;
    int id;
    char **keys;
    const bool *truth;      /* CO_KEYS answers asked alone, one by one */
    size_t calls, asked;
    char err[RPC_CLIENT_MSGLEN + 64];
};

static void *caller_main(void *arg)
{
    struct caller *c = arg;
    struct rpc_status st;
    bool out[3];
    for (int round = 0; round < CO_ROUNDS && !c->err[0]; round++) {
        for (size_t j = 0; j < CO_KEYS && !c->err[0]; j++) {
            /* Mostly single keys; every fourth call three in a row. */
            size_t n = j % 4 == 3 && j + 3 <= CO_KEYS ? 3 : 1;
            if (t_keys(c->ch, "MayContain", "co", &c->keys[j], n, out, &st) != 0) {
                snprintf(c->err, sizeof c->err, "caller %d key %zu: %s: %s", c->id, j,
                         rpc_status_name(st.code), st.message);
                break;
            }
            for (size_t k = 0; k < n; k++)
                if (out[k] != c->truth[j + k] || (!out[k] && (j + k) % 2 == 0))
                    snprintf(c->err, sizeof c->err, "caller %d key %s: answered %d, "
                             "alone %d", c->id, c->keys[j + k], out[k], c->truth[j + k]);
            c->calls++;
            c->asked += n;
        }
    }
    return NULL;
}

static void test_coalesce(void)
{
    struct cluster c;
    struct rpc_status st;
    static const char *const rflags[] = {"--threads", "64", NULL};
    cluster_start_flags(&c, "router-link-coalesce", 1, 1, "none", rflags);
    struct rpc_channel *r = c.router[0].ch;
    CHECK(t_create_sharded(r, "co", 100000, 0.001, 0, 8, NULL, &st) == 0, "create: %s",
          st.message);

    static struct caller cl[CO_CALLERS];
    static bool truth[CO_CALLERS][CO_KEYS];
    for (int i = 0; i < CO_CALLERS; i++) {
        char prefix[32];
        snprintf(prefix, sizeof prefix, "co-%d", i);
        cl[i] = (struct caller){.ch = r, .id = i, .keys = keys_make(prefix, 0, CO_KEYS),
                                .truth = truth[i]};
        char *even[CO_KEYS / 2];
        bool added[CO_KEYS / 2];
        for (int j = 0; j < CO_KEYS / 2; j++)
            even[j] = cl[i].keys[2 * j];
        CHECK(t_keys(r, "Add", "co", even, CO_KEYS / 2, added, &st) == 0, "Add: %s",
              st.message);
        /* What each key answers alone, before anything is concurrent. */
        for (int j = 0; j < CO_KEYS; j++)
            CHECK(t_keys(r, "MayContain", "co", &cl[i].keys[j], 1, &truth[i][j], &st) == 0,
                  "MayContain alone: %s", st.message);
    }

    struct node_info before, after;
    t_node_info(c.node[0].ch, &before);
    pthread_t th[CO_CALLERS];
    for (int i = 0; i < CO_CALLERS; i++)
        pthread_create(&th[i], NULL, caller_main, &cl[i]);
    size_t calls = 0, asked = 0;
    for (int i = 0; i < CO_CALLERS; i++) {
        pthread_join(th[i], NULL);
        CHECK(!cl[i].err[0], "%s", cl[i].err);
        calls += cl[i].calls;
        asked += cl[i].asked;
        keys_free(cl[i].keys, CO_KEYS);
    }
    t_node_info(c.node[0].ch, &after);
    uint64_t msgs = after.messages - before.messages;
    uint64_t hashes = after.hashes - before.hashes;
    printf("%zu concurrent calls (%zu keys) reached the node in %llu messages "
           "(%.1f calls per message), %llu entries\n", calls, asked,
           (unsigned long long)msgs, msgs ? (double)calls / (double)msgs : 0.0,
           (unsigned long long)(after.entries - before.entries));
    CHECK(hashes == asked, "the node received %llu hashes for %zu keys asked",
          (unsigned long long)hashes, asked);
    CHECK(msgs < calls, "%llu messages for %zu calls: nothing was coalesced",
          (unsigned long long)msgs, calls);
    CHECK(after.read_streams >= 1 && after.write_streams >= 1 && after.mixed_streams == 0,
          "streams: %llu with reads, %llu with writes, %llu with both",
          (unsigned long long)after.read_streams, (unsigned long long)after.write_streams,
          (unsigned long long)after.mixed_streams);
    cluster_stop(&c);
}

/* ---- restart ---- */

#define RS_WRITERS 16
#define RS_MAX_KEYS 200000      /* per writer */

struct writer {
    struct rpc_channel *ch;
    int id;
    atomic_bool *stop;
    bool *acked;                /* per key index */
    atomic_size_t acks, fails;
    size_t next;                /* keys [0, next) were sent */
    int bad_code;               /* a failure other than the node being down */
    char bad_msg[RPC_CLIENT_MSGLEN];
};

static void *writer_main(void *arg)
{
    struct writer *w = arg;
    struct rpc_status st;
    bool out[4];
    while (!atomic_load(w->stop) && w->next + 4 <= RS_MAX_KEYS) {
        size_t n = 1 + w->next % 4;
        char prefix[32];
        snprintf(prefix, sizeof prefix, "rs-%d", w->id);
        char **k = keys_make(prefix, w->next, n);
        int code = t_keys(w->ch, "Add", "rs", k, n, out, &st);
        keys_free(k, n);
        if (code == 0) {
            for (size_t i = 0; i < n; i++)
                w->acked[w->next + i] = true;
            atomic_fetch_add(&w->acks, 1);
        } else {
            atomic_fetch_add(&w->fails, 1);
            if (code != GRPC_STATUS_UNAVAILABLE && code != GRPC_STATUS_DEADLINE_EXCEEDED &&
                !w->bad_code) {
                w->bad_code = code;
                snprintf(w->bad_msg, sizeof w->bad_msg, "%s", st.message);
            }
            harness_sleep_ms(2);
        }
        w->next += n;
    }
    return NULL;
}

static size_t total(struct writer *w, bool fails)
{
    size_t n = 0;
    for (int i = 0; i < RS_WRITERS; i++)
        n += fails ? atomic_load(&w[i].fails) : atomic_load(&w[i].acks);
    return n;
}

/* Wait up to ms for total(w, fails) to reach want. */
static bool wait_total(struct writer *w, bool fails, size_t want, int ms)
{
    for (int i = 0; i < ms / 10; i++) {
        if (total(w, fails) >= want)
            return true;
        harness_sleep_ms(10);
    }
    return total(w, fails) >= want;
}

static void test_restart(void)
{
    struct cluster c;
    struct rpc_status st;
    static const char *const rflags[] = {"--threads", "32", NULL};
    cluster_start_flags(&c, "router-link-restart", 1, 1, "fsync", rflags);
    struct rpc_channel *r = c.router[0].ch;
    CHECK(t_create_sharded(r, "rs", 4000000, 0.01, 0, 16, NULL, &st) == 0, "create: %s",
          st.message);

    static struct writer w[RS_WRITERS];
    atomic_bool stop = false;
    pthread_t th[RS_WRITERS];
    for (int i = 0; i < RS_WRITERS; i++) {
        w[i] = (struct writer){.ch = r, .id = i, .stop = &stop,
                               .acked = calloc(RS_MAX_KEYS, sizeof(bool))};
        pthread_create(&th[i], NULL, writer_main, &w[i]);
    }
    CHECK(wait_total(w, false, 50 * RS_WRITERS, 60000), "writers stalled: %zu calls "
          "acknowledged, %zu failed", total(w, false), total(w, true));
    size_t fails0 = total(w, true);
    node_stop(&c.node[0], SIGKILL);
    CHECK(wait_total(w, true, fails0 + RS_WRITERS, 30000),
          "no call failed with the node killed");
    size_t acks_down = total(w, false);
    cluster_node_start(&c, 0, c.node[0].port, NULL);
    /* The router finds the node again by itself: calls are acknowledged. */
    CHECK(wait_total(w, false, acks_down + 20 * RS_WRITERS, 60000),
          "after the restart only %zu more calls acknowledged",
          total(w, false) - acks_down);
    atomic_store(&stop, true);
    for (int i = 0; i < RS_WRITERS; i++) {
        pthread_join(th[i], NULL);
        CHECK(!w[i].bad_code, "writer %d: a failure other than the node being down: "
              "%s: %s", i, rpc_status_name(w[i].bad_code), w[i].bad_msg);
    }
    printf("%zu calls acknowledged, %zu failed (%zu acknowledged before the kill)\n",
           total(w, false), total(w, true), acks_down);

    /* No acknowledged key is lost. */
    size_t checked = 0;
    bool *out = malloc(RS_MAX_KEYS * sizeof *out);
    for (int i = 0; i < RS_WRITERS; i++) {
        char prefix[32];
        snprintf(prefix, sizeof prefix, "rs-%d", i);
        char **k = keys_make(prefix, 0, w[i].next);
        CHECK(t_keys(r, "MayContain", "rs", k, w[i].next, out, &st) == 0,
              "MayContain: %s", st.message);
        for (size_t j = 0; j < w[i].next; j++) {
            CHECK(!w[i].acked[j] || out[j], "acknowledged key %s lost", k[j]);
            checked += w[i].acked[j];
        }
        keys_free(k, w[i].next);
        free(w[i].acked);
    }
    free(out);
    printf("%zu acknowledged keys present\n", checked);
    cluster_stop(&c);
}

/* ---- slow_fsync ---- */

#define GATE_LEN 720

/* One single-key Add on its own thread. */
struct one_add {
    struct rpc_channel *ch;
    const char *filter, *key;
    atomic_bool done;
    int code;
    char msg[RPC_CLIENT_MSGLEN];
};

static void *one_add_main(void *arg)
{
    struct one_add *a = arg;
    struct rpc_status st;
    char *k[] = {(char *)a->key};
    bool out[1];
    a->code = t_keys(a->ch, "Add", a->filter, k, 1, out, &st);
    snprintf(a->msg, sizeof a->msg, "%s", st.message);
    atomic_store(&a->done, true);
    return NULL;
}

static bool file_exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* A cluster of one node whose log fsyncs wait while the file gate exists
 * (slow_fsync.c, preloaded; held exists while one waits) and one router;
 * returns the router's channel. */
static struct rpc_channel *gated_cluster(struct cluster *c, const char *name,
                                         const char *preload, char *gate, char *held)
{
    static const char *const rflags[] = {"--node-timeout-ms", "60000", NULL};
    cluster_init(c, name, "fsync");
    snprintf(gate, GATE_LEN, "%s/fsync-gate", c->dir);
    harness_fsync_gate(gate, "/wal-", held, GATE_LEN);
    harness_preload_begin(preload);
    cluster_node_start(c, 0, 0, NULL);
    harness_preload_end();
    cluster_write_topo(c, 1, false, NULL);
    cluster_router_start(c, 0, rflags);
    return c->router[0].ch;
}

/* Hold the WAL's fsync (the gate file), start a's write on th and wait until
 * it is held there. */
static void start_held_write(const char *gate, const char *held, struct one_add *a,
                             pthread_t *th)
{
    FILE *g = fopen(gate, "w");
    CHECK(g, "create %s", gate);
    fclose(g);
    pthread_create(th, NULL, one_add_main, a);
    for (int i = 0; i < 3000 && !file_exists(held); i++)
        harness_sleep_ms(10);
    CHECK(file_exists(held), "the write of %s never reached the WAL's fsync", a->key);
}

static void test_slow_fsync(const char *preload)
{
    struct cluster c;
    struct rpc_status st;
    char gate[GATE_LEN], held[GATE_LEN];
    struct rpc_channel *r = gated_cluster(&c, "router-link-slow-fsync", preload, gate, held);
    CHECK(t_create_sharded(r, "sf", 100000, 0.01, 0, 4, NULL, &st) == 0, "create: %s",
          st.message);
    char **k = keys_make("sf", 0, 100);
    bool out[100];
    CHECK(t_keys(r, "Add", "sf", k, 100, out, &st) == 0, "Add: %s", st.message);

    /* Hold the WAL's fsync, start a write and wait until it is held. */
    struct one_add a = {.ch = r, .filter = "sf", .key = "held-write"};
    pthread_t th;
    start_held_write(gate, held, &a, &th);

    /* Reads through the same router are answered meanwhile. */
    for (int round = 0; round < 20; round++) {
        CHECK(t_keys(r, "MayContain", "sf", k, 100, out, &st) == 0,
              "read while a write waits for its fsync: %s: %s", rpc_status_name(st.code),
              st.message);
        for (int i = 0; i < 100; i++)
            CHECK(out[i], "key %s missing", k[i]);
        CHECK(t_keys(r, "MayContain", "sf", &k[round], 1, out, &st) == 0 && out[0],
              "single-key read while a write waits: %s", st.message);
    }
    CHECK(!atomic_load(&a.done), "the held write finished (%s: %s) before its fsync was "
          "let go", rpc_status_name(a.code), a.msg);
    unlink(gate);
    pthread_join(th, NULL);
    CHECK(a.code == 0, "the held write failed: %s: %s", rpc_status_name(a.code), a.msg);
    struct node_info ni;
    t_node_info(c.node[0].ch, &ni);
    CHECK(ni.read_streams >= 1 && ni.write_streams >= 1 && ni.mixed_streams == 0,
          "streams: %llu with reads, %llu with writes, %llu with both",
          (unsigned long long)ni.read_streams, (unsigned long long)ni.write_streams,
          (unsigned long long)ni.mixed_streams);
    keys_free(k, 100);
    cluster_stop(&c);
}

/* ---- pipelined ---- */

static void test_pipelined(const char *preload)
{
    struct cluster c;
    struct rpc_status st;
    char gate[GATE_LEN], held[GATE_LEN];
    struct rpc_channel *r = gated_cluster(&c, "router-link-pipelined", preload, gate, held);
    CHECK(t_create_sharded(r, "pl", 100000, 0.001, 0, 4, NULL, &st) == 0, "create: %s",
          st.message);
    char *second[] = {"pipelined-second"};
    bool out[1];
    CHECK(t_keys(r, "MayContain", "pl", second, 1, out, &st) == 0 && !out[0],
          "the second key before any write: %s", st.message);
    struct node_info before, after;
    t_node_info(c.node[0].ch, &before);

    struct one_add a = {.ch = r, .filter = "pl", .key = "pipelined-first"};
    struct one_add b = {.ch = r, .filter = "pl", .key = second[0]};
    pthread_t ta, tb;
    start_held_write(gate, held, &a, &ta);
    pthread_create(&tb, NULL, one_add_main, &b);
    /* The second write is applied on the node while the first waits. */
    bool seen = false;
    for (int i = 0; i < 1000 && !seen; i++) {
        CHECK(t_keys(r, "MayContain", "pl", second, 1, out, &st) == 0,
              "read while the first write waits: %s", st.message);
        seen = out[0];
        if (!seen)
            harness_sleep_ms(10);
    }
    t_node_info(c.node[0].ch, &after);
    printf("while the first write's fsync was held: second key %s, %llu batch messages "
           "(%llu before), first done %d, second done %d\n", seen ? "maybe" : "no",
           (unsigned long long)after.messages, (unsigned long long)before.messages,
           atomic_load(&a.done), atomic_load(&b.done));
    CHECK(seen, "the second write never reached the node while the first waited for "
          "its fsync: the write stream holds one message at a time");
    CHECK(!atomic_load(&a.done) && !atomic_load(&b.done),
          "a write was answered before its fsync was let go (%s / %s)", a.msg, b.msg);
    unlink(gate);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    CHECK(a.code == 0 && b.code == 0, "the held writes: %s: %s / %s: %s",
          rpc_status_name(a.code), a.msg, rpc_status_name(b.code), b.msg);
    char *both[] = {"pipelined-first", "pipelined-second"};
    bool o2[2];
    CHECK(t_keys(r, "MayContain", "pl", both, 2, o2, &st) == 0 && o2[0] && o2[1],
          "both keys after the fsync: %s", st.message);
    cluster_stop(&c);
}

/* ---- stalled ---- */

#define ST_KEYS 40000           /* 640 KB of hashes: two exceed 1 MiB */

struct big_add {
    struct rpc_channel *ch;
    int id;
    int code;
    char msg[RPC_CLIENT_MSGLEN];
};

static void *big_add_main(void *arg)
{
    struct big_add *b = arg;
    struct rpc_status st;
    char prefix[32];
    snprintf(prefix, sizeof prefix, "st-%d", b->id);
    char **k = keys_make(prefix, 0, ST_KEYS);
    bool *out = malloc(ST_KEYS * sizeof *out);
    b->code = t_keys(b->ch, "Add", "st", k, ST_KEYS, out, &st);
    snprintf(b->msg, sizeof b->msg, "%s", st.message);
    free(out);
    keys_free(k, ST_KEYS);
    return NULL;
}

static void test_stalled(void)
{
    struct cluster c;
    struct rpc_status st;
    /* Threads enough that all three writes wait in the router at once. */
    static const char *const rflags[] = {"--node-timeout-ms", "1500", "--node-queue-mb",
                                         "1", "--threads", "16", NULL};
    cluster_start_flags(&c, "router-link-stalled", 1, 1, "none", rflags);
    struct rpc_channel *r = c.router[0].ch;
    CHECK(t_create_sharded(r, "st", 1000000, 0.01, 0, 4, NULL, &st) == 0, "create: %s",
          st.message);
    char *k1[] = {"before"};
    bool out[1];
    CHECK(t_keys(r, "Add", "st", k1, 1, out, &st) == 0, "Add: %s", st.message);

    harness_sigstop(c.node[0].pid);
    /* The first big write goes out and hangs (within the node's stream
     * window, stream_window_kb: 1 MiB by default; a second one fits in it
     * when the window is larger), the next waits in the queue, and the last
     * would pass 1 MiB queued.  They start a moment apart, so that each
     * finds the one before it placed. */
    struct big_add b[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        b[i] = (struct big_add){.ch = r, .id = i};
        pthread_create(&th[i], NULL, big_add_main, &b[i]);
        harness_sleep_ms(150);
    }
    int exhausted = 0, late = 0;
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        printf("write %d to the stopped node: %s: %s\n", i, rpc_status_name(b[i].code),
               b[i].msg);
        exhausted += b[i].code == GRPC_STATUS_RESOURCE_EXHAUSTED &&
                     strstr(b[i].msg, "node_queue_mb");
        /* A write whose node did not answer: UNAVAILABLE naming the
         * deadline, nothing acknowledged. */
        late += b[i].code == GRPC_STATUS_UNAVAILABLE &&
                (strstr(b[i].msg, "no answer within") ||
                 strstr(b[i].msg, "not sent within")) &&
                strstr(b[i].msg, "acknowledged 0 of");
    }
    CHECK(exhausted >= 1 && late >= 2 && exhausted + late == 4, "%d refused for the "
          "queue bound and %d past their deadline, of 4 writes to a stopped node",
          exhausted, late);
    CHECK(b[3].code == GRPC_STATUS_RESOURCE_EXHAUSTED, "the fourth write, not another, "
          "should find the queue full: %s: %s", rpc_status_name(b[3].code), b[3].msg);
    kill(c.node[0].pid, SIGCONT);

    /* The stuck stream was given up: the router serves again. */
    CHECK(t_keys(r, "MayContain", "st", k1, 1, out, &st) == 0 && out[0],
          "read after SIGCONT: %s: %s", rpc_status_name(st.code), st.message);
    char *k2[] = {"after"};
    CHECK(t_keys(r, "Add", "st", k2, 1, out, &st) == 0, "write after SIGCONT: %s: %s",
          rpc_status_name(st.code), st.message);
    cluster_stop(&c);
}

/* ---- joined ---- */

#define JO_LONE 200             /* lone add-then-read pairs per phase */
#define JO_WRITERS 16
#define JO_BURST 100            /* single-key Adds per writer */

struct jo_writer {
    struct rpc_channel *ch;
    int id;
    char err[RPC_CLIENT_MSGLEN + 64];
};

static void *jo_writer_main(void *arg)
{
    struct jo_writer *w = arg;
    struct rpc_status st;
    char prefix[32];
    snprintf(prefix, sizeof prefix, "jo-burst-%d", w->id);
    char **k = keys_make(prefix, 0, JO_BURST);
    bool out[1];
    for (size_t i = 0; i < JO_BURST && !w->err[0]; i++)
        if (t_keys(w->ch, "Add", "jo", &k[i], 1, out, &st) != 0)
            snprintf(w->err, sizeof w->err, "writer %d key %zu: %s: %s", w->id, i,
                     rpc_status_name(st.code), st.message);
    keys_free(k, JO_BURST);
    return NULL;
}

/* JO_LONE lone Adds, each read back alone at once: each call is one
 * message (nothing else is in flight), and every key reads "maybe". */
static void jo_lone(struct cluster *c, const char *prefix)
{
    struct rpc_channel *r = c->router[0].ch;
    struct rpc_status st;
    char **k = keys_make(prefix, 0, JO_LONE);
    struct node_info before, after;
    bool out[1];
    t_node_info(c->node[0].ch, &before);
    for (size_t i = 0; i < JO_LONE; i++) {
        CHECK(t_keys(r, "Add", "jo", &k[i], 1, out, &st) == 0, "lone Add %s: %s: %s",
              k[i], rpc_status_name(st.code), st.message);
        CHECK(t_keys(r, "MayContain", "jo", &k[i], 1, out, &st) == 0 && out[0],
              "lone read of %s, added just before: %s %s", k[i],
              st.code ? rpc_status_name(st.code) : "answered", st.code ? st.message : "no");
    }
    t_node_info(c->node[0].ch, &after);
    CHECK(after.messages - before.messages == 2 * JO_LONE && after.hashes - before.hashes ==
          2 * JO_LONE, "%d lone calls reached the node as %llu messages, %llu hashes",
          2 * JO_LONE, (unsigned long long)(after.messages - before.messages),
          (unsigned long long)(after.hashes - before.hashes));
    keys_free(k, JO_LONE);
}

/* A lone call to the stopped node: it fails past node_timeout_ms. */
static void jo_stopped_call(struct rpc_channel *r, const char *method, const char *key)
{
    struct rpc_status st;
    char *k[] = {(char *)key};
    bool out[1];
    int rc = t_keys(r, method, "jo", k, 1, out, &st);
    printf("%s of one key to the stopped node: %s: %s\n", method, rpc_status_name(st.code),
           st.message);
    CHECK(rc != 0 && (st.code == GRPC_STATUS_UNAVAILABLE ||
                      st.code == GRPC_STATUS_DEADLINE_EXCEEDED) &&
          strstr(st.message, "no answer within"),
          "%s to a stopped node: %s: %s", method, rpc_status_name(st.code), st.message);
    if (strcmp(method, "Add") == 0)
        CHECK(strstr(st.message, "acknowledged 0 of 1"), "the write's error says nothing "
              "was acknowledged: %s", st.message);
}

/* After SIGCONT the node may still take messages sent while it was
 * stopped (the router gave them up past their deadline, but their bytes
 * were in the node's socket): wait until its count of messages holds
 * still for 500 ms (at most 10 s), so that they are not counted as the
 * next phase's. */
static void jo_node_settled(struct cluster *c)
{
    struct node_info a, b;

    t_node_info(c->node[0].ch, &a);
    for (int i = 0; i < 20; i++) {
        usleep(500 * 1000);
        t_node_info(c->node[0].ch, &b);
        if (b.messages == a.messages)
            return;
        a = b;
    }
}

static void test_joined(void)
{
    struct cluster c;
    struct rpc_status st;
    static const char *const rflags[] = {"--node-timeout-ms", "1000", "--threads", "32",
                                         NULL};
    cluster_start_flags(&c, "router-link-joined", 1, 1, "none", rflags);
    struct rpc_channel *r = c.router[0].ch;
    CHECK(t_create_sharded(r, "jo", 100000, 0.001, 0, 8, NULL, &st) == 0, "create: %s",
          st.message);

    jo_lone(&c, "jo-lone-1");
    /* A burst: the write stream has calls waiting at its answers. */
    static struct jo_writer w[JO_WRITERS];
    pthread_t th[JO_WRITERS];
    for (int i = 0; i < JO_WRITERS; i++) {
        w[i] = (struct jo_writer){.ch = r, .id = i};
        pthread_create(&th[i], NULL, jo_writer_main, &w[i]);
    }
    for (int i = 0; i < JO_WRITERS; i++) {
        pthread_join(th[i], NULL);
        CHECK(!w[i].err[0], "%s", w[i].err);
    }
    jo_lone(&c, "jo-lone-2");
    for (int i = 0; i < JO_WRITERS; i++) {
        char prefix[32];
        snprintf(prefix, sizeof prefix, "jo-burst-%d", i);
        char **k = keys_make(prefix, 0, JO_BURST);
        CHECK(t_never_no(r, "jo", k, JO_BURST, "after the burst"), "a burst key reads no");
        keys_free(k, JO_BURST);
    }

    /* Both lanes idle (the write lane joined): a lone read and a lone
     * write to a node that never answers. */
    harness_sigstop(c.node[0].pid);
    jo_stopped_call(r, "MayContain", "jo-lone-1-0");
    jo_stopped_call(r, "Add", "jo-stopped");
    kill(c.node[0].pid, SIGCONT);
    jo_node_settled(&c);

    jo_lone(&c, "jo-lone-3");
    char **k = keys_make("jo-lone-1", 0, JO_LONE);
    CHECK(t_never_no(r, "jo", k, JO_LONE, "after SIGCONT"), "an acknowledged key reads no");
    keys_free(k, JO_LONE);
    cluster_stop(&c);
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: %s NODE_BIN ROUTER_BIN SCENARIO [SLOW_FSYNC_SO]\n",
                argv[0]);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    harness_node_bin = argv[1];
    harness_router_bin = argv[2];
    grpc_init();
    if (strcmp(argv[3], "coalesce") == 0)
        test_coalesce();
    else if (strcmp(argv[3], "restart") == 0)
        test_restart();
    else if (strcmp(argv[3], "slow_fsync") == 0 && argc == 5)
        test_slow_fsync(argv[4]);
    else if (strcmp(argv[3], "stalled") == 0)
        test_stalled();
    else if (strcmp(argv[3], "pipelined") == 0 && argc == 5)
        test_pipelined(argv[4]);
    else if (strcmp(argv[3], "joined") == 0)
        test_joined();
    else {
        fprintf(stderr, "unknown scenario %s\n", argv[3]);
        return 2;
    }
    grpc_shutdown();
    printf("ok\n");
    return 0;
}
