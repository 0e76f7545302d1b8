/* router_rpc_import: Import of a sharded filter through the router, the
 * shard bundle streamed on to the nodes shard by shard.  An RPC edge file
 * like router_rpc.c.
 *
 * The bundle (docs/FORMAT.md, "Shard bundle"; common/engine/bundle.h) is read as
 * it arrives, never held whole: the router checks its frame on the way
 * (magic, version, the shard count against the filter's, each entry's
 * index in shard order and its length against what a file of that shard
 * can be, and the trailer's XXH3-64 of every byte before it) and forwards
 * each shard's file, message by message, on one internal ImportShard
 * stream to every member of the shard's group.  A node collects its
 * shard's file, checks it whole (its checksum, and that it is this shard
 * of this filter: "secret", "shard_index", "shard_count") and merges it
 * only when the router half-closes the stream.  The router does that one
 * entry late: a shard is merged once the next entry's header (for the last
 * shard, the trailer and the end of the client's stream) has arrived and
 * checks out; on any refusal before that, its streams are cancelled and
 * the nodes drop what they collected.  So an Import holds no more than one
 * message of its client and one shard's streams at the router, and one
 * shard's file on each of that shard's nodes (their max_memory_mb counts
 * it).
 *
 * What this gives: a bundle of another filter or shard count, a plain
 * filter file, a frame out of order and a damaged first shard are refused
 * before anything changes.  A shard found damaged later (or a bundle cut
 * short, or a trailer that does not match) is refused with the shards
 * before it merged: they are this filter's own shard files, checked by
 * their nodes, so merging them only added bits the file holds; importing
 * an intact file completes the import (merging is idempotent).  A node
 * that fails half-way does the same.
 */
#include <errno.h>
#include <stdarg.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "bf.h"
#include "bf_file.h"
#include "bloomgrid/v1/bloomgrid.pb-c.h"
#include "bloomgrid/v1/internal.pb-c.h"
#include "bundle.h"
#include "log.h"
#include "node_client.h"
#include "router.h"
#include "router_nodes.h"
#include "router_rpc.h"
#include "rules.h"

#define TRANSFER_TIMEOUT_MS 600000
/* The last bytes of a shard's file, sent only when it is to be merged: a
 * node given less than the whole file merges nothing of it, whatever it
 * makes of a cancelled stream. */
#define TAIL_BYTES 64

enum import_state {
    IM_HEAD,        /* the bundle's header (BUNDLE_HEAD_BYTES) */
    IM_ENTRY,       /* an entry's header (BUNDLE_ENTRY_BYTES) */
    IM_FHEAD,       /* the header of an entry's file (BF_FILE_HEADER_BYTES) */
    IM_DATA,        /* the rest of the entry's file */
    IM_TRAILER,     /* the checksum (BUNDLE_TRAILER_BYTES) */
    IM_DONE,        /* nothing may follow */
};

struct import_run {
    struct router *r;
    struct topo *t;
    struct router_filter *f;
    struct router_filter_desc d;
    char name[ROUTER_NAME_MAX + 1];
    /* The frame, as it arrives. */
    enum import_state state;
    uint8_t part[BF_FILE_HEADER_BYTES];  /* a header being collected */
    size_t npart;
    uint32_t shard;              /* the entry being read (or last read) */
    uint64_t flen, fpos;         /* its file's length, bytes of it read */
    uint8_t tail[TAIL_BYTES];    /* its file's last bytes, held back */
    uint64_t received;           /* bundle bytes so far */
    XXH3_state_t *xx;            /* of every byte before the trailer */
    /* The streams of shard `pending` to its group's members: open, its
     * file sent (or being sent), not yet merged. */
    struct rpc_cstream *cs[TOPO_MAX_COPIES];
    const char *node[TOPO_MAX_COPIES];
    unsigned ncs;
    bool open;
    uint32_t pending;
    uint32_t merged;             /* shards merged so far */
    double fill_bits, bits, fpr_sum;
    struct rpc_status st;
};

static uint64_t get_le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/* The import fails with code and the message fmt makes, followed by what
 * was merged before it (im->st).  Returns -1. */
static int refuse(struct import_run *im, grpc_status_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int refuse(struct import_run *im, grpc_status_code code, const char *fmt, ...)
{
    char what[RPC_MSGLEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (im->merged)
        rpc_status_set(&im->st, code, "%s; shards 0..%u were merged before it (their "
                       "own files, checked by their nodes): import an intact file to "
                       "finish (merging is idempotent)", what, im->merged - 1);
    else
        rpc_status_set(&im->st, code, "%s; nothing was merged", what);
    return -1;
}

/* The most a file of shard s can be: about the shard's size (scalable
 * shards may have grown more layers), as a node bounds an Import. */
static uint64_t shard_limit(const struct import_run *im, uint32_t s)
{
    const struct router_shard_desc *sd = &im->d.shard[s];
    uint64_t grow = sd->kind == BLOOMGRID__V1__FILTER_KIND__FILTER_KIND_SCALABLE ? 64 : 1;
    return sd->bytes * grow + (1u << 20);
}

/* Cancel the pending shard's streams: the nodes merge nothing of it. */
static void shard_cancel(struct import_run *im)
{
    for (unsigned i = 0; i < im->ncs; i++) {
        struct rpc_status ignored;
        rpc_cstream_cancel(im->cs[i]);
        rpc_cstream_finish(im->cs[i], &ignored);
    }
    im->ncs = 0;
    im->open = false;
}

/* Take member i's stream off the pending shard's (it is finished). */
static void drop_member(struct import_run *im, unsigned i)
{
    for (unsigned k = i + 1; k < im->ncs; k++) {
        im->cs[k - 1] = im->cs[k];
        im->node[k - 1] = im->node[k];
    }
    im->ncs--;
}

/* A member's stream failed (while sending, or at its answer; finished:
 * its status when the stream is finished already): the import fails with
 * that status, the pending shard cancelled everywhere else. */
static int member_failed(struct import_run *im, unsigned i,
                         const struct rpc_status *finished)
{
    struct rpc_status rs = {0};
    if (finished)
        rs = *finished;
    else
        rpc_cstream_finish(im->cs[i], &rs);
    const char *node = im->node[i];
    uint32_t s = im->pending;
    drop_member(im, i);
    shard_cancel(im);
    if (rs.code == GRPC_STATUS_OK)
        rs.code = GRPC_STATUS_UNAVAILABLE;
    return refuse(im, router_node_down(rs.code) ? GRPC_STATUS_UNAVAILABLE : rs.code,
                  "Import into \"%s\": shard %u on node %s: %s: %s", im->name, s, node,
                  rpc_status_name(rs.code), rs.message);
}

/* Open shard s's streams to every member of its group: its copies and, in
 * a joint phase, the other set's (an import is a write). */
static int shard_open(struct import_run *im, uint32_t s)
{
    const struct topo_group *g = &im->t->groups[im->f->group[s]];
    im->pending = s;
    im->ncs = 0;
    im->open = true;
    for (unsigned m = 0; m < g->nmembers; m++) {
        const char *node = topo_member(g, m);
        struct rpc_channel *ch = router_channel(im->r, node);
        struct rpc_cstream *cs = ch ? node_client_import_open(ch, TRANSFER_TIMEOUT_MS)
                                    : NULL;
        if (!cs) {
            shard_cancel(im);
            return refuse(im, GRPC_STATUS_UNAVAILABLE, "Import into \"%s\": shard %u "
                          "on node %s: cannot start the call", im->name, s, node);
        }
        im->cs[im->ncs] = cs;
        im->node[im->ncs++] = node;
    }
    return 0;
}

/* Send len bytes of the pending shard's file to each of its members. */
static int shard_send(struct import_run *im, const uint8_t *p, size_t len)
{
    if (len == 0)
        return 0;
    struct node_client_ref ref = {.filter = im->name, .shard = im->pending,
                                  .topology_version = im->t->version};
    for (size_t off = 0; off < len; off += RULES_CHUNK_DEFAULT) {
        size_t n = len - off < RULES_CHUNK_DEFAULT ? len - off : RULES_CHUNK_DEFAULT;
        for (unsigned i = 0; i < im->ncs; i++)
            if (node_client_import_write(im->cs[i], &ref, p + off, n) < 0)
                return member_failed(im, i, NULL);
    }
    return 0;
}

/* The next len bytes of the pending shard's file, at im->fpos: sent on,
 * but for its last TAIL_BYTES, which are kept for shard_merge. */
static int shard_take(struct import_run *im, const uint8_t *p, size_t len)
{
    uint64_t keep_from = im->flen - TAIL_BYTES;
    size_t now = im->fpos >= keep_from ? 0 : (size_t)(keep_from - im->fpos) < len
                 ? (size_t)(keep_from - im->fpos) : len;
    if (shard_send(im, p, now) < 0)
        return -1;
    memcpy(im->tail + (im->fpos + now - keep_from), p + now, len - now);
    im->fpos += len;
    return 0;
}

/* Have the pending shard merged: send the end of its file, half-close
 * every member's stream (they merge at once, side by side), then take
 * each one's answer. */
static int shard_merge(struct import_run *im)
{
    double fill = 0, fpr = 0;
    if (shard_send(im, im->tail, TAIL_BYTES) < 0)
        return -1;
    for (unsigned i = 0; i < im->ncs; i++)
        if (rpc_cstream_close_send(im->cs[i]) < 0)
            return member_failed(im, i, NULL);
    while (im->ncs > 0) {
        Bloomgrid__V1__ImportResponse *resp = NULL;
        grpc_slice sl;
        if (rpc_cstream_read(im->cs[0], &sl) == 1) {
            resp = bloomgrid__v1__import_response__unpack(NULL, GRPC_SLICE_LENGTH(sl),
                                                          GRPC_SLICE_START_PTR(sl));
            grpc_slice_unref(sl);
        }
        if (!resp)
            return member_failed(im, 0, NULL);
        fill = resp->projected_fill_ratio;
        fpr = resp->projected_error_rate;
        bloomgrid__v1__import_response__free_unpacked(resp, NULL);
        struct rpc_status rs;
        if (rpc_cstream_finish(im->cs[0], &rs) < 0)
            return member_failed(im, 0, &rs);
        drop_member(im, 0);
    }
    im->open = false;
    uint64_t bits = im->d.shard[im->pending].bits;
    im->fill_bits += fill * (double)bits;
    im->bits += (double)bits;
    im->fpr_sum += fpr;
    im->merged = im->pending + 1;
    return 0;
}

/* The bundle's header is in im->part. */
static int head_check(struct import_run *im)
{
    uint32_t version = (uint32_t)get_le(im->part + 8, 4);
    uint32_t count = (uint32_t)get_le(im->part + 12, 4);
    if (version != BUNDLE_VERSION)
        return refuse(im, GRPC_STATUS_INVALID_ARGUMENT, "imported file refused: "
                      "unsupported version: bundle version %u (this build reads "
                      "version %d)", version, BUNDLE_VERSION);
    if (count == 0)
        return refuse(im, GRPC_STATUS_INVALID_ARGUMENT, "imported file refused: bad "
                      "bundle: 0 shards");
    if (count != im->f->shards)
        return refuse(im, GRPC_STATUS_FAILED_PRECONDITION, "imported filter is "
                      "incompatible with \"%s\": field \"shard_count\" differs (%u "
                      "shards, not %u)", im->name, count, im->f->shards);
    im->state = IM_ENTRY;
    im->shard = 0;
    return 0;
}

/* An entry's header is in im->part. */
static int entry_check(struct import_run *im)
{
    uint64_t index = get_le(im->part, 4), len = get_le(im->part + 4, 8);
    uint32_t s = im->shard;
    if (index != s)
        return refuse(im, GRPC_STATUS_INVALID_ARGUMENT, "imported file refused: bad "
                      "bundle: entry %u is for shard %llu (entries go in shard order)",
                      s, (unsigned long long)index);
    if (len < BF_FILE_HEADER_BYTES)
        return refuse(im, GRPC_STATUS_INVALID_ARGUMENT, "imported file refused: shard "
                      "%u: truncated: %llu bytes", s, (unsigned long long)len);
    if (len > shard_limit(im, s))
        return refuse(im, GRPC_STATUS_RESOURCE_EXHAUSTED, "import refused: shard %u's "
                      "file is %llu bytes, larger than any file of shard %u of filter "
                      "\"%s\" (%llu bytes)", s, (unsigned long long)len, s, im->name,
                      (unsigned long long)shard_limit(im, s));
    im->flen = len;
    im->fpos = 0;
    im->state = IM_FHEAD;
    return 0;
}

/* The header of an entry's file is in im->part: the fields that make it
 * this shard of this filter (bundle_shard_mismatch: the node checks the
 * whole file again).  Then the shard before it may be merged, and this
 * one's streams opened. */
static int file_head_check(struct import_run *im)
{
    const uint8_t *h = im->part;
    uint32_t s = im->shard;
    const char *field = NULL;
    if (memcmp(h, BF_FILE_MAGIC, 8) != 0)
        return refuse(im, GRPC_STATUS_INVALID_ARGUMENT, "imported file refused: shard "
                      "%u: bad magic: not a filter file", s);
    if (memcmp(h + 24, im->f->secret, BF_SECRET_LEN) != 0)
        field = "secret";
    else if (get_le(h + 84, 4) != s)
        field = "shard_index";
    else if (get_le(h + 88, 4) != im->f->shards)
        field = "shard_count";
    if (field)
        return refuse(im, GRPC_STATUS_FAILED_PRECONDITION, "imported filter is "
                      "incompatible with \"%s\": field \"%s\" differs (shard %u)",
                      im->name, field, s);
    if (im->open && shard_merge(im) < 0)
        return -1;
    if (shard_open(im, s) < 0 || shard_take(im, h, BF_FILE_HEADER_BYTES) < 0)
        return -1;
    im->state = IM_DATA;
    return 0;
}

/* Gather a header of want bytes from the input; true once it is whole. */
static bool gather(struct import_run *im, size_t want, const uint8_t **p, size_t *len)
{
    size_t n = want - im->npart < *len ? want - im->npart : *len;
    memcpy(im->part + im->npart, *p, n);
    im->npart += n;
    *p += n;
    *len -= n;
    if (im->npart < want)
        return false;
    im->npart = 0;
    return true;
}

/* Take len more bytes of the bundle. */
static int feed(struct import_run *im, const uint8_t *p, size_t len)
{
    while (len > 0) {
        const uint8_t *start = p;
        int rc = 0;
        switch (im->state) {
        case IM_HEAD: {
            /* The magic is checked as it comes: a plain filter file is
             * named as such at its first bytes. */
            size_t had = im->npart;
            bool whole = gather(im, BUNDLE_HEAD_BYTES, &p, &len);
            size_t m = im->npart ? im->npart : BUNDLE_HEAD_BYTES;
            if (had < 8 && memcmp(im->part, BUNDLE_MAGIC, m < 8 ? m : 8) != 0)
                return refuse(im, GRPC_STATUS_INVALID_ARGUMENT, "imported file "
                              "refused: bad magic: not a shard bundle (a router "
                              "exports one file holding every shard; see "
                              "docs/ROUTER.md)");
            if (whole)
                rc = head_check(im);
            break;
        }
        case IM_ENTRY:
            if (gather(im, BUNDLE_ENTRY_BYTES, &p, &len))
                rc = entry_check(im);
            break;
        case IM_FHEAD:
            if (gather(im, BF_FILE_HEADER_BYTES, &p, &len))
                rc = file_head_check(im);
            break;
        case IM_DATA: {
            size_t n = im->flen - im->fpos < len ? (size_t)(im->flen - im->fpos) : len;
            rc = shard_take(im, p, n);
            p += n;
            len -= n;
            break;
        }
        case IM_TRAILER:
            im->received += len;
            if (gather(im, BUNDLE_TRAILER_BYTES, &p, &len)) {
                im->received -= len;
                if (get_le(im->part, 8) != XXH3_64bits_digest(im->xx)) {
                    shard_cancel(im);
                    return refuse(im, GRPC_STATUS_INVALID_ARGUMENT, "imported file "
                                  "refused: checksum mismatch: the bundle is damaged "
                                  "or truncated");
                }
                im->state = IM_DONE;
            }
            continue;      /* the trailer is not part of its own checksum */
        case IM_DONE:
            shard_cancel(im);
            return refuse(im, GRPC_STATUS_INVALID_ARGUMENT, "imported file refused: "
                          "bad bundle: bytes after the last shard");
        }
        if (rc < 0)
            return -1;
        if (im->state == IM_DATA && im->fpos == im->flen)
            im->state = ++im->shard < im->f->shards ? IM_ENTRY : IM_TRAILER;
        XXH3_64bits_update(im->xx, start, (size_t)(p - start));
        im->received += (uint64_t)(p - start);
    }
    return 0;
}

/* The first message names the filter: look it up, with its shards' sizes. */
static int import_begin(struct import_run *im, const char *filter)
{
    struct rpc_reply rep = {.st.code = GRPC_STATUS_OK};
    if (!filter[0]) {
        rpc_status_set(&im->st, GRPC_STATUS_INVALID_ARGUMENT,
                       "the first ImportRequest must name the filter");
        return -1;
    }
    if (!router_rpc__name_ok(filter, &rep)) {
        rpc_status_set(&im->st, rep.st.code, "%s", rep.st.message);
        return -1;
    }
    snprintf(im->name, sizeof im->name, "%s", filter);
    /* The nodes check each shard file against the filter as it is now. */
    router_filter_forget(im->r, im->name);
    im->f = router_filter_lookup(im->r, im->t, im->name, &im->st);
    if (!im->f)
        return -1;
    if (router_describe_filter(im->r, im->name, &im->d, &im->st) < 0)
        return -1;
    if (im->d.shards != im->f->shards) {
        rpc_status_set(&im->st, GRPC_STATUS_UNAVAILABLE, "filter \"%s\" changed while "
                       "the import began; retry", im->name);
        return -1;
    }
    return 0;
}

/* The bundle is whole: merge its last shard, then answer with the filter
 * as it is now. */
static void import_end(struct import_run *im, struct rpc_stream *s)
{
    if (im->state != IM_DONE) {
        shard_cancel(im);
        refuse(im, GRPC_STATUS_INVALID_ARGUMENT, "imported file refused: truncated: "
               "the bundle ended after %llu bytes, in %s", (unsigned long long)im->received,
               im->state == IM_HEAD ? "its header" : im->state == IM_TRAILER
               ? "its trailer" : "the entry of a shard");
        rpc_stream_finish_status(s, &im->st);
        return;
    }
    if (im->open && shard_merge(im) < 0) {
        rpc_stream_finish_status(s, &im->st);
        return;
    }
    log_info("imported %llu bytes into filter %s (%u shards, streamed shard by shard)",
             (unsigned long long)im->received, im->name, im->f->shards);
    router_filter_desc_free(&im->d);
    if (router_describe_filter(im->r, im->name, &im->d, &im->st) < 0) {
        rpc_stream_finish_status(s, &im->st);
        return;
    }
    Bloomgrid__V1__ImportResponse resp = BLOOMGRID__V1__IMPORT_RESPONSE__INIT;
    resp.bytes_received = im->received;
    resp.projected_fill_ratio = im->bits > 0 ? im->fill_bits / im->bits : 0;
    resp.projected_error_rate = im->fpr_sum / im->f->shards;
    resp.over_target = im->d.shards && resp.projected_error_rate > im->d.shard[0].error_rate;
    if (router_rpc__write_info(s, &resp, &im->d) < 0)
        return;
    rpc_stream_finish(s, GRPC_STATUS_OK, "%s", "");
}

void router_rpc__import(void *arg, struct rpc_stream *s)
{
    struct import_run im = {.r = arg, .st.code = GRPC_STATUS_OK};
    const uint8_t *in;
    size_t len;

    im.t = router_topo(im.r);
    im.xx = XXH3_createState();
    if (!im.xx) {
        rpc_stream_finish(s, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    XXH3_64bits_reset(im.xx);
    for (;;) {
        int rc = rpc_stream_read(s, &in, &len);
        if (rc < 0)
            goto gone;       /* the client went (or idled) away */
        if (rc == 0)
            break;
        Bloomgrid__V1__ImportRequest *m = bloomgrid__v1__import_request__unpack(NULL, len, in);
        if (!m) {
            rpc_status_set(&im.st, GRPC_STATUS_INVALID_ARGUMENT,
                           "malformed ImportRequest message");
            goto fail;
        }
        int frc = 0;
        if (!im.f)
            frc = import_begin(&im, m->filter);
        else if (m->filter[0] && strcmp(m->filter, im.name) != 0)
            frc = refuse(&im, GRPC_STATUS_INVALID_ARGUMENT, "ImportRequest names filter "
                         "\"%s\" after \"%s\"", m->filter, im.name);
        if (frc == 0)
            frc = feed(&im, m->data.data, m->data.len);
        bloomgrid__v1__import_request__free_unpacked(m, NULL);
        if (frc < 0)
            goto fail;
    }
    if (!im.f) {
        rpc_status_set(&im.st, GRPC_STATUS_INVALID_ARGUMENT,
                       "Import received no message naming a filter");
        goto fail;
    }
    import_end(&im, s);
    goto out;
fail:
    rpc_stream_finish_status(s, &im.st);
gone:
    shard_cancel(&im);
out:
    XXH3_freeState(im.xx);
    router_filter_desc_free(&im.d);
    router_filter_unref(im.f);
    topo_unref(im.t);
}
