/* node_config: the settings of bloomgrid-node, from a config file and flags.
 *
 * One table (node_config.c) lists every setting: its name (the INI key in
 * section [node] and, with '_' as '-', the --flag), type, bounds, default
 * and the field it fills.  Precedence: defaults < config file < flags.  The
 * file is parsed with libinih.
 *
 * Live settings (SETTING_LIVE in the table; SIGHUP applies them through
 * node_config_reload) are _Atomic numbers: handlers read them while the main
 * thread stores a new value.  Every other field is set once at start-up.
 */
#ifndef BLOOMGRID_NODE_CONFIG_H
#define BLOOMGRID_NODE_CONFIG_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "rpc_auth.h"
#include "rpc_listen.h"
#include "rpc_metrics.h"
#include "resp_settings.h"

struct node_config {
    char listen[256];
    char data_dir[1024];
    char durability[16];          /* "fsync" or "none" */
    uint64_t snapshot_interval_s;
    uint64_t snapshot_wal_mb;
    uint64_t checkpoint_log_percent;
    uint64_t wal_block_bytes;     /* 0: detected (wal_unit_detect) */
    uint64_t wal_commit_delay_us; /* wal_set_commit_delay */
    char resp_commit[8];          /* "loop" or "thread" (node_resp.c) */
    _Atomic uint64_t max_batch_keys;    /* live */
    _Atomic uint64_t max_key_size;      /* live */
    uint64_t max_message_size;
    uint64_t max_push_mb;         /* page bytes per PushPages stream */
    uint64_t max_memory_mb;       /* memory budget of the filters; 0 at
                                     load: computed (node_config_memory) */
    uint64_t max_filters;
    uint64_t stream_idle_ms;      /* 0: streams never idle out */
    uint64_t internal_streams;    /* stream threads kept for internal calls */
    uint64_t conn_idle_ms;
    uint64_t stream_window_kb;    /* HTTP/2 stream window of calls to it */
    uint64_t threads;
    uint64_t loops;
    uint64_t max_streams;
    uint64_t shutdown_grace_ms;
    char log_level[16];           /* live; read by the main thread only */
    char log_format[8];           /* text or json */
    char topology[1024];          /* topology file, or "" */
    char advertise[256];          /* this node in the topology, or "" */
    char role[16];                /* gone: refused when set */
    char primary[256];            /* gone: refused when set */
    _Atomic uint64_t replicate_interval_ms;   /* live */
    char internal_listen[256];    /* the Internal service's address, or "" */
    uint64_t metrics_sample_s;    /* fill gauges' sampling period */
    char metrics_shards[8];       /* each or filter: per-filter series */
    RPC_LISTEN_FIELDS
    RPC_METRICS_FIELDS
    RPC_AUTH_FIELDS
    RESP_FIELDS
};

/* Parse argv (and the --config file it names).  Returns 0 when the node
 * should run, 1 when it printed --help / --version and should exit 0, or -1
 * after printing an error naming the setting (exit 2). */
int node_config_load(struct node_config *c, int argc, char **argv);

/* SIGHUP: read argv's --config file and flags again and apply the live
 * settings that changed to c (a changed setting that needs a restart is
 * logged and left).  Call from one thread only.  Returns the number of
 * settings changed, or -1 with a message in err (SETTINGS_ERRLEN bytes)
 * when the file or a flag is refused; c is then untouched. */
int node_config_reload(struct node_config *c, int argc, char **argv, char *err);

/* The default of max_memory_mb: three quarters of the machine's memory
 * (physical pages, or the cgroup's memory.max when lower), in MiB. */
uint64_t node_config_default_memory_mb(void);

/* Print the --help text with every setting. */
void node_config_usage(FILE *out, const char *prog);

#endif
