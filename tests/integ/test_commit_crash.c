/* The node's commit path under kill -9: 32 concurrent writers of one key
 * each, through a router, into a filter of 64 shards on two nodes (so every
 * node log holds records of many shards, written by many handler threads).
 * The nodes are killed with SIGKILL one after the other and restarted;
 * after each restart, and at the end, every key whose Add was acknowledged
 * must be present.
 *
 * usage: test_commit_crash NODE_BIN ROUTER_BIN
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <grpc/grpc.h>

#include "cluster.h"

#define WRITERS 32
#define SHARDS 64
#define ROUNDS 8
#define MAXKEYS 100000   /* per writer */

struct writer {
    int id;
    struct rpc_channel *ch;
    atomic_bool *stop;
    atomic_size_t tried;            /* keys [0, tried) were sent */
    atomic_bool *acked;             /* MAXKEYS flags */
    atomic_size_t nacked;
    pthread_t thr;
};

static void key_of(char *buf, size_t len, int w, size_t i)
{
    snprintf(buf, len, "w%d-%zu", w, i);
}

static void *writer_main(void *p)
{
    struct writer *w = p;
    char key[32], *keys[1] = {key};
    struct rpc_status st;
    bool out;

    for (size_t i = 0; i < MAXKEYS && !atomic_load(w->stop); i++) {
        key_of(key, sizeof key, w->id, i);
        int rc = t_keys(w->ch, "Add", "many", keys, 1, &out, &st);
        if (rc == 0) {
            atomic_store(&w->acked[i], true);
            atomic_fetch_add(&w->nacked, 1);
        } else {
            harness_sleep_ms(5);   /* a node is down: not acknowledged */
        }
        atomic_store(&w->tried, i + 1);
    }
    return NULL;
}

/* Every acknowledged key of every writer is present through the router. */
static size_t check_acked(struct cluster *c, struct writer *w, int round)
{
    size_t checked = 0;

    for (int t = 0; t < WRITERS; t++) {
        size_t n = atomic_load(&w[t].tried), k = 0;
        char **keys = malloc((n ? n : 1) * sizeof *keys);
        size_t *idx = malloc((n ? n : 1) * sizeof *idx);
        for (size_t i = 0; i < n; i++)
            if (atomic_load(&w[t].acked[i])) {
                keys[k] = malloc(32);
                key_of(keys[k], 32, t, i);
                idx[k++] = i;
            }
        bool *present = malloc((k ? k : 1) * sizeof *present);
        for (size_t b = 0; b < k; b += 2000) {
            size_t m = k - b < 2000 ? k - b : 2000;
            struct rpc_status st;
            int rc = -1;
            /* The router reconnects to a restarted node after a backoff:
             * until then its shards answer UNAVAILABLE, never "absent". */
            for (int tries = 0; tries < 300 && rc != 0; tries++) {
                rc = t_keys(c->router[0].ch, "MayContain", "many", keys + b, m,
                            present + b, &st);
                if (rc != 0) {
                    CHECK(rc == GRPC_STATUS_UNAVAILABLE, "MayContain: %s",
                          st.message);
                    harness_sleep_ms(50);
                }
            }
            CHECK(rc == 0, "MayContain never answered: %s", st.message);
        }
        for (size_t i = 0; i < k; i++) {
            CHECK(present[i], "round %d: LOST acknowledged key w%d-%zu", round, t,
                  idx[i]);
            free(keys[i]);
        }
        checked += k;
        free(present);
        free(idx);
        free(keys);
    }
    return checked;
}

static void test_commit_crash(void)
{
    static struct cluster c;
    static struct writer w[WRITERS];
    const char *const flags[] = {"--threads", "32", "--snapshot-interval", "1",
                                 "--snapshot-wal-mb", "1", NULL};
    struct rpc_status st;
    atomic_bool stop = false;
    size_t checks = 0;

    cluster_init(&c, "commit_crash", "fsync");
    for (int i = 0; i < 2; i++)
        cluster_node_start(&c, i, 0, flags);
    c.nnodes = 2;
    cluster_write_topo(&c, 2, false, NULL);
    cluster_router_start(&c, 0, NULL);
    c.nrouters = 1;
    CHECK(t_create_sharded(c.router[0].ch, "many", 2000000, 0.01, 0, SHARDS, NULL,
                           &st) == 0, "create: %s", st.message);
    for (int t = 0; t < WRITERS; t++) {
        w[t].id = t;
        w[t].ch = c.router[0].ch;
        w[t].stop = &stop;
        w[t].acked = calloc(MAXKEYS, sizeof *w[t].acked);
        pthread_create(&w[t].thr, NULL, writer_main, &w[t]);
    }
    srand((unsigned)time(NULL));
    for (int round = 0; round < ROUNDS; round++) {
        harness_sleep_ms(300 + rand() % 700);
        /* Mid-write: handler threads of many shards are in the commit loop. */
        cluster_node_restart(&c, round % 2, SIGKILL, flags);
        checks += check_acked(&c, w, round);
    }
    atomic_store(&stop, true);
    size_t acked = 0, tried = 0;
    for (int t = 0; t < WRITERS; t++) {
        pthread_join(w[t].thr, NULL);
        acked += atomic_load(&w[t].nacked);
        tried += atomic_load(&w[t].tried);
    }
    checks += check_acked(&c, w, ROUNDS);
    CHECK(acked > 1000, "only %zu keys acknowledged", acked);
    printf("  %d kill -9 rounds, %d writers, %d shards: %zu of %zu single-key Adds "
           "acknowledged, %zu key checks, 0 lost\n", ROUNDS, WRITERS, SHARDS, acked,
           tried, checks);
    for (int t = 0; t < WRITERS; t++)
        free(w[t].acked);
    cluster_stop(&c);
}

int main(int argc, char **argv)
{
    return cluster_test_main(argc, argv, test_commit_crash);
}
