/* router_link_msg: building the next message of a lane from its queue, and
 * handing the answer back to the calls it carried (see router_link_int.h).
 *
 * A message is built from the queue front (whole calls, up to
 * max_message_hashes hashes): entries with the same filter, secret,
 * operation and shard get one wire entry, each call entry remembering its
 * wire entry and its offset in it (struct link_slot); the answer's
 * ShardResult of that wire entry gives the call entry its slice of
 * results, or its error.  The wire entries are packed into a BatchRequest,
 * and the hashes laid out, by node_client (node_client.h).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

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
            !grow(&b->wire_hash, cap, sizeof *b->wire_hash))
            return -ENOMEM;
        b->wcap = cap;
    }
    if (table > b->tcap) {
        if (!grow(&b->table, table, sizeof *b->table))
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
                2 * nent * sizeof(uint32_t);
    struct link_msg *m = calloc(1, sz);
    if (!m)
        return NULL;
    m->calls = (struct router_link_call **)(m + 1);
    m->first = (size_t *)(m->calls + ncalls);
    m->slots = (struct link_slot *)(m->first + ncalls);
    m->wire_n = (uint32_t *)(m->slots + nent);
    m->wire_shard = m->wire_n + nent;
    m->ncalls = ncalls;
    m->id = ++ln->next_id;

    /* Merge entries into wire entries. */
    memset(b->table, 0xff, tsize * sizeof *b->table);
    size_t nwire = 0, slot = 0;
    struct router_link_call *c = ln->qhead;
    for (size_t i = 0; i < ncalls; i++, c = c->qnext) {
        uint64_t fh = XXH3_64bits(c->filter, strlen(c->filter)) ^
                      (c->secret_id * 0x9E3779B97F4A7C15ull) ^ (uint64_t)c->op;
        m->calls[i] = c;
        m->first[i] = slot;
        for (size_t j = 0; j < c->n; j++, slot++) {
            const struct router_link_entry *e = &c->e[j];
            uint64_t h = XXH3_64bits_withSeed(&e->shard, sizeof e->shard, fh);
            size_t t = (size_t)h & (tsize - 1);
            int32_t w;
            while ((w = b->table[t]) >= 0 &&
                   !(b->wire_hash[w] == h && b->wire_shard[w] == e->shard &&
                     same_key(b->wire_call[w], c)))
                t = (t + 1) & (tsize - 1);
            if (w < 0) {
                w = (int32_t)nwire++;
                b->table[t] = w;
                b->wire_hash[w] = h;
                b->wire_shard[w] = e->shard;
                b->wire_call[w] = c;
                b->wire_n[w] = 0;
            }
            m->slots[slot].wire = (uint32_t)w;
            m->slots[slot].off = b->wire_n[w];
            b->wire_n[w] += e->n;
        }
    }
    m->nwire = nwire;
    for (size_t w = 0, start = 0; w < nwire; w++) {
        b->wire_start[w] = (uint32_t)start;
        start += b->wire_n[w];
        m->wire_n[w] = b->wire_n[w];
        m->wire_shard[w] = b->wire_shard[w];
    }
    /* Hashes into place, each wire entry's contiguous. */
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
            .n = b->wire_n[w]};
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


void router_link__msg_deliver(struct router_link *l, struct link_msg *m,
                              const Bloomgrid__V1__BatchResponse *resp)
{
    for (size_t i = 0; i < m->ncalls; i++) {
        struct router_link_call *c = m->calls[i];
        if (!c)
            continue;
        for (size_t j = 0; j < c->n; j++) {
            struct router_link_entry *e = &c->e[j];
            const struct link_slot *sl = &m->slots[m->first[i] + j];
            const Bloomgrid__V1__ShardResult *r =
                sl->wire < resp->n_results ? resp->results[sl->wire] : NULL;
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
                e->st.code = (grpc_status_code)r->code;
                if ((int)r->reason > 0 && (int)r->reason <= RPC_REASON_NOT_COUNTING)
                    e->st.reason = (enum rpc_reason)r->reason;
                snprintf(e->st.message, sizeof e->st.message, "%s",
                         r->message && r->message[0] ? r->message
                                                     : rpc_status_name(e->st.code));
                continue;
            }
            e->st.code = GRPC_STATUS_OK;
            e->version = r->version;
            for (uint32_t k = 0; k < e->n; k++)
                e->out[k] = r->results[sl->off + k] != 0;
        }
        router_link__call_done(l, c);
    }
}
