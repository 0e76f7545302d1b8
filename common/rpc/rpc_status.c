/* rpc_status: names of codes and reasons (see rpc_status.h). */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "rpc_status.h"

static const char *const status_names[] = {
    "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
    "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED",
    "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED",
};

static const char *const reason_names[] = {
    "", "SECRET_MISMATCH", "WRONG_SHARD", "NOT_COUNTING", "DROPPED",
    "PLACEMENT_UNKNOWN",
};

#define COUNT(a) (sizeof a / sizeof a[0])

void rpc_status_set(struct rpc_status *st, grpc_status_code code,
                    const char *fmt, ...)
{
    va_list ap;

    if (!st)
        return;
    st->code = code;
    st->reason = RPC_REASON_NONE;
    va_start(ap, fmt);
    vsnprintf(st->message, sizeof st->message, fmt, ap);
    va_end(ap);
}

const char *rpc_status_name(grpc_status_code code)
{
    if ((unsigned)code < COUNT(status_names))
        return status_names[code];
    return "UNKNOWN";
}

const char *rpc_reason_name(enum rpc_reason reason)
{
    if ((unsigned)reason < COUNT(reason_names))
        return reason_names[reason];
    return "";
}

enum rpc_reason rpc_reason_parse(const char *s, size_t len)
{
    for (unsigned i = 1; i < COUNT(reason_names); i++)
        if (strlen(reason_names[i]) == len && memcmp(reason_names[i], s, len) == 0)
            return (enum rpc_reason)i;
    return RPC_REASON_NONE;
}
