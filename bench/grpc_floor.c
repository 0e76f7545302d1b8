/* grpc_floor: the node's public service served by the node's own server code
 * (common/rpc/rpc_server.h), with handlers that touch no store.
 *
 * What a single-key call to a node costs is mostly the gRPC core: HTTP/2
 * framing, the completion queues, the thread hand-offs.  This server runs
 * the same rpc_server with the same settings as bloomgrid-node (event
 * loops, worker threads, message limit), and its Add, MayContain, AddStream and
 * MayContainStream decode each request with the node's key-batch codec
 * (common/rpc/rpc_keys.h, its rules included) and answer one "false" per key
 * with the node's encoder, without hashing a key or looking up a filter.
 * A benchmark that calls it with the node's messages measures the floor
 * under every node figure on this machine.  CreateFilter and DropFilter
 * answer OK (an empty FilterInfo / DropFilterResponse) so that load clients
 * can set up as they do against a node; every other method is
 * UNIMPLEMENTED.
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
#include "rpc_keys.h"
#include "rpc_server.h"
#include "rules.h"

/* The widest limits a node can be given: the floor refuses nothing a node
 * would take. */
static const struct rpc_keys_limits limits = {.max_keys = RULES_BATCH_KEYS_MAX,
                                              .max_key = RULES_KEY_SIZE_MAX};

/* Decode a key batch into kb and answer one false per key.  Returns 0, or -1
 * with r holding the error. */
static int answer_keys(struct rpc_keys_buf *kb, enum rpc_keys_op op, const uint8_t *req,
                       size_t len, struct rpc_reply *r)
{
    struct rpc_keys k;

    if (rpc_keys_decode(kb, &limits, op, req, len, &k, r) < 0)
        return -1;
    memset(k.out, 0, k.n * sizeof *k.out);
    return rpc_keys_reply(&k, r);
}

static void h_empty(void *arg, const uint8_t *req, size_t len, struct rpc_reply *r)
{
    (void)arg, (void)req, (void)len;
    rpc_reply_alloc(r, 0);
}

static void h_keys(enum rpc_keys_op op, const uint8_t *req, size_t len, struct rpc_reply *r)
{
    struct rpc_keys_buf *kb = rpc_keys_thread_buf();
    if (!kb) {
        rpc_reply_error(r, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    answer_keys(kb, op, req, len, r);
}

static void h_add(void *arg, const uint8_t *req, size_t len, struct rpc_reply *r)
{
    (void)arg;
    h_keys(RPC_KEYS_ADD, req, len, r);
}

static void h_may_contain(void *arg, const uint8_t *req, size_t len, struct rpc_reply *r)
{
    (void)arg;
    h_keys(RPC_KEYS_MAY_CONTAIN, req, len, r);
}

/* One answer message per request message, sent while the next is read. */
static void keys_stream(enum rpc_keys_op op, struct rpc_stream *st)
{
    struct rpc_keys_buf kb = {0};
    const uint8_t *req;
    size_t len;
    int rc;

    while ((rc = rpc_stream_read(st, &req, &len)) == 1) {
        struct rpc_reply r = {.st.code = GRPC_STATUS_OK};
        if (answer_keys(&kb, op, req, len, &r) < 0) {
            rpc_stream_finish_status(st, &r.st);
            goto out;
        }
        if (rpc_stream_send(st, r.has_body ? r.body : grpc_empty_slice()) < 0)
            goto out;
    }
    if (rc == 0)
        rpc_stream_finish(st, GRPC_STATUS_OK, "%s", "");
out:
    rpc_keys_buf_free(&kb);
}

static void h_add_stream(void *arg, struct rpc_stream *st)
{
    (void)arg;
    keys_stream(RPC_KEYS_ADD, st);
}

static void h_may_contain_stream(void *arg, struct rpc_stream *st)
{
    (void)arg;
    keys_stream(RPC_KEYS_MAY_CONTAIN, st);
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: grpc_floor [options]\n"
            "Serve bloomgrid.v1.BloomGrid with handlers that touch no store: Add and\n"
            "MayContain (unary and streams) decode the keys as a node does and answer\n"
            "one \"false\" per key; CreateFilter and DropFilter answer OK; other\n"
            "methods UNIMPLEMENTED.\n"
            "  --listen HOST:PORT   address (port 0: a free one) [127.0.0.1:0]\n"
            "  --loops N            event loops, as the node's `loops` [1]\n"
            "  --threads N          RPC worker threads, as the node's `threads` [8]\n"
            "  --max-message BYTES  largest message, both directions [67108864]\n"
            "  -h, --help           this text\n");
}

int main(int argc, char **argv)
{
    static const struct option lo[] = {{"listen", 1, 0, 'l'},
                                       {"threads", 1, 0, 't'},
                                       {"loops", 1, 0, 'o'},
                                       {"max-message", 1, 0, 'm'},
                                       {"help", 0, 0, 'h'},
                                       {0, 0, 0, 0}};
    /* The node's defaults (node/node_config.c). */
    struct rpc_server_config sc = {
        .listen = "127.0.0.1:0",
        .threads = 8,
        .loops = 1,
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
        case 'o':
            sc.loops = (int)strtol(optarg, &end, 10);
            if (*end || sc.loops < 0 || sc.loops > 64) {
                fprintf(stderr, "grpc_floor: --loops takes 0..64\n");
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
        {.unary = h_add, .checks_strings = true, .loop = true},
        {.unary = h_may_contain, .checks_strings = true, .loop = true},
        {0},
        {.stream = h_add_stream, .checks_strings = true},
        {.stream = h_may_contain_stream, .checks_strings = true},
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
