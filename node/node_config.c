/* node_config: the settings table of bloomgrid-node (common/base/settings.h does
 * the parsing). */
#include "node_config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rpc_listen.h"
#include "rpc_metrics.h"
#include "rpc_auth.h"
#include "rules.h"
#include "settings.h"

#define F(f) SETTING_FIELD(struct node_config, f)

static const struct setting settings[] = {
    {"listen", SETTING_ADDR, 0, 0, NULL, "127.0.0.1:7400", F(listen),
     "address to serve gRPC on, host:port (port 0 picks a free port); with "
     "internal_listen set, the public service (bloomgrid.v1.BloomGrid) and "
     "health only"},
    {"internal_listen", SETTING_ADDR, 0, 0, NULL, "", F(internal_listen),
     "address of the listener serving bloomgrid.v1.Internal (and health) to "
     "routers, the merger and the other copies, host:port (port 0 picks a "
     "free port); with TLS it requires a client certificate of tls_ca, and "
     "must be set; the topology lists this address; empty: the internal "
     "service is served on listen"},
    RPC_HEALTH_LISTEN_SETTING(struct node_config),
    {"data_dir", SETTING_STRING, 0, 0, NULL, "./bloomgrid-data", F(data_dir),
     "directory holding the filters (checkpoints) and the node's write-ahead "
     "log (docs/STORAGE.md)"},
    {"durability", SETTING_ENUM, 0, 0, "fsync|none", "fsync", F(durability),
     "fsync: acknowledge writes once on disk (one fdatasync for every write "
     "that arrived meanwhile, on any filter); none: acknowledge after "
     "write(): a machine crash loses recent writes"},
    {"snapshot_interval", SETTING_UINT, 1, 86400, NULL, "60", F(snapshot_interval_s),
     "seconds after which a changed filter is checkpointed when that writes "
     "no more than twice the bytes of its log records since the last "
     "checkpoint (a sparse filter's log stays short; docs/STORAGE.md, "
     "Checkpoints)"},
    {"checkpoint_log_percent", SETTING_UINT, 1, 10000, NULL, "50",
     F(checkpoint_log_percent),
     "a filter is checkpointed once its records in the write-ahead log since "
     "its last checkpoint reach this percent of its bits' bytes: a "
     "checkpoint writes the pages changed (or those records) and every few a "
     "new base, so checkpoints write about 0.5 + 50/percent times the log's "
     "bytes (1.5x at 50); lower means a shorter log and faster restarts "
     "for more writes (docs/STORAGE.md, Checkpoints)"},
    {"snapshot_wal_mb", SETTING_UINT, 1, 1 << 20, NULL, "64", F(snapshot_wal_mb),
     "bound on the node's write-ahead log, in MiB, or twice the sum of the "
     "filters' checkpoint points (checkpoint_log_percent) when that is "
     "more: past it the filters that hold its oldest segments are "
     "checkpointed and the segments removed"},
    {"wal_block_bytes", SETTING_UINT, 0, 1 << 20, NULL, "0", F(wal_block_bytes),
     "least write unit of the write-ahead log with durability fsync, in bytes "
     "(a power of two, 4096 to 1048576): each commit group is padded to whole "
     "units so that a torn write cannot reach an acknowledged record; 0: the "
     "largest of the page size, the file system's block size and the disk's "
     "physical block size, at least 4096 (docs/STORAGE.md, Write units)"},
    {"wal_commit_delay_us", SETTING_UINT, 0, 100000, NULL, "1000",
     F(wal_commit_delay_us),
     "with durability fsync, while writes keep arriving during each "
     "fdatasync, start the next one no sooner than this many microseconds "
     "(and than the last fdatasync took, if less) after the last: the "
     "writers its answers let go join it (more writes per fdatasync, each "
     "waiting at most this much longer); a lone writer never waits; with "
     "resp_commit = loop, also how long the Redis door's loop waits, after "
     "a group it committed (and no longer than that group took), for the "
     "clients it answered to send their next adds before committing those "
     "it holds; 0: no delay (docs/STORAGE.md, Writing; docs/RESP.md, "
     "Durable adds)"},
    {"resp_commit", SETTING_ENUM, 0, 0, "loop|thread", "loop", F(resp_commit),
     "with durability fsync, who commits the log records of the Redis "
     "door's adds: loop: the door's event loop, at the end of each pass "
     "while the log's commit thread is idle (one fdatasync for the pass's "
     "adds, then their replies at once, as Redis's appendfsync always; the "
     "door serves no other command during that fdatasync); thread: the "
     "log's commit thread, as for gRPC writes (the door goes on serving "
     "meanwhile; each reply crosses two threads) (docs/RESP.md, Durable "
     "adds)"},
    {"max_batch_keys", SETTING_UINT | SETTING_LIVE, 1, RULES_BATCH_KEYS_MAX, NULL,
     RULES_STR(RULES_BATCH_KEYS_DEFAULT), F(max_batch_keys),
     "most keys (or hashes) in one request; more is RESOURCE_EXHAUSTED"},
    {"max_key_size", SETTING_UINT | SETTING_LIVE, 1, RULES_KEY_SIZE_MAX, NULL,
     RULES_STR(RULES_KEY_SIZE_DEFAULT), F(max_key_size),
     "longest key in bytes; longer is INVALID_ARGUMENT"},
    {"max_message_size", SETTING_UINT, 4096, 1u << 30, NULL, "67108864",
     F(max_message_size), "largest gRPC message in bytes, both directions"},
    {"max_push_mb", SETTING_UINT, 1, 1 << 16, NULL, "256", F(max_push_mb),
     "most page bytes one PushPages stream may carry, in MiB (spooled in the "
     "data directory until the stream ends, then applied 1 MiB at a time); "
     "more is RESOURCE_EXHAUSTED"},
    {"max_memory_mb", SETTING_UINT, 0, UINT64_C(1) << 40, NULL, "0", F(max_memory_mb),
     "memory budget of the node's filters, in MiB: a filter counts its bits "
     "and their page versions (1/512 more; checkpoints, exports and page "
     "pulls read the live bits a page at a time and hold no copy), and an "
     "Import's bytes, each Export's chunk and pushed pages count while held; "
     "a CreateFilter, CreateShard or Export past it is RESOURCE_EXHAUSTED "
     "before anything is allocated or written "
     "(docs/SECURITY.md, Budgets); "
     "0: three quarters of the machine's memory (or of the cgroup's "
     "memory.max), computed at start"},
    {"max_filters", SETTING_UINT, 1, 1000000, NULL, "100000", F(max_filters),
     "most filters (and shards) the node holds; one more is RESOURCE_EXHAUSTED "
     "(filters hold no file descriptor: the node has one log for all)"},
    {"stream_idle_ms", SETTING_UINT, 0, 86400000, NULL, "60000", F(stream_idle_ms),
     "a public stream (AddStream, MayContainStream, Export, Import) that "
     "receives no message, or whose client takes no answer, for this long "
     "is ended with RESOURCE_EXHAUSTED; internal streams (routers' Batches, "
     "pages) are exempt; 0: never"},
    {"internal_streams", SETTING_UINT, 0, 99999, NULL, "32", F(internal_streams),
     "of max_streams, the stream threads only internal streams (Batches, "
     "PullPages, PushPages, ExportShard, ImportShard) may take, so public "
     "streams cannot starve the routers and the merger; less than "
     "max_streams"},
    {"conn_idle_ms", SETTING_UINT, 0, 86400000, NULL, "300000", F(conn_idle_ms),
     "a connection with no call for this long is closed, and one that has "
     "not finished its HTTP/2 handshake within it; 0: gRPC's defaults"},
    {"stream_window_kb", SETTING_UINT, 0, 1u << 20, NULL, "1024", F(stream_window_kb),
     "KiB a client may send on a call ahead of what the node has read (its "
     "HTTP/2 stream window, never grown by BDP probes): a merger's push, an "
     "ImportShard or a router's Batches held by gRPC while the node makes "
     "the last piece durable; 0: gRPC's, which its probes grow to tens of "
     "MiB a call on a fast link (raise it for pushes over a link of long "
     "round trips)"},
    {"threads", SETTING_UINT, 1, 256, NULL, "8", F(threads),
     "RPC worker threads (writes are answered by the commit thread once "
     "durable, so no worker waits for an fsync: about the number of cores)"},
    {"loops", SETTING_UINT, 0, 64, NULL, "1", F(loops),
     "event loops: threads that each read the connections and serve unary "
     "Add, MayContain and Remove start to finish, with no hand-over between "
     "threads (the other threads then never read a socket); one loop answers "
     "tens of thousands of calls a second; 0: none, the worker threads serve "
     "every call and all of them read sockets"},
    {"max_streams", SETTING_UINT, 1, 100000, NULL, "256", F(max_streams),
     "streaming calls open at once (each has a thread, except AddStream, "
     "MayContainStream and the routers' Batches, which the event loop "
     "serves); more get RESOURCE_EXHAUSTED"},
    {"shutdown_grace_ms", SETTING_UINT, 0, 600000, NULL, "3000", F(shutdown_grace_ms),
     "on SIGTERM/SIGINT, how long in-flight calls may finish before cancel"},
    {"log_level", SETTING_ENUM | SETTING_LIVE, 0, 0, "debug|info|warn|error", "info", F(log_level),
     "least severe log level printed"},
    {"log_format", SETTING_ENUM, 0, 0, "text|json", "text", F(log_format),
     "log line format: text (with a syslog priority prefix instead of the time when stderr is the systemd journal) or json (one object per line: time, level, program, source, msg), which the \"listening on\" and \"metrics on\" lines on stdout follow too"},
    {"topology", SETTING_STRING, 0, 0, NULL, "", F(topology),
     "topology file the routers read (docs/TOPOLOGY.md): the node finds its "
     "group there, refuses internal calls made under another version, "
     "enforces the group rules (docs/REPLICATION.md) and pulls changed pages "
     "from the other copies of its group; SIGHUP re-reads it; empty: a node "
     "of its own"},
    {"advertise", SETTING_ADDR, 1, 0, NULL, "", F(advertise),
     "host:port of this node as the topology lists it; empty: the host of "
     "internal_listen (or of listen, without it) with the port bound"},
    {"role", SETTING_STRING, 0, 0, NULL, "", F(role),
     "gone: refused (a group is now a list of equal copies: set topology)"},
    {"primary", SETTING_STRING, 0, 0, NULL, "", F(primary),
     "gone: refused (copies pull from each other: set topology)"},
    RPC_AUTH_SETTINGS(F),
    {"replicate_interval_ms", SETTING_UINT | SETTING_LIVE, 10, 60000, NULL, "1000",
     F(replicate_interval_ms),
     "with a topology: milliseconds between pulls of the pages that changed "
     "on the other copies of the node's group (anti-entropy)"},
    RPC_LISTEN_SETTINGS(struct node_config),
    RPC_METRICS_SETTING(struct node_config),
    RESP_SETTINGS(struct node_config),
    {"metrics_sample_s", SETTING_UINT, 1, 3600, NULL, "30", F(metrics_sample_s),
     "with metrics_listen: seconds between samples of each filter's bits for "
     "the fill, n-hat and estimated FPR gauges (a bounded sample, never a "
     "scan at scrape time)"},
    {"metrics_shards", SETTING_ENUM, 0, 0, "each|filter", "each", F(metrics_shards),
     "with metrics_listen: the per-filter series (bloomgrid_filter_*, "
     "bloomgrid_shard_syncing): each = one series per shard held, labels filter "
     "and shard; filter = one per filter, label filter, its shards on this node "
     "summed (bytes, inserts, capacity, n-hat) or their largest value taken "
     "(FPRs, fill, SYNCING), for nodes that hold thousands of shards "
     "(docs/METRICS.md)"},
};

static const struct settings_spec spec = {
    .program = "bloomgrid-node",
    .section = "node",
    .intro = "bloomgrid-node serves named Bloom filters over gRPC (bloomgrid.v1.BloomGrid,\n"
             "bloomgrid.v1.Internal and grpc.health.v1.Health).  SIGTERM or SIGINT: stop\n"
             "accepting calls, let in-flight calls finish, snapshot, exit 0.  SIGHUP:\n"
             "re-read the --config file and apply the settings marked below (a\n"
             "malformed file is refused and the running settings stay).\n",
    .table = settings,
    .count = sizeof settings / sizeof settings[0],
};

/* Settings that are gone: refused with what replaces them; settings that
 * must agree; values the table's bounds cannot say. */
static int gone_check(const struct node_config *c, char *err, size_t len)
{
    if (c->internal_streams >= c->max_streams) {
        snprintf(err, len, "internal_streams = %llu must be less than "
                 "max_streams = %llu (public streams need threads too)",
                 (unsigned long long)c->internal_streams,
                 (unsigned long long)c->max_streams);
        return -1;
    }
    uint64_t u = c->wal_block_bytes;
    if (u && (u < 4096 || (u & (u - 1)))) {
        snprintf(err, len, "wal_block_bytes = %llu must be 0 (detected) or a "
                 "power of two from 4096 to 1048576", (unsigned long long)u);
        return -1;
    }
    if (c->role[0] || c->primary[0]) {
        snprintf(err, len, "%s is gone: a shard group is a list of equal copies "
                 "in the topology file (copies = HOST:PORT ...); set topology = "
                 "FILE, the file the routers read (docs/REPLICATION.md)",
                 c->role[0] ? "role" : "primary");
        return -1;
    }
    return 0;
}

int node_config_load(struct node_config *c, int argc, char **argv)
{
    char err[SETTINGS_ERRLEN];
    memset(c, 0, sizeof *c);
    int rc = settings_load(&spec, c, argc, argv);
    if (rc == 0 && gone_check(c, err, sizeof err) < 0) {
        fprintf(stderr, "bloomgrid-node: %s\n", err);
        return -1;
    }
    return rc;
}

int node_config_reload(struct node_config *c, int argc, char **argv, char *err)
{
    struct node_config *next = calloc(1, sizeof *next);
    int rc = -1;

    if (!next) {
        snprintf(err, SETTINGS_ERRLEN, "out of memory");
        return -1;
    }
    if (settings_reload(&spec, next, argc, argv, err) == 0 &&
        gone_check(next, err, SETTINGS_ERRLEN) == 0)
        rc = settings_apply(&spec, c, next);
    free(next);
    return rc;
}

/* The cgroup v2 bound on this process's memory, or 0. */
static uint64_t cgroup_memory_max(void)
{
    char path[512] = "/sys/fs/cgroup", line[512];
    unsigned long long v = 0;
    FILE *f = fopen("/proc/self/cgroup", "r");

    /* "0::/PATH": the unified hierarchy. */
    if (f) {
        while (fgets(line, sizeof line, f))
            if (strncmp(line, "0::", 3) == 0) {
                line[strcspn(line, "\n")] = 0;
                snprintf(path, sizeof path, "/sys/fs/cgroup%.400s/memory.max",
                         line + 3);
            }
        fclose(f);
    }
    f = fopen(path, "r");
    if (!f)
        return 0;
    if (fscanf(f, "%llu", &v) != 1)   /* "max": none */
        v = 0;
    fclose(f);
    return v;
}

uint64_t node_config_default_memory_mb(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);
    uint64_t mem = pages > 0 && psize > 0 ? (uint64_t)pages * (uint64_t)psize
                                          : UINT64_C(1) << 30;
    uint64_t cg = cgroup_memory_max();

    if (cg && cg < mem)
        mem = cg;
    uint64_t mb = (mem / 4 * 3) >> 20;
    return mb ? mb : 1;
}

void node_config_usage(FILE *out, const char *prog)
{
    settings_usage(&spec, out, prog);
}
