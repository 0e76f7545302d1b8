/* rpc_check: string fields of a serialized message (see rpc_check.h).
 *
 * The walk follows the protobuf wire format: each field is a varint tag
 * (field number << 3 | wire type) and a value whose size the wire type
 * gives.  Only length-delimited fields can be strings or messages; every
 * other field is skipped by its size, unknown fields included. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "rpc_check.h"
#include "rules.h"
#include "wire.h"

#define WT_VARINT 0
#define WT_FIXED64 1
#define WT_LEN 2
#define WT_FIXED32 5
#define MAX_DEPTH 32

static const char *short_name(const ProtobufCMessageDescriptor *d)
{
    return d->short_name ? d->short_name : d->name;
}

static int walk(const ProtobufCMessageDescriptor *d, const uint8_t *p,
                const uint8_t *end, int depth, char *msg, size_t msglen)
{
    if (depth > MAX_DEPTH) {
        snprintf(msg, msglen, "malformed %s message: nested too deeply",
                 short_name(d));
        return -EBADMSG;
    }
    while (p < end) {
        uint64_t tag, v;
        if (!get_varint(&p, end, &tag) || (tag >> 3) == 0)
            goto malformed;
        switch (tag & 7) {
        case WT_VARINT:
            if (!get_varint(&p, end, &v))
                goto malformed;
            continue;
        case WT_FIXED64:
            if (end - p < 8)
                goto malformed;
            p += 8;
            continue;
        case WT_FIXED32:
            if (end - p < 4)
                goto malformed;
            p += 4;
            continue;
        case WT_LEN:
            if (!get_varint(&p, end, &v) || v > (uint64_t)(end - p))
                goto malformed;
            break;
        default:
            goto malformed;
        }
        const ProtobufCFieldDescriptor *f =
            tag >> 3 <= UINT32_MAX
                ? protobuf_c_message_descriptor_get_field(d, (unsigned)(tag >> 3))
                : NULL;
        if (f && f->type == PROTOBUF_C_TYPE_STRING &&
            (memchr(p, 0, (size_t)v) || !rules_utf8_valid(p, (size_t)v))) {
            /* The label is built only for a string that breaks the rule. */
            char what[160], err[RULES_ERRLEN];
            snprintf(what, sizeof what, "%s.%s", short_name(d), f->name);
            rules_string_check(what, p, (size_t)v, err);
            snprintf(msg, msglen, "%s", err);
            return -EINVAL;
        } else if (f && f->type == PROTOBUF_C_TYPE_MESSAGE) {
            int rc = walk(f->descriptor, p, p + v, depth + 1, msg, msglen);
            if (rc < 0)
                return rc;
        }
        p += v;
    }
    return 0;
malformed:
    snprintf(msg, msglen, "malformed %s message", short_name(d));
    return -EBADMSG;
}

int rpc_check_strings(const ProtobufCMessageDescriptor *d, const uint8_t *buf,
                      size_t len, char *msg, size_t msglen)
{
    if (msglen)
        msg[0] = 0;
    if (!d || len == 0)
        return 0;
    return walk(d, buf, buf + len, 0, msg, msglen);
}
