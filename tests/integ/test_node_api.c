/* Integration tests of bloomgrid-node: every RPC of the public and internal
 * services, every error code, health, unknown methods, malformed messages
 * and SIGTERM, against a real node process on a loopback port.
 *
 * usage: test_node_api NODE_BINARY (api|errors|streams|internal)
 */
#include <grpc/grpc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "grpc/health/v1/health.pb-c.h"
#include "harness.h"

#define GS(c) GRPC_STATUS_##c

static void test_api(struct node_proc *np)
{
    struct rpc_status st;
    struct rpc_channel *ch = np->ch;
    const size_t n = 5000;
    char **keys = keys_make("user", 0, n), **other = keys_make("nobody", 0, n);
    bool *out = calloc(n, sizeof *out);

    CHECK(node_health(np, "") == 1, "health SERVING");
    CHECK(node_health(np, "bloomgrid.v1.BloomGrid") == 1, "service health");
    CHECK(t_create(ch, "slugs", 100000, 0.01, 0, &st) == 0, "create: %s", st.message);
    CHECK(t_create(ch, "counts", 10000, 0.01, 3, &st) == 0, "create counting: %s",
          st.message);

    /* Add: first time every key is new (a few may collide), second time none. */
    CHECK(t_keys(ch, "Add", "slugs", keys, n, out, &st) == 0, "add: %s", st.message);
    size_t added = 0;
    for (size_t i = 0; i < n; i++)
        added += out[i];
    CHECK(added > n - 10, "added %zu of %zu", added, n);
    CHECK(t_keys(ch, "Add", "slugs", keys, n, out, &st) == 0, "add again");
    for (size_t i = 0; i < n; i++)
        CHECK(!out[i], "key %zu reported new twice", i);
    CHECK(t_keys(ch, "MayContain", "slugs", keys, n, out, &st) == 0, "query");
    for (size_t i = 0; i < n; i++)
        CHECK(out[i], "false negative for %s", keys[i]);
    CHECK(t_keys(ch, "MayContain", "slugs", other, n, out, &st) == 0, "query");
    size_t fp = 0;
    for (size_t i = 0; i < n; i++)
        fp += out[i];
    CHECK(fp < n / 20, "%zu false positives of %zu", fp, n);

    /* An empty batch is a valid batch. */
    CHECK(t_keys(ch, "MayContain", "slugs", keys, 0, out, &st) == 0, "empty batch");

    /* GetFilter / ListFilters. */
    Bloomgrid__V1__FilterInfo *fi;
    CHECK(t_get(ch, "slugs", &fi, &st) == 0, "get: %s", st.message);
    CHECK(strcmp(fi->name, "slugs") == 0, "name");
    CHECK(fi->capacity == 100000 && fi->error_rate == 0.01, "geometry");
    CHECK(fi->kind == BLOOMGRID__V1__FILTER_KIND__FILTER_KIND_BLOCKED, "kind %d", fi->kind);
    CHECK(fi->bits > 0 && fi->hashes > 0 && fi->bytes > 0, "bits");
    CHECK(fi->state == BLOOMGRID__V1__FILTER_STATE__FILTER_STATE_READY, "state");
    CHECK(fi->estimated_count > n * 0.9 && fi->estimated_count < n * 1.1,
          "estimated_count %f", fi->estimated_count);
    CHECK(fi->fill_ratio > 0 && fi->estimated_error_rate > 0, "estimates");
    CHECK(fi->version > 0, "version");
    CHECK(fi->n_shard_info == 1, "shard info");
    bloomgrid__v1__filter_info__free_unpacked(fi, NULL);

    Bloomgrid__V1__ListFiltersRequest lrq = BLOOMGRID__V1__LIST_FILTERS_REQUEST__INIT;
    Bloomgrid__V1__ListFiltersResponse *lr = NULL;
    CHECK(rpc_call(ch, "/bloomgrid.v1.BloomGrid/ListFilters", &lrq.base,
                   &bloomgrid__v1__list_filters_response__descriptor,
                   (ProtobufCMessage **)&lr, TIMEOUT_MS, &st) == 0,
          "list: %s", st.message);
    CHECK(lr->n_filters == 2, "%zu filters", lr->n_filters);
    CHECK(strcmp(lr->filters[0]->name, "counts") == 0 &&
              strcmp(lr->filters[1]->name, "slugs") == 0,
          "sorted names");
    bloomgrid__v1__list_filters_response__free_unpacked(lr, NULL);

    /* Remove on a counting filter. */
    CHECK(t_keys(ch, "Add", "counts", keys, 100, out, &st) == 0, "add counting");
    CHECK(t_keys(ch, "Remove", "counts", keys, 50, out, &st) == 0, "remove: %s",
          st.message);
    for (size_t i = 0; i < 50; i++)
        CHECK(out[i], "remove %zu", i);
    CHECK(t_keys(ch, "MayContain", "counts", keys + 50, 50, out, &st) == 0, "q");
    for (size_t i = 0; i < 50; i++)
        CHECK(out[i], "kept key %zu lost by remove", i);

    /* Durability across a clean restart. */
    char dir[512];
    snprintf(dir, sizeof dir, "%s", np->dir);
    CHECK(node_stop(np, SIGTERM) == 0, "SIGTERM exits 0");
    node_start(np, dir, NULL);
    CHECK(node_wait_health(np, true, 10000), "SERVING after restart");
    CHECK(t_keys(np->ch, "MayContain", "slugs", keys, n, out, &st) == 0, "query: %s",
          st.message);
    for (size_t i = 0; i < n; i++)
        CHECK(out[i], "key %s lost across restart", keys[i]);

    /* Drop. */
    CHECK(t_drop(np->ch, "counts", &st) == 0, "drop: %s", st.message);
    CHECK(t_get(np->ch, "counts", &fi, &st) == GS(NOT_FOUND), "dropped gone");
    free(out);
    keys_free(keys, n);
    keys_free(other, n);
}

static void expect(int got, int want, const struct rpc_status *st, const char *what)
{
    CHECK(got == want, "%s: got %s (%s), want %s", what, rpc_status_name(got),
          st->message, rpc_status_name(want));
    CHECK(want == 0 || st->message[0], "%s: status without a message", what);
    printf("  %-40s %s: %s\n", what, rpc_status_name(got), st->message);
}

/* The next status a Watch stream sends, or -1. */
static int watch_next(struct rpc_cstream *w)
{
    grpc_slice sl;
    if (rpc_cstream_read(w, &sl) != 1)
        return -1;
    Grpc__Health__V1__HealthCheckResponse *r = grpc__health__v1__health_check_response__unpack(
        NULL, GRPC_SLICE_LENGTH(sl), GRPC_SLICE_START_PTR(sl));
    grpc_slice_unref(sl);
    int s = r ? (int)r->status : -1;
    if (r)
        grpc__health__v1__health_check_response__free_unpacked(r, NULL);
    return s;
}

static void test_errors(struct node_proc *np)
{
    struct rpc_status st;
    struct rpc_channel *ch = np->ch;
    bool out[200];
    char *k1[] = {"a"};

    CHECK(t_create(ch, "f", 1000, 0.01, 0, &st) == 0, "create");
    expect(t_create(ch, "f", 1000, 0.01, 0, &st), GS(ALREADY_EXISTS), &st,
           "create duplicate");
    expect(t_create(ch, "g", 0, 0.01, 0, &st), GS(INVALID_ARGUMENT), &st,
           "capacity 0");
    expect(t_create(ch, "g", 10, 0.0, 0, &st), GS(INVALID_ARGUMENT), &st,
           "error_rate 0");
    expect(t_create(ch, "g", 10, 1.0, 0, &st), GS(INVALID_ARGUMENT), &st,
           "error_rate 1");
    expect(t_create(ch, "g", 10, -0.5, 0, &st), GS(INVALID_ARGUMENT), &st,
           "error_rate negative");
    expect(t_create(ch, "g", 10, 0.01, 9, &st), GS(INVALID_ARGUMENT), &st,
           "unknown kind");
    expect(t_create(ch, "bad/name", 10, 0.01, 0, &st), GS(INVALID_ARGUMENT), &st,
           "bad name");
    expect(t_create(ch, "", 10, 0.01, 0, &st), GS(INVALID_ARGUMENT), &st,
           "empty name");
    expect(t_drop(ch, "nope", &st), GS(NOT_FOUND), &st, "drop unknown");
    Bloomgrid__V1__FilterInfo *fi;
    expect(t_get(ch, "nope", &fi, &st), GS(NOT_FOUND), &st, "get unknown");
    expect(t_keys(ch, "Add", "nope", k1, 1, out, &st), GS(NOT_FOUND), &st,
           "add unknown filter");
    expect(t_keys(ch, "MayContain", "nope", k1, 1, out, &st), GS(NOT_FOUND), &st,
           "query unknown filter");
    expect(t_keys(ch, "MayContain", "", k1, 1, out, &st), GS(INVALID_ARGUMENT), &st,
           "no filter named");
    char *empty[] = {"x", ""};
    expect(t_keys(ch, "Add", "f", empty, 2, out, &st), GS(INVALID_ARGUMENT), &st,
           "empty key");
    /* Nothing of a refused batch is stored. */
    char *x[] = {"x"};
    CHECK(t_keys(ch, "MayContain", "f", x, 1, out, &st) == 0 && !out[0],
          "refused batch left key x behind");
    char *big = malloc(5000);
    memset(big, 'k', 4999);
    big[4999] = 0;
    char *bigk[] = {big};
    expect(t_keys(ch, "Add", "f", bigk, 1, out, &st), GS(INVALID_ARGUMENT), &st,
           "oversize key");
    free(big);
    char **many = keys_make("m", 0, 150);
    expect(t_keys(ch, "Add", "f", many, 150, out, &st), GS(RESOURCE_EXHAUSTED), &st,
           "batch over max_batch_keys");
    CHECK(t_keys(ch, "Add", "f", many, 100, out, &st) == 0, "batch at limit");
    keys_free(many, 150);
    expect(t_keys(ch, "Remove", "f", k1, 1, out, &st), GS(FAILED_PRECONDITION), &st,
           "remove on blocked");

    /* Unknown method and unknown service. */
    grpc_slice resp;
    expect(rpc_call_raw(ch, "/bloomgrid.v1.BloomGrid/Nope", "", 0, &resp, 2000, &st)
               < 0 ? st.code : 0,
           GS(UNIMPLEMENTED), &st, "unknown method");
    expect(rpc_call_raw(ch, "/no.Such/Thing", "", 0, &resp, 2000, &st) < 0 ? st.code : 0,
           GS(UNIMPLEMENTED), &st, "unknown service");
    expect(rpc_call_raw(ch, "/bloomgrid.v1.Internal/PullPages", "", 0, &resp, 2000,
                        &st) < 0 ? st.code : 0,
           GS(INVALID_ARGUMENT), &st, "PullPages without a filter");
    CHECK(node_health(np, "no.such.Service") == -GS(NOT_FOUND), "health unknown service");

    /* Malformed messages: INVALID_ARGUMENT and the server lives on. */
    static const unsigned char junk[][12] = {
        {0x12, 0x7f, 'a'},                   /* key length past the end */
        {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, /* bad varint */
        {0x0b},                              /* group wire type */
        {0x08, 0x01},                        /* field 1 as a varint */
        {0x0a, 0x01},                        /* truncated filter name */
    };
    static const size_t junk_len[] = {3, 11, 1, 2, 2};
    static const char *const methods[] = {
        "/bloomgrid.v1.BloomGrid/Add", "/bloomgrid.v1.BloomGrid/MayContain",
        "/bloomgrid.v1.BloomGrid/CreateFilter", "/bloomgrid.v1.BloomGrid/GetFilter",
        "/bloomgrid.v1.Internal/AddHashes", "/grpc.health.v1.Health/Check"};
    for (size_t m = 0; m < sizeof methods / sizeof methods[0]; m++) {
        for (size_t j = 0; j < sizeof junk_len / sizeof junk_len[0]; j++) {
            int rc = rpc_call_raw(ch, methods[m], junk[j], junk_len[j], &resp, 2000, &st);
            if (rc == 0)
                grpc_slice_unref(resp);
            /* Some junk is valid protobuf for a message without that field. */
            CHECK(rc < 0 ? st.code == GS(INVALID_ARGUMENT) : (m >= 2),
                  "%s junk %zu: %s %s", methods[m], j, rpc_status_name(st.code),
                  st.message);
        }
    }
    /* Random bytes: any status but OK-with-garbage is fine; the node lives. */
    srand(12345);
    unsigned char rnd[96];
    int refused = 0;
    for (int i = 0; i < 3000; i++) {
        size_t n = (size_t)(rand() % (int)sizeof rnd);
        for (size_t j = 0; j < n; j++)
            rnd[j] = (unsigned char)rand();
        if (i % 3 == 0 && n > 2) { /* a plausible start: field 2, short length */
            rnd[0] = 0x12;
            rnd[1] = (unsigned char)(rand() % 8);
        }
        const char *m = methods[i % (sizeof methods / sizeof methods[0])];
        if (rpc_call_raw(ch, m, rnd, n, &resp, 2000, &st) == 0)
            grpc_slice_unref(resp);
        else
            refused++;
        CHECK(st.code != GRPC_STATUS_DEADLINE_EXCEEDED && st.code != GRPC_STATUS_UNAVAILABLE,
              "random message %d to %s: %s %s", i, m, rpc_status_name(st.code), st.message);
    }
    printf("  malformed messages: INVALID_ARGUMENT, server alive (%d of 3000 random "
           "messages refused)\n", refused);
    CHECK(node_health(np, "") == 1, "alive after junk");
    CHECK(t_keys(ch, "MayContain", "f", k1, 1, out, &st) == 0, "still serving");

    /* Health Watch: a cancelled watch goes away quietly. */
    Grpc__Health__V1__HealthCheckRequest hrq = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    hrq.service = "";
    struct rpc_cstream *w = rpc_cstream_open(ch, "/grpc.health.v1.Health/Watch", 5000);
    CHECK(w && rpc_cstream_write_msg(w, &hrq.base) == 0, "watch");
    CHECK(watch_next(w) == 1, "watch starts SERVING");
    rpc_cstream_cancel(w);
    rpc_cstream_finish(w, &st);
    hrq.service = "no.such.Service";
    w = rpc_cstream_open(ch, "/grpc.health.v1.Health/Watch", 5000);
    CHECK(w && rpc_cstream_write_msg(w, &hrq.base) == 0, "watch");
    CHECK(watch_next(w) == 3, "unknown service: SERVICE_UNKNOWN");
    rpc_cstream_cancel(w);
    rpc_cstream_finish(w, &st);

    /* SIGTERM: a watcher sees NOT_SERVING, then the node exits 0. */
    hrq.service = "";
    w = rpc_cstream_open(ch, "/grpc.health.v1.Health/Watch", 10000);
    CHECK(w && rpc_cstream_write_msg(w, &hrq.base) == 0, "watch");
    CHECK(watch_next(w) == 1, "watch SERVING");
    kill(np->pid, SIGTERM);
    CHECK(watch_next(w) == 2, "watch sees NOT_SERVING on SIGTERM");
    rpc_cstream_finish(w, &st);
    printf("  health Watch: SERVING, then NOT_SERVING on SIGTERM\n");
    CHECK(node_stop(np, SIGTERM) == 0, "SIGTERM: exit 0");
    printf("  SIGTERM: exit 0\n");
}

/* Add/MayContain streams, Export, Import. */
static void test_streams(struct node_proc *np)
{
    struct rpc_status st;
    struct rpc_channel *ch = np->ch;
    const size_t n = 1000, batches = 20;

    CHECK(t_create(ch, "s", 100000, 0.01, 0, &st) == 0, "create");
    struct rpc_cstream *s = rpc_cstream_open(ch, "/bloomgrid.v1.BloomGrid/AddStream",
                                             TIMEOUT_MS);
    CHECK(s, "open AddStream");
    for (size_t b = 0; b < batches; b++) {
        char prefix[32];
        snprintf(prefix, sizeof prefix, "st%zu", b);
        char **keys = keys_make(prefix, 0, n);
        Bloomgrid__V1__AddRequest rq = BLOOMGRID__V1__ADD_REQUEST__INIT;
        ProtobufCBinaryData *kd = calloc(n, sizeof *kd);
        for (size_t i = 0; i < n; i++) {
            kd[i].data = (uint8_t *)keys[i];
            kd[i].len = strlen(keys[i]);
        }
        rq.filter = b == 0 ? "s" : ""; /* later messages reuse the filter */
        rq.n_keys = n;
        rq.keys = kd;
        CHECK(rpc_cstream_write_msg(s, &rq.base) == 0, "write");
        grpc_slice sl;
        CHECK(rpc_cstream_read(s, &sl) == 1, "read");
        Bloomgrid__V1__AddResponse *r = bloomgrid__v1__add_response__unpack(
            NULL, GRPC_SLICE_LENGTH(sl), GRPC_SLICE_START_PTR(sl));
        CHECK(r && r->n_added == n, "answers");
        bloomgrid__v1__add_response__free_unpacked(r, NULL);
        grpc_slice_unref(sl);
        free(kd);
        keys_free(keys, n);
    }
    CHECK(rpc_cstream_close_send(s) == 0, "close");
    grpc_slice sl;
    CHECK(rpc_cstream_read(s, &sl) == 0, "end of stream");
    CHECK(rpc_cstream_finish(s, &st) == 0, "finish: %s", st.message);

    /* MayContainStream over the same keys, and an error mid-stream. */
    s = rpc_cstream_open(ch, "/bloomgrid.v1.BloomGrid/MayContainStream", TIMEOUT_MS);
    for (size_t b = 0; b < batches; b++) {
        char prefix[32];
        snprintf(prefix, sizeof prefix, "st%zu", b);
        char **keys = keys_make(prefix, 0, n);
        Bloomgrid__V1__MayContainRequest rq = BLOOMGRID__V1__MAY_CONTAIN_REQUEST__INIT;
        ProtobufCBinaryData *kd = calloc(n, sizeof *kd);
        for (size_t i = 0; i < n; i++) {
            kd[i].data = (uint8_t *)keys[i];
            kd[i].len = strlen(keys[i]);
        }
        rq.filter = "s";
        rq.n_keys = n;
        rq.keys = kd;
        CHECK(rpc_cstream_write_msg(s, &rq.base) == 0, "write");
        CHECK(rpc_cstream_read(s, &sl) == 1, "read");
        Bloomgrid__V1__MayContainResponse *r = bloomgrid__v1__may_contain_response__unpack(
            NULL, GRPC_SLICE_LENGTH(sl), GRPC_SLICE_START_PTR(sl));
        CHECK(r && r->n_present == n, "answers");
        for (size_t i = 0; i < n; i++)
            CHECK(r->present[i], "stream false negative %s", keys[i]);
        bloomgrid__v1__may_contain_response__free_unpacked(r, NULL);
        grpc_slice_unref(sl);
        free(kd);
        keys_free(keys, n);
    }
    Bloomgrid__V1__MayContainRequest bad = BLOOMGRID__V1__MAY_CONTAIN_REQUEST__INIT;
    bad.filter = "missing";
    CHECK(rpc_cstream_write_msg(s, &bad.base) == 0, "write");
    CHECK(rpc_cstream_read(s, &sl) <= 0, "no answer to a bad batch");
    CHECK(rpc_cstream_finish(s, &st) < 0 && st.code == GS(NOT_FOUND),
          "stream error: %s %s", rpc_status_name(st.code), st.message);

    /* Export. */
    Bloomgrid__V1__ExportRequest erq = BLOOMGRID__V1__EXPORT_REQUEST__INIT;
    erq.filter = "s";
    erq.chunk_size = 10000;
    s = rpc_cstream_open(ch, "/bloomgrid.v1.BloomGrid/Export", TIMEOUT_MS);
    CHECK(rpc_cstream_write_msg(s, &erq.base) == 0, "export request");
    rpc_cstream_close_send(s);
    uint8_t *file = NULL;
    size_t flen = 0, total = 0, chunks = 0;
    for (;;) {
        int rc = rpc_cstream_read(s, &sl);
        CHECK(rc >= 0, "export read");
        if (rc == 0)
            break;
        Bloomgrid__V1__FileChunk *fc = bloomgrid__v1__file_chunk__unpack(
            NULL, GRPC_SLICE_LENGTH(sl), GRPC_SLICE_START_PTR(sl));
        CHECK(fc && fc->offset == flen, "chunk offset");
        file = realloc(file, flen + fc->data.len);
        memcpy(file + flen, fc->data.data, fc->data.len);
        flen += fc->data.len;
        total = fc->total_size;
        chunks++;
        bloomgrid__v1__file_chunk__free_unpacked(fc, NULL);
        grpc_slice_unref(sl);
    }
    CHECK(rpc_cstream_finish(s, &st) == 0, "export: %s", st.message);
    CHECK(flen == total && flen > 100000 && chunks > 1, "export %zu of %zu bytes",
          flen, total);
    printf("  exported %zu bytes in %zu chunks\n", flen, chunks);

    /* Import into another filter: incompatible (different secret). */
    CHECK(t_create(ch, "t", 100000, 0.01, 0, &st) == 0, "create t");
    for (int target = 0; target < 3; target++) {
        const char *name = target == 0 ? "t" : "s";
        s = rpc_cstream_open(ch, "/bloomgrid.v1.BloomGrid/Import", TIMEOUT_MS);
        size_t len = target == 2 ? flen - 9 : flen; /* 2: truncated */
        for (size_t off = 0; off < len; off += 30000) {
            Bloomgrid__V1__ImportRequest irq = BLOOMGRID__V1__IMPORT_REQUEST__INIT;
            irq.filter = off == 0 ? (char *)name : "";
            irq.data.data = file + off;
            irq.data.len = len - off < 30000 ? len - off : 30000;
            CHECK(rpc_cstream_write_msg(s, &irq.base) == 0, "import write");
        }
        rpc_cstream_close_send(s);
        int rc = rpc_cstream_read(s, &sl);
        if (rc == 1) {
            Bloomgrid__V1__ImportResponse *ir = bloomgrid__v1__import_response__unpack(
                NULL, GRPC_SLICE_LENGTH(sl), GRPC_SLICE_START_PTR(sl));
            CHECK(ir && ir->bytes_received == flen && ir->info, "import response");
            bloomgrid__v1__import_response__free_unpacked(ir, NULL);
            grpc_slice_unref(sl);
        }
        int fr = rpc_cstream_finish(s, &st);
        if (target == 0) {
            CHECK(fr < 0 && st.code == GS(FAILED_PRECONDITION) &&
                      strstr(st.message, "secret"),
                  "incompatible import: %s %s", rpc_status_name(st.code), st.message);
            printf("  %-40s %s: %s\n", "incompatible import", rpc_status_name(st.code),
                   st.message);
        } else if (target == 1) {
            CHECK(fr == 0 && rc == 1, "import into itself: %s", st.message);
        } else {
            CHECK(fr < 0 && st.code == GS(INVALID_ARGUMENT), "truncated import: %s %s",
                  rpc_status_name(st.code), st.message);
            printf("  %-40s %s: %s\n", "truncated import", rpc_status_name(st.code),
                   st.message);
        }
    }
    free(file);
}

static void test_internal(struct node_proc *np)
{
    struct rpc_status st;
    struct rpc_channel *ch = np->ch;
    uint8_t secret[32];
    for (int i = 0; i < 32; i++)
        secret[i] = (uint8_t)(i * 7 + 1);

    /* Shards 1 and 3 of 4 of filter "big". */
    for (unsigned idx = 1; idx < 4; idx += 2) {
        Bloomgrid__V1__CreateShardRequest rq = BLOOMGRID__V1__CREATE_SHARD_REQUEST__INIT;
        Bloomgrid__V1__InternalShardInfo *isi = NULL;
        rq.filter = "big";
        rq.shard_index = idx;
        rq.shard_count = 4;
        rq.capacity = 10000;
        rq.error_rate = 0.01;
        rq.secret.data = secret;
        rq.secret.len = 32;
        CHECK(rpc_call(ch, "/bloomgrid.v1.Internal/CreateShard", &rq.base,
                       &bloomgrid__v1__internal_shard_info__descriptor,
                       (ProtobufCMessage **)&isi, TIMEOUT_MS, &st) == 0,
              "create shard: %s", st.message);
        CHECK(isi->shard_index == idx && isi->shard_count == 4, "shard info");
        CHECK(isi->secret.len == 0, "secret only on request");
        bloomgrid__v1__internal_shard_info__free_unpacked(isi, NULL);
    }
    Bloomgrid__V1__GetShardRequest grq = BLOOMGRID__V1__GET_SHARD_REQUEST__INIT;
    Bloomgrid__V1__InternalShardInfo *isi = NULL;
    grq.filter = "big";
    grq.shard_index = 3;
    grq.include_secret = true;
    CHECK(rpc_call(ch, "/bloomgrid.v1.Internal/GetShard", &grq.base,
                   &bloomgrid__v1__internal_shard_info__descriptor,
                   (ProtobufCMessage **)&isi, TIMEOUT_MS, &st) == 0,
          "get shard: %s", st.message);
    CHECK(isi->secret.len == 32 && memcmp(isi->secret.data, secret, 32) == 0,
          "secret returned");
    bloomgrid__v1__internal_shard_info__free_unpacked(isi, NULL);
    grq.shard_index = 2;
    CHECK(rpc_call(ch, "/bloomgrid.v1.Internal/GetShard", &grq.base,
                   &bloomgrid__v1__internal_shard_info__descriptor,
                   (ProtobufCMessage **)&isi, TIMEOUT_MS, &st) < 0 &&
              st.code == GS(NOT_FOUND),
          "absent shard NOT_FOUND");

    /* Hashes whose shard (high 32 bits of h2) is 1 of 4. */
    enum { N = 1000 };
    uint8_t *h = malloc(16 * N);
    bool out[N];
    srand(7);
    for (size_t i = 0; i < N; i++) {
        uint64_t h1 = ((uint64_t)rand() << 33) ^ ((uint64_t)rand() << 11) ^ (uint64_t)rand();
        uint64_t lo = (uint64_t)(uint32_t)rand();
        uint64_t hi = (UINT64_C(1) << 30) + ((uint64_t)rand() & 0x3fffffff); /* [1/4, 2/4) */
        uint64_t h2 = (hi << 32) | lo;
        for (int b = 0; b < 8; b++) {
            h[16 * i + b] = (uint8_t)(h1 >> (8 * b));
            h[16 * i + 8 + b] = (uint8_t)(h2 >> (8 * b));
        }
    }
    CHECK(t_hashes(ch, "AddHashes", "big", 1, h, N, true, out, &st) == 0, "add hashes: %s",
          st.message);
    CHECK(t_hashes(ch, "MayContainHashes", "big", 1, h, N, true, out, &st) == 0, "query");
    for (size_t i = 0; i < N; i++)
        CHECK(out[i], "hash %zu missing", i);
    {
        /* A shard is not a public filter: the public API refuses its name. */
        char *k[] = {"x"};
        CHECK(t_keys(ch, "Add", "big.shard-1", k, 1, out, &st) == GS(INVALID_ARGUMENT),
              "public Add to a shard name: %s", st.message);
    }
    CHECK(t_hashes(ch, "AddHashes", "big", 3, h, N, true, out, &st) == GS(FAILED_PRECONDITION),
          "wrong shard refused: %s", st.message);
    CHECK(t_hashes(ch, "RemoveHashes", "big", 1, h, 1, true, out, &st) == GS(FAILED_PRECONDITION),
          "remove on blocked shard");
    {
        Bloomgrid__V1__HashesRequest rq = BLOOMGRID__V1__HASHES_REQUEST__INIT;
        ProtobufCMessage *r = NULL;
        rq.filter = "big";
        rq.shard_index = 1;
        rq.hashes.data = h;
        rq.hashes.len = 17;
        CHECK(rpc_call(ch, "/bloomgrid.v1.Internal/AddHashes", &rq.base,
                       &bloomgrid__v1__hashes_response__descriptor, &r, TIMEOUT_MS,
                       &st) < 0 && st.code == GS(INVALID_ARGUMENT),
              "17 bytes of hashes");
    }

    Bloomgrid__V1__ListShardsRequest lrq = BLOOMGRID__V1__LIST_SHARDS_REQUEST__INIT;
    Bloomgrid__V1__ListShardsResponse *lr = NULL;
    CHECK(rpc_call(ch, "/bloomgrid.v1.Internal/ListShards", &lrq.base,
                   &bloomgrid__v1__list_shards_response__descriptor,
                   (ProtobufCMessage **)&lr, TIMEOUT_MS, &st) == 0, "list shards");
    CHECK(lr->n_shards == 2 && strcmp(lr->shards[0]->filter, "big") == 0 &&
              lr->shards[0]->shard_index == 1 && lr->shards[1]->shard_index == 3,
          "list shards content");
    bloomgrid__v1__list_shards_response__free_unpacked(lr, NULL);

    Bloomgrid__V1__ShardRef ref = BLOOMGRID__V1__SHARD_REF__INIT;
    ProtobufCMessage *dr = NULL;
    /* A rollback's drop (only_unwritten) leaves shard 1, which took keys. */
    ref.filter = "big";
    ref.shard_index = 1;
    ref.only_unwritten = true;
    CHECK(rpc_call(ch, "/bloomgrid.v1.Internal/DropShard", &ref.base,
                   &bloomgrid__v1__drop_shard_response__descriptor, &dr, TIMEOUT_MS,
                   &st) < 0 && st.code == GS(FAILED_PRECONDITION) &&
              strstr(st.message, "has taken keys"),
          "only_unwritten drop of a shard with keys: %d %s", st.code, st.message);
    CHECK(t_hashes(ch, "MayContainHashes", "big", 1, h, N, true, out, &st) == 0,
          "query after the refused drop: %s", st.message);
    for (size_t i = 0; i < N; i++)
        CHECK(out[i], "hash %zu missing after the refused drop", i);
    free(h);
    /* ... and drops shard 3, which took none. */
    ref.shard_index = 3;
    CHECK(rpc_call(ch, "/bloomgrid.v1.Internal/DropShard", &ref.base,
                   &bloomgrid__v1__drop_shard_response__descriptor, &dr, TIMEOUT_MS,
                   &st) == 0, "drop shard: %s", st.message);
    ref.only_unwritten = false;
    protobuf_c_message_free_unpacked(dr, NULL);
    CHECK(rpc_call(ch, "/bloomgrid.v1.Internal/DropShard", &ref.base,
                   &bloomgrid__v1__drop_shard_response__descriptor, &dr, TIMEOUT_MS,
                   &st) < 0 && st.code == GS(NOT_FOUND), "drop twice");
}

static const char *example_dir = ".";

/* Settings: file, flags overriding it, refusals naming the line, --help. */
static void test_config(const char *base)
{
    char ini[600], dir[600], cmd[1400], line[512];
    struct rpc_status st;
    bool out[30];
    snprintf(ini, sizeof ini, "%s/node.ini", base);
    snprintf(dir, sizeof dir, "%s/data", base);
    FILE *f = fopen(ini, "w");
    CHECK(f, "write %s", ini);
    fprintf(f, "; test settings\n[node]\nmax_batch_keys = 10\nlog_level = warn\n"
               "durability = none\n");
    fclose(f);
    struct node_proc np;
    const char *const flags[] = {"--config", ini, "--max-batch-keys", "20", NULL};
    node_start(&np, dir, flags);
    CHECK(node_wait_health(&np, true, 10000), "SERVING");
    CHECK(t_create(np.ch, "c", 1000, 0.01, 0, &st) == 0, "create");
    char **keys = keys_make("c", 0, 25);
    CHECK(t_keys(np.ch, "Add", "c", keys, 15, out, &st) == 0,
          "15 keys: the flag (20) overrides the file (10): %s", st.message);
    CHECK(t_keys(np.ch, "Add", "c", keys, 25, out, &st) == GS(RESOURCE_EXHAUSTED),
          "25 keys over the limit");
    keys_free(keys, 25);
    CHECK(node_stop(&np, SIGINT) == 0, "SIGINT exits 0 too");

    /* The shipped example parses and holds every default. */
    {
        char ex[700];
        snprintf(ex, sizeof ex, "%s/node/bloomgrid-node.example.ini", example_dir);
        const char *const eflags[] = {"--config", ex, NULL};
        char edir[700];
        snprintf(edir, sizeof edir, "%s/example", base);
        struct node_proc ep;
        node_start(&ep, edir, eflags);
        CHECK(node_wait_health(&ep, true, 10000), "node with the example config");
        CHECK(node_stop(&ep, SIGTERM) == 0, "SIGTERM");
    }

    /* A bad setting is refused with the file and line named; exit 2. */
    f = fopen(ini, "w");
    fprintf(f, "[node]\nlisten = 127.0.0.1:0\nmax_batch_keys = lots\n");
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s --config %s 2>&1", harness_node_bin, ini);
    FILE *p = popen(cmd, "r");
    CHECK(p && fgets(line, sizeof line, p), "run with a bad config");
    int status = pclose(p);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 2, "bad config: exit 2");
    CHECK(strstr(line, "node.ini:3") && strstr(line, "max_batch_keys"),
          "message names file, line and setting: %s", line);
    printf("  bad config: %s", line);
    snprintf(cmd, sizeof cmd, "%s --no-such-flag 1 2>&1", harness_node_bin);
    p = popen(cmd, "r");
    CHECK(p && fgets(line, sizeof line, p), "unknown flag");
    status = pclose(p);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 2 && strstr(line, "--no-such-flag"),
          "unknown flag refused: %s", line);

    /* --help documents every setting. */
    snprintf(cmd, sizeof cmd, "%s --help", harness_node_bin);
    p = popen(cmd, "r");
    static char all[65536];
    size_t used = 0;
    all[0] = 0;
    /* Read to the end (a reader that stops early makes the writer fail). */
    while (p && fgets(line, sizeof line, p))
        if (used + strlen(line) < sizeof all) {
            strcat(all + used, line);
            used += strlen(line);
        }
    status = pclose(p);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "--help exits 0");
    static const char *const names[] = {
        "--listen", "--data-dir", "--durability", "--snapshot-interval",
        "--snapshot-wal-mb", "--max-batch-keys", "--max-key-size",
        "--max-message-size", "--threads", "--max-streams", "--shutdown-grace-ms",
        "--log-level",
        "--config"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        CHECK(strstr(all, names[i]), "--help lacks %s", names[i]);
    printf("  --help documents every setting\n");
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s NODE_BINARY api|errors|streams|internal\n", argv[0]);
        return 2;
    }
    harness_node_bin = argv[1];
    grpc_init();
    char dir[512];
    struct node_proc np;
    harness_tmpdir(dir, sizeof dir, argv[2]);
    if (strcmp(argv[2], "config") == 0) {
        if (argc > 3)
            example_dir = argv[3];
        test_config(dir);
        grpc_shutdown();
        printf("config: ok\n");
        return 0;
    }
    strncat(dir, "/data", sizeof dir - strlen(dir) - 1);
    const char *const limits[] = {"--max-batch-keys", "100", "--max-key-size", "4096",
                                  NULL};
    node_start(&np, dir, strcmp(argv[2], "errors") == 0 ? limits : NULL);
    CHECK(node_wait_health(&np, true, 10000), "node never SERVING (log %s)", np.log);
    if (strcmp(argv[2], "api") == 0)
        test_api(&np);
    else if (strcmp(argv[2], "errors") == 0)
        test_errors(&np);
    else if (strcmp(argv[2], "streams") == 0)
        test_streams(&np);
    else if (strcmp(argv[2], "internal") == 0)
        test_internal(&np);
    else
        CHECK(0, "unknown test %s", argv[2]);
    if (np.pid > 0)
        CHECK(node_stop(&np, SIGTERM) == 0, "SIGTERM exits 0 (log %s)", np.log);
    grpc_shutdown();
    printf("%s: ok\n", argv[2]);
    return 0;
}
