/* Integration tests of bloomgrid-router: real nodes and routers on loopback.
 *
 * usage: test_router NODE_BIN ROUTER_BIN TEST
 *   cluster   3 nodes, 2 routers: 1M keys added through one router are all
 *             present through the other; FPR at capacity; answers in request
 *             order; aggregated GetFilter / ListFilters
 *   create    create-all-or-nothing with one node down
 *   kill      a node killed mid-batch: UNAVAILABLE naming it; after its
 *             restart every acknowledged key is present
 *   reload    SIGHUP: benign reloads drop no call, a bad file is refused
 *             (the old topology stays), a new group takes new shards
 *   replica   with the primary down, reads go to a replica that reports at
 *             least the version the router saw; writes fail naming the primary
 *   transfer  AddStream / MayContainStream in order; Export of a 16-shard filter as one bundle, Import back (damaged
 *             bundles and another filter's bundle refused)
 *   frames    key batches over the nodes' frame ports where offered, gRPC
 *             to a node and from a router with --frames off (same answers);
 *             a node restarted on a new frame port: the router learns it
 *             again and no acknowledged key is lost; a fixed --frame-port is
 *             served, reported and used
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <grpc/grpc.h>

#include "bf.h"
#include "harness.h"

#define MAXN 4

static const char *router_bin;

struct cluster {
    char dir[512];
    char topo[600];
    struct node_proc node[MAXN];
    char node_dir[MAXN][600];
    int nnodes;
    struct node_proc router[2];
    int nrouters;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Write a topology with one group per node in [0, n) (optionally reordered). */
static void write_topo(struct cluster *c, int n, bool reversed, const char *extra)
{
    FILE *f = fopen(c->topo, "w");
    CHECK(f, "open %s", c->topo);
    fprintf(f, "; test topology\n");
    for (int k = 0; k < n; k++) {
        int i = reversed ? n - 1 - k : k;
        fprintf(f, "[group g%d]\nprimary = %s\n\n", i, c->node[i].addr);
    }
    if (extra)
        fputs(extra, f);
    fclose(f);
}

#define MAX_MORE 8

/* Start node i (port 0: a free port) with further flags more (NULL-terminated,
 * may be NULL). */
static void start_node_args(struct cluster *c, int i, const char *durability, int port,
                            const char *const *more)
{
    char listen[64];
    const char *extra[6 + MAX_MORE + 1] = {"--durability", durability, "--threads", "4"};
    int a = 4;
    snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
    if (port) {
        extra[a++] = "--listen";
        extra[a++] = listen;
    }
    for (int k = 0; more && more[k]; k++) {
        CHECK(k < MAX_MORE, "too many node flags");
        extra[a++] = more[k];
    }
    extra[a] = NULL;
    node_start(&c->node[i], c->node_dir[i], extra);
    CHECK(node_wait_health(&c->node[i], true, 20000), "node %d not serving", i);
}

static void start_node(struct cluster *c, int i, const char *durability, int port)
{
    start_node_args(c, i, durability, port, NULL);
}

static void start_router_args(struct cluster *c, int i, const char *const *more)
{
    struct node_proc *rp = &c->router[i];
    char log[sizeof rp->log];
    const char *argv[10 + MAX_MORE + 1] = {router_bin, "--listen", "127.0.0.1:0",
                                           "--topology", c->topo, "--node-timeout-ms",
                                           "3000", "--threads", "4"};
    int a = 9;
    for (int k = 0; more && more[k]; k++) {
        CHECK(k < MAX_MORE, "too many router flags");
        argv[a++] = more[k];
    }
    argv[a] = NULL;
    snprintf(log, sizeof log, "%s/router%d.log", c->dir, i);
    proc_spawn(rp, log, argv);
    CHECK(node_wait_health(rp, true, 10000), "router %d not serving", i);
}

static void start_router(struct cluster *c, int i)
{
    start_router_args(c, i, NULL);
}

static void cluster_start(struct cluster *c, const char *tag, int nnodes,
                          int nrouters, const char *durability)
{
    memset(c, 0, sizeof *c);
    harness_tmpdir(c->dir, sizeof c->dir, tag);
    snprintf(c->topo, sizeof c->topo, "%s/topology.ini", c->dir);
    c->nnodes = nnodes;
    for (int i = 0; i < nnodes; i++) {
        snprintf(c->node_dir[i], sizeof c->node_dir[i], "%s/node%d", c->dir, i);
        start_node(c, i, durability, 0);
    }
    write_topo(c, nnodes, false, NULL);
    c->nrouters = nrouters;
    for (int i = 0; i < nrouters; i++)
        start_router(c, i);
}

static void cluster_stop(struct cluster *c)
{
    for (int i = 0; i < c->nrouters; i++)
        CHECK(node_stop(&c->router[i], SIGTERM) == 0, "router %d exit status", i);
    for (int i = 0; i < c->nnodes; i++)
        if (c->node[i].pid > 0)
            node_stop(&c->node[i], SIGTERM);
}

/* ---- key batches over the raw public API ---- */

static char **make_keys(const char *prefix, size_t from, size_t n)
{
    char **k = malloc(n * sizeof *k);
    for (size_t i = 0; i < n; i++) {
        k[i] = malloc(32);
        snprintf(k[i], 32, "%s-%010zu", prefix, from + i);
    }
    return k;
}

static void free_keys(char **k, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(k[i]);
    free(k);
}

static int create_sharded(struct rpc_channel *ch, const char *name, uint64_t cap,
                          double p, uint32_t shards, Bloomgrid__V1__FilterInfo **out,
                          struct rpc_status *st)
{
    Bloomgrid__V1__CreateFilterRequest rq = BLOOMGRID__V1__CREATE_FILTER_REQUEST__INIT;
    Bloomgrid__V1__FilterInfo *fi = NULL;
    rq.name = (char *)name;
    rq.capacity = cap;
    rq.error_rate = p;
    rq.shards = shards;
    if (rpc_call(ch, "/bloomgrid.v1.BloomGrid/CreateFilter", &rq.base,
                 &bloomgrid__v1__filter_info__descriptor, (ProtobufCMessage **)&fi,
                 TIMEOUT_MS, st) < 0)
        return st->code;
    if (out)
        *out = fi;
    else
        bloomgrid__v1__filter_info__free_unpacked(fi, NULL);
    return 0;
}

/* Shards of filter held by a node (ListShards). */
static int shards_on(struct node_proc *np, const char *filter)
{
    Bloomgrid__V1__ListShardsRequest rq = BLOOMGRID__V1__LIST_SHARDS_REQUEST__INIT;
    Bloomgrid__V1__ListShardsResponse *resp = NULL;
    struct rpc_status st;
    CHECK(rpc_call(np->ch, "/bloomgrid.v1.Internal/ListShards", &rq.base,
                   &bloomgrid__v1__list_shards_response__descriptor,
                   (ProtobufCMessage **)&resp, TIMEOUT_MS, &st) == 0,
          "ListShards on %s: %s", np->addr, st.message);
    int n = 0;
    for (size_t i = 0; i < resp->n_shards; i++)
        n += strcmp(resp->shards[i]->filter, filter) == 0;
    bloomgrid__v1__list_shards_response__free_unpacked(resp, NULL);
    return n;
}

/* ---- cluster: 1M keys, FPR, order, info ---- */

static void test_cluster(void)
{
    struct cluster c;
    struct rpc_status st;
    const size_t N = 1000000, B = 10000;
    const double P = 0.01;
    bool *out = malloc(B * sizeof *out);
    Bloomgrid__V1__FilterInfo *fi = NULL;

    cluster_start(&c, "router-cluster", 3, 2, "none");
    struct rpc_channel *a = c.router[0].ch, *b = c.router[1].ch;
    CHECK(create_sharded(a, "big", N, P, 0, &fi, &st) == 0, "create: %s", st.message);
    CHECK(fi->shards == 64, "default shards %u", fi->shards);
    CHECK(fi->n_shard_info == 64, "shard infos %zu", fi->n_shard_info);
    bloomgrid__v1__filter_info__free_unpacked(fi, NULL);
    for (int i = 0; i < 3; i++) {
        int n = shards_on(&c.node[i], "big");
        CHECK(n > 5 && n < 40, "node %d holds %d shards", i, n);
    }
    CHECK(create_sharded(b, "big", N, P, 0, NULL, &st) == GRPC_STATUS_ALREADY_EXISTS,
          "second create: %d %s", st.code, st.message);

    double t0 = now_s();
    for (size_t from = 0; from < N; from += B) {
        char **k = make_keys("present", from, B);
        CHECK(t_keys(a, "Add", "big", k, B, out, &st) == 0, "Add: %s", st.message);
        free_keys(k, B);
    }
    double t1 = now_s();
    for (size_t from = 0; from < N; from += B) {
        char **k = make_keys("present", from, B);
        CHECK(t_keys(b, "MayContain", "big", k, B, out, &st) == 0, "MayContain: %s",
              st.message);
        for (size_t i = 0; i < B; i++)
            CHECK(out[i], "key %s missing through the other router", k[i]);
        free_keys(k, B);
    }
    double t2 = now_s();
    size_t fp = 0;
    for (size_t from = 0; from < N; from += B) {
        char **k = make_keys("absent", from, B);
        CHECK(t_keys(b, "MayContain", "big", k, B, out, &st) == 0, "MayContain: %s",
              st.message);
        for (size_t i = 0; i < B; i++)
            fp += out[i];
        free_keys(k, B);
    }
    double fpr = (double)fp / N;
    printf("1M adds %.2fs, 1M present %.2fs, 1M absent %.2fs; FPR %.5f (p %.3f)\n",
           t1 - t0, t2 - t1, now_s() - t2, fpr, P);
    CHECK(fpr <= 1.1 * P, "FPR %.5f above 1.1 p", fpr);

    /* Request order: present and absent keys interleaved over every shard;
     * the same keys asked one at a time must give the same answers. */
    const size_t M = 3000;
    char **mix = malloc(M * sizeof *mix);
    for (size_t i = 0; i < M; i++) {
        mix[i] = malloc(32);
        snprintf(mix[i], 32, i % 3 == 0 ? "present-%010zu" : "absent-%010zu",
                 (i * 7919) % N);
    }
    bool *ans = malloc(M * sizeof *ans);
    CHECK(t_keys(a, "MayContain", "big", mix, M, ans, &st) == 0, "mix: %s", st.message);
    size_t neg = 0;
    for (size_t i = 0; i < M; i++) {
        if (i % 3 == 0)
            CHECK(ans[i], "present key %zu answered absent", i);
        neg += !ans[i];
        if (i % 10 == 0) {
            bool one;
            CHECK(t_keys(b, "MayContain", "big", &mix[i], 1, &one, &st) == 0, "one: %s",
                  st.message);
            CHECK(one == ans[i], "key %zu: batch says %d, alone %d", i, ans[i], one);
        }
    }
    CHECK(neg > M / 2, "too few absent answers: %zu", neg);
    free_keys(mix, M);
    free(ans);

    /* Aggregated info. */
    CHECK(t_get(b, "big", &fi, &st) == 0, "GetFilter: %s", st.message);
    CHECK(fi->shards == 64 && fi->n_shard_info == 64, "shards");
    CHECK(fi->state == BLOOMGRID__V1__FILTER_STATE__FILTER_STATE_READY, "state %d: %s",
          fi->state, fi->reason);
    CHECK(fi->estimated_count > 0.95 * N && fi->estimated_count < 1.05 * N,
          "n-hat %.0f", fi->estimated_count);
    CHECK(fi->capacity >= N && fi->capacity < N + 64, "capacity %llu",
          (unsigned long long)fi->capacity);
    CHECK(fi->estimated_error_rate > 0.5 * P && fi->estimated_error_rate < 1.5 * P,
          "estimated FPR %g", fi->estimated_error_rate);
    uint64_t bits = 0;
    for (size_t i = 0; i < fi->n_shard_info; i++) {
        CHECK(fi->shard_info[i]->index == i, "shard order");
        CHECK(fi->shard_info[i]->node[0], "shard %zu names no node", i);
        bits += fi->shard_info[i]->bits;
    }
    CHECK(bits == fi->bits, "bits %llu vs sum %llu", (unsigned long long)fi->bits,
          (unsigned long long)bits);
    bloomgrid__v1__filter_info__free_unpacked(fi, NULL);

    Bloomgrid__V1__ListFiltersRequest lr = BLOOMGRID__V1__LIST_FILTERS_REQUEST__INIT;
    Bloomgrid__V1__ListFiltersResponse *ls = NULL;
    CHECK(rpc_call(a, "/bloomgrid.v1.BloomGrid/ListFilters", &lr.base,
                   &bloomgrid__v1__list_filters_response__descriptor,
                   (ProtobufCMessage **)&ls, TIMEOUT_MS, &st) == 0, "List: %s",
          st.message);
    CHECK(ls->n_filters == 1 && strcmp(ls->filters[0]->name, "big") == 0 &&
          ls->filters[0]->shards == 64 && ls->filters[0]->n_shard_info == 64,
          "ListFilters");
    bloomgrid__v1__list_filters_response__free_unpacked(ls, NULL);

    /* A shard gone from its node while the node's other shards answer (one
     * call carries them all): the batch fails naming that shard and its
     * node, and says which keys were acknowledged. */
    CHECK(create_sharded(a, "part", 10000, P, 8, NULL, &st) == 0, "create part: %s",
          st.message);
    int holder = -1;
    for (int i = 0; i < 3; i++) {
        Bloomgrid__V1__ShardRef ref = BLOOMGRID__V1__SHARD_REF__INIT;
        ProtobufCMessage *dr = NULL;
        ref.filter = "part";
        ref.shard_index = 3;
        if (rpc_call(c.node[i].ch, "/bloomgrid.v1.Internal/DropShard", &ref.base,
                     &bloomgrid__v1__drop_shard_response__descriptor, &dr,
                     TIMEOUT_MS, &st) == 0) {
            holder = i;
            protobuf_c_message_free_unpacked(dr, NULL);
        }
    }
    CHECK(holder >= 0, "no node held shard 3 of part");
    char **pk = make_keys("part", 0, 200);
    char want[128];
    snprintf(want, sizeof want, "shard 3 on node %s: NOT_FOUND", c.node[holder].addr);
    CHECK(t_keys(a, "Add", "part", pk, 200, out, &st) == GRPC_STATUS_UNAVAILABLE,
          "Add with shard 3 gone: %d %s", st.code, st.message);
    CHECK(strstr(st.message, want) && strstr(st.message, "of 200 keys; not acknowledged"),
          "Add with shard 3 gone: %s", st.message);
    CHECK(t_keys(b, "MayContain", "part", pk, 200, out, &st) == GRPC_STATUS_UNAVAILABLE &&
          strstr(st.message, want), "MayContain with shard 3 gone: %d %s", st.code,
          st.message);
    free_keys(pk, 200);

    /* The node's multi-shard call directly: each entry answers on its own. */
    Bloomgrid__V1__ListShardsRequest lsr = BLOOMGRID__V1__LIST_SHARDS_REQUEST__INIT;
    Bloomgrid__V1__ListShardsResponse *lsp = NULL;
    CHECK(rpc_call(c.node[holder].ch, "/bloomgrid.v1.Internal/ListShards", &lsr.base,
                   &bloomgrid__v1__list_shards_response__descriptor,
                   (ProtobufCMessage **)&lsp, TIMEOUT_MS, &st) == 0, "ListShards: %s",
          st.message);
    int other = -1;
    for (size_t i = 0; i < lsp->n_shards; i++)
        if (strcmp(lsp->shards[i]->filter, "part") == 0)
            other = (int)lsp->shards[i]->shard_index;
    bloomgrid__v1__list_shards_response__free_unpacked(lsp, NULL);
    CHECK(other >= 0 && other != 3, "node %d holds no other shard of part", holder);
    uint8_t hbytes[32] = {1, 2, 3};
    Bloomgrid__V1__ShardHashes e0 = BLOOMGRID__V1__SHARD_HASHES__INIT;
    Bloomgrid__V1__ShardHashes e1 = BLOOMGRID__V1__SHARD_HASHES__INIT;
    Bloomgrid__V1__ShardHashes *ents[] = {&e0, &e1};
    Bloomgrid__V1__MultiHashesRequest mq = BLOOMGRID__V1__MULTI_HASHES_REQUEST__INIT;
    Bloomgrid__V1__MultiHashesResponse *mr = NULL;
    e0.shard_index = (uint32_t)other;
    e0.hashes.data = hbytes;
    e0.hashes.len = 32;
    e1.shard_index = 3;
    e1.hashes.data = hbytes;
    e1.hashes.len = 16;
    mq.filter = "part";
    mq.n_shards = 2;
    mq.shards = ents;
    CHECK(rpc_call(c.node[holder].ch, "/bloomgrid.v1.Internal/MayContainMultiHashes",
                   &mq.base, &bloomgrid__v1__multi_hashes_response__descriptor,
                   (ProtobufCMessage **)&mr, TIMEOUT_MS, &st) == 0, "multi: %s",
          st.message);
    CHECK(mr->n_shards == 2, "multi: %zu results", mr->n_shards);
    CHECK(mr->shards[0]->shard_index == (uint32_t)other && mr->shards[0]->code == 0 &&
          mr->shards[0]->n_results == 2, "multi entry 0: shard %u code %d, %zu results",
          mr->shards[0]->shard_index, mr->shards[0]->code, mr->shards[0]->n_results);
    CHECK(mr->shards[1]->shard_index == 3 &&
          mr->shards[1]->code == GRPC_STATUS_NOT_FOUND &&
          strstr(mr->shards[1]->message, "shard 3") && mr->shards[1]->n_results == 0,
          "multi entry 1: code %d: %s", mr->shards[1]->code, mr->shards[1]->message);
    bloomgrid__v1__multi_hashes_response__free_unpacked(mr, NULL);
    mq.secret_id = 12345;   /* not this filter's secret: refused per shard */
    mq.n_shards = 1;
    CHECK(rpc_call(c.node[holder].ch, "/bloomgrid.v1.Internal/AddMultiHashes",
                   &mq.base, &bloomgrid__v1__multi_hashes_response__descriptor,
                   (ProtobufCMessage **)&mr, TIMEOUT_MS, &st) == 0, "multi: %s",
          st.message);
    CHECK(mr->n_shards == 1 && mr->shards[0]->code == GRPC_STATUS_FAILED_PRECONDITION &&
          strstr(mr->shards[0]->message, "another secret"), "multi secret: %d %s",
          mr->n_shards ? mr->shards[0]->code : -1,
          mr->n_shards ? mr->shards[0]->message : "");
    bloomgrid__v1__multi_hashes_response__free_unpacked(mr, NULL);
    e0.hashes.len = 15;     /* not a multiple of 16: the call is refused */
    CHECK(rpc_call(c.node[holder].ch, "/bloomgrid.v1.Internal/MayContainMultiHashes",
                   &mq.base, &bloomgrid__v1__multi_hashes_response__descriptor,
                   (ProtobufCMessage **)&mr, TIMEOUT_MS, &st) ==
          -1 && st.code == GRPC_STATUS_INVALID_ARGUMENT, "multi 15 bytes: %d %s",
          st.code, st.message);

    /* Errors. */
    char *k1[] = {"x"};
    CHECK(t_keys(a, "MayContain", "nosuch", k1, 1, out, &st) == GRPC_STATUS_NOT_FOUND,
          "unknown filter: %d", st.code);
    char *empty[] = {""};
    CHECK(t_keys(a, "Add", "big", empty, 1, out, &st) == GRPC_STATUS_INVALID_ARGUMENT,
          "empty key: %d", st.code);
    CHECK(t_keys(a, "Remove", "big", k1, 1, out, &st) ==
          GRPC_STATUS_FAILED_PRECONDITION, "Remove on blocked: %d %s", st.code,
          st.message);

    /* Drop through one router; the other notices. */
    CHECK(t_drop(a, "big", &st) == 0, "drop: %s", st.message);
    for (int i = 0; i < 3; i++)
        CHECK(shards_on(&c.node[i], "big") == 0, "node %d kept shards", i);
    CHECK(t_keys(b, "MayContain", "big", k1, 1, out, &st) == GRPC_STATUS_NOT_FOUND,
          "after drop: %d %s", st.code, st.message);
    CHECK(t_drop(a, "big", &st) == GRPC_STATUS_NOT_FOUND, "drop twice");
    free(out);
    cluster_stop(&c);
}

/* ---- create all or nothing ---- */

static void test_create(void)
{
    struct cluster c;
    struct rpc_status st;
    cluster_start(&c, "router-create", 3, 1, "none");
    struct rpc_channel *a = c.router[0].ch;
    int port = c.node[1].port;
    node_stop(&c.node[1], SIGTERM);

    int code = create_sharded(a, "half", 100000, 0.01, 32, NULL, &st);
    CHECK(code == GRPC_STATUS_UNAVAILABLE, "create with a node down: %d %s", code,
          st.message);
    CHECK(strstr(st.message, c.node[1].addr), "message names the node: %s",
          st.message);
    CHECK(strstr(st.message, "shard "), "message names the shard: %s", st.message);
    printf("create with a node down: %s\n", st.message);
    CHECK(shards_on(&c.node[0], "half") == 0, "node 0 kept shards");
    CHECK(shards_on(&c.node[2], "half") == 0, "node 2 kept shards");
    Bloomgrid__V1__FilterInfo *fi;
    CHECK(t_get(a, "half", &fi, &st) == GRPC_STATUS_UNAVAILABLE ||
          st.code == GRPC_STATUS_NOT_FOUND, "get: %d", st.code);

    start_node(&c, 1, "none", port);
    /* The router's channel reconnects within its backoff (at most 1 s). */
    int tries = 0;
    while ((code = create_sharded(a, "half", 100000, 0.01, 32, NULL, &st)) ==
               GRPC_STATUS_UNAVAILABLE && tries++ < 100)
        sleep_ms(50);
    CHECK(code == 0, "create after restart: %s", st.message);
    int total = 0;
    for (int i = 0; i < 3; i++)
        total += shards_on(&c.node[i], "half");
    CHECK(total == 32, "%d shards", total);

    /* A shard that already exists is never dropped by a failed create. */
    CHECK(create_sharded(a, "half", 100000, 0.01, 32, NULL, &st) ==
          GRPC_STATUS_ALREADY_EXISTS, "duplicate: %d %s", st.code, st.message);
    total = 0;
    for (int i = 0; i < 3; i++)
        total += shards_on(&c.node[i], "half");
    CHECK(total == 32, "%d shards after a duplicate create", total);
    CHECK(create_sharded(a, "bad.shard-1", 10, 0.01, 2, NULL, &st) ==
          GRPC_STATUS_INVALID_ARGUMENT, "reserved name");
    CHECK(create_sharded(a, "zero", 0, 0.01, 2, NULL, &st) ==
          GRPC_STATUS_INVALID_ARGUMENT, "capacity 0");
    CHECK(create_sharded(a, "p1", 10, 1.0, 2, NULL, &st) ==
          GRPC_STATUS_INVALID_ARGUMENT, "p = 1");
    CHECK(create_sharded(a, "many", 10, 0.01, 5000, NULL, &st) ==
          GRPC_STATUS_INVALID_ARGUMENT, "5000 shards");
    cluster_stop(&c);
}

/* ---- node killed mid-batch ---- */

struct adder {
    struct rpc_channel *ch;
    atomic_bool stop;
    atomic_size_t batches_ok;   /* batches [0, batches_ok) acknowledged */
    size_t failed_batch;   /* first batch that failed */
    char failed_msg[RPC_CLIENT_MSGLEN];
    atomic_int failed_code;
};

#define KB 5000

static void *adder_main(void *arg)
{
    struct adder *ad = arg;
    bool *out = malloc(KB * sizeof *out);
    struct rpc_status st;
    for (size_t b = 0; !atomic_load(&ad->stop); b++) {
        char **k = make_keys("acked", b * KB, KB);
        int code = t_keys(ad->ch, "Add", "kill", k, KB, out, &st);
        free_keys(k, KB);
        if (code != 0) {
            ad->failed_batch = b;
            ad->failed_code = code;
            snprintf(ad->failed_msg, sizeof ad->failed_msg, "%s", st.message);
            break;
        }
        ad->batches_ok = b + 1;
    }
    free(out);
    return NULL;
}

/* Parse "not acknowledged: 1,4-9,..." into a bitmap; false when truncated. */
static bool parse_unacked(const char *msg, bool *unacked, size_t n)
{
    const char *p = strstr(msg, "not acknowledged: ");
    if (!p)
        return false;
    p += strlen("not acknowledged: ");
    while (*p) {
        if (*p == '.')
            return false;
        char *e;
        size_t a = strtoul(p, &e, 10), b = a;
        if (e == p)
            return false;
        if (*e == '-')
            b = strtoul(e + 1, &e, 10);
        for (size_t i = a; i <= b && i < n; i++)
            unacked[i] = true;
        p = e;
        if (*p == ',')
            p++;
        else
            break;
    }
    return true;
}

static void test_kill(void)
{
    struct cluster c;
    struct rpc_status st;
    cluster_start(&c, "router-kill", 3, 1, "fsync");
    struct rpc_channel *a = c.router[0].ch;
    CHECK(create_sharded(a, "kill", 1000000, 0.01, 48, NULL, &st) == 0, "create: %s",
          st.message);
    struct adder ad = {.ch = a};
    pthread_t th;
    pthread_create(&th, NULL, adder_main, &ad);
    for (int i = 0; i < 3000 && ad.batches_ok < 10 && !ad.failed_code; i++)
        sleep_ms(10);
    CHECK(ad.batches_ok >= 10, "adder stalled: %s", ad.failed_msg);
    int port = c.node[2].port;
    char addr[64];
    snprintf(addr, sizeof addr, "%s", c.node[2].addr);
    node_stop(&c.node[2], SIGKILL);
    pthread_join(th, NULL);
    printf("after %zu acknowledged batches: %s: %s\n", ad.batches_ok,
           rpc_status_name(ad.failed_code), ad.failed_msg);
    CHECK(ad.failed_code == GRPC_STATUS_UNAVAILABLE, "code %d", ad.failed_code);
    CHECK(strstr(ad.failed_msg, addr), "message names the node %s", addr);
    CHECK(strstr(ad.failed_msg, "shard "), "message names the shard");
    bool unacked[KB] = {0};
    bool listed = parse_unacked(ad.failed_msg, unacked, KB);

    /* Reads of the dead node's shards fail naming it too. */
    char **k = make_keys("acked", 0, 1000);
    bool *out = malloc(KB * sizeof *out);
    CHECK(t_keys(a, "MayContain", "kill", k, 1000, out, &st) == GRPC_STATUS_UNAVAILABLE,
          "read with a node down: %d", st.code);
    CHECK(strstr(st.message, addr), "read message names the node: %s", st.message);
    free_keys(k, 1000);

    start_node(&c, 2, "fsync", port);
    /* The channel reconnects: retry briefly while it does. */
    for (size_t b = 0; b < ad.batches_ok; b++) {
        k = make_keys("acked", b * KB, KB);
        int code, tries = 0;
        while ((code = t_keys(a, "MayContain", "kill", k, KB, out, &st)) ==
                   GRPC_STATUS_UNAVAILABLE && tries++ < 100)
            sleep_ms(50);
        CHECK(code == 0, "MayContain after restart: %s", st.message);
        for (size_t i = 0; i < KB; i++)
            CHECK(out[i], "acknowledged key %s lost", k[i]);
        free_keys(k, KB);
    }
    size_t extra = 0;
    if (listed) {
        k = make_keys("acked", ad.failed_batch * KB, KB);
        CHECK(t_keys(a, "MayContain", "kill", k, KB, out, &st) == 0, "%s", st.message);
        for (size_t i = 0; i < KB; i++) {
            if (!unacked[i]) {
                CHECK(out[i], "key %s reported acknowledged but missing", k[i]);
                extra++;
            }
        }
        free_keys(k, KB);
    }
    printf("%zu batches and %zu keys of the failed batch verified present\n",
           ad.batches_ok, extra);
    free(out);
    cluster_stop(&c);
}

/* ---- topology reload ---- */

struct reader {
    struct rpc_channel *ch;
    atomic_bool stop;
    size_t calls, failures;
    char msg[RPC_CLIENT_MSGLEN];
};

static void *reader_main(void *arg)
{
    struct reader *rd = arg;
    char **k = make_keys("r", 0, 500);
    bool out[500];
    struct rpc_status st;
    while (!atomic_load(&rd->stop)) {
        if (t_keys(rd->ch, "MayContain", "f1", k, 500, out, &st) != 0) {
            rd->failures++;
            snprintf(rd->msg, sizeof rd->msg, "%s", st.message);
        } else {
            for (int i = 0; i < 500; i++)
                if (!out[i])
                    rd->failures++;
        }
        rd->calls++;
    }
    free_keys(k, 500);
    return NULL;
}

static bool log_has(const char *path, const char *needle)
{
    FILE *f = fopen(path, "r");
    char line[2048];
    bool found = false;
    while (f && !found && fgets(line, sizeof line, f))
        found = strstr(line, needle) != NULL;
    if (f)
        fclose(f);
    return found;
}

static void test_reload(void)
{
    struct cluster c;
    struct rpc_status st;
    bool out[500];
    cluster_start(&c, "router-reload", 3, 1, "none");
    /* A fourth node, not yet in the topology. */
    snprintf(c.node_dir[3], sizeof c.node_dir[3], "%s/node3", c.dir);
    start_node(&c, 3, "none", 0);
    c.nnodes = 4;
    struct rpc_channel *a = c.router[0].ch;
    CHECK(create_sharded(a, "f1", 10000, 0.01, 16, NULL, &st) == 0, "%s", st.message);
    char **k = make_keys("r", 0, 500);
    CHECK(t_keys(a, "Add", "f1", k, 500, out, &st) == 0, "%s", st.message);
    free_keys(k, 500);

    struct reader rd = {.ch = a};
    pthread_t th;
    pthread_create(&th, NULL, reader_main, &rd);
    /* Benign reloads (same groups, another order) while calls run. */
    for (int i = 0; i < 10; i++) {
        write_topo(&c, 3, i % 2, NULL);
        kill(c.router[0].pid, SIGHUP);
        sleep_ms(50);
    }
    /* A bad file: refused, the old topology stays. */
    write_topo(&c, 3, false, "[group g9]\nprimary = 127.0.0.1:1\nbogus line\n");
    kill(c.router[0].pid, SIGHUP);
    sleep_ms(300);
    atomic_store(&rd.stop, true);
    pthread_join(th, NULL);
    printf("%zu calls during reloads, %zu failures %s\n", rd.calls, rd.failures, rd.msg);
    CHECK(rd.calls > 5 && rd.failures == 0, "calls dropped during reload: %s", rd.msg);
    char want[700];
    snprintf(want, sizeof want, "%s:13: syntax error", c.topo);
    CHECK(log_has(c.router[0].log, want), "router log lacks \"%s\"", want);
    CHECK(log_has(c.router[0].log, "the old one stays"), "log says the old stays");
    k = make_keys("r", 0, 500);
    CHECK(t_keys(a, "MayContain", "f1", k, 500, out, &st) == 0, "%s", st.message);
    free_keys(k, 500);
    CHECK(create_sharded(a, "f2", 10000, 0.01, 32, NULL, &st) == 0, "%s", st.message);
    CHECK(shards_on(&c.node[3], "f2") == 0, "node 3 used before it is in the topology");

    /* A fourth group: new filters use it. */
    write_topo(&c, 4, false, NULL);
    kill(c.router[0].pid, SIGHUP);
    for (int i = 0; i < 100 && !log_has(c.router[0].log, "reloaded: 4 groups"); i++)
        sleep_ms(20);
    CHECK(log_has(c.router[0].log, "reloaded: 4 groups"), "reload not logged");
    CHECK(create_sharded(a, "f3", 10000, 0.01, 32, NULL, &st) == 0, "%s", st.message);
    int on3 = shards_on(&c.node[3], "f3");
    CHECK(on3 > 0, "the new group holds no shard of a new filter");
    k = make_keys("f3", 0, 500);
    CHECK(t_keys(a, "Add", "f3", k, 500, out, &st) == 0, "%s", st.message);
    CHECK(t_keys(a, "MayContain", "f3", k, 500, out, &st) == 0, "%s", st.message);
    for (int i = 0; i < 500; i++)
        CHECK(out[i], "f3 key %d missing", i);
    free_keys(k, 500);
    printf("after adding a group: %d of 32 shards of a new filter on it\n", on3);
    cluster_stop(&c);
}

/* ---- Export / Import of a sharded filter ---- */

static size_t export_bundle(struct rpc_channel *ch, const char *name, uint8_t **out,
                            struct rpc_status *st)
{
    Bloomgrid__V1__ExportRequest rq = BLOOMGRID__V1__EXPORT_REQUEST__INIT;
    rq.filter = (char *)name;
    rq.chunk_size = 100000;
    struct rpc_cstream *cs = rpc_cstream_open(ch, "/bloomgrid.v1.BloomGrid/Export",
                                              TIMEOUT_MS);
    CHECK(cs, "open Export");
    CHECK(rpc_cstream_write_msg(cs, &rq.base) == 0 && rpc_cstream_close_send(cs) == 0,
          "send ExportRequest");
    size_t len = 0;
    uint8_t *buf = NULL;
    grpc_slice sl;
    while (rpc_cstream_read(cs, &sl) == 1) {
        Bloomgrid__V1__FileChunk *fc = bloomgrid__v1__file_chunk__unpack(
            NULL, GRPC_SLICE_LENGTH(sl), GRPC_SLICE_START_PTR(sl));
        CHECK(fc && fc->offset == len, "chunk at %zu", len);
        buf = realloc(buf, len + fc->data.len);
        memcpy(buf + len, fc->data.data, fc->data.len);
        len += fc->data.len;
        CHECK(fc->total_size >= len, "total_size");
        bloomgrid__v1__file_chunk__free_unpacked(fc, NULL);
        grpc_slice_unref(sl);
    }
    if (rpc_cstream_finish(cs, st) < 0) {
        free(buf);
        return 0;
    }
    *out = buf;
    return len;
}

static int import_bundle(struct rpc_channel *ch, const char *name, const uint8_t *buf,
                         size_t len, struct rpc_status *st)
{
    struct rpc_cstream *cs = rpc_cstream_open(ch, "/bloomgrid.v1.BloomGrid/Import",
                                              TIMEOUT_MS);
    CHECK(cs, "open Import");
    for (size_t off = 0; off < len; off += 65536) {
        Bloomgrid__V1__ImportRequest rq = BLOOMGRID__V1__IMPORT_REQUEST__INIT;
        rq.filter = off == 0 ? (char *)name : "";
        rq.data.data = (uint8_t *)buf + off;
        rq.data.len = len - off < 65536 ? len - off : 65536;
        if (rpc_cstream_write_msg(cs, &rq.base) < 0)
            break;
    }
    rpc_cstream_close_send(cs);
    grpc_slice sl;
    while (rpc_cstream_read(cs, &sl) == 1) {
        Bloomgrid__V1__ImportResponse *ir = bloomgrid__v1__import_response__unpack(
            NULL, GRPC_SLICE_LENGTH(sl), GRPC_SLICE_START_PTR(sl));
        CHECK(ir && ir->bytes_received == len && ir->info && ir->info->shards == 16,
              "ImportResponse");
        bloomgrid__v1__import_response__free_unpacked(ir, NULL);
        grpc_slice_unref(sl);
    }
    return rpc_cstream_finish(cs, st) < 0 ? (int)st->code : 0;
}

/* A bidirectional key stream: nb batches of n keys each (the first names the
 * filter, later ones leave it empty); answers in out[nb * n]. */
static int stream_keys(struct rpc_channel *ch, const char *method, const char *filter,
                       char **keys, size_t n, size_t nb, bool *out,
                       struct rpc_status *st)
{
    char path[128];
    snprintf(path, sizeof path, "/bloomgrid.v1.BloomGrid/%s", method);
    struct rpc_cstream *cs = rpc_cstream_open(ch, path, TIMEOUT_MS);
    CHECK(cs, "open %s", method);
    ProtobufCBinaryData *kd = calloc(n, sizeof *kd);
    for (size_t b = 0; b < nb; b++) {
        Bloomgrid__V1__AddRequest rq = BLOOMGRID__V1__ADD_REQUEST__INIT;
        rq.filter = b == 0 ? (char *)filter : "";
        rq.n_keys = n;
        rq.keys = kd;
        for (size_t i = 0; i < n; i++) {
            kd[i].data = (uint8_t *)keys[b * n + i];
            kd[i].len = strlen(keys[b * n + i]);
        }
        CHECK(rpc_cstream_write_msg(cs, &rq.base) == 0, "stream write %zu", b);
    }
    free(kd);
    rpc_cstream_close_send(cs);
    grpc_slice sl;
    size_t b = 0;
    while (rpc_cstream_read(cs, &sl) == 1) {
        Bloomgrid__V1__AddResponse *resp = bloomgrid__v1__add_response__unpack(
            NULL, GRPC_SLICE_LENGTH(sl), GRPC_SLICE_START_PTR(sl));
        CHECK(resp && resp->n_added == n && b < nb, "stream answer %zu", b);
        for (size_t i = 0; i < n; i++)
            out[b * n + i] = resp->added[i];
        b++;
        bloomgrid__v1__add_response__free_unpacked(resp, NULL);
        grpc_slice_unref(sl);
    }
    if (rpc_cstream_finish(cs, st) < 0)
        return st->code;
    CHECK(b == nb, "%zu answers for %zu batches", b, nb);
    return 0;
}

static void test_transfer(void)
{
    struct cluster c;
    struct rpc_status st;
    const size_t N = 2000;
    bool out[2000];
    cluster_start(&c, "router-transfer", 3, 2, "none");
    struct rpc_channel *a = c.router[0].ch, *b = c.router[1].ch;
    Bloomgrid__V1__CreateFilterRequest rq = BLOOMGRID__V1__CREATE_FILTER_REQUEST__INIT;
    Bloomgrid__V1__FilterInfo *fi = NULL;
    rq.name = "cnt";
    rq.capacity = 20000;
    rq.error_rate = 0.01;
    rq.kind = BLOOMGRID__V1__FILTER_KIND__FILTER_KIND_COUNTING;
    rq.shards = 16;
    CHECK(rpc_call(a, "/bloomgrid.v1.BloomGrid/CreateFilter", &rq.base,
                   &bloomgrid__v1__filter_info__descriptor, (ProtobufCMessage **)&fi,
                   TIMEOUT_MS, &st) == 0, "create counting: %s", st.message);
    bloomgrid__v1__filter_info__free_unpacked(fi, NULL);
    char **k = make_keys("t", 0, N);
    /* Streams: 4 batches of 500 in, answers in order. */
    CHECK(stream_keys(a, "AddStream", "cnt", k, N / 4, 4, out, &st) == 0,
          "AddStream: %s", st.message);
    size_t added = 0;
    for (size_t i = 0; i < N; i++)
        added += out[i];
    CHECK(added > N * 9 / 10, "only %zu of %zu stream adds were new", added, N);
    char **mixed = malloc(N * sizeof *mixed);
    char **absent = make_keys("never", 0, N);
    for (size_t i = 0; i < N; i++)
        mixed[i] = i % 2 ? absent[i] : k[i];
    CHECK(stream_keys(b, "MayContainStream", "cnt", mixed, N / 4, 4, out, &st) == 0,
          "MayContainStream: %s", st.message);
    size_t neg = 0;
    for (size_t i = 0; i < N; i++) {
        if (i % 2 == 0)
            CHECK(out[i], "stream answer %zu: present key absent", i);
        else
            neg += !out[i];
    }
    CHECK(neg > N / 2 * 9 / 10, "stream: %zu of %zu absent keys said absent", neg, N / 2);
    free(mixed);
    free_keys(absent, N);

    uint8_t *bundle = NULL;
    size_t len = export_bundle(b, "cnt", &bundle, &st);
    CHECK(len > 0, "Export: %s", st.message);
    printf("bundle of 16 shards: %zu bytes\n", len);
    CHECK(t_keys(b, "Remove", "cnt", k, N, out, &st) == 0, "Remove: %s", st.message);
    CHECK(t_keys(a, "MayContain", "cnt", k, N, out, &st) == 0, "%s", st.message);
    size_t present = 0;
    for (size_t i = 0; i < N; i++)
        present += out[i];
    CHECK(present < N / 10, "%zu keys still present after Remove", present);

    /* Damaged bundles are refused before anything changes. */
    bundle[len / 2] ^= 1;
    CHECK(import_bundle(a, "cnt", bundle, len, &st) == GRPC_STATUS_INVALID_ARGUMENT,
          "damaged bundle: %d %s", st.code, st.message);
    bundle[len / 2] ^= 1;
    CHECK(import_bundle(a, "cnt", bundle, len - 9, &st) == GRPC_STATUS_INVALID_ARGUMENT,
          "truncated bundle: %d %s", st.code, st.message);
    CHECK(import_bundle(a, "cnt", bundle, len, &st) == 0, "Import: %s", st.message);
    CHECK(t_keys(b, "MayContain", "cnt", k, N, out, &st) == 0, "%s", st.message);
    for (size_t i = 0; i < N; i++)
        CHECK(out[i], "key %s missing after Import", k[i]);

    /* Another filter of the same name (a new secret) refuses the bundle. */
    CHECK(t_drop(a, "cnt", &st) == 0, "drop: %s", st.message);
    CHECK(rpc_call(a, "/bloomgrid.v1.BloomGrid/CreateFilter", &rq.base,
                   &bloomgrid__v1__filter_info__descriptor, (ProtobufCMessage **)&fi,
                   TIMEOUT_MS, &st) == 0, "re-create: %s", st.message);
    bloomgrid__v1__filter_info__free_unpacked(fi, NULL);
    /* Router b still caches the old secret: the nodes refuse its hashes and
     * it fetches the new secret; nothing is written with the old one. */
    CHECK(t_keys(b, "Add", "cnt", k, N, out, &st) == 0, "Add via b: %s", st.message);
    CHECK(t_keys(a, "MayContain", "cnt", k, N, out, &st) == 0, "%s", st.message);
    for (size_t i = 0; i < N; i++)
        CHECK(out[i], "key %s added through a router with a stale secret is missing",
              k[i]);
    CHECK(import_bundle(b, "cnt", bundle, len, &st) == GRPC_STATUS_FAILED_PRECONDITION,
          "other secret: %d %s", st.code, st.message);
    CHECK(strstr(st.message, "secret"), "message names the field: %s", st.message);
    printf("refused: %s\n", st.message);
    free(bundle);
    free_keys(k, N);
    cluster_stop(&c);
}

/* ---- reads fall back to a caught-up replica ---- */

static void test_replica(void)
{
    struct cluster c;
    struct rpc_status st;
    const size_t N = 1000;
    const uint32_t S = 4;
    bool out[1000];
    cluster_start(&c, "router-replica", 2, 1, "none");
    /* One group: node 0 primary, node 1 its replica. */
    FILE *f = fopen(c.topo, "w");
    fprintf(f, "[group g0]\nprimary = %s\nreplica = %s\n", c.node[0].addr,
            c.node[1].addr);
    fclose(f);
    kill(c.router[0].pid, SIGHUP);
    for (int i = 0; i < 100 && !log_has(c.router[0].log, "reloaded: 1 groups"); i++)
        sleep_ms(20);
    CHECK(log_has(c.router[0].log, "reloaded: 1 groups"), "reload");
    struct rpc_channel *a = c.router[0].ch;
    CHECK(create_sharded(a, "rep", 10000, 0.01, S, NULL, &st) == 0, "%s", st.message);
    CHECK(shards_on(&c.node[0], "rep") == (int)S, "all shards on the primary");

    /* The same shards on the replica, with the primary's secret. */
    Bloomgrid__V1__GetShardRequest gq = BLOOMGRID__V1__GET_SHARD_REQUEST__INIT;
    Bloomgrid__V1__InternalShardInfo *isi = NULL;
    gq.filter = "rep";
    gq.include_secret = true;
    CHECK(rpc_call(c.node[0].ch, "/bloomgrid.v1.Internal/GetShard", &gq.base,
                   &bloomgrid__v1__internal_shard_info__descriptor,
                   (ProtobufCMessage **)&isi, TIMEOUT_MS, &st) == 0, "%s", st.message);
    CHECK(isi->secret.len == BF_SECRET_LEN, "secret");
    uint8_t secret[BF_SECRET_LEN];
    memcpy(secret, isi->secret.data, BF_SECRET_LEN);
    uint64_t cap = isi->info->capacity;
    bloomgrid__v1__internal_shard_info__free_unpacked(isi, NULL);
    for (uint32_t s = 0; s < S; s++) {
        Bloomgrid__V1__CreateShardRequest cq = BLOOMGRID__V1__CREATE_SHARD_REQUEST__INIT;
        ProtobufCMessage *resp = NULL;
        cq.filter = "rep";
        cq.shard_index = s;
        cq.shard_count = S;
        cq.capacity = cap;
        cq.error_rate = 0.01;
        cq.secret.data = secret;
        cq.secret.len = BF_SECRET_LEN;
        CHECK(rpc_call(c.node[1].ch, "/bloomgrid.v1.Internal/CreateShard", &cq.base,
                       &bloomgrid__v1__internal_shard_info__descriptor, &resp,
                       TIMEOUT_MS, &st) == 0, "replica shard %u: %s", s, st.message);
        protobuf_c_message_free_unpacked(resp, NULL);
    }
    char **k = make_keys("rep", 0, N);
    CHECK(t_keys(a, "Add", "rep", k, N, out, &st) == 0, "%s", st.message);

    /* Bring the replica up to (and past) the primary's versions: every
     * shard's hashes twice. */
    char err[BF_ERRLEN];
    struct bf_params bp = {.capacity = 1, .error_rate = 0.5, .secret = secret};
    struct bf *hasher = bf_create(&bp, err);
    CHECK(hasher, "%s", err);
    uint8_t *hb = malloc(16 * N);
    for (uint32_t s = 0; s < S; s++) {
        size_t n = 0;
        for (size_t i = 0; i < N; i++) {
            struct bf_hash h = bf_hash_key(hasher, k[i], strlen(k[i]));
            if (bf_hash_shard(h, S) != s)
                continue;
            for (int b = 0; b < 8; b++) {
                hb[16 * n + b] = (uint8_t)(h.h1 >> (8 * b));
                hb[16 * n + 8 + b] = (uint8_t)(h.h2 >> (8 * b));
            }
            n++;
        }
        for (int rep = 0; rep < 2; rep++) {
            Bloomgrid__V1__HashesRequest hq = BLOOMGRID__V1__HASHES_REQUEST__INIT;
            ProtobufCMessage *resp = NULL;
            hq.filter = "rep";
            hq.shard_index = s;
            hq.hashes.data = hb;
            hq.hashes.len = 16 * n;
            CHECK(rpc_call(c.node[1].ch, "/bloomgrid.v1.Internal/AddHashes", &hq.base,
                           &bloomgrid__v1__hashes_response__descriptor, &resp,
                           TIMEOUT_MS, &st) == 0, "AddHashes: %s", st.message);
            protobuf_c_message_free_unpacked(resp, NULL);
        }
    }
    free(hb);
    bf_destroy(hasher);

    /* The primary dies: reads are served by the replica. */
    node_stop(&c.node[0], SIGKILL);
    CHECK(t_keys(a, "MayContain", "rep", k, N, out, &st) == 0,
          "read with the primary down: %s", st.message);
    for (size_t i = 0; i < N; i++)
        CHECK(out[i], "key %s missing from the replica read", k[i]);
    CHECK(log_has(c.router[0].log, "read from replica"), "replica read not logged");
    /* Writes are never sent to a replica. */
    CHECK(t_keys(a, "Add", "rep", k, 10, out, &st) == GRPC_STATUS_UNAVAILABLE,
          "write with the primary down: %d", st.code);
    CHECK(strstr(st.message, c.node[0].addr), "write names the primary: %s", st.message);
    free_keys(k, N);
    cluster_stop(&c);
}

/* ---- key batches over the nodes' frame transport ---- */

#define FB 2000     /* keys per batch */

/* A TCP port on 127.0.0.1 that was free a moment ago. */
static int free_tcp_port(void)
{
    struct sockaddr_in a = {.sin_family = AF_INET};
    socklen_t al = sizeof a;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
              getsockname(fd, (struct sockaddr *)&a, &al) == 0,
          "no free port");
    close(fd);
    return ntohs(a.sin_port);
}

/* The frame port a node reports through Internal/NodeInfo (0: frames off). */
static int node_frame_port(struct node_proc *np)
{
    Bloomgrid__V1__NodeInfoRequest rq = BLOOMGRID__V1__NODE_INFO_REQUEST__INIT;
    Bloomgrid__V1__NodeInfoResponse *resp = NULL;
    struct rpc_status st;
    CHECK(rpc_call(np->ch, "/bloomgrid.v1.Internal/NodeInfo", &rq.base,
                   &bloomgrid__v1__node_info_response__descriptor,
                   (ProtobufCMessage **)&resp, TIMEOUT_MS, &st) == 0,
          "NodeInfo on %s: %s", np->addr, st.message);
    int port = (int)resp->frame_port;
    bloomgrid__v1__node_info_response__free_unpacked(resp, NULL);
    return port;
}

/* The numbers right after needle on the log lines that hold it, in order
 * (at most max); returns how many lines hold it. */
static int log_numbers(const char *path, const char *needle, int *nums, int max)
{
    FILE *f = fopen(path, "r");
    char line[2048];
    int n = 0;
    while (f && fgets(line, sizeof line, f)) {
        const char *p = strstr(line, needle);
        if (!p)
            continue;
        if (n < max)
            nums[n] = atoi(p + strlen(needle));
        n++;
    }
    if (f)
        fclose(f);
    return n;
}

/* Router log lines for node addr: the ports it learned, or those that failed. */
static int learned_ports(const char *log, const char *addr, int *ports, int max)
{
    char needle[128];
    snprintf(needle, sizeof needle, "node %s: key batches over its frame port ", addr);
    return log_numbers(log, needle, ports, max);
}

static int failed_ports(const char *log, const char *addr, int *ports, int max)
{
    char needle[128];
    snprintf(needle, sizeof needle, "node %s: frame port ", addr);
    return log_numbers(log, needle, ports, max);
}

/* Established TCP connections of process pid to port on loopback: the
 * socket inodes among its descriptors, looked up in /proc/net/tcp{,6}. */
static int conns_to(pid_t pid, int port)
{
    unsigned long inode[1024];
    int ni = 0, n = 0;
    char path[64], link[64], line[512];
    snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
    DIR *d = opendir(path);
    CHECK(d, "%s: %s", path, strerror(errno));
    for (struct dirent *e; (e = readdir(d)) && ni < 1024;) {
        char fp[320];
        snprintf(fp, sizeof fp, "%s/%s", path, e->d_name);
        ssize_t l = readlink(fp, link, sizeof link - 1);
        if (l > 0) {
            link[l] = 0;
            if (sscanf(link, "socket:[%lu]", &inode[ni]) == 1)
                ni++;
        }
    }
    closedir(d);
    const char *tabs[] = {"/proc/net/tcp", "/proc/net/tcp6"};
    for (int t = 0; t < 2; t++) {
        FILE *f = fopen(tabs[t], "r");
        while (f && fgets(line, sizeof line, f)) {
            unsigned rport, st;
            unsigned long ino;
            if (sscanf(line, "%*s %*s %*[0-9A-Fa-f]:%x %x %*s %*s %*s %*s %*s %lu",
                       &rport, &st, &ino) != 3 || rport != (unsigned)port || st != 1)
                continue;
            for (int i = 0; i < ni; i++)
                n += inode[i] == ino;
        }
        if (f)
            fclose(f);
    }
    return n;
}

/* Send method for keys prefix-[from, from + n) in batches of FB through ch;
 * answers in out[n]. */
static void key_batches(struct rpc_channel *ch, const char *method, const char *filter,
                        const char *prefix, size_t from, size_t n, bool *out)
{
    struct rpc_status st;
    for (size_t b = 0; b < n; b += FB) {
        size_t m = n - b < FB ? n - b : FB;
        char **k = make_keys(prefix, from + b, m);
        CHECK(t_keys(ch, method, filter, k, m, out + b, &st) == 0, "%s %s: %s", method,
              prefix, st.message);
        free_keys(k, m);
    }
}

static void check_all(const bool *out, size_t n, const char *what)
{
    for (size_t i = 0; i < n; i++)
        CHECK(out[i], "%s: key %zu missing", what, i);
}

/* Nodes 0 and 1 offer frames, node 2 runs with --frames off; router 0 uses
 * frames, router 1 runs with --frames off.  fsync: a killed node keeps
 * every acknowledged key. */
static void frames_cluster_start(struct cluster *c, int *fport)
{
    static const char *const off[] = {"--frames", "off", NULL};
    memset(c, 0, sizeof *c);
    harness_tmpdir(c->dir, sizeof c->dir, "router-frames");
    snprintf(c->topo, sizeof c->topo, "%s/topology.ini", c->dir);
    c->nnodes = 3;
    for (int i = 0; i < 3; i++) {
        snprintf(c->node_dir[i], sizeof c->node_dir[i], "%s/node%d", c->dir, i);
        start_node_args(c, i, "fsync", 0, i == 2 ? off : NULL);
        fport[i] = node_frame_port(&c->node[i]);
        int logged[2];
        int n = log_numbers(c->node[i].log, "frame transport on 127.0.0.1:", logged, 2);
        if (i < 2)
            CHECK(fport[i] > 0 && n == 1 && logged[0] == fport[i],
                  "node %d: NodeInfo port %d, %d log lines (first %d)", i, fport[i], n,
                  n ? logged[0] : -1);
        else
            CHECK(fport[i] == 0 && n == 0, "node with --frames off: port %d, %d lines",
                  fport[i], n);
    }
    write_topo(c, 3, false, NULL);
    c->nrouters = 2;
    start_router(c, 0);
    start_router_args(c, 1, off);
}

/* Remove over frames too: on a counting filter, removed keys go, the others
 * stay, whichever router asks. */
static void frames_remove(struct cluster *c)
{
    Bloomgrid__V1__CreateFilterRequest rq = BLOOMGRID__V1__CREATE_FILTER_REQUEST__INIT;
    Bloomgrid__V1__FilterInfo *fi = NULL;
    struct rpc_status st;
    bool out[2 * FB];
    rq.name = "cnt";
    rq.capacity = 10000;
    rq.error_rate = 0.01;
    rq.kind = BLOOMGRID__V1__FILTER_KIND__FILTER_KIND_COUNTING;
    rq.shards = 16;
    CHECK(rpc_call(c->router[0].ch, "/bloomgrid.v1.BloomGrid/CreateFilter", &rq.base,
                   &bloomgrid__v1__filter_info__descriptor, (ProtobufCMessage **)&fi,
                   TIMEOUT_MS, &st) == 0, "create counting: %s", st.message);
    bloomgrid__v1__filter_info__free_unpacked(fi, NULL);
    key_batches(c->router[0].ch, "Add", "cnt", "c", 0, 2 * FB, out);
    key_batches(c->router[0].ch, "Remove", "cnt", "c", 0, FB, out);
    for (int r = 0; r < 2; r++) {
        key_batches(c->router[r].ch, "MayContain", "cnt", "c", 0, 2 * FB, out);
        size_t left = 0;
        for (size_t i = 0; i < FB; i++)
            left += out[i];
        CHECK(left < FB / 20, "router %d: %zu of %d removed keys present", r, left, FB);
        check_all(out + FB, FB, "kept key of the counting filter");
    }
}

/* Kill node i (SIGKILL) and start it again on its gRPC port and data;
 * returns its new frame port, which differs from old (should the kernel
 * hand out the old port again, the node is restarted once more: the point
 * is a port the router does not know yet). */
static int frames_restart(struct cluster *c, int i, int old)
{
    int gport = c->node[i].port, port = old;
    for (int tries = 0; port == old && tries < 3; tries++) {
        node_stop(&c->node[i], SIGKILL);
        start_node_args(c, i, "fsync", gport, NULL);
        port = node_frame_port(&c->node[i]);
    }
    CHECK(port > 0 && port != old, "restarted node: frame port %d (was %d)", port, old);
    return port;
}

static void test_frames(void)
{
    struct cluster c;
    struct rpc_status st;
    const size_t N = 20000;
    const double P = 0.01;
    int fport[3];
    bool *in = malloc(N * sizeof *in), *abs_a = malloc(N * sizeof *abs_a);
    bool *abs_b = malloc(N * sizeof *abs_b);

    frames_cluster_start(&c, fport);
    struct rpc_channel *a = c.router[0].ch, *b = c.router[1].ch;
    const char *r0log = c.router[0].log, *r1log = c.router[1].log;
    CHECK(create_sharded(a, "fr", N, P, 32, NULL, &st) == 0, "create: %s", st.message);
    for (int i = 0; i < 3; i++)
        CHECK(shards_on(&c.node[i], "fr") > 0, "node %d holds no shard", i);

    /* Mixed cluster: every batch spans frame and gRPC nodes. */
    double t0 = now_s();
    key_batches(a, "Add", "fr", "present", 0, N, in);
    key_batches(a, "MayContain", "fr", "present", 0, N, in);
    check_all(in, N, "router 0");
    key_batches(a, "MayContain", "fr", "absent", 0, N, abs_a);
    size_t fp = 0;
    for (size_t i = 0; i < N; i++)
        fp += abs_a[i];
    printf("mixed cluster: %zu keys in, out and absent in %.2fs; FPR %.4f\n", N,
           now_s() - t0, (double)fp / N);
    CHECK((double)fp / N < 2 * P, "FPR %.4f at p %.2f", (double)fp / N, P);

    /* Frames to nodes 0 and 1 at the ports they report, never to node 2. */
    int ports[8];
    for (int i = 0; i < 2; i++) {
        int n = learned_ports(r0log, c.node[i].addr, ports, 8);
        CHECK(n == 1 && ports[0] == fport[i], "router 0, node %d: %d lines, port %d "
              "(node says %d)", i, n, n ? ports[0] : -1, fport[i]);
    }
    CHECK(learned_ports(r0log, c.node[2].addr, ports, 8) == 0 &&
          failed_ports(r0log, c.node[2].addr, ports, 8) == 0,
          "router 0 names a frame port for the node with --frames off");

    /* Its pooled connections say the same: open to both frame ports. */
    for (int i = 0; i < 2; i++)
        CHECK(conns_to(c.router[0].pid, fport[i]) > 0,
              "router 0 holds no connection to node %d's frame port", i);

    /* A router with --frames off: the same answers, all over gRPC. */
    key_batches(b, "MayContain", "fr", "present", 0, N, in);
    check_all(in, N, "router 1");
    key_batches(b, "MayContain", "fr", "absent", 0, N, abs_b);
    CHECK(memcmp(abs_a, abs_b, N * sizeof *abs_a) == 0,
          "the routers answer absent keys differently");
    frames_remove(&c);
    CHECK(!log_has(r1log, "frame port"), "router with --frames off used frames");
    for (int i = 0; i < 2; i++)
        CHECK(conns_to(c.router[1].pid, fport[i]) == 0,
              "router with --frames off connected to node %d's frame port", i);

    /* Node 1 restarts on another frame port.  The router's first call finds
     * the old port closed, goes over gRPC, and learns the new port ~200 ms
     * later.  At most the first two batches may fail (UNAVAILABLE, while the
     * node's gRPC connection comes back); once one succeeds every later one
     * must. */
    int newport = frames_restart(&c, 1, fport[1]);
    char relearned[160];
    snprintf(relearned, sizeof relearned, "node %s: key batches over its frame port %d",
             c.node[1].addr, newport);
    size_t ok = 0, fails = 0, after = 0;
    t0 = now_s();
    while ((ok < 10 || !log_has(r0log, relearned)) && now_s() - t0 < 5) {
        char **k = make_keys("after", ok * FB, FB);
        int code = t_keys(a, "Add", "fr", k, FB, in, &st);
        free_keys(k, FB);
        if (code == 0) {
            after = ++ok * FB;
            sleep_ms(20);
            continue;
        }
        CHECK(code == GRPC_STATUS_UNAVAILABLE && ok == 0 && ++fails <= 2,
              "batch %zu after the restart (%zu failed before): %s: %s", ok, fails,
              rpc_status_name(code), st.message);
        sleep_ms(200);
    }
    printf("after the restart: %zu batches in %.2fs, %zu failed first; frame port "
           "%d -> %d\n", ok, now_s() - t0, fails, fport[1], newport);
    CHECK(ok >= 10, "%zu batches succeeded in 5 s after the restart", ok);
    CHECK(log_has(r0log, relearned), "router 0 did not learn port %d", newport);
    CHECK(conns_to(c.router[0].pid, newport) > 0 &&
          conns_to(c.router[0].pid, fport[1]) == 0,
          "router 0's connections to node 1: %d to the new port, %d to the old",
          conns_to(c.router[0].pid, newport), conns_to(c.router[0].pid, fport[1]));

    /* The router log tells the story: old port learned, failed, new one
     * learned; nodes 0 and 2 unaffected. */
    int n = learned_ports(r0log, c.node[1].addr, ports, 8);
    CHECK(n >= 2 && ports[0] == fport[1] && ports[n - 1] == newport,
          "node 1 ports learned: %d lines, first %d, last %d", n, ports[0],
          ports[n < 8 ? n - 1 : 7]);
    int nf = failed_ports(r0log, c.node[1].addr, ports, 8);
    CHECK(nf >= 1 && ports[0] == fport[1], "old port failure not logged (%d lines)", nf);
    for (int i = 0; i < nf && i < 8; i++)
        CHECK(ports[i] != newport, "the new port %d failed", newport);
    CHECK(learned_ports(r0log, c.node[0].addr, ports, 8) == 1 &&
          failed_ports(r0log, c.node[0].addr, ports, 8) == 0,
          "node 0's port was dropped for node 1's restart");
    CHECK(learned_ports(r0log, c.node[2].addr, ports, 8) == 0, "node 2 over frames");
    n = log_numbers(c.node[1].log, "frame transport on 127.0.0.1:", ports, 8);
    CHECK(n == 2 && ports[0] == fport[1] && ports[1] == newport,
          "node 1 log: %d frame transport lines", n);

    /* Nothing acknowledged was lost, through either transport. */
    key_batches(a, "MayContain", "fr", "present", 0, N, in);
    check_all(in, N, "router 0 after the restart");
    key_batches(b, "MayContain", "fr", "present", 0, N, in);
    check_all(in, N, "router 1 after the restart");
    bool *more = malloc(after * sizeof *more);
    key_batches(b, "MayContain", "fr", "after", 0, after, more);
    check_all(more, after, "batch added after the restart");

    /* A fixed frame_port is the one the node serves and reports, and the
     * router follows it there. */
    int fixed = free_tcp_port();
    char fixed_s[16], fixed_line[160];
    snprintf(fixed_s, sizeof fixed_s, "%d", fixed);
    const char *const fixed_args[] = {"--frame-port", fixed_s, NULL};
    node_stop(&c.node[0], SIGTERM);
    start_node_args(&c, 0, "fsync", c.node[0].port, fixed_args);
    CHECK(node_frame_port(&c.node[0]) == fixed, "node 0 reports frame port %d, not %d",
          node_frame_port(&c.node[0]), fixed);
    snprintf(fixed_line, sizeof fixed_line, "node %s: key batches over its frame port %d",
             c.node[0].addr, fixed);
    t0 = now_s();
    bool learned = false;
    while (!learned && now_s() - t0 < 5) {
        key_batches(a, "MayContain", "fr", "present", 0, N, in);
        learned = log_has(r0log, fixed_line);
        if (!learned)
            sleep_ms(100);
    }
    check_all(in, N, "router 0 with node 0 on a fixed frame port");
    CHECK(learned, "router 0 did not move to node 0's fixed frame port %d", fixed);
    CHECK(conns_to(c.router[0].pid, fixed) > 0, "no connection to the fixed port %d", fixed);
    free(more);
    free(in);
    free(abs_a);
    free(abs_b);
    cluster_stop(&c);
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s NODE_BIN ROUTER_BIN cluster|create|kill|reload|replica|transfer|frames\n",
                argv[0]);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    harness_node_bin = argv[1];
    router_bin = argv[2];
    grpc_init();
    if (strcmp(argv[3], "cluster") == 0)
        test_cluster();
    else if (strcmp(argv[3], "create") == 0)
        test_create();
    else if (strcmp(argv[3], "kill") == 0)
        test_kill();
    else if (strcmp(argv[3], "reload") == 0)
        test_reload();
    else if (strcmp(argv[3], "transfer") == 0)
        test_transfer();
    else if (strcmp(argv[3], "replica") == 0)
        test_replica();
    else if (strcmp(argv[3], "frames") == 0)
        test_frames();
    else {
        fprintf(stderr, "unknown test %s\n", argv[3]);
        return 2;
    }
    grpc_shutdown();
    printf("ok\n");
    return 0;
}
