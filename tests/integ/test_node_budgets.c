/* Integration test: the node's budgets (docs/SECURITY.md, "Budgets").
 *
 * usage: test_node_budgets NODE_BIN CASE
 *   memory   max_memory_mb: a CreateFilter or CreateShard that would take
 *            the filters' charges past it is RESOURCE_EXHAUSTED naming the
 *            budget; nothing stored changes, and the node's memory, data
 *            directory and descriptors do not grow; the pieces an Import
 *            holds count while it runs; a drop gives the room back.
 *   exports  max_memory_mb: an Export held open (its client read one
 *            chunk and waits) holds its chunk, not a copy of the filter:
 *            sixteen of a filter whose copies would not fit the budget
 *            are all served, the charge grows by their chunks only, the
 *            node's RSS by little more, and once they end the charge is
 *            back and an Export works again.
 *   filters  max_filters: one filter more is RESOURCE_EXHAUSTED; a drop
 *            makes room.
 *   sparse   the first checkpoint of a new filter is sparse: creating a
 *            256 MiB filter leaves a data directory of a few MiB, and the
 *            filter survives kill -9 right after the create and after adds.
 *   idle     stream_idle_ms: a stream that sends nothing is ended with
 *            RESOURCE_EXHAUSTED and its pool thread is free again.
 *   pool     internal_streams: public streams that hold every public pool
 *            thread are refused past their share; an internal stream still
 *            gets a thread.
 *   watch    health Watch streams (which never end on their own) get a
 *            quarter of max_streams: one more is RESOURCE_EXHAUSTED while
 *            other streams still get threads; an ended Watch makes room.
 *   conn     conn_idle_ms: a TCP connection that never starts its HTTP/2
 *            handshake is closed by the node.
 *   fds      a node with 256 descriptors holds 300 filters, all READY, with
 *            a descriptor count that does not grow with them (also after a
 *            restart).
 * Memory, disk and descriptors are read from /proc/PID/status (VmRSS),
 * /proc/PID/fd and the blocks of the data directory.
 */
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>

#include "grpc/health/v1/health.pb-c.h"
#include "harness.h"

#define FILTER_KIND_BLOCKED 1

/* ---- what the test measures of the node ---- */

static uint64_t rss_kb(pid_t pid)
{
    char path[64], line[256];
    unsigned long long kb = 0;
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    CHECK(f != NULL, "cannot read %s", path);
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %llu kB", &kb) == 1)
            break;
    fclose(f);
    return kb;
}

static int fd_count(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
    DIR *d = opendir(path);
    CHECK(d != NULL, "cannot read %s", path);
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        if (de->d_name[0] != '.')
            n++;
    closedir(d);
    return n;
}


/* GetFilter's status code (0: the filter exists). */
static int get_code(struct rpc_channel *ch, const char *name)
{
    Bloomgrid__V1__FilterInfo *fi = NULL;
    struct rpc_status st;
    int rc = t_get(ch, name, &fi, &st);
    if (fi)
        bloomgrid__v1__filter_info__free_unpacked(fi, NULL);
    return rc;
}

/* Restart np on its data directory with flags after sig. */
static void restart(struct node_proc *np, int sig, const char *const *flags)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s", np->dir);
    node_stop(np, sig);
    node_start(np, dir, flags);
    CHECK(node_wait_health(np, true, TIMEOUT_MS), "node not SERVING after a restart");
}

static void expect_exhausted(int rc, const struct rpc_status *st, const char *budget)
{
    CHECK(rc == GRPC_STATUS_RESOURCE_EXHAUSTED, "want RESOURCE_EXHAUSTED, got %d: %s",
          rc, st->message);
    CHECK(strstr(st->message, budget) != NULL, "message does not name %s: %s",
          budget, st->message);
}

static uint64_t filter_bytes(struct rpc_channel *ch, const char *name)
{
    Bloomgrid__V1__FilterInfo *fi = NULL;
    struct rpc_status st;
    CHECK(t_get(ch, name, &fi, &st) == 0, "GetFilter %s: %s", name, st.message);
    CHECK(fi->state == BLOOMGRID__V1__FILTER_STATE__FILTER_STATE_READY,
          "filter %s is not READY (%d): %s", name, fi->state, fi->reason);
    uint64_t b = fi->bytes;
    bloomgrid__v1__filter_info__free_unpacked(fi, NULL);
    return b;
}

static int create_shard(struct rpc_channel *ch, const char *filter, uint64_t cap,
                        struct rpc_status *st)
{
    Bloomgrid__V1__CreateShardRequest rq = BLOOMGRID__V1__CREATE_SHARD_REQUEST__INIT;
    uint8_t secret[32];
    memset(secret, 7, sizeof secret);
    rq.filter = (char *)filter;
    rq.shard_index = 0;
    rq.shard_count = 2;
    rq.capacity = cap;
    rq.error_rate = 0.01;
    rq.secret.data = secret;
    rq.secret.len = sizeof secret;
    rq.new_filter = true;
    ProtobufCMessage *resp = NULL;
    if (rpc_call(ch, "/bloomgrid.v1.Internal/CreateShard", &rq.base,
                 &bloomgrid__v1__internal_shard_info__descriptor, &resp, TIMEOUT_MS,
                 st) < 0)
        return st->code;
    protobuf_c_message_free_unpacked(resp, NULL);
    return 0;
}

static void start(struct node_proc *np, const char *tag, const char *const *flags)
{
    char dir[512];
    harness_tmpdir(dir, sizeof dir, tag);
    node_start(np, dir, flags);
    CHECK(node_wait_health(np, true, TIMEOUT_MS), "node not SERVING");
}

/* ---- cases ---- */

static void case_memory(void)
{
    struct node_proc np;
    struct rpc_status st;
    const char *flags[] = {"--max-memory-mb", "28", NULL};
    start(&np, "budget-memory", flags);

    /* About 6 MiB of bits (a filter is charged its bits and their page
     * versions, 1/512 more); b, c, d and the shard about 12 MiB. */
    CHECK(t_create(np.ch, "a", 5000000, 0.01, FILTER_KIND_BLOCKED, &st) == 0,
          "create a: %s", st.message);
    uint64_t abytes = filter_bytes(np.ch, "a");
    CHECK(abytes > (6u << 20) && abytes < (8u << 20), "a has %llu bytes",
          (unsigned long long)abytes);
    char **keys = keys_make("k", 0, 2000);
    keys_call(np.ch, "Add", "a", keys, 2000, 500, NULL);

    uint64_t rss0 = rss_kb(np.pid), disk0 = harness_du(np.dir);
    int fd0 = fd_count(np.pid);
    /* 196 GB of bits, as one router CreateFilter once asked of a node. */
    int rc = t_create(np.ch, "huge", 150000000000ull, 0.01, FILTER_KIND_BLOCKED, &st);
    expect_exhausted(rc, &st, "max_memory_mb");
    /* A filter that would fit alone but not beside a and b: 6 + 12 + 12 > 28. */
    CHECK(t_create(np.ch, "b", 10000000, 0.01, FILTER_KIND_BLOCKED, &st) == 0,
          "create b: %s", st.message);
    rc = t_create(np.ch, "c", 10000000, 0.01, FILTER_KIND_BLOCKED, &st);
    expect_exhausted(rc, &st, "max_memory_mb");
    rc = create_shard(np.ch, "sharded", 10000000, &st);
    expect_exhausted(rc, &st, "max_memory_mb");
    for (int i = 0; i < 20; i++) {
        rc = t_create(np.ch, "huge", 150000000000ull, 0.01, FILTER_KIND_BLOCKED, &st);
        expect_exhausted(rc, &st, "max_memory_mb");
    }
    /* Nothing of the refused filters exists or was written. */
    CHECK(get_code(np.ch, "huge") == GRPC_STATUS_NOT_FOUND, "huge exists");
    CHECK(get_code(np.ch, "c") == GRPC_STATUS_NOT_FOUND, "c exists");
    CHECK(keys_present(np.ch, "a", keys, 2000, NULL) == 2000, "a lost keys");
    uint64_t rss1 = rss_kb(np.pid), disk1 = harness_du(np.dir);
    int fd1 = fd_count(np.pid);
    printf("rss %llu -> %llu kB, disk %llu -> %llu kB, fds %d -> %d\n",
           (unsigned long long)rss0, (unsigned long long)rss1,
           (unsigned long long)disk0 >> 10, (unsigned long long)disk1 >> 10, fd0, fd1);
    /* b's own bits (untouched: a few pages) and its sparse checkpoint are
     * all that may have been added. */
    CHECK(rss1 < rss0 + 16 * 1024, "RSS grew from %llu to %llu kB",
          (unsigned long long)rss0, (unsigned long long)rss1);
    CHECK(disk1 < disk0 + (4u << 20), "data directory grew from %llu to %llu bytes",
          (unsigned long long)disk0, (unsigned long long)disk1);
    CHECK(fd1 <= fd0 + 4, "descriptors grew from %d to %d", fd0, fd1);

    /* What an import holds while it runs counts: its file waits on disk,
     * and its pieces (a piece of 4 MiB, its log record, and the 1 MiB it
     * reads the file by: 9 MiB) do not fit beside a, b and s (about
     * 5 MiB), and fit once b is dropped. */
    CHECK(t_create(np.ch, "s", 4000000, 0.01, FILTER_KIND_BLOCKED, &st) == 0,
          "create s: %s", st.message);
    uint8_t *file = NULL;
    size_t flen = t_export(np.ch, "a", &file, &st);
    CHECK(flen > abytes, "export a: %s", st.message);
    rc = t_import(np.ch, "a", file, flen, NULL, &st);
    expect_exhausted(rc, &st, "max_memory_mb");
    CHECK(keys_present(np.ch, "a", keys, 2000, NULL) == 2000, "a lost keys");

    /* Dropping b gives its charge back: the import fits, and so does c. */
    CHECK(t_drop(np.ch, "b", &st) == 0, "drop b: %s", st.message);
    CHECK(t_import(np.ch, "a", file, flen, NULL, &st) == 0, "import: %s", st.message);
    free(file);
    CHECK(t_create(np.ch, "c", 10000000, 0.01, FILTER_KIND_BLOCKED, &st) == 0,
          "create c after the drop: %s", st.message);
    /* A restart with the same budget keeps every filter. */
    restart(&np, SIGKILL, flags);
    CHECK(keys_present(np.ch, "a", keys, 2000, NULL) == 2000, "a lost keys");
    filter_bytes(np.ch, "c");
    rc = t_create(np.ch, "d", 10000000, 0.01, FILTER_KIND_BLOCKED, &st);
    expect_exhausted(rc, &st, "max_memory_mb");
    keys_free(keys, 2000);
    node_stop(&np, SIGTERM);
}

/* An Export held open by a client that read one chunk and waits.  Its
 * channel has its own connection with a 64 KiB receive window and no
 * window growth, so the node cannot hand the client the whole file: it
 * keeps its copy, and its thread waits to send, until the call ends. */
struct held_export {
    grpc_channel *ch;
    grpc_completion_queue *cq;
    grpc_call *call;
};

static void held_wait(struct held_export *h, void *tag)
{
    grpc_event ev = grpc_completion_queue_next(
        h->cq, gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                            gpr_time_from_millis(TIMEOUT_MS, GPR_TIMESPAN)), NULL);
    CHECK(ev.type == GRPC_OP_COMPLETE && ev.tag == tag, "Export call: event %d",
          (int)ev.type);
}

/* The call's status (after its messages, or a cancel): code and message. */
static int held_status(struct held_export *h, struct rpc_status *st)
{
    grpc_metadata_array trailing;
    grpc_status_code code;
    grpc_slice details;
    grpc_op op;
    grpc_metadata_array_init(&trailing);
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    op.data.recv_status_on_client.trailing_metadata = &trailing;
    op.data.recv_status_on_client.status = &code;
    op.data.recv_status_on_client.status_details = &details;
    CHECK(grpc_call_start_batch(h->call, &op, 1, (void *)3, NULL) == GRPC_CALL_OK,
          "status batch");
    held_wait(h, (void *)3);
    st->code = code;
    snprintf(st->message, sizeof st->message, "%.*s", (int)GRPC_SLICE_LENGTH(details),
             (const char *)GRPC_SLICE_START_PTR(details));
    grpc_slice_unref(details);
    grpc_metadata_array_destroy(&trailing);
    return (int)code;
}

static void held_free(struct held_export *h)
{
    grpc_call_unref(h->call);
    grpc_channel_destroy(h->ch);
    grpc_completion_queue_shutdown(h->cq);
    while (grpc_completion_queue_next(h->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL)
               .type != GRPC_QUEUE_SHUTDOWN)
        ;
    grpc_completion_queue_destroy(h->cq);
}

/* Start an Export of name and read its first chunk: true when the client
 * got it and now holds the call; false with the status in st when the
 * export was refused (h is then freed). */
static bool export_hold(struct held_export *h, const char *addr, const char *name,
                        struct rpc_status *st)
{
    grpc_arg args[3];
    memset(args, 0, sizeof args);
    args[0].type = GRPC_ARG_INTEGER;
    args[0].key = GRPC_ARG_HTTP2_BDP_PROBE;
    args[0].value.integer = 0;
    args[1].type = GRPC_ARG_INTEGER;
    args[1].key = GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES;
    args[1].value.integer = 65536;
    args[2].type = GRPC_ARG_INTEGER;
    args[2].key = GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL;
    args[2].value.integer = 1;
    grpc_channel_args cargs = {.num_args = 3, .args = args};
    grpc_channel_credentials *creds = grpc_insecure_credentials_create();
    h->ch = grpc_channel_create(addr, creds, &cargs);
    grpc_channel_credentials_release(creds);
    h->cq = grpc_completion_queue_create_for_next(NULL);
    h->call = grpc_channel_create_call(
        h->ch, NULL, GRPC_PROPAGATE_DEFAULTS, h->cq,
        grpc_slice_from_static_string("/bloomgrid.v1.BloomGrid/Export"), NULL,
        gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                     gpr_time_from_millis(60000, GPR_TIMESPAN)), NULL);
    CHECK(h->call, "create the Export call");

    Bloomgrid__V1__ExportRequest rq = BLOOMGRID__V1__EXPORT_REQUEST__INIT;
    rq.filter = (char *)name;
    rq.chunk_size = 65536;
    uint8_t buf[256];
    size_t len = protobuf_c_message_pack(&rq.base, buf);
    grpc_slice sl = grpc_slice_from_copied_buffer((const char *)buf, len);
    grpc_byte_buffer *req = grpc_raw_byte_buffer_create(&sl, 1);
    grpc_slice_unref(sl);
    grpc_metadata_array md;
    grpc_metadata_array_init(&md);
    grpc_op ops[4];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = req;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &md;
    CHECK(grpc_call_start_batch(h->call, ops, 4, (void *)1, NULL) == GRPC_CALL_OK,
          "first batch");
    held_wait(h, (void *)1);
    grpc_byte_buffer_destroy(req);
    grpc_metadata_array_destroy(&md);

    grpc_byte_buffer *chunk = NULL;
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_RECV_MESSAGE;
    ops[0].data.recv_message.recv_message = &chunk;
    CHECK(grpc_call_start_batch(h->call, ops, 1, (void *)2, NULL) == GRPC_CALL_OK,
          "read batch");
    held_wait(h, (void *)2);
    if (chunk) {
        grpc_byte_buffer_destroy(chunk);
        return true;
    }
    CHECK(held_status(h, st) != 0, "an Export ended OK before its first chunk");
    held_free(h);
    return false;
}

static void case_exports(void)
{
    struct node_proc np;
    struct rpc_status st;
    const char *flags[] = {"--max-memory-mb", "64", NULL};
    start(&np, "budget-exports", flags);

    /* About 7 MiB of bits, charged 21 MiB of the 64; keys on every page,
     * so that each copy is resident in full. */
    CHECK(t_create(np.ch, "x", 5000000, 0.01, FILTER_KIND_BLOCKED, &st) == 0,
          "create x: %s", st.message);
    uint64_t bytes = filter_bytes(np.ch, "x");
    char **keys = keys_make("e", 0, 20000);
    keys_call(np.ch, "Add", "x", keys, 20000, 5000, NULL);
    struct node_info ni;
    t_node_info(np.ch, &ni);
    uint64_t room = ni.max_memory_bytes - ni.charged_bytes, charged0 = ni.charged_bytes;
    uint64_t rss0 = rss_kb(np.pid);

    /* Sixteen exports held open: more than the room would hold copies
     * for, had each export a copy of the filter. */
    enum { N = 16 };
    struct held_export held[N];
    bool is_held[N];
    int nheld = 0, nrefused = 0;
    CHECK((uint64_t)N * bytes > room, "room for %d copies", N);
    for (int i = 0; i < N; i++) {
        if ((is_held[i] = export_hold(&held[i], np.addr, "x", &st))) {
            nheld++;
            continue;
        }
        nrefused++;
    }
    t_node_info(np.ch, &ni);
    uint64_t rss1 = rss_kb(np.pid);
    printf("filter of %llu KiB, room for %llu KiB: %d exports held, %d refused (%s); "
           "charged %llu KiB of %llu; RSS %llu -> %llu kB\n",
           (unsigned long long)bytes >> 10, (unsigned long long)room >> 10, nheld,
           nrefused, nrefused ? st.message : "", (unsigned long long)ni.charged_bytes >> 10,
           (unsigned long long)ni.max_memory_bytes >> 10, (unsigned long long)rss0,
           (unsigned long long)rss1);
    CHECK(nheld == N && nrefused == 0, "%d held, %d refused: %s", nheld, nrefused,
          st.message);
    /* Each holds its chunk (64 KiB) and the message packed from it. */
    CHECK(ni.charged_bytes == charged0 + (uint64_t)N * 2 * 65536,
          "charged %llu KiB with %d exports held, %llu KiB before",
          (unsigned long long)ni.charged_bytes >> 10, N,
          (unsigned long long)charged0 >> 10);
    /* No copies: the chunks, the streams' buffers and threads, a few MiB. */
    uint64_t bound = rss0 + (uint64_t)N * 1024 + 8 * 1024;
    CHECK(rss1 <= bound, "RSS %llu kB with %d exports held: past %llu kB (1 MiB "
          "an export and 8 MiB)", (unsigned long long)rss1, nheld,
          (unsigned long long)bound);
    /* Reads go on meanwhile. */
    CHECK(keys_present(np.ch, "x", keys, 20000, NULL) == 20000, "x lost keys");

    /* The held exports end (their clients go away): room again. */
    for (int i = 0; i < N; i++) {
        if (!is_held[i])
            continue;
        grpc_call_cancel(held[i].call, NULL);
        held_status(&held[i], &st);
        held_free(&held[i]);
    }
    for (int i = 0; i < 100; i++) {
        t_node_info(np.ch, &ni);
        if (ni.charged_bytes == charged0)
            break;
        harness_sleep_ms(50);
    }
    CHECK(ni.charged_bytes == charged0, "charged %llu after the exports ended, %llu "
          "before", (unsigned long long)ni.charged_bytes, (unsigned long long)charged0);
    uint8_t *file = NULL;
    size_t flen = t_export(np.ch, "x", &file, &st);
    CHECK(flen > bytes, "Export after the held ones ended: %s", st.message);
    free(file);
    keys_free(keys, 20000);
    node_stop(&np, SIGTERM);
}

static void case_filters(void)
{
    struct node_proc np;
    struct rpc_status st;
    const char *flags[] = {"--max-filters", "5", NULL};
    start(&np, "budget-filters", flags);
    char name[32];
    for (int i = 0; i < 5; i++) {
        snprintf(name, sizeof name, "f%d", i);
        CHECK(t_create(np.ch, name, 1000, 0.01, FILTER_KIND_BLOCKED, &st) == 0,
              "create %s: %s", name, st.message);
    }
    uint64_t disk0 = harness_du(np.dir);
    int rc = t_create(np.ch, "f5", 1000, 0.01, FILTER_KIND_BLOCKED, &st);
    expect_exhausted(rc, &st, "max_filters");
    rc = create_shard(np.ch, "s", 1000, &st);
    expect_exhausted(rc, &st, "max_filters");
    CHECK(get_code(np.ch, "f5") == GRPC_STATUS_NOT_FOUND, "f5 exists");
    CHECK(harness_du(np.dir) <= disk0 + 64 * 1024, "data directory grew");
    CHECK(t_drop(np.ch, "f0", &st) == 0, "drop: %s", st.message);
    CHECK(t_create(np.ch, "f5", 1000, 0.01, FILTER_KIND_BLOCKED, &st) == 0,
          "create f5 after a drop: %s", st.message);
    node_stop(&np, SIGTERM);
}

static void case_sparse(void)
{
    struct node_proc np;
    struct rpc_status st;
    start(&np, "budget-sparse", NULL);
    uint64_t disk0 = harness_du(np.dir);
    /* About 256 MiB of bits. */
    CHECK(t_create(np.ch, "big", 190000000, 0.01, FILTER_KIND_BLOCKED, &st) == 0,
          "create: %s", st.message);
    uint64_t bytes = filter_bytes(np.ch, "big");
    CHECK(bytes > (200u << 20), "big has only %llu bytes", (unsigned long long)bytes);
    uint64_t disk1 = harness_du(np.dir);
    printf("filter of %llu MiB: data directory %llu -> %llu KiB\n",
           (unsigned long long)bytes >> 20, (unsigned long long)disk0 >> 10,
           (unsigned long long)disk1 >> 10);
    CHECK(disk1 < disk0 + (8u << 20), "the first checkpoint took %llu bytes of disk",
          (unsigned long long)(disk1 - disk0));
    /* Crash right after the create: the filter comes back, whole. */
    restart(&np, SIGKILL, NULL);
    CHECK(filter_bytes(np.ch, "big") == bytes, "big changed size");
    char **keys = keys_make("s", 0, 5000);
    CHECK(keys_present(np.ch, "big", keys, 5000, NULL) < 50, "an empty filter says maybe");
    keys_call(np.ch, "Add", "big", keys, 5000, 1000, NULL);
    restart(&np, SIGKILL, NULL);
    CHECK(keys_present(np.ch, "big", keys, 5000, NULL) == 5000, "keys lost");
    /* A clean stop checkpoints the filter with its keys: still sparse
     * where no key landed. */
    restart(&np, SIGTERM, NULL);
    CHECK(keys_present(np.ch, "big", keys, 5000, NULL) == 5000, "keys lost");
    keys_free(keys, 5000);
    node_stop(&np, SIGTERM);
}

/* Open a stream on method and send its first message (so it holds a pool
 * thread), or nothing when msg is NULL. */
static struct rpc_cstream *stream_open(struct rpc_channel *ch, const char *method,
                                       const ProtobufCMessage *msg)
{
    struct rpc_cstream *s = rpc_cstream_open(ch, method, 30000);
    CHECK(s != NULL, "cannot open %s", method);
    if (msg)
        CHECK(rpc_cstream_write_msg(s, msg) == 0, "first message of %s", method);
    return s;
}

/* Read what is left of s and end it: its status code (0: OK). */
static int stream_end(struct rpc_cstream *s, struct rpc_status *st)
{
    grpc_slice m;
    while (rpc_cstream_read(s, &m) == 1)
        grpc_slice_unref(m);
    return rpc_cstream_finish(s, st) < 0 ? (int)st->code : 0;
}

static void case_idle(void)
{
    struct node_proc np;
    struct rpc_status st;
    const char *flags[] = {"--stream-idle-ms", "300", "--max-streams", "4",
                           "--internal-streams", "1", NULL};
    start(&np, "budget-idle", flags);
    CHECK(t_create(np.ch, "f", 1000, 0.01, FILTER_KIND_BLOCKED, &st) == 0,
          "create: %s", st.message);
    Bloomgrid__V1__AddRequest kr = BLOOMGRID__V1__ADD_REQUEST__INIT;
    kr.filter = "f";
    /* Three idle streams take every public thread; each is ended. */
    struct rpc_cstream *s[3];
    for (int i = 0; i < 3; i++)
        s[i] = stream_open(np.ch, "/bloomgrid.v1.BloomGrid/AddStream", &kr.base);
    for (int i = 0; i < 3; i++)
        expect_exhausted(stream_end(s[i], &st), &st, "stream_idle_ms");
    /* Their threads are free: a stream that talks gets its answers. */
    char **keys = keys_make("i", 0, 10);
    bool out[10];
    CHECK(t_stream_keys(np.ch, "AddStream", "f", keys, 10, 1, out, &st) == 0,
          "AddStream after the idle ones: %s", st.message);
    keys_free(keys, 10);
    node_stop(&np, SIGTERM);
}

static void case_pool(void)
{
    struct node_proc np;
    struct rpc_status st;
    const char *flags[] = {"--stream-idle-ms", "0", "--max-streams", "4",
                           "--internal-streams", "2", NULL};
    start(&np, "budget-pool", flags);
    CHECK(t_create(np.ch, "f", 1000, 0.01, FILTER_KIND_BLOCKED, &st) == 0,
          "create: %s", st.message);
    Bloomgrid__V1__MayContainRequest kr = BLOOMGRID__V1__MAY_CONTAIN_REQUEST__INIT;
    kr.filter = "f";
    struct rpc_cstream *s[2];
    for (int i = 0; i < 2; i++)
        s[i] = stream_open(np.ch, "/bloomgrid.v1.BloomGrid/MayContainStream", &kr.base);
    /* Each is on its thread once it answers its message (no keys: one
     * empty answer). */
    for (int i = 0; i < 2; i++) {
        grpc_slice m;
        CHECK(rpc_cstream_read(s[i], &m) == 1, "stream %d got no answer", i);
        grpc_slice_unref(m);
    }
    /* A third public stream is refused ... */
    char **keys = keys_make("p", 0, 10);
    bool out[10];
    int rc = t_stream_keys(np.ch, "MayContainStream", "f", keys, 10, 1, out, &st);
    expect_exhausted(rc, &st, "internal_streams");
    /* ... while the internal share still serves a pull of pages. */
    Bloomgrid__V1__PullPagesRequest pr = BLOOMGRID__V1__PULL_PAGES_REQUEST__INIT;
    pr.filter = "f";
    struct rpc_cstream *p = stream_open(np.ch, "/bloomgrid.v1.Internal/PullPages",
                                        &pr.base);
    CHECK(rpc_cstream_close_send(p) == 0, "close PullPages");
    CHECK(stream_end(p, &st) == 0, "PullPages: %s", st.message);
    for (int i = 0; i < 2; i++) {
        rpc_cstream_close_send(s[i]);
        CHECK(stream_end(s[i], &st) == 0, "stream %d: %s", i, st.message);
    }
    CHECK(t_stream_keys(np.ch, "MayContainStream", "f", keys, 10, 1, out, &st) == 0,
          "MayContainStream once the others ended: %s", st.message);
    keys_free(keys, 10);
    node_stop(&np, SIGTERM);
}

/* A health Watch of service "" that has had its first answer (it holds its
 * pool thread then). */
static struct rpc_cstream *watch_open(struct rpc_channel *ch)
{
    Grpc__Health__V1__HealthCheckRequest rq = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    rq.service = "";
    struct rpc_cstream *w = stream_open(ch, "/grpc.health.v1.Health/Watch", &rq.base);
    grpc_slice m;
    CHECK(rpc_cstream_read(w, &m) == 1, "Watch sent no status");
    grpc_slice_unref(m);
    return w;
}

static void case_watch(void)
{
    struct node_proc np;
    struct rpc_status st;
    const char *flags[] = {"--stream-idle-ms", "0", "--max-streams", "8",
                           "--internal-streams", "2", NULL};
    start(&np, "budget-watch", flags);
    CHECK(t_create(np.ch, "f", 1000, 0.01, FILTER_KIND_BLOCKED, &st) == 0,
          "create: %s", st.message);
    /* Two of 8 threads for watchers. */
    struct rpc_cstream *w[2];
    for (int i = 0; i < 2; i++)
        w[i] = watch_open(np.ch);
    Grpc__Health__V1__HealthCheckRequest rq = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    rq.service = "";
    struct rpc_cstream *x = stream_open(np.ch, "/grpc.health.v1.Health/Watch", &rq.base);
    expect_exhausted(stream_end(x, &st), &st, "health Watch");
    /* The rest of the pool still serves key streams. */
    char **keys = keys_make("w", 0, 10);
    bool out[10];
    CHECK(t_stream_keys(np.ch, "AddStream", "f", keys, 10, 1, out, &st) == 0,
          "AddStream beside the watchers: %s", st.message);
    /* A watcher that leaves makes room for another. */
    rpc_cstream_cancel(w[0]);
    rpc_cstream_finish(w[0], &st);
    struct rpc_cstream *y = NULL;
    for (int i = 0; i < 100 && !y; i++) {
        struct rpc_cstream *t = rpc_cstream_open(np.ch, "/grpc.health.v1.Health/Watch", 30000);
        CHECK(t && rpc_cstream_write_msg(t, &rq.base) == 0, "Watch");
        grpc_slice m;
        if (rpc_cstream_read(t, &m) == 1) {
            grpc_slice_unref(m);
            y = t;
        } else {
            rpc_cstream_finish(t, &st);
            harness_sleep_ms(50);
        }
    }
    CHECK(y, "no Watch once one had ended");
    rpc_cstream_cancel(y);
    rpc_cstream_finish(y, &st);
    rpc_cstream_cancel(w[1]);
    rpc_cstream_finish(w[1], &st);
    keys_free(keys, 10);
    node_stop(&np, SIGTERM);
}

static void case_conn(void)
{
    struct node_proc np;
    const char *flags[] = {"--conn-idle-ms", "500", NULL};
    start(&np, "budget-conn", flags);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)np.port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    CHECK(connect(fd, (struct sockaddr *)&a, sizeof a) == 0, "connect: %s",
          strerror(errno));
    /* Send nothing: the node must close it (gRPC's own default waits 120 s
     * for a handshake; the 30 s bound here is generous, not a timing).  It
     * may send its settings first. */
    double until = harness_now_s() + 30;
    ssize_t n = 1;
    while (n > 0) {
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        int left = (int)((until - harness_now_s()) * 1000);
        CHECK(left > 0 && poll(&pf, 1, left) == 1,
              "the node kept a silent connection open for 30 s");
        char b[256];
        n = recv(fd, b, sizeof b, 0);
    }
    CHECK(n == 0 || errno == ECONNRESET, "connection not closed: %s", strerror(errno));
    close(fd);
    CHECK(node_health(&np, "") == 1, "node not serving");
    node_stop(&np, SIGTERM);
}

static void case_fds(void)
{
    struct node_proc np;
    struct rpc_status st;
    struct rlimit rl = {.rlim_cur = 256, .rlim_max = 256};
    /* The node inherits a limit of 256 descriptors. */
    CHECK(setrlimit(RLIMIT_NOFILE, &rl) == 0, "setrlimit: %s", strerror(errno));
    const char *flags[] = {"--durability", "none", NULL};
    start(&np, "budget-fds", flags);
    int fd0 = fd_count(np.pid);
    char name[32];
    char *key[1] = {"k"};
    for (int i = 0; i < 300; i++) {
        snprintf(name, sizeof name, "small%d", i);
        CHECK(t_create(np.ch, name, 100, 0.01, FILTER_KIND_BLOCKED, &st) == 0,
              "create %s: %s", name, st.message);
        bool added[1];
        CHECK(t_keys(np.ch, "Add", name, key, 1, added, &st) == 0, "add: %s",
              st.message);
    }
    int fd1 = fd_count(np.pid);
    printf("descriptors: %d with no filter, %d with 300\n", fd0, fd1);
    CHECK(fd1 < fd0 + 16, "descriptors grew with the filters: %d -> %d", fd0, fd1);
    for (int i = 0; i < 300; i += 37) {
        snprintf(name, sizeof name, "small%d", i);
        filter_bytes(np.ch, name);
    }
    restart(&np, SIGTERM, flags);
    for (int i = 0; i < 300; i++) {
        snprintf(name, sizeof name, "small%d", i);
        bool out[1];
        CHECK(t_keys(np.ch, "MayContain", name, key, 1, out, &st) == 0 && out[0],
              "filter %s lost its key: %s", name, st.message);
    }
    CHECK(fd_count(np.pid) < fd0 + 16, "descriptors grew after the restart");
    node_stop(&np, SIGTERM);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s NODE_BIN "
                "memory|exports|filters|sparse|idle|pool|watch|conn|fds\n",
                argv[0]);
        return 2;
    }
    harness_node_bin = argv[1];
    grpc_init();
    const char *c = argv[2];
    if (!strcmp(c, "memory"))
        case_memory();
    else if (!strcmp(c, "exports"))
        case_exports();
    else if (!strcmp(c, "filters"))
        case_filters();
    else if (!strcmp(c, "sparse"))
        case_sparse();
    else if (!strcmp(c, "idle"))
        case_idle();
    else if (!strcmp(c, "pool"))
        case_pool();
    else if (!strcmp(c, "watch"))
        case_watch();
    else if (!strcmp(c, "conn"))
        case_conn();
    else if (!strcmp(c, "fds"))
        case_fds();
    else {
        fprintf(stderr, "unknown case %s\n", c);
        return 2;
    }
    printf("ok\n");
    return 0;
}
