/* router_rpc_nodes: the router's side of the internal service (see
 * router_nodes.h).  With router_rpc.c and router_link.c, the only place of
 * the router that converts wire messages.
 *
 * Key batches: the keys are hashed once, sorted by shard into one array
 * (each shard's hashes contiguous, in request order), and the shards that
 * have keys are grouped by the primary of their group into one call per
 * node, which the node's link (router_link.h) sends on its batch streams,
 * coalesced with the concurrent calls of other clients.  Answers come back
 * per shard and are put back in request order; each shard succeeds or fails
 * on its own.  The catalog calls are in router_rpc_catalog.c.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bloomgrid/v1/bloomgrid.pb-c.h"
#include "bloomgrid/v1/internal.pb-c.h"
#include "log.h"
#include "router_link.h"
#include "router_nodes.h"
#include "router_pool.h"
#include "router_rpc.h"
#include "rpc_client.h"

#define M_GET "/bloomgrid.v1.Internal/GetShard"

static const char *const op_names[] = {"Add", "MayContain", "Remove"};

bool router_node_down(grpc_status_code c)
{
    return c == GRPC_STATUS_UNAVAILABLE || c == GRPC_STATUS_DEADLINE_EXCEEDED ||
           c == GRPC_STATUS_CANCELLED || c == GRPC_STATUS_UNKNOWN ||
           c == GRPC_STATUS_INTERNAL;
}

grpc_slice router_rpc__pack_slice(const ProtobufCMessage *m)
{
    size_t len = protobuf_c_message_get_packed_size(m);
    grpc_slice s = grpc_slice_malloc(len);
    protobuf_c_message_pack(m, GRPC_SLICE_START_PTR(s));
    return s;
}

void router_rpc__multi_free(struct rpc_multi *calls, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        grpc_slice_unref(calls[i].req);
        grpc_slice_unref(calls[i].resp);
    }
    free(calls);
}

const char *router_rpc__primary(const struct topo *t, const struct router_filter *f,
                                uint32_t shard)
{
    return t->groups[f->group[shard]].primary;
}

/* ---- filters: secret and shard count ---- */

/* Ask one node for shard 0 of name with its secret. */
static int fetch_secret(struct router *r, const char *addr, const char *name,
                        uint8_t *secret, uint32_t *shards, struct rpc_status *rs)
{
    Bloomgrid__V1__GetShardRequest req = BLOOMGRID__V1__GET_SHARD_REQUEST__INIT;
    ProtobufCMessage *resp = NULL;
    struct rpc_channel *ch = router_channel(r, addr);
    if (!ch) {
        rs->code = GRPC_STATUS_RESOURCE_EXHAUSTED;
        snprintf(rs->message, sizeof rs->message, "out of memory");
        return -1;
    }
    req.filter = (char *)name;
    req.shard_index = 0;
    req.include_secret = true;
    if (rpc_call(ch, M_GET, &req.base, &bloomgrid__v1__internal_shard_info__descriptor,
                 &resp, (int)r->cfg.node_timeout_ms, rs) < 0)
        return -1;
    Bloomgrid__V1__InternalShardInfo *isi = (Bloomgrid__V1__InternalShardInfo *)resp;
    int rc = 0;
    if (isi->secret.len != BF_SECRET_LEN || isi->shard_count < 1 ||
        isi->shard_count > ROUTER_MAX_SHARDS ||
        (isi->hash_id && isi->hash_id != BF_HASH_XXH3_128)) {
        rs->code = GRPC_STATUS_UNAVAILABLE;
        snprintf(rs->message, sizeof rs->message,
                 "node %s describes shard 0 of filter \"%s\" without a usable "
                 "secret (%zu bytes, %u shards, hash %u); it is not ready", addr,
                 name, isi->secret.len, isi->shard_count, isi->hash_id);
        rc = -1;
    } else {
        memcpy(secret, isi->secret.data, BF_SECRET_LEN);
        *shards = isi->shard_count;
    }
    protobuf_c_message_free_unpacked(resp, NULL);
    return rc;
}

/* The filter as this router knows it, fetching its secret from shard 0's
 * group (primary, then replicas) when it is not cached or is stale.  A stale
 * entry still serves when no node of that group answers. */
struct router_filter *router_filter_lookup(struct router *r, const struct topo *t,
                                          const char *name, struct rpc_status *st)
{
    struct router_filter *stale = NULL;
    struct router_filter *f = router_filter_get(r, name, t, &stale);
    if (f)
        return f;
    const struct topo_group *g = &t->groups[topo_group_for(t, name, 0)];
    struct rpc_status rs = {0};
    uint8_t secret[BF_SECRET_LEN];
    uint32_t shards = 0;
    int rc = fetch_secret(r, g->primary, name, secret, &shards, &rs);
    const char *addr = g->primary;
    for (unsigned i = 0; rc < 0 && router_node_down(rs.code) && i < g->nreplicas; i++) {
        addr = g->replicas[i];
        rc = fetch_secret(r, addr, name, secret, &shards, &rs);
    }
    if (rc < 0) {
        if (rs.code == GRPC_STATUS_NOT_FOUND) {
            router_filter_forget(r, name);
            router_filter_unref(stale);
            rpc_status_set(st, GRPC_STATUS_NOT_FOUND, "filter \"%s\" does not exist",
                       name);
            return NULL;
        }
        if (stale && router_node_down(rs.code)) {
            log_warn("cannot re-check filter %s on %s (%s); using the cached secret",
                     name, addr, rs.message);
            f = router_filter_add(r, name, stale->secret, stale->shards,
                                  (struct topo *)t, stale);
            router_filter_unref(stale);
            if (!f)
                rpc_status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
            return f;
        }
        router_filter_unref(stale);
        rpc_status_set(st, router_node_down(rs.code) ? GRPC_STATUS_UNAVAILABLE : rs.code,
                   "filter \"%s\": shard 0 on node %s (group %s): %s: %s", name,
                   addr, g->name, rpc_status_name(rs.code), rs.message);
        return NULL;
    }
    if (stale && memcmp(stale->secret, secret, BF_SECRET_LEN) != 0)
        log_info("filter %s was re-created: new secret", name);
    f = router_filter_add(r, name, secret, shards, (struct topo *)t, stale);
    router_filter_unref(stale);
    if (!f)
        rpc_status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    return f;
}
/* ---- key batches ---- */

/* A thread's buffers for starting a batch, kept between batches. */
struct scratch {
    struct bf_hash *h;          /* per key, request order */
    uint32_t *shard;            /* per key */
    size_t cap;                 /* of the two above */
    uint32_t *call_of_group;    /* per topology group */
    size_t gcap;
    uint32_t count[ROUTER_MAX_SHARDS + 1], start[ROUTER_MAX_SHARDS + 1];
};

/* One scratch per thread, freed when the thread exits. */
static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;

static void scratch_free(void *p)
{
    struct scratch *s = p;
    free(s->h);
    free(s->shard);
    free(s->call_of_group);
    free(s);
}

static void scratch_key_init(void)
{
    pthread_key_create(&scratch_key, scratch_free);
}

/* Grow *p to n elements of size bytes; false when out of memory. */
static bool grow(void *pp, size_t n, size_t size)
{
    void **p = pp;
    void *q = realloc(*p, (n ? n : 1) * size);
    if (!q)
        return false;
    *p = q;
    return true;
}

/* The calling thread's scratch for n keys and ngroups groups, or NULL when
 * out of memory. */
static struct scratch *scratch_get(size_t n, size_t ngroups)
{
    pthread_once(&scratch_once, scratch_key_init);
    struct scratch *s = pthread_getspecific(scratch_key);
    if (!s) {
        s = calloc(1, sizeof *s);
        if (!s || pthread_setspecific(scratch_key, s) != 0) {
            free(s);
            return NULL;
        }
    }
    if (n > s->cap) {
        size_t cap = s->cap ? s->cap : 4096;
        while (cap < n)
            cap *= 2;
        if (!grow(&s->h, cap, sizeof *s->h) || !grow(&s->shard, cap, sizeof *s->shard))
            return NULL;
        s->cap = cap;
    }
    if (ngroups > s->gcap) {
        if (!grow(&s->call_of_group, ngroups, sizeof *s->call_of_group))
            return NULL;
        s->gcap = ngroups;
    }
    return s;
}

/* A batch in flight.  It owns the hashes and answer slots lent to the
 * links, so it lives (refs) until every link call has ended, which may be
 * after its caller was answered (done): the caller's keys and out are used
 * only until then.  References: the starter's while it submits, and one per
 * link set. */
struct key_batch {
    atomic_int refs;
    atomic_size_t pending;      /* link sets not ended */
    struct router *r;
    struct topo *t;
    struct router_filter *f;
    enum router_key_op op;
    bool retried;               /* the second attempt, after a new secret */
    char filter[ROUTER_NAME_MAX + 1];
    const uint8_t *const *keys; /* the caller's, until done */
    const uint32_t *lens;
    size_t n;
    bool *out;
    router_keys_fn done;
    void *arg;
    uint32_t nused;             /* entries (shards asked) */
    size_t ncalls;
    uint32_t *shard;            /* per key */
    struct bf_hash *hs;         /* by shard: each shard's hashes contiguous */
    uint32_t *idx;              /* by shard: the key's index in the request */
    bool *outs;                 /* by shard: the answers */
    struct router_link_entry *ent;   /* per used shard, grouped by call */
    struct router_link_call *calls;  /* per node */
};

/* A batch for n keys and nused entries (one allocation), or NULL. */
static struct key_batch *batch_alloc(size_t n, uint32_t nused)
{
    size_t sz = sizeof(struct key_batch) + nused * sizeof(struct router_link_entry) +
                nused * sizeof(struct router_link_call) + n * sizeof(struct bf_hash) +
                n * 2 * sizeof(uint32_t) + n * sizeof(bool);
    struct key_batch *b = calloc(1, sz);
    if (!b)
        return NULL;
    b->ent = (struct router_link_entry *)(b + 1);
    b->calls = (struct router_link_call *)(b->ent + nused);
    b->hs = (struct bf_hash *)(b->calls + nused);
    b->shard = (uint32_t *)(b->hs + n);
    b->idx = b->shard + n;
    b->outs = (bool *)(b->idx + n);
    b->nused = nused;
    return b;
}

static void batch_unref(struct key_batch *b)
{
    if (atomic_fetch_sub(&b->refs, 1) != 1)
        return;
    router_filter_unref(b->f);
    topo_unref(b->t);
    free(b);
}

static enum router_link_op link_op(enum router_key_op op)
{
    switch (op) {
    case ROUTER_MAY_CONTAIN:
        return ROUTER_LINK_MAY_CONTAIN;
    case ROUTER_REMOVE:
        return ROUTER_LINK_REMOVE;
    default:
        return ROUTER_LINK_ADD;
    }
}

/* A failed shard of a batch. */
struct shard_fail {
    uint32_t shard;
    const char *node;
    grpc_status_code code;
    enum rpc_reason reason;
    char msg[200];
};

static int shard_fail_cmp(const void *a, const void *b)
{
    uint32_t x = ((const struct shard_fail *)a)->shard;
    uint32_t y = ((const struct shard_fail *)b)->shard;
    return x < y ? -1 : x > y;
}
/* Try a failed read of shard on the replicas of its group that are known
 * to be caught up: they must report at least the version this router last
 * saw from the primary.  e is the shard's entry (its hashes and answer
 * slots); returns true when a replica answered into e->out. */
static bool read_from_replica(struct router *r, const struct topo *t,
                              struct router_filter *f, uint32_t shard,
                              const struct router_link_entry *e)
{
    const struct topo_group *g = &t->groups[f->group[shard]];
    uint64_t need = atomic_load(&f->seen_version[shard]);
    if (need == 0)
        return false;    /* nothing to compare a replica with */
    for (unsigned i = 0; i < g->nreplicas; i++) {
        struct router_link_entry one = {.shard = shard, .h = e->h, .n = e->n,
                                        .out = e->out};
        struct router_link_call c = {.link = router_node_link(r, g->replicas[i]),
                                     .filter = f->name, .secret_id = f->secret_id,
                                     .op = ROUTER_LINK_MAY_CONTAIN, .e = &one, .n = 1};
        if (!c.link)
            continue;
        router_link_run(&c, 1, (int)r->cfg.node_timeout_ms);
        if (one.st.code == GRPC_STATUS_OK && one.version >= need) {
            log_info("shard %u of %s read from replica %s (version %llu)", shard,
                     f->name, g->replicas[i], (unsigned long long)one.version);
            return true;
        }
    }
    return false;
}

/* Append the ranges of key indices whose shard failed (or did not) to buf. */
static void list_keys(char *buf, size_t len, const bool *failed_shard,
                      const uint32_t *shard_of, size_t n, bool want_failed)
{
    size_t used = strlen(buf);
    size_t i = 0;
    bool first = true;
    while (i < n) {
        if (failed_shard[shard_of[i]] != want_failed) {
            i++;
            continue;
        }
        size_t j = i;
        while (j + 1 < n && failed_shard[shard_of[j + 1]] == want_failed)
            j++;
        char item[48];
        if (j == i)
            snprintf(item, sizeof item, "%s%zu", first ? "" : ",", i);
        else
            snprintf(item, sizeof item, "%s%zu-%zu", first ? "" : ",", i, j);
        if (used + strlen(item) + 5 >= len) {
            snprintf(buf + used, len - used, ",...");
            return;
        }
        memcpy(buf + used, item, strlen(item) + 1);
        used += strlen(item);
        first = false;
        i = j + 1;
    }
}

/* Build the status of a batch with failed shards. */
static void batch_failure(struct rpc_status *st, enum router_key_op op,
                          const char *filter, const struct shard_fail *fails,
                          size_t nfail, const bool *failed_shard,
                          const uint32_t *shard_of, size_t n)
{
    grpc_status_code code = GRPC_STATUS_UNAVAILABLE;
    bool all_down = true;
    for (size_t i = 0; i < nfail; i++)
        if (!router_node_down(fails[i].code) && fails[i].code != GRPC_STATUS_NOT_FOUND) {
            code = fails[i].code;   /* e.g. FAILED_PRECONDITION: pass it on */
            all_down = false;
            break;
        }
    size_t acked = 0;
    for (size_t i = 0; i < n; i++)
        if (!failed_shard[shard_of[i]])
            acked++;
    int w = snprintf(st->message, sizeof st->message, "%s on filter \"%s\": shard %u on node "
                     "%s: %s: %s", op_names[op], filter, fails[0].shard,
                     fails[0].node, rpc_status_name(fails[0].code), fails[0].msg);
    if (nfail > 1 && w > 0 && (size_t)w < sizeof st->message) {
        w += snprintf(st->message + w, sizeof st->message - (size_t)w, " (and %zu more "
                      "shards:", nfail - 1);
        for (size_t i = 1; i < nfail && i < 6 && (size_t)w < sizeof st->message; i++)
            w += snprintf(st->message + w, sizeof st->message - (size_t)w, " %u@%s",
                          fails[i].shard, fails[i].node);
        if ((size_t)w < sizeof st->message)
            w += snprintf(st->message + w, sizeof st->message - (size_t)w, "%s)",
                          nfail > 6 ? " ..." : "");
    }
    if (op != ROUTER_MAY_CONTAIN && all_down && w > 0 && (size_t)w < sizeof st->message) {
        /* Writes: say which keys were acknowledged anyway. */
        snprintf(st->message + w, sizeof st->message - (size_t)w,
                 "; acknowledged %zu of %zu keys; not acknowledged: ", acked, n);
        list_keys(st->message, sizeof st->message, failed_shard, shard_of, n, true);
    }
    st->code = code;
}
/* Sort the hashed keys by shard (b->hs, b->idx) and build one call per
 * node of the shards that take part: entries in shard order, grouped by
 * call.  Returns the number of calls, or -ENOMEM. */
static int batch_calls(struct router *r, const struct topo *t, struct router_filter *f,
                       struct scratch *sc, struct key_batch *b, enum router_key_op op,
                       size_t n, bool ask0)
{
    uint32_t S = f->shards;
    uint32_t fill[ROUTER_MAX_SHARDS];
    size_t ncalls = 0;

    memset(fill, 0, S * sizeof fill[0]);
    for (size_t i = 0; i < n; i++) {
        uint32_t s = sc->shard[i];
        size_t at = sc->start[s] + fill[s]++;
        b->hs[at] = sc->h[i];
        b->idx[at] = (uint32_t)i;
    }
    for (unsigned g = 0; g < t->ngroups; g++)
        sc->call_of_group[g] = UINT32_MAX;
    /* Calls by node: groups that share a primary share its call.  First
     * count each call's entries, then lay them out call by call. */
    uint32_t ncall_ent[ROUTER_MAX_SHARDS];
    for (uint32_t s = 0; s < S; s++) {
        if (!sc->count[s] && !(ask0 && s == 0))
            continue;
        uint32_t g = f->group[s];
        if (sc->call_of_group[g] == UINT32_MAX) {
            const char *a = t->groups[g].primary;
            uint32_t c = 0;
            while (c < ncalls && strcmp(router_link_addr(b->calls[c].link), a) != 0)
                c++;
            if (c == ncalls) {
                struct router_link *l = router_node_link(r, a);
                if (!l)
                    return -ENOMEM;
                memset(&b->calls[c], 0, sizeof b->calls[c]);
                b->calls[c].link = l;
                ncall_ent[c] = 0;
                ncalls++;
            }
            sc->call_of_group[g] = c;
        }
        ncall_ent[sc->call_of_group[g]]++;
    }
    for (size_t c = 0, first = 0; c < ncalls; c++) {
        struct router_link_call *lc = &b->calls[c];
        lc->filter = b->filter;
        lc->secret_id = f->secret_id;
        lc->op = link_op(op);
        lc->e = b->ent + first;
        lc->n = 0;
        first += ncall_ent[c];
    }
    for (uint32_t s = 0; s < S; s++) {
        if (!sc->count[s] && !(ask0 && s == 0))
            continue;
        struct router_link_call *lc = &b->calls[sc->call_of_group[f->group[s]]];
        struct router_link_entry *e = &lc->e[lc->n++];
        memset(&e->st, 0, sizeof e->st);
        e->shard = s;
        e->h = b->hs + sc->start[s];
        e->n = sc->count[s];
        e->out = b->outs + sc->start[s];
        e->version = 0;
    }
    return (int)ncalls;
}

/* The outcome of a batch whose calls have ended: answers into the caller's
 * out, or -1 with st.  slow: this thread may block (a pool thread), so a
 * failed read may be tried on the replicas; *stale is set when a node says
 * the cached secret is no longer the filter's. */
static int batch_outcome(struct key_batch *b, bool slow, struct rpc_status *st,
                         bool *stale)
{
    struct router *r = b->r;
    struct topo *t = b->t;
    struct router_filter *f = b->f;
    enum router_key_op op = b->op;
    const char *filter = b->filter;
    uint32_t nused = b->nused;
    size_t n = b->n, nfail = 0;
    struct shard_fail *fails = calloc(nused, sizeof *fails);
    bool *failed_shard = calloc(f->shards, sizeof *failed_shard);
    int rc = -1;

    if (!fails || !failed_shard) {
        rpc_status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    for (uint32_t k = 0; k < nused; k++) {
        struct router_link_entry *e = &b->ent[k];
        uint32_t s = e->shard;
        bool ok = e->st.code == GRPC_STATUS_OK;
        if (ok)
            router_filter_saw_version(f, s, e->version);
        else if (slow && op == ROUTER_MAY_CONTAIN && router_node_down(e->st.code))
            ok = read_from_replica(r, t, f, s, e);
        if (ok) {
            size_t first = (size_t)(e->out - b->outs);
            for (uint32_t i = 0; i < e->n; i++)
                b->out[b->idx[first + i]] = e->out[i];
            continue;
        }
        struct shard_fail *sf = &fails[nfail++];
        sf->shard = s;
        sf->node = router_rpc__primary(t, f, s);
        sf->code = e->st.code;
        sf->reason = e->st.reason;
        snprintf(sf->msg, sizeof sf->msg, "%.199s", e->st.message);
        failed_shard[s] = true;
    }
    if (nfail == 0) {
        rc = 0;
        goto out;
    }
    /* Failures in shard order, as the messages list them. */
    qsort(fails, nfail, sizeof *fails, shard_fail_cmp);
    size_t notfound = 0;
    bool not_counting = false;
    for (size_t i = 0; i < nfail; i++) {
        notfound += fails[i].code == GRPC_STATUS_NOT_FOUND;
        if (fails[i].reason == RPC_REASON_SECRET_MISMATCH)
            *stale = true;
        if (fails[i].reason == RPC_REASON_NOT_COUNTING)
            not_counting = true;
    }
    if (*stale) {
        router_filter_forget(r, filter);
        rpc_status_set(st, GRPC_STATUS_FAILED_PRECONDITION, "%s", fails[0].msg);
        goto out;
    }
    if (not_counting) {
        /* Every shard has the filter's kind: answer as a node would. */
        rpc_status_set(st, GRPC_STATUS_FAILED_PRECONDITION, RULES_MSG_NOT_COUNTING,
                       filter);
        st->reason = RPC_REASON_NOT_COUNTING;
        goto out;
    }
    if (notfound) /* dropped or re-created elsewhere: fetch it again next time */
        router_filter_forget(r, filter);
    if (notfound == nfail && nfail == nused) {
        rpc_status_set(st, GRPC_STATUS_NOT_FOUND, "filter \"%s\" does not exist", filter);
        goto out;
    }
    batch_failure(st, op, filter, fails, nfail, failed_shard, b->shard, n);
    log_warn("%s", st->message);
out:
    free(fails);
    free(failed_shard);
    return rc;
}

static void keys_start(struct router *r, const char *filter, enum router_key_op op,
                       const uint8_t *const *keys, const uint32_t *lens, size_t n,
                       bool *out, router_keys_fn done, void *arg, bool retried);

/* Answer the caller of b, or start the second attempt after a new secret
 * (slow: on a pool thread). */
static void batch_end(struct key_batch *b, bool slow)
{
    struct rpc_status st = {.code = GRPC_STATUS_OK};
    bool stale = false;
    int rc = batch_outcome(b, slow, &st, &stale);
    if (rc < 0 && stale && !b->retried && slow) {
        /* The filter was re-created elsewhere: nothing was applied with the
         * old secret; fetch the new one and run the batch again. */
        log_info("filter %s has a new secret; fetching it", b->filter);
        keys_start(b->r, b->filter, b->op, b->keys, b->lens, b->n, b->out, b->done,
                   b->arg, true);
        return;
    }
    b->done(b->arg, rc, &st);
}

static void batch_slow(void *arg)
{
    struct key_batch *b = arg;
    batch_end(b, true);
    batch_unref(b);
}

/* Does the outcome need a blocking step (a new secret, a replica read)? */
static bool batch_needs_slow(const struct key_batch *b)
{
    for (uint32_t k = 0; k < b->nused; k++) {
        const struct router_link_entry *e = &b->ent[k];
        if (e->st.code == GRPC_STATUS_OK)
            continue;
        if (e->st.reason == RPC_REASON_SECRET_MISMATCH && !b->retried)
            return true;
        if (b->op == ROUTER_MAY_CONTAIN && router_node_down(e->st.code))
            return true;
    }
    return false;
}

/* Every link call of b has ended (usually on a link's thread, which must
 * not block): answer, or hand the slow part to the router's pool. */
static void batch_complete(struct key_batch *b)
{
    if (!batch_needs_slow(b)) {
        batch_end(b, false);
        return;
    }
    atomic_fetch_add(&b->refs, 1);
    int rc = router_pool_push(b->r->pool, batch_slow, b);
    if (rc == 0)
        return;
    atomic_fetch_sub(&b->refs, 1);   /* the link set's reference remains */
    struct rpc_status st;
    if (rc == -ECANCELED)
        rpc_status_set(&st, GRPC_STATUS_UNAVAILABLE, "%s on filter \"%s\": the router "
                       "is shutting down", op_names[b->op], b->filter);
    else
        rpc_status_set(&st, GRPC_STATUS_UNAVAILABLE, "%s on filter \"%s\": a shard "
                       "needs a replica read or a new secret, and the router's queue "
                       "for them is full (%d waiting); retry shortly", op_names[b->op],
                       b->filter, ROUTER_POOL_QUEUE);
    b->done(b->arg, -1, &st);
}

/* One link set (one node's call) of b ended. */
static void batch_set_done(void *arg)
{
    struct key_batch *b = arg;
    if (atomic_fetch_sub(&b->pending, 1) == 1)
        batch_complete(b);
    batch_unref(b);
}

static void keys_start(struct router *r, const char *filter, enum router_key_op op,
                       const uint8_t *const *keys, const uint32_t *lens, size_t n,
                       bool *out, router_keys_fn done, void *arg, bool retried)
{
    struct topo *t = router_topo(r);
    struct key_batch *b = NULL;
    struct rpc_status st = {.code = GRPC_STATUS_OK};
    uint32_t nused = 0;
    bool ask0 = false;

    struct router_filter *f = router_filter_lookup(r, t, filter, &st);
    if (!f)
        goto fail;
    uint32_t S = f->shards;
    struct scratch *sc = scratch_get(n, t->ngroups);
    if (!sc) {
        rpc_status_set(&st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto fail;
    }
    /* Hash once, count per shard. */
    memset(sc->count, 0, (S + 1) * sizeof sc->count[0]);
    for (size_t i = 0; i < n; i++) {
        sc->h[i] = bf_hash_key(f->hasher, keys[i], lens[i]);
        sc->shard[i] = bf_hash_shard(sc->h[i], S);
        sc->count[sc->shard[i]]++;
    }
    for (uint32_t s = 0, off = 0; s < S; s++) {
        sc->start[s] = off;
        off += sc->count[s];
        nused += sc->count[s] > 0;
    }
    if (nused == 0 && op == ROUTER_REMOVE) {
        /* No keys: shard 0 still answers whether the filter takes a
         * Remove, as a node's Remove of no keys does. */
        ask0 = true;
        nused = 1;
    }
    if (nused == 0) {
        router_filter_unref(f);
        topo_unref(t);
        done(arg, 0, &st);
        return;
    }
    b = batch_alloc(n, nused);
    int ncalls = b ? batch_calls(r, t, f, sc, b, op, n, ask0) : -ENOMEM;
    if (ncalls < 0) {
        rpc_status_set(&st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto fail;
    }
    memcpy(b->shard, sc->shard, n * sizeof *b->shard);
    snprintf(b->filter, sizeof b->filter, "%s", filter);
    b->r = r;
    b->t = t;
    b->f = f;
    b->op = op;
    b->retried = retried;
    b->keys = keys;
    b->lens = lens;
    b->n = n;
    b->out = out;
    b->done = done;
    b->arg = arg;
    b->ncalls = (size_t)ncalls;
    atomic_init(&b->refs, 1 + ncalls);
    atomic_init(&b->pending, (size_t)ncalls);
    /* One set per node, so that each node's outcome is known on its own
     * (what a write quorum over copies will count). */
    for (int c = 0; c < ncalls; c++)
        router_link_submit(&b->calls[c], 1, (int)r->cfg.node_timeout_ms,
                           batch_set_done, b);
    batch_unref(b);
    return;
fail:
    free(b);
    router_filter_unref(f);
    topo_unref(t);
    done(arg, -1, &st);
}

void router_keys_start(struct router *r, const char *filter, enum router_key_op op,
                       const uint8_t *const *keys, const uint32_t *lens, size_t n,
                       bool *out, router_keys_fn done, void *arg)
{
    keys_start(r, filter, op, keys, lens, n, out, done, arg, false);
}
