/* rpc_keys: the one codec of the public key batches (AddRequest,
 * MayContainRequest, RemoveRequest and their answers, alone or on
 * AddStream / MayContainStream), used by the node, the router and the tool.
 *
 * Requests are decoded by hand, in one bounds-checked pass that applies the
 * rules of rules.h as it goes (filter name on its exact bytes, number of
 * keys, size of each key) and records where each key lies inside the
 * request instead of copying it.  bench/bench_codec measures why, in one
 * run: protobuf-c, even unpacking into an rpc_arena, costs about 4x this
 * decoder with the server's string check it needs (it copies every key),
 * and makes a whole call to one server thread on loopback 5-20 % slower
 * with 100 keys and about a third slower with 1000.  The decoder accepts
 * only what protobuf-c accepts and yields the same fields
 * (tests/unit/rpc/test_rpc_keys.c checks it field by field, truncations and
 * unknown fields included).  Everything else goes through protobuf-c: the
 * answers (one packed repeated bool; a hand encoder saved about 1 % of a
 * call), and on the tool's side the requests and the reading of answers.
 *
 * The filter name is the only string of a request; its rule (rules.h) is
 * stricter than the server's string rule (no NUL, valid UTF-8), so servers
 * register these handlers with checks_strings (rpc_server.h): "F\0junk" is
 * refused as a name, never read as "F".
 *
 * A struct rpc_keys_buf belongs to one thread at a time (one per worker
 * thread or per stream); nothing else here keeps state.
 */
#ifndef BLOOMGRID_RPC_KEYS_H
#define BLOOMGRID_RPC_KEYS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <grpc/slice.h>
#include <protobuf-c/protobuf-c.h>

#include "rpc_server.h"
#include "rules.h"

/* Field numbers of the requests (bloomgrid.proto; the unit test checks them
 * against the generated descriptors). */
#define RPC_KEYS_FIELD_FILTER 1      /* string filter */
#define RPC_KEYS_FIELD_KEYS 2        /* repeated bytes keys */

enum rpc_keys_op { RPC_KEYS_ADD, RPC_KEYS_MAY_CONTAIN, RPC_KEYS_REMOVE };

/* The settings a request is checked against. */
struct rpc_keys_limits {
    uint64_t max_keys;       /* max_batch_keys */
    uint64_t max_key;        /* max_key_size */
};

/* Arrays reused from request to request, grown to the largest batch seen
 * (at most max_keys entries).  Zero it before the first use. */
struct rpc_keys_buf {
    const uint8_t **ptr;
    uint32_t *len;
    bool *out;
    protobuf_c_boolean *wire;
    size_t cap;
};

/* A decoded request.  key and len point into the request bytes and into
 * the buf it was decoded with: valid while both are. */
struct rpc_keys {
    enum rpc_keys_op op;
    char filter[RULES_FILTER_NAME_MAX + 1];   /* "" when the request names none */
    size_t n;
    const uint8_t *const *key;   /* key[i] is len[i] bytes */
    const uint32_t *len;
    bool *out;                   /* room for the n answers (rpc_keys_reply) */
    protobuf_c_boolean *wire;    /* rpc_keys_reply's */
};

/* Free the arrays of b (it may be used again, as zeroed). */
void rpc_keys_buf_free(struct rpc_keys_buf *b);

/* The calling thread's buf, freed when the thread exits; NULL when out of
 * memory. */
struct rpc_keys_buf *rpc_keys_thread_buf(void);

/* Decode and check the request of op in buf[0..len).  Returns 0, or -1 with
 * r set: INVALID_ARGUMENT for malformed bytes ("malformed request message
 * (byte 7 of 20)"), a bad filter name, an empty or too long key;
 * RESOURCE_EXHAUSTED for more than max_keys keys or when memory runs out.
 * The first offence in the order of the bytes is the one reported. */
int rpc_keys_decode(struct rpc_keys_buf *b, const struct rpc_keys_limits *lim,
                    enum rpc_keys_op op, const uint8_t *buf, size_t len,
                    struct rpc_keys *out, struct rpc_reply *r);

/* Set r's body to the answer of k's request, k->out[0..k->n) (protobuf-c
 * packs it).  Returns 0 or -ENOMEM (r then RESOURCE_EXHAUSTED). */
int rpc_keys_reply(const struct rpc_keys *k, struct rpc_reply *r);

/* Client side. */

/* The request of op naming filter with key[0..n), packed by protobuf-c into
 * a new slice that the caller unrefs. */
grpc_slice rpc_keys_request(enum rpc_keys_op op, const char *filter,
                            const ProtobufCBinaryData *key, size_t n);

/* Read the answer of op in buf[0..len) (packed or not; unknown fields are
 * skipped) into out[0..want) with protobuf-c.  Returns 0, or -EBADMSG when
 * it is malformed or holds another number of answers than want. */
int rpc_keys_answer(enum rpc_keys_op op, const uint8_t *buf, size_t len,
                    bool *out, size_t want);

#endif
