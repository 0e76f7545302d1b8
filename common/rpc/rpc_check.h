/* rpc_check: the rule every string from the wire obeys, applied to a whole
 * serialized message before anything decodes it.
 *
 * protobuf-c hands string fields over as C strings, so a name with a NUL
 * byte inside ("x\0y") would silently become "x" and name another filter.
 * rpc_check_strings walks the wire bytes of a message with its descriptor
 * and checks every string field, in nested messages too, with
 * rules_string_check (no NUL, valid UTF-8).  The server layer runs it on
 * every request message of every method (rpc_server.c, rpc_stream.c)
 * unless the method's handler decodes and checks its strings itself
 * (struct rpc_handler.checks_strings).
 *
 * Stateless; any thread.
 */
#ifndef BLOOMGRID_RPC_CHECK_H
#define BLOOMGRID_RPC_CHECK_H

#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

/* Check the string fields of the len bytes at buf, a message of type d.
 * Returns 0, -EINVAL when a string field breaks the rule, or -EBADMSG when
 * the bytes are not a well-formed message (nesting deeper than 32 levels
 * counts as malformed); msg (msglen bytes) then says which field and why,
 * e.g. "CreateFilterRequest.name \"x\\x00y\" contains a NUL byte at
 * position 1". */
int rpc_check_strings(const ProtobufCMessageDescriptor *d, const uint8_t *buf,
                      size_t len, char *msg, size_t msglen);

#endif
