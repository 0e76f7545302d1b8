/* Integration tests: what a node holds and shows beyond its filters' bits.
 *
 * usage: test_node_memory NODE_BIN create_health SLOW_FSYNC_LIBRARY
 *        test_node_memory NODE_BIN empty_rss
 *
 * create_health: a filter being created must not make its node NOT_SERVING
 *   when the filters it serves are fine.  One create is held inside the
 *   fsync of its first checkpoint (slow_fsync.c) for more than five of the
 *   node's health ticks (200 ms each) while health ("" and the readiness
 *   service bloomgrid.v1.BloomGrid) is polled; then 40 creates and drops
 *   run back to back on another thread while health is polled throughout.
 *   Every answer must be SERVING; the held filter then serves keys.
 * empty_rss: a node with an empty filter of about 1 GiB, its metrics
 *   scraped a few times with a sample of the bits taken every second
 *   (--metrics-sample-s 1), the filter's info read (GetFilter: its fill
 *   from every word) and a full pull of its pages (internal PullPages
 *   since 0, which streams none), keeps its resident memory (smaps_rollup)
 *   far below the filter's bytes: statistics and pulls do not read pages
 *   never written; then, with one key added, an Export of it (the key's
 *   bits in it, the rest zeros) still leaves the node's memory so.
 * import_peak: a node with two filters of 64 MiB of bits of one secret
 *   and geometry, one ("src") with eight keys a 4 KiB page, the other
 *   ("f") empty and not resident, imports src's export (a file of 64 MiB
 *   with bits in about every page) into f, with its peak resident memory
 *   (VmHWM) started over just before.  The Import's file waits on disk
 *   and is applied a piece at a time: the peak stays within the RSS before
 *   it + f's bits (which the import makes resident) × 1.15 + 48 MiB.  A
 *   node that held the file in memory (its log record and the filter
 *   parsed from it) needed 3 × the bits (the test fails there).  Then kill
 *   -9: the pieces' records replay.  BLOOMGRID_TEST_SIZE_MB sets the
 *   filters' MiB (64) for a measurement at another size.
 * import_peak_counting: a counting filter imports its own export, applied
 *   whole from its log record: the peak stays within the file once +
 *   15 % + 48 MiB (test_import_peak_counting).
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <grpc/grpc.h>

#include "harness.h"
#include "node_client.h"

#define READY_SERVICE "bloomgrid.v1.BloomGrid"

/* ---- create_health ---- */

struct creator {
    struct rpc_channel *ch;
    const char *name;
    uint64_t capacity;
    unsigned rounds;          /* create + drop of name-N, N < rounds */
    int rc;
    char msg[512];
    atomic_bool done;
};

static void *create_main(void *arg)
{
    struct creator *c = arg;
    struct rpc_status st;
    char name[64];

    c->rc = 0;
    if (!c->rounds) {
        c->rc = t_create(c->ch, c->name, c->capacity, 0.01, 1, &st);
        if (c->rc)
            snprintf(c->msg, sizeof c->msg, "create %s: %.400s", c->name, st.message);
    }
    for (unsigned i = 0; i < c->rounds && !c->rc; i++) {
        snprintf(name, sizeof name, "%s-%u", c->name, i);
        if ((c->rc = t_create(c->ch, name, c->capacity, 0.01, 1, &st)) ||
            (c->rc = t_drop(c->ch, name, &st)))
            snprintf(c->msg, sizeof c->msg, "create/drop %s: %.400s", name, st.message);
    }
    atomic_store(&c->done, true);
    return NULL;
}

/* Poll both health services until *stop (and at least min_polls times);
 * every answer must be SERVING.  Returns the polls made. */
static unsigned poll_serving(struct node_proc *n, atomic_bool *stop, unsigned min_polls)
{
    struct timespec ts = {0, 10 * 1000 * 1000};
    unsigned polls = 0;

    while (!atomic_load(stop) || polls < min_polls) {
        int live = node_health(n, "");
        int ready = node_health(n, READY_SERVICE);
        CHECK(live == 1 && ready == 1, "health during a create: liveness %d, "
              "readiness %d (1 is SERVING), poll %u", live, ready, polls);
        polls++;
        nanosleep(&ts, NULL);
    }
    return polls;
}

static void test_create_health(const char *dir, const char *preload)
{
    const char *flags[] = {"--durability", "fsync", NULL};
    char gate[800], held[820];
    struct node_proc n;
    struct rpc_status st;
    pthread_t th;

    snprintf(gate, sizeof gate, "%s.gate", dir);
    harness_fsync_gate(gate, "/.creating-", held, sizeof held);
    harness_preload_begin(preload);
    node_start(&n, dir, flags);
    harness_preload_end();
    CHECK(node_wait_health(&n, true, 20000), "node not serving");
    CHECK(t_create(n.ch, "served", 100000, 0.01, 1, &st) == 0, "create served: %s",
          st.message);
    char **k = keys_make("s", 0, 100);
    keys_call(n.ch, "Add", "served", k, 100, 100, NULL);
    keys_free(k, 100);

    /* One create held in the fsync of its files. */
    FILE *g = fopen(gate, "w");
    CHECK(g, "create %s", gate);
    fclose(g);
    struct creator c = {.ch = rpc_channel_create(n.addr, 0), .name = "held",
                        .capacity = 1000000};
    CHECK(c.ch, "channel");
    CHECK(pthread_create(&th, NULL, create_main, &c) == 0, "thread");
    struct timespec ts = {0, 10 * 1000 * 1000};
    while (access(held, F_OK) != 0) {
        CHECK(!atomic_load(&c.done), "the create ended without being held: %s",
              c.msg);
        nanosleep(&ts, NULL);
    }
    /* About 1.5 s of polls: the node's health follows its filters every
     * 200 ms, so several of its checks see the reserved name. */
    atomic_bool now = true;   /* min_polls decides */
    unsigned polls = poll_serving(&n, &now, 100);
    CHECK(!atomic_load(&c.done), "the create ended while held");
    unlink(gate);
    pthread_join(th, NULL);
    CHECK(c.rc == 0, "%s", c.msg);
    printf("held create: %u polls, all SERVING\n", polls);
    k = keys_make("h", 0, 100);
    keys_call(n.ch, "Add", "held", k, 100, 100, NULL);
    CHECK(keys_present(n.ch, "held", k, 100, NULL) == 100, "keys of the held filter");
    keys_free(k, 100);

    /* Creates and drops back to back. */
    struct creator c2 = {.ch = c.ch, .name = "burst", .capacity = 2000000,
                         .rounds = 40};
    CHECK(pthread_create(&th, NULL, create_main, &c2) == 0, "thread");
    polls = poll_serving(&n, &c2.done, 1);
    pthread_join(th, NULL);
    CHECK(c2.rc == 0, "%s", c2.msg);
    printf("40 creates and drops: %u polls, all SERVING\n", polls);
    rpc_channel_destroy(c.ch);
    CHECK(node_stop(&n, 15) == 0, "node exit");
}

/* ---- empty_rss ---- */

static uint64_t rss_bytes(pid_t pid)
{
    char path[64], line[256];
    unsigned long long kb = 0;
    bool found = false;

    snprintf(path, sizeof path, "/proc/%d/smaps_rollup", (int)pid);
    FILE *f = fopen(path, "r");
    CHECK(f != NULL, "cannot read %s", path);
    while (!found && fgets(line, sizeof line, f))
        found = sscanf(line, "Rss: %llu kB", &kb) == 1;
    fclose(f);
    CHECK(found, "no Rss line in %s", path);
    return (uint64_t)kb << 10;
}

/* CreateFilter with a deadline long enough for a node that reads the
 * whole body of the filter it creates (what this test catches). */
static int create_long(struct rpc_channel *ch, const char *name, uint64_t cap,
                       struct rpc_status *st)
{
    Bloomgrid__V1__CreateFilterRequest rq = BLOOMGRID__V1__CREATE_FILTER_REQUEST__INIT;
    Bloomgrid__V1__FilterInfo *fi = NULL;

    rq.name = (char *)name;
    rq.capacity = cap;
    rq.error_rate = 0.01;
    rq.kind = 1;
    if (rpc_call(ch, "/bloomgrid.v1.BloomGrid/CreateFilter", &rq.base,
                 &bloomgrid__v1__filter_info__descriptor, (ProtobufCMessage **)&fi,
                 120000, st) < 0)
        return st->code;
    bloomgrid__v1__filter_info__free_unpacked(fi, NULL);
    return 0;
}

/* Export name (one layer of body bytes) in chunks of 1 MiB without keeping
 * them: the file's bytes and how many bytes of the body are not zero (the
 * file is the meta, the body, then an 8-byte checksum). */
static void export_count(struct rpc_channel *ch, const char *name, uint64_t body,
                         uint64_t *total, uint64_t *nonzero)
{
    Bloomgrid__V1__ExportRequest rq = BLOOMGRID__V1__EXPORT_REQUEST__INIT;
    struct rpc_status st;
    grpc_slice sl;

    rq.filter = (char *)name;
    rq.chunk_size = 1u << 20;
    struct rpc_cstream *cs = rpc_cstream_open(ch, "/bloomgrid.v1.BloomGrid/Export", 120000);
    CHECK(cs, "open Export");
    CHECK(rpc_cstream_write_msg(cs, &rq.base) == 0 && rpc_cstream_close_send(cs) == 0,
          "send ExportRequest");
    *total = *nonzero = 0;
    while (rpc_cstream_read(cs, &sl) == 1) {
        Bloomgrid__V1__FileChunk *fc = bloomgrid__v1__file_chunk__unpack(
            NULL, GRPC_SLICE_LENGTH(sl), GRPC_SLICE_START_PTR(sl));
        CHECK(fc && fc->offset == *total, "chunk at %" PRIu64, *total);
        CHECK(fc->total_size > body + 8, "total_size %" PRIu64, (uint64_t)fc->total_size);
        uint64_t from = fc->total_size - 8 - body, to = fc->total_size - 8;
        for (size_t i = 0; i < fc->data.len; i++) {
            uint64_t at = *total + i;
            *nonzero += at >= from && at < to && fc->data.data[i] != 0;
        }
        *total += fc->data.len;
        bloomgrid__v1__file_chunk__free_unpacked(fc, NULL);
        grpc_slice_unref(sl);
    }
    CHECK(rpc_cstream_finish(cs, &st) == 0, "Export: %s", st.message);
}

static void test_empty_rss(const char *dir)
{
    const char *flags[] = {"--durability", "none", "--metrics-listen", "127.0.0.1:0",
                           "--metrics-sample-s", "1", NULL};
    struct node_proc n;
    struct rpc_status st;
    Bloomgrid__V1__FilterInfo *fi;

    node_start(&n, dir, flags);
    CHECK(node_wait_health(&n, true, 20000), "node not serving");
    CHECK(n.maddr[0], "no metrics address");
    uint64_t before = rss_bytes(n.pid);
    /* About 1.1 GiB of bits at 1 %. */
    CHECK(create_long(n.ch, "empty", 900000000, &st) == 0, "create: %s", st.message);
    CHECK(t_get(n.ch, "empty", &fi, &st) == 0, "GetFilter: %s", st.message);
    uint64_t bytes = fi->bytes;
    bloomgrid__v1__filter_info__free_unpacked(fi, NULL);
    CHECK(bytes >= (1ull << 30), "the filter has %" PRIu64 " bytes", bytes);
    /* Samples of the bits (one a second), scrapes, and GetFilter's fill. */
    double fill = -1;
    for (int i = 0; i < 4; i++) {
        harness_sleep_ms(1100);
        const char *sel[] = {"filter=empty,shard=0"};
        CHECK(harness_scrape(n.maddr, "bloomgrid_filter_bytes", NULL, sel, 1, &fill) == 0,
              "scrape");
        CHECK(t_get(n.ch, "empty", &fi, &st) == 0, "GetFilter: %s", st.message);
        bloomgrid__v1__filter_info__free_unpacked(fi, NULL);
    }
    /* A full pull (since 0: every non-empty page) finds none, reading no
     * page never written. */
    struct node_client_pull_end end;
    CHECK(node_client_pull(n.ch, "empty", 0, 0, 0, NULL, NULL, &end, 120000, &st) == 0,
          "PullPages: %s", st.message);
    CHECK(end.pages == 0, "a pull of the empty filter streamed %" PRIu64 " pages",
          end.pages);
    /* The fill gauge was served from a sample (the sampler ran). */
    const char *sel[] = {"filter=empty,shard=0"};
    CHECK(harness_scrape(n.maddr, "bloomgrid_filter_fill_ratio", NULL, sel, 1, &fill) == 0 &&
          fill == 0.0, "fill gauge of the empty filter: %g", fill);
    uint64_t after = rss_bytes(n.pid);
    printf("empty filter of %" PRIu64 " MiB: node RSS %" PRIu64 " MiB before it, %"
           PRIu64 " MiB after samples, scrapes and GetFilter\n", bytes >> 20,
           before >> 20, after >> 20);
    CHECK(after < before + bytes / 8, "RSS %" PRIu64 " MiB with an empty filter of %"
          PRIu64 " MiB (%" PRIu64 " MiB before it)", after >> 20, bytes >> 20,
          before >> 20);
    /* A key makes its page resident, and only around it. */
    char **k = keys_make("k", 0, 1);
    keys_call(n.ch, "Add", "empty", k, 1, 1, NULL);
    CHECK(keys_present(n.ch, "empty", k, 1, NULL) == 1, "the key added");
    keys_free(k, 1);
    /* An Export streams the whole body: the key's bits are in it (its page
     * is read), and the pages never written are sent as zeros without
     * being read. */
    uint64_t total = 0, nonzero = 0;
    export_count(n.ch, "empty", bytes, &total, &nonzero);
    CHECK(total > bytes, "the export holds %" PRIu64 " bytes for %" PRIu64 " bytes of bits",
          total, bytes);
    CHECK(nonzero >= 1 && nonzero <= 64,
          "the export of a filter holding one key has %" PRIu64 " nonzero bytes of "
          "bits (its key's block of 64 bytes)", nonzero);
    uint64_t exported = rss_bytes(n.pid);
    printf("after an Export of it: node RSS %" PRIu64 " MiB\n", exported >> 20);
    CHECK(exported < before + bytes / 8, "RSS %" PRIu64 " MiB after an Export of an "
          "empty filter of %" PRIu64 " MiB (%" PRIu64 " MiB before it)", exported >> 20,
          bytes >> 20, before >> 20);
    CHECK(node_stop(&n, 15) == 0, "node exit");
}

/* ---- import_peak ---- */

/* Start pid's peak resident memory (VmHWM) over from its RSS now. */
static void hwm_reset(pid_t pid)
{
    char path[64];

    snprintf(path, sizeof path, "/proc/%d/clear_refs", (int)pid);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL, "cannot open %s", path);
    CHECK(fputs("5", f) >= 0 && fclose(f) == 0, "cannot write %s", path);
}

/* The filters' MiB of the import tests (BLOOMGRID_TEST_SIZE_MB, 64). */
static uint64_t size_mb(void)
{
    const char *e = getenv("BLOOMGRID_TEST_SIZE_MB");

    return e && atoi(e) > 0 ? (uint64_t)atoi(e) : 64;
}

/* The bytes of filter name's bits (GetFilter). */
static uint64_t bytes_of(struct rpc_channel *ch, const char *name)
{
    Bloomgrid__V1__FilterInfo *fi;
    struct rpc_status st;

    CHECK(t_get(ch, name, &fi, &st) == 0, "GetFilter %s: %s", name, st.message);
    uint64_t bytes = fi->bytes;
    bloomgrid__v1__filter_info__free_unpacked(fi, NULL);
    return bytes;
}

/* Keys "k-0" ... of n, added to filter name (keys_free). */
static char **keys_added(struct rpc_channel *ch, const char *name, size_t n)
{
    char **k = keys_make("k", 0, n);

    keys_call(ch, "Add", name, k, n, 5000, NULL);
    return k;
}

/* kill -9 n and start it again: every one of keys[0, n) in filter name
 * (their records replay); then the keys are freed. */
static void restart_keeps(struct node_proc *n, const char *dir, const char *const *flags,
                          const char *name, char **k, size_t nk)
{
    node_stop(n, 9);
    node_start(n, dir, flags);
    CHECK(node_wait_health(n, true, 60000), "node not serving after a restart");
    CHECK(keys_present(n->ch, name, k, nk, NULL) == nk, "keys lost in the restart");
    keys_free(k, nk);
}

/* An Import measured: its file (the caller frees), the RSS before it, the
 * peak during it (VmHWM started over just before) and its seconds. */
struct measured {
    uint8_t *file;
    size_t flen;
    uint64_t before, peak;
    double took;
};

/* Export from (more than at_least bytes), then, once the allocator gave
 * its free pages back, Import that file into `into`, measured. */
static struct measured import_measured(struct node_proc *n, const char *from,
                                       const char *into, uint64_t at_least)
{
    struct measured m = {0};
    struct rpc_status st;

    m.flen = t_export_ms(n->ch, from, &m.file, 120000, &st);
    CHECK(m.flen > at_least, "export: %s", st.message);
    harness_sleep_ms(2500);
    m.before = harness_status_bytes(n->pid, "VmRSS");
    hwm_reset(n->pid);
    double t0 = harness_now_s();
    CHECK(t_import_ms(n->ch, into, m.file, m.flen, NULL, 120000, &st) == 0, "import: %s",
          st.message);
    m.took = harness_now_s() - t0;
    m.peak = harness_status_bytes(n->pid, "VmHWM");
    return m;
}

static void test_import_peak(const char *dir)
{
    /* The log writes its records with durability none too (a process's
     * crash loses nothing), without an fdatasync of each piece on a busy
     * disk. */
    const char *flags[] = {"--durability", "none", NULL};
    struct node_proc n;
    struct rpc_status st;
    uint8_t secret[32];

    node_start(&n, dir, flags);
    CHECK(node_wait_health(&n, true, 20000), "node not serving");
    /* About 64 MiB of bits at 1 % (BLOOMGRID_TEST_SIZE_MB: another size,
     * for a measurement): "src" and "f", of one secret and geometry. */
    uint64_t mb = size_mb();
    for (int i = 0; i < 32; i++)
        secret[i] = (uint8_t)(i * 11 + 3);
    CHECK(t_create_shard(n.ch, "src", 0, 1, mb * 859375, 0.01, secret, &st) == 0,
          "create src: %s", st.message);
    CHECK(t_create_shard(n.ch, "f", 0, 1, mb * 859375, 0.01, secret, &st) == 0,
          "create f: %s", st.message);
    uint64_t bits = bytes_of(n.ch, "f");
    /* Eight keys a 4 KiB page of src: its export sets bits in about every
     * page, so the Import writes every page of f. */
    size_t nk = (size_t)mb * 2048;
    char **k = keys_added(n.ch, "src", nk);
    struct measured m = import_measured(&n, "src", "f", bits);
    uint64_t after = harness_status_bytes(n.pid, "VmRSS");
    printf("Import of %zu MiB into an empty filter of %" PRIu64 " MiB: RSS %" PRIu64
           " MiB before, %" PRIu64 " MiB after, peak %" PRIu64 " MiB (+%" PRIu64
           " MiB, %.2f x the bits) in %.2f s\n", m.flen >> 20, bits >> 20, m.before >> 20,
           after >> 20, m.peak >> 20, (m.peak - m.before) >> 20,
           (double)(m.peak - m.before) / (double)bits, m.took);
    /* f's bits become resident (1 x), and beside them the Import holds its
     * pieces (9 MiB), never the file; what the allocator keeps of them
     * until its next release and what gRPC's receive window (grown by its
     * BDP probes) buffers of a client faster than the node make the rest:
     * 1.15 x the bits + 48 MiB (+82 to +103 MiB measured at 66 MiB, the
     * larger on a loaded machine).  A node holding the file in memory (its
     * log record and the filter parsed from it) needs 3 x (+218 MiB). */
#ifndef __SANITIZE_ADDRESS__   /* its allocator keeps what is freed (quarantine) */
    CHECK(m.peak <= m.before + bits + bits * 15 / 100 + (48u << 20),
          "an Import of %zu MiB raised the node's peak from %" PRIu64 " to %" PRIu64
          " MiB: more than its %" PRIu64 " MiB of bits and a few pieces",
          m.flen >> 20, m.before >> 20, m.peak >> 20, bits >> 20);
#endif
    CHECK(keys_present(n.ch, "f", k, nk, NULL) == nk, "keys missing after the import");
    /* The pieces' records replay after a crash. */
    restart_keeps(&n, dir, flags, "f", k, nk);
    free(m.file);
    CHECK(node_stop(&n, 15) == 0, "node exit");
}

/* ---- import_peak_counting ---- */

/* A counting filter of about 64 MiB of counters ("c", one shard), its keys
 * added once, imports its own export: a counting merge adds, so it is
 * applied whole, from the log record that holds the file.  The file is
 * held once (that record) and read a piece at a time, merged and written
 * to the log from it: the peak stays within the RSS before it + the file
 * × 1.15 + 48 MiB.  A node that parsed a second copy of the file from the
 * record and copied the record into the log's buffer (rounded up to a
 * power of two) needed about 3 × the file.  The counters are added: every
 * key survives one Remove, after a kill -9 too (the record replays). */
static void test_import_peak_counting(const char *dir)
{
    const char *flags[] = {"--durability", "none", NULL};
    struct node_proc n;
    struct rpc_status st;

    node_start(&n, dir, flags);
    CHECK(node_wait_health(&n, true, 20000), "node not serving");
    uint64_t mb = size_mb();
    CHECK(t_create_sharded(n.ch, "c", mb * 218000, 0.01,
                           BLOOMGRID__V1__FILTER_KIND__FILTER_KIND_COUNTING, 1, NULL,
                           &st) == 0, "create c: %s", st.message);
    uint64_t bytes = bytes_of(n.ch, "c");
    size_t nk = (size_t)mb * 2048;
    char **k = keys_added(n.ch, "c", nk);
    struct measured m = import_measured(&n, "c", "c", bytes);
    printf("Import of %zu MiB into a counting filter of %" PRIu64 " MiB: RSS %" PRIu64
           " MiB before, peak %" PRIu64 " MiB (+%" PRIu64 " MiB, %.2f x the file) in "
           "%.2f s\n", m.flen >> 20, bytes >> 20, m.before >> 20, m.peak >> 20,
           (m.peak - m.before) >> 20, (double)(m.peak - m.before) / (double)m.flen, m.took);
#ifndef __SANITIZE_ADDRESS__   /* its allocator keeps what is freed (quarantine) */
    CHECK(m.peak <= m.before + m.flen + m.flen * 15 / 100 + (48u << 20),
          "an Import of %zu MiB into a counting filter raised the node's peak from %"
          PRIu64 " to %" PRIu64 " MiB: more than the file once and a few pieces",
          m.flen >> 20, m.before >> 20, m.peak >> 20);
#endif
    /* Counters of 2: one Remove leaves every key. */
    keys_call(n.ch, "Remove", "c", k, nk, 5000, NULL);
    CHECK(keys_present(n.ch, "c", k, nk, NULL) == nk, "keys lost: the import did "
          "not add the counters");
    restart_keeps(&n, dir, flags, "c", k, nk);
    free(m.file);
    CHECK(node_stop(&n, 15) == 0, "node exit");
}

int main(int argc, char **argv)
{
    char dir[512];

    CHECK(argc >= 3, "usage: test_node_memory NODE_BIN create_health LIB | empty_rss | "
          "import_peak | import_peak_counting");
    harness_node_bin = argv[1];
    grpc_init();
    harness_tmpdir(dir, sizeof dir, argv[2]);
    if (strcmp(argv[2], "create_health") == 0) {
        CHECK(argc >= 4, "create_health needs the slow_fsync library");
        test_create_health(dir, argv[3]);
    } else if (strcmp(argv[2], "empty_rss") == 0) {
        test_empty_rss(dir);
    } else if (strcmp(argv[2], "import_peak") == 0) {
        test_import_peak(dir);
    } else if (strcmp(argv[2], "import_peak_counting") == 0) {
        test_import_peak_counting(dir);
    } else {
        CHECK(0, "unknown test %s", argv[2]);
    }
    grpc_shutdown();
    printf("ok\n");
    return 0;
}
