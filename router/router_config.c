/* router_config: the settings table of bloomgrid-router (common/base/settings.h does
 * the parsing). */
#include "router_config.h"

#include <string.h>

#include "canary.h"
#include "rpc_listen.h"
#include "rpc_metrics.h"
#include "rpc_auth.h"
#include "rules.h"
#include "settings.h"

#define F(f) SETTING_FIELD(struct router_config, f)

static const struct setting settings[] = {
    {"listen", SETTING_ADDR, 0, 0, NULL, "127.0.0.1:7500", F(listen),
     "address to serve gRPC on, host:port (port 0 picks a free port)"},
    RPC_HEALTH_LISTEN_SETTING(struct router_config),
    {"health_probe_ms", SETTING_UINT, 50, 60000, NULL, "1000", F(health_probe_ms),
     "milliseconds between the router's health checks of every node (each "
     "bounded by the same time): a filter whose shard has fewer serving "
     "copies than its group's read quorum is NOT_SERVING (docs/ROUTER.md)"},
    {"topology", SETTING_STRING, 0, 0, NULL, "./topology.ini", F(topology),
     "topology file naming the shard groups (docs/TOPOLOGY.md); SIGHUP "
     "re-reads it"},
    {"default_shards", SETTING_UINT, 1, RULES_SHARDS_MAX, NULL, "64", F(default_shards),
     "most shards of a filter created with shards = 0, or at the Redis door "
     "without SHARDS n (a scaling filter gets this many; see default_shard_mb)"},
    {"default_shard_mb", SETTING_UINT, 0, UINT64_C(1) << 30, NULL, "64",
     F(default_shard_mb),
     "a non-scaling filter created without a shard count gets one shard per "
     "this many MiB of its bits (rounded up), at least one per group of the "
     "topology and at most default_shards: a small filter is not cut into "
     "shards it cannot use, and costs less per key; 0: every such filter gets "
     "default_shards (docs/ROUTER.md, \"Shards and the cost of a key\")"},
    {"node_timeout_ms", SETTING_UINT, 10, 600000, NULL, "5000", F(node_timeout_ms),
     "deadline of every call forwarded to a node"},
    {"read_failover_ms", SETTING_UINT, 10, 600000, NULL, "1000", F(read_failover_ms),
     "a read of a group with more copies than its read quorum counts a copy "
     "that has not answered within this many milliseconds as failed and asks "
     "another copy (at most node_timeout_ms)"},
    {"secret_ttl_s", SETTING_UINT, 1, 86400, NULL, "10", F(secret_ttl_s),
     "how long a filter's secret and shard count are cached before they are "
     "checked again"},
    {"max_batch_keys", SETTING_UINT, 1, RULES_BATCH_KEYS_MAX, NULL,
     RULES_STR(RULES_BATCH_KEYS_DEFAULT), F(max_batch_keys),
     "most keys in one request; more is RESOURCE_EXHAUSTED"},
    {"max_key_size", SETTING_UINT, 1, RULES_KEY_SIZE_MAX, NULL,
     RULES_STR(RULES_KEY_SIZE_DEFAULT), F(max_key_size),
     "longest key in bytes; longer is INVALID_ARGUMENT"},
    {"max_message_size", SETTING_UINT, 4096, 1u << 30, NULL, "67108864",
     F(max_message_size), "largest gRPC message in bytes, both directions"},
    {"max_memory_mb", SETTING_UINT, 16, UINT64_C(1) << 20, NULL,
     RULES_STR(ROUTER_MEMORY_MB_DEFAULT), F(max_memory_mb),
     "memory budget of the requests the router holds at once, in MiB: "
     "every request's bytes count from the moment the router has them, with "
     "what it builds from them (about 100 bytes a key), until the call ends, "
     "and so do an Export's chunks and, for a group read by R > 1 copies, "
     "the copies of the shard it ORs; a request of more than "
     "64 KiB still arriving after 20 ms takes the room of max_message_size "
     "while it arrives; large requests may take all but an eighth of the "
     "budget, which stays for small ones; a request past it is "
     "RESOURCE_EXHAUSTED before the router works on it, while other clients' "
     "small calls go on (docs/SECURITY.md, \"The router's budgets\"); at "
     "least 8/7 of max_message_size"},
    {"loops", SETTING_UINT, 0, 64, NULL, "1", F(loops),
     "event loops: threads that each serve unary Add, MayContain and Remove "
     "and the streams to some of the nodes, start to finish, with no hand-over "
     "between threads; one loop answers tens of thousands of calls a second, "
     "add one per core the router should use for them; 0: none, the worker "
     "threads serve them and each link reads its node's answers on a thread "
     "of its own"},
    {"max_streams", SETTING_UINT, 1, 100000, NULL, "256", F(max_streams),
     "streaming calls open at once (each has a thread, except AddStream "
     "and MayContainStream, which the event loops serve); more get "
     "RESOURCE_EXHAUSTED"},
    {"stream_idle_ms", SETTING_UINT, 0, 86400000, NULL, "60000", F(stream_idle_ms),
     "a stream (AddStream, MayContainStream, Export, Import) that receives "
     "no message, or whose client takes no answer, for this long is ended "
     "with RESOURCE_EXHAUSTED; 0: never"},
    {"conn_idle_ms", SETTING_UINT, 0, 86400000, NULL, "300000", F(conn_idle_ms),
     "a connection with no call for this long is closed, and one that has "
     "not finished its HTTP/2 handshake within it (0: gRPC's defaults); a "
     "RESP connection with nothing received or sent for this long and no "
     "command in flight is closed, half-sent commands included (0: never)"},
    {"threads", SETTING_UINT, 1, 256, NULL, "32", F(threads),
     "RPC worker threads for the other calls (catalog, Export, Import), which "
     "may wait for the nodes; as many again for the RESP door's commands that "
     "wait for them (libuv's pool, unless UV_THREADPOOL_SIZE is set)"},
    {"max_deferred", SETTING_UINT, 1, 1u << 20, NULL, "4096", F(max_deferred),
     "unary key calls (Add, MayContain, Remove) waiting for their nodes at "
     "once; more get RESOURCE_EXHAUSTED"},
    {"node_queue_mb", SETTING_UINT, 1, 65536, NULL, "64", F(node_queue_mb),
     "MiB of key batches that may wait to be sent to one node; more is "
     "RESOURCE_EXHAUSTED"},
    {"shutdown_grace_ms", SETTING_UINT, 0, 600000, NULL, "3000", F(shutdown_grace_ms),
     "on SIGTERM/SIGINT, how long in-flight calls may finish before cancel"},
    RPC_AUTH_SETTINGS(F),
    {"log_level", SETTING_ENUM, 0, 0, "debug|info|warn|error", "info", F(log_level),
     "least severe log level printed"},
    {"log_format", SETTING_ENUM, 0, 0, "text|json", "text", F(log_format),
     "log line format: text (with a syslog priority prefix instead of the time when stderr is the systemd journal) or json (one object per line: time, level, program, source, msg), which the \"listening on\" and \"metrics on\" lines on stdout follow too"},
    RPC_LISTEN_SETTINGS(struct router_config),
    RPC_METRICS_SETTING(struct router_config),
    RESP_SETTINGS(struct router_config),
    {"resp_slow_timeout_ms", SETTING_UINT, 100, 600000, NULL, "5000",
     F(resp_slow_timeout_ms),
     "longest a RESP command waits for the router's slow path (the first check "
     "of a filter on every copy, its creation, BF.INFO, BF.CARD, DEL); past it "
     "the command is answered -UNAVAILABLE saying what was under way (an add "
     "then writes nothing) and the connection's later commands on that filter "
     "go on"},
    {"canary_filter", SETTING_STRING, 0, 0, NULL, "", F(canary_filter),
     "filter the router's canary adds a key to every canary_interval_ms and "
     "asks for every earlier one (bloomgrid_canary_false_negatives_total, "
     "docs/ROUTER.md); the filter must exist; empty: no canary"},
    {"canary_interval_ms", SETTING_UINT, 100, 86400000, NULL, "60000",
     F(canary_interval_ms), "milliseconds between canary rounds"},
    {"canary_check_keys", SETTING_UINT, 1, CANARY_CHECK_MAX, NULL, "1000",
     F(canary_check_keys),
     "earlier canary keys asked for per round at most: all while there are "
     "no more, then the newest half and a sample of the older ones"},
    {"canary_name", SETTING_STRING, 0, 0, NULL, "router", F(canary_name),
     "the canary's name in its keys, bloomgrid-canary/NAME/SEQ: letters, "
     "digits, '.', '_', '-'"},
    {"canary_state_file", SETTING_STRING, 0, 0, NULL, "", F(canary_state_file),
     "file recording how many canary keys were acknowledged, so that a "
     "restarted router checks the keys of its earlier runs; empty: the "
     "router checks only the keys it added since it started"},
};

static const struct settings_spec spec = {
    .program = "bloomgrid-router",
    .section = "router",
    .intro = "bloomgrid-router serves the public bloomgrid.v1.BloomGrid API (and\n"
             "grpc.health.v1.Health) in front of the nodes named by a topology file.\n"
             "It hashes every key once with the filter's secret, sends the hashes\n"
             "of every node's shards on long-lived streams to it (the batches of\n"
             "concurrent calls travel together) and answers in request order.  It\n"
             "keeps no state of its own: any number of routers may serve one\n"
             "cluster.\n\n"
             "Signals: SIGHUP re-reads the topology file (a malformed file is refused\n"
             "and the old topology stays); SIGTERM or SIGINT stop accepting calls, let\n"
             "in-flight calls finish and exit 0.\n",
    .table = settings,
    .count = sizeof settings / sizeof settings[0],
};

/* What the table cannot say of the budgets; prints the error. */
static int budget_settings_check(const struct router_config *c, const char *prog)
{
    /* Large requests take at most seven eighths of the budget, and one
     * that is still arriving takes the room of a whole message. */
    uint64_t large = (c->max_memory_mb << 20) - (c->max_memory_mb << 20) / 8;
    if (large < c->max_message_size) {
        fprintf(stderr, "%s: max_memory_mb = %llu leaves no room for a message of "
                "max_message_size = %llu bytes (large requests may take seven "
                "eighths of the budget): raise max_memory_mb to at least %llu or "
                "lower max_message_size\n", prog,
                (unsigned long long)c->max_memory_mb,
                (unsigned long long)c->max_message_size,
                (unsigned long long)((c->max_message_size * 8 / 7 + (1u << 20) - 1) >> 20));
        return -1;
    }
    return 0;
}

/* What the table cannot say of the canary settings; prints the error. */
static int canary_settings_check(const struct router_config *c, const char *prog)
{
    char err[RULES_ERRLEN];

    if (canary_name_check("canary_name", c->canary_name, err) < 0) {
        fprintf(stderr, "%s: %s\n", prog, err);
        return -1;
    }
    if (c->canary_filter[0] &&
        rules_filter_name_check(c->canary_filter, strlen(c->canary_filter), err) < 0) {
        fprintf(stderr, "%s: canary_filter: %s\n", prog, err);
        return -1;
    }
    if (!c->canary_filter[0] && c->canary_state_file[0]) {
        fprintf(stderr, "%s: canary_state_file is set but canary_filter is not "
                "(name the filter the canary writes to)\n", prog);
        return -1;
    }
    return 0;
}

int router_config_load(struct router_config *c, int argc, char **argv)
{
    memset(c, 0, sizeof *c);
    int rc = settings_load(&spec, c, argc, argv);
    if (rc == 0 && (canary_settings_check(c, argv[0]) < 0 ||
                    budget_settings_check(c, argv[0]) < 0))
        return -1;
    return rc;
}

void router_config_usage(FILE *out, const char *prog)
{
    settings_usage(&spec, out, prog);
}
