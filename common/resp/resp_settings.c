/* resp_settings: a RESP server's config from the process's settings
 * (resp_settings.h). */
#include "resp_settings.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rules.h"

int resp_settings_config(const struct resp_settings_in *in,
                         struct resp_server_config *out, char *err)
{
    char *end;
    double er = strtod(in->resp_autocreate_error_rate, &end);
    char rerr[RULES_ERRLEN];
    if (*end || end == in->resp_autocreate_error_rate ||
        rules_params_check(in->resp_autocreate_capacity, er, rerr) < 0) {
        snprintf(err, RESP_SERVER_ERRLEN, "resp_autocreate_capacity = %llu, "
                 "resp_autocreate_error_rate = %s: %s",
                 (unsigned long long)in->resp_autocreate_capacity,
                 in->resp_autocreate_error_rate,
                 *end || end == in->resp_autocreate_error_rate
                     ? "the error rate is not a number" : rerr);
        return -EINVAL;
    }
    out->listen = in->resp_listen;
    out->max_connections = (unsigned)in->resp_max_connections;
    out->pipeline_bytes = in->resp_pipeline_bytes;
    out->autocreate = strcmp(in->resp_autocreate, "on") == 0;
    out->autocreate_capacity = in->resp_autocreate_capacity;
    out->autocreate_error_rate = er;
    /* A command is its name, the filter, options and the keys. */
    out->max_args = in->max_batch_keys + 16;
    out->max_key = in->max_key_size;
    /* An argument is a key, a filter name, a number or a token. */
    out->max_bulk = in->max_key_size > 4096 ? in->max_key_size : 4096;
    out->max_command = in->max_message_size;
    out->idle_ms = in->conn_idle_ms;
    return 0;
}
