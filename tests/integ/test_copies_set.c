/* The set test of shard groups of copies (docs/REPLICATION.md, "Tests"), in
 * the manner of Jepsen's set workload: real nodes, two routers over the same
 * topology and a merger on loopback, with faults injected while keys are
 * written and read.
 *
 * A writer thread adds keys through both routers in turn (single keys and
 * batches of 2..16) and records each key whose Add was acknowledged, with
 * the time of the acknowledgement.  A reader thread per router reads
 * recorded keys (the freshest and a uniform sample) all through the run: a
 * "no" for a key acknowledged before the read was sent is a false negative,
 * and fails the test.  The main thread injects a fault every 1-4 s, one at
 * a time (so at most one copy of a group is faulted at once): kill -9 a
 * copy and restart it; kill -9 a copy, delete its data directory, restart
 * it (only once every other copy of its group serves reads: one refilling
 * after an earlier wipe is still a faulted copy); SIGSTOP a copy for
 * 2-10 s; kill -9 a router or the merger and restart it.  The faults come
 * from a seeded generator: the seed is printed and given back with --seed
 * (or BLOOMGRID_SET_SEED) to replay the same faults (thread timing is not
 * replayed).  Calls that fail (UNAVAILABLE, a
 * deadline) are counted, not errors: a write that failed is not recorded.
 *
 * At the end, with the faults stopped and every process up, the test waits
 * (bounded) until anti-entropy and the merger gave every copy alone every
 * acknowledged key, then checks that every acknowledged key reads "maybe"
 * through every router, and prints the counts.
 *
 * usage: test_copies_set NODE_BIN ROUTER_BIN MERGER_BIN [options]
 *   --copies N        copies per group (default 3; 1 leaves only kill faults)
 *   --groups G        groups (default 1; G * N <= 6)
 *   --write-quorum W  (default: the topology's, a majority: 2 at N = 3)
 *   --read-quorum R   (default: the topology's, N - W + 1: 2 at N = 3)
 *   --duration S      seconds of faults (default 60; BLOOMGRID_SET_DURATION_S)
 *   --seed N          the fault generator's seed (default: from the clock)
 *   --no-wipe         leave out the fault that deletes a copy's data
 */
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <grpc/grpc.h>

#include "cluster.h"

#define FILTER "f"
#define SHARDS 8
#define CAPACITY 2000000
#define READ_BATCH 32
#define FRESH 256           /* readers favour the latest acknowledged keys */
#define FINAL_BATCH 5000
#define SETTLE_MS 60000
#define MAX_FAULT_LOG 4096
#define MAX_FN_KEPT 64
#define WIPE_WAIT_MS 30000  /* for the group's other copies to serve reads */

enum fault { F_KILL, F_WIPE, F_STOP, F_ROUTER, F_MERGER, F_KINDS };
static const char *const fault_name[F_KINDS] = {
    "kill -9 copy", "kill -9 copy + wipe", "SIGSTOP copy", "kill -9 router",
    "kill -9 merger"};

static const char *merger_bin;

static struct opts {
    int copies, groups, w, r, duration_s;
    unsigned long seed;
    bool no_wipe;
} opt = {.copies = 3, .groups = 1, .duration_s = 60};

/* A false negative as the reader saw it. */
struct fneg {
    uint32_t id;
    double acked, sent;     /* seconds since the start */
    int router;
};

static struct {
    struct cluster c;
    struct node_proc merger;
    char merger_cfg[700], merger_log[700];
    char raddr[CLUSTER_MAX_ROUTERS][64];
    double t0;

    pthread_mutex_t lock;   /* guards ack_*, fn_*, flog */
    uint32_t *ack_id;       /* acknowledged keys, in acknowledgement order */
    double *ack_t;
    size_t nack, ack_cap;
    struct fneg fn[MAX_FN_KEPT];
    size_t nfn;
    char flog[MAX_FAULT_LOG][128];
    int nflog;

    atomic_bool stop;
    atomic_ulong writes_ok, writes_failed, reads_ok, reads_failed, keys_read;
    atomic_ulong failed_unavailable, failed_deadline, failed_other;
    int faults[F_KINDS];
    int wipes_left_out;     /* a copy of the group was still refilling */
} run = {.lock = PTHREAD_MUTEX_INITIALIZER};

static double since_start(void)
{
    return harness_now_s() - run.t0;
}

static void key_name(char *buf, size_t len, uint32_t id)
{
    snprintf(buf, len, "k-%u", id);
}

static void fault_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void fault_log(const char *fmt, ...)
{
    char line[100];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    printf("%8.3f s  %s\n", since_start(), line);
    fflush(stdout);
    pthread_mutex_lock(&run.lock);
    if (run.nflog < MAX_FAULT_LOG)
        snprintf(run.flog[run.nflog++], sizeof run.flog[0], "%8.3f s  %s",
                 since_start(), line);
    pthread_mutex_unlock(&run.lock);
}

/* A failed call: counted by kind.  Anything but UNAVAILABLE or a deadline
 * is printed (the first few), since a client would see it as an error. */
static void count_failure(const struct rpc_status *st, const char *what, int router)
{
    if (st->code == GRPC_STATUS_UNAVAILABLE) {
        run.failed_unavailable++;
    } else if (st->code == GRPC_STATUS_DEADLINE_EXCEEDED) {
        run.failed_deadline++;
    } else if (run.failed_other++ < 10) {
        fprintf(stderr, "%8.3f s  %s through router %d: %s: %s\n", since_start(), what,
                router, rpc_status_name(st->code), st->message);
    }
}

/* ---- the writer ---- */

static void ack_append(const uint32_t *ids, size_t n, double t)
{
    pthread_mutex_lock(&run.lock);
    if (run.nack + n > run.ack_cap) {
        size_t cap = run.ack_cap ? run.ack_cap * 2 : 1 << 16;
        run.ack_id = realloc(run.ack_id, cap * sizeof *run.ack_id);
        run.ack_t = realloc(run.ack_t, cap * sizeof *run.ack_t);
        CHECK(run.ack_id && run.ack_t, "out of memory");
        run.ack_cap = cap;
    }
    for (size_t i = 0; i < n; i++) {
        run.ack_id[run.nack + i] = ids[i];
        run.ack_t[run.nack + i] = t;
    }
    run.nack += n;
    pthread_mutex_unlock(&run.lock);
}

static void *writer_main(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg;
    struct rpc_channel *ch[CLUSTER_MAX_ROUTERS];
    char buf[16][24], *keys[16];
    uint32_t ids[16];
    bool out[16];
    uint32_t next = 0;
    for (int r = 0; r < CLUSTER_MAX_ROUTERS; r++)
        CHECK((ch[r] = rpc_channel_create(run.raddr[r], 0)), "channel");
    for (int i = 0; i < 16; i++)
        keys[i] = buf[i];
    for (unsigned long call = 0; !run.stop; call++) {
        int r = (int)(call % CLUSTER_MAX_ROUTERS);
        size_t n = rand_r(&seed) % 2 ? 1 : 2 + rand_r(&seed) % 15;
        struct rpc_status st;
        for (size_t i = 0; i < n; i++) {
            ids[i] = next++;
            key_name(buf[i], sizeof buf[i], ids[i]);
        }
        if (t_keys(ch[r], "Add", FILTER, keys, n, out, &st) == 0) {
            ack_append(ids, n, since_start());
            run.writes_ok++;
        } else {
            /* Not acknowledged: never recorded, and never written again. */
            run.writes_failed++;
            count_failure(&st, "Add", r);
            harness_sleep_ms(10);
        }
    }
    for (int r = 0; r < CLUSTER_MAX_ROUTERS; r++)
        rpc_channel_destroy(ch[r]);
    return NULL;
}

/* ---- the readers ---- */

static void fn_record(uint32_t id, double acked, double sent, int router)
{
    pthread_mutex_lock(&run.lock);
    if (run.nfn < MAX_FN_KEPT)
        run.fn[run.nfn] = (struct fneg){id, acked, sent, router};
    run.nfn++;
    pthread_mutex_unlock(&run.lock);
    char k[24];
    key_name(k, sizeof k, id);
    printf("%8.3f s  FALSE NEGATIVE: %s (acknowledged at %.3f s, read sent at %.3f s) "
           "through router %d\n", since_start(), k, acked, sent, router);
    fflush(stdout);
}

static void *reader_main(void *arg)
{
    int r = (int)(intptr_t)arg;
    unsigned seed = (unsigned)opt.seed * 31u + (unsigned)r;
    struct rpc_channel *ch = rpc_channel_create(run.raddr[r], 0);
    char buf[READ_BATCH][24], *keys[READ_BATCH];
    uint32_t ids[READ_BATCH];
    double acked[READ_BATCH];
    bool out[READ_BATCH];
    CHECK(ch, "channel");
    for (int i = 0; i < READ_BATCH; i++)
        keys[i] = buf[i];
    while (!run.stop) {
        /* Only keys acknowledged before the read is sent are asked. */
        double sent = since_start();
        pthread_mutex_lock(&run.lock);
        size_t n = run.nack, m = n < READ_BATCH ? n : READ_BATCH;
        for (size_t i = 0; i < m; i++) {
            size_t fresh = n < FRESH ? n : FRESH;
            size_t at = i % 2 ? rand_r(&seed) % n : n - 1 - rand_r(&seed) % fresh;
            ids[i] = run.ack_id[at];
            acked[i] = run.ack_t[at];
        }
        pthread_mutex_unlock(&run.lock);
        if (m == 0) {
            harness_sleep_ms(10);
            continue;
        }
        for (size_t i = 0; i < m; i++)
            key_name(buf[i], sizeof buf[i], ids[i]);
        struct rpc_status st;
        if (t_keys(ch, "MayContain", FILTER, keys, m, out, &st) != 0) {
            run.reads_failed++;
            count_failure(&st, "MayContain", r);
            harness_sleep_ms(10);
            continue;
        }
        run.reads_ok++;
        run.keys_read += m;
        for (size_t i = 0; i < m; i++)
            if (!out[i])
                fn_record(ids[i], acked[i], sent, r);
    }
    rpc_channel_destroy(ch);
    return NULL;
}

/* ---- processes ---- */

static void merger_start(void)
{
    const char *argv[] = {merger_bin, "--config", run.merger_cfg, NULL};
    proc_spawn(&run.merger, run.merger_log, argv);
    CHECK(node_wait_health(&run.merger, true, 10000), "merger not serving (see %s)",
          run.merger_log);
}

/* The merger's sources are the routers' groups (one datacenter, the
 * cluster's topology); a round every second. */
static void merger_setup(struct cluster *c)
{
    char sources[700];
    FILE *f;
    snprintf(sources, sizeof sources, "%s/merger-sources.ini", c->dir);
    snprintf(run.merger_cfg, sizeof run.merger_cfg, "%s/merger.ini", c->dir);
    snprintf(run.merger_log, sizeof run.merger_log, "%s/merger.log", c->dir);
    CHECK((f = fopen(sources, "w")), "%s", sources);
    fprintf(f, "[filter %s]\ndatacenter = dc1 %s\n", FILTER, c->topo);
    fclose(f);
    CHECK((f = fopen(run.merger_cfg, "w")), "%s", run.merger_cfg);
    fprintf(f, "[merger]\nlisten = 127.0.0.1:0\nstate_dir = %s/merger-state\n"
            "sources = %s\ninterval_s = 1\nnode_timeout_ms = 3000\n", c->dir, sources);
    fclose(f);
    merger_start();
}

static void router_restart(struct cluster *c, int r, int down_ms)
{
    char listen[64];
    snprintf(listen, sizeof listen, "127.0.0.1:%d", c->router[r].port);
    const char *more[] = {"--listen", listen, NULL};
    node_stop(&c->router[r], SIGKILL);
    harness_sleep_ms(down_ms);
    cluster_router_start(c, r, more);
}

/* ---- faults ---- */

static unsigned fault_seed;

static int rnd(int lo, int hi)     /* uniform in [lo, hi] */
{
    return lo + rand_r(&fault_seed) % (hi - lo + 1);
}

/* Whether every copy of node i's group but i serves reads, waiting up to
 * timeout_ms for each. */
static bool group_serves(struct cluster *c, int i, int timeout_ms)
{
    int g0 = i / c->copies * c->copies;

    for (int j = g0; j < g0 + c->copies; j++)
        if (j != i && !cluster_wait_reads(c, j, timeout_ms))
            return false;
    return true;
}

static void fault_one(struct cluster *c)
{
    enum fault kinds[F_KINDS];
    int nk = 0;
    kinds[nk++] = F_KILL;
    if (opt.copies > 1 && !opt.no_wipe)
        kinds[nk++] = F_WIPE;
    if (opt.copies > 1)
        kinds[nk++] = F_STOP;
    kinds[nk++] = F_ROUTER;
    kinds[nk++] = F_MERGER;
    enum fault f = kinds[rnd(0, nk - 1)];
    int n = c->nnodes, i = rnd(0, n - 1), down = rnd(0, 1500);
    char cmd[700];

    run.faults[f]++;
    switch (f) {
    case F_KILL:
        fault_log("%s %d (%s), down %d ms", fault_name[f], i, c->node[i].addr, down);
        node_stop(&c->node[i], SIGKILL);
        harness_sleep_ms(down);
        cluster_node_start(c, i, c->node[i].port, NULL);
        break;
    case F_WIPE:
        /* A copy refilling after a wipe is still a faulted copy: a second
         * wipe in its group before it serves again makes more than N - W
         * copies lose their data, which no rule can recover from without
         * an operator (docs/REPLICATION.md, "Accepting a loss").  Wipe
         * only once every other copy of the group serves reads. */
        if (!group_serves(c, i, WIPE_WAIT_MS)) {
            fault_log("%s %d (%s) left out: a copy of its group does not serve reads "
                      "after %d ms", fault_name[f], i, c->node[i].addr, WIPE_WAIT_MS);
            run.faults[f]--;
            run.wipes_left_out++;
            return;
        }
        fault_log("%s %d (%s), down %d ms", fault_name[f], i, c->node[i].addr, down);
        node_stop(&c->node[i], SIGKILL);
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", c->node_dir[i]);
        CHECK(system(cmd) == 0, "%s", cmd);
        harness_sleep_ms(down);
        cluster_node_start(c, i, c->node[i].port, NULL);
        break;
    case F_STOP: {
        int ms = rnd(2000, 10000);
        fault_log("%s %d (%s) for %d ms", fault_name[f], i, c->node[i].addr, ms);
        harness_sigstop(c->node[i].pid);
        harness_sleep_ms(ms);
        kill(c->node[i].pid, SIGCONT);
        break;
    }
    case F_ROUTER: {
        int r = rnd(0, c->nrouters - 1);
        fault_log("%s %d (%s), down %d ms", fault_name[f], r, c->router[r].addr, down);
        router_restart(c, r, down);
        break;
    }
    case F_MERGER:
        fault_log("%s, down %d ms", fault_name[f], down);
        node_stop(&run.merger, SIGKILL);
        harness_sleep_ms(down);
        merger_start();
        break;
    default:
        break;
    }
    fault_log("  back up");
}

/* ---- the end ---- */

/* How many of the acknowledged keys [0, n) read "maybe" through ch; the
 * first missing ones go to miss[0, nmiss).  -1 when a call failed (st
 * says why). */
static long count_maybe(struct rpc_channel *ch, size_t n, uint32_t *miss, size_t nmiss,
                        struct rpc_status *st)
{
    static char buf[FINAL_BATCH][24];
    static char *keys[FINAL_BATCH];
    static bool out[FINAL_BATCH];
    size_t found = 0, missing = 0;
    for (size_t b = 0; b < n; b += FINAL_BATCH) {
        size_t m = n - b < FINAL_BATCH ? n - b : FINAL_BATCH;
        for (size_t i = 0; i < m; i++) {
            keys[i] = buf[i];
            key_name(buf[i], sizeof buf[i], run.ack_id[b + i]);
        }
        if (t_keys(ch, "MayContain", FILTER, keys, m, out, st) != 0)
            return -1;
        for (size_t i = 0; i < m; i++) {
            if (out[i])
                found++;
            else if (missing++ < nmiss)
                miss[missing - 1] = run.ack_id[b + i];
        }
    }
    return (long)found;
}

static void print_fault_log(void)
{
    fprintf(stderr, "fault log (seed %lu):\n", opt.seed);
    for (int i = 0; i < run.nflog; i++)
        fprintf(stderr, "  %s\n", run.flog[i]);
}

/* Wait (bounded) until copy i alone holds every acknowledged key: what
 * anti-entropy and the merger must bring about once faults stop. */
static void settle_copy(struct cluster *c, int i)
{
    struct node_proc view = {0};
    struct rpc_status st = {0};
    long got = -1;
    cluster_view_start(c, i, &view);
    double end = harness_now_s() + SETTLE_MS / 1000.0;
    while ((got = count_maybe(view.ch, run.nack, NULL, 0, &st)) != (long)run.nack &&
           harness_now_s() < end)
        harness_sleep_ms(200);
    node_stop(&view, SIGTERM);
    if (got != (long)run.nack)
        print_fault_log();
    CHECK(got == (long)run.nack,
          "copy %d alone holds %ld of %zu acknowledged keys %d s after the faults "
          "stopped (last call: %s %s)", i, got, run.nack, SETTLE_MS / 1000,
          rpc_status_name(st.code), st.code ? st.message : "");
    printf("%8.3f s  copy %d alone holds every acknowledged key\n", since_start(), i);
}

static void final_check(struct cluster *c)
{
    for (int r = 0; r < c->nrouters; r++) {
        uint32_t miss[10];
        struct rpc_status st = {0};
        long got = count_maybe(c->router[r].ch, run.nack, miss, 10, &st);
        if (got != (long)run.nack) {
            print_fault_log();
            for (long k = 0; got >= 0 && k < (long)run.nack - got && k < 10; k++)
                fprintf(stderr, "acknowledged key k-%u reads \"no\" through router %d\n",
                        miss[k], r);
        }
        CHECK(got == (long)run.nack, "router %d: %ld of %zu acknowledged keys \"maybe\" "
              "after the settle (%s %s)", r, got, run.nack, rpc_status_name(st.code),
              st.code ? st.message : "");
    }
    printf("%8.3f s  every acknowledged key reads \"maybe\" through every router\n",
           since_start());
}

static void report(void)
{
    printf("seed %lu, N = %d, groups %d, W = %d, R = %d, %d s of faults%s\n", opt.seed,
           opt.copies, opt.groups, opt.w, opt.r, opt.duration_s,
           opt.no_wipe ? ", no wipe" : "");
    printf("acknowledged keys %zu (%lu Add calls; %lu failed)\n", run.nack,
           (unsigned long)run.writes_ok, (unsigned long)run.writes_failed);
    printf("reads: %lu MayContain calls, %lu keys; %lu failed\n",
           (unsigned long)run.reads_ok, (unsigned long)run.keys_read,
           (unsigned long)run.reads_failed);
    printf("failed calls: %lu UNAVAILABLE, %lu DEADLINE_EXCEEDED, %lu other\n",
           (unsigned long)run.failed_unavailable, (unsigned long)run.failed_deadline,
           (unsigned long)run.failed_other);
    printf("false negatives %zu\n", run.nfn);
    printf("faults:");
    for (int f = 0; f < F_KINDS; f++)
        printf(" %s %d%s", fault_name[f], run.faults[f], f + 1 < F_KINDS ? "," : "\n");
    if (run.wipes_left_out)
        printf("wipes left out (a copy of the group still refilling after %d ms): %d\n",
               WIPE_WAIT_MS, run.wipes_left_out);
}

static void test(void)
{
    struct cluster *c = &run.c;
    struct rpc_status st;
    char head[128], tag[64];
    pthread_t writer, reader[CLUSTER_MAX_ROUTERS];

    snprintf(head, sizeof head, "write_quorum = %d\nread_quorum = %d\n", opt.w, opt.r);
    snprintf(tag, sizeof tag, "copies-set-n%dw%dr%d", opt.copies, opt.w, opt.r);
    printf("seed %lu (replay with --seed %lu)\n", opt.seed, opt.seed);
    run.t0 = harness_now_s();
    cluster_start_copies(c, tag, opt.groups, opt.copies, head, CLUSTER_MAX_ROUTERS);
    CHECK(t_create_sharded(c->router[0].ch, FILTER, CAPACITY, 0.01, 0, SHARDS, NULL,
                           &st) == 0, "create: %s", st.message);
    merger_setup(c);
    for (int r = 0; r < c->nrouters; r++)
        snprintf(run.raddr[r], sizeof run.raddr[r], "%s", c->router[r].addr);
    printf("%d nodes, 2 routers and a merger under %s\n", c->nnodes, c->dir);

    fault_seed = (unsigned)opt.seed;
    pthread_create(&writer, NULL, writer_main, (void *)(uintptr_t)(opt.seed * 7 + 1));
    for (int r = 0; r < c->nrouters; r++)
        pthread_create(&reader[r], NULL, reader_main, (void *)(intptr_t)r);
    double end = harness_now_s() + opt.duration_s;
    while (harness_now_s() < end) {
        harness_sleep_ms(rnd(1000, 4000));
        if (harness_now_s() < end)
            fault_one(c);
    }
    run.stop = true;
    pthread_join(writer, NULL);
    for (int r = 0; r < c->nrouters; r++)
        pthread_join(reader[r], NULL);
    fault_log("faults stopped, every process up");

    if (run.nfn) {
        report();
        print_fault_log();
        for (size_t i = 0; i < run.nfn && i < MAX_FN_KEPT; i++)
            fprintf(stderr, "false negative: k-%u acknowledged at %.3f s, read sent at "
                    "%.3f s through router %d (%s)\n", run.fn[i].id, run.fn[i].acked,
                    run.fn[i].sent, run.fn[i].router, run.raddr[run.fn[i].router]);
        CHECK(run.nfn == 0, "%zu false negatives (seed %lu)", run.nfn, opt.seed);
    }
    CHECK(run.nack > 0, "no write was acknowledged in %d s", opt.duration_s);
    for (int i = 0; i < c->nnodes; i++)
        settle_copy(c, i);
    final_check(c);
    report();
    CHECK(node_stop(&run.merger, SIGTERM) == 0, "merger exit status");
    cluster_stop(c);
    free(run.ack_id);
    free(run.ack_t);
}

static void usage(const char *prog)
{
    fprintf(stderr, "usage: %s NODE_BIN ROUTER_BIN MERGER_BIN [--copies N] [--groups G] "
            "[--write-quorum W] [--read-quorum R] [--duration S] [--seed N] "
            "[--no-wipe]\n", prog);
    exit(2);
}

static void parse(int argc, char **argv)
{
    const char *env;
    if (argc < 4)
        usage(argv[0]);
    opt.seed = (unsigned long)time(NULL) ^ (unsigned long)getpid();
    if ((env = getenv("BLOOMGRID_SET_SEED")) && *env)
        opt.seed = strtoul(env, NULL, 10);
    if ((env = getenv("BLOOMGRID_SET_DURATION_S")) && *env)
        opt.duration_s = atoi(env);
    for (int a = 4; a < argc; a++) {
        const char *v = a + 1 < argc ? argv[a + 1] : NULL;
        if (!strcmp(argv[a], "--no-wipe")) {
            opt.no_wipe = true;
            continue;
        }
        if (!v)
            usage(argv[0]);
        if (!strcmp(argv[a], "--copies"))
            opt.copies = atoi(v);
        else if (!strcmp(argv[a], "--groups"))
            opt.groups = atoi(v);
        else if (!strcmp(argv[a], "--write-quorum"))
            opt.w = atoi(v);
        else if (!strcmp(argv[a], "--read-quorum"))
            opt.r = atoi(v);
        else if (!strcmp(argv[a], "--duration"))
            opt.duration_s = atoi(v);
        else if (!strcmp(argv[a], "--seed"))
            opt.seed = strtoul(v, NULL, 10);
        else
            usage(argv[0]);
        a++;
    }
    /* The topology's defaults (docs/TOPOLOGY.md), written out. */
    if (!opt.w && !opt.r) {
        opt.w = opt.copies / 2 + 1;
        opt.r = opt.copies - opt.w + 1;
    }
    if (opt.copies < 1 || opt.groups < 1 || opt.copies * opt.groups > CLUSTER_MAX_NODES ||
        opt.duration_s < 1 || (!opt.w != !opt.r)) {
        fprintf(stderr, "%s: --copies * --groups must be 1..%d, --duration at least 1, "
                "and --write-quorum and --read-quorum given together\n", argv[0],
                CLUSTER_MAX_NODES);
        exit(2);
    }
}

int main(int argc, char **argv)
{
    parse(argc, argv);
    merger_bin = argv[3];
    setvbuf(stdout, NULL, _IOLBF, 0);
    return cluster_test_main(3, argv, test);
}
