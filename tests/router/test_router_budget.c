/* Router test "budget": a CreateFilter is checked whole against the
 * budgets of the nodes (docs/SECURITY.md, "Budgets") before any shard is
 * created.
 *
 * Two nodes of 64 MiB (max_memory_mb) and 12 filters (max_filters) each:
 *   - 196 GB of bits over 64 shards is RESOURCE_EXHAUSTED naming the budget
 *     and a node, and no node holds a shard or wrote a file of it;
 *   - 16 shards of about 8.5 MiB each (their bits and page versions) fit
 *     one by one but not eight on one node: refused before the fan-out;
 *   - max_filters likewise;
 *   - creates racing for the last room (past the router's check, a node's
 *     own refusal): every one either has all its shards or none (rolled
 *     back), and no node goes past its budget.
 *
 * usage: test_router_budget NODE_BIN ROUTER_BIN
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/grpc.h>

#include "cluster.h"


/* The node's budgets as NodeInfo reports them. */
static void budget_of(struct rpc_channel *ch, uint64_t *charged, uint64_t *filters)
{
    struct node_info ni;
    t_node_info(ch, &ni);
    CHECK(ni.max_memory_bytes == (64u << 20), "max_memory_bytes %llu",
          (unsigned long long)ni.max_memory_bytes);
    CHECK(ni.max_filters == 12, "max_filters %llu", (unsigned long long)ni.max_filters);
    *charged = ni.charged_bytes;
    *filters = ni.filters;
}

struct racer {
    struct rpc_channel *ch;
    char name[32];
    int code;
    char msg[RPC_MSGLEN];
};

static void *race(void *p)
{
    struct racer *r = p;
    struct rpc_status st;
    r->code = t_create_sharded(r->ch, r->name, 2000, 0.01, 0, 2, NULL, &st);
    snprintf(r->msg, sizeof r->msg, "%s", st.message);
    return NULL;
}

static void test_budget(void)
{
    struct cluster c;
    struct rpc_status st;
    const char *flags[] = {"--max-memory-mb", "64", "--max-filters", "12", NULL};
    cluster_init(&c, "router-budget", "none");
    for (int i = 0; i < 2; i++)
        cluster_node_start(&c, i, 0, flags);
    cluster_write_topo(&c, 2, false, NULL);
    cluster_router_start(&c, 0, NULL);
    struct rpc_channel *a = c.router[0].ch;
    uint64_t disk0[2], charged, filters;
    for (int i = 0; i < 2; i++) {
        disk0[i] = harness_du(c.node_dir[i]);
        budget_of(c.node[i].ch, &charged, &filters);
        CHECK(charged == 0 && filters == 0, "node %d starts with %llu bytes, %llu "
              "filters", i, (unsigned long long)charged, (unsigned long long)filters);
    }

    int code = t_create_sharded(a, "huge", 150000000000ull, 0.01, 0, 64, NULL, &st);
    printf("196 GB: %s\n", st.message);
    CHECK(code == GRPC_STATUS_RESOURCE_EXHAUSTED, "huge: %d %s", code, st.message);
    CHECK(strstr(st.message, "max_memory_mb"), "no budget named: %s", st.message);
    CHECK(strstr(st.message, c.node[0].addr) || strstr(st.message, c.node[1].addr),
          "no node named: %s", st.message);

    /* 8.5 MiB of bits a shard: 8 a node is 68 MiB of 64. */
    code = t_create_sharded(a, "wide", 7000000ull * 16, 0.01, 0, 16, NULL, &st);
    printf("16 x 8.5 MiB: %s\n", st.message);
    CHECK(code == GRPC_STATUS_RESOURCE_EXHAUSTED, "wide: %d %s", code, st.message);
    CHECK(strstr(st.message, "would exceed its budget max_memory_mb"),
          "not refused before the fan-out: %s", st.message);
    for (int i = 0; i < 2; i++) {
        CHECK(t_shard_count(c.node[i].ch, "huge") == 0, "node %d holds huge", i);
        CHECK(t_shard_count(c.node[i].ch, "wide") == 0, "node %d holds wide", i);
        budget_of(c.node[i].ch, &charged, &filters);
        CHECK(charged == 0 && filters == 0, "node %d took %llu bytes", i,
              (unsigned long long)charged);
        CHECK(harness_du(c.node_dir[i]) <= disk0[i] + 64 * 1024, "node %d wrote files", i);
    }

    /* max_filters: 25 shards put 13 on one node at least. */
    code = t_create_sharded(a, "many", 1000, 0.01, 0, 25, NULL, &st);
    CHECK(code == GRPC_STATUS_RESOURCE_EXHAUSTED, "many: %d %s", code, st.message);
    CHECK(strstr(st.message, "max_filters"), "no budget named: %s", st.message);
    for (int i = 0; i < 2; i++)
        CHECK(t_shard_count(c.node[i].ch, "many") == 0, "node %d holds many", i);

    /* Racing creates of 2 shards for the 8 places a filter of 16 leaves:
     * all or nothing each. */
    CHECK(t_create_sharded(a, "fill", 1000, 0.01, 0, 16, NULL, &st) == 0, "fill: %s",
          st.message);
    struct racer r[8];
    pthread_t th[8];
    for (int i = 0; i < 8; i++) {
        r[i].ch = a;
        snprintf(r[i].name, sizeof r[i].name, "race%d", i);
        pthread_create(&th[i], NULL, race, &r[i]);
    }
    int made = 0;
    for (int i = 0; i < 8; i++) {
        pthread_join(th[i], NULL);
        int held = t_shard_count(c.node[0].ch, r[i].name) +
                   t_shard_count(c.node[1].ch, r[i].name);
        if (r[i].code == 0) {
            made++;
            CHECK(held == 2, "%s made with %d shards", r[i].name, held);
        } else {
            CHECK(r[i].code == GRPC_STATUS_RESOURCE_EXHAUSTED, "%s: %d %s", r[i].name,
                  r[i].code, r[i].msg);
            CHECK(held == 0, "%s refused but %d shards left", r[i].name, held);
        }
    }
    printf("%d of 8 racing creates made\n", made);
    for (int i = 0; i < 2; i++) {
        budget_of(c.node[i].ch, &charged, &filters);
        CHECK(filters <= 12, "node %d holds %llu filters", i, (unsigned long long)filters);
    }
    cluster_stop(&c);
}

int main(int argc, char **argv)
{
    return cluster_test_main(argc, argv, test_budget);
}
