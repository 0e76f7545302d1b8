/* merger_config: the settings table of bloomgrid-merger (common/base/settings.h
 * does the parsing). */
#include "merger_config.h"

#include <string.h>

#include "rpc_listen.h"
#include "rpc_metrics.h"
#include "rpc_auth.h"
#include "settings.h"

#define F(f) SETTING_FIELD(struct merger_config, f)

static const struct setting settings[] = {
    {"listen", SETTING_ADDR, 0, 0, NULL, "127.0.0.1:7600", F(listen),
     "address to serve the Merger status service and health on, host:port "
     "(port 0 picks a free port)"},
    RPC_HEALTH_LISTEN_SETTING(struct merger_config),
    {"state_dir", SETTING_STRING, 0, 0, NULL, "./bloomgrid-merger",
     F(state_dir),
     "directory of the global snapshots (<filter>/shard-<i>.bf) and of what "
     "was last pulled from each datacenter (<filter>/shard-<i>.state)"},
    {"sources", SETTING_STRING, 0, 0, NULL, "./merger-sources.ini", F(sources),
     "sources file: per filter, [filter NAME] with repeatable keys "
     "\"datacenter = NAME TOPOLOGY-FILE\" (a cluster: one copy of each "
     "group is pulled, every copy pushed to; or HOST:PORT of a single node) and \"partial = FILE\" "
     "(a filter file of the shard, same geometry and secret, or a shard "
     "bundle of the whole filter such as 'bloomgrid build --like' writes: "
     "read a piece at a time, verified, and ORed in whenever it changes)"},
    {"interval_s", SETTING_UINT, 1, 86400, NULL, "60", F(interval_s),
     "seconds between rounds (SIGUSR1 or Merger.RunRound start one at once)"},
    {"node_timeout_ms", SETTING_UINT, 100, 3600000, NULL, "10000",
     F(node_timeout_ms), "deadline of a unary call to a node; page streams get "
     "four times as much"},
    {"max_message_size", SETTING_UINT, 1u << 20, 1u << 30, NULL, "67108864",
     F(max_message_size), "largest gRPC message in bytes, both directions"},
    {"workers", SETTING_UINT, 1, 256, NULL, "4", F(workers),
     "shards pulled, merged and pushed at once (threads); the merger holds "
     "one shard's snapshot in memory per worker (its snapshots stay in "
     "state_dir), so its memory is about workers x the largest shard's "
     "bytes, plus page buffers and the process itself (docs/MERGER.md, "
     "Memory)"},
    RPC_AUTH_SETTINGS(F),
    {"log_level", SETTING_ENUM, 0, 0, "debug|info|warn|error", "info",
     F(log_level), "least severe log level printed"},
    {"log_format", SETTING_ENUM, 0, 0, "text|json", "text", F(log_format),
     "log line format: text (with a syslog priority prefix instead of the time when stderr is the systemd journal) or json (one object per line: time, level, program, source, msg), which the \"listening on\" and \"metrics on\" lines on stdout follow too"},
    RPC_LISTEN_SETTINGS(struct merger_config),
    RPC_METRICS_SETTING(struct merger_config),
};

static const struct settings_spec spec = {
    .program = "bloomgrid-merger",
    .section = "merger",
    .intro =
        "bloomgrid-merger pulls what changed since its last round (the changed\n"
        "pages, or the keys' hashes of add-only ranges) from R copies of every\n"
        "datacenter's groups (and ORs in changed partial files), keeps the\n"
        "union as a versioned global snapshot on its own disk (one shard in\n"
        "memory at a time per worker), and pushes every copy of every\n"
        "datacenter's groups what it lacks (pages, or keys' hashes when the\n"
        "round brought only keys and they are fewer bytes).\n"
        "A quiet round ships nothing.  SIGUSR1 runs a round now; SIGTERM/SIGINT\n"
        "stop.  Serves bloomgrid.v1.Merger (Status, RunRound) and\n"
        "grpc.health.v1.Health.\n"
        "\n"
        "  --once   run one round, print its report, exit (0: no error, 1: "
        "errors)\n",
    .table = settings,
    .count = sizeof settings / sizeof settings[0],
};

int merger_config_load(struct merger_config *c, bool *once, int argc,
                       char **argv)
{
    int nargs = 0;

    *once = false;
    for (int i = 0; i < argc; i++)
        if (i > 0 && strcmp(argv[i], "--once") == 0)
            *once = true;
        else
            argv[nargs++] = argv[i];
    memset(c, 0, sizeof *c);
    return settings_load(&spec, c, nargs, argv);
}
