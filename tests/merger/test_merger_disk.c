/* Integration tests of the merger's snapshots on disk: it holds one shard
 * per worker in memory whatever the number of shards, picks its snapshots
 * up again when restarted, and refuses a damaged one.
 *
 * usage: test_merger_disk NODE_BIN ROUTER_BIN MERGER_BIN TEST
 *
 * Each datacenter is a cluster of one node (every shard) and one router.
 *   memory   a filter of 2 shards and one of 12 shards of the same size
 *            (32 MiB each, every page holding bits), one merger each with
 *            workers = 2 doing a full pull: the merger's peak RSS (VmHWM)
 *            stays under workers x one shard + 128 MiB (the process and
 *            its gRPC threads) with 12 shards (384 MiB of snapshots), and
 *            grows by less than two shards from 2 shards to 12 (a merger
 *            holding every snapshot needs the whole 384 MiB)
 *   restart  two datacenters of one node; every round is a new merger
 *            process (--once) on the same state directory: the second
 *            pushes nothing (its snapshots and sidecars say each copy
 *            holds everything), the third ships nothing, a later one ships
 *            only the pages that changed; each node then holds every key
 *            of the other and answers "no" for keys never added
 *   corrupt  a snapshot file with a page overwritten (its checksum fails)
 *            is refused by a running merger (RunRound reports the error,
 *            the file is moved to .bf.damaged) and rebuilt by full pulls:
 *            the damaged bits are never pushed (the other copy's pages
 *            equal the source's), every key stays present; the same
 *            damage found by a merger starting (--once) likewise
 *   partial  a filter of 3 shards of 64 MiB and a partial file that is a
 *            shard bundle of the whole filter (every page holding bits),
 *            merged with workers = 1: the merger reads each shard's entry
 *            a piece at a time, so the round grows its peak RSS (VmHWM) by
 *            less than 1.5 shards (the snapshot, and not the partial's
 *            shard beside it); each saved snapshot is bit for bit the
 *            bundle's shard, and every key of the bundle reads present
 *            through the router
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <grpc/grpc.h>
#include <xxhash.h>

#include "bf.h"
#include "bf_file.h"
#include "bundle.h"
#include "bloomgrid/v1/merger.pb-c.h"
#include "cluster.h"
#include "harness.h"
#include "merger_once.h"
#include "node_client.h"
#include "rules.h"

#define M_RUN "/bloomgrid.v1.Merger/RunRound"
#define MIB (1024ull * 1024)

static const char *merger_bin;
static char tdir[PATH_MAX], cfg[PATH_MAX + 32], state_dir[PATH_MAX + 32];

static void setup(const char *tag)
{
    harness_tmpdir(tdir, sizeof tdir, tag);
    snprintf(state_dir, sizeof state_dir, "%s/state", tdir);
    snprintf(cfg, sizeof cfg, "%s/merger.ini", tdir);
}

static void write_config(const char *sources_text, unsigned workers)
{
    char sources[PATH_MAX + 32];
    FILE *f;

    snprintf(sources, sizeof sources, "%s/sources.ini", tdir);
    CHECK((f = fopen(sources, "w")), "sources");
    fputs(sources_text, f);
    fclose(f);
    CHECK((f = fopen(cfg, "w")), "config");
    fprintf(f, "[merger]\nlisten = 127.0.0.1:0\nstate_dir = %s\nsources = %s\n"
            "interval_s = 3600\nnode_timeout_ms = 20000\nworkers = %u\n"
            "log_level = debug\n", state_dir, sources, workers);
    fclose(f);
}

/* A datacenter: one node holding every shard, one router. */
static void dc_up(struct cluster *c, const char *name)
{
    char tag[64];

    /* Creating many shards on one busy node may take longer than the
     * cluster's default deadline. */
    static const char *const slow[] = {"--node-timeout-ms", "30000", NULL};

    snprintf(tag, sizeof tag, "merger-disk-%s", name);
    cluster_start_flags(c, tag, 1, 1, "none", slow);
}

static void merger_start(struct node_proc *p)
{
    char log[PATH_MAX + 32];
    snprintf(log, sizeof log, "%s/merger.log", tdir);
    const char *argv[] = {merger_bin, "--config", cfg, NULL};
    proc_spawn(p, log, argv);
}

/* RunRound on a running merger (the caller frees the report). */
static Bloomgrid__V1__RoundReport *run_round(struct rpc_channel *ch)
{
    Bloomgrid__V1__RunRoundRequest rq = BLOOMGRID__V1__RUN_ROUND_REQUEST__INIT;
    Bloomgrid__V1__RoundReport *r = NULL;
    struct rpc_status st;

    CHECK(rpc_call(ch, M_RUN, &rq.base,
                   &bloomgrid__v1__round_report__descriptor,
                   (ProtobufCMessage **)&r, 120000, &st) == 0,
          "RunRound: %s", st.message);
    printf("round %llu: pulled %llu pushed %llu changed %llu errors %u\n",
           (unsigned long long)r->round, (unsigned long long)r->bytes_pulled,
           (unsigned long long)r->bytes_pushed,
           (unsigned long long)r->pages_changed, r->errors);
    return r;
}

/* Bytes the merger shipped (pulled and pushed) in every round so far. */
static uint64_t shipped(struct rpc_channel *ch)
{
    Bloomgrid__V1__MergerStatusRequest rq =
        BLOOMGRID__V1__MERGER_STATUS_REQUEST__INIT;
    Bloomgrid__V1__MergerStatus *ms = NULL;
    struct rpc_status st;

    CHECK(rpc_call(ch, "/bloomgrid.v1.Merger/Status", &rq.base,
                   &bloomgrid__v1__merger_status__descriptor,
                   (ProtobufCMessage **)&ms, TIMEOUT_MS, &st) == 0,
          "Status: %s", st.message);
    uint64_t n = ms->bytes_shipped_total;
    bloomgrid__v1__merger_status__free_unpacked(ms, NULL);
    return n;
}

static bool report_says(const Bloomgrid__V1__RoundReport *r, const char *what)
{
    for (size_t i = 0; i < r->n_messages; i++)
        if (strstr(r->messages[i], what))
            return true;
    return false;
}

/* A field of /proc/PID/status in KiB. */
static unsigned long long proc_kib(pid_t pid, const char *field)
{
    char path[64], line[256];
    unsigned long long v = 0;
    size_t fl = strlen(field);
    FILE *f;

    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    CHECK((f = fopen(path, "r")), "open %s", path);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, field, fl) && line[fl] == ':')
            sscanf(line + fl + 1, "%llu", &v);
    fclose(f);
    return v;
}

/* ---- memory ---- */

/* The merger's peak RSS (bytes) after one round of a full pull of a filter
 * of `shards` shards of capacity cap each, every page holding bits. */
static unsigned long long hwm_for(unsigned shards, uint64_t cap,
                                  uint64_t *shard_bytes)
{
    struct cluster c;
    struct node_proc m;
    struct rpc_status st;
    Bloomgrid__V1__FilterInfo *fi = NULL;
    char src[PATH_MAX + 64], tag[64];

    snprintf(tag, sizeof tag, "merger-memory-%u", shards);
    setup(tag);
    dc_up(&c, tag);
    CHECK(t_create_sharded(c.router[0].ch, "f", cap * shards, 0.01, 0, shards, &fi,
                           &st) == 0, "create: %s", st.message);
    *shard_bytes = fi->bytes / shards;
    bloomgrid__v1__filter_info__free_unpacked(fi, NULL);
    /* A blocked filter puts each key in one page: 40 keys per 64 KiB page
     * leave no page empty. */
    size_t nkeys = (size_t)(*shard_bytes * shards / RULES_PAGE_BYTES) * 40;
    char **k = keys_make("m", 0, nkeys);
    keys_call(c.router[0].ch, "Add", "f", k, nkeys, 5000, NULL);
    keys_free(k, nkeys);

    snprintf(src, sizeof src, "[filter f]\ndatacenter = a %s\n", c.topo);
    write_config(src, 2);
    /* The merger's first round (at start) pulls every page; RunRound
     * waits for it and runs another. */
    merger_start(&m);
    Bloomgrid__V1__RoundReport *r = run_round(m.ch);
    CHECK(r->errors == 0, "round errors: %s",
          r->n_messages ? r->messages[0] : "");
    uint64_t total = *shard_bytes * shards, got = shipped(m.ch);
    CHECK(got >= total * 9 / 10, "pulled %llu of %llu bytes: the pages are "
          "not all holding bits", (unsigned long long)got,
          (unsigned long long)total);
    bloomgrid__v1__round_report__free_unpacked(r, NULL);
    unsigned long long hwm = proc_kib(m.pid, "VmHWM") * 1024;
    printf("%u shards of %llu bytes (%llu MiB in all): merger VmHWM %llu MiB\n",
           shards, (unsigned long long)*shard_bytes,
           (unsigned long long)(total / MIB), hwm / MIB);
    node_stop(&m, SIGTERM);
    cluster_stop(&c);
    return hwm;
}

static void test_memory(void)
{
    uint64_t cap = 27000000;   /* about 32 MiB of bits a shard at 1 % */
    uint64_t few_bytes, many_bytes;
    unsigned long long few = hwm_for(2, cap, &few_bytes);
    unsigned long long many = hwm_for(12, cap, &many_bytes);

    CHECK(few_bytes == many_bytes, "shard sizes differ");
    /* workers = 2: two snapshots in flight, plus page buffers, and the
     * process itself (its gRPC threads and malloc arenas: about 60 MiB
     * measured). */
    CHECK(many < 2 * many_bytes + 128 * MIB,
          "merger VmHWM %llu MiB with 12 shards of %llu MiB: past 2 shards "
          "+ 128 MiB", many / MIB, (unsigned long long)(many_bytes / MIB));
    CHECK(many < few + 2 * many_bytes,
          "merger VmHWM grew from %llu MiB (2 shards) to %llu MiB (12 "
          "shards)", few / MIB, many / MIB);
}

/* ---- restart ---- */

static void test_restart(void)
{
    struct cluster ca, cb;
    struct rpc_channel *a, *b;
    struct round_out o;
    struct rpc_status st;
    char src[2 * PATH_MAX];
    enum { NK = 20000 };

    setup("merger-restart");
    dc_up(&ca, "restart-a");
    dc_up(&cb, "restart-b");
    a = ca.router[0].ch;
    b = cb.router[0].ch;
    CHECK(t_create_sharded(a, "f", 4000000, 0.01, 0, 4, NULL, &st) == 0,
          "create: %s", st.message);
    char **k1 = keys_make("one", 0, NK), **k2 = keys_make("two", 0, NK);
    char **none = keys_make("never", 0, NK);
    keys_call(a, "Add", "f", k1, NK, 5000, NULL);
    snprintf(src, sizeof src, "[filter f]\ndatacenter = a %s\n"
             "datacenter = b %s\n", ca.topo, cb.topo);
    write_config(src, 2);

    merger_once_run(merger_bin, cfg, tdir, &o, NULL, 0, NULL);
    CHECK(o.status == 0 && o.changed > 0 && o.pushed > 0, "first round:\n%s",
          o.text);
    CHECK(keys_present(b, "f", k1, NK, NULL) == NK, "b lacks keys of a");
    /* A new process: b's pages come back once (they were pushed), and
     * change nothing, so nothing is pushed. */
    merger_once_run(merger_bin, cfg, tdir, &o, NULL, 0, NULL);
    CHECK(o.status == 0 && o.changed == 0 && o.pushed == 0,
          "second round after a restart:\n%s", o.text);
    merger_once_run(merger_bin, cfg, tdir, &o, NULL, 0, NULL);
    CHECK(o.status == 0 && o.pulled == 0 && o.pushed == 0,
          "third round after a restart is not quiet:\n%s", o.text);

    /* Keys on b: a restarted merger pushes a only the pages that changed
     * (it pulls b's keys' hashes, 16 bytes each, or the changed pages). */
    keys_call(b, "Add", "f", k2, 2000, 2000, NULL);
    merger_once_run(merger_bin, cfg, tdir, &o, NULL, 0, NULL);
    CHECK(o.status == 0 && o.changed > 0 &&
          o.pages_pushed <= o.changed && o.pushed <= o.changed * 65536 &&
          o.pulled <= o.changed * 65536,
          "round after adds on b: pushed %llu pages for %llu changed:\n%s",
          o.pages_pushed, o.changed, o.text);
    CHECK(keys_present(a, "f", k2, 2000, NULL) == 2000, "a lacks keys of b");
    CHECK(keys_present(a, "f", k1, NK, NULL) == NK, "a lost keys");
    size_t fa = keys_present(a, "f", none, NK, NULL);
    size_t fb = keys_present(b, "f", none, NK, NULL);
    CHECK(fa < NK / 20 && fb < NK / 20, "keys never added read maybe: %zu on "
          "a, %zu on b of %d", fa, fb, NK);
    keys_free(k1, NK);
    keys_free(k2, NK);
    keys_free(none, NK);
    cluster_stop(&ca);
    cluster_stop(&cb);
}

/* ---- corrupt ---- */

struct pages {
    uint64_t hash[64];
    bool have[64];
};

static int page_in(void *ctx, uint64_t off, const uint8_t *data, size_t len)
{
    struct pages *p = ctx;
    uint64_t i = off / RULES_PAGE_BYTES;
    if (i < 64) {
        p->hash[i] = XXH64(data, len, 0);
        p->have[i] = true;
    }
    return 0;
}

/* Every page of shard 0 of "f" on a node (a full pull). */
static void pages_of(struct cluster *c, struct pages *p)
{
    struct node_client_pull_end end;
    struct rpc_status st;

    memset(p, 0, sizeof *p);
    CHECK(node_client_pull(c->node[0].ch, "f", 0, 0, 0, page_in, p, &end, TIMEOUT_MS,
                           &st) == 0, "pull: %s", st.message);
}

/* Overwrite the second page of the body of shard 0's snapshot with ones. */
static void damage(void)
{
    char path[PATH_MAX + 64];
    uint8_t ones[RULES_PAGE_BYTES];
    int fd;

    memset(ones, 0xff, sizeof ones);
    snprintf(path, sizeof path, "%s/f/shard-0000.bf", state_dir);
    CHECK((fd = open(path, O_WRONLY)) >= 0, "open %s: %s", path,
          strerror(errno));
    CHECK(pwrite(fd, ones, sizeof ones, BF_FILE_HEADER_BYTES +
                 BF_FILE_LAYER_BYTES + RULES_PAGE_BYTES) == sizeof ones,
          "pwrite");
    close(fd);
}

static void expect_same_pages(struct cluster *a, struct cluster *b)
{
    struct pages pa, pb;

    pages_of(a, &pa);
    pages_of(b, &pb);
    for (int i = 0; i < 64; i++)
        CHECK(pa.have[i] == pb.have[i] && pa.hash[i] == pb.hash[i],
              "page %d of shard 0 differs between the copies (a damaged "
              "snapshot was pushed?)", i);
    CHECK(pa.have[1], "page 1 of shard 0 holds no bits");
}

static void test_corrupt(void)
{
    struct cluster ca, cb;
    struct rpc_channel *a, *b;
    struct node_proc m;
    struct round_out o;
    struct rpc_status st;
    char src[2 * PATH_MAX], path[PATH_MAX + 64], err[BF_ERRLEN];
    enum { NK = 20000 };

    setup("merger-corrupt");
    dc_up(&ca, "corrupt-a");
    dc_up(&cb, "corrupt-b");
    a = ca.router[0].ch;
    b = cb.router[0].ch;
    /* About 1 MiB a shard: 16 pages. */
    CHECK(t_create_sharded(a, "f", 3400000, 0.01, 0, 4, NULL, &st) == 0,
          "create: %s", st.message);
    char **k = keys_make("c", 0, 3 * NK);
    keys_call(a, "Add", "f", k, NK, 5000, NULL);
    snprintf(src, sizeof src, "[filter f]\ndatacenter = a %s\n"
             "datacenter = b %s\n", ca.topo, cb.topo);
    write_config(src, 2);

    /* A running merger finds the damage when a round needs the snapshot. */
    merger_start(&m);
    Bloomgrid__V1__RoundReport *r = run_round(m.ch);
    CHECK(r->errors == 0 && shipped(m.ch) > 0, "first rounds");
    bloomgrid__v1__round_report__free_unpacked(r, NULL);
    damage();
    keys_call(a, "Add", "f", k + NK, NK, 5000, NULL);
    r = run_round(m.ch);
    CHECK(r->errors >= 1 && report_says(r, "refused"),
          "a damaged snapshot was not reported");
    bloomgrid__v1__round_report__free_unpacked(r, NULL);
    snprintf(path, sizeof path, "%s/f/shard-0000.bf.damaged", state_dir);
    CHECK(access(path, F_OK) == 0, "%s missing", path);
    r = run_round(m.ch);
    CHECK(r->errors == 0, "round after the damage: %s",
          r->n_messages ? r->messages[0] : "");
    bloomgrid__v1__round_report__free_unpacked(r, NULL);
    node_stop(&m, SIGTERM);
    expect_same_pages(&ca, &cb);
    CHECK(keys_present(b, "f", k, 2 * NK, NULL) == 2 * NK, "b lacks keys");
    snprintf(path, sizeof path, "%s/f/shard-0000.bf", state_dir);
    struct bf *g = bf_file_load(path, err, NULL);
    CHECK(g, "rebuilt snapshot: %s", err);
    bf_destroy(g);

    /* A merger starting finds it when it reads its snapshots. */
    damage();
    keys_call(a, "Add", "f", k + 2 * NK, NK, 5000, NULL);
    merger_once_run(merger_bin, cfg, tdir, &o, NULL, 0, NULL);
    CHECK(o.status == 1 && strstr(o.text, "refused"),
          "start with a damaged snapshot:\n%s", o.text);
    merger_once_run(merger_bin, cfg, tdir, &o, NULL, 0, NULL);
    CHECK(o.status == 0, "round after the damage:\n%s", o.text);
    expect_same_pages(&ca, &cb);
    CHECK(keys_present(b, "f", k, 3 * NK, NULL) == 3 * NK, "b lacks keys");
    keys_free(k, 3 * NK);
    cluster_stop(&ca);
    cluster_stop(&cb);
}

/* ---- partial ---- */

static void test_partial(void)
{
    enum { S = 3 };
    uint64_t cap = 54000000;   /* about 64 MiB of bits a shard at 1 % */
    struct cluster c;
    struct node_proc m;
    struct rpc_status st;
    Bloomgrid__V1__FilterInfo *fi = NULL;
    char src[2 * PATH_MAX], part[PATH_MAX + 32], err[BF_ERRLEN];
    struct bf *sh[S];

    setup("merger-partial");
    dc_up(&c, "partial");
    CHECK(t_create_sharded(c.router[0].ch, "f", cap * S, 0.01, 0, S, &fi,
                           &st) == 0, "create: %s", st.message);
    uint64_t shard_bytes = fi->bytes / S;
    bloomgrid__v1__filter_info__free_unpacked(fi, NULL);
    snprintf(part, sizeof part, "%s/batch.bundle", tdir);
    snprintf(src, sizeof src, "[filter f]\ndatacenter = a %s\npartial = %s\n",
             c.topo, part);
    write_config(src, 1);
    /* The first rounds: an empty filter, and no partial yet (an error). */
    merger_start(&m);
    bloomgrid__v1__round_report__free_unpacked(run_round(m.ch), NULL);
    unsigned long long before = proc_kib(m.pid, "VmHWM") * 1024;

    /* The batch job's result: every shard of the filter in one bundle,
     * with bits in every page. */
    for (unsigned i = 0; i < S; i++) {
        struct node_client_shard ns;
        CHECK(node_client_get_shard(c.node[0].ch, "f", i, &ns, TIMEOUT_MS,
                                    &st) == 0, "GetShard: %s", st.message);
        CHECK((sh[i] = node_client_shard_filter(&ns, err)), "shard: %s", err);
    }
    size_t nkeys = (size_t)(shard_bytes * S / RULES_PAGE_BYTES) * 40;
    char **k = keys_make("part", 0, nkeys);
    for (size_t i = 0; i < nkeys; i++) {
        struct bf_hash h = bf_hash_key(sh[0], k[i], strlen(k[i]));
        bf_add_hashes(sh[bf_hash_shard(h, S)], &h, 1, NULL);
    }
    struct bundle b = {.count = S, .plain = false, .shard = sh};
    CHECK(bundle_save(&b, part, err) == 0, "bundle: %s", err);

    Bloomgrid__V1__RoundReport *r = run_round(m.ch);
    CHECK(r->errors == 0, "round errors: %s",
          r->n_messages ? r->messages[0] : "");
    bloomgrid__v1__round_report__free_unpacked(r, NULL);
    unsigned long long after = proc_kib(m.pid, "VmHWM") * 1024;
    printf("partial bundle of %u shards of %llu MiB, workers 1: merger VmHWM "
           "%llu MiB before, %llu MiB after (+%llu MiB)\n", S,
           (unsigned long long)(shard_bytes / MIB), before / MIB, after / MIB,
           (after - before) / MIB);
    CHECK(after < before + shard_bytes * 3 / 2,
          "merging a partial of %u shards of %llu MiB grew the merger's VmHWM "
          "from %llu to %llu MiB: past 1.5 shards (one snapshot per worker)",
          S, (unsigned long long)(shard_bytes / MIB), before / MIB,
          after / MIB);
    /* The same bits as loading the partial whole. */
    for (unsigned i = 0; i < S; i++) {
        char path[PATH_MAX + 64];
        snprintf(path, sizeof path, "%s/f/shard-%04u.bf", state_dir, i);
        struct bf *snap = bf_file_load(path, err, NULL);
        CHECK(snap, "snapshot %s: %s", path, err);
        CHECK(memcmp(bf_layer_body_const(snap, 0), bf_layer_body_const(sh[i], 0),
                     (size_t)shard_bytes) == 0,
              "snapshot of shard %u differs from the partial's shard", i);
        bf_destroy(snap);
        bf_destroy(sh[i]);
    }
    CHECK(keys_present(c.router[0].ch, "f", k, nkeys, NULL) == nkeys,
          "the node lacks keys of the partial");
    keys_free(k, nkeys);
    node_stop(&m, SIGTERM);
    cluster_stop(&c);
}

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: %s NODE_BIN ROUTER_BIN MERGER_BIN TEST\n",
                argv[0]);
        return 2;
    }
    harness_node_bin = argv[1];
    harness_router_bin = argv[2];
    merger_bin = argv[3];
    grpc_init();
    if (!strcmp(argv[4], "memory"))
        test_memory();
    else if (!strcmp(argv[4], "restart"))
        test_restart();
    else if (!strcmp(argv[4], "corrupt"))
        test_corrupt();
    else if (!strcmp(argv[4], "partial"))
        test_partial();
    else {
        fprintf(stderr, "unknown test %s\n", argv[4]);
        return 2;
    }
    grpc_shutdown();
    printf("%s: ok\n", argv[4]);
    return 0;
}
