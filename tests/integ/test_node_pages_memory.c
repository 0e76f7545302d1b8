/* Integration test: a shard's change tracking holds no copy of its bits,
 * and its memory dies with the shard.
 *
 * usage: test_node_pages_memory NODE_BIN
 *   A big single-shard filter gets keys on every page and is pulled
 *   (Internal/PullPages) by two pullers, one of them twice: the node's
 *   resident memory (/proc/PID/smaps_rollup) grows by no more than an
 *   eighth of the filter's bytes (the tracking is the page versions, 1/512
 *   of the bits, not a copy).  DropFilter gives the bits back: the RSS
 *   falls by most of the filter's bytes.  A filter created again under the
 *   same name starts a new tracking epoch: a pull since the old epoch and
 *   version streams every non-empty page, as a pull since 0 does.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <grpc/grpc.h>

#include "harness.h"

#define PULL_PATH "/bloomgrid.v1.Internal/PullPages"
#define PULL_TIMEOUT_MS 60000
#define BIG_CAPACITY 120000000u   /* about 150 MiB of bits at 1 % */
#define ADD_BATCH 20000

/* What a pull streamed and what its last message said. */
struct pull {
    uint64_t pages, bytes;
    uint64_t version, epoch, store_version;
};

/* PullPages of shard 0 of filter since (epoch, since).  Returns the status
 * code; st gets the message. */
static int pull_pages(struct rpc_channel *ch, const char *filter,
                      uint64_t since, uint64_t epoch, struct pull *out,
                      struct rpc_status *st)
{
    Bloomgrid__V1__PullPagesRequest rq =
        BLOOMGRID__V1__PULL_PAGES_REQUEST__INIT;
    struct rpc_cstream *s = rpc_cstream_open(ch, PULL_PATH, PULL_TIMEOUT_MS);
    grpc_slice msg;
    bool last = false;

    memset(out, 0, sizeof *out);
    CHECK(s != NULL, "cannot open PullPages");
    rq.filter = (char *)filter;
    rq.since_version = since;
    rq.epoch = epoch;
    if (rpc_cstream_write_msg(s, &rq.base) == 0 &&
        rpc_cstream_close_send(s) == 0)
        while (rpc_cstream_read(s, &msg) == 1) {
            Bloomgrid__V1__Page *pg = bloomgrid__v1__page__unpack(
                NULL, GRPC_SLICE_LENGTH(msg), GRPC_SLICE_START_PTR(msg));
            grpc_slice_unref(msg);
            CHECK(pg != NULL, "malformed Page");
            if (pg->last) {
                out->version = pg->version;
                out->epoch = pg->epoch;
                out->store_version = pg->store_version;
                last = true;
            } else {
                out->pages++;
                out->bytes += pg->data.len;
            }
            bloomgrid__v1__page__free_unpacked(pg, NULL);
        }
    if (rpc_cstream_finish(s, st) < 0)
        return st->code;
    CHECK(last, "PullPages of \"%s\" ended without its last message", filter);
    return 0;
}

/* Resident bytes of pid, from the exact page-table walk of smaps_rollup. */
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

static void add_keys(struct rpc_channel *ch, const char *filter,
                     const char *prefix, unsigned nkeys)
{
    char **keys = malloc(ADD_BATCH * sizeof *keys);
    char *buf = malloc(ADD_BATCH * 24);
    bool *out = malloc(ADD_BATCH);
    struct rpc_status st;

    for (unsigned from = 0; from < nkeys; from += ADD_BATCH) {
        unsigned n = nkeys - from < ADD_BATCH ? nkeys - from : ADD_BATCH;
        for (unsigned i = 0; i < n; i++) {
            keys[i] = buf + 24 * i;
            snprintf(keys[i], 24, "%s-%u", prefix, from + i);
        }
        CHECK(t_keys(ch, "Add", filter, keys, n, out, &st) == 0, "Add: %s",
              st.message);
    }
    free(out);
    free(buf);
    free(keys);
}

static uint64_t filter_bytes(struct rpc_channel *ch, const char *filter)
{
    Bloomgrid__V1__FilterInfo *fi;
    struct rpc_status st;

    CHECK(t_get(ch, filter, &fi, &st) == 0, "GetFilter: %s", st.message);
    uint64_t bytes = fi->bytes;
    bloomgrid__v1__filter_info__free_unpacked(fi, NULL);
    return bytes;
}

/* Resident memory after a drop: the last handle on the shard may be put
 * just after the drop's answer (a snapshot tick holds one for a moment),
 * so wait for it to fall, up to a bound far above any such moment. */
static uint64_t rss_after_release(pid_t pid, uint64_t below)
{
    struct timespec ts = {0, 20 * 1000 * 1000};
    uint64_t rss = rss_bytes(pid);

    for (int i = 0; i < 250 && rss > below; i++) {
        nanosleep(&ts, NULL);
        rss = rss_bytes(pid);
    }
    return rss;
}

int main(int argc, char **argv)
{
    const char *flags[] = {"--durability", "none", "--snapshot-interval",
                           "86400", NULL};
    struct node_proc n;
    struct rpc_status st;
    struct pull p, p2;
    char dir[512];

    CHECK(argc >= 2, "usage: test_node_pages_memory NODE_BIN");
    harness_node_bin = argv[1];
    /* A sanitized node would hold freed memory in its quarantine, and this
     * test measures when memory is given back: the node gets none. */
    const char *asan = getenv("ASAN_OPTIONS");
    char opts[512];
    snprintf(opts, sizeof opts, "%s%squarantine_size_mb=0", asan ? asan : "",
             asan && *asan ? ":" : "");
    setenv("ASAN_OPTIONS", opts, 1);
    grpc_init();
    harness_tmpdir(dir, sizeof dir, "pages-memory");
    node_start(&n, dir, flags);
    CHECK(node_wait_health(&n, true, 10000), "node not serving");

    CHECK(t_create(n.ch, "big", BIG_CAPACITY, 0.01, 1, &st) == 0,
          "create big: %s", st.message);
    uint64_t body = filter_bytes(n.ch, "big");
    CHECK(body >= (100u << 20), "big has only %" PRIu64 " bytes", body);
    /* Eight keys per 4 KiB page: every page of the body is touched. */
    add_keys(n.ch, "big", "k", (unsigned)(body / 4096 * 8));
    uint64_t unpulled = rss_bytes(n.pid);
    CHECK(pull_pages(n.ch, "big", 0, 0, &p, &st) == 0, "pull big: %s",
          st.message);
    CHECK(p.bytes == body, "pull since 0 streamed %" PRIu64 " of %" PRIu64
          " bytes", p.bytes, body);
    /* A second puller, and the first one again with its cursor. */
    add_keys(n.ch, "big", "new", 2000);
    CHECK(pull_pages(n.ch, "big", 0, 0, &p2, &st) == 0, "second pull: %s",
          st.message);
    CHECK(pull_pages(n.ch, "big", p.version, p.epoch, &p2, &st) == 0,
          "pull since %" PRIu64 ": %s", p.version, st.message);
    CHECK(p2.pages > 0 && p2.pages < p.pages, "a pull since the last one "
          "streamed %" PRIu64 " of %" PRIu64 " pages", p2.pages, p.pages);
    uint64_t before = rss_bytes(n.pid);
    printf("big: %" PRIu64 " MiB of bits, %" PRIu64 " pages pulled, node "
           "RSS %" PRIu64 " MiB before the pulls, %" PRIu64 " MiB after\n",
           body >> 20, p.pages, unpulled >> 20, before >> 20);
    /* No copy of the bits behind the tracking. */
    CHECK(before <= unpulled + body / 8, "RSS %" PRIu64 " MiB with a %" PRIu64
          " MiB filter pulled, %" PRIu64 " MiB before", before >> 20,
          body >> 20, unpulled >> 20);

    CHECK(t_drop(n.ch, "big", &st) == 0, "drop big: %s", st.message);
    /* Most of the bits come back. */
    uint64_t want = body * 3 / 4;
    uint64_t after = rss_after_release(n.pid, before - want);
    printf("after DropFilter: node RSS %" PRIu64 " MiB (fell by %" PRIu64
           " MiB)\n", after >> 20, (before - after) >> 20);
    CHECK(before - after >= want, "DropFilter gave back %" PRIu64 " MiB of "
          "a %" PRIu64 " MiB filter (%" PRIu64 " MiB expected)",
          (before - after) >> 20, body >> 20, want >> 20);

    /* The same name again: a new epoch, so a pull since the old epoch and
     * version is a full pull. */
    CHECK(t_create(n.ch, "big", 1000000, 0.01, 1, &st) == 0,
          "create big again: %s", st.message);
    add_keys(n.ch, "big", "k", 20000);
    CHECK(pull_pages(n.ch, "big", p.version, p.epoch, &p2, &st) == 0,
          "pull big again: %s", st.message);
    CHECK(p2.epoch != p.epoch, "the re-created filter kept epoch %" PRIx64,
          p.epoch);
    struct pull full;
    CHECK(pull_pages(n.ch, "big", 0, 0, &full, &st) == 0, "pull since 0: %s",
          st.message);
    CHECK(full.pages > 0 && p2.pages == full.pages,
          "a pull since the old epoch streamed %" PRIu64 " pages, since 0 %"
          PRIu64, p2.pages, full.pages);
    CHECK(full.bytes == filter_bytes(n.ch, "big"),
          "20000 keys left pages of the re-created filter empty");

    CHECK(node_stop(&n, 15) == 0, "node exit");
    grpc_shutdown();
    printf("ok\n");
    return 0;
}
