/* node_transfer_rpc: Export (a point-in-time copy streamed in the file
 * format) and Import (a streamed file, spooled to disk, verified whole,
 * then OR-merged durably a piece at a time).
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bf.h"
#include "bf_file.h"
#include "log.h"
#include "node.h"
#include "node_rpc.h"
#include "rpc_server.h"
#include "rules.h"
#include "store.h"


/* ---- Export / Import ---- */

/* Export writer: fills a chunk and sends it whenever it is full. */
struct chunker {
    struct rpc_stream *st;
    uint8_t *buf;
    size_t cap, len;
    uint64_t offset, total;
    bool failed;
};

static int chunk_flush(struct chunker *c)
{
    Bloomgrid__V1__FileChunk fc = BLOOMGRID__V1__FILE_CHUNK__INIT;
    fc.offset = c->offset;
    fc.data.data = c->buf;
    fc.data.len = c->len;
    fc.total_size = c->total;
    if (rpc_stream_write(c->st, &fc.base) < 0) {
        c->failed = true;
        return -ECANCELED;
    }
    c->offset += c->len;
    c->len = 0;
    return 0;
}

static int chunk_write(void *ctx, const void *buf, size_t len)
{
    struct chunker *c = ctx;
    const uint8_t *p = buf;
    while (len) {
        size_t n = c->cap - c->len < len ? c->cap - c->len : len;
        memcpy(c->buf + c->len, p, n);
        c->len += n;
        p += n;
        len -= n;
        if (c->len == c->cap && chunk_flush(c) < 0)
            return -ECANCELED;
    }
    return 0;
}

/* The size of f's file, for the chunk's size. */
static void file_size_of(const struct bf *f, void *ctx)
{
    *(uint64_t *)ctx = bf_file_size(f);
}

/* Export: the filter streamed in the file format straight from its live
 * bits (store_export: a piece at a time, no lock held while sending, no
 * copy of the filter), in chunks.  What the call holds, its chunk (the
 * buffer and the message on its way), counts against max_memory_mb until
 * the call ends, however long the client takes to read (docs/SECURITY.md,
 * "Budgets").  shard: the request is an ExportShardRequest naming one
 * shard (internal ExportShard). */
static void export_run(struct node *n, struct rpc_stream *st, bool shard)
{
    struct rpc_reply r = {.st.code = GRPC_STATUS_OK};
    const uint8_t *buf;
    size_t len;
    struct store *s = NULL;
    struct store_filter *sf = NULL;
    uint64_t reserved = 0;          /* of max_memory_mb: the chunk */
    uint64_t size = 0;
    char err[STORE_ERRLEN] = "", what[STORE_NAME_MAX + 64];
    Bloomgrid__V1__ExportShardRequest *m = NULL;
    struct chunker c = {.st = st};

    int rc = rpc_stream_read(st, &buf, &len);
    if (rc < 0)
        return;
    if (rc == 0) {
        rpc_reply_error(&r, GRPC_STATUS_INVALID_ARGUMENT, "Export needs a request");
        goto done;
    }
    /* ExportRequest is ExportShardRequest without shard_index. */
    m = (Bloomgrid__V1__ExportShardRequest *)protobuf_c_message_unpack(
        shard ? &bloomgrid__v1__export_shard_request__descriptor
              : &bloomgrid__v1__export_request__descriptor, NULL, len, buf);
    if (!m) {
        rpc_reply_error(&r, GRPC_STATUS_INVALID_ARGUMENT, "malformed ExportRequest");
        goto done;
    }
    s = node_rpc__need_store(n, &r);
    if (!s || (shard && node_rpc__refuse_version(&r, m->topology_version)))
        goto done;
    if (shard)
        sf = node_rpc__get_shard(s, m->filter, m->shard_index, &r);
    else if (node_rpc__public_name_ok(m->filter, &r))
        sf = node_rpc__get_filter(s, m->filter, &r);
    if (!sf || node_rpc__refuse_syncing(sf, &r))
        goto done;
    if ((rc = store_filter_inspect(sf, file_size_of, &size)) < 0) {
        node_rpc__store_error(&r, sf, m->filter, rc, err);
        goto done;
    }
    c.cap = m->chunk_size ? m->chunk_size : RULES_CHUNK_DEFAULT;
    if (c.cap > RULES_CHUNK_MAX)
        c.cap = RULES_CHUNK_MAX;
    if (c.cap + 64 > rpc_stream_max_message(st))
        c.cap = rpc_stream_max_message(st) - 64;
    if (c.cap > size)
        c.cap = (size_t)size;
    if (shard)
        snprintf(what, sizeof what, "ExportShard of shard %u of \"%s\"",
                 m->shard_index, m->filter);
    else
        snprintf(what, sizeof what, "Export of \"%s\"", m->filter);
    /* The chunk's buffer, and the message packed from it on its way. */
    if ((rc = store_reserve(s, 2 * (uint64_t)c.cap, what, err)) < 0) {
        node_rpc__store_error(&r, sf, m->filter, rc, err);
        goto done;
    }
    reserved = 2 * (uint64_t)c.cap;
    c.buf = malloc(c.cap);
    if (!c.buf) {
        rpc_reply_error(&r, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto done;
    }
    rc = store_export(sf, chunk_write, &c, &c.total, err);
    if (rc == 0 && (c.len > 0 || c.offset == 0))
        rc = chunk_flush(&c);
    if (c.failed)
        goto out; /* the client went away */
    if (rc < 0) {
        node_rpc__store_error(&r, sf, m->filter, rc, err);
        goto done;
    }
    log_info("exported filter %s (%llu bytes)", m->filter,
             (unsigned long long)c.total);
done:
    /* The chunk's room goes back before the status, so that an export the
     * client starts once it has the status finds it free. */
    if (reserved)
        store_release(s, reserved);
    reserved = 0;
    node_rpc__finish_reply(st, &r);
out:
    if (reserved)
        store_release(s, reserved);
    free(c.buf);
    if (sf)
        store_put(sf);
    if (m)
        protobuf_c_message_free_unpacked(&m->base, NULL);
}

void node_rpc__h_export(void *arg, struct rpc_stream *st)
{
    export_run(arg, st, false);
}

void node_rpc__h_export_shard(void *arg, struct rpc_stream *st)
{
    export_run(arg, st, true);
}

/* The most bytes a file compatible with f can have: f's own size; a
 * scalable filter's file may have grown more layers. */
static void import_limit(const struct bf *f, void *ctx)
{
    size_t *limit = ctx;
    uint64_t sz = bf_file_size(f);
    *limit = bf_kind(f) == BF_KIND_SCALABLE ? (size_t)sz * 64 + (16u << 20)
                                            : (size_t)sz + (1u << 20);
}

/* The checks of an Import on its file's header, before any bit is read
 * (store_import_spool's check): not a file of a dropped incarnation, and
 * compatible with the filter.  Sets r and returns -ECANCELED to refuse. */
struct import_check {
    struct store *s;
    struct store_filter *sf;
    const char *name;
    struct rpc_reply *r;
    const struct bf *src;
    const char *field;
};

static void mismatch_run(const struct bf *dst, void *ctx)
{
    struct import_check *ic = ctx;
    ic->field = bf_mismatch(dst, ic->src);
}

static int import_check(void *ctx, const struct bf *src)
{
    struct import_check *ic = ctx;

    if (store_dropped(ic->s, store_filter_name(ic->sf), store_secret_id(src), NULL)) {
        rpc_reply_error(ic->r, GRPC_STATUS_FAILED_PRECONDITION,
                        "imported file is of filter \"%s\" as it was before "
                        "it was dropped on this node: refused (only an undrop "
                        "brings it back)", ic->name);
        return -ECANCELED;
    }
    ic->src = src;
    int rc = store_filter_inspect(ic->sf, mismatch_run, ic);
    if (rc < 0) {
        node_rpc__store_error(ic->r, ic->sf, ic->name, rc, NULL);
        return -ECANCELED;
    }
    if (ic->field) {
        rpc_reply_error(ic->r, GRPC_STATUS_FAILED_PRECONDITION,
                        "imported filter is incompatible with \"%s\": field "
                        "\"%s\" differs", ic->name, ic->field);
        return -ECANCELED;
    }
    return 0;
}

/* Import: the file is written to a spool file in the data directory as
 * it arrives (store_spool_write: bounded by the largest file compatible
 * with the filter, and together with the other Imports' by the store),
 * then verified whole a piece at a time and applied a piece at a time,
 * each piece a durable log record (store_import_spool): the call holds a
 * message and a few MiB, never the file.  Nothing is applied before the
 * whole file is verified; the answer goes out once every piece is durable.
 * shard: the messages are ImportShardRequests naming one shard (internal
 * ImportShard). */
static void import_run(struct node *n, struct rpc_stream *st, bool shard)
{
    struct rpc_reply r = {.st.code = GRPC_STATUS_OK};
    const uint8_t *buf;
    size_t len;
    struct store_filter *sf = NULL;
    struct store_spool *sp = NULL;
    char name[STORE_NAME_MAX + 1] = "";
    char err[STORE_ERRLEN] = "";
    size_t limit = 0;

    struct store *s = node_rpc__need_store(n, &r);
    if (!s || (!shard && node_rpc__refuse_public(&r, "Import", true)))
        goto done;
    for (;;) {
        int rc = rpc_stream_read(st, &buf, &len);
        if (rc < 0)
            goto out;
        if (rc == 0)
            break;
        /* ImportRequest is ImportShardRequest without shard_index. */
        Bloomgrid__V1__ImportShardRequest *m =
            (Bloomgrid__V1__ImportShardRequest *)protobuf_c_message_unpack(
                shard ? &bloomgrid__v1__import_shard_request__descriptor
                      : &bloomgrid__v1__import_request__descriptor, NULL, len, buf);
        if (!m) {
            rpc_reply_error(&r, GRPC_STATUS_INVALID_ARGUMENT,
                            "malformed ImportRequest message");
            goto done;
        }
        if (!sf) {
            if (!m->filter[0]) {
                rpc_reply_error(&r, GRPC_STATUS_INVALID_ARGUMENT,
                                "the first ImportRequest must name the filter");
            } else if (shard && node_rpc__refuse_version(&r, m->topology_version)) {
                /* made under another topology: nothing merged */
            } else if (shard || node_rpc__public_name_ok(m->filter, &r)) {
                snprintf(name, sizeof name, "%s", m->filter);
                sf = shard ? node_rpc__get_shard(s, name, m->shard_index, &r)
                           : node_rpc__get_filter(s, name, &r);
                int e = sf ? store_filter_inspect(sf, import_limit, &limit) : 0;
                if (e < 0)
                    node_rpc__store_error(&r, sf, name, e, NULL);
                else if (sf && (e = store_spool_new(s, limit, &sp, err)) < 0)
                    rpc_reply_error(&r, GRPC_STATUS_UNAVAILABLE,
                                    "the import into \"%s\": %s", name, err);
            }
        } else if (m->filter[0] && strcmp(m->filter, name) != 0) {
            rpc_reply_error(&r, GRPC_STATUS_INVALID_ARGUMENT,
                            "ImportRequest names filter \"%s\" after \"%s\"",
                            m->filter, name);
        }
        /* The file's bytes go to the spool as they come (its disk bounded:
         * store.h), not to memory; the message received and its unpacked
         * copy count against max_memory_mb until written. */
        int wrc = 0;
        if (r.st.code == GRPC_STATUS_OK && m->data.len) {
            char what[STORE_NAME_MAX + 32];
            snprintf(what, sizeof what, "the import into \"%s\"", name);
            wrc = store_reserve(s, 2 * (uint64_t)len, what, err);
            if (wrc == 0) {
                wrc = store_spool_write(sp, m->data.data, m->data.len, err);
                store_release(s, 2 * (uint64_t)len);
            }
        }
        if (wrc == -E2BIG)
            rpc_reply_error(&r, GRPC_STATUS_RESOURCE_EXHAUSTED,
                            "import is larger (%zu+ bytes) than any file "
                            "compatible with filter \"%s\" (%zu bytes)",
                            (size_t)store_spool_len(sp) + m->data.len, name, limit);
        else if (wrc == -EDQUOT || wrc == -ENOSPC)
            rpc_reply_error(&r, GRPC_STATUS_RESOURCE_EXHAUSTED, "%s", err);
        else if (wrc < 0)
            rpc_reply_error(&r, GRPC_STATUS_UNAVAILABLE, "the import into \"%s\": %s",
                            name, err);
        protobuf_c_message_free_unpacked(&m->base, NULL);
        if (r.st.code != GRPC_STATUS_OK)
            goto done;
    }
    if (!sf) {
        rpc_reply_error(&r, GRPC_STATUS_INVALID_ARGUMENT,
                        "Import received no message naming a filter");
        goto done;
    }
    size_t received = (size_t)store_spool_len(sp);
    struct import_check ic = {.s = s, .sf = sf, .name = name, .r = &r};
    struct bf_merge_projection proj = {0};
    int rc = store_import_spool(sf, sp, import_check, &ic, &proj, err);
    store_spool_free(sp);     /* its disk back before the answer */
    sp = NULL;
    if (rc < 0 && r.st.code == GRPC_STATUS_OK) {   /* else import_check's */
        if (rc == -EBADMSG || rc == -EPROTONOSUPPORT)
            rpc_reply_error(&r, GRPC_STATUS_INVALID_ARGUMENT,
                            "imported file refused: %s", err);
        else if (rc == -EINVAL)
            rpc_reply_error(&r, GRPC_STATUS_FAILED_PRECONDITION,
                            "imported filter is incompatible with \"%s\": %s",
                            name, err);
        else
            node_rpc__store_error(&r, sf, name, rc, err);
    }
    if (rc < 0)
        goto done;
    log_info("imported %zu bytes into filter %s", received, name);
    struct info_buf ib;
    node_rpc__info_fill(n, &ib, sf, name);
    Bloomgrid__V1__ImportResponse resp = BLOOMGRID__V1__IMPORT_RESPONSE__INIT;
    resp.info = &ib.fi;
    resp.bytes_received = received;
    resp.projected_fill_ratio = proj.fill_ratio;
    resp.projected_error_rate = proj.estimated_fpr;
    resp.over_target = proj.over_target;
    if (rpc_stream_write(st, &resp.base) < 0)
        goto out;
done:
    store_spool_free(sp);
    sp = NULL;
    node_rpc__finish_reply(st, &r);
out:
    store_spool_free(sp);
    if (sf)
        store_put(sf);
}

void node_rpc__h_import(void *arg, struct rpc_stream *st)
{
    import_run(arg, st, false);
}

void node_rpc__h_import_shard(void *arg, struct rpc_stream *st)
{
    import_run(arg, st, true);
}
