/* Integration test of the node's write path: no handler thread waits for
 * an fsync, and no thread is created per request.
 *
 * A node with ONE worker thread runs with its log's fsyncs held behind a
 * gate (slow_fsync.c, preloaded).  Sixteen unary Adds and an AddStream of
 * 32 one-key messages are sent while the gate is closed: none is answered
 * before its record is durable, yet reads keep being answered meanwhile by
 * the one thread that serves key calls (the event loop, or with no loops
 * the one worker thread): a handler waiting for the fsync would hold it.
 * Once the gate opens, every write is answered, the stream's answers in
 * request order, and every key is found.  The node's own threads are as
 * many after the requests as before.
 *
 * With LOOPS, the node runs with that many event loops (`loops`; 0: the
 * worker thread serves the key calls too); without, the default (one).
 *
 * usage: test_node_async NODE_BINARY SLOW_FSYNC_LIBRARY [LOOPS]
 */
#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <grpc/grpc.h>

#include "bloomgrid/v1/bloomgrid.pb-c.h"
#include "harness.h"

#define WRITERS 16
#define STREAMED 32

struct writer {
    struct rpc_channel *ch;
    char key[32];
    atomic_bool done;
    int code;
    bool added;
};

static void *writer_main(void *p)
{
    struct writer *w = p;
    struct rpc_status st;
    char *k = w->key;
    bool out = false;
    w->code = t_keys(w->ch, "Add", "a", &k, 1, &out, &st);
    w->added = out;
    atomic_store(&w->done, true);
    return NULL;
}

static bool exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* The node's own threads: those named after the program (gRPC's core
 * names its threads, and grows its timer pool by itself). */
static int threads_of(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
    DIR *d = opendir(path);
    int n = 0;
    CHECK(d, "open %s", path);
    for (struct dirent *de; (de = readdir(d));) {
        char cp[300], name[64] = "";
        if (de->d_name[0] == '.')
            continue;
        snprintf(cp, sizeof cp, "/proc/%d/task/%.32s/comm", (int)pid, de->d_name);
        FILE *f = fopen(cp, "r");
        if (f && fgets(name, sizeof name, f))
            n += strncmp(name, "bloomgrid-node", 14) == 0;
        if (f)
            fclose(f);
    }
    closedir(d);
    return n;
}

/* A read answered while writes wait: the one worker thread is free. */
static void read_answers(struct rpc_channel *ch, const char *what)
{
    struct rpc_status st;
    char *k = "never-added";
    bool out = true;
    CHECK(t_keys(ch, "MayContain", "a", &k, 1, &out, &st) == 0,
          "%s: a read was not answered while writes wait for their fsync: %s: %s",
          what, rpc_status_name(st.code), st.message);
    CHECK(!out, "%s: a key never added is present", what);
}

int main(int argc, char **argv)
{
    struct node_proc np;
    struct rpc_status st;
    char dir[512], gate[600], held[620];
    struct writer w[WRITERS];
    pthread_t th[WRITERS];

    CHECK(argc == 3 || argc == 4,
          "usage: test_node_async NODE_BINARY SLOW_FSYNC_LIBRARY [LOOPS]");
    harness_node_bin = argv[1];
    grpc_init();
    harness_tmpdir(dir, sizeof dir, "node-async");
    snprintf(gate, sizeof gate, "%s.gate", dir);
    harness_fsync_gate(gate, "/wal-", held, sizeof held);
    const char *flags[] = {"--threads", "1", "--durability", "fsync", NULL, NULL, NULL};
    if (argc == 4) {
        flags[4] = "--loops";
        flags[5] = argv[3];
    }
    harness_preload_begin(argv[2]);
    node_start(&np, dir, flags);
    harness_preload_end();
    CHECK(node_wait_health(&np, true, 20000), "node not serving");
    CHECK(t_create(np.ch, "a", 100000, 0.01, 0, &st) == 0, "create: %s", st.message);
    read_answers(np.ch, "before");
    int threads_before = threads_of(np.pid);

    /* Hold the log's fsync, then write. */
    FILE *g = fopen(gate, "w");
    CHECK(g, "create %s", gate);
    fclose(g);
    for (int i = 0; i < WRITERS; i++) {
        memset(&w[i], 0, sizeof w[i]);
        w[i].ch = np.ch;
        snprintf(w[i].key, sizeof w[i].key, "unary-%d", i);
        pthread_create(&th[i], NULL, writer_main, &w[i]);
    }
    for (int i = 0; i < 1000 && !exists(held); i++)
        harness_sleep_ms(10);
    CHECK(exists(held), "no write reached the log's fsync");
    harness_sleep_ms(300); /* let every writer's call reach the node */
    read_answers(np.ch, "unary writes held");

    /* A stream of one-key messages, all sent before any answer. */
    struct rpc_cstream *cs = rpc_cstream_open(np.ch, "/bloomgrid.v1.BloomGrid/AddStream",
                                              60000);
    CHECK(cs, "open AddStream");
    char skey[STREAMED][32];
    for (int i = 0; i < STREAMED; i++) {
        Bloomgrid__V1__AddRequest rq = BLOOMGRID__V1__ADD_REQUEST__INIT;
        ProtobufCBinaryData kd;
        int kl = snprintf(skey[i], sizeof skey[i], "streamed-%d", i);
        kd.data = (uint8_t *)skey[i];
        kd.len = (size_t)kl;
        rq.filter = i == 0 ? "a" : "";
        rq.n_keys = 1;
        rq.keys = &kd;
        CHECK(rpc_cstream_write_msg(cs, &rq.base) == 0, "send message %d", i);
    }
    harness_sleep_ms(300);
    read_answers(np.ch, "streamed writes held");
    for (int i = 0; i < WRITERS; i++)
        CHECK(!atomic_load(&w[i].done), "Add %d was answered (%s) before its record "
              "was durable", i, rpc_status_name(w[i].code));

    /* Let the fsyncs go: every write is answered. */
    unlink(gate);
    for (int i = 0; i < WRITERS; i++) {
        pthread_join(th[i], NULL);
        CHECK(w[i].code == 0 && w[i].added, "Add %d: %s, added %d", i,
              rpc_status_name(w[i].code), w[i].added);
    }
    CHECK(rpc_cstream_close_send(cs) == 0, "half-close");
    for (int i = 0; i < STREAMED; i++) {
        grpc_slice sl;
        CHECK(rpc_cstream_read(cs, &sl) == 1, "answer %d of the stream", i);
        Bloomgrid__V1__AddResponse *ar = bloomgrid__v1__add_response__unpack(
            NULL, GRPC_SLICE_LENGTH(sl), GRPC_SLICE_START_PTR(sl));
        grpc_slice_unref(sl);
        CHECK(ar && ar->n_added == 1 && ar->added[0], "answer %d: one new key", i);
        bloomgrid__v1__add_response__free_unpacked(ar, NULL);
    }
    CHECK(rpc_cstream_finish(cs, &st) == 0, "AddStream: %s", st.message);

    char *all[WRITERS + STREAMED];
    bool out[WRITERS + STREAMED];
    for (int i = 0; i < WRITERS; i++)
        all[i] = w[i].key;
    for (int i = 0; i < STREAMED; i++)
        all[WRITERS + i] = skey[i];
    CHECK(t_keys(np.ch, "MayContain", "a", all, WRITERS + STREAMED, out, &st) == 0,
          "query: %s", st.message);
    for (int i = 0; i < WRITERS + STREAMED; i++)
        CHECK(out[i], "key %s missing", all[i]);

    /* Requests made no threads. */
    for (int i = 0; i < 50; i++)
        read_answers(np.ch, "after");
    int threads_after = threads_of(np.pid);
    CHECK(threads_after == threads_before, "the node went from %d to %d threads",
          threads_before, threads_after);
    CHECK(node_stop(&np, SIGTERM) == 0, "node exit status");
    printf("ok: %d writes answered once durable, reads answered meanwhile, %d "
           "threads\n", WRITERS + STREAMED, threads_after);
    return 0;
}
