/* Router test "placement": filters keep the placement version they were
 * created with (docs/TOPOLOGY.md, "Placement versions").
 *
 *   old     the data directories of three nodes written by the release
 *           before placement versions (tests/fixtures/placement-v1-dirs:
 *           filter "old", 64 shards placed by rendezvous) open under this
 *           build: the router finds every shard where it was, every key
 *           is there, the filter says placement 1; a new filter gets
 *           placement 2, at most ceil(64/3) + 1 shards per group, each
 *           shard where version 2 puts it; an explicit placement 1 gives
 *           rendezvous; an unknown version is refused;
 *   refuse  a filter recorded with a placement version this build does
 *           not know (3, created shard by shard with CreateShard) is
 *           refused by the router on every call (FAILED_PRECONDITION,
 *           reason PLACEMENT_UNKNOWN, naming the version), never answered
 *           NOT_FOUND; a caller from before versions (GetShard without
 *           placement_known) gets no secret of a version-2 filter.
 *
 * usage: test_router_placement NODE_BIN ROUTER_BIN SOURCE_DIR SCENARIO
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/grpc.h>

#include "cluster.h"
#include "rpc_status.h"
#include "topo.h"

#define M_GET_SHARD "/bloomgrid.v1.Internal/GetShard"
#define M_CREATE_SHARD "/bloomgrid.v1.Internal/CreateShard"

static const char *source_dir;

/* The node of c (index) that holds group g of t: groups are g<i>, one node
 * each. */
static int node_of_group(const struct topo *t, unsigned g)
{
    return atoi(t->groups[g].name + 1);
}

/* CreateFilter through ch with a placement version; the answer in *out. */
static int create_placed(struct rpc_channel *ch, const char *name, uint32_t shards,
                         uint32_t placement, Bloomgrid__V1__FilterInfo **out,
                         struct rpc_status *st)
{
    Bloomgrid__V1__CreateFilterRequest rq = BLOOMGRID__V1__CREATE_FILTER_REQUEST__INIT;
    rq.name = (char *)name;
    rq.capacity = 10000;
    rq.error_rate = 0.01;
    rq.shards = shards;
    rq.placement = placement;
    if (rpc_call(ch, "/bloomgrid.v1.BloomGrid/CreateFilter", &rq.base,
                 &bloomgrid__v1__filter_info__descriptor, (ProtobufCMessage **)out,
                 TIMEOUT_MS, st) < 0)
        return st->code;
    return 0;
}

/* Every shard of fi is on the node that group[s] of t names. */
static void expect_shards_on(const struct cluster *c, const struct topo *t,
                             const Bloomgrid__V1__FilterInfo *fi, const uint16_t *group)
{
    CHECK(fi->n_shard_info == fi->shards, "%zu shard infos of %u", fi->n_shard_info,
          fi->shards);
    for (size_t s = 0; s < fi->n_shard_info; s++) {
        int node = node_of_group(t, group[s]);
        CHECK(strcmp(fi->shard_info[s]->node, c->node[node].addr) == 0,
              "%s shard %zu on %s, placement says node %d (%s)", fi->name, s,
              fi->shard_info[s]->node, node, c->node[node].addr);
    }
}

static void test_old(void)
{
    struct cluster c;
    struct rpc_status st;
    char cmd[2048];

    cluster_init(&c, "router-placement-old", "fsync");
    for (int i = 0; i < 3; i++) {
        snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s/tests/fixtures/"
                 "placement-v1-dirs/node%d' '%s'", c.node_dir[i], source_dir, i,
                 c.node_dir[i]);
        CHECK(system(cmd) == 0, "%s", cmd);
        cluster_node_start(&c, i, 0, NULL);
    }
    cluster_write_topo(&c, 3, false, NULL);
    cluster_router_start(&c, 0, NULL);
    struct rpc_channel *r = c.router[0].ch;
    char err[TOPO_ERRLEN];
    struct topo *t = topo_load(c.topo, err);
    CHECK(t, "%s", err);

    /* Where the old release put them: rendezvous, shard by shard. */
    uint16_t v1[64], v2[64];
    CHECK(topo_place(t, "old", 64, 1, v1) == 0, "place v1");
    CHECK(topo_place(t, "old", 64, 2, v2) == 0, "place v2");
    int differ = 0;
    for (int s = 0; s < 64; s++) {
        CHECK(v1[s] == topo_group_for(t, "old", (uint32_t)s), "v1 is rendezvous");
        differ += v1[s] != v2[s];
    }
    /* Else this test could not tell the two rules apart. */
    CHECK(differ > 0, "both rules place \"old\" alike");
    printf("old: %d of 64 shards would be elsewhere under version 2\n", differ);
    int count[3] = {0};
    for (int s = 0; s < 64; s++)
        count[node_of_group(t, v1[s])]++;
    for (int i = 0; i < 3; i++)
        CHECK(t_shard_count(c.node[i].ch, "old") == count[i],
              "node %d holds %d shards of old, rendezvous puts %d there", i,
              t_shard_count(c.node[i].ch, "old"), count[i]);

    Bloomgrid__V1__FilterInfo *fi = NULL;
    CHECK(t_get(r, "old", &fi, &st) == 0, "get old: %s", st.message);
    CHECK(fi->placement == 1, "old says placement %u", fi->placement);
    CHECK(fi->state == BLOOMGRID__V1__FILTER_STATE__FILTER_STATE_READY, "old: %s",
          fi->reason);
    expect_shards_on(&c, t, fi, v1);
    bloomgrid__v1__filter_info__free_unpacked(fi, NULL);
    char **k = keys_make("old", 0, 2000);
    CHECK(keys_present(r, "old", k, 2000, NULL) == 2000, "a key of old is missing");
    /* It takes writes where it is. */
    keys_call(r, "Add", "old", k, 2000, 500, NULL);
    keys_free(k, 2000);

    /* A new filter: version 2, balanced. */
    CHECK(t_create_sharded(r, "new", 10000, 0.01, 0, 64, &fi, &st) == 0, "create: %s",
          st.message);
    CHECK(fi->placement == TOPO_PLACEMENT_NEWEST, "new says placement %u",
          fi->placement);
    bloomgrid__v1__filter_info__free_unpacked(fi, NULL);
    CHECK(t_get(r, "new", &fi, &st) == 0, "get new: %s", st.message);
    uint16_t nv2[64];
    CHECK(topo_place(t, "new", 64, 2, nv2) == 0, "place new");
    expect_shards_on(&c, t, fi, nv2);
    bloomgrid__v1__filter_info__free_unpacked(fi, NULL);
    for (int i = 0; i < 3; i++) {
        int n = t_shard_count(c.node[i].ch, "new");
        CHECK(n <= 64 / 3 + 1 + 1, "node %d holds %d shards of new", i, n);
        printf("new: node %d holds %d shards\n", i, n);
    }
    k = keys_make("new", 0, 2000);
    keys_call(r, "Add", "new", k, 2000, 500, NULL);
    CHECK(keys_present(r, "new", k, 2000, NULL) == 2000, "a key of new is missing");
    keys_free(k, 2000);

    /* Asked for: rendezvous; a version this router does not know: no. */
    CHECK(create_placed(r, "asked1", 64, 1, &fi, &st) == 0, "create v1: %s", st.message);
    CHECK(fi->placement == 1, "asked1 says placement %u", fi->placement);
    uint16_t a1[64];
    CHECK(topo_place(t, "asked1", 64, 1, a1) == 0, "place asked1");
    expect_shards_on(&c, t, fi, a1);
    bloomgrid__v1__filter_info__free_unpacked(fi, NULL);
    CHECK(create_placed(r, "asked9", 4, 9, &fi, &st) == GRPC_STATUS_INVALID_ARGUMENT,
          "create with placement 9: %d %s", st.code, st.message);
    CHECK(strstr(st.message, "placement version 9"), "message: %s", st.message);
    for (int i = 0; i < 3; i++)
        CHECK(t_shard_count(c.node[i].ch, "asked9") == 0, "asked9 on node %d", i);

    /* After a restart of every node the versions are still there. */
    for (int i = 0; i < 3; i++)
        cluster_node_restart(&c, i, SIGKILL, NULL);
    CHECK(node_wait_health(&c.router[0], true, 20000), "router");
    const char *names[] = {"old", "new", "asked1"};
    const uint32_t want[] = {1, 2, 1};
    for (int j = 0; j < 3; j++) {
        int tries = 0, code;
        while ((code = t_get(r, names[j], &fi, &st)) == GRPC_STATUS_UNAVAILABLE &&
               tries++ < 100)
            harness_sleep_ms(100);
        CHECK(code == 0, "get %s: %s", names[j], st.message);
        CHECK(fi->placement == want[j], "%s says placement %u after a restart",
              names[j], fi->placement);
        bloomgrid__v1__filter_info__free_unpacked(fi, NULL);
    }
    topo_unref(t);
    cluster_stop(&c);
}

/* Create every shard of name (S shards, placement version placement) on
 * the group rendezvous gives, by hand. */
static void create_by_hand(struct cluster *c, const struct topo *t, const char *name,
                           uint32_t S, uint32_t placement)
{
    uint8_t secret[32];
    for (int i = 0; i < 32; i++)
        secret[i] = (uint8_t)(7 * i + 1);
    for (uint32_t s = 0; s < S; s++) {
        int node = node_of_group(t, topo_group_for(t, name, s));
        Bloomgrid__V1__CreateShardRequest rq = BLOOMGRID__V1__CREATE_SHARD_REQUEST__INIT;
        ProtobufCMessage *resp = NULL;
        struct rpc_status st;
        rq.filter = (char *)name;
        rq.shard_index = s;
        rq.shard_count = S;
        rq.capacity = 1000;
        rq.error_rate = 0.01;
        rq.secret.data = secret;
        rq.secret.len = sizeof secret;
        rq.new_filter = true;
        rq.placement = placement;
        CHECK(rpc_call(c->node[node].ch, M_CREATE_SHARD, &rq.base,
                       &bloomgrid__v1__internal_shard_info__descriptor, &resp,
                       TIMEOUT_MS, &st) == 0, "create shard %u: %s", s, st.message);
        Bloomgrid__V1__InternalShardInfo *isi = (Bloomgrid__V1__InternalShardInfo *)resp;
        CHECK(isi->placement == placement, "shard %u recorded placement %u", s,
              isi->placement);
        protobuf_c_message_free_unpacked(resp, NULL);
    }
}

/* A refused call: FAILED_PRECONDITION, reason PLACEMENT_UNKNOWN, naming
 * version 3; never NOT_FOUND. */
static void expect_unknown(int code, const struct rpc_status *st, const char *what)
{
    CHECK(code == GRPC_STATUS_FAILED_PRECONDITION, "%s: %d %s", what, code, st->message);
    CHECK(st->reason == RPC_REASON_PLACEMENT_UNKNOWN, "%s: reason %d", what, st->reason);
    CHECK(strstr(st->message, "placement version 3"), "%s: %s", what, st->message);
    printf("%s: %s\n", what, st->message);
}

static void test_refuse(void)
{
    struct cluster c;
    struct rpc_status st;
    char err[TOPO_ERRLEN];

    cluster_start(&c, "router-placement-refuse", 3, 1, "none");
    struct rpc_channel *r = c.router[0].ch;
    struct topo *t = topo_load(c.topo, err);
    CHECK(t, "%s", err);
    create_by_hand(&c, t, "future", 16, 3);

    char **k = keys_make("k", 0, 100);
    bool out[100];
    expect_unknown(t_keys(r, "Add", "future", k, 100, out, &st), &st, "Add");
    expect_unknown(t_keys(r, "MayContain", "future", k, 100, out, &st), &st, "MayContain");
    /* Again: the refusal is not cached as an absent filter. */
    expect_unknown(t_keys(r, "MayContain", "future", k, 100, out, &st), &st,
                   "MayContain again");
    Bloomgrid__V1__FilterInfo *fi = NULL;
    expect_unknown(t_get(r, "future", &fi, &st), &st, "GetFilter");
    expect_unknown(t_drop(r, "future", &st), &st, "DropFilter");
    int total = 0;
    for (int i = 0; i < 3; i++)
        total += t_shard_count(c.node[i].ch, "future");
    CHECK(total == 16, "%d shards of future left after a refused drop", total);
    keys_free(k, 100);

    /* Listed, each shard saying why it cannot be used. */
    Bloomgrid__V1__ListFiltersRequest lq = BLOOMGRID__V1__LIST_FILTERS_REQUEST__INIT;
    Bloomgrid__V1__ListFiltersResponse *lr = NULL;
    CHECK(rpc_call(r, "/bloomgrid.v1.BloomGrid/ListFilters", &lq.base,
                   &bloomgrid__v1__list_filters_response__descriptor,
                   (ProtobufCMessage **)&lr, TIMEOUT_MS, &st) == 0, "list: %s",
          st.message);
    CHECK(lr->n_filters == 1 && strcmp(lr->filters[0]->name, "future") == 0 &&
          lr->filters[0]->placement == 3, "list: %zu filters", lr->n_filters);
    CHECK(lr->filters[0]->state != BLOOMGRID__V1__FILTER_STATE__FILTER_STATE_READY,
          "future listed READY");
    CHECK(strstr(lr->filters[0]->reason, "placement version 3"), "reason: %s",
          lr->filters[0]->reason);
    bloomgrid__v1__list_filters_response__free_unpacked(lr, NULL);

    /* A caller from before versions sends no placement_known: a
     * version-2 filter's secret is not given to it. */
    CHECK(t_create_sharded(r, "now", 10000, 0.01, 0, 8, NULL, &st) == 0, "create: %s",
          st.message);
    int node0 = node_of_group(t, topo_group_for(t, "now", 0));
    Bloomgrid__V1__GetShardRequest gq = BLOOMGRID__V1__GET_SHARD_REQUEST__INIT;
    ProtobufCMessage *resp = NULL;
    gq.filter = "now";
    gq.include_secret = true;
    CHECK(rpc_call(c.node[node0].ch, M_GET_SHARD, &gq.base,
                   &bloomgrid__v1__internal_shard_info__descriptor, &resp, TIMEOUT_MS,
                   &st) < 0, "an old caller got the secret");
    CHECK(st.code == GRPC_STATUS_FAILED_PRECONDITION &&
          st.reason == RPC_REASON_PLACEMENT_UNKNOWN, "old caller: %d %s", st.code,
          st.message);
    CHECK(strstr(st.message, "placement version 2"), "%s", st.message);
    /* Without the secret it is described. */
    gq.include_secret = false;
    CHECK(rpc_call(c.node[node0].ch, M_GET_SHARD, &gq.base,
                   &bloomgrid__v1__internal_shard_info__descriptor, &resp, TIMEOUT_MS,
                   &st) == 0, "describe: %s", st.message);
    CHECK(((Bloomgrid__V1__InternalShardInfo *)resp)->placement == 2, "placement");
    protobuf_c_message_free_unpacked(resp, NULL);
    /* One that knows version 2 gets it. */
    gq.include_secret = true;
    gq.placement_known = 2;
    CHECK(rpc_call(c.node[node0].ch, M_GET_SHARD, &gq.base,
                   &bloomgrid__v1__internal_shard_info__descriptor, &resp, TIMEOUT_MS,
                   &st) == 0, "get: %s", st.message);
    CHECK(((Bloomgrid__V1__InternalShardInfo *)resp)->secret.len == 32, "secret");
    protobuf_c_message_free_unpacked(resp, NULL);
    topo_unref(t);
    cluster_stop(&c);
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: %s NODE_BIN ROUTER_BIN SOURCE_DIR old|refuse\n", argv[0]);
        return 2;
    }
    source_dir = argv[3];
    char *args[] = {argv[0], argv[1], argv[2], NULL};
    if (strcmp(argv[4], "old") == 0)
        return cluster_test_main(3, args, test_old);
    if (strcmp(argv[4], "refuse") == 0)
        return cluster_test_main(3, args, test_refuse);
    fprintf(stderr, "unknown scenario %s\n", argv[4]);
    return 2;
}
