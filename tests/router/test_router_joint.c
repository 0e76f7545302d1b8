/* Changing a group's copies, and a copy restored from an older copy of its
 * data directory (docs/REPLICATION.md): one group of three copies, W = 2,
 * R = 2, behind a router, nodes reading the topology.
 *
 * usage: test_router_joint NODE_BIN ROUTER_BIN TEST
 *   replace  copy 2 is replaced by a new empty node (node 3) while a
 *            writer adds keys through the router, by the steps of the
 *            docs: copies_next (node 3 joins), node 3's health SERVING
 *            (an Import then reaches node 3 at once, as writes do),
 *            copies_prev (reads from the new copies), the new copies
 *            alone.  After every step every acknowledged key reads
 *            "maybe"; in the joint phase a write that the next copies do
 *            not take at W is UNAVAILABLE; at the end node 2 is stopped,
 *            every key still reads "maybe", and node 3 alone holds them.
 *   restore  copy 0 is stopped, its data directory copied, and it is
 *            started again; keys k2 are acknowledged by copies 0 and 1
 *            (copy 2 down); copy 0 is stopped, its old directory put
 *            back, and started: it hears from copy 1 that its directory
 *            is older, and every shard is SYNCING (on disk).  With copy 1
 *            stopped, no k2 key reads "no" through the router (copy 2
 *            never had them, copy 0 lost them: without the check both
 *            answer "no"), and copy 0 refuses reads; once copy 1 is back,
 *            copy 0 pulls and, by itself, holds every key.
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/grpc.h>

#include "bundle.h"
#include "bytebuf.h"
#include "cluster.h"

#define S 4          /* shards */
#define BATCH 20     /* keys per write of the writer */
#define MAXKEYS 400000

static const char *test_name;

/* ---- topology steps ---- */

/* Write version v of the topology with the group's lines body. */
static void write_topo(struct cluster *c, unsigned long long v, const char *body)
{
    char tmp[700];
    snprintf(tmp, sizeof tmp, "%s.tmp", c->topo);
    FILE *f = fopen(tmp, "w");
    CHECK(f, "cannot write %s", tmp);
    fprintf(f, "; test topology\nversion = %llu\nwrite_quorum = 2\nread_quorum = 2\n"
               "[group g0]\n%s", v, body);
    CHECK(fclose(f) == 0 && rename(tmp, c->topo) == 0, "cannot write %s", c->topo);
    c->topo_version = v;
}

/* SIGHUP the router and the nodes listed (-1 ends the list). */
static void reload(struct cluster *c, const int *nodes)
{
    for (int i = 0; nodes[i] >= 0; i++)
        CHECK(kill(c->node[nodes[i]].pid, SIGHUP) == 0, "SIGHUP node %d", nodes[i]);
    CHECK(kill(c->router[0].pid, SIGHUP) == 0, "SIGHUP router");
}

/* ---- the writer ---- */

struct writer {
    struct cluster *c;
    struct rpc_channel *ch;     /* its own channel to the router */
    atomic_size_t acked;        /* keys w0 .. w(acked - 1) are acknowledged */
    atomic_bool stop;
    size_t failed;              /* calls that failed (retried) */
    pthread_t th;
};

static void key_name(char *buf, size_t len, size_t i)
{
    snprintf(buf, len, "w%07zu", i);
}

/* Add keys in batches, each until it is acknowledged, recording how many
 * are.  A failed write (a reload in progress) is written again. */
static void *writer_main(void *arg)
{
    struct writer *w = arg;
    char names[BATCH][24];
    char *k[BATCH];
    bool out[BATCH];
    struct rpc_status st;
    size_t next = 0;

    while (!atomic_load(&w->stop) && next + BATCH <= MAXKEYS) {
        for (int j = 0; j < BATCH; j++) {
            key_name(names[j], sizeof names[j], next + (size_t)j);
            k[j] = names[j];
        }
        if (t_keys(w->ch, "Add", "f", k, BATCH, out, &st) != 0) {
            w->failed++;
            harness_sleep_ms(20);
            continue;
        }
        next += BATCH;
        atomic_store(&w->acked, next);
    }
    return NULL;
}

static void writer_start(struct writer *w, struct cluster *c)
{
    char a[64];
    memset(w, 0, sizeof *w);
    w->c = c;
    snprintf(a, sizeof a, "127.0.0.1:%d", c->router[0].port);
    w->ch = rpc_channel_create(a, 0);
    CHECK(w->ch, "writer channel");
    CHECK(pthread_create(&w->th, NULL, writer_main, w) == 0, "writer thread");
}

static void writer_stop(struct writer *w)
{
    atomic_store(&w->stop, true);
    pthread_join(w->th, NULL);
    rpc_channel_destroy(w->ch);
}

/* Read keys w0 .. w(n-1) through the router: each "maybe".  A call
 * refused while the topology is being reloaded (FAILED_PRECONDITION) or a
 * quorum short (UNAVAILABLE) is asked again; a "no" fails at once. */
static void check_acked(struct cluster *c, size_t n, const char *when)
{
    enum { CHUNK = 500 };
    static char names[CHUNK][24];
    char *k[CHUNK];
    bool out[CHUNK];
    struct rpc_status st;
    size_t retries = 0;

    for (size_t b = 0; b < n;) {
        size_t m = n - b < CHUNK ? n - b : CHUNK;
        for (size_t j = 0; j < m; j++) {
            key_name(names[j], sizeof names[j], b + j);
            k[j] = names[j];
        }
        int code = t_keys(c->router[0].ch, "MayContain", "f", k, m, out, &st);
        if (code == GRPC_STATUS_FAILED_PRECONDITION || code == GRPC_STATUS_UNAVAILABLE) {
            CHECK(++retries < 300, "%s: reads stay refused: %d %s", when, code,
                  st.message);
            harness_sleep_ms(100);
            continue;
        }
        CHECK(code == 0, "%s: MayContain: %d %s", when, code, st.message);
        for (size_t j = 0; j < m; j++)
            CHECK(out[j], "%s: acknowledged key %s reads \"no\"", when, k[j]);
        b += m;
    }
    printf("%s: %zu acknowledged keys \"maybe\"\n", when, n);
}

/* Let the writer acknowledge at least n more keys (bounded). */
static size_t writer_progress(struct writer *w, size_t n)
{
    size_t from = atomic_load(&w->acked);
    for (int t = 0; t < 600 && atomic_load(&w->acked) < from + n; t++)
        harness_sleep_ms(50);
    size_t now = atomic_load(&w->acked);
    CHECK(now >= from + n, "the writer is stuck at %zu keys (%zu failed calls)", now,
          w->failed);
    return now;
}

static void test_replace(void)
{
    struct cluster c;
    struct rpc_status st;
    struct writer w;
    char body[1024];

    cluster_start_copies(&c, "router-joint-replace", 1, 3, NULL, 1);
    CHECK(t_create_sharded(c.router[0].ch, "f", 200000, 0.01, 0, S, NULL, &st) == 0,
          "create: %s", st.message);
    writer_start(&w, &c);
    check_acked(&c, writer_progress(&w, 200), "copies 0 1 2");

    /* Node 3: a new machine with an empty data directory.  Its port is
     * known once it listens: started alone first, then in the topology. */
    c.node_topo = false;
    cluster_node_start(&c, 3, 0, NULL);
    node_stop(&c.node[3], SIGTERM);
    c.node_topo = true;

    /* Step 1: node 3 joins; writes go to both sets, reads to the copies. */
    snprintf(body, sizeof body, "copies = %s %s %s\ncopies_next = %s %s %s\n",
             c.node[0].addr, c.node[1].addr, c.node[2].addr, c.node[0].addr, c.node[1].addr,
             c.node[3].addr);
    write_topo(&c, 2, body);
    reload(&c, (const int[]){0, 1, 2, -1});
    cluster_node_start(&c, 3, c.node[3].port, NULL);
    check_acked(&c, writer_progress(&w, 200), "copies_next: node 3 joining");

    /* A write needs W of each set: with nodes 1 and 3 stopped, copies 0
     * and 2 would take it, but only one of the next copies. */
    harness_sigstop(c.node[1].pid);
    harness_sigstop(c.node[3].pid);
    char *probe[] = {"probe-joint"};
    bool out[1];
    int code = t_keys(c.router[0].ch, "Add", "f", probe, 1, out, &st);
    kill(c.node[1].pid, SIGCONT);
    kill(c.node[3].pid, SIGCONT);
    CHECK(code == GRPC_STATUS_UNAVAILABLE && strstr(st.message, "copies_next"),
          "a write the next copies did not take: %d %s", code, st.message);
    printf("a write short of the next copies' quorum: UNAVAILABLE (%s)\n", st.message);

    /* Node 3 says when it holds what the copies hold. */
    CHECK(cluster_wait_reads(&c, 3, 120000), "node 3 does not report in sync");
    printf("node 3 reports in sync (public health SERVING)\n");
    check_acked(&c, writer_progress(&w, 200), "node 3 in sync");

    /* An Import is a write: it reaches the joining copy too, at once (not
     * only through node 3's next pull from the others). */
    uint8_t *buf = NULL;
    size_t blen = t_export(c.router[0].ch, "f", &buf, &st);
    CHECK(blen > 0, "Export: %s", st.message);
    char err[256];
    struct bundle *b = bundle_parse(buf, blen, err);
    CHECK(b, "export: %s", err);
    free(buf);
    enum { NI = 500 };
    char **ik = keys_make("imported", 0, NI);
    size_t ilens[NI];
    for (int i = 0; i < NI; i++)
        ilens[i] = strlen(ik[i]);
    bundle_add_keys(b, (const void *const *)ik, ilens, NI);
    struct bytebuf bb;
    bytebuf_init(&bb, SIZE_MAX);
    CHECK(bundle_write(b, bytebuf_write, &bb) == 0, "bundle");
    bundle_destroy(b);
    CHECK(t_import(c.router[0].ch, "f", bb.p, bb.len, NULL, &st) == 0, "Import in the "
          "joint phase: %s", st.message);
    bytebuf_deinit(&bb);
    struct node_proc iview = {0};
    cluster_view_start(&c, 3, &iview);
    size_t got = keys_present(iview.ch, "f", ik, NI, NULL);
    node_stop(&iview, SIGTERM);
    CHECK(got == NI, "the joining copy holds %zu of %d imported keys right after the "
          "Import", got, (int)NI);
    printf("an Import in the joint phase reached the joining copy\n");
    keys_free(ik, NI);

    /* Step 2: reads from the new copies; writes still reach node 2. */
    snprintf(body, sizeof body, "copies = %s %s %s\ncopies_prev = %s %s %s\n",
             c.node[0].addr, c.node[1].addr, c.node[3].addr, c.node[0].addr, c.node[1].addr,
             c.node[2].addr);
    write_topo(&c, 3, body);
    reload(&c, (const int[]){0, 1, 2, 3, -1});
    check_acked(&c, writer_progress(&w, 200), "copies 0 1 3, copies_prev 0 1 2");

    /* Step 3: the new copies alone; node 2 is no longer listed. */
    snprintf(body, sizeof body, "copies = %s %s %s\n", c.node[0].addr, c.node[1].addr,
             c.node[3].addr);
    write_topo(&c, 4, body);
    reload(&c, (const int[]){0, 1, 3, -1});
    check_acked(&c, writer_progress(&w, 200), "copies 0 1 3");
    writer_stop(&w);
    size_t n = atomic_load(&w.acked);
    printf("writer: %zu keys acknowledged, %zu calls failed and retried\n", n, w.failed);

    node_stop(&c.node[2], SIGTERM);
    check_acked(&c, n, "node 2 stopped");
    /* Node 3 by itself, once anti-entropy caught up. */
    char **k = malloc(n * sizeof *k);
    CHECK(k, "memory");
    for (size_t i = 0; i < n; i++) {
        k[i] = malloc(24);
        CHECK(k[i], "memory");
        key_name(k[i], 24, i);
    }
    struct node_proc view = {0};
    cluster_view_start(&c, 3, &view);
    size_t on3 = 0;
    for (int t = 0; t < 300 && (on3 = keys_present(view.ch, "f", k, n, NULL)) < n; t++)
        harness_sleep_ms(100);
    node_stop(&view, SIGTERM);
    CHECK(on3 == n, "node 3 alone holds %zu of %zu keys", on3, n);
    printf("node 3 alone holds every acknowledged key\n");
    keys_free(k, n);
    cluster_stop(&c);
}

/* ---- restore ---- */

#define NK 1000

/* How many shards DIR/SYNCING lists (the marks on disk, not a hold). */
static int syncing_listed(const char *dir)
{
    char path[700], line[256];
    snprintf(path, sizeof path, "%s/SYNCING", dir);
    FILE *f = fopen(path, "r");
    int n = -1;
    if (!f)
        return 0;
    while (fgets(line, sizeof line, f))
        n++;
    fclose(f);
    return n;
}

static void sh(const char *fmt, const char *a, const char *b)
{
    char cmd[1600];
    snprintf(cmd, sizeof cmd, fmt, a, b);
    CHECK(system(cmd) == 0, "%s", cmd);
}

/* Read k through the router: answered with every key "maybe", or
 * UNAVAILABLE; never "no".  Returns whether it was answered. */
static bool never_no(struct cluster *c, char **k, const char *when)
{
    return t_never_no(c->router[0].ch, "f", k, NK, when);
}

static void test_restore(void)
{
    struct cluster c;
    struct rpc_status st;
    char backup[700];
    /* Anti-entropy slow enough that no copy pulls k2 before the checks. */
    const char *slow[] = {"--replicate-interval-ms", "60000", NULL};
    const int X = 0, P = 1, Q = 2;

    cluster_start_copies(&c, "router-joint-restore", 1, 3, NULL, 1);
    CHECK(t_create_sharded(c.router[0].ch, "f", 100000, 0.01, 0, S, NULL, &st) == 0,
          "create: %s", st.message);
    char **k1 = keys_make("k1", 0, NK);
    keys_call(c.router[0].ch, "Add", "f", k1, NK, 500, NULL);

    /* A copy of copy X's data directory, taken while it is stopped. */
    snprintf(backup, sizeof backup, "%s.backup", c.node_dir[X]);
    node_stop(&c.node[X], SIGTERM);
    sh("cp -a '%s' '%s'", c.node_dir[X], backup);
    cluster_node_start(&c, X, c.node[X].port, NULL);
    CHECK(cluster_wait_reads(&c, X, 20000), "copy X does not answer reads");

    /* k2: acknowledged by X and P (Q down). */
    node_stop(&c.node[Q], SIGKILL);
    char **k2 = keys_make("k2", 0, NK);
    for (int t = 0; t < 100; t++) {
        bool out[1];
        char *probe[] = {"probe"};
        if (t_keys(c.router[0].ch, "Add", "f", probe, 1, out, &st) == 0)
            break;
        harness_sleep_ms(100);
    }
    keys_call(c.router[0].ch, "Add", "f", k2, NK, 500, NULL);
    printf("k2 acknowledged by copies X and P\n");

    /* X's old directory put back. */
    node_stop(&c.node[X], SIGTERM);
    sh("rm -rf '%s' && mkdir '%s'", c.node_dir[X], c.node_dir[X]);
    sh("cp -a '%s'/. '%s'", backup, c.node_dir[X]);
    cluster_node_start(&c, Q, c.node[Q].port, slow);
    cluster_node_start(&c, X, c.node[X].port, slow);
    for (int t = 0; t < 200 && syncing_listed(c.node_dir[X]) < S; t++)
        harness_sleep_ms(100);
    CHECK(syncing_listed(c.node_dir[X]) == S, "the restored copy lists %d SYNCING shards",
          syncing_listed(c.node_dir[X]));
    for (uint32_t s = 0; s < S; s++)
        CHECK(t_shard_state(c.node[X].ch, "f", s) ==
                  BLOOMGRID__V1__FILTER_STATE__FILTER_STATE_SYNCING,
              "restored copy: shard %u not SYNCING", s);
    printf("restored copy: every shard SYNCING\n");

    /* P stopped: X (restored) and Q (down when k2 was written) alone. */
    node_stop(&c.node[P], SIGKILL);
    struct node_proc view = {0};
    cluster_view_start(&c, X, &view);
    bool vo[NK];
    int code = t_keys(view.ch, "MayContain", "f", k2, NK, vo, &st);
    node_stop(&view, SIGTERM);
    CHECK(code == GRPC_STATUS_UNAVAILABLE && strstr(st.message, "syncing"),
          "the restored copy answers reads: %d %s", code, st.message);
    int answered = 0;
    for (int r = 0; r < 4; r++)
        answered += never_no(&c, k2, "restored copy, P stopped");
    printf("reads with P stopped: %d of 4 answered, none \"no\"\n", answered);

    /* P back; X restarted with anti-entropy at the default pace. */
    cluster_node_start(&c, P, c.node[P].port, NULL);
    node_stop(&c.node[X], SIGTERM);
    cluster_node_start(&c, X, c.node[X].port, NULL);
    CHECK(cluster_wait_reads(&c, X, 60000), "the restored copy does not leave SYNCING");
    cluster_view_start(&c, X, &view);
    CHECK(keys_present(view.ch, "f", k1, NK, NULL) == NK &&
              keys_present(view.ch, "f", k2, NK, NULL) == NK,
          "the restored copy lacks acknowledged keys after leaving SYNCING");
    node_stop(&view, SIGTERM);
    CHECK(never_no(&c, k1, "after SYNCING") && never_no(&c, k2, "after SYNCING"),
          "reads not answered with every copy up");
    printf("restored copy left SYNCING holding every key\n");
    keys_free(k1, NK);
    keys_free(k2, NK);
    cluster_stop(&c);
}

static void test(void)
{
    if (strcmp(test_name, "replace") == 0)
        test_replace();
    else if (strcmp(test_name, "restore") == 0)
        test_restore();
    else
        CHECK(0, "unknown test %s", test_name);
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s NODE_BIN ROUTER_BIN replace|restore\n", argv[0]);
        return 2;
    }
    test_name = argv[3];
    return cluster_test_main(3, argv, test);
}
