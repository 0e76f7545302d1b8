/* router_rpc_transfer: Export and Import of sharded filters through the
 * router (public Export/Import on one side, internal ExportShard/ImportShard
 * streams to the nodes on the other).  An RPC edge file like router_rpc.c.
 *
 * A sharded filter travels as ONE file holding every shard, the shard
 * bundle (docs/FORMAT.md, "Shard bundle"; written and framed by
 * common/engine/bundle.h).  Export assembles the bundle in memory from the shards'
 * own exports (each a consistent point-in-time snapshot of its shard),
 * streaming each node's chunks into the bundle writer, then streams it.
 * Import receives the whole bundle, checks it (the frame, then that every
 * shard file parses and carries this filter's secret, shard index and count)
 * before anything changes, then forwards each shard's bytes to its node, one
 * shard after the other, shard 0 first, to every copy of its group (Export
 * reads each shard from the first copy that answers): a geometry mismatch is refused by
 * the node on shard 0, before any shard changed.  A node failing half-way
 * leaves earlier shards merged; merging is idempotent, so importing the same
 * bundle again completes it.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bf.h"
#include "bf_file.h"
#include "bloomgrid/v1/bloomgrid.pb-c.h"
#include "bloomgrid/v1/internal.pb-c.h"
#include "bundle.h"
#include "bytebuf.h"
#include "log.h"
#include "router.h"
#include "router_nodes.h"
#include "router_rpc.h"

#define M_EXPORT_SHARD "/bloomgrid.v1.Internal/ExportShard"
#define M_IMPORT_SHARD "/bloomgrid.v1.Internal/ImportShard"
#define TRANSFER_TIMEOUT_MS 600000

/* Where a copy's shard file goes: begin(ctx, total) once its size is
 * known, then data(ctx, ...) for each chunk. */
struct export_sink {
    int (*begin)(void *ctx, uint64_t total);
    bf_file_writer data;
    void *ctx;
};

/* Stream shard s's file, exported by the copy node, into sink.  *pbegun
 * says whether any of it reached the sink (else another copy may be
 * asked). */
static int export_copy(struct router *r, const struct topo *t,
                       const struct router_filter *f, uint32_t s, const char *node,
                       const struct export_sink *sink, bool *pbegun,
                       struct rpc_status *st)
{
    struct rpc_channel *ch = router_channel(r, node);
    struct rpc_status rs = {0};
    Bloomgrid__V1__ExportShardRequest rq = BLOOMGRID__V1__EXPORT_SHARD_REQUEST__INIT;
    uint64_t got = 0, total = 0;
    bool begun = false, bad = false;
    int wrc = 0;

    if (!ch) {
        rpc_status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        return -1;
    }
    struct rpc_cstream *cs = rpc_cstream_open(ch, M_EXPORT_SHARD, TRANSFER_TIMEOUT_MS);
    if (!cs) {
        rpc_status_set(st, GRPC_STATUS_UNAVAILABLE, "Export: shard %u on node %s: "
                          "cannot start the call", s, node);
        return -1;
    }
    rq.filter = (char *)f->name;
    rq.chunk_size = RULES_CHUNK_MAX;
    rq.shard_index = s;
    rq.topology_version = t->version;
    bool sent = rpc_cstream_write_msg(cs, &rq.base) == 0 &&
                rpc_cstream_close_send(cs) == 0;
    for (grpc_slice sl; sent && !bad && rpc_cstream_read(cs, &sl) == 1;) {
        Bloomgrid__V1__FileChunk *fc = bloomgrid__v1__file_chunk__unpack(
            NULL, GRPC_SLICE_LENGTH(sl), GRPC_SLICE_START_PTR(sl));
        grpc_slice_unref(sl);
        bad = !fc || fc->offset != got || (begun && fc->total_size != total) ||
              fc->offset + fc->data.len > fc->total_size;
        if (!bad && !begun) {
            /* The first chunk announces the size: the entry can begin. */
            begun = true;
            total = fc->total_size;
            bad = total == 0 || (wrc = sink->begin(sink->ctx, total)) < 0;
        }
        if (!bad && (wrc = sink->data(sink->ctx, fc->data.data, fc->data.len)) < 0)
            bad = true;
        if (!bad)
            got += fc->data.len;
        if (fc)
            bloomgrid__v1__file_chunk__free_unpacked(fc, NULL);
    }
    *pbegun = begun;
    if (rpc_cstream_finish(cs, &rs) < 0) {
        rpc_status_set(st, router_node_down(rs.code) ? GRPC_STATUS_UNAVAILABLE : rs.code,
                          "Export of \"%s\": shard %u on node %s: %s: %s", f->name, s,
                          node, rpc_status_name(rs.code), rs.message);
        return -1;
    }
    if (wrc == -ENOMEM) {
        rpc_status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        return -1;
    }
    if (!sent || bad || !begun || got != total) {
        rpc_status_set(st, GRPC_STATUS_UNAVAILABLE,
                          "Export of \"%s\": shard %u on node %s sent an incomplete "
                          "or inconsistent file", f->name, s, node);
        return -1;
    }
    return 0;
}

struct entry_sink {
    struct bundle_writer *w;
    uint32_t index;
};

static int entry_begin(void *ctx, uint64_t total)
{
    struct entry_sink *e = ctx;
    return bundle_writer_entry(e->w, e->index, total);
}

static int entry_data(void *ctx, const void *buf, size_t len)
{
    struct entry_sink *e = ctx;
    return bundle_writer_data(e->w, buf, len);
}

static int buf_begin(void *ctx, uint64_t total)
{
    struct bytebuf *b = ctx;
    return total > b->max ? -ENOMEM : 0;
}

/* Shard s of a group of one copy, or read by one copy (R = 1): streamed
 * from the first copy that answers into the bundle (a copy that failed
 * before its file began is passed over). */
static int export_shard_one(struct router *r, const struct topo *t,
                            const struct router_filter *f, uint32_t s,
                            struct bundle_writer *w, struct rpc_status *st)
{
    const struct topo_group *g = &t->groups[f->group[s]];
    struct entry_sink e = {w, s};
    struct export_sink sink = {entry_begin, entry_data, &e};
    int rc = -1;
    for (unsigned c = 0; c < g->ncopies; c++) {
        bool begun = false;
        if ((rc = export_copy(r, t, f, s, g->copies[c], &sink, &begun, st)) == 0 || begun)
            break;
    }
    return rc;
}

/* Copy node's file of shard s, parsed; NULL with *cst saying why. */
static struct bf *export_copy_bf(struct router *r, const struct topo *t,
                                 const struct router_filter *f, uint32_t s,
                                 const char *node, struct rpc_status *cst)
{
    struct bytebuf b;
    struct export_sink sink = {buf_begin, bytebuf_write, &b};
    struct bf *one = NULL;
    char err[256];
    bool begun = false;

    bytebuf_init(&b, SIZE_MAX);
    if (export_copy(r, t, f, s, node, &sink, &begun, cst) == 0 &&
        !(one = bf_file_parse(b.p, b.len, err)))
        rpc_status_set(cst, GRPC_STATUS_DATA_LOSS, "its file does not parse: %s", err);
    bytebuf_deinit(&b);
    return one;
}

/* Shard s of a group read by R > 1 copies: one copy alone may lack a write
 * that W others acknowledged, so R copies are exported and ORed, as a read
 * asks R (R + W > N: every acknowledged key is in one of them).  inserts and
 * keys added are the largest copy's, not the sum (the copies hold the same
 * adds; an uncounted copy's BF_KEYS_UNCOUNTED is the largest).  Fewer
 * than R copies answering: UNAVAILABLE, never a file from fewer. */
static int export_shard_quorum(struct router *r, const struct topo *t,
                               const struct router_filter *f, uint32_t s,
                               struct bundle_writer *w, struct rpc_status *st)
{
    const struct topo_group *g = &t->groups[f->group[s]];
    unsigned need = g->read_quorum, got = 0;
    uint64_t inserts = 0, keys = 0, count = 0;     /* the largest copy's */
    struct bf *acc = NULL;
    char failed[512] = "", err[256];
    size_t flen = 0;
    int rc = -1;

    for (unsigned c = 0; c < g->ncopies && got < need; c++) {
        struct rpc_status cst = {0};
        struct bf *one = export_copy_bf(r, t, f, s, g->copies[c], &cst);
        struct bf_layer_info li;
        if (one && acc && bf_merge_from(acc, one, err) < 0)
            rpc_status_set(&cst, GRPC_STATUS_DATA_LOSS, "its copy differs: %s", err);
        if (one && !cst.code) {
            got++;
            if (bf_insert_count(one) > inserts)
                inserts = bf_insert_count(one);
            if (bf_keys_added(one) > keys)
                keys = bf_keys_added(one);
            if (bf_layer_info(one, 0, &li) == 0 && li.count > count)
                count = li.count;
        }
        if (one && !acc)
            acc = one;
        else
            bf_destroy(one);
        if (cst.code && flen < sizeof failed) {
            int n = snprintf(failed + flen, sizeof failed - flen, "%s%s %s: %s",
                             flen ? "; " : "", g->copies[c],
                             rpc_status_name(cst.code), cst.message);
            flen += n > 0 ? (size_t)n : 0;
        }
    }
    if (got < need) {
        rpc_status_set(st, GRPC_STATUS_UNAVAILABLE,
                       "Export of \"%s\": shard %u (group %s): %u of %u copies answered, "
                       "read quorum %u; failed copies: %s", f->name, s, g->name, got,
                       g->ncopies, need, failed[0] ? failed : "none asked");
        goto out;
    }
    bf_set_counts(acc, inserts, keys, &count);
    if (bundle_writer_entry(w, s, bf_file_size(acc)) < 0 ||
        bf_file_write(acc, bundle_writer_data, w) < 0) {
        rpc_status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    rc = 0;
out:
    bf_destroy(acc);
    return rc;
}

static int export_shard(struct router *r, const struct topo *t,
                        const struct router_filter *f, uint32_t s,
                        struct bundle_writer *w, struct rpc_status *st)
{
    const struct topo_group *g = &t->groups[f->group[s]];
    if (g->ncopies > 1 && g->read_quorum > 1)
        return export_shard_quorum(r, t, f, s, w, st);
    return export_shard_one(r, t, f, s, w, st);
}

/* The bundle of every shard of filter name, in out. */
static int export_bundle(struct router *r, const char *name, struct bytebuf *out,
                         struct rpc_status *st)
{
    struct topo *t = router_topo(r);
    struct router_filter *f = router_filter_lookup(r, t, name, st);
    struct bundle_writer w;
    int rc = -1;

    if (!f)
        goto out;
    if (bundle_writer_begin(&w, f->shards, bytebuf_write, out) < 0) {
        rpc_status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    for (uint32_t s = 0; s < f->shards; s++) {
        if (export_shard(r, t, f, s, &w, st) < 0) {
            bundle_writer_abort(&w);
            goto out;
        }
    }
    if (bundle_writer_end(&w) < 0) {
        rpc_status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
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
    struct rpc_status st;
    struct bytebuf b;
    const uint8_t *in;
    size_t len;
    Bloomgrid__V1__ExportRequest *m = NULL;

    /* As large as the filter, which its nodes already hold in memory. */
    bytebuf_init(&b, SIZE_MAX);
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
    struct rpc_reply rep = {.st.code = GRPC_STATUS_OK};
    if (!router_rpc__name_ok(m->filter, &rep)) {
        rpc_stream_finish_status(s, &rep.st);
        goto out;
    }
    if (export_bundle(r, m->filter, &b, &st) < 0) {
        rpc_stream_finish_status(s, &st);
        goto out;
    }
    size_t chunk = m->chunk_size ? m->chunk_size : RULES_CHUNK_DEFAULT;
    if (chunk > RULES_CHUNK_MAX)
        chunk = RULES_CHUNK_MAX;
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
    bytebuf_deinit(&b);
    bloomgrid__v1__export_request__free_unpacked(m, NULL);
}

/* ---- Import ---- */

/* Check a bundle for filter f: the frame (common/engine/bundle.h), then that every
 * shard file parses with f's secret, shard index and count.  Returns 0 with
 * l filled (entries point into b) or -1 with st (INVALID_ARGUMENT for a
 * damaged bundle, FAILED_PRECONDITION for another filter's). */
static int bundle_check(const struct bytebuf *b, const struct router_filter *f,
                        struct bundle_layout *l, struct rpc_status *st)
{
    char err[BF_ERRLEN];
    int rc = bundle_layout_parse(b->p, b->len, l, err);

    if (rc == -ENOMEM) {
        rpc_status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        return -1;
    }
    if (rc < 0) {
        rpc_status_set(st, GRPC_STATUS_INVALID_ARGUMENT, "imported file refused: "
                          "%s%s", err, bundle_is(b->p, b->len) ? "" :
                          " (a router exports one file holding every shard; see "
                          "docs/ROUTER.md)");
        return -1;
    }
    if (l->count != f->shards) {
        rpc_status_set(st, GRPC_STATUS_FAILED_PRECONDITION,
                          "imported filter is incompatible with \"%s\": field "
                          "\"shard_count\" differs (%u shards, not %u)", f->name,
                          l->count, f->shards);
        return -1;
    }
    for (uint32_t s = 0; s < l->count; s++) {
        struct bf *sh = bf_file_parse(l->entry[s].file, l->entry[s].len, err);
        if (!sh) {
            rpc_status_set(st, GRPC_STATUS_INVALID_ARGUMENT,
                              "imported file refused: shard %u: %s", s, err);
            return -1;
        }
        const char *field = bundle_shard_mismatch(sh, s, l->count, f->secret);
        bf_destroy(sh);
        if (field) {
            rpc_status_set(st, GRPC_STATUS_FAILED_PRECONDITION,
                              "imported filter is incompatible with \"%s\": field "
                              "\"%s\" differs (shard %u)", f->name, field, s);
            return -1;
        }
    }
    return 0;
}

/* Merge one shard file into shard s on the copy node; fills its
 * projection. */
static int import_copy(struct router *r, const struct topo *t,
                       const struct router_filter *f, uint32_t s, const char *node,
                       const struct bundle_entry *e, double *fill, double *fpr,
                       struct rpc_status *st)
{
    struct rpc_channel *ch = router_channel(r, node);
    struct rpc_status rs = {0};
    bool ok = ch != NULL;
    struct rpc_cstream *cs = ok ? rpc_cstream_open(ch, M_IMPORT_SHARD, TRANSFER_TIMEOUT_MS)
                                : NULL;
    for (uint64_t off = 0; cs && ok && off < e->len; off += RULES_CHUNK_DEFAULT) {
        Bloomgrid__V1__ImportShardRequest rq = BLOOMGRID__V1__IMPORT_SHARD_REQUEST__INIT;
        rq.filter = (char *)f->name;
        rq.shard_index = s;
        rq.topology_version = t->version;
        rq.data.data = (uint8_t *)e->file + off;
        rq.data.len = e->len - off < RULES_CHUNK_DEFAULT ? e->len - off : RULES_CHUNK_DEFAULT;
        ok = rpc_cstream_write_msg(cs, &rq.base) == 0;
    }
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
        rpc_status_set(st, router_node_down(rs.code) ? GRPC_STATUS_UNAVAILABLE : rs.code,
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

/* Merge one shard file into every member of shard s's group: its copies
 * and, in a joint phase, the other set's (an import is a write, and a
 * write reaches both sets).  One after the other: a copy that fails stops
 * the import, which may simply be run again. */
static int import_shard(struct router *r, const struct topo *t,
                        const struct router_filter *f, uint32_t s,
                        const struct bundle_entry *e, double *fill, double *fpr,
                        struct rpc_status *st)
{
    const struct topo_group *g = &t->groups[f->group[s]];
    for (unsigned m = 0; m < g->nmembers; m++)
        if (import_copy(r, t, f, s, topo_member(g, m), e, fill, fpr, st) < 0)
            return -1;
    return 0;
}

void router_rpc__import(void *arg, struct rpc_stream *s)
{
    struct router *r = arg;
    struct rpc_status st = {.code = GRPC_STATUS_OK};
    struct bytebuf b = {0};     /* max 0 until the filter is known */
    char name[ROUTER_NAME_MAX + 1] = "";
    struct topo *t = router_topo(r);
    struct router_filter *f = NULL;
    struct bundle_layout l = {0};
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
            rpc_status_set(&st, GRPC_STATUS_INVALID_ARGUMENT,
                              "malformed ImportRequest message");
            goto fail;
        }
        if (!f) {
            struct rpc_reply rep = {.st.code = GRPC_STATUS_OK};
            if (!m->filter[0]) {
                rpc_status_set(&st, GRPC_STATUS_INVALID_ARGUMENT,
                                  "the first ImportRequest must name the filter");
            } else if (!router_rpc__name_ok(m->filter, &rep)) {
                rpc_status_set(&st, rep.st.code, "%s", rep.st.message);
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
                    bytebuf_init(&b, limit);
                } else if (f) {
                    router_filter_unref(f);
                    f = NULL;
                }
            }
        } else if (m->filter[0] && strcmp(m->filter, name) != 0) {
            rpc_status_set(&st, GRPC_STATUS_INVALID_ARGUMENT,
                              "ImportRequest names filter \"%s\" after \"%s\"",
                              m->filter, name);
        }
        int arc = st.code == GRPC_STATUS_OK ? bytebuf_append(&b, m->data.data, m->data.len)
                                            : 0;
        if (arc == -E2BIG)
            rpc_status_set(&st, GRPC_STATUS_RESOURCE_EXHAUSTED,
                              "import is larger (%zu+ bytes) than any bundle "
                              "compatible with filter \"%s\" (%" PRIu64 " bytes)",
                              b.len + m->data.len, name, limit);
        else if (arc < 0)
            rpc_status_set(&st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        bloomgrid__v1__import_request__free_unpacked(m, NULL);
        if (st.code != GRPC_STATUS_OK)
            goto fail;
    }
    if (!f) {
        rpc_status_set(&st, GRPC_STATUS_INVALID_ARGUMENT,
                          "Import received no message naming a filter");
        goto fail;
    }
    if (bundle_check(&b, f, &l, &st) < 0)
        goto fail;
    double fill_bits = 0, fpr_sum = 0, bits = 0;
    for (uint32_t i = 0; i < f->shards; i++) {
        double fill = 0, fpr = 0;
        if (import_shard(r, t, f, i, &l.entry[i], &fill, &fpr, &st) < 0)
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
    rpc_stream_finish_status(s, &st);
out:
    router_filter_desc_free(&d);
    bundle_layout_deinit(&l);
    bytebuf_deinit(&b);
    router_filter_unref(f);
    topo_unref(t);
}
