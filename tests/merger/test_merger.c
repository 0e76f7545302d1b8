/* Integration tests of bloomgrid-merger: two loopback clusters ("dc1",
 * "dc2"), each with two groups of two copies ("p" and "r" nodes) and a
 * router, merged by real bloomgrid-merger processes.  A "view" router per
 * datacenter reads the r copies alone, to see what they hold.
 *
 * usage: test_merger NODE_BIN ROUTER_BIN MERGER_BIN TEST
 *   converge  disjoint keys added in each datacenter; after one round every
 *             key is present through both routers and on every r copy; a
 *             second round pulls the pushed pages back and pushes
 *             nothing, a third ships 0 bytes; keys added while a round runs are
 *             present after the next one; the daemon's RunRound and Status;
 *             with one copy of a group killed, the router still reads
 *             every key and refuses Add (write quorum 2 of 2) naming the
 *             copy
 *   kill      the merger killed (SIGKILL) between its pulls and its pushes,
 *             and again mid-push, then restarted: everything converges, and
 *             no r copy ever answers "absent" for a key it reported before
 *   refuse    a partial file of another filter is refused naming the field
 *             (secret), one of the same filter is merged; a shard re-created
 *             with another secret in one datacenter is refused; a partial
 *             that over-fills a shard is merged with a warning; a broken
 *             sources file is refused naming its line
 *   single    two stand-alone nodes named by address (no topology file)
 *             converge on an unsharded filter; one that loses its filter
 *             (an empty data directory, the shard re-created) is refilled
 *             by the next round
 *   keys      the same two nodes: once the rounds are quiet, keys added to
 *             one node reach the merger as their 16-byte hashes (the
 *             round's keys_pulled and bytes_pulled are 16 per key, no
 *             page), the other node gets them by the push (the node they
 *             came from is not pushed them back), and the saved
 *             snapshot is bit for bit the OR of both nodes' pages
 *   pushkeys  the same two nodes, quiet: after N keys added to one node
 *             the round pushes the other node exactly those keys' hashes
 *             (16 bytes a key, no page; bytes in proportion to N for two
 *             N), the node they came from gets nothing; the next round
 *             pulls them back from the other node as keys (the push was
 *             logged as adds there, so the pull is still keys) and pushes
 *             nothing; keys added on both nodes at once each reach the
 *             other as keys; every node holds every key
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <grpc/grpc.h>

#include "bf.h"
#include "bf_file.h"
#include "bloomgrid/v1/merger.pb-c.h"
#include "harness.h"
#include "merger_once.h"
#include "node_client.h"

#define NKEYS 20000
#define SHARDS 4

static const char *merger_bin;
static char tdir[512];

struct dc {
    const char *name;
    struct node_proc prim[2], repl[2];
    struct node_proc router, view;    /* view: the r copies alone */
    char topo[700], view_topo[700];
};

static struct dc dcs[2] = {{.name = "dc1"}, {.name = "dc2"}};
static char sources[700], mcfg[700], state_dir[700];

static void start_router(struct node_proc *p, const char *topo, const char *tag)
{
    char log[700];
    snprintf(log, sizeof log, "%s/%s.log", tdir, tag);
    const char *const flags[] = {"--node-timeout-ms", "3000", NULL};
    router_start(p, log, topo, flags);
}

static void write_topo(const char *path, const struct dc *d, bool view)
{
    FILE *f = fopen(path, "w");
    CHECK(f, "open %s", path);
    fprintf(f, "version = 1\n");
    for (int g = 0; g < 2; g++) {
        fprintf(f, "[group g%d]\n", g);
        if (view)
            fprintf(f, "copies = %s\n", d->repl[g].addr);
        else
            fprintf(f, "copies = %s %s\n", d->prim[g].addr, d->repl[g].addr);
        fprintf(f, "datacenter = %s\n\n", d->name);
    }
    fclose(f);
}

static void start_dcs(void)
{
    const char *fast[] = {"--durability", "none", NULL};

    for (int i = 0; i < 2; i++) {
        struct dc *d = &dcs[i];
        char dir[600];
        for (int g = 0; g < 2; g++) {
            snprintf(dir, sizeof dir, "%s/%s-p%d", tdir, d->name, g);
            node_start(&d->prim[g], dir, fast);
            CHECK(node_wait_health(&d->prim[g], true, 20000), "node not serving");
            snprintf(dir, sizeof dir, "%s/%s-r%d", tdir, d->name, g);
            node_start(&d->repl[g], dir, fast);
            CHECK(node_wait_health(&d->repl[g], true, 20000), "node not serving");
        }
        snprintf(d->topo, sizeof d->topo, "%s/%s.ini", tdir, d->name);
        snprintf(d->view_topo, sizeof d->view_topo, "%s/%s-view.ini", tdir,
                 d->name);
        write_topo(d->topo, d, false);
        write_topo(d->view_topo, d, true);
        char tag[32];
        snprintf(tag, sizeof tag, "%s-router", d->name);
        start_router(&d->router, d->topo, tag);
    }
}

/* The view routers read the r copies; start them once the r copies hold
 * the shards (a create through the router makes them on both copies). */
static void start_views(void)
{
    for (int i = 0; i < 2; i++) {
        char tag[32];
        snprintf(tag, sizeof tag, "%s-view", dcs[i].name);
        if (!dcs[i].view.pid)
            start_router(&dcs[i].view, dcs[i].view_topo, tag);
    }
}

static void stop_all(void)
{
    for (int i = 0; i < 2; i++) {
        node_stop(&dcs[i].router, SIGTERM);
        node_stop(&dcs[i].view, SIGTERM);
        for (int g = 0; g < 2; g++) {
            node_stop(&dcs[i].prim[g], SIGTERM);
            node_stop(&dcs[i].repl[g], SIGTERM);
        }
    }
}

static void write_merger_config(const char *partials)
{
    FILE *f;
    snprintf(sources, sizeof sources, "%s/sources.ini", tdir);
    snprintf(mcfg, sizeof mcfg, "%s/merger.ini", tdir);
    snprintf(state_dir, sizeof state_dir, "%s/merger-state", tdir);
    CHECK((f = fopen(sources, "w")), "sources");
    fprintf(f, "[filter f]\ndatacenter = dc1 %s\ndatacenter = dc2 %s\n%s",
            dcs[0].topo, dcs[1].topo, partials ? partials : "");
    fclose(f);
    CHECK((f = fopen(mcfg, "w")), "merger config");
    fprintf(f, "[merger]\nlisten = 127.0.0.1:0\nstate_dir = %s\nsources = %s\n"
            "interval_s = 3600\nnode_timeout_ms = 5000\nlog_level = debug\n", state_dir, sources);
    fclose(f);
}

/* One round as a process; pause_ms > 0: the test pause between pulls and
 * pushes; kill_after_ms > 0: killed (SIGKILL) after that long. */
static void merger_once(struct round_out *o, int pause_ms, int kill_after_ms)
{
    char pause[32];
    snprintf(pause, sizeof pause, "%d", pause_ms);
    const char *env[] = {"BLOOMGRID_MERGER_TEST_PAUSE_MS", pause, NULL};
    merger_once_run(merger_bin, mcfg, tdir, o, pause_ms ? env : NULL,
                    kill_after_ms, NULL);
}

static void check_everywhere(char **k, int n, const char *what)
{
    for (int i = 0; i < 2; i++) {
        int a = (int)keys_present(dcs[i].router.ch, "f", k, n, NULL);
        int b = (int)keys_present(dcs[i].view.ch, "f", k, n, NULL);
        CHECK(a == n, "%s: %d of %d keys through the %s router", what, a, n,
              dcs[i].name);
        CHECK(b == n, "%s: %d of %d keys on the %s r copies", what, b, n,
              dcs[i].name);
    }
}

static void setup(void)
{
    struct rpc_status st;
    harness_tmpdir(tdir, sizeof tdir, "merger");
    start_dcs();
    CHECK(t_create_sharded(dcs[0].router.ch, "f", 4000000, 0.01, 0, SHARDS, NULL, &st) == 0,
          "create: %s", st.message);
}

/* A first round creates the filter's shards in dc2. */
static void first_round(void)
{
    struct round_out o;
    merger_once(&o, 0, 0);
    CHECK(o.status == 0, "bootstrap round failed:\n%s", o.text);
    start_views();
}

static void test_converge(void)
{
    struct round_out o;
    setup();
    write_merger_config(NULL);
    first_round();

    char **k1 = keys_make("dc1", 0, NKEYS), **k2 = keys_make("dc2", 0, NKEYS);
    keys_call(dcs[0].router.ch, "Add", "f", k1, NKEYS, 5000, NULL);
    keys_call(dcs[1].router.ch, "Add", "f", k2, NKEYS, 5000, NULL);
    CHECK(keys_present(dcs[1].router.ch, "f", k1, NKEYS, NULL) < NKEYS / 10,
          "dc2 has dc1's keys before any round");
    merger_once(&o, 0, 0);
    CHECK(o.status == 0 && o.pulled > 0 && o.pushed > 0, "round 1:\n%s", o.text);
    check_everywhere(k1, NKEYS, "after round 1 (dc1 keys)");
    check_everywhere(k2, NKEYS, "after round 1 (dc2 keys)");

    /* The pushed pages changed the nodes, so the next round pulls them
     * back once (every puller hears of every change) and pushes nothing;
     * the one after is quiet. */
    merger_once(&o, 0, 0);
    CHECK(o.status == 0 && o.pushed == 0, "echo round pushed:\n%s", o.text);
    merger_once(&o, 0, 0);
    CHECK(o.status == 0 && o.pulled == 0 && o.pushed == 0,
          "a quiet round shipped bytes:\n%s", o.text);

    /* Keys added while a round runs (between its pulls and pushes). */
    char **k3 = keys_make("during", 0, 2000);
    pid_t pid = fork();
    CHECK(pid >= 0, "fork");
    if (pid == 0) {
        merger_once(&o, 1500, 0);
        _exit(o.status);
    }
    harness_sleep_ms(500);
    keys_call(dcs[0].router.ch, "Add", "f", k3, 2000, 5000, NULL);
    int ws;
    waitpid(pid, &ws, 0);
    CHECK(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "round during adds failed");
    merger_once(&o, 0, 0);
    CHECK(o.status == 0, "round after adds:\n%s", o.text);
    check_everywhere(k3, 2000, "keys added during a round, after the next");

    /* The daemon: RunRound returns the report, Status the totals. */
    char log[700];
    snprintf(log, sizeof log, "%s/merger-daemon.log", tdir);
    struct node_proc md;
    const char *argv[] = {merger_bin, "--config", mcfg, NULL};
    proc_spawn(&md, log, argv);
    struct rpc_status st;
    Bloomgrid__V1__RunRoundRequest rr = BLOOMGRID__V1__RUN_ROUND_REQUEST__INIT;
    Bloomgrid__V1__RoundReport *rep = NULL;
    CHECK(rpc_call(md.ch, "/bloomgrid.v1.Merger/RunRound", &rr.base,
                   &bloomgrid__v1__round_report__descriptor,
                   (ProtobufCMessage **)&rep, 60000, &st) == 0, "RunRound: %s",
          st.message);
    /* Nothing changed since the last --once round but its own pushes,
     * pulled back once: nothing to push (what every copy holds is kept
     * next to the snapshot). */
    CHECK(rep->errors == 0 && rep->bytes_pushed == 0,
          "daemon's first round: %llu pulled, %llu pushed, %u errors",
          (unsigned long long)rep->bytes_pulled,
          (unsigned long long)rep->bytes_pushed, rep->errors);
    bloomgrid__v1__round_report__free_unpacked(rep, NULL);
    CHECK(rpc_call(md.ch, "/bloomgrid.v1.Merger/RunRound", &rr.base,
                   &bloomgrid__v1__round_report__descriptor,
                   (ProtobufCMessage **)&rep, 60000, &st) == 0, "RunRound: %s",
          st.message);
    CHECK(rep->errors == 0 && rep->bytes_pulled == 0 && rep->bytes_pushed == 0,
          "daemon quiet round: %llu pulled, %llu pushed, %u errors",
          (unsigned long long)rep->bytes_pulled,
          (unsigned long long)rep->bytes_pushed, rep->errors);
    /* Groups of two copies, W = 2, R = 1: one copy pulled per group and
     * datacenter, every copy pushed without an error. */
    CHECK(rep->n_pulls == 2 * SHARDS && rep->uncovered == 0, "%zu group pulls, "
          "%u uncovered", rep->n_pulls, rep->uncovered);
    for (size_t i = 0; i < rep->n_pulls; i++)
        CHECK(rep->pulls[i]->covered && rep->pulls[i]->read_quorum == 1 &&
              rep->pulls[i]->n_pulled == 1 && rep->pulls[i]->n_not_asked == 1,
              "shard %u in %s: %zu pulled, %zu not asked", rep->pulls[i]->shard_index,
              rep->pulls[i]->datacenter, rep->pulls[i]->n_pulled,
              rep->pulls[i]->n_not_asked);
    CHECK(rep->n_targets == 4 * SHARDS, "%zu copies", rep->n_targets);
    for (size_t i = 0; i < rep->n_targets; i++)
        CHECK(!rep->targets[i]->error[0] && rep->targets[i]->lag_ms > 0,
              "copy %s shard %u: error \"%s\", lag %llu ms", rep->targets[i]->node,
              rep->targets[i]->shard_index, rep->targets[i]->error,
              (unsigned long long)rep->targets[i]->lag_ms);
    bloomgrid__v1__round_report__free_unpacked(rep, NULL);
    Bloomgrid__V1__MergerStatusRequest sr = BLOOMGRID__V1__MERGER_STATUS_REQUEST__INIT;
    Bloomgrid__V1__MergerStatus *ms = NULL;
    CHECK(rpc_call(md.ch, "/bloomgrid.v1.Merger/Status", &sr.base,
                   &bloomgrid__v1__merger_status__descriptor,
                   (ProtobufCMessage **)&ms, 10000, &st) == 0, "Status: %s",
          st.message);
    CHECK(ms->rounds >= 2 && ms->last && ms->last->round >= 2, "status rounds");
    bloomgrid__v1__merger_status__free_unpacked(ms, NULL);
    node_stop(&md, SIGTERM);

    /* One copy of g0 gone: reads still find every key on the other; a
     * write cannot reach its quorum (2 of 2) and says which copy failed. */
    node_stop(&dcs[0].prim[0], SIGKILL);
    CHECK(keys_present(dcs[0].router.ch, "f", k1, NKEYS, NULL) == NKEYS,
          "reads lost keys with one copy down");
    CHECK(keys_present(dcs[0].router.ch, "f", k2, NKEYS, NULL) == NKEYS,
          "reads lost keys with one copy down (dc2 keys)");
    bool *acked = calloc(64, 1);
    CHECK(t_keys(dcs[0].router.ch, "Add", "f", k3, 64, acked, &st) ==
              GRPC_STATUS_UNAVAILABLE && strstr(st.message, dcs[0].prim[0].addr),
          "Add with a copy down: %d %s", st.code, st.message);
    free(acked);

    keys_free(k1, NKEYS);
    keys_free(k2, NKEYS);
    keys_free(k3, 2000);
    stop_all();
}

static void test_kill(void)
{
    struct round_out o;
    setup();
    write_merger_config(NULL);
    first_round();

    char **k1 = keys_make("a", 0, NKEYS), **k2 = keys_make("b", 0, NKEYS);
    keys_call(dcs[0].router.ch, "Add", "f", k1, NKEYS, 5000, NULL);
    keys_call(dcs[1].router.ch, "Add", "f", k2, NKEYS, 5000, NULL);
    /* Killed after its pulls (and saves), before its pushes. */
    merger_once(&o, 3000, 1000);
    CHECK(o.status == 128 + SIGKILL, "merger not killed: %d", o.status);
    /* Nothing the r copies said before may be taken back. */
    bool *seen = calloc(NKEYS, 1), *now = calloc(NKEYS, 1);
    keys_present(dcs[1].view.ch, "f", k2, NKEYS, seen);
    /* Killed again, this time probably mid-push (small pause). */
    merger_once(&o, 10, 150);
    keys_present(dcs[1].view.ch, "f", k2, NKEYS, now);
    for (int i = 0; i < NKEYS; i++)
        CHECK(!seen[i] || now[i], "copy forgot key %s", k2[i]);
    merger_once(&o, 0, 0);
    CHECK(o.status == 0, "round after restarts:\n%s", o.text);
    check_everywhere(k1, NKEYS, "after kills (dc1 keys)");
    check_everywhere(k2, NKEYS, "after kills (dc2 keys)");
    merger_once(&o, 0, 0);
    CHECK(o.status == 0, "second round after restarts:\n%s", o.text);
    free(seen);
    free(now);
    keys_free(k1, NKEYS);
    keys_free(k2, NKEYS);
    stop_all();
}

static void test_refuse(void)
{
    struct round_out o;
    struct rpc_status st;
    struct node_client_shard sh;
    char err[BF_ERRLEN], bad[700], good[700], partials[1600];
    setup();
    write_merger_config(NULL);
    first_round();

    /* A partial of shard 1 with the filter's secret, and one with another. */
    unsigned g = 0;
    for (; g < 2; g++)
        if (node_client_get_shard(dcs[0].prim[g].ch, "f", 1, &sh, TIMEOUT_MS, &st) == 0)
            break;
    CHECK(g < 2, "shard 1 not found");
    struct bf *p = node_client_shard_filter(&sh, err);
    CHECK(p, "%s", err);
    char **all = keys_make("partial", 0, 5000);
    char **k = calloc(5000, sizeof *k);   /* the shard-1 keys of all */
    int n1 = 0;
    for (int i = 0; i < 5000; i++) {
        struct bf_hash h = bf_hash_key(p, all[i], strlen(all[i]));
        if (bf_hash_shard(h, SHARDS) == 1) {
            bf_add_hash(p, h);
            k[n1++] = all[i];
        }
    }
    snprintf(good, sizeof good, "%s/good.bf", tdir);
    CHECK(bf_file_save(p, good, err) == 0, "%s", err);
    bf_destroy(p);
    sh.secret[0] ^= 1;
    p = node_client_shard_filter(&sh, err);
    snprintf(bad, sizeof bad, "%s/bad.bf", tdir);
    CHECK(bf_file_save(p, bad, err) == 0, "%s", err);
    bf_destroy(p);
    snprintf(partials, sizeof partials, "partial = %s\npartial = %s\n", bad, good);
    write_merger_config(partials);
    merger_once(&o, 0, 0);
    CHECK(o.status == 1 && strstr(o.text, "bad.bf") &&
          strstr(o.text, "field \"secret\" differs"),
          "bad partial not refused naming the field:\n%s", o.text);
    check_everywhere(k, n1, "keys of the good partial");

    /* dc2 re-creates shard 2 with another secret: refused, not merged. */
    for (g = 0; g < 2; g++)
        if (node_client_get_shard(dcs[1].prim[g].ch, "f", 2, &sh, TIMEOUT_MS, &st) == 0)
            break;
    CHECK(g < 2, "shard 2 not found in dc2");
    Bloomgrid__V1__ShardRef ref = BLOOMGRID__V1__SHARD_REF__INIT;
    ref.filter = "f";
    ref.shard_index = 2;
    ProtobufCMessage *resp = NULL;
    CHECK(rpc_call(dcs[1].prim[g].ch, "/bloomgrid.v1.Internal/DropShard", &ref.base,
                   &bloomgrid__v1__drop_shard_response__descriptor, &resp,
                   TIMEOUT_MS, &st) == 0, "drop: %s", st.message);
    protobuf_c_message_free_unpacked(resp, NULL);
    sh.secret[5] ^= 0x40;
    CHECK(node_client_create_shard(dcs[1].prim[g].ch, "f", &sh, TIMEOUT_MS, &st) == 0,
          "re-create: %s", st.message);
    merger_once(&o, 0, 0);
    CHECK(o.status == 1 && strstr(o.text, "shard 2") &&
          (strstr(o.text, "secret") || strstr(o.text, "fingerprint")),
          "shard with another secret not refused:\n%s", o.text);
    free(k);
    keys_free(all, 5000);

    /* A partial that over-fills shard 3 is merged with a warning. */
    for (g = 0; g < 2; g++)
        if (node_client_get_shard(dcs[0].prim[g].ch, "f", 3, &sh, TIMEOUT_MS, &st) == 0)
            break;
    CHECK(g < 2, "shard 3 not found");
    p = node_client_shard_filter(&sh, err);
    uint64_t x = 1;
    for (int i = 0; i < 3000000; i++) {
        struct bf_hash h;
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        h.h1 = x;
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        h.h2 = x;
        bf_add_hash(p, h);
    }
    char full[700];
    snprintf(full, sizeof full, "%s/full.bf", tdir);
    CHECK(bf_file_save(p, full, err) == 0, "%s", err);
    bf_destroy(p);
    snprintf(partials, sizeof partials, "partial = %s\n", full);
    write_merger_config(partials);
    merger_once(&o, 0, 0);
    /* (The round still reports shard 2's other secret: exit 1.) */
    CHECK(strstr(o.text, "full.bf") && strstr(o.text, "exceeds the target"),
          "over-full partial not warned about:\n%s", o.text);

    /* A broken sources file is refused naming the file and line. */
    FILE *f = fopen(sources, "w");
    fprintf(f, "[filter f]\ndatacenter = dc1\n");
    fclose(f);
    merger_once(&o, 0, 0);
    char log[700], text[4096] = "";
    snprintf(log, sizeof log, "%s/merger.log", tdir);
    f = fopen(log, "r");
    CHECK(f, "merger log");
    fseek(f, 0, SEEK_END);
    long end = ftell(f);
    fseek(f, end > 4000 ? end - 4000 : 0, SEEK_SET);
    text[fread(text, 1, sizeof text - 1, f)] = 0;
    fclose(f);
    CHECK(o.status == 2 && strstr(text, "sources.ini:2"),
          "bad sources file: exit %d, log tail:\n%s", o.status, text);
    stop_all();
}

/* Two stand-alone nodes (no topology, no router) with an unsharded filter,
 * each named by its address in the sources file. */
static void test_single(void)
{
    struct node_proc a, b;
    char da[600], db[600];
    struct rpc_status st;
    struct round_out o;
    const char *fast[] = {"--durability", "none", NULL};

    harness_tmpdir(tdir, sizeof tdir, "merger-single");
    snprintf(da, sizeof da, "%s/a", tdir);
    snprintf(db, sizeof db, "%s/b", tdir);
    node_start(&a, da, fast);
    CHECK(node_wait_health(&a, true, 20000), "node not serving");
    node_start(&b, db, fast);
    CHECK(node_wait_health(&b, true, 20000), "node not serving");
    CHECK(t_create(a.ch, "f", 100000, 0.01, 1, &st) == 0, "create: %s", st.message);
    char **ka = keys_make("a", 0, 5000), **kb = keys_make("b", 0, 5000);
    keys_call(a.ch, "Add", "f", ka, 5000, 5000, NULL);
    write_merger_config(NULL);
    FILE *f = fopen(sources, "w");
    CHECK(f, "sources");
    fprintf(f, "[filter f]\ndatacenter = a %s\ndatacenter = b %s\n", a.addr,
            b.addr);
    fclose(f);
    merger_once(&o, 0, 0);
    CHECK(o.status == 0, "round 1:\n%s", o.text);
    CHECK(keys_present(b.ch, "f", ka, 5000, NULL) == 5000, "b lacks a's keys");
    keys_call(b.ch, "Add", "f", kb, 5000, 5000, NULL);
    merger_once(&o, 0, 0);
    CHECK(o.status == 0, "round 2:\n%s", o.text);
    CHECK(keys_present(a.ch, "f", kb, 5000, NULL) == 5000, "a lacks b's keys");
    merger_once(&o, 0, 0);
    CHECK(o.status == 0 && o.pushed == 0, "echo round:\n%s", o.text);
    merger_once(&o, 0, 0);
    CHECK(o.status == 0 && o.pulled == 0 && o.pushed == 0, "quiet:\n%s", o.text);

    /* b loses its filter (its disk: it starts on an empty directory and
     * the shard is re-created with the same secret; a drop could not be
     * undone so, it leaves a tombstone): its new epoch makes the merger
     * push it everything again. */
    struct node_client_shard sh;
    CHECK(node_client_get_shard(a.ch, "f", 0, &sh, TIMEOUT_MS, &st) == 0, "get: %s",
          st.message);
    node_stop(&b, SIGTERM);
    snprintf(db, sizeof db, "%s/b-new", tdir);
    node_start(&b, db, fast);
    CHECK(node_wait_health(&b, true, 20000), "node not serving");
    f = fopen(sources, "w");
    CHECK(f, "sources");
    fprintf(f, "[filter f]\ndatacenter = a %s\ndatacenter = b %s\n", a.addr,
            b.addr);
    fclose(f);
    CHECK(node_client_create_shard(b.ch, "f", &sh, TIMEOUT_MS, &st) == 0, "re-create: %s",
          st.message);
    CHECK(keys_present(b.ch, "f", kb, 5000, NULL) < 100, "re-created filter not empty");
    merger_once(&o, 0, 0);
    CHECK(o.status == 0, "round after re-create:\n%s", o.text);
    CHECK(keys_present(b.ch, "f", ka, 5000, NULL) == 5000 &&
          keys_present(b.ch, "f", kb, 5000, NULL) == 5000,
          "re-created filter not refilled");
    keys_free(ka, 5000);
    keys_free(kb, 5000);
    node_stop(&a, SIGTERM);
    node_stop(&b, SIGTERM);
}

/* Every page of f on ch ORed into body (len bytes). */
struct or_body {
    uint8_t *body;
    size_t len;
};

static int or_page(void *ctx, uint64_t off, const uint8_t *data, size_t len)
{
    struct or_body *o = ctx;
    if (off + len > o->len)
        return -1;
    for (size_t i = 0; i < len; i++)
        o->body[off + i] |= data[i];
    return 0;
}

static unsigned long long text_field(const char *text, const char *name)
{
    const char *p = strstr(text, name);
    CHECK(p, "no %s in the round's report:\n%s", name, text);
    return strtoull(p + strlen(name), NULL, 10);
}

static void test_keys(void)
{
    struct node_proc a, b;
    char da[600], db[600], path[800], err[BF_ERRLEN];
    struct rpc_status st;
    struct round_out o;
    const char *fast[] = {"--durability", "none", NULL};
    const int n = 3000;

    harness_tmpdir(tdir, sizeof tdir, "merger-keys");
    snprintf(da, sizeof da, "%s/a", tdir);
    snprintf(db, sizeof db, "%s/b", tdir);
    node_start(&a, da, fast);
    CHECK(node_wait_health(&a, true, 20000), "node not serving");
    node_start(&b, db, fast);
    CHECK(node_wait_health(&b, true, 20000), "node not serving");
    /* 1 M keys at 1 %: 1.2 MB of bits, 19 pages of 64 KiB. */
    CHECK(t_create(a.ch, "f", 1000000, 0.01, 1, &st) == 0, "create: %s", st.message);
    char **ka = keys_make("a", 0, 5000), **kb = keys_make("b", 0, n);
    keys_call(a.ch, "Add", "f", ka, 5000, 5000, NULL);
    write_merger_config(NULL);
    FILE *f = fopen(sources, "w");
    CHECK(f, "sources");
    fprintf(f, "[filter f]\ndatacenter = a %s\ndatacenter = b %s\n", a.addr,
            b.addr);
    fclose(f);
    /* The first rounds pull pages (full pulls, then b's pushed pages back);
     * then nothing moves. */
    for (int r = 0; r < 4; r++) {
        merger_once(&o, 0, 0);
        CHECK(o.status == 0, "round %d:\n%s", r, o.text);
    }
    CHECK(o.pulled == 0 && o.pushed == 0, "not quiet:\n%s", o.text);

    keys_call(a.ch, "Add", "f", kb, n, 1000, NULL);
    merger_once(&o, 0, 0);
    CHECK(o.status == 0, "round with keys:\n%s", o.text);
    unsigned long long keys = text_field(o.text, "keys_pulled ");
    unsigned long long pages = text_field(o.text, "pages_pulled ");
    printf("keys round: %llu keys, %llu pages, %llu bytes pulled (16 x %d = %d)\n",
           keys, pages, o.pulled, n, 16 * n);
    CHECK(keys == (unsigned long long)n && pages == 0 && o.pulled == 16ull * n,
          "the keys' round pulled %llu keys, %llu pages, %llu bytes:\n%s", keys,
          pages, o.pulled, o.text);
    CHECK(keys_present(b.ch, "f", kb, n, NULL) == (size_t)n, "b lacks the keys");
    unsigned long long pushed = o.pushed;

    /* The snapshot is the OR of both nodes' pages. */
    snprintf(path, sizeof path, "%s/f/shard-0000.bf", state_dir);
    int code = 0;
    struct bf *snap = bf_file_load(path, err, &code);
    CHECK(snap, "snapshot %s: %s", path, err);
    struct bf_layer_info li;
    CHECK(bf_layer_info(snap, 0, &li) == 0, "snapshot layer");
    /* Pushed to b alone: a, whose keys they were, holds those pages. */
    CHECK(pushed > 0 && pushed <= li.body_bytes, "the keys' round pushed %llu "
          "bytes (the body: %llu)", pushed, (unsigned long long)li.body_bytes);
    struct or_body ob = {calloc(1, li.body_bytes), li.body_bytes};
    struct node_client_pull_end end;
    CHECK(ob.body, "memory");
    CHECK(node_client_pull(a.ch, "f", 0, 0, 0, or_page, &ob, &end, TIMEOUT_MS, &st) == 0 &&
          node_client_pull(b.ch, "f", 0, 0, 0, or_page, &ob, &end, TIMEOUT_MS, &st) == 0,
          "pull: %s", st.message);
    CHECK(memcmp(bf_layer_body_const(snap, 0), ob.body, li.body_bytes) == 0,
          "the snapshot differs from the OR of the nodes' pages");
    free(ob.body);
    bf_destroy(snap);
    keys_free(ka, 5000);
    keys_free(kb, n);
    node_stop(&a, SIGTERM);
    node_stop(&b, SIGTERM);
}

/* One round with keys added: what it pulled and pushed, from the report. */
struct keys_round {
    unsigned long long keys_pulled, pages_pulled, keys_pushed, pages_pushed;
    unsigned long long pulled, pushed;
};

static void keys_round(struct keys_round *k, const char *what)
{
    struct round_out o;

    merger_once(&o, 0, 0);
    CHECK(o.status == 0, "%s:\n%s", what, o.text);
    k->keys_pulled = text_field(o.text, "keys_pulled ");
    k->pages_pulled = text_field(o.text, "pages_pulled ");
    k->keys_pushed = text_field(o.text, "keys_pushed ");
    k->pages_pushed = o.pages_pushed;
    k->pulled = o.pulled;
    k->pushed = o.pushed;
    printf("%s: pulled %llu keys %llu pages (%llu bytes), pushed %llu keys "
           "%llu pages (%llu bytes)\n", what, k->keys_pulled, k->pages_pulled,
           k->pulled, k->keys_pushed, k->pages_pushed, k->pushed);
}

static void test_pushkeys(void)
{
    struct node_proc a, b;
    char da[600], db[600];
    struct rpc_status st;
    struct round_out o;
    struct keys_round k;
    const char *fast[] = {"--durability", "none", NULL};
    enum { N1 = 1000, N2 = 4000 };

    harness_tmpdir(tdir, sizeof tdir, "merger-pushkeys");
    snprintf(da, sizeof da, "%s/a", tdir);
    snprintf(db, sizeof db, "%s/b", tdir);
    node_start(&a, da, fast);
    CHECK(node_wait_health(&a, true, 20000), "node not serving");
    node_start(&b, db, fast);
    CHECK(node_wait_health(&b, true, 20000), "node not serving");
    /* 4 M keys at 1 %: 4.8 MB of bits, 74 pages of 64 KiB. */
    CHECK(t_create(a.ch, "f", 4000000, 0.01, 1, &st) == 0, "create: %s",
          st.message);
    char **k0 = keys_make("zero", 0, 5000), **k1 = keys_make("one", 0, N1);
    char **k2 = keys_make("two", 0, N2), **ka = keys_make("ka", 0, N1);
    char **kb = keys_make("kb", 0, N1);
    keys_call(a.ch, "Add", "f", k0, 5000, 5000, NULL);
    write_merger_config(NULL);
    FILE *f = fopen(sources, "w");
    CHECK(f, "sources");
    fprintf(f, "[filter f]\ndatacenter = a %s\ndatacenter = b %s\n", a.addr,
            b.addr);
    fclose(f);
    for (int r = 0; r < 4; r++) {
        merger_once(&o, 0, 0);
        CHECK(o.status == 0, "round %d:\n%s", r, o.text);
    }
    CHECK(o.pulled == 0 && o.pushed == 0, "not quiet:\n%s", o.text);

    /* N keys on a: b is pushed their hashes, a nothing (it holds them); a
     * key whose bits were all set already adds nothing and is not sent. */
    unsigned long long per[2];
    for (int i = 0; i < 2; i++) {
        int n = i ? N2 : N1;
        keys_call(a.ch, "Add", "f", i ? k2 : k1, n, 1000, NULL);
        keys_round(&k, "round after adds on a");
        CHECK(k.keys_pulled == (unsigned long long)n && k.pages_pulled == 0,
              "pulled %llu keys, %llu pages", k.keys_pulled, k.pages_pulled);
        CHECK(k.pages_pushed == 0 && k.keys_pushed <= (unsigned long long)n &&
              k.keys_pushed >= (unsigned long long)n * 95 / 100 &&
              k.pushed == 16 * k.keys_pushed,
              "after %d keys on a the round pushed %llu keys and %llu pages "
              "(%llu bytes): not the keys' hashes to b alone", n,
              k.keys_pushed, k.pages_pushed, k.pushed);
        CHECK(keys_present(b.ch, "f", i ? k2 : k1, n, NULL) == (size_t)n,
              "b lacks keys of a");
        per[i] = k.pushed;
        /* b logged them as adds: its next pull is keys again, which change
         * nothing, so nothing is pushed. */
        keys_round(&k, "round after the push");
        CHECK(k.pages_pulled == 0 && k.keys_pulled >= per[i] / 16 &&
              k.pulled == 16 * k.keys_pulled && k.pushed == 0,
              "the round after a push of keys pulled %llu pages, %llu keys "
              "(%llu bytes) and pushed %llu bytes", k.pages_pulled,
              k.keys_pulled, k.pulled, k.pushed);
        keys_round(&k, "quiet round");
        CHECK(k.pulled == 0 && k.pushed == 0, "not quiet");
    }
    CHECK(per[1] >= 3 * per[0] && per[1] <= 5 * per[0],
          "bytes pushed for %d and %d keys: %llu and %llu, not in proportion",
          N1, N2, per[0], per[1]);

    /* Keys on both: each gets the other's, as keys. */
    keys_call(a.ch, "Add", "f", ka, N1, 1000, NULL);
    keys_call(b.ch, "Add", "f", kb, N1, 1000, NULL);
    keys_round(&k, "round after adds on both");
    CHECK(k.pages_pulled == 0 && k.pages_pushed == 0 &&
          k.keys_pushed >= 2ull * N1 * 95 / 100 && k.keys_pushed <= 2ull * N1 &&
          k.pushed == 16 * k.keys_pushed,
          "adds on both: pushed %llu keys and %llu pages", k.keys_pushed,
          k.pages_pushed);
    char **all[] = {k0, k1, k2, ka, kb};
    const int alln[] = {5000, N1, N2, N1, N1};
    for (int i = 0; i < 5; i++) {
        CHECK(keys_present(a.ch, "f", all[i], alln[i], NULL) == (size_t)alln[i],
              "a lacks keys (set %d)", i);
        CHECK(keys_present(b.ch, "f", all[i], alln[i], NULL) == (size_t)alln[i],
              "b lacks keys (set %d)", i);
    }
    keys_round(&k, "round after the pushes");
    CHECK(k.pages_pulled == 0 && k.pushed == 0, "pages or pushes after keys");
    keys_free(k0, 5000);
    keys_free(k1, N1);
    keys_free(k2, N2);
    keys_free(ka, N1);
    keys_free(kb, N1);
    node_stop(&a, SIGTERM);
    node_stop(&b, SIGTERM);
}

int main(int argc, char **argv)
{
    CHECK(argc >= 5, "usage: test_merger NODE_BIN ROUTER_BIN MERGER_BIN TEST");
    harness_node_bin = argv[1];
    harness_router_bin = argv[2];
    merger_bin = argv[3];
    signal(SIGPIPE, SIG_IGN);
    grpc_init();
    if (!strcmp(argv[4], "converge"))
        test_converge();
    else if (!strcmp(argv[4], "kill"))
        test_kill();
    else if (!strcmp(argv[4], "refuse"))
        test_refuse();
    else if (!strcmp(argv[4], "single"))
        test_single();
    else if (!strcmp(argv[4], "keys"))
        test_keys();
    else if (!strcmp(argv[4], "pushkeys"))
        test_pushkeys();
    else
        CHECK(0, "unknown test %s", argv[4]);
    grpc_shutdown();
    printf("ok\n");
    return 0;
}
