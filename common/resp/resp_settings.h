/* resp_settings: the settings of the Redis door that the node and the
 * router share (their settings tables hold RESP_SETTINGS, their config
 * structs RESP_FIELDS), and how they become a struct resp_server_config.
 *
 * The budgets a RESP connection shares with gRPC keep gRPC's names, read
 * from the process's own settings: max_batch_keys (keys of one command),
 * max_key_size (bytes of one key), max_message_size (bytes of one
 * command) and conn_idle_ms (a connection with nothing received or sent
 * for this long is closed).  Only what has no gRPC counterpart is named
 * resp_*.  Pure, any thread.
 */
#ifndef BLOOMGRID_RESP_SETTINGS_H
#define BLOOMGRID_RESP_SETTINGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "resp_server.h"
#include "settings.h"

#define RESP_FIELDS                                                            \
    char resp_listen[256];           /* "" : no RESP listener */              \
    uint64_t resp_max_connections;                                             \
    uint64_t resp_pipeline_bytes;                                              \
    char resp_autocreate[8];         /* on, off */                             \
    uint64_t resp_autocreate_capacity;                                         \
    char resp_autocreate_error_rate[32];

#define RESP_SETTINGS(type)                                                    \
    {"resp_listen", SETTING_ADDR, 0, 0, NULL, "", SETTING_FIELD(type, resp_listen), \
     "address of the Redis-protocol listener (RESP2/RESP3, RedisBloom's BF.* " \
     "commands: docs/RESP.md), host:port (port 0 picks a free one); the same " \
     "tokens (AUTH), TLS files and listening rule as gRPC; empty: none"},     \
    {"resp_max_connections", SETTING_UINT, 1, 1000000, NULL, "10000",          \
     SETTING_FIELD(type, resp_max_connections),                                \
     "RESP connections open at once; one more is answered \"-ERR max number " \
     "of clients reached\" and closed"},                                       \
    {"resp_pipeline_bytes", SETTING_UINT, 65536, 1u << 30, NULL, "4194304",   \
     SETTING_FIELD(type, resp_pipeline_bytes),                                 \
     "bytes of one RESP connection's commands read but not yet answered, and " \
     "of its replies not yet taken by the client (and of a MULTI's queue); "   \
     "past it the connection is not read until its replies drain"},            \
    {"resp_autocreate", SETTING_ENUM, 0, 0, "on|off", "on",                    \
     SETTING_FIELD(type, resp_autocreate),                                     \
     "on: BF.ADD, BF.MADD and BF.INSERT create a missing filter as RedisBloom " \
     "does, for an admin token or when no tokens are asked for; off: never "   \
     "(BF.RESERVE creates)"},                                                  \
    {"resp_autocreate_capacity", SETTING_UINT, 1, UINT64_C(1) << 40, NULL,     \
     "1000000", SETTING_FIELD(type, resp_autocreate_capacity),                 \
     "capacity of a filter created by its first add (BF.INSERT's CAPACITY "    \
     "overrides): a non-scaling filter in a group of copies, the first layer " \
     "of a scaling one (EXPANSION 2) elsewhere"},                              \
    {"resp_autocreate_error_rate", SETTING_STRING, 0, 0, NULL, "0.01",         \
     SETTING_FIELD(type, resp_autocreate_error_rate),                          \
     "error rate of a filter created by its first add (BF.INSERT's ERROR "     \
     "overrides), in (0, 1)"}

/* The process's settings that make a RESP server's config (strings are
 * pointed to, not copied). */
struct resp_settings_in {
    const char *resp_listen;
    uint64_t resp_max_connections, resp_pipeline_bytes;
    const char *resp_autocreate;
    uint64_t resp_autocreate_capacity;
    const char *resp_autocreate_error_rate;
    uint64_t max_batch_keys, max_key_size, max_message_size, conn_idle_ms;
};

/* Fill out from in (the rest of out is the caller's: prog, version, TLS).
 * Returns 0, or -EINVAL with err (RESP_SERVER_ERRLEN) naming the setting. */
int resp_settings_config(const struct resp_settings_in *in,
                         struct resp_server_config *out, char *err);

#endif
