/* router_link_msg: building the next message of a lane from its queue, and
 * handing the answer back to the calls it carried (see router_link_int.h).
 *
 * A message is built from the queue front (whole calls, up to
 * max_message_hashes hashes): entries with the same filter, secret and
 * operation get one wire entry, and within it the entries of one shard
 * one run (BatchEntry.run_shards), each call entry remembering its wire
 * entry, its offset in it and its run (struct link_slot); the answer's
 * ShardResult of that wire entry gives the call entry its slice of
 * results, or its run's error, or the entry's.  A wire entry of one run
 * goes as an entry of its shard, and so does every entry to a node that
 * refused runs as a node of an earlier release does (no_runs).  The wire
 * entries are packed into a BatchRequest, and the hashes laid out, by
 * node_client (node_client.h).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "log.h"
#include "router_link_int.h"

/* Grow *pp to n elements of size bytes; false when out of memory (*pp is
 * then unchanged). */
static bool grow(void *pp, size_t n, size_t size)
{
    void **p = pp;
    void *q = realloc(*p, n * size);
    if (!q)
        return false;
    *p = q;
    return true;
}

static int build_reserve(struct link_build *b, size_t wires, size_t table, size_t hbytes)
{
    if (wires > b->wcap) {
        size_t cap = b->wcap ? b->wcap : 64;
        while (cap < wires)
            cap *= 2;
        if (!grow(&b->ent, cap, sizeof *b->ent) ||
            !grow(&b->wire_call, cap, sizeof *b->wire_call) ||
            !grow(&b->wire_start, cap, sizeof *b->wire_start) ||
            !grow(&b->wire_n, cap, sizeof *b->wire_n) ||
            !grow(&b->wire_shard, cap, sizeof *b->wire_shard) ||
            !grow(&b->wire_runs, cap, sizeof *b->wire_runs) ||
            !grow(&b->wire_rstart, cap, sizeof *b->wire_rstart) ||
            !grow(&b->wire_multi, cap, sizeof *b->wire_multi) ||
            !grow(&b->run_shard, cap, sizeof *b->run_shard) ||
            !grow(&b->run_count, cap, sizeof *b->run_count) ||
            !grow(&b->wire_fill, cap, sizeof *b->wire_fill) ||
            !grow(&b->r_wire, cap, sizeof *b->r_wire) ||
            !grow(&b->r_shard, cap, sizeof *b->r_shard) ||
            !grow(&b->r_count, cap, sizeof *b->r_count) ||
            !grow(&b->r_local, cap, sizeof *b->r_local) ||
            !grow(&b->r_off, cap, sizeof *b->r_off) ||
            !grow(&b->wire_hash, cap, sizeof *b->wire_hash))
            return -ENOMEM;
        b->wcap = cap;
    }
    if (table > b->tcap) {
        if (!grow(&b->table, table, sizeof *b->table) ||
            !grow(&b->rtable, table, sizeof *b->rtable))
            return -ENOMEM;
        b->tcap = table;
    }
    if (hbytes > b->hcap) {
        size_t cap = b->hcap ? b->hcap : 4096;
        while (cap < hbytes)
            cap *= 2;
        if (!grow(&b->hb, cap, 1))
            return -ENOMEM;
        b->hcap = cap;
    }
    return 0;
}

void router_link__build_free(struct link_build *b)
{
    free(b->ent);
    node_client_batch_scratch_free(&b->pack);
    free(b->wire_call);
    free(b->wire_start);
    free(b->wire_n);
    free(b->wire_shard);
    free(b->wire_runs);
    free(b->wire_rstart);
    free(b->wire_multi);
    free(b->run_shard);
    free(b->run_count);
    free(b->wire_fill);
    free(b->r_wire);
    free(b->r_shard);
    free(b->r_count);
    free(b->r_local);
    free(b->r_off);
    free(b->rtable);
    free(b->wire_hash);
    free(b->table);
    free(b->hb);
    memset(b, 0, sizeof *b);
}

static bool same_key(const struct router_link_call *a, const struct router_link_call *c)
{
    return a == c || (a->op == c->op && a->secret_id == c->secret_id &&
                      strcmp(a->filter, c->filter) == 0);
}

static enum node_client_op client_op(enum router_link_op op)
{
    switch (op) {
    case ROUTER_LINK_MAY_CONTAIN:
        return NODE_CLIENT_MAY_CONTAIN;
    case ROUTER_LINK_REMOVE:
        return NODE_CLIENT_REMOVE;
    default:
        return NODE_CLIENT_ADD;
    }
}

size_t router_link__call_hashes(const struct router_link_call *c)
{
    size_t n = 0;
    for (size_t j = 0; j < c->n; j++)
        n += c->e[j].n;
    return n;
}

struct link_msg *router_link__msg_build(struct link_lane *ln, grpc_byte_buffer **out)
{
    struct router_link *l = ln->l;
    struct link_build *b = &l->b;
    size_t ncalls = 0, nent = 0, nhash = 0, bytes = 0;
    size_t max_bytes = l->cfg.max_message > 4096 ? l->cfg.max_message - 1024 : 4096;

    for (struct router_link_call *c = ln->qhead; c; c = c->qnext) {
        size_t h = router_link__call_hashes(c);
        if (ncalls && (nhash + h > l->cfg.max_message_hashes || bytes + c->bytes > max_bytes ||
                       c->topology_version != ln->qhead->topology_version))
            break;
        ncalls++;
        nent += c->n;
        nhash += h;
        bytes += c->bytes + strlen(c->filter);
    }
    size_t tsize = 16;
    while (tsize < 2 * nent)
        tsize *= 2;
    if (build_reserve(b, nent, tsize, NODE_CLIENT_HASH_LEN * nhash) < 0)
        return NULL;

    /* One block: the message and its arrays, pointers first. */
    size_t sz = sizeof(struct link_msg) + ncalls * sizeof(struct router_link_call *) +
                ncalls * sizeof(size_t) + nent * sizeof(struct link_slot) +
                3 * nent * sizeof(uint32_t);
    struct link_msg *m = calloc(1, sz);
    if (!m)
        return NULL;
    m->calls = (struct router_link_call **)(m + 1);
    m->first = (size_t *)(m->calls + ncalls);
    m->slots = (struct link_slot *)(m->first + ncalls);
    m->wire_n = (uint32_t *)(m->slots + nent);
    m->wire_shard = m->wire_n + nent;
    m->wire_runs = m->wire_shard + nent;
    m->ncalls = ncalls;
    m->id = ++ln->next_id;

    /* Merge entries into wire entries, and within each, entries of one
     * shard into one run. */
    memset(b->table, 0xff, tsize * sizeof *b->table);
    memset(b->rtable, 0xff, tsize * sizeof *b->rtable);
    size_t nwire = 0, nrun = 0, slot = 0;
    struct router_link_call *c = ln->qhead;
    for (size_t i = 0; i < ncalls; i++, c = c->qnext) {
        uint64_t fh = XXH3_64bits(c->filter, strlen(c->filter)) ^
                      (c->secret_id * 0x9E3779B97F4A7C15ull) ^ (uint64_t)c->op;
        m->calls[i] = c;
        m->first[i] = slot;
        for (size_t j = 0; j < c->n; j++, slot++) {
            const struct router_link_entry *e = &c->e[j];
            /* Keyed by filter, secret and operation: the shards of one
             * filter share a wire entry.  By shard as well for a node that
             * takes no runs, and for an entry of no hashes (a run holds at
             * least one). */
            bool multi = !l->no_runs && e->n > 0;
            uint64_t h = multi ? fh : XXH3_64bits_withSeed(&e->shard, sizeof e->shard, fh) | 1;
            size_t t = (size_t)h & (tsize - 1);
            int32_t w;
            while ((w = b->table[t]) >= 0 &&
                   !(b->wire_hash[w] == h && b->wire_multi[w] == multi &&
                     (multi || b->wire_shard[w] == e->shard) &&
                     same_key(b->wire_call[w], c)))
                t = (t + 1) & (tsize - 1);
            if (w < 0) {
                w = (int32_t)nwire++;
                b->table[t] = w;
                b->wire_hash[w] = h;
                b->wire_multi[w] = multi;
                b->wire_shard[w] = e->shard;
                b->wire_call[w] = c;
                b->wire_n[w] = 0;
                b->wire_runs[w] = 0;
            }
            /* The run of e's shard in w, opened by the first entry of it. */
            uint64_t rh = XXH3_64bits_withSeed(&e->shard, sizeof e->shard,
                                               (uint64_t)w * 0x9E3779B97F4A7C15ull + 1);
            size_t rt = (size_t)rh & (tsize - 1);
            int32_t r;
            while ((r = b->rtable[rt]) >= 0 &&
                   !(b->r_wire[r] == (uint32_t)w && b->r_shard[r] == e->shard))
                rt = (rt + 1) & (tsize - 1);
            if (r < 0) {
                r = (int32_t)nrun++;
                b->rtable[rt] = r;
                b->r_wire[r] = (uint32_t)w;
                b->r_shard[r] = e->shard;
                b->r_count[r] = 0;
                b->r_local[r] = b->wire_runs[w]++;
            }
            /* For now: the run's global index, the offset in the run. */
            m->slots[slot].wire = (uint32_t)w;
            m->slots[slot].run = (uint32_t)r;
            m->slots[slot].off = b->r_count[r];
            b->r_count[r] += e->n;
            b->wire_n[w] += e->n;
        }
    }
    m->nwire = nwire;
    for (size_t w = 0, start = 0, runs = 0; w < nwire; w++) {
        b->wire_start[w] = (uint32_t)start;
        b->wire_rstart[w] = (uint32_t)runs;
        b->wire_fill[w] = 0;
        start += b->wire_n[w];
        runs += b->wire_runs[w];
        m->wire_n[w] = b->wire_n[w];
        m->wire_shard[w] = b->wire_shard[w];
        m->wire_runs[w] = b->wire_runs[w];
    }
    /* Each run's place in its wire entry, in the order the runs opened. */
    for (size_t r = 0; r < nrun; r++) {
        uint32_t w = b->r_wire[r];
        size_t at = (size_t)b->wire_rstart[w] + b->r_local[r];
        b->r_off[r] = b->wire_fill[w];
        b->wire_fill[w] += b->r_count[r];
        b->run_shard[at] = b->r_shard[r];
        b->run_count[at] = b->r_count[r];
    }
    for (size_t k = 0; k < slot; k++) {
        struct link_slot *sl = &m->slots[k];
        sl->off += b->r_off[sl->run];
        sl->run = b->r_local[sl->run];
    }
    /* Hashes into place, each wire entry's contiguous, its runs in order. */
    for (size_t i = 0; i < ncalls; i++) {
        c = m->calls[i];
        for (size_t j = 0; j < c->n; j++) {
            const struct link_slot *sl = &m->slots[m->first[i] + j];
            node_client_hashes_put(b->hb + NODE_CLIENT_HASH_LEN *
                                   ((size_t)b->wire_start[sl->wire] + sl->off),
                                   c->e[j].h, c->e[j].n);
        }
    }
    for (size_t w = 0; w < nwire; w++) {
        const struct router_link_call *wc = b->wire_call[w];
        b->ent[w] = (struct node_client_batch_entry){
            .filter = wc->filter, .shard = b->wire_shard[w], .op = client_op(wc->op),
            .secret_id = wc->secret_id,
            .hashes = b->hb + NODE_CLIENT_HASH_LEN * (size_t)b->wire_start[w],
            .n = b->wire_n[w],
            .run_shards = b->run_shard + b->wire_rstart[w],
            .run_counts = b->run_count + b->wire_rstart[w],
            .nruns = b->wire_runs[w] > 1 ? b->wire_runs[w] : 0};
    }
    *out = node_client_batch_pack(&b->pack, m->id, ln->qhead->topology_version, b->ent,
                                  nwire);
    if (!*out) {
        free(m);
        return NULL;
    }

    /* The calls leave the queue. */
    for (size_t i = 0; i < ncalls; i++) {
        c = m->calls[i];
        ln->qhead = c->qnext;
        c->qnext = NULL;
        l->qbytes -= c->bytes;
        c->state = CALL_SENT;
        c->msg = m;
        c->slot = i;
    }
    if (!ln->qhead)
        ln->qtail = NULL;
    return m;
}


/* e's error: code, reason and message (the code's name when empty). */
static void entry_error(struct router_link_entry *e, int32_t code,
                        Bloomgrid__V1__ErrorReason reason, const char *msg)
{
    e->st.code = (grpc_status_code)code;
    if ((int)reason > 0 && (int)reason <= RPC_REASON_NOT_COUNTING)
        e->st.reason = (enum rpc_reason)reason;
    snprintf(e->st.message, sizeof e->st.message, "%s",
             msg && msg[0] ? msg : rpc_status_name(e->st.code));
}

/* The refusal of run `run` in r's run_errors, or NULL. */
static const Bloomgrid__V1__RunError *run_error(const Bloomgrid__V1__ShardResult *r,
                                                uint32_t run)
{
    for (size_t k = 0; k < r->n_run_errors; k++)
        if (r->run_errors[k] && r->run_errors[k]->run == run)
            return r->run_errors[k];
    return NULL;
}

/* A node of an earlier release reads an entry of runs as one of its first
 * shard, and refuses the others' hashes before it applies any: r says so
 * for an entry of runs. */
static bool runs_refused(const Bloomgrid__V1__ShardResult *r)
{
    return r && r->code != 0 &&
           r->reason == BLOOMGRID__V1__ERROR_REASON__ERROR_REASON_WRONG_SHARD;
}

void router_link__msg_deliver(struct router_link *l, struct link_msg *m,
                              const Bloomgrid__V1__BatchResponse *resp)
{
    struct router_link_call *again = NULL, **tail = &again, *last = NULL;
    size_t again_bytes = 0;
    for (size_t i = 0; i < m->ncalls; i++) {
        struct router_link_call *c = m->calls[i];
        if (!c)
            continue;
        /* Refused as runs by a node of an earlier release: nothing of it
         * was applied; it goes again, one entry per shard. */
        bool resend = false;
        for (size_t j = 0; j < c->n && !resend; j++) {
            uint32_t w = m->slots[m->first[i] + j].wire;
            resend = m->wire_runs[w] > 1 && w < resp->n_results &&
                     runs_refused(resp->results[w]);
        }
        if (resend) {
            if (!l->no_runs)
                log_warn("node %s takes no entries of many shards (a node of an "
                         "earlier release): one entry per shard from now on", l->addr);
            l->no_runs = true;
            c->state = CALL_QUEUED;
            c->msg = NULL;
            c->qnext = NULL;
            *tail = last = c;
            tail = &c->qnext;
            again_bytes += c->bytes;
            continue;
        }
        for (size_t j = 0; j < c->n; j++) {
            struct router_link_entry *e = &c->e[j];
            const struct link_slot *sl = &m->slots[m->first[i] + j];
            const Bloomgrid__V1__ShardResult *r =
                sl->wire < resp->n_results ? resp->results[sl->wire] : NULL;
            bool runs = m->wire_runs[sl->wire] > 1;
            e->version = 0;
            e->st.reason = RPC_REASON_NONE;
            e->st.message[0] = 0;
            if (!r || r->shard_index != m->wire_shard[sl->wire] ||
                (r->code == 0 && r->n_results != m->wire_n[sl->wire])) {
                e->st.code = GRPC_STATUS_INTERNAL;
                snprintf(e->st.message, sizeof e->st.message,
                         "node %s: answer does not parse or has the wrong number "
                         "of results", l->addr);
                continue;
            }
            if (r->code != 0) {
                entry_error(e, r->code, r->reason, r->message);
                continue;
            }
            const Bloomgrid__V1__RunError *re = runs ? run_error(r, sl->run) : NULL;
            if (re) {
                entry_error(e, re->code ? re->code : GRPC_STATUS_UNKNOWN, re->reason,
                            re->message);
                continue;
            }
            e->st.code = GRPC_STATUS_OK;
            e->version = r->version;
            for (uint32_t k = 0; k < e->n; k++)
                e->out[k] = r->results[sl->off + k] != 0;
        }
        router_link__call_done(l, c);
    }
    if (again) {
        /* At the queue's front, in their order: the lane's next kick. */
        struct link_lane *ln = m->s->lane;
        *tail = ln->qhead;
        ln->qhead = again;
        if (!ln->qtail)
            ln->qtail = last;
        l->qbytes += again_bytes;
    }
}
