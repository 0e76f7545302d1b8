/* grpc_floor: the node's public service served by the node's own server code
 * (common/rpc_server.h), with handlers that touch no store.
 *
 * What a single-key call to a node costs is mostly the gRPC core: HTTP/2
 * framing, the completion queues, the thread hand-offs.  This server runs
 * the same rpc_server with the same settings as bloomgrid-node (worker
 * threads, message limit), and its Add, MayContain, AddStream and
 * MayContainStream only count the keys of each request and answer as many
 * "false" (a packed repeated bool, the node's reply layout), so a benchmark
 * that calls it with the node's messages measures the floor under every
 * node figure on this machine.  CreateFilter and DropFilter answer OK (an
 * empty FilterInfo / DropFilterResponse) so that load clients can set up as
 * they do against a node; every other method is UNIMPLEMENTED.
 *
 * Prints "grpc_floor listening on HOST:PORT" once it serves (like the
 * node), then serves until SIGTERM or SIGINT.
 */
#include <errno.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/grpc.h>

#include "bloomgrid/v1/bloomgrid.pb-c.h"
#include "rpc_server.h"
#include "wire.h"

/* AddRequest and MayContainRequest: field 2 is `repeated bytes keys`. */
#define KEYS_FIELD 2
#define WIRE_VARINT 0
#define WIRE_FIXED64 1
#define WIRE_LEN 2
#define WIRE_FIXED32 5
/* AddResponse.added / MayContainResponse.present: field 1, packed. */
#define ANSWERS_TAG ((1u << 3) | WIRE_LEN)

/* Count the keys of a key batch without copying anything.  Returns the
 * count or -1 when the message does not parse. */
static long count_keys(const uint8_t *p, size_t len)
{
    const uint8_t *end = p + len;
    long n = 0;

    while (p < end) {
        uint64_t tag, v;
        if (!get_varint(&p, end, &tag))
            return -1;
        switch (tag & 7) {
        case WIRE_VARINT:
            if (!get_varint(&p, end, &v))
                return -1;
            break;
        case WIRE_FIXED64:
        case WIRE_FIXED32: {
            size_t w = (tag & 7) == WIRE_FIXED64 ? 8 : 4;
            if ((size_t)(end - p) < w)
                return -1;
            p += w;
            break;
        }
        case WIRE_LEN:
            if (!get_varint(&p, end, &v) || v > (uint64_t)(end - p))
                return -1;
            p += v;
            if (tag >> 3 == KEYS_FIELD)
                n++;
            break;
        default:
            return -1;
        }
    }
    return n;
}

/* The reply of n answers, all false, written at out (reply_len bytes). */
static size_t reply_len(size_t n)
{
    return n ? 1 + varint_len(n) + n : 0;
}

static void reply_write(uint8_t *out, size_t n)
{
    if (!n)
        return;
    *out++ = ANSWERS_TAG;
    out = put_varint(out, n);
    memset(out, 0, n);
}

static void h_empty(void *arg, const uint8_t *req, size_t len, struct rpc_reply *r)
{
    (void)arg, (void)req, (void)len;
    rpc_reply_alloc(r, 0);
}

static void h_keys(void *arg, const uint8_t *req, size_t len, struct rpc_reply *r)
{
    (void)arg;
    long n = count_keys(req, len);
    if (n < 0) {
        rpc_reply_error(r, GRPC_STATUS_INVALID_ARGUMENT, "malformed key batch");
        return;
    }
    uint8_t *out = rpc_reply_alloc(r, reply_len((size_t)n));
    if (!out) {
        rpc_reply_error(r, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    reply_write(out, (size_t)n);
}

/* One answer message per request message, sent while the next is read. */
static void h_keys_stream(void *arg, struct rpc_stream *st)
{
    (void)arg;
    const uint8_t *req;
    size_t len;
    int rc;

    while ((rc = rpc_stream_read(st, &req, &len)) == 1) {
        long n = count_keys(req, len);
        if (n < 0) {
            rpc_stream_finish(st, GRPC_STATUS_INVALID_ARGUMENT, "malformed key batch");
            return;
        }
        grpc_slice body = grpc_slice_malloc(reply_len((size_t)n));
        reply_write(GRPC_SLICE_START_PTR(body), (size_t)n);
        if (rpc_stream_send(st, body) < 0)
            return;
    }
    if (rc == 0)
        rpc_stream_finish(st, GRPC_STATUS_OK, "%s", "");
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: grpc_floor [options]\n"
            "Serve bloomgrid.v1.BloomGrid with handlers that touch no store: Add and\n"
            "MayContain (unary and streams) answer one \"false\" per key; CreateFilter\n"
            "and DropFilter answer OK; other methods UNIMPLEMENTED.\n"
            "  --listen HOST:PORT   address (port 0: a free one) [127.0.0.1:0]\n"
            "  --threads N          RPC worker threads, as the node's `threads` [8]\n"
            "  --max-message BYTES  largest message, both directions [67108864]\n"
            "  -h, --help           this text\n");
}

int main(int argc, char **argv)
{
    static const struct option lo[] = {{"listen", 1, 0, 'l'},
                                       {"threads", 1, 0, 't'},
                                       {"max-message", 1, 0, 'm'},
                                       {"help", 0, 0, 'h'},
                                       {0, 0, 0, 0}};
    /* The node's defaults (node/node_config.c). */
    struct rpc_server_config sc = {
        .listen = "127.0.0.1:0",
        .threads = 8,
        .max_message = 64u << 20,
        .grace_ms = 1000,
    };
    int c;
    char *end;

    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (c) {
        case 'l':
            sc.listen = optarg;
            break;
        case 't':
            sc.threads = (int)strtol(optarg, &end, 10);
            if (*end || sc.threads < 1 || sc.threads > 256) {
                fprintf(stderr, "grpc_floor: --threads takes 1..256\n");
                return 2;
            }
            break;
        case 'm':
            errno = 0;
            sc.max_message = strtoull(optarg, &end, 10);
            if (errno || *end || sc.max_message < 4096 || sc.max_message > (1u << 30)) {
                fprintf(stderr, "grpc_floor: --max-message takes 4096..1073741824\n");
                return 2;
            }
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "grpc_floor: unexpected argument %s (see --help)\n", argv[optind]);
        return 2;
    }

    /* Descriptor order: CreateFilter, DropFilter, ListFilters, GetFilter,
     * Add, MayContain, Remove, AddStream, MayContainStream, Export, Import. */
    static const struct rpc_handler handlers[] = {
        {.unary = h_empty},
        {.unary = h_empty},
        {0},
        {0},
        {.unary = h_keys, .checks_strings = true},
        {.unary = h_keys, .checks_strings = true},
        {0},
        {.stream = h_keys_stream, .checks_strings = true},
        {.stream = h_keys_stream, .checks_strings = true},
        {0},
        {0},
    };
    const ProtobufCServiceDescriptor *sd = &bloomgrid__v1__bloom_grid__descriptor;
    if (sd->n_methods != sizeof handlers / sizeof handlers[0]) {
        fprintf(stderr, "grpc_floor: the handler table does not match the service\n");
        return 1;
    }

    rpc_signals_block();
    grpc_init();
    int rc = 1;
    struct rpc_server *srv = rpc_server_create(&sc);
    if (!srv) {
        fprintf(stderr, "grpc_floor: cannot create the server\n");
        goto out;
    }
    rpc_server_add_service(srv, sd, handlers, NULL);
    int port = rpc_server_start(srv);
    if (port < 0) {
        fprintf(stderr, "grpc_floor: cannot listen on %s\n", sc.listen);
        goto out;
    }
    rpc_server_set_health(srv, "", true);
    char host[256];
    snprintf(host, sizeof host, "%s", sc.listen);
    char *colon = strrchr(host, ':');
    if (colon)
        *colon = 0;
    printf("grpc_floor listening on %s:%d\n", host, port);
    fflush(stdout);
    rpc_signals_wait();
    rc = 0;
out:
    rpc_server_destroy(srv);
    grpc_shutdown();
    return rc;
}
