/* A copy's memory and safety while it pulls a whole shard from its group
 * (docs/REPLICATION.md, "Pulls applied as they arrive"): one group of two
 * copies (W = 2, R = 1) behind a router, one filter of one shard of about
 * 64 MiB of bits, 100 000 keys added (every 64 KiB page of the shard holds
 * some).
 *
 * usage: test_router_pull_memory NODE_BIN ROUTER_BIN peak
 *        test_router_pull_memory NODE_BIN ROUTER_BIN killed SLOW_FSYNC_LIBRARY
 *
 * peak: copy 1 is wiped and restarts empty; it re-creates the shard and
 *   pulls all of it from copy 0 before it leaves SYNCING.  Its peak
 *   resident memory (VmHWM, the whole life of the new process) stays
 *   within its RSS before the wipe (when it held the same bits) + 48 MiB
 *   (what the allocator may keep free before it gives pages back, the
 *   log's buffers): the pull is ORed in 4 MiB at a time as it arrives, and
 *   the channel's receive window is 1 MiB.  A copy that held
 *   the whole pull until its last message (the fingerprint that vouched
 *   for it came last) held a second copy of the shard's 64 MiB (the test
 *   fails there).  It then holds every key by itself.
 * killed: copy 1 is wiped and restarts empty with its log's fdatasyncs
 *   held (slow_fsync.c) from its start on, so that its full pull cannot
 *   complete: it is killed (SIGKILL) inside a held fdatasync, with the
 *   pieces of the pull it received ORed in and written but not synced.
 *   Restarted with copy 0 stopped, it must not serve reads (its shard is
 *   SYNCING: the pieces it holds do not make a verified full pull); with
 *   copy 0 back, a later pull completes, it leaves SYNCING and holds every
 *   key by itself.
 *
 * BLOOMGRID_TEST_SIZE_MB sets the shard's MiB of bits (64) for a
 * measurement at another size.
 */
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <grpc/grpc.h>

#include "cluster.h"

#define NKEYS 100000

/* Capacity of about mb MiB of bits at 1 %: 64 unless BLOOMGRID_TEST_SIZE_MB
 * says otherwise (a measurement at another size; keys stay 100 000). */
static uint64_t capacity(void)
{
    const char *e = getenv("BLOOMGRID_TEST_SIZE_MB");
    uint64_t mb = e && atoi(e) > 0 ? (uint64_t)atoi(e) : 64;
    return mb * 859375;
}

static const char *slow_lib;

/* The group, the filter and its keys; returns the shard's bytes. */
static uint64_t setup(struct cluster *c, const char *tag, char ***keys)
{
    struct rpc_status st;
    Bloomgrid__V1__FilterInfo *fi = NULL;

    cluster_start_copies(c, tag, 1, 2, "write_quorum = 2\nread_quorum = 1\n", 1);
    CHECK(t_create_sharded(c->router[0].ch, "f", capacity(), 0.01, 0, 1, &fi, &st) == 0,
          "create: %s", st.message);
    uint64_t bytes = fi->bytes;
    bloomgrid__v1__filter_info__free_unpacked(fi, NULL);
    *keys = keys_make("k", 0, NKEYS);
    keys_call(c->router[0].ch, "Add", "f", *keys, NKEYS, 1000, NULL);
    return bytes;
}

/* Every key, read from copy i alone. */
static void all_keys_on(struct cluster *c, int i, char **k)
{
    struct node_proc view = {0};

    cluster_view_start(c, i, &view);
    size_t on = keys_present(view.ch, "f", k, NKEYS, NULL);
    node_stop(&view, SIGTERM);
    CHECK(on == NKEYS, "copy %d holds %zu of %d keys by itself", i, on, NKEYS);
    printf("copy %d holds every key by itself\n", i);
}

static void test_peak(void)
{
    struct cluster c;
    char **k;
    uint64_t bytes = setup(&c, "pull-peak", &k);

    uint64_t before = harness_status_bytes(c.node[1].pid, "VmRSS");
    cluster_node_wipe(&c, 1);
    CHECK(cluster_wait_reads(&c, 1, 120000), "the wiped copy does not leave SYNCING");
    uint64_t peak = harness_status_bytes(c.node[1].pid, "VmHWM");
    uint64_t rss = harness_status_bytes(c.node[1].pid, "VmRSS");
    printf("shard of %" PRIu64 " MiB: copy 1 RSS %" PRIu64 " MiB before the wipe; "
           "after its full pull RSS %" PRIu64 " MiB, peak %" PRIu64 " MiB\n",
           bytes >> 20, before >> 20, rss >> 20, peak >> 20);
    CHECK(peak <= before + (48u << 20), "the full pull of a %" PRIu64 " MiB shard "
          "raised the copy's peak to %" PRIu64 " MiB (%" PRIu64 " MiB before the "
          "wipe): a second copy of the pull was held", bytes >> 20, peak >> 20,
          before >> 20);
    all_keys_on(&c, 1, k);
    keys_free(k, NKEYS);
    cluster_stop(&c);
}

static void test_killed(void)
{
    struct cluster c;
    char **k;
    char gate[700], held[720], cmd[700];

    setup(&c, "pull-killed", &k);
    snprintf(gate, sizeof gate, "%s/wal.gate", c.dir);
    harness_fsync_gate(gate, "/wal-", held, sizeof held);

    /* Wiped and started with the library while copy 0 is stopped (nothing
     * to pull from yet); then its log's fdatasyncs are held and copy 0
     * goes on: no full pull can complete. */
    CHECK(harness_sigstop(c.node[0].pid) == 0, "cannot stop copy 0");
    node_stop(&c.node[1], SIGKILL);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", c.node_dir[1]);
    CHECK(system(cmd) == 0, "%s", cmd);
    harness_preload_begin(slow_lib);
    cluster_node_start(&c, 1, c.node[1].port, NULL);
    harness_preload_end();
    FILE *g = fopen(gate, "w");
    CHECK(g && fclose(g) == 0, "cannot create %s", gate);
    kill(c.node[0].pid, SIGCONT);
    for (int i = 0; i < 6000 && access(held, F_OK) != 0; i++)
        harness_sleep_ms(10);
    CHECK(access(held, F_OK) == 0, "copy 1 never reached a log fdatasync");
    /* Let the pull go on to its held piece (a puller that held the whole
     * pull would receive all of it now). */
    harness_sleep_ms(1500);
    node_stop(&c.node[1], SIGKILL);
    unlink(gate);
    printf("copy 1 killed inside a held fdatasync of its log\n");

    /* Alone, it has no copy to complete a full pull from. */
    node_stop(&c.node[0], SIGKILL);
    cluster_node_start(&c, 1, c.node[1].port, NULL);
    CHECK(!cluster_wait_reads(&c, 1, 3000), "copy 1 serves reads after an "
          "interrupted full pull, with its only peer stopped");
    int state = t_shard_state(c.node[1].ch, "f", 0);
    CHECK(state == -1 || state == BLOOMGRID__V1__FILTER_STATE__FILTER_STATE_SYNCING,
          "copy 1's shard is in state %d after an interrupted full pull", state);
    printf("restarted alone: not serving reads, shard %s\n",
           state == -1 ? "not created yet" : "SYNCING");

    /* Copy 0 back: a later pull completes. */
    cluster_node_start(&c, 0, c.node[0].port, NULL);
    CHECK(cluster_wait_reads(&c, 1, 120000), "copy 1 does not leave SYNCING once "
          "copy 0 is back");
    CHECK(cluster_wait_reads(&c, 0, 60000), "copy 0 does not serve after its restart");
    all_keys_on(&c, 1, k);
    keys_free(k, NKEYS);
    cluster_stop(&c);
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: %s NODE_BIN ROUTER_BIN peak | killed "
                "SLOW_FSYNC_LIBRARY\n", argv[0]);
        return 2;
    }
    void (*fn)(void) = NULL;
    if (strcmp(argv[3], "peak") == 0) {
        fn = test_peak;
    } else if (strcmp(argv[3], "killed") == 0 && argc >= 5) {
        slow_lib = argv[4];
        fn = test_killed;
    }
    if (!fn) {
        fprintf(stderr, "%s: unknown scenario %s (killed needs the slow_fsync "
                "library)\n", argv[0], argv[3]);
        return 2;
    }
    char *cargv[] = {argv[0], argv[1], argv[2], NULL};
    return cluster_test_main(3, cargv, fn);
}
