/* router_rpc_transfer: Export and Import of sharded filters through the
 * router (public Export/Import on one side, internal ExportShard/ImportShard
 * streams to the nodes on the other).  An RPC edge file like router_rpc.c.
 *
 * A sharded filter travels as ONE file holding every shard, the "shard
 * bundle" (docs/ROUTER.md):
 *
 *   "BGSHARDS"  u32 version (1)  u32 S
 *   S times:    u32 shard index  u64 length L  L bytes: the shard's filter
 *               file (docs/FORMAT.md), in shard order 0..S-1
 *   u64 XXH3-64 of every byte before it
 *
 * all integers little-endian.  Export assembles the bundle in memory from the
 * shards' own exports (each a consistent point-in-time snapshot of its
 * shard), then streams it.  Import receives the whole bundle, checks it
 * (magic, version, shard count, checksum, every shard file parses and carries
 * this filter's secret, shard index and count) before anything changes, then
 * merges the shards one by one, shard 0 first: a geometry mismatch is refused
 * by the node on shard 0, before any shard changed.  A node failing half-way
 * leaves earlier shards merged; merging is idempotent, so importing the same
 * bundle again completes it.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "bf.h"
#include "bf_file.h"
#include "bloomgrid/v1/bloomgrid.pb-c.h"
#include "log.h"
#include "router.h"
#include "router_nodes.h"
#include "router_rpc.h"

#define M_EXPORT_SHARD "/bloomgrid.v1.Internal/ExportShard"
#define M_IMPORT_SHARD "/bloomgrid.v1.Internal/ImportShard"
#define BUNDLE_MAGIC "BGSHARDS"
#define BUNDLE_VERSION 1
#define CHUNK_DEFAULT (1u << 20)
#define CHUNK_MAX (4u << 20)
#define TRANSFER_TIMEOUT_MS 600000

struct buf {
    uint8_t *p;
    size_t len, cap;
};

static int buf_put(struct buf *b, const void *data, size_t len)
{
    if (b->len + len > b->cap) {
        size_t cap = b->cap ? b->cap : 1 << 16;
        while (cap < b->len + len)
            cap *= 2;
        uint8_t *p = realloc(b->p, cap);
        if (!p)
            return -ENOMEM;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, data, len);
    b->len += len;
    return 0;
}

static int buf_le(struct buf *b, uint64_t v, int bytes)
{
    uint8_t x[8];
    for (int i = 0; i < bytes; i++)
        x[i] = (uint8_t)(v >> (8 * i));
    return buf_put(b, x, (size_t)bytes);
}

static uint64_t get_le(const uint8_t *p, int bytes)
{
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* Hand-encoded ExportShardRequest / ImportShardRequest (1 filter, 2
 * chunk_size or data, 3 shard_index). */
static void put_varint(struct buf *b, uint64_t v)
{
    uint8_t x[10];
    int n = 0;
    while (v >= 0x80) {
        x[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    x[n++] = (uint8_t)v;
    buf_put(b, x, (size_t)n);
}

static void encode_shard_msg(struct buf *b, const char *filter, uint32_t shard,
                             bool with_bytes, const void *data, size_t len,
                             uint32_t number)
{
    b->len = 0;
    size_t fl = strlen(filter);
    buf_put(b, "\x0a", 1);
    put_varint(b, fl);
    buf_put(b, filter, fl);
    if (with_bytes) {
        buf_put(b, "\x12", 1);
        put_varint(b, len);
        buf_put(b, data, len);
    } else if (number) {
        buf_put(b, "\x10", 1);
        put_varint(b, number);
    }
    if (shard) {
        buf_put(b, "\x18", 1);
        put_varint(b, shard);
    }
}

/* Append shard s's file, exported by its primary, to out. */
static int export_shard(struct router *r, const struct topo *t,
                        const struct router_filter *f, uint32_t s, struct buf *out,
                        struct router_status *st)
{
    const char *node = t->groups[f->group[s]].primary;
    struct rpc_channel *ch = router_channel(r, node);
    struct rpc_status rs = {0};
    struct buf req = {0};
    size_t start = out->len;
    uint64_t total = 0;
    int rc = -1;

    if (!ch) {
        router_status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        return -1;
    }
    struct rpc_cstream *cs = rpc_cstream_open(ch, M_EXPORT_SHARD, TRANSFER_TIMEOUT_MS);
    if (!cs) {
        router_status_set(st, GRPC_STATUS_UNAVAILABLE, "Export: shard %u on node %s: "
                          "cannot start the call", s, node);
        return -1;
    }
    encode_shard_msg(&req, f->name, s, false, NULL, 0, CHUNK_MAX);
    bool sent = req.p && rpc_cstream_write(cs, req.p, req.len) == 0 &&
                rpc_cstream_close_send(cs) == 0;
    free(req.p);
    bool bad = false;
    for (grpc_slice sl; sent && !bad && rpc_cstream_read(cs, &sl) == 1;) {
        Bloomgrid__V1__FileChunk *fc = bloomgrid__v1__file_chunk__unpack(
            NULL, GRPC_SLICE_LENGTH(sl), GRPC_SLICE_START_PTR(sl));
        grpc_slice_unref(sl);
        if (!fc || fc->offset != out->len - start ||
            (total && fc->total_size != total) ||
            fc->offset + fc->data.len > fc->total_size ||
            buf_put(out, fc->data.data, fc->data.len) < 0)
            bad = true;
        else
            total = fc->total_size;
        if (fc)
            bloomgrid__v1__file_chunk__free_unpacked(fc, NULL);
    }
    if (rpc_cstream_finish(cs, &rs) < 0) {
        router_status_set(st, router_node_down(rs.code) ? GRPC_STATUS_UNAVAILABLE : rs.code,
                          "Export of \"%s\": shard %u on node %s: %s: %s", f->name, s,
                          node, rpc_status_name(rs.code), rs.message);
        goto out;
    }
    if (!sent || bad || out->len - start != total || total == 0) {
        router_status_set(st, GRPC_STATUS_UNAVAILABLE,
                          "Export of \"%s\": shard %u on node %s sent an incomplete "
                          "or inconsistent file", f->name, s, node);
        goto out;
    }
    rc = 0;
out:
    return rc;
}

static int export_bundle(struct router *r, const char *name, struct buf *out,
                         struct router_status *st)
{
    struct topo *t = router_topo(r);
    struct router_filter *f = router_filter_lookup(r, t, name, st);
    int rc = -1;

    if (!f)
        goto out;
    buf_put(out, BUNDLE_MAGIC, 8);
    buf_le(out, BUNDLE_VERSION, 4);
    buf_le(out, f->shards, 4);
    for (uint32_t s = 0; s < f->shards; s++) {
        size_t at = out->len;
        if (buf_le(out, s, 4) < 0 || buf_le(out, 0, 8) < 0) {
            router_status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
            goto out;
        }
        if (export_shard(r, t, f, s, out, st) < 0)
            goto out;
        uint64_t len = out->len - at - 12;
        for (int i = 0; i < 8; i++)
            out->p[at + 4 + i] = (uint8_t)(len >> (8 * i));
    }
    if (buf_le(out, XXH3_64bits(out->p, out->len), 8) < 0) {
        router_status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    rc = 0;
out:
    router_filter_unref(f);
    topo_unref(t);
    return rc;
}

void router_rpc__export(void *arg, struct rpc_stream *s)
{
    struct router *r = arg;
    struct router_status st;
    struct buf b = {0};
    const uint8_t *in;
    size_t len;
    Bloomgrid__V1__ExportRequest *m = NULL;

    int rc = rpc_stream_read(s, &in, &len);
    if (rc < 0)
        return;
    if (rc == 0) {
        rpc_stream_finish(s, GRPC_STATUS_INVALID_ARGUMENT, "Export needs a request");
        return;
    }
    m = bloomgrid__v1__export_request__unpack(NULL, len, in);
    if (!m) {
        rpc_stream_finish(s, GRPC_STATUS_INVALID_ARGUMENT, "malformed ExportRequest");
        return;
    }
    struct rpc_reply rep = {.code = GRPC_STATUS_OK};
    if (!router_rpc__name_ok(m->filter, &rep)) {
        rpc_stream_finish(s, rep.code, "%s", rep.message);
        goto out;
    }
    if (export_bundle(r, m->filter, &b, &st) < 0) {
        rpc_stream_finish(s, st.code, "%s", st.msg);
        goto out;
    }
    size_t chunk = m->chunk_size ? m->chunk_size : CHUNK_DEFAULT;
    if (chunk > CHUNK_MAX)
        chunk = CHUNK_MAX;
    if (chunk + 64 > rpc_stream_max_message(s))
        chunk = rpc_stream_max_message(s) - 64;
    for (size_t off = 0; off < b.len; off += chunk) {
        Bloomgrid__V1__FileChunk fc = BLOOMGRID__V1__FILE_CHUNK__INIT;
        fc.offset = off;
        fc.data.data = b.p + off;
        fc.data.len = b.len - off < chunk ? b.len - off : chunk;
        fc.total_size = b.len;
        if (rpc_stream_write(s, &fc.base) < 0)
            goto out;
    }
    log_info("exported filter %s (%zu bytes, one bundle of every shard)", m->filter,
             b.len);
    rpc_stream_finish(s, GRPC_STATUS_OK, "%s", "");
out:
    free(b.p);
    bloomgrid__v1__export_request__free_unpacked(m, NULL);
}

/* ---- Import ---- */

struct bundle_entry {
    const uint8_t *file;
    uint64_t len;
};

/* Check a bundle for filter f: layout, checksum, and that every shard file
 * parses with f's secret, shard index and count.  Returns 0 or -1 with st
 * (INVALID_ARGUMENT for a damaged bundle, FAILED_PRECONDITION for another
 * filter's). */
static int bundle_check(const struct buf *b, const struct router_filter *f,
                        struct bundle_entry *e, struct router_status *st)
{
    char err[BF_ERRLEN];
    const uint8_t *p = b->p, *end = b->p + b->len;
    if (b->len < 24 || memcmp(p, BUNDLE_MAGIC, 8) != 0) {
        router_status_set(st, GRPC_STATUS_INVALID_ARGUMENT, "imported file refused: "
                          "not a shard bundle (a router exports one file holding "
                          "every shard; see docs/ROUTER.md)");
        return -1;
    }
    if (get_le(end - 8, 8) != XXH3_64bits(p, b->len - 8)) {
        router_status_set(st, GRPC_STATUS_INVALID_ARGUMENT,
                          "imported file refused: checksum mismatch (damaged or "
                          "truncated)");
        return -1;
    }
    uint32_t version = (uint32_t)get_le(p + 8, 4), S = (uint32_t)get_le(p + 12, 4);
    if (version != BUNDLE_VERSION) {
        router_status_set(st, GRPC_STATUS_INVALID_ARGUMENT,
                          "imported file refused: bundle version %u (this router "
                          "reads %d)", version, BUNDLE_VERSION);
        return -1;
    }
    if (S != f->shards) {
        router_status_set(st, GRPC_STATUS_FAILED_PRECONDITION,
                          "imported filter is incompatible with \"%s\": field "
                          "\"shard_count\" differs (%u shards, not %u)", f->name, S,
                          f->shards);
        return -1;
    }
    p += 16;
    end -= 8;
    for (uint32_t s = 0; s < S; s++) {
        if (end - p < 12 || get_le(p, 4) != s || get_le(p + 4, 8) > (uint64_t)(end - p - 12)) {
            router_status_set(st, GRPC_STATUS_INVALID_ARGUMENT,
                              "imported file refused: entry of shard %u is malformed",
                              s);
            return -1;
        }
        e[s].len = get_le(p + 4, 8);
        e[s].file = p + 12;
        p += 12 + e[s].len;
        struct bf *sh = bf_file_parse(e[s].file, e[s].len, err);
        if (!sh) {
            router_status_set(st, GRPC_STATUS_INVALID_ARGUMENT,
                              "imported file refused: shard %u: %s", s, err);
            return -1;
        }
        const char *field = memcmp(bf_secret(sh), f->secret, BF_SECRET_LEN) != 0 ? "secret"
                            : bf_shard_index(sh) != s                              ? "shard_index"
                            : bf_shard_count(sh) != S                              ? "shard_count"
                                                                                   : NULL;
        bf_destroy(sh);
        if (field) {
            router_status_set(st, GRPC_STATUS_FAILED_PRECONDITION,
                              "imported filter is incompatible with \"%s\": field "
                              "\"%s\" differs (shard %u)", f->name, field, s);
            return -1;
        }
    }
    if (p != end) {
        router_status_set(st, GRPC_STATUS_INVALID_ARGUMENT,
                          "imported file refused: bytes after the last shard");
        return -1;
    }
    return 0;
}

/* Merge one shard file into shard s; fills its projection. */
static int import_shard(struct router *r, const struct topo *t,
                        const struct router_filter *f, uint32_t s,
                        const struct bundle_entry *e, double *fill, double *fpr,
                        struct router_status *st)
{
    const char *node = t->groups[f->group[s]].primary;
    struct rpc_channel *ch = router_channel(r, node);
    struct rpc_status rs = {0};
    struct buf req = {0};
    bool ok = ch != NULL;
    struct rpc_cstream *cs = ok ? rpc_cstream_open(ch, M_IMPORT_SHARD, TRANSFER_TIMEOUT_MS)
                                : NULL;
    for (uint64_t off = 0; cs && ok && (off < e->len || off == 0); off += CHUNK_DEFAULT) {
        size_t n = e->len - off < CHUNK_DEFAULT ? e->len - off : CHUNK_DEFAULT;
        encode_shard_msg(&req, f->name, s, true, e->file + off, n, 0);
        ok = req.p && rpc_cstream_write(cs, req.p, req.len) == 0;
        if (e->len == 0)
            break;
    }
    free(req.p);
    Bloomgrid__V1__ImportResponse *resp = NULL;
    grpc_slice sl;
    if (cs && ok && rpc_cstream_close_send(cs) == 0 && rpc_cstream_read(cs, &sl) == 1) {
        resp = bloomgrid__v1__import_response__unpack(NULL, GRPC_SLICE_LENGTH(sl),
                                                      GRPC_SLICE_START_PTR(sl));
        grpc_slice_unref(sl);
    }
    int frc = cs ? rpc_cstream_finish(cs, &rs) : -1;
    if (frc < 0 || !resp) {
        if (frc == 0 || !cs)
            rs.code = GRPC_STATUS_UNAVAILABLE;
        router_status_set(st, router_node_down(rs.code) ? GRPC_STATUS_UNAVAILABLE : rs.code,
                          "Import into \"%s\": shard %u on node %s: %s: %s; shards "
                          "0..%d were merged: import the same file again to finish "
                          "(merging is idempotent)", f->name, s, node,
                          rpc_status_name(rs.code), rs.message, (int)s - 1);
        if (resp)
            bloomgrid__v1__import_response__free_unpacked(resp, NULL);
        return -1;
    }
    *fill = resp->projected_fill_ratio;
    *fpr = resp->projected_error_rate;
    bloomgrid__v1__import_response__free_unpacked(resp, NULL);
    return 0;
}

void router_rpc__import(void *arg, struct rpc_stream *s)
{
    struct router *r = arg;
    struct router_status st = {.code = GRPC_STATUS_OK};
    struct buf b = {0};
    char name[ROUTER_NAME_MAX + 1] = "";
    struct topo *t = router_topo(r);
    struct router_filter *f = NULL;
    struct bundle_entry *e = NULL;
    struct router_filter_desc d = {0};
    uint64_t limit = 0;
    const uint8_t *in;
    size_t len;

    for (;;) {
        int rc = rpc_stream_read(s, &in, &len);
        if (rc < 0)
            goto out;
        if (rc == 0)
            break;
        Bloomgrid__V1__ImportRequest *m = bloomgrid__v1__import_request__unpack(NULL, len, in);
        if (!m) {
            router_status_set(&st, GRPC_STATUS_INVALID_ARGUMENT,
                              "malformed ImportRequest message");
            goto fail;
        }
        if (!f) {
            struct rpc_reply rep = {.code = GRPC_STATUS_OK};
            if (!m->filter[0]) {
                router_status_set(&st, GRPC_STATUS_INVALID_ARGUMENT,
                                  "the first ImportRequest must name the filter");
            } else if (!router_rpc__name_ok(m->filter, &rep)) {
                router_status_set(&st, rep.code, "%s", rep.message);
            } else {
                snprintf(name, sizeof name, "%s", m->filter);
                /* The bundle is checked against the filter's secret now. */
                router_filter_forget(r, name);
                f = router_filter_lookup(r, t, name, &st);
                if (f && router_describe_filter(r, name, &d, &st) == 0) {
                    /* As on a node: a compatible bundle is about the filter's
                     * size; scalable shards may have grown more layers. */
                    for (uint32_t i = 0; i < d.shards; i++)
                        limit += d.shard[i].bytes * (d.shard[i].kind ==
                                 BLOOMGRID__V1__FILTER_KIND__FILTER_KIND_SCALABLE ? 64 : 1) +
                                 (1u << 20);
                    limit += 1u << 20;
                } else if (f) {
                    router_filter_unref(f);
                    f = NULL;
                }
            }
        } else if (m->filter[0] && strcmp(m->filter, name) != 0) {
            router_status_set(&st, GRPC_STATUS_INVALID_ARGUMENT,
                              "ImportRequest names filter \"%s\" after \"%s\"",
                              m->filter, name);
        }
        if (st.code == GRPC_STATUS_OK) {
            if (b.len + m->data.len > limit)
                router_status_set(&st, GRPC_STATUS_RESOURCE_EXHAUSTED,
                                  "import is larger (%zu+ bytes) than any bundle "
                                  "compatible with filter \"%s\" (%" PRIu64 " bytes)",
                                  b.len + m->data.len, name, limit);
            else if (buf_put(&b, m->data.data, m->data.len) < 0)
                router_status_set(&st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        }
        bloomgrid__v1__import_request__free_unpacked(m, NULL);
        if (st.code != GRPC_STATUS_OK)
            goto fail;
    }
    if (!f) {
        router_status_set(&st, GRPC_STATUS_INVALID_ARGUMENT,
                          "Import received no message naming a filter");
        goto fail;
    }
    e = calloc(f->shards, sizeof *e);
    if (!e) {
        router_status_set(&st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto fail;
    }
    if (bundle_check(&b, f, e, &st) < 0)
        goto fail;
    double fill_bits = 0, fpr_sum = 0, bits = 0;
    for (uint32_t i = 0; i < f->shards; i++) {
        double fill = 0, fpr = 0;
        if (import_shard(r, t, f, i, &e[i], &fill, &fpr, &st) < 0)
            goto fail;
        fill_bits += fill * (double)d.shard[i].bits;
        bits += (double)d.shard[i].bits;
        fpr_sum += fpr;
    }
    log_info("imported %zu bytes into filter %s (%u shards)", b.len, name, f->shards);
    router_filter_desc_free(&d);
    if (router_describe_filter(r, name, &d, &st) < 0)
        goto fail;
    Bloomgrid__V1__ImportResponse resp = BLOOMGRID__V1__IMPORT_RESPONSE__INIT;
    resp.bytes_received = b.len;
    resp.projected_fill_ratio = bits > 0 ? fill_bits / bits : 0;
    resp.projected_error_rate = fpr_sum / f->shards;
    resp.over_target = d.shards && resp.projected_error_rate > d.shard[0].error_rate;
    if (router_rpc__write_info(s, &resp, &d) < 0)
        goto out;
    rpc_stream_finish(s, GRPC_STATUS_OK, "%s", "");
    goto out;
fail:
    rpc_stream_finish(s, st.code, "%s", st.msg);
out:
    router_filter_desc_free(&d);
    free(e);
    free(b.p);
    router_filter_unref(f);
    topo_unref(t);
}
