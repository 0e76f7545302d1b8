/* merger_config: the settings of bloomgrid-merger, from a config file and
 * flags.
 *
 * One table (merger_config.c) lists every setting: its name (the INI key in
 * section [merger] and, with '_' as '-', the --flag), type, bounds, default
 * and the field it fills.  Precedence: defaults < config file < flags; the
 * parsing is common/base/settings.h's.  --once is a mode, not a setting.
 */
#ifndef BLOOMGRID_MERGER_CONFIG_H
#define BLOOMGRID_MERGER_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#include "rpc_auth.h"
#include "rpc_listen.h"
#include "rpc_metrics.h"

#define MG_PATH_MAX 1024

struct merger_config {
    char listen[256];
    char state_dir[MG_PATH_MAX];
    char sources[MG_PATH_MAX];
    uint64_t interval_s;
    uint64_t node_timeout_ms;
    uint64_t max_message_size;
    uint64_t workers;             /* shards handled at once */
    char log_level[16];
    char log_format[8];           /* text or json */
    RPC_LISTEN_FIELDS
    RPC_METRICS_FIELDS
    RPC_AUTH_FIELDS
};

/* Parse argv (and the --config file it names) into *c; *once is set when
 * --once was given (argv is reordered to take it out).  Returns 0 when the
 * merger should run, 1 when it printed --help / --version and should exit
 * 0, or -1 after printing an error naming the setting (exit 2). */
int merger_config_load(struct merger_config *c, bool *once, int argc,
                       char **argv);

#endif
