/* Undoing a drop through a router (docs/BACKUP.md and docs/REPLICATION.md,
 * "Undoing a drop"): one group of three copies, W = 2, R = 2, a filter of
 * 4 shards.
 *
 * usage: test_router_undrop NODE_BIN ROUTER_BIN CLI_BIN copies|refuse
 *
 *   copies  `bloomgrid backup`, then the filter dropped.  A plain `restore`
 *           refuses it naming --undrop and creates nothing; `restore
 *           --undrop` brings it back with its secret (the same fingerprint)
 *           and every key, READY on every copy, each of which alone holds
 *           every key, at one generation.  A drop that misses a stopped
 *           copy is not undone by anti-entropy from it (it holds the
 *           filter at the generation of the tombstones), though a shard
 *           it holds that was never dropped is re-created on the others
 *           meanwhile.  With a copy killed, `restore --undrop` undrops the
 *           filter on the two others (the import then stops at the dead
 *           copy, and says to run it again); the dead copy's data directory
 *           still holds its tombstones; keys are added through the router;
 *           once it is back, anti-entropy lifts its tombstones and brings it
 *           the filter, which it holds alone with every key added meanwhile
 *           (and, after the restore is run again, every key of the backup).
 *   refuse  an undrop of a name that exists under another secret is refused
 *           (FAILED_PRECONDITION, SECRET_MISMATCH) and changes nothing; one
 *           that a copy refuses part-way (a shard of another secret there)
 *           is rolled back on every copy: no shard of the filter is left
 *           and every copy still refuses the secret as dropped; one with
 *           two copies stopped (short of the write quorum) is rolled back
 *           on the third; with every copy up it goes through, and once more
 *           is ALREADY_EXISTS.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <grpc/grpc.h>

#include "cluster.h"
#include "node_client.h"

#define NKEYS 2000
#define S 4

static const char *cli_bin;
static char out_path[700], err_path[700];

/* Run the CLI with args (NULL-terminated) against server; its stdout and
 * stderr go to out_path and err_path.  Returns its exit status. */
static int cli(const char *server, const char *const *args)
{
    const char *argv[32] = {cli_bin, "--server", server};
    int a = 3;
    for (int i = 0; args[i] && a < 31; i++)
        argv[a++] = args[i];
    argv[a] = NULL;
    unlink(out_path);
    unlink(err_path);
    return harness_run(argv, out_path, err_path, NULL, 0);
}

static bool said(const char *path, const char *needle)
{
    return harness_log_count(path, needle) > 0;
}

/* CreateFilter of "f" (S shards) with secret (NULL: random) and undrop;
 * returns the status code, the fingerprint into fp (may be NULL). */
static int create_f(struct rpc_channel *ch, const uint8_t *secret, bool undrop,
                    char *fp, struct rpc_status *st)
{
    Bloomgrid__V1__CreateFilterRequest rq = BLOOMGRID__V1__CREATE_FILTER_REQUEST__INIT;
    Bloomgrid__V1__FilterInfo *fi = NULL;

    rq.name = "f";
    rq.capacity = 100000;
    rq.error_rate = 0.01;
    rq.shards = S;
    rq.undrop = undrop;
    if (secret) {
        rq.secret.data = (uint8_t *)secret;
        rq.secret.len = BF_SECRET_LEN;
    }
    if (rpc_call(ch, "/bloomgrid.v1.BloomGrid/CreateFilter", &rq.base,
                 &bloomgrid__v1__filter_info__descriptor, (ProtobufCMessage **)&fi,
                 60000, st) < 0)   /* stopped copies cost the router timeouts */
        return st->code;
    if (fp)
        snprintf(fp, 17, "%s", fi->fingerprint);
    bloomgrid__v1__filter_info__free_unpacked(fi, NULL);
    return 0;
}

/* GetShard of shard s of "f" on ch: its generation and fingerprint; the
 * status code (NOT_FOUND when the copy lacks it). */
static int shard_get(struct rpc_channel *ch, uint32_t s, uint64_t *gen, char *fp)
{
    Bloomgrid__V1__GetShardRequest q = BLOOMGRID__V1__GET_SHARD_REQUEST__INIT;
    Bloomgrid__V1__InternalShardInfo *isi = NULL;
    struct rpc_status st;

    q.filter = "f";
    q.shard_index = s;
    if (rpc_call(ch, "/bloomgrid.v1.Internal/GetShard", &q.base,
                 &bloomgrid__v1__internal_shard_info__descriptor,
                 (ProtobufCMessage **)&isi, TIMEOUT_MS, &st) != 0)
        return st.code;
    *gen = isi->generation;
    snprintf(fp, 17, "%s", isi->info && isi->info->fingerprint ? isi->info->fingerprint : "");
    bloomgrid__v1__internal_shard_info__free_unpacked(isi, NULL);
    return 0;
}

/* Does the data directory of node i hold a tombstone of store name sname
 * ("d" line of DIR/.tombstones, or a line of its first format)? */
static bool tombstoned(struct cluster *c, int i, const char *sname)
{
    char path[700], line[512];
    bool found = false;
    snprintf(path, sizeof path, "%s/.tombstones", c->node_dir[i]);
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    while (fgets(line, sizeof line, f)) {
        size_t len = strlen(line), nl = strlen(sname);
        if (line[0] == 'u' || len < nl + 2 || line[len - 1] != '\n')
            continue;
        line[--len] = 0;
        if (line[len - nl - 1] == ' ' && strcmp(line + len - nl, sname) == 0)
            found = true;
    }
    fclose(f);
    return found;
}

static void shard_name(char *out, size_t len, uint32_t s)
{
    snprintf(out, len, "f.shard-%u", s);
}

/* How many of the keys k copy i holds alone (read through a view router). */
static size_t copy_holds(struct cluster *c, int i, char **k, size_t n)
{
    struct node_proc view = {0};
    cluster_view_start(c, i, &view);
    size_t got = keys_present(view.ch, "f", k, n, NULL);
    node_stop(&view, SIGTERM);
    return got;
}

/* The secret of "f" (shard 0 on copy ch). */
static void secret_of(struct rpc_channel *ch, uint8_t *secret)
{
    struct node_client_shard sh;
    struct rpc_status st;
    CHECK(node_client_get_shard(ch, "f", 0, &sh, TIMEOUT_MS, &st) == 0, "get: %s",
          st.message);
    memcpy(secret, sh.secret, BF_SECRET_LEN);
}

static void start(struct cluster *c, const char *tag, const char *const *node_flags)
{
    cluster_init(c, tag, "fsync");
    c->node_flags = node_flags;
    cluster_run_copies(c, 1, 3, "write_quorum = 2\nread_quorum = 2\n", 1);
    snprintf(out_path, sizeof out_path, "%s/cli.out", c->dir);
    snprintf(err_path, sizeof err_path, "%s/cli.err", c->dir);
}

static void test_copies(void)
{
    struct cluster c;
    struct rpc_status st;
    char bak[700], fp0[17], fp[17], sname[32];
    uint64_t gen = 0;

    start(&c, "router-undrop", NULL);
    struct rpc_channel *rt = c.router[0].ch;
    CHECK(create_f(rt, NULL, false, fp0, &st) == 0, "create: %s", st.message);
    char **k = keys_make("k", 0, NKEYS);
    keys_call(rt, "Add", "f", k, NKEYS, 500, NULL);
    snprintf(bak, sizeof bak, "%s/bak", c.dir);
    CHECK(cli(c.router[0].addr, (const char *[]){"backup", bak, NULL}) == 0,
          "backup failed");
    CHECK(t_drop(rt, "f", &st) == 0, "drop: %s", st.message);

    /* A plain restore refuses the dropped filter, naming --undrop. */
    CHECK(cli(c.router[0].addr, (const char *[]){"restore", bak, NULL}) == 2,
          "a plain restore of a dropped filter did not fail");
    CHECK(said(err_path, "restore --undrop"), "a plain restore does not name --undrop");
    for (int i = 0; i < 3; i++)
        CHECK(t_shard_count(c.node[i].ch, "f") == 0, "copy %d holds shards after "
              "a refused restore", i);
    printf("plain restore of a dropped filter: refused, naming --undrop\n");

    /* restore --undrop: its secret, every key, READY on every copy, one
     * generation; each copy alone holds every key. */
    CHECK(cli(c.router[0].addr, (const char *[]){"restore", "--undrop", bak, NULL}) == 0,
          "restore --undrop failed");
    Bloomgrid__V1__FilterInfo *fi;
    CHECK(t_get(rt, "f", &fi, &st) == 0, "get: %s", st.message);
    CHECK(strcmp(fi->fingerprint, fp0) == 0, "undropped with fingerprint %s, not %s",
          fi->fingerprint, fp0);
    bloomgrid__v1__filter_info__free_unpacked(fi, NULL);
    CHECK(keys_present(rt, "f", k, NKEYS, NULL) == NKEYS, "keys missing after the undrop");
    uint64_t gen0 = 0;
    for (int i = 0; i < 3; i++) {
        for (uint32_t s = 0; s < S; s++) {
            CHECK(t_shard_state(c.node[i].ch, "f", s) ==
                      BLOOMGRID__V1__FILTER_STATE__FILTER_STATE_READY,
                  "copy %d shard %u not READY after the undrop", i, s);
            CHECK(shard_get(c.node[i].ch, s, &gen, fp) == 0, "GetShard");
            CHECK(gen > 0 && (!gen0 || gen == gen0), "copy %d shard %u generation "
                  "%llu (others %llu)", i, s, (unsigned long long)gen,
                  (unsigned long long)gen0);
            gen0 = gen;
            shard_name(sname, sizeof sname, s);
            CHECK(!tombstoned(&c, i, sname), "copy %d keeps a tombstone of %s", i, sname);
        }
        CHECK(copy_holds(&c, i, k, NKEYS) == NKEYS, "copy %d alone lacks keys", i);
    }
    printf("restore --undrop: the same fingerprint, every key on each copy, "
           "generation %llu\n", (unsigned long long)gen0);

    /* A drop that misses a stopped copy: the router's drop fails (shard 0
     * stays on every copy, shards 1-3 stay on the stopped one).  The stopped
     * copy, back, holds shards 1-3 at the generation of the others'
     * tombstones: they do not take them back.  A shard it holds that was
     * never dropped ("probe", made on it alone) is re-created on the others
     * meanwhile: anti-entropy had its chance. */
    CHECK(harness_sigstop(c.node[2].pid) == 0, "SIGSTOP");
    CHECK(t_drop(rt, "f", &st) != 0, "a drop with a copy stopped succeeded");
    kill(c.node[2].pid, SIGCONT);
    struct node_client_shard probe = {.shard_index = 0, .shard_count = 1,
                                      .kind = 1, .capacity = 1000, .error_rate = 0.01};
    memset(probe.secret, 0x3c, sizeof probe.secret);
    CHECK(node_client_create_shard(c.node[2].ch, "probe", &probe, TIMEOUT_MS, &st) == 0,
          "probe: %s", st.message);
    for (int i = 0; i < 2; i++) {
        int t = 0;
        while (t_shard_count(c.node[i].ch, "probe") < 1 && t++ < 600)
            harness_sleep_ms(100);
        CHECK(t < 600, "copy %d never re-created the probe", i);
        CHECK(t_shard_count(c.node[i].ch, "f") == 1, "copy %d took dropped shards "
              "back from the copy the drop missed (%d shards)", i,
              t_shard_count(c.node[i].ch, "f"));
    }
    CHECK(t_drop(rt, "f", &st) == 0, "retried drop: %s", st.message);
    for (int i = 0; i < 3; i++)
        CHECK(t_shard_count(c.node[i].ch, "f") == 0, "copy %d holds f after the drop", i);
    printf("a drop that missed a copy: nothing taken back from it\n");

    /* A copy down during the undrop keeps its tombstones; once back, anti-
     * entropy lifts them and brings it the filter. */
    int port2 = c.node[2].port;
    node_stop(&c.node[2], SIGKILL);
    CHECK(cli(c.router[0].addr, (const char *[]){"restore", "--undrop", bak, NULL}) == 2,
          "restore --undrop with a copy down: the import did not stop at it");
    CHECK(said(err_path, "the filter was created: run the restore again"),
          "the restore does not say to run it again");
    for (int i = 0; i < 2; i++)
        CHECK(t_shard_count(c.node[i].ch, "f") == S, "copy %d lacks undropped shards", i);
    for (uint32_t s = 0; s < S; s++) {
        shard_name(sname, sizeof sname, s);
        CHECK(tombstoned(&c, 2, sname), "the copy that was down lost its tombstone "
              "of %s", sname);
    }
    char **k2 = keys_make("k2", 0, NKEYS);
    keys_call(rt, "Add", "f", k2, NKEYS, 500, NULL);
    cluster_node_start(&c, 2, port2, NULL);
    CHECK(t_wait_shard_states(c.node[2].ch, "f", S,
                              BLOOMGRID__V1__FILTER_STATE__FILTER_STATE_READY, 90000),
          "anti-entropy did not bring the undropped filter to the copy that was down");
    for (uint32_t s = 0; s < S; s++) {
        uint64_t g0 = 0, g2 = 0;
        char f0[17], f2[17];
        CHECK(shard_get(c.node[0].ch, s, &g0, f0) == 0 &&
                  shard_get(c.node[2].ch, s, &g2, f2) == 0, "GetShard");
        CHECK(g2 == g0 && g0 > gen0 && strcmp(f0, f2) == 0,
              "shard %u: generation %llu / %llu, fingerprint %s / %s", s,
              (unsigned long long)g2, (unsigned long long)g0, f2, f0);
        shard_name(sname, sizeof sname, s);
        CHECK(!tombstoned(&c, 2, sname), "the tombstone of %s stays", sname);
    }
    CHECK(copy_holds(&c, 2, k2, NKEYS) == NKEYS,
          "the copy that was down lacks keys acknowledged while it was");
    printf("copy down during the undrop: tombstones kept, then lifted by "
           "anti-entropy; it holds the keys added meanwhile\n");
    CHECK(cli(c.router[0].addr, (const char *[]){"restore", "--undrop", bak, NULL}) == 0,
          "restore --undrop run again failed");
    CHECK(said(out_path, "imported into the existing filter"), "second run did not import");
    CHECK(copy_holds(&c, 2, k, NKEYS) == NKEYS, "copy 2 lacks the backup's keys");
    CHECK(keys_present(rt, "f", k, NKEYS, NULL) == NKEYS &&
              keys_present(rt, "f", k2, NKEYS, NULL) == NKEYS,
          "keys missing through the router");
    printf("restore run again: every key on the copy that was down\n");
    keys_free(k, NKEYS);
    keys_free(k2, NKEYS);
    cluster_stop(&c);
}

/* No copy holds a shard of fingerprint fp. */
static void none_of(struct cluster *c, const char *fp, const char *when)
{
    for (int i = 0; i < 3; i++)
        for (uint32_t s = 0; s < S; s++) {
            uint64_t g;
            char f[17];
            int code = shard_get(c->node[i].ch, s, &g, f);
            CHECK(code == GRPC_STATUS_NOT_FOUND || (code == 0 && strcmp(f, fp) != 0),
                  "%s: copy %d holds shard %u of the undropped filter (%d)", when,
                  i, s, code);
        }
}

static void test_refuse(void)
{
    struct cluster c;
    struct rpc_status st;
    uint8_t secret[BF_SECRET_LEN];
    char fp0[17], fp1[17];
    /* Anti-entropy quiet, so that no copy re-creates the stray shard made
     * below on another. */
    static const char *const quiet[] = {"--replicate-interval-ms", "60000", NULL};

    start(&c, "router-undrop-refuse", quiet);
    struct rpc_channel *rt = c.router[0].ch;
    CHECK(create_f(rt, NULL, false, fp0, &st) == 0, "create: %s", st.message);
    secret_of(c.node[0].ch, secret);
    CHECK(t_drop(rt, "f", &st) == 0, "drop: %s", st.message);

    /* The name again, under another secret: the undrop is refused. */
    CHECK(create_f(rt, NULL, false, fp1, &st) == 0, "create again: %s", st.message);
    CHECK(create_f(rt, secret, true, NULL, &st) == GRPC_STATUS_FAILED_PRECONDITION &&
              st.reason == RPC_REASON_SECRET_MISMATCH &&
              strstr(st.message, "exists under another secret"),
          "undrop over another secret: %d %s", st.code, st.message);
    Bloomgrid__V1__FilterInfo *fi;
    CHECK(t_get(rt, "f", &fi, &st) == 0 && strcmp(fi->fingerprint, fp1) == 0,
          "the refused undrop changed the filter");
    bloomgrid__v1__filter_info__free_unpacked(fi, NULL);
    CHECK(t_drop(rt, "f", &st) == 0, "drop: %s", st.message);
    printf("undrop over a name created again: refused, nothing changed\n");

    /* Copy 1 holds shard 3 under another secret: it refuses part-way, and
     * every shard undropped on the others is dropped again. */
    struct node_client_shard stray = {.shard_index = 3, .shard_count = S, .kind = 1,
                                      .capacity = 25000, .error_rate = 0.01};
    memset(stray.secret, 0x77, sizeof stray.secret);
    CHECK(node_client_create_shard(c.node[1].ch, "f", &stray, TIMEOUT_MS, &st) == 0,
          "stray: %s", st.message);
    CHECK(create_f(rt, secret, true, NULL, &st) == GRPC_STATUS_FAILED_PRECONDITION &&
              st.reason == RPC_REASON_SECRET_MISMATCH &&
              strstr(st.message, "were dropped"),
          "undrop refused part-way: %d %s", st.code, st.message);
    none_of(&c, fp0, "a refused undrop");
    /* Every tombstone is back: a plain create with the secret is DROPPED. */
    CHECK(create_f(rt, secret, false, NULL, &st) == GRPC_STATUS_FAILED_PRECONDITION &&
              st.reason == RPC_REASON_DROPPED,
          "plain create after the rollback: %d %s", st.code, st.message);
    struct node_client_shard sh = {.shard_index = 0, .shard_count = S, .kind = 1,
                                   .capacity = 25000, .error_rate = 0.01};
    memcpy(sh.secret, secret, BF_SECRET_LEN);
    for (int i = 0; i < 3; i++)
        CHECK(node_client_create_shard(c.node[i].ch, "f", &sh, TIMEOUT_MS, &st) < 0 &&
                  st.code == GRPC_STATUS_FAILED_PRECONDITION && strstr(st.message, "dropped"),
              "copy %d: CreateShard with the dropped secret after the rollback: %d %s",
              i, st.code, st.message);
    /* The stray goes (a drop sweeps the shards of a name without shard 0). */
    CHECK(t_drop(rt, "f", &st) == 0, "sweep: %s", st.message);
    printf("undrop refused by one copy part-way: rolled back everywhere\n");

    /* Two copies stopped: short of the write quorum, rolled back. */
    CHECK(harness_sigstop(c.node[1].pid) == 0 && harness_sigstop(c.node[2].pid) == 0,
          "SIGSTOP");
    CHECK(create_f(rt, secret, true, NULL, &st) == GRPC_STATUS_UNAVAILABLE,
          "undrop with two copies stopped: %d %s", st.code, st.message);
    printf("undrop with two copies stopped: %s\n", st.message);
    for (uint32_t s = 0; s < S; s++) {
        uint64_t g;
        char f[17];
        CHECK(shard_get(c.node[0].ch, s, &g, f) == GRPC_STATUS_NOT_FOUND,
              "copy 0 keeps shard %u of an undrop short of its quorum", s);
    }
    CHECK(node_client_create_shard(c.node[0].ch, "f", &sh, TIMEOUT_MS, &st) < 0 &&
              strstr(st.message, "dropped"), "copy 0 lost its tombstone: %s", st.message);
    kill(c.node[1].pid, SIGCONT);
    kill(c.node[2].pid, SIGCONT);

    /* Every copy up: it goes through; a second time nothing is left to undo. */
    int code, tries = 0;
    while ((code = create_f(rt, secret, true, fp1, &st)) == GRPC_STATUS_UNAVAILABLE &&
           tries++ < 100)
        harness_sleep_ms(100);
    CHECK(code == 0, "undrop: %d %s", code, st.message);
    CHECK(strcmp(fp1, fp0) == 0, "undropped as %s, not %s", fp1, fp0);
    for (int i = 0; i < 3; i++)
        CHECK(t_wait_shard_states(c.node[i].ch, "f", S,
                                  BLOOMGRID__V1__FILTER_STATE__FILTER_STATE_READY, 10000),
              "copy %d not READY after the undrop", i);
    CHECK(create_f(rt, secret, true, NULL, &st) == GRPC_STATUS_ALREADY_EXISTS,
          "undrop of a filter every copy holds: %d %s", st.code, st.message);
    printf("undrop with every copy up: done; again: ALREADY_EXISTS\n");
    cluster_stop(&c);
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: %s NODE_BIN ROUTER_BIN CLI_BIN copies|refuse\n", argv[0]);
        return 2;
    }
    cli_bin = argv[3];
    char *cargv[] = {argv[0], argv[1], argv[2], NULL};
    return cluster_test_main(3, cargv,
                             strcmp(argv[4], "refuse") == 0 ? test_refuse : test_copies);
}
