/* Integration tests of anti-entropy between the copies of a group (nodes
 * reading the topology; node_replicate.c), with no merger.
 *
 * usage: test_replicate NODE_BIN ROUTER_BIN TEST
 *   pull     one group of two copies, write quorum 1 (read quorum 2).  With
 *            copy 1 down, keys are acknowledged by copy 0 alone; copy 1,
 *            restarted, pulls them from copy 0 and then holds every one of
 *            them by itself (read through a router that asks copy 1 only).
 *            Keys written later with copy 0 down reach copy 0 the same way
 *            once it is back.
 *   stalled  three copies, W = 2, R = 2.  Copy 0 is stopped (SIGSTOP: hung,
 *            its port still open) and hashes are added to copy 2 alone (as
 *            a router's write that reached no other copy): copy 1 holds
 *            them before one pull from the stopped copy could have reached
 *            its 10 s deadline, so the hung copy does not hold back pulls
 *            from copy 2; copy 1's metrics show copy 0 passed over, then
 *            pulled from again once it runs (twice), and copy 0 gets the
 *            hashes too.
 *   keys     two copies, W = 1: after copy 1 caught up with copy 0, N keys
 *            added to copy 0 alone reach copy 1 as their hashes: copy 0
 *            sends 16 x N bytes of hashes (bloomgrid_pull_bytes_total
 *            {kind="hashes"}) and no page, and both copies end with the same
 *            bits (every page of each shard, pulled whole from both).
 *   keys_merge  the same with a page merged into copy 0 (PushPages) before
 *            the keys: the range holding the merge goes as pages, and the
 *            copies still end bit for bit the same.
 *   prune    three copies, W = 2, R = 2: copy 0's pull cursors per peer go
 *            back to the shards it holds after filters are created and
 *            dropped one after another, and once copy 2 is removed from the
 *            topology (SIGHUP) copy 0 keeps no cursor and no channel for it.
 */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/grpc.h>

#include "cluster.h"
#include "node_client.h"

#include "bloomgrid/v1/internal.pb-c.h"

#define NKEYS 3000
#define INTERVAL "50"
#define NHASHES 1000
#define S 2          /* shards of f in stalled */

static const char *test_name;

/* Wait until node i alone holds every key of k; false after timeout_ms. */
static bool wait_copy_has(struct cluster *c, int i, char **k, int timeout_ms)
{
    struct node_proc view = {0};
    bool all = false;
    /* A restarted copy reads once it has checked its epoch with its peer. */
    CHECK(cluster_wait_reads(c, i, timeout_ms), "copy %d does not answer reads", i);
    cluster_view_start(c, i, &view);
    for (int t = 0; t < timeout_ms && !all; t += 50) {
        all = keys_present(view.ch, "f", k, NKEYS, NULL) == NKEYS;
        if (!all)
            harness_sleep_ms(50);
    }
    node_stop(&view, SIGTERM);
    return all;
}

/* Wait (bounded) until the router reaches a restarted copy again: its
 * channel reconnects within the reconnect backoff (1 s at most). */
static void wait_writable(struct cluster *c)
{
    char *probe[] = {"probe"};
    bool out[1];
    struct rpc_status st;
    int code = -1;
    for (int i = 0; i < 100 && code != 0; i++)
        if ((code = t_keys(c->router[0].ch, "Add", "f", probe, 1, out, &st)) != 0)
            harness_sleep_ms(50);
    CHECK(code == 0, "writes stay refused: %s", st.message);
}

static void test_pull(void)
{
    struct cluster c;
    struct rpc_status st;
    const char *fast[] = {"--replicate-interval-ms", INTERVAL, NULL};

    cluster_start_copies(&c, "anti-entropy", 1, 2,
                         "write_quorum = 1\nread_quorum = 2\n", 1);
    CHECK(t_create_sharded(c.router[0].ch, "f", 100000, 0.01, 0, 2, NULL, &st) == 0,
          "create: %s", st.message);

    node_stop(&c.node[1], SIGKILL);
    char **k1 = keys_make("a", 0, NKEYS);
    keys_call(c.router[0].ch, "Add", "f", k1, NKEYS, 500, NULL);
    cluster_node_start(&c, 1, c.node[1].port, fast);
    CHECK(wait_copy_has(&c, 1, k1, 20000), "copy 1 did not pull the keys it missed");
    printf("copy 1 pulled the %d keys it missed\n", NKEYS);

    node_stop(&c.node[0], SIGKILL);
    wait_writable(&c);
    char **k2 = keys_make("b", 0, NKEYS);
    keys_call(c.router[0].ch, "Add", "f", k2, NKEYS, 500, NULL);
    cluster_node_start(&c, 0, c.node[0].port, fast);
    CHECK(wait_copy_has(&c, 0, k2, 20000), "copy 0 did not pull the keys it missed");
    CHECK(wait_copy_has(&c, 0, k1, 1000), "copy 0 lost keys");
    printf("copy 0 pulled the %d keys it missed\n", NKEYS);
    keys_free(k1, NKEYS);
    keys_free(k2, NKEYS);
    cluster_stop(&c);
}

/* How many of the hashes h node i holds in every shard of f (-1 when it
 * does not answer). */
static long copy_holds(struct cluster *c, int i, const uint8_t *h)
{
    static bool out[NHASHES];
    struct rpc_status st;
    long got = 0;
    for (unsigned s = 0; s < S; s++) {
        if (t_hashes(c->node[i].ch, "MayContainHashes", "f", s, h, NHASHES, false, out, &st) != 0)
            return -1;
        for (size_t k = 0; k < NHASHES; k++)
            got += out[k];
    }
    return got;
}

/* One sample of node i's series name{peer = node p's address}; NAN when
 * it is not served. */
static double peer_metric(struct cluster *c, int i, const char *name, int p)
{
    const char *const peer[1] = {c->node[p].addr};
    double v = NAN;
    CHECK(harness_scrape(c->node[i].maddr, name, "peer", peer, 1, &v) == 0,
          "GET /metrics of node %d", i);
    return v;
}

/* Wait (bounded) until node i's name{peer = node p} is want. */
static bool wait_peer_metric(struct cluster *c, int i, const char *name, int p,
                             double want)
{
    for (int t = 0; t < 200; t++) {
        if (peer_metric(c, i, name, p) == want)
            return true;
        harness_sleep_ms(50);
    }
    return false;
}

static void test_stalled(void)
{
    struct cluster c;
    struct rpc_status st;
    static uint8_t h[16 * NHASHES];
    static bool out[NHASHES];
    const char *flags[] = {"--metrics-listen", "127.0.0.1:0", "--replicate-interval-ms",
                           "100", NULL};
    const char *up = "bloomgrid_antientropy_peer_up";

    cluster_init(&c, "anti-entropy-stalled", "fsync");
    c.node_flags = flags;
    cluster_run_copies(&c, 1, 3, "write_quorum = 2\nread_quorum = 2\n", 1);
    CHECK(t_create_sharded(c.router[0].ch, "f", 100000, 0.01, 0, S, NULL, &st) == 0,
          "create: %s", st.message);
    srand(12);
    /* Twice: a copy stopping at any point of copy 1's rounds. */
    for (int trial = 0; trial < 2; trial++) {
        for (size_t k = 0; k < sizeof h; k++)
            h[k] = (uint8_t)rand();
        CHECK(harness_sigstop(c.node[0].pid) == 0, "SIGSTOP copy 0");
        for (unsigned s = 0; s < S; s++)
            CHECK(t_hashes(c.node[2].ch, "AddHashes", "f", s, h, NHASHES, false, out, &st) == 0,
                  "AddHashes on copy 2: %s", st.message);
        /* Well below the 10 s a pull from the stopped copy takes to fail,
         * with a wide margin for a loaded machine (this takes about a
         * second): the bound says that no pull from copy 2 waited for the
         * hung copy; it measures nothing. */
        double t0 = harness_now_s();
        long got;
        while ((got = copy_holds(&c, 1, h)) != S * NHASHES && harness_now_s() - t0 < 6.0)
            harness_sleep_ms(50);
        double took = harness_now_s() - t0;
        CHECK(got == S * NHASHES, "trial %d: copy 1 holds %ld of the %d hashes added to "
              "copy 2 %.1f s before, with copy 0 stopped: its pulls from copy 2 waited "
              "for copy 0", trial, got, S * NHASHES, took);
        printf("trial %d: copy 1 pulled the hashes from copy 2 in %.1f s, copy 0 "
               "stopped\n", trial, took);
        CHECK(wait_peer_metric(&c, 1, up, 0, 0), "copy 1 does not show stopped copy 0 "
              "passed over: %s = %f", up, peer_metric(&c, 1, up, 0));
        CHECK(peer_metric(&c, 1, up, 2) == 1, "copy 1 shows copy 2 passed over");

        /* Copy 0 runs again: pulled from again, and it pulls what it missed. */
        CHECK(kill(c.node[0].pid, SIGCONT) == 0, "SIGCONT copy 0");
        CHECK(wait_peer_metric(&c, 1, up, 0, 1), "copy 1 does not pull from copy 0 "
              "again once it runs: %s = %f", up, peer_metric(&c, 1, up, 0));
        for (int t = 0; t < 400 && (got = copy_holds(&c, 0, h)) != S * NHASHES; t++)
            harness_sleep_ms(50);
        CHECK(got == S * NHASHES, "copy 0, running again, holds %ld of %d hashes",
              got, S * NHASHES);
    }
    cluster_stop(&c);
}

/* Every page of shard sh of f on node i, pulled whole into *body (the
 * caller frees it); *len its bytes (up to the last non-empty page). */
struct whole {
    uint8_t *body;
    size_t len, cap;
};

static int whole_page(void *ctx, uint64_t off, const uint8_t *data, size_t len)
{
    struct whole *w = ctx;
    if (off + len > w->cap) {
        size_t cap = (off + len) * 2;
        uint8_t *nb = realloc(w->body, cap);
        if (!nb)
            return -1;
        memset(nb + w->cap, 0, cap - w->cap);
        w->body = nb;
        w->cap = cap;
    }
    memcpy(w->body + off, data, len);
    if (off + len > w->len)
        w->len = off + len;
    return 0;
}

static struct whole pull_whole(struct cluster *c, int i, unsigned sh, char *fp)
{
    struct whole w = {0};
    struct node_client_pull_end end;
    struct rpc_status st;
    CHECK(node_client_pull(c->node[i].ch, "f", sh, 0, 0, whole_page, &w, &end,
                           10000, &st) == 0, "pull of shard %u from copy %d: %s",
          sh, i, st.message);
    if (fp)
        memcpy(fp, end.fp, sizeof end.fp);
    return w;
}

/* Do copies 0 and 1 hold the same bits in every shard of f? */
static bool same_bits(struct cluster *c)
{
    bool same = true;
    for (unsigned sh = 0; sh < S && same; sh++) {
        struct whole a = pull_whole(c, 0, sh, NULL), b = pull_whole(c, 1, sh, NULL);
        same = a.len == b.len && (a.len == 0 || memcmp(a.body, b.body, a.len) == 0);
        free(a.body);
        free(b.body);
    }
    return same;
}

/* Copy i's bloomgrid_pull_bytes_total{kind} (NAN when not served: the
 * checks at the end then fail). */
static double pulled_bytes(struct cluster *c, int i, const char *kind)
{
    const char *const k[1] = {kind};
    double v = NAN;
    if (harness_scrape(c->node[i].maddr, "bloomgrid_pull_bytes_total", "kind", k,
                       1, &v) != 0)
        v = NAN;
    return v;
}

static void test_keys(bool merge)
{
    struct cluster c;
    struct rpc_status st;
    static uint8_t h[16 * NHASHES];
    static bool out[NHASHES];
    const char *flags[] = {"--metrics-listen", "127.0.0.1:0", "--replicate-interval-ms",
                           "100", NULL};
    const int rounds = 3;                     /* of NHASHES per shard */
    const double n = (double)S * rounds * NHASHES;

    cluster_init(&c, merge ? "anti-entropy-keys-merge" : "anti-entropy-keys", "fsync");
    c.node_flags = flags;
    cluster_run_copies(&c, 1, 2, "write_quorum = 1\nread_quorum = 2\n", 1);
    /* 2 M keys at 1 % in 2 shards: 1.2 MB of bits a shard, 19 pages of
     * 64 KiB each. */
    CHECK(t_create_sharded(c.router[0].ch, "f", 2000000, 0.01, 0, S, NULL, &st) == 0,
          "create: %s", st.message);
    srand(merge ? 29 : 28);
    for (size_t k = 0; k < sizeof h; k++)
        h[k] = (uint8_t)rand();
    for (unsigned s = 0; s < S; s++)
        CHECK(t_hashes(c.node[0].ch, "AddHashes", "f", s, h, NHASHES, false, out, &st) == 0,
              "AddHashes: %s", st.message);
    long got;
    for (int t = 0; t < 400 && (got = copy_holds(&c, 1, h)) != S * NHASHES; t++)
        harness_sleep_ms(50);
    CHECK(got == S * NHASHES, "copy 1 holds %ld of %d hashes", got, S * NHASHES);
    /* Settled: each copy has pulled from the other since (its cursor is
     * past every record so far); a second apart, nothing more moves. */
    double p0 = -1, h0 = -1;
    for (int t = 0; t < 20; t++) {
        harness_sleep_ms(1000);
        double p = pulled_bytes(&c, 0, "pages"), hh = pulled_bytes(&c, 0, "hashes");
        if (p == p0 && hh == h0)
            break;
        p0 = p;
        h0 = hh;
    }
    CHECK(same_bits(&c), "the copies differ before the test");
    /* (This test's own whole pulls are counted too: none from here to the
     * second reading.) */
    char fp[NODE_CLIENT_FP_LEN + 1];
    struct whole w = pull_whole(&c, 0, 0, fp);
    free(w.body);
    p0 = pulled_bytes(&c, 0, "pages");
    h0 = pulled_bytes(&c, 0, "hashes");
    const char *pb = "bloomgrid_antientropy_bytes_total";
    double b0 = peer_metric(&c, 1, pb, 0);

    if (merge) {
        /* A page ORed into copy 0's shard 0, as a merger's push. */
        static uint64_t page[8192];
        for (size_t k = 0; k < 8192; k += 97)
            page[k] = (uint64_t)rand() << 1 | 1;
        struct node_client_page pg = {0, page, sizeof page};
        uint64_t merged = 0;
        CHECK(node_client_push(c.node[0].ch, "f", 0, fp, 0, &pg, 1, &merged, 10000,
                               &st) == 0 && merged == 1, "push: %s", st.message);
    }
    for (int r = 0; r < rounds; r++) {
        for (size_t k = 0; k < sizeof h; k++)
            h[k] = (uint8_t)rand();
        for (unsigned s = 0; s < S; s++)
            CHECK(t_hashes(c.node[0].ch, "AddHashes", "f", s, h, NHASHES, false, out,
                           &st) == 0, "AddHashes: %s", st.message);
    }
    for (int t = 0; t < 400 && (got = copy_holds(&c, 1, h)) != S * NHASHES; t++)
        harness_sleep_ms(50);
    CHECK(got == S * NHASHES, "copy 1 holds %ld of the last %d hashes", got, S * NHASHES);
    harness_sleep_ms(1000);   /* the merged page's pull may come after the keys' */
    double dp = pulled_bytes(&c, 0, "pages") - p0, dh = pulled_bytes(&c, 0, "hashes") - h0;
    double db = peer_metric(&c, 1, pb, 0) - b0;
    bool same = false;
    for (int t = 0; t < 100 && !(same = same_bits(&c)); t++)
        harness_sleep_ms(100);
    CHECK(same, "the copies' bits differ after the pulls");
    printf("copy 0 sent %.0f bytes of hashes and %.0f bytes of pages for %.0f keys "
           "(16 x keys = %.0f; the shards' bits: %d x 1.2 MB); copy 1 counted %.0f "
           "bytes of pages pulled from it\n", dh, dp, n, 16 * n, S, db);
    if (!merge) {
        CHECK(dh >= 16 * n && dh <= 2 * 16 * n, "hashes sent: %.0f bytes, want about "
              "%.0f", dh, 16 * n);
        CHECK(dp == 0, "pages sent: %.0f bytes, want none", dp);
    } else {
        CHECK(dp > 0, "the range with a merge went as %.0f bytes of pages", dp);
        CHECK(dh <= 2 * 16 * n, "hashes sent: %.0f bytes", dh);
    }
    cluster_stop(&c);
}

static void test_prune(void)
{
    struct cluster c;
    struct rpc_status st;
    const char *flags[] = {"--metrics-listen", "127.0.0.1:0", "--replicate-interval-ms",
                           INTERVAL, NULL};
    const char *cur = "bloomgrid_antientropy_cursors";

    cluster_init(&c, "anti-entropy-prune", "fsync");
    c.node_flags = flags;
    cluster_run_copies(&c, 1, 3, "write_quorum = 2\nread_quorum = 2\n", 1);
    CHECK(t_create_sharded(c.router[0].ch, "f", 10000, 0.01, 0, 2, NULL, &st) == 0,
          "create: %s", st.message);
    CHECK(wait_peer_metric(&c, 0, cur, 1, 2) && wait_peer_metric(&c, 0, cur, 2, 2),
          "copy 0 keeps no cursor per peer for the 2 shards of f: %f, %f",
          peer_metric(&c, 0, cur, 1), peer_metric(&c, 0, cur, 2));

    /* Filters created and dropped one after another: the cursors of the
     * dropped shards go with them. */
    for (int i = 0; i < 5; i++) {
        char name[16];
        snprintf(name, sizeof name, "d%d", i);
        CHECK(t_create_sharded(c.router[0].ch, name, 10000, 0.01, 0, 2, NULL, &st) == 0,
              "create %s: %s", name, st.message);
        CHECK(wait_peer_metric(&c, 0, cur, 1, 4), "copy 0 does not pull %s: %s = %f",
              name, cur, peer_metric(&c, 0, cur, 1));
        CHECK(t_drop(c.router[0].ch, name, &st) == 0, "drop %s: %s", name, st.message);
        CHECK(wait_peer_metric(&c, 0, cur, 1, 2), "copy 0 keeps the cursors of "
              "dropped %s: %s = %f, expected 2 (f's shards)", name, cur,
              peer_metric(&c, 0, cur, 1));
    }

    /* Copy 2 leaves the group (copy 2 itself runs on, on the old file):
     * copy 0 forgets it. */
    c.topo_version++;
    FILE *f = fopen(c.topo, "w");
    CHECK(f, "open %s", c.topo);
    fprintf(f, "; test topology\nversion = %llu\nwrite_quorum = 2\nread_quorum = 1\n"
               "[group g0]\ncopies = %s %s\n", c.topo_version, c.node[0].addr,
            c.node[1].addr);
    CHECK(fclose(f) == 0, "write %s", c.topo);
    CHECK(kill(c.node[0].pid, SIGHUP) == 0, "SIGHUP copy 0");
    CHECK(wait_peer_metric(&c, 0, cur, 2, 0), "copy 0 keeps cursors for removed copy "
          "2: %s = %f", cur, peer_metric(&c, 0, cur, 2));
    CHECK(wait_peer_metric(&c, 0, "bloomgrid_antientropy_peer_up", 2, 0),
          "copy 0 still pulls from removed copy 2");
    CHECK(peer_metric(&c, 0, cur, 1) == 2, "copy 0 lost its cursors for copy 1");
    printf("copy 0 forgot the dropped shards and the removed copy\n");
    cluster_stop(&c);
}

static void run(void)
{
    if (!strcmp(test_name, "pull"))
        test_pull();
    else if (!strcmp(test_name, "stalled"))
        test_stalled();
    else if (!strcmp(test_name, "keys"))
        test_keys(false);
    else if (!strcmp(test_name, "keys_merge"))
        test_keys(true);
    else if (!strcmp(test_name, "prune"))
        test_prune();
    else
        CHECK(false, "unknown test %s", test_name);
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s NODE_BIN ROUTER_BIN TEST\n", argv[0]);
        return 2;
    }
    test_name = argv[3];
    return cluster_test_main(3, argv, run);
}
