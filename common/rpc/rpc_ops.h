/* rpc_ops: the op batches every streaming call of the project starts, in
 * one place.
 *
 * A stream sends its initial metadata with its first message and receives
 * the peer's with its first read; both helpers fill ops (room for 2) and
 * return how many ops they filled, for grpc_call_start_batch.
 */
#ifndef BLOOMGRID_RPC_OPS_H
#define BLOOMGRID_RPC_OPS_H

#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#include <grpc/grpc.h>

/* Send msg, preceded by the initial metadata (nmd entries of md: a
 * client's token, rpc_channel_metadata) while *md_sent is false (then
 * set). */
static inline size_t rpc_ops_send_md(grpc_op ops[2], bool *md_sent, grpc_byte_buffer *msg,
                                     grpc_metadata *md, size_t nmd)
{
    size_t n = 0;
    memset(ops, 0, 2 * sizeof *ops);
    if (!*md_sent) {
        ops[n].op = GRPC_OP_SEND_INITIAL_METADATA;
        ops[n].data.send_initial_metadata.count = nmd;
        ops[n++].data.send_initial_metadata.metadata = nmd ? md : NULL;
        *md_sent = true;
    }
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n++].data.send_message.send_message = msg;
    return n;
}

/* rpc_ops_send_md without metadata (a server's streams). */
static inline size_t rpc_ops_send(grpc_op ops[2], bool *md_sent, grpc_byte_buffer *msg)
{
    return rpc_ops_send_md(ops, md_sent, msg, NULL, 0);
}

/* Receive the next message into *msg, preceded the first time by the
 * peer's initial metadata into md. */
static inline size_t rpc_ops_recv(grpc_op ops[2], bool first, grpc_metadata_array *md,
                                  grpc_byte_buffer **msg)
{
    size_t n = 0;
    memset(ops, 0, 2 * sizeof *ops);
    if (first) {
        ops[n].op = GRPC_OP_RECV_INITIAL_METADATA;
        ops[n++].data.recv_initial_metadata.recv_initial_metadata = md;
    }
    ops[n].op = GRPC_OP_RECV_MESSAGE;
    ops[n++].data.recv_message.recv_message = msg;
    return n;
}

#endif
