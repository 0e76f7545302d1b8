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
 * copy (R = 1) goes through as its node sends it; a shard of a group read
 * by R > 1 copies is read from its R copies at once, in step, and ORed a
 * piece at a time as it goes out (export_shard_quorum; only blocked and
 * classic filters have several copies, but the counting kind's counters
 * would be added as a merge adds them, and a scalable filter's layers that
 * only some copies have taken from those).  So an
 * Export holds a bounded window whatever the shards' sizes: a chunk
 * gathered and one going out, and per copy read a message received and
 * decoded and its call's receive window, plus one piece for R > 1.  Every
 * byte of it counts against max_memory_mb while held: an Export past it
 * is RESOURCE_EXHAUSTED naming it.  A failure after chunks went out still
 * ends the call with its status (for R > 1, a copy that fails once its
 * shard's entry has begun fails the Export UNAVAILABLE naming it: the
 * entry is never made of fewer than R copies).
 *
 * Threads: each Export runs on one of the server's stream threads
 * (rpc_server.h, max_streams) and blocks there on its client's and its
 * nodes' streams, one node stream per copy it reads; Exports share only
 * the budget and the router's topology and filters (held by reference).
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
#include "log.h"
#include "node_client.h"
#include "proc_malloc.h"
#include "quorum.h"
#include "router.h"
#include "router_nodes.h"
#include "router_rpc.h"

#include <xxhash.h>

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

/* ---- R > 1: the copies read in step ----------------------------------
 *
 * A shard of a group read by R > 1 copies: one copy alone may lack a write
 * that W others acknowledged, so R copies are exported and ORed, as a read
 * asks R (R + W > N: every acknowledged key is in one of them).  The R
 * ExportShard streams are open at once and read in step: each copy's
 * header and layer descriptors first (they must agree, else "its copy
 * differs" and the next copy is asked), then the entry is written as the
 * copies' bodies arrive, a piece of EXPORT_STEP_PIECE bytes at a time, each
 * piece taken from every copy that has the layer and combined as a merge
 * does (bits ORed; counting: counters added, saturating), then each copy's
 * checksum checked and the entry's own written.  What is held is one piece
 * and each copy's message and window, whatever the shard's size. */

/* The piece of a layer's body combined at a time (a multiple of 8). */
#define EXPORT_STEP_PIECE (256u << 10)

/* What each stream of a copy read in step holds: its message received and
 * decoded (up to a node chunk each) and what its call may have sent ahead
 * (its window).  The Export's base counts one stream; every further one
 * open at once is counted as it opens. */
#define EXPORT_STEP_STREAM (2 * (uint64_t)EXPORT_NODE_CHUNK + EXPORT_NODE_WINDOW)

/* One copy's ExportShard stream, read in step with the others. */
struct step_copy {
    const char *node;
    struct rpc_cstream *cs;         /* NULL once finished */
    bool charged;                   /* EXPORT_STEP_STREAM counted for it */
    Bloomgrid__V1__FileChunk *fc;   /* the message being taken, or NULL */
    size_t at;                      /* bytes of fc taken */
    uint64_t got, total;            /* file bytes received; its size (0: not yet) */
    XXH64_state_t *xx;              /* of every byte taken before its trailer */
    struct bf *meta;                /* its geometry and counts (bodies untouched) */
    uint32_t nlayers;
    uint64_t m[BF_MAX_LAYERS], body[BF_MAX_LAYERS];
    struct rpc_status st;           /* why it failed (code 0: it did not) */
};

/* End c's call (cancelled unless its messages all came) and let go of what
 * it holds.  Its status, when it failed and c has no reason yet, goes to
 * c->st. */
static void step_close(struct step_copy *c, struct export_mem *mem, bool cancel)
{
    if (c->cs) {
        struct rpc_status rs = {0};
        if (cancel)
            rpc_cstream_cancel(c->cs);
        if (rpc_cstream_finish(c->cs, &rs) < 0 && !c->st.code && !cancel)
            c->st = rs;
        c->cs = NULL;
    }
    if (c->fc)
        bloomgrid__v1__file_chunk__free_unpacked(c->fc, NULL);
    c->fc = NULL;
    if (c->xx)
        XXH64_freeState(c->xx);
    c->xx = NULL;
    bf_destroy(c->meta);
    c->meta = NULL;
    if (c->charged)
        mem_give(mem, EXPORT_STEP_STREAM);
    c->charged = false;
}

/* c failed: its stream's status (or, when it ended without one, that its
 * file ended early) becomes its reason, unless it has one already. */
static void step_fail(struct step_copy *c, struct export_mem *mem)
{
    bool had = c->st.code != 0;
    step_close(c, mem, had);
    if (!c->st.code)
        rpc_status_set(&c->st, GRPC_STATUS_UNAVAILABLE, "its file ended early");
}

/* Start copy node's ExportShard of shard s into c, counting its stream
 * (charge: another stream is open already).  -1 when the budget refused
 * it (mem->st says so); a call that cannot start leaves c->st set. */
static int step_open(const struct topo *t, const struct router_filter *f, uint32_t s,
                     const char *node, bool charge, struct export_mem *mem,
                     struct step_copy *c)
{
    struct node_client_ref ref = {.filter = f->name, .shard = s,
                                  .topology_version = t->version};
    struct rpc_channel *ch;
    bool sent = false;

    memset(c, 0, sizeof *c);
    c->node = node;
    if (charge) {
        if (mem_take(mem, EXPORT_STEP_STREAM) < 0)
            return -1;
        c->charged = true;
    }
    if (!(c->xx = XXH64_createState()) || !(ch = export_channel(mem, node))) {
        rpc_status_set(&c->st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        return 0;
    }
    XXH64_reset(c->xx, 0);
    c->cs = node_client_export_open(ch, &ref, EXPORT_NODE_CHUNK, TRANSFER_TIMEOUT_MS,
                                    &sent);
    if (!c->cs)
        rpc_status_set(&c->st, GRPC_STATUS_UNAVAILABLE, "cannot start the call");
    else if (!sent)
        step_fail(c, mem);
    return 0;
}

/* Up to want (> 0) more bytes of c's file at *p (valid until the next
 * take), receiving its next message when the one held is used up.  The
 * bytes taken, or 0 when c failed (c->st says why; its call is over). */
static size_t step_take(struct step_copy *c, struct export_mem *mem, size_t want,
                        const uint8_t **p)
{
    while (!c->fc || c->at == c->fc->data.len) {
        grpc_slice sl;
        if (c->fc)
            bloomgrid__v1__file_chunk__free_unpacked(c->fc, NULL);
        c->fc = NULL;
        c->at = 0;
        if (!c->cs || rpc_cstream_read(c->cs, &sl) != 1) {
            step_fail(c, mem);
            return 0;
        }
        Bloomgrid__V1__FileChunk *fc = bloomgrid__v1__file_chunk__unpack(
            NULL, GRPC_SLICE_LENGTH(sl), GRPC_SLICE_START_PTR(sl));
        grpc_slice_unref(sl);
        if (!fc || fc->offset != c->got || fc->total_size == 0 ||
            (c->total && fc->total_size != c->total) ||
            fc->offset + fc->data.len > fc->total_size) {
            if (fc)
                bloomgrid__v1__file_chunk__free_unpacked(fc, NULL);
            rpc_status_set(&c->st, GRPC_STATUS_UNAVAILABLE, "it sent an incomplete or "
                           "inconsistent file");
            step_fail(c, mem);
            return 0;
        }
        c->total = fc->total_size;
        c->got += fc->data.len;
        c->fc = fc;
    }
    size_t n = c->fc->data.len - c->at;
    if (n > want)
        n = want;
    *p = c->fc->data.data + c->at;
    c->at += n;
    return n;
}

/* Exactly n bytes of c's file into buf, hashed into its checksum when
 * hash.  0, or -1 when c failed. */
static int step_read(struct step_copy *c, struct export_mem *mem, void *buf, size_t n,
                     bool hash)
{
    for (size_t got = 0, k; got < n; got += k) {
        const uint8_t *p;
        if (!(k = step_take(c, mem, n - got, &p)))
            return -1;
        if (hash)
            XXH64_update(c->xx, p, k);
        memcpy((uint8_t *)buf + got, p, k);
    }
    return 0;
}

/* c's header and layer descriptors: parsed (docs/FORMAT.md, checks 1-8),
 * its size the one its stream announced, and its geometry ref's (when ref
 * is not NULL: the first copy that got this far).  0, or -1 when c failed
 * (its call is then over). */
static int step_meta(struct step_copy *c, const struct step_copy *ref,
                     struct export_mem *mem)
{
    uint8_t buf[BF_FILE_META_MAX];
    char err[BF_ERRLEN];
    const char *why;

    if (step_read(c, mem, buf, BF_FILE_HEADER_BYTES, true) < 0)
        return -1;
    uint32_t nl = (uint32_t)buf[20] | (uint32_t)buf[21] << 8 | (uint32_t)buf[22] << 16 |
                  (uint32_t)buf[23] << 24;   /* the layer count (docs/FORMAT.md) */
    size_t len = BF_FILE_HEADER_BYTES;
    if (nl >= 1 && nl <= BF_MAX_LAYERS) {
        if (step_read(c, mem, buf + len, (size_t)nl * BF_FILE_LAYER_BYTES, true) < 0)
            return -1;
        len += (size_t)nl * BF_FILE_LAYER_BYTES;
    }
    if (!(c->meta = bf_file_meta_parse(buf, len, NULL, err)))
        rpc_status_set(&c->st, GRPC_STATUS_DATA_LOSS, "its file does not parse: %s", err);
    else if (bf_file_size(c->meta) != c->total)
        rpc_status_set(&c->st, GRPC_STATUS_DATA_LOSS, "its file does not parse: bad size "
                       "(%" PRIu64 " bytes, its header says %" PRIu64 ")", c->total,
                       bf_file_size(c->meta));
    else if (ref && (why = bf_mismatch(ref->meta, c->meta)))
        rpc_status_set(&c->st, GRPC_STATUS_DATA_LOSS, "its copy differs: filters are not "
                       "compatible: %s differs", why);
    if (c->st.code) {
        step_close(c, mem, true);
        return -1;
    }
    c->nlayers = bf_layer_count(c->meta);
    for (uint32_t i = 0; i < c->nlayers; i++) {
        struct bf_layer_info li;
        bf_layer_info(c->meta, i, &li);
        c->m[i] = li.m;
        c->body[i] = li.body_bytes;
    }
    return 0;
}

/* Is a bit set past the last bit (counting: counter) in use of a layer of
 * m bits (counters) in its body's bytes [off, off + n) at p?  (No writer
 * sets one; docs/FORMAT.md, check 10.) */
static bool step_padding(enum bf_kind kind, uint64_t m, uint64_t off, const uint8_t *p,
                         size_t n)
{
    uint64_t used = kind == BF_KIND_COUNTING ? m * BF_COUNTER_BITS : m;
    uint64_t from = used / 8;       /* the first byte with padding bits */
    for (uint64_t j = from > off ? from : off; j < off + n; j++) {
        uint8_t b = p[j - off];
        if (j == from)
            b &= (uint8_t)(0xFFu << (used % 8));
        if (b)
            return true;
    }
    return false;
}

/* Combine n bytes of a copy's body (src) into dst, as bf_merge_from does:
 * bits ORed, counters added (saturating).  Byte for byte, so any split of
 * the body into pieces gives the same bytes. */
static void step_combine(enum bf_kind kind, uint8_t *dst, const uint8_t *src, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t a, b;
        memcpy(&a, dst + i, 8);
        memcpy(&b, src + i, 8);
        a = kind == BF_KIND_COUNTING ? bf_counters_add(a, b) : a | b;
        memcpy(dst + i, &a, 8);
    }
    for (; i < n; i++)
        dst[i] = kind == BF_KIND_COUNTING ? (uint8_t)bf_counters_add(dst[i], src[i])
                                          : dst[i] | src[i];
}

/* Bytes of the entry: hashed into its checksum, then into the bundle. */
static int step_emit(struct bundle_writer *w, XXH64_state_t *xx, const void *p, size_t n)
{
    XXH64_update(xx, p, n);
    return bundle_writer_data(w, p, n);
}

/* The entry's header and descriptors: act[0]'s (the first copy that
 * answered), with layers only later copies have taken from the first of
 * them, and the counts the largest copy's: inserts and keys added (the
 * copies hold the same adds; an uncounted copy's BF_KEYS_UNCOUNTED is the
 * largest), and each layer's count.  Returns the bytes written to out and
 * the whole entry's size in *size. */
static size_t step_entry_meta(struct step_copy *const *act, unsigned nact, uint8_t *out,
                              uint64_t *size)
{
    uint64_t inserts = 0, keys = 0, counts[BF_MAX_LAYERS] = {0};
    uint32_t nl = 0;
    for (unsigned a = 0; a < nact; a++) {
        const struct bf *m = act[a]->meta;
        if (bf_insert_count(m) > inserts)
            inserts = bf_insert_count(m);
        if (bf_keys_added(m) > keys)
            keys = bf_keys_added(m);
        for (uint32_t i = 0; i < act[a]->nlayers; i++) {
            struct bf_layer_info li;
            bf_layer_info(m, i, &li);
            if (li.count > counts[i])
                counts[i] = li.count;
        }
        if (act[a]->nlayers > nl)
            nl = act[a]->nlayers;
    }
    for (unsigned a = 0; a < nact; a++)
        bf_set_counts(act[a]->meta, inserts, keys, counts);
    size_t len = bf_file_meta_encode(act[0]->meta, nl, out);
    *size = len + 8;
    for (uint32_t i = 0; i < nl; i++) {
        unsigned a = 0;
        while (act[a]->nlayers <= i)
            a++;
        if (a > 0) {
            uint8_t other[BF_FILE_META_MAX];
            bf_file_meta_encode(act[a]->meta, act[a]->nlayers, other);
            size_t d = BF_FILE_HEADER_BYTES + (size_t)i * BF_FILE_LAYER_BYTES;
            memcpy(out + d, other + d, BF_FILE_LAYER_BYTES);
        }
        *size += act[a]->body[i];
    }
    return len;
}

/* The copies' trailers: each its checksum, then the end of its messages
 * and an OK status.  0, or the first copy that failed (-1, *bad). */
static int step_trailers(struct step_copy *const *act, unsigned nact,
                         struct export_mem *mem, unsigned *bad)
{
    for (unsigned a = 0; a < nact; a++) {
        struct step_copy *c = act[a];
        uint8_t tr[8];
        *bad = a;
        if (step_read(c, mem, tr, sizeof tr, false) < 0)
            return -1;
        uint64_t want = XXH64_digest(c->xx), have = 0;
        for (int i = 7; i >= 0; i--)
            have = have << 8 | tr[i];
        if (have != want) {
            rpc_status_set(&c->st, GRPC_STATUS_DATA_LOSS, "its file does not parse: "
                           "checksum mismatch");
            step_close(c, mem, true);
            return -1;
        }
        /* Nothing may follow (its chunks said its size), and its status is
         * OK: anything else fails it. */
        if (c->fc && c->at < c->fc->data.len) {
            rpc_status_set(&c->st, GRPC_STATUS_UNAVAILABLE, "it sent an incomplete or "
                           "inconsistent file");
            step_close(c, mem, true);
            return -1;
        }
        grpc_slice sl;
        if (rpc_cstream_read(c->cs, &sl) == 1) {
            grpc_slice_unref(sl);
            rpc_status_set(&c->st, GRPC_STATUS_UNAVAILABLE, "it sent an incomplete or "
                           "inconsistent file");
            step_close(c, mem, true);
            return -1;
        }
        step_close(c, mem, false);
        if (c->st.code)
            return -1;
    }
    return 0;
}

/* Append "NODE CODE: message" of a failed copy to the list failed. */
static void step_note(char *failed, size_t cap, size_t *flen, const struct step_copy *c)
{
    if (*flen >= cap)
        return;
    int n = snprintf(failed + *flen, cap - *flen, "%s%s %s: %s", *flen ? "; " : "",
                     c->node, rpc_status_name(c->st.code), c->st.message);
    *flen += n > 0 ? (size_t)n : 0;
}

/* Shard s of a group read by R > 1 copies, read in step (above).  inserts
 * and keys added are the largest copy's, not the sum.  Fewer than R copies
 * answering with the same geometry: UNAVAILABLE naming them, never a file
 * from fewer; a copy that fails once the entry has begun fails the Export
 * (UNAVAILABLE naming it: the others have gone on without it). */
static int export_shard_quorum(const struct topo *t,
                               const struct router_filter *f, uint32_t s,
                               struct bundle_writer *w, struct export_mem *mem,
                               struct rpc_status *st)
{
    const struct topo_group *g = &t->groups[f->group[s]];
    unsigned need = quorum_read_need(g), next = 0, nact = 0, opened = 0, bad = 0;
    struct step_copy *cp = calloc(g->ncopies, sizeof *cp), *act[TOPO_MAX_COPIES] = {0};
    uint8_t meta[BF_FILE_META_MAX], *piece = NULL;
    bool piece_charged = false;
    XXH64_state_t *xx = NULL;
    char failed[512] = "";
    size_t flen = 0;
    int rc = -1, wrc = 0;

    if (!cp) {
        rpc_status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        return -1;
    }
    /* R copies whose headers agree: the first R asked at once, the next
     * ones in the place of those that fail. */
    while (nact < need && next < g->ncopies) {
        unsigned from = next;
        while (next < g->ncopies && next - from < need - nact) {
            if (step_open(t, f, s, g->copies[next], opened > 0, mem, &cp[next]) < 0) {
                *st = mem->st;    /* past the budget: the Export's refusal */
                goto out;
            }
            opened++;
            next++;
        }
        for (unsigned c = from; c < next; c++) {
            if (!cp[c].st.code)
                step_meta(&cp[c], nact ? act[0] : NULL, mem);
            if (cp[c].st.code) {
                step_close(&cp[c], mem, true);
                step_note(failed, sizeof failed, &flen, &cp[c]);
            } else {
                act[nact++] = &cp[c];
            }
        }
    }
    if (nact < need) {
        rpc_status_set(st, GRPC_STATUS_UNAVAILABLE,
                       "Export of \"%s\": shard %u (group %s): %u of %u copies answered, "
                       "read quorum %u; failed copies: %s", f->name, s, g->name, nact,
                       g->ncopies, need, failed[0] ? failed : "none asked");
        goto out;
    }

    uint64_t size;
    size_t mlen = step_entry_meta(act, nact, meta, &size);
    enum bf_kind kind = bf_kind(act[0]->meta);
    uint32_t nl = (uint32_t)((mlen - BF_FILE_HEADER_BYTES) / BF_FILE_LAYER_BYTES);
    uint64_t body[BF_MAX_LAYERS], m[BF_MAX_LAYERS];
    for (uint32_t i = 0; i < nl; i++) {
        unsigned a = 0;
        while (act[a]->nlayers <= i)
            a++;
        body[i] = act[a]->body[i];
        m[i] = act[a]->m[i];
    }
    for (unsigned a = 0; a < nact; a++) {
        bf_destroy(act[a]->meta);   /* its geometry is known now */
        act[a]->meta = NULL;
    }
    if (mem_take(mem, EXPORT_STEP_PIECE) < 0) {
        *st = mem->st;
        goto out;
    }
    piece_charged = true;
    if (!(piece = malloc(EXPORT_STEP_PIECE)) || !(xx = XXH64_createState())) {
        rpc_status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    XXH64_reset(xx, 0);
    if ((wrc = bundle_writer_entry(w, s, size)) < 0 ||
        (wrc = step_emit(w, xx, meta, mlen)) < 0)
        goto out_failed;

    for (uint32_t i = 0; i < nl; i++) {
        for (uint64_t off = 0, n; off < body[i]; off += n) {
            n = body[i] - off < EXPORT_STEP_PIECE ? body[i] - off : EXPORT_STEP_PIECE;
            bool first = true;
            for (unsigned a = 0; a < nact; a++) {
                struct step_copy *c = act[a];
                if (c->nlayers <= i)
                    continue;
                bad = a;
                for (size_t fill = 0, k; fill < n; fill += k) {
                    const uint8_t *p;
                    if (!(k = step_take(c, mem, n - fill, &p)))
                        goto copy_failed;
                    XXH64_update(c->xx, p, k);
                    if (step_padding(kind, m[i], off + fill, p, k)) {
                        rpc_status_set(&c->st, GRPC_STATUS_DATA_LOSS, "its file does "
                                       "not parse: bad padding in layer %u", i);
                        step_close(c, mem, true);
                        goto copy_failed;
                    }
                    if (first)
                        memcpy(piece + fill, p, k);
                    else
                        step_combine(kind, piece + fill, p, k);
                }
                first = false;
            }
            if ((wrc = step_emit(w, xx, piece, n)) < 0)
                goto out_failed;
        }
    }
    if (step_trailers(act, nact, mem, &bad) < 0)
        goto copy_failed;
    uint8_t tr[8];
    uint64_t sum = XXH64_digest(xx);
    for (int i = 0; i < 8; i++)
        tr[i] = (uint8_t)(sum >> (8 * i));
    if ((wrc = bundle_writer_data(w, tr, sizeof tr)) < 0)
        goto out_failed;
    rc = 0;
    goto out;

copy_failed:
    rpc_status_set(st, GRPC_STATUS_UNAVAILABLE,
                   "Export of \"%s\": shard %u (group %s): copy %s failed while its file "
                   "was read with %u other%s: %s: %s; an Export never ORs fewer than the "
                   "read quorum %u", f->name, s, g->name, act[bad]->node, nact - 1,
                   nact == 2 ? "" : "s", rpc_status_name(act[bad]->st.code),
                   act[bad]->st.message, need);
    goto out;
out_failed:
    if (wrc == -ECANCELED)
        rpc_status_set(st, GRPC_STATUS_CANCELLED, "Export of \"%s\": the client went "
                       "away", f->name);
    else
        write_failed(mem, st);
out:
    for (unsigned c = 0; c < next; c++)
        step_close(&cp[c], mem, true);
    if (xx)
        XXH64_freeState(xx);
    free(piece);
    if (piece_charged)
        mem_give(mem, EXPORT_STEP_PIECE);
    free(cp);
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
