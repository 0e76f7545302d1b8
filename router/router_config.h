/* router_config: the settings of bloomgrid-router, from a config file and flags.
 *
 * One table (router_config.c) lists every setting: its name (the INI key in
 * section [router] and, with '_' as '-', the --flag), type, bounds, default
 * and the field it fills.  Precedence: defaults < config file < flags.  The
 * file is parsed with libinih.
 */
#ifndef BLOOMGRID_ROUTER_CONFIG_H
#define BLOOMGRID_ROUTER_CONFIG_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "canary.h"
#include "rules.h"
#include "rpc_auth.h"
#include "rpc_listen.h"
#include "rpc_metrics.h"
#include "resp_settings.h"

/* The default of max_memory_mb: with the router's own few tens of MiB, a
 * router stays under 1 GiB. */
#define ROUTER_MEMORY_MB_DEFAULT 512

struct router_config {
    char listen[256];
    uint64_t health_probe_ms;     /* between probes of the nodes */
    char topology[1024];
    uint64_t default_shards;
    uint64_t default_shard_mb;
    uint64_t node_timeout_ms;
    uint64_t read_failover_ms;
    uint64_t secret_ttl_s;
    uint64_t max_batch_keys;
    uint64_t max_key_size;
    uint64_t max_message_size;
    uint64_t max_memory_mb;       /* requests held at once (rpc_server.h,
                                     "Request budget") */
    uint64_t max_streams;
    uint64_t stream_idle_ms;
    uint64_t conn_idle_ms;
    uint64_t threads;
    uint64_t loops;
    uint64_t max_deferred;
    uint64_t node_queue_mb;
    uint64_t shutdown_grace_ms;
    char log_level[16];
    char log_format[8];           /* text or json */
    /* The canary (router_canary.h); off while canary_filter is "". */
    char canary_filter[RULES_FILTER_NAME_MAX + 1];
    char canary_name[CANARY_NAME_MAX + 1];
    char canary_state_file[1024]; /* "": keys kept in memory only */
    uint64_t canary_interval_ms;
    uint64_t canary_check_keys;
    RPC_LISTEN_FIELDS
    RPC_METRICS_FIELDS
    RPC_AUTH_FIELDS
    RESP_FIELDS
    uint64_t resp_slow_timeout_ms;   /* router_resp.h */
};

/* Parse argv (and the --config file it names).  Returns 0 when the router
 * should run, 1 when it printed --help and should exit 0, or -1 after
 * printing an error naming the setting (exit 2). */
int router_config_load(struct router_config *c, int argc, char **argv);

/* Print the --help text with every setting. */
void router_config_usage(FILE *out, const char *prog);

#endif
