/* router_rpc_transfer: Export of sharded filters through the router
 * (public Export on one side, internal ExportShard streams to the nodes
 * on the other).  An RPC edge file like router_rpc.c; Import is in
 * router_rpc_import.c.
 *
 * A sharded filter travels as ONE file holding every shard, the shard
 * bundle (docs/FORMAT.md, "Shard bundle"; written and framed by
 * common/engine/bundle.h).  Export streams the bundle to its client as it
 * is produced, shard after shard, from the shards' own exports (each a
 * consistent point-in-time snapshot of its shard): a shard read from one
 * copy (R = 1) goes through as its node sends it, a shard of a group read
 * by R > 1 copies is held while its R copies are ORed (the largest shard,
 * not the filter).  Every byte it holds for that (a chunk gathered and one
 * going out, a node's message, and a group's copies while they are ORed)
 * counts against max_memory_mb while held: an Export past it is
 * RESOURCE_EXHAUSTED naming it.  A failure after chunks went out still
 * ends the call with its status.
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
#include "node_client.h"
#include "proc_malloc.h"
#include "quorum.h"
#include "router.h"
#include "router_nodes.h"
#include "router_rpc.h"

#define TRANSFER_TIMEOUT_MS 600000
/* The chunks a node sends its shard's file in. */
#define EXPORT_NODE_CHUNK RULES_CHUNK_DEFAULT

/* The receive window of an Export's calls to the nodes: the most of a
 * shard's file a node sends ahead of the router that gRPC holds (the
 * router reads at its client's pace). */
#define EXPORT_NODE_WINDOW (1u << 20)

/* A channel to a node for an Export's ExportShard calls, with a receive
 * window of EXPORT_NODE_WINDOW: the links' channels let HTTP/2 BDP probing
 * grow each call's window to tens of MiB on a fast link, which a node
 * would fill while the router waits for a slow client. */
struct export_chan {
    char addr[TOPO_ADDR_MAX + 1];
    struct rpc_channel *ch;
};

/* What an Export holds, counted against max_memory_mb (rpc_server.h,
 * "Request budget"): every buffer's room before it grows, and each copy
 * parsed for a quorum read while it lives.  over: a charge was refused (st
 * says so, naming the budget); writers then return -ENOSPC.  chans: the
 * channels opened to the nodes, closed when the Export ends. */
struct export_mem {
    struct router *r;
    uint64_t held;
    bool over;
    struct rpc_status st;
    struct export_chan *chans;
    size_t nchans;
};

/* The Export's channel to node (opened on first use); NULL when out of
 * memory. */
static struct rpc_channel *export_channel(struct export_mem *m, const char *node)
{
    for (size_t i = 0; i < m->nchans; i++)
        if (!strcmp(m->chans[i].addr, node))
            return m->chans[i].ch;
    struct export_chan *c = realloc(m->chans, (m->nchans + 1) * sizeof *c);
    if (!c)
        return NULL;
    m->chans = c;
    c = &m->chans[m->nchans];
    snprintf(c->addr, sizeof c->addr, "%s", node);
    if (!(c->ch = rpc_channel_create_window(node, m->r->cfg.max_message_size,
                                            EXPORT_NODE_WINDOW)))
        return NULL;
    m->nchans++;
    return c->ch;
}

static void export_channels_close(struct export_mem *m)
{
    for (size_t i = 0; i < m->nchans; i++)
        rpc_channel_destroy(m->chans[i].ch);
    free(m->chans);
    m->chans = NULL;
    m->nchans = 0;
}

static int mem_take(struct export_mem *m, uint64_t n)
{
    if (rpc_server_charge(m->r->srv, n, &m->st) < 0) {
        m->over = true;
        return -ENOSPC;
    }
    m->held += n;
    return 0;
}

static void mem_give(struct export_mem *m, uint64_t n)
{
    rpc_server_uncharge(m->r->srv, n);
    m->held -= n;
}

/* A byte buffer whose room is counted before it grows. */
struct held_buf {
    struct bytebuf b;
    uint64_t charged;           /* its room */
    struct export_mem *m;
};

static void held_init(struct held_buf *h, struct export_mem *m)
{
    bytebuf_init(&h->b, SIZE_MAX);
    h->charged = 0;
    h->m = m;
}

static void held_deinit(struct held_buf *h)
{
    bytebuf_deinit(&h->b);
    mem_give(h->m, h->charged);
    h->charged = 0;
}

/* bf_file_writer: append to the buffer (ctx), counting the room it grows
 * to (as bytebuf grows: doubling from 64 KiB) first. */
static int held_write(void *ctx, const void *data, size_t len)
{
    struct held_buf *h = ctx;
    size_t need = h->b.len + len, cap = h->b.cap ? h->b.cap : (64u << 10);
    if (need > h->b.cap) {
        while (cap < need)
            cap = cap > SIZE_MAX / 2 ? SIZE_MAX : cap * 2;
        if (cap > h->charged) {
            if (mem_take(h->m, cap - h->charged) < 0)
                return -ENOSPC;
            h->charged = cap;
        }
    }
    return bytebuf_append(&h->b, data, len);
}

/* Where a copy's shard file goes: begin(ctx, total) once its size is
 * known, then data(ctx, ...) for each chunk; mem says why a write failed
 * with -ENOSPC. */
struct export_sink {
    int (*begin)(void *ctx, uint64_t total);
    bf_file_writer data;
    void *ctx;
    struct export_mem *mem;
};

/* Stream shard s's file, exported by the copy node, into sink.  *pbegun
 * says whether any of it reached the sink (else another copy may be
 * asked). */
static int export_copy(const struct topo *t,
                       const struct router_filter *f, uint32_t s, const char *node,
                       const struct export_sink *sink, bool *pbegun,
                       struct rpc_status *st)
{
    struct rpc_channel *ch = export_channel(sink->mem, node);
    struct rpc_status rs = {0};
    struct node_client_ref ref = {.filter = f->name, .shard = s,
                                  .topology_version = t->version};
    uint64_t got = 0, total = 0;
    bool begun = false, bad = false, sent = false;
    int wrc = 0;

    if (!ch) {
        rpc_status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        return -1;
    }
    struct rpc_cstream *cs = node_client_export_open(ch, &ref, EXPORT_NODE_CHUNK,
                                                     TRANSFER_TIMEOUT_MS, &sent);
    if (!cs) {
        rpc_status_set(st, GRPC_STATUS_UNAVAILABLE, "Export: shard %u on node %s: "
                          "cannot start the call", s, node);
        return -1;
    }
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
    /* Reading stopped before the node's end (a bad chunk, or the sink
     * failed: the budget, the client gone): cancel the call, or its finish
     * would wait for a node held by the flow control of a stream no longer
     * read.  The sink's own reason then comes first. */
    if (bad)
        rpc_cstream_cancel(cs);
    int frc = rpc_cstream_finish(cs, &rs);
    if (wrc == -ENOSPC && sink->mem->over) {
        *st = sink->mem->st;
        return -1;
    }
    if (wrc == -ENOMEM) {
        rpc_status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        return -1;
    }
    if (wrc == -ECANCELED) {
        rpc_status_set(st, GRPC_STATUS_CANCELLED, "Export of \"%s\": the client went "
                       "away", f->name);
        return -1;
    }
    if (frc < 0 && !bad) {
        rpc_status_set(st, router_node_down(rs.code) ? GRPC_STATUS_UNAVAILABLE : rs.code,
                          "Export of \"%s\": shard %u on node %s: %s: %s", f->name, s,
                          node, rpc_status_name(rs.code), rs.message);
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
    struct held_buf *h = ctx;
    return total > h->b.max ? -ENOMEM : 0;
}

/* A write of the bundle failed: the budget's refusal, or out of memory. */
static void write_failed(const struct export_mem *mem, struct rpc_status *st)
{
    if (mem->over)
        *st = mem->st;
    else
        rpc_status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
}

/* Shard s of a group of one copy, or read by one copy (R = 1): streamed
 * from the first copy that answers into the bundle (a copy that failed
 * before its file began is passed over). */
static int export_shard_one(const struct topo *t,
                            const struct router_filter *f, uint32_t s,
                            struct bundle_writer *w, struct export_mem *mem,
                            struct rpc_status *st)
{
    const struct topo_group *g = &t->groups[f->group[s]];
    struct entry_sink e = {w, s};
    struct export_sink sink = {entry_begin, entry_data, &e, mem};
    int rc = -1;
    for (unsigned c = 0; c < g->ncopies; c++) {
        bool begun = false;
        if ((rc = export_copy(t, f, s, g->copies[c], &sink, &begun, st)) == 0 || begun)
            break;
    }
    return rc;
}

/* Copy node's file of shard s, parsed; NULL with *cst saying why.  The
 * filter's bytes stay counted in mem (*charged of them) until the caller
 * gives them back. */
static struct bf *export_copy_bf(const struct topo *t,
                                 const struct router_filter *f, uint32_t s,
                                 const char *node, struct export_mem *mem,
                                 uint64_t *charged, struct rpc_status *cst)
{
    struct held_buf h;
    struct export_sink sink = {buf_begin, held_write, &h, mem};
    struct bf *one = NULL;
    char err[256];
    bool begun = false;

    *charged = 0;
    held_init(&h, mem);
    if (export_copy(t, f, s, node, &sink, &begun, cst) == 0) {
        if (mem_take(mem, h.b.len) < 0)
            *cst = mem->st;
        else if (!(one = bf_file_parse(h.b.p, h.b.len, err)))
            rpc_status_set(cst, GRPC_STATUS_DATA_LOSS, "its file does not parse: %s", err);
        if (one)
            *charged = h.b.len;
        else if (!mem->over)
            mem_give(mem, h.b.len);
    }
    held_deinit(&h);
    return one;
}

/* Shard s of a group read by R > 1 copies: one copy alone may lack a write
 * that W others acknowledged, so R copies are exported and ORed, as a read
 * asks R (R + W > N: every acknowledged key is in one of them).  inserts and
 * keys added are the largest copy's, not the sum (the copies hold the same
 * adds; an uncounted copy's BF_KEYS_UNCOUNTED is the largest).  Fewer
 * than R copies answering: UNAVAILABLE, never a file from fewer. */
static int export_shard_quorum(const struct topo *t,
                               const struct router_filter *f, uint32_t s,
                               struct bundle_writer *w, struct export_mem *mem,
                               struct rpc_status *st)
{
    const struct topo_group *g = &t->groups[f->group[s]];
    unsigned got = 0;
    uint64_t inserts = 0, keys = 0, count = 0;     /* the largest copy's */
    uint64_t acc_charged = 0, one_charged;
    struct bf *acc = NULL;
    char failed[512] = "", err[256];
    size_t flen = 0;
    int rc = -1;

    for (unsigned c = 0; c < g->ncopies && !quorum_read_met(g, got); c++) {
        struct rpc_status cst = {0};
        struct bf *one = export_copy_bf(t, f, s, g->copies[c], mem, &one_charged,
                                        &cst);
        if (mem->over) {
            /* Past the budget: not a failed copy, the Export's refusal. */
            bf_destroy(one);
            mem_give(mem, one_charged);
            *st = mem->st;
            goto out;
        }
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
        if (one && !acc) {
            acc = one;
            acc_charged = one_charged;
        } else {
            bf_destroy(one);
            mem_give(mem, one_charged);
        }
        if (cst.code && flen < sizeof failed) {
            int n = snprintf(failed + flen, sizeof failed - flen, "%s%s %s: %s",
                             flen ? "; " : "", g->copies[c],
                             rpc_status_name(cst.code), cst.message);
            flen += n > 0 ? (size_t)n : 0;
        }
    }
    if (!quorum_read_met(g, got)) {
        rpc_status_set(st, GRPC_STATUS_UNAVAILABLE,
                       "Export of \"%s\": shard %u (group %s): %u of %u copies answered, "
                       "read quorum %u; failed copies: %s", f->name, s, g->name, got,
                       g->ncopies, quorum_read_need(g), failed[0] ? failed : "none asked");
        goto out;
    }
    bf_set_counts(acc, inserts, keys, &count);
    int wrc = bundle_writer_entry(w, s, bf_file_size(acc));
    if (wrc == 0)
        wrc = bf_file_write_stable(acc, bundle_writer_data, w);   /* acc is ours */
    if (wrc == -ECANCELED) {
        rpc_status_set(st, GRPC_STATUS_CANCELLED, "Export of \"%s\": the client went "
                       "away", f->name);
        goto out;
    }
    if (wrc < 0) {
        write_failed(mem, st);
        goto out;
    }
    rc = 0;
out:
    bf_destroy(acc);
    mem_give(mem, acc_charged);
    return rc;
}

static int export_shard(const struct topo *t,
                        const struct router_filter *f, uint32_t s,
                        struct bundle_writer *w, struct export_mem *mem,
                        struct rpc_status *st)
{
    const struct topo_group *g = &t->groups[f->group[s]];
    /* R > 1 (so N > 1): one copy alone may lack a write. */
    if (quorum_read_need(g) > 1)
        return export_shard_quorum(t, f, s, w, mem, st);
    return export_shard_one(t, f, s, w, mem, st);
}

/* The Export's way out to its client: the bundle's bytes gathered into
 * chunks of `chunk` bytes, each sent as a FileChunk once full and more bytes
 * follow; the next one is gathered while it goes out (rpc_stream_send), so
 * the router holds the chunk being gathered and the message being sent,
 * whatever the bundle's size.  Its total size is known only at its end:
 * every chunk says total_size 0 (not known yet) but the last, which says
 * it (proto/bloomgrid/v1/bloomgrid.proto, Export).  A client that goes
 * away makes its writes fail with -ECANCELED; a slow one holds the router
 * (and, through the flow control of the node's stream, the node) at its
 * pace. */
struct export_out {
    struct rpc_stream *s;
    uint8_t *buf;           /* the chunk being gathered */
    size_t chunk, len;      /* its room and its bytes */
    uint64_t off;           /* bundle bytes sent before buf */
};

/* Send the gathered bytes as one FileChunk (total: 0, or the bundle's size
 * on the last), after the message before it has gone out. */
static int out_send(struct export_out *o, uint64_t total)
{
    Bloomgrid__V1__FileChunk fc = BLOOMGRID__V1__FILE_CHUNK__INIT;
    if (rpc_stream_drain(o->s) < 0)
        return -ECANCELED;
    fc.offset = o->off;
    fc.data.data = o->buf;
    fc.data.len = o->len;
    fc.total_size = total;
    size_t n = protobuf_c_message_get_packed_size(&fc.base);
    grpc_slice sl = grpc_slice_malloc(n);
    protobuf_c_message_pack(&fc.base, GRPC_SLICE_START_PTR(sl));
    if (rpc_stream_send(o->s, sl) < 0)
        return -ECANCELED;
    o->off += o->len;
    o->len = 0;
    return 0;
}

/* bf_file_writer of the bundle: a full chunk goes out when more bytes
 * come, so the last chunk (holding at least the trailer) is sent by
 * out_end. */
static int out_write(void *ctx, const void *data, size_t len)
{
    struct export_out *o = ctx;
    const uint8_t *p = data;
    while (len > 0) {
        if (o->len == o->chunk && out_send(o, 0) < 0)
            return -ECANCELED;
        size_t n = o->chunk - o->len < len ? o->chunk - o->len : len;
        memcpy(o->buf + o->len, p, n);
        o->len += n;
        p += n;
        len -= n;
    }
    return 0;
}

/* The last chunk, saying the bundle's size; then wait until it is out. */
static int out_end(struct export_out *o)
{
    if (out_send(o, o->off + o->len) < 0 || rpc_stream_drain(o->s) < 0)
        return -ECANCELED;
    return 0;
}

/* A write of the bundle to the client failed: the client went away. */
static void client_gone(const char *name, struct rpc_status *st)
{
    rpc_status_set(st, GRPC_STATUS_CANCELLED, "Export of \"%s\": the client went away",
                   name);
}

/* Stream the bundle of every shard of filter f to the client through o:
 * the header, then each shard's entry as its copy (R = 1) sends it, or as
 * R copies ORed give it (R > 1), then the trailer.  A failure after some
 * chunks went out ends the call with its status all the same: the client
 * never takes a stream cut short for a whole file. */
static int export_bundle(const struct topo *t,
                         const struct router_filter *f, struct export_out *o,
                         struct export_mem *mem, struct rpc_status *st)
{
    struct bundle_writer w;
    int rc = bundle_writer_begin(&w, f->shards, out_write, o);
    if (rc < 0) {
        if (rc == -ECANCELED)
            client_gone(f->name, st);
        else
            write_failed(mem, st);
        return -1;
    }
    for (uint32_t s = 0; s < f->shards; s++) {
        if (export_shard(t, f, s, &w, mem, st) < 0) {
            bundle_writer_abort(&w);
            return -1;
        }
    }
    if ((rc = bundle_writer_end(&w)) < 0 || out_end(o) < 0) {
        if (rc < 0 && rc != -ECANCELED)
            write_failed(mem, st);
        else
            client_gone(f->name, st);
        return -1;
    }
    return 0;
}

/* The chunk size of an Export's answer: the client's (0: the default),
 * within RULES_CHUNK_MAX and the message size. */
static size_t export_chunk_size(const struct rpc_stream *s, uint32_t asked)
{
    size_t chunk = asked ? asked : RULES_CHUNK_DEFAULT;
    if (chunk > RULES_CHUNK_MAX)
        chunk = RULES_CHUNK_MAX;
    if (chunk + 64 > rpc_stream_max_message(s))
        chunk = rpc_stream_max_message(s) - 64;
    return chunk;
}

/* Let go of what an Export held (once; *base 0 after): its buffer, its
 * channels to the nodes and its charge.  An Export passes the whole filter
 * through buffers of a few MiB, taken and freed by this thread and gRPC's:
 * what the allocator's arenas kept free of them goes back to the system
 * now, or each Export on another thread would leave its own behind
 * (proc_malloc.h). */
static void export_release(struct export_out *o, struct export_mem *mem,
                           uint64_t *base)
{
    free(o->buf);
    o->buf = NULL;
    export_channels_close(mem);
    if (*base) {
        mem_give(mem, *base);
        *base = 0;
        proc_malloc_release();
    }
}

void router_rpc__export(void *arg, struct rpc_stream *s)
{
    struct router *r = arg;
    struct rpc_status st = {0};
    struct export_mem mem = {.r = r};
    struct export_out o = {.s = s};
    struct topo *t = NULL;
    struct router_filter *f = NULL;
    uint64_t base = 0;
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
    struct rpc_reply rep = {.st.code = GRPC_STATUS_OK};
    if (!router_rpc__name_ok(m->filter, &rep)) {
        rpc_stream_finish_status(s, &rep.st);
        goto out;
    }
    t = router_topo(r);
    if (!(f = router_filter_lookup(r, t, m->filter, &st))) {
        rpc_stream_finish_status(s, &st);
        goto out;
    }
    /* What the stream holds whatever the filter's size, counted while it
     * runs: the chunk being gathered and the message going out, a node's
     * message received and its decoded copy, and what the node's call may
     * have sent ahead (its window). */
    o.chunk = export_chunk_size(s, m->chunk_size);
    base = 2 * (uint64_t)o.chunk + 64 + 2 * (uint64_t)EXPORT_NODE_CHUNK +
           EXPORT_NODE_WINDOW;
    if (mem_take(&mem, base) < 0) {
        base = 0;
        rpc_stream_finish_status(s, &mem.st);
        goto out;
    }
    if (!(o.buf = malloc(o.chunk))) {
        rpc_stream_finish(s, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    rc = export_bundle(t, f, &o, &mem, &st);
    /* What the Export held goes back before its status does: a client that
     * has the status may count on the stream's place being free (the
     * router's max_streams), and closing the channels and giving memory
     * back take a while. */
    export_release(&o, &mem, &base);
    if (rc < 0) {
        if (st.code == GRPC_STATUS_OK)    /* never OK for a bundle cut short */
            rpc_status_set(&st, GRPC_STATUS_INTERNAL, "Export of \"%s\" failed after "
                           "%" PRIu64 " bytes", m->filter, o.off);
        if (st.code == GRPC_STATUS_CANCELLED)
            log_info("Export of filter %s ended after %" PRIu64 " bytes: %s", m->filter,
                     o.off, st.message);
        rpc_stream_finish_status(s, &st);
        goto out;
    }
    log_info("exported filter %s (%" PRIu64 " bytes, one bundle of every shard)",
             m->filter, o.off);
    rpc_stream_finish(s, GRPC_STATUS_OK, "%s", "");
out:
    export_release(&o, &mem, &base);
    router_filter_unref(f);
    if (t)
        topo_unref(t);
    bloomgrid__v1__export_request__free_unpacked(m, NULL);
}
