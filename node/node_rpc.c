/* node_rpc: what the node's handler files share (per-thread scratch, the
 * request checks, store error translation, FilterInfo, shard lookup and the
 * per-shard hash operation, reply encoding) and the handler tables.  See
 * node_rpc.h for how the handlers are split.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "bf.h"
#include "bf_file.h"
#include "log.h"
#include "node.h"
#include "node_client.h"
#include "node_rpc.h"
#include "rpc_server.h"
#include "rules.h"
#include "store.h"
#include "wire.h"

/* Worker threads keep their scratch between calls; it is freed when the
 * thread exits (server shutdown). */
static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;

static void scratch_destroy(void *p)
{
    node_rpc__scratch_free(p);
    free(p);
}

static void scratch_key_init(void)
{
    pthread_key_create(&scratch_key, scratch_destroy);
}

struct scratch *node_rpc__thread_scratch(void)
{
    pthread_once(&scratch_once, scratch_key_init);
    struct scratch *sc = pthread_getspecific(scratch_key);
    if (!sc) {
        sc = calloc(1, sizeof *sc);
        if (sc)
            pthread_setspecific(scratch_key, sc);
    }
    return sc;
}

int node_rpc__scratch_reserve(struct scratch *sc, size_t n)
{
    if (n <= sc->cap)
        return 0;
    size_t cap = sc->cap ? sc->cap : 1024;
    while (cap < n)
        cap *= 2;
    struct bf_hash *h = realloc(sc->hashes, cap * sizeof *h);
    if (h)
        sc->hashes = h;
    bool *o = realloc(sc->out, cap * sizeof *o);
    if (o)
        sc->out = o;
    if (!h || !o)
        return -ENOMEM;
    sc->cap = cap;
    return 0;
}

void node_rpc__scratch_free(struct scratch *sc)
{
    free(sc->hashes);
    free(sc->out);
    memset(sc, 0, sizeof *sc);
}

/* ---- helpers ---- */

bool node_rpc__public_name_ok(const char *name, struct rpc_reply *r)
{
    char err[RULES_ERRLEN];
    if (rules_filter_name_check(name, strlen(name), err) < 0) {
        rpc_reply_error(r, GRPC_STATUS_INVALID_ARGUMENT, "%s", err);
        return false;
    }
    return true;
}

struct store *node_rpc__need_store(struct node *n, struct rpc_reply *r)
{
    struct store *s = node_store(n);
    if (!s)
        rpc_reply_error(r, GRPC_STATUS_UNAVAILABLE,
                        "node is recovering its data directory %s; retry shortly",
                        n->cfg.data_dir);
    return s;
}

static void read_nothing(const struct bf *f, void *ctx)
{
    (void)f;
    (void)ctx;
}

/* Translate a store error about filter name into a status. */
void node_rpc__store_error(struct rpc_reply *r, struct store_filter *sf,
                        const char *name, int rc, const char *err)
{
    char why[STORE_ERRLEN] = "";
    switch (rc) {
    case -ENOENT:
        rpc_reply_error(r, GRPC_STATUS_NOT_FOUND, "filter \"%s\" does not exist",
                        name);
        break;
    case -EAGAIN:
        rpc_reply_error(r, GRPC_STATUS_UNAVAILABLE,
                        "filter \"%s\" is recovering; retry shortly", name);
        break;
    case -EIO:
        if (sf)
            store_filter_state(sf, why);
        /* A write to a filter whose log failed: its reads go on. */
        rpc_reply_error(r, GRPC_STATUS_UNAVAILABLE, "filter \"%s\" %s: %s", name,
                        sf && store_filter_read(sf, read_nothing, NULL) == 0
                            ? "takes no writes" : "is not serving",
                        why[0] ? why : (err && err[0] ? err : "I/O error"));
        break;
    case -EEXIST:
        rpc_reply_error(r, GRPC_STATUS_ALREADY_EXISTS,
                        "filter \"%s\" already exists", name);
        break;
    case -EINVAL:
        rpc_reply_error(r, GRPC_STATUS_INVALID_ARGUMENT, "filter \"%s\": %s", name,
                        err && err[0] ? err : "invalid argument");
        break;
    case -EOPNOTSUPP:
        rpc_reply_fail(r, GRPC_STATUS_FAILED_PRECONDITION, RPC_REASON_NOT_COUNTING,
                       RULES_MSG_NOT_COUNTING, name);
        break;
    case -ENOMEM:
        rpc_reply_error(r, GRPC_STATUS_RESOURCE_EXHAUSTED, "filter \"%s\": %s", name,
                        err && err[0] ? err : "out of memory");
        break;
    case -ESTALE:   /* a tombstone: store.h, "Tombstones" */
        rpc_reply_fail(r, GRPC_STATUS_FAILED_PRECONDITION, RPC_REASON_DROPPED,
                       "filter \"%s\": %s (CreateFilter with undrop set: "
                       "bloomgrid restore --undrop)", name,
                       err && err[0] ? err : "dropped");
        break;
    case -EDQUOT:   /* a budget: store.h, "Budgets" */
        rpc_reply_error(r, GRPC_STATUS_RESOURCE_EXHAUSTED, "%s",
                        err && err[0] ? err : "over a budget of the node");
        break;
    case -ENOSPC:   /* the disk is full: writes refused, reads go on */
        if (sf && !(err && err[0]))
            store_filter_state(sf, why);
        rpc_reply_error(r, GRPC_STATUS_UNAVAILABLE,
                        "filter \"%s\": no space left on device: %s", name,
                        err && err[0] ? err
                        : why[0] ? why
                                 : "the write could not be made durable; nothing "
                                   "was acknowledged");
        break;
    default:
        rpc_reply_error(r, GRPC_STATUS_UNAVAILABLE, "filter \"%s\": %s (%s)",
                        name, err && err[0] ? err : "store error", strerror(-rc));
        break;
    }
}

/* A handle on a READY filter, or NULL with the reply set. */
struct store_filter *node_rpc__get_filter(struct store *s, const char *name,
                                       struct rpc_reply *r)
{
    struct store_filter *sf = store_get(s, name);
    if (!sf) {
        rpc_reply_error(r, GRPC_STATUS_NOT_FOUND, "filter \"%s\" does not exist",
                        name);
        return NULL;
    }
    return sf;
}

/* ---- FilterInfo ---- */

static void info_from_bf(const struct bf *f, void *ctx);

static Bloomgrid__V1__FilterState state_to_wire(enum store_state st)
{
    switch (st) {
    case STORE_READY: return BLOOMGRID__V1__FILTER_STATE__FILTER_STATE_READY;
    case STORE_RECOVERING: return BLOOMGRID__V1__FILTER_STATE__FILTER_STATE_RECOVERING;
    default: return BLOOMGRID__V1__FILTER_STATE__FILTER_STATE_FAILED;
    }
}

void node_rpc__info_fill(struct node *n, struct info_buf *ib, struct store_filter *sf,
                      const char *public_name)
{
    bloomgrid__v1__filter_info__init(&ib->fi);
    bloomgrid__v1__shard_info__init(&ib->si);
    snprintf(ib->name, sizeof ib->name, "%s", public_name);
    ib->reason[0] = 0;
    ib->fp[0] = 0;
    ib->fi.name = ib->name;
    ib->fi.reason = ib->reason;
    ib->fi.fingerprint = ib->fp;
    ib->si.node = n->cfg.listen;
    ib->si.reason = ib->reason;
    ib->sip = &ib->si;
    ib->fi.n_shard_info = 1;
    ib->fi.shard_info = &ib->sip;

    enum store_state st = store_filter_state(sf, ib->reason);
    if (st == STORE_RECOVERING && !ib->reason[0])
        snprintf(ib->reason, sizeof ib->reason, "recovering");
    ib->fi.state = state_to_wire(st);
    ib->si.state = ib->fi.state;
    ib->fi.version = store_filter_version(sf);
    ib->si.version = ib->fi.version;
    ib->fi.shards = 1;
    /* Geometry and estimates also of a filter that takes no writes (a
     * full disk) but still has its bits. */
    store_filter_read(sf, info_from_bf, ib);
    if (st == STORE_READY && node_rpc__shard_syncing(sf)) {
        ib->fi.state = BLOOMGRID__V1__FILTER_STATE__FILTER_STATE_SYNCING;
        ib->si.state = ib->fi.state;
        snprintf(ib->reason, sizeof ib->reason, "syncing: it has not yet "
                 "pulled its group's pages (reads are refused)");
    }
}

/* Geometry and estimates, read under the filter's shared lock. */
static void info_from_bf(const struct bf *f, void *ctx)
{
    struct info_buf *ib = ctx;
    struct bf_stats stats;
    struct bf_layer_info li;
    bf_stats(f, &stats);
    ib->fi.kind = (Bloomgrid__V1__FilterKind)bf_kind(f);
    ib->fi.capacity = bf_capacity(f);
    ib->fi.error_rate = bf_error_rate(f);
    ib->fi.shards = bf_shard_count(f);
    ib->fi.placement = bf_placement(f) ? bf_placement(f) : 1;
    ib->fi.bits = stats.bits;
    if (bf_layer_info(f, 0, &li) == 0)
        ib->fi.hashes = li.k;
    ib->fi.bytes = stats.bytes;
    ib->fi.fill_ratio = stats.fill_ratio;
    ib->fi.estimated_count = stats.estimated_count;
    ib->fi.estimated_error_rate = stats.estimated_fpr;
    ib->fi.over_capacity = stats.over_capacity;
    ib->fi.layers = stats.layers;
    ib->fi.insert_count = bf_insert_count(f);
    bf_fingerprint_id(f, ib->fp);
    ib->si.index = bf_shard_index(f);
    ib->si.bits = stats.bits;
    ib->si.bytes = stats.bytes;
    ib->si.fill_ratio = stats.fill_ratio;
    ib->si.estimated_count = stats.estimated_count;
}

bool node_rpc__kind_from_wire(int k, enum bf_kind *out, struct rpc_reply *r)
{
    char err[RULES_ERRLEN];
    if (rules_kind_check(k, err) < 0) {
        rpc_reply_error(r, GRPC_STATUS_INVALID_ARGUMENT, "%s", err);
        return false;
    }
    /* The wire enum numbers the kinds as enum bf_kind; 0 is the default. */
    *out = k == 0 ? BF_KIND_BLOCKED : (enum bf_kind)k;
    return true;
}

bool node_rpc__params_ok(uint64_t capacity, double error_rate, struct rpc_reply *r)
{
    char err[RULES_ERRLEN];
    if (rules_params_check(capacity, error_rate, err) < 0) {
        rpc_reply_error(r, GRPC_STATUS_INVALID_ARGUMENT, "%s", err);
        return false;
    }
    return true;
}

/* ---- shards ---- */

static void shard_facts_read(const struct bf *f, void *ctx)
{
    struct shard_facts *sf = ctx;
    sf->count = bf_shard_count(f);
    sf->index = bf_shard_index(f);
    sf->placement = bf_placement(f);
    memcpy(sf->secret, bf_secret(f), BF_SECRET_LEN);
    sf->secret_id = XXH3_64bits(sf->secret, BF_SECRET_LEN);
}

int node_rpc__shard_facts(struct store_filter *sf, struct shard_facts *out)
{
    memset(out, 0, sizeof *out);
    return store_filter_read(sf, shard_facts_read, out);
}

/* Find the store filter of (filter, index): the plain name holds a
 * single-shard filter, "<filter>.shard-<index>" one shard of many. */
struct store_filter *node_rpc__get_shard(struct store *s, const char *filter,
                                      unsigned index, struct rpc_reply *r)
{
    char sname[STORE_NAME_MAX + 1];
    struct store_filter *sf = NULL;
    if (!node_rpc__public_name_ok(filter, r))
        return NULL;
    if (index < RULES_SHARDS_MAX &&
        rules_shard_name(sname, sizeof sname, filter, index, RULES_SHARDS_MAX,
                         NULL) == 0)
        sf = store_get(s, sname);
    if (!sf && index == 0)
        sf = store_get(s, filter);
    if (!sf)
        rpc_reply_error(r, GRPC_STATUS_NOT_FOUND,
                        "shard %u of filter \"%s\" is not on this node", index,
                        filter);
    return sf;
}

static pthread_mutex_t create_mu = PTHREAD_MUTEX_INITIALIZER;

bool node_rpc__create_begin(struct store *s, const char *filter, unsigned index,
                            unsigned count, struct rpc_reply *r)
{
    char other[STORE_NAME_MAX + 1];
    pthread_mutex_lock(&create_mu);
    if (index != 0)
        return true;
    if (count > 1)
        snprintf(other, sizeof other, "%s", filter);
    else if (rules_shard_name(other, sizeof other, filter, 0, 2, NULL) < 0)
        return true;   /* not a valid name: the creation says why */
    struct store_filter *sf = store_get(s, other);
    if (!sf)
        return true;
    store_put(sf);
    pthread_mutex_unlock(&create_mu);
    rpc_reply_error(r, GRPC_STATUS_ALREADY_EXISTS,
                    "filter \"%s\" exists on this node with %s (as \"%s\"); a "
                    "filter has one shard count for life", filter,
                    count > 1 ? "one shard" : "more than one shard", other);
    return false;
}

void node_rpc__create_end(void)
{
    pthread_mutex_unlock(&create_mu);
}

struct store_filter *node_rpc__shard_check(struct store *s, enum key_op op,
                                           const char *filter, unsigned index,
                                           const uint8_t *data, size_t cnt,
                                           bool check_shard, uint64_t secret_id,
                                           struct bf_hash *h, struct rpc_reply *r)
{
    struct store_filter *sf = node_rpc__get_shard(s, filter, index, r);
    if (!sf)
        return NULL;
    /* A SYNCING copy takes writes but may lack acknowledged ones. */
    if (op == OP_MAY_CONTAIN && node_rpc__refuse_syncing(sf, r))
        goto fail;
    node_client_hashes_get(h, data, cnt);
    if (check_shard || secret_id) {
        struct shard_facts facts;
        node_rpc__shard_facts(sf, &facts);
        uint32_t count = check_shard ? facts.count : 0;
        if (secret_id && facts.count && facts.secret_id != secret_id) {
            rpc_reply_fail(r, GRPC_STATUS_FAILED_PRECONDITION,
                           RPC_REASON_SECRET_MISMATCH,
                            "shard %u of filter \"%s\" has another secret than the "
                            "hashes were made with (the filter was re-created): "
                            "fetch the secret again", index, filter);
            goto fail;
        }
        for (size_t i = 0; count && i < cnt; i++) {
            if (bf_hash_shard(h[i], count) != index) {
                rpc_reply_fail(r, GRPC_STATUS_FAILED_PRECONDITION,
                               RPC_REASON_WRONG_SHARD,
                                "hash %zu belongs to shard %u, not %u", i,
                                bf_hash_shard(h[i], count), index);
                goto fail;
            }
        }
    }
    return sf;
fail:
    store_put(sf);
    return NULL;
}

uint64_t node_rpc__shard_version(struct store_filter *sf)
{
    return store_filter_version(sf);
}

void node_rpc__shard_store_error(struct rpc_reply *r, struct store_filter *sf,
                                 const char *filter, unsigned index, int rc,
                                 const char *err)
{
    char label[STORE_NAME_MAX + 32];
    snprintf(label, sizeof label, "%s shard %u", filter, index);
    node_rpc__store_error(r, sf, label, rc, err);
}

int node_rpc__shard_apply(struct store_filter *sf, enum key_op op, const char *filter,
                          unsigned index, const struct bf_hash *h, size_t cnt, bool *out,
                          uint64_t *version, struct rpc_reply *r)
{
    char err[STORE_ERRLEN] = "";
    int src = 0;
    /* cnt 0 still asks the store, which refuses a Remove on a kind without
     * counters as it would with keys. */
    switch (op) {
    case OP_ADD:
        src = store_add_hashes(sf, h, cnt, out, err);
        break;
    case OP_MAY_CONTAIN:
        src = store_may_contain_hashes(sf, h, cnt, out);
        break;
    case OP_REMOVE:
        src = store_remove_hashes(sf, h, cnt, out, err);
        break;
    }
    int rc = 0;
    if (src < 0) {
        node_rpc__shard_store_error(r, sf, filter, index, src, err);
        rc = -1;
    } else {
        *version = node_rpc__shard_version(sf);
    }
    store_put(sf);
    return rc;
}

int node_rpc__shard_hashes(struct store *s, enum key_op op, const char *filter,
                           unsigned index, const uint8_t *data, size_t cnt,
                           bool check_shard, uint64_t secret_id,
                           struct bf_hash *h, bool *out, uint64_t *version,
                           struct rpc_reply *r)
{
    struct store_filter *sf = node_rpc__shard_check(s, op, filter, index, data, cnt,
                                                    check_shard, secret_id, h, r);
    if (!sf)
        return -1;
    return node_rpc__shard_apply(sf, op, filter, index, h, cnt, out, version, r);
}

/* ---- replies ---- */

/* Encode "repeated bool field 1 [packed]" (+ optional uint64 field 2). */
void node_rpc__encode_bools(struct rpc_reply *r, const bool *v, size_t n,
                         bool with_version, uint64_t version)
{
    size_t len = 0;
    if (n)
        len += 1 + varint_len(n) + n;
    if (with_version && version)
        len += 1 + varint_len(version);
    uint8_t *p = rpc_reply_alloc(r, len);
    if (n) {
        *p++ = 0x0a;
        p = put_varint(p, n);
        for (size_t i = 0; i < n; i++)
            *p++ = v[i] ? 1 : 0;
    }
    if (with_version && version) {
        *p++ = 0x10;
        p = put_varint(p, version);
    }
}

void node_rpc__finish_reply(struct rpc_stream *st, const struct rpc_reply *r)
{
    rpc_stream_finish_status(st, &r->st);
}

/* ---- the node's group in the topology ---- */

/* The topology is swapped whole (SIGHUP) under topo_mu; the hot paths read
 * the three numbers they need from atomics and never take the lock. */
static pthread_mutex_t topo_mu = PTHREAD_MUTEX_INITIALIZER;
static struct topo *node_topo;
static int node_group = -1;
static _Atomic uint64_t topo_version;     /* 0: no topology */
static atomic_uint group_n = 1, group_w = 1;
static char self_addr[TOPO_ADDR_MAX + 1];   /* under topo_mu */

int node_rpc__topo_install(struct topo *t, const char *addr, char *err, size_t errlen)
{
    unsigned copy = 0;
    int g = topo_group_of(t, addr, &copy);
    if (g < 0) {
        snprintf(err, errlen, "%s lists no group with %s as a copy: set advertise "
                 "to this node's address as the topology writes it", t->origin,
                 addr);
        topo_unref(t);
        return -ENOENT;
    }
    pthread_mutex_lock(&topo_mu);
    struct topo *old = node_topo;
    node_topo = t;
    node_group = g;
    snprintf(self_addr, sizeof self_addr, "%s", addr);
    /* A member of a group that changes its copies holds writes others
     * count on too: the copies' rules apply to it (docs/REPLICATION.md). */
    atomic_store(&group_n, t->groups[g].nmembers);
    atomic_store(&group_w, t->groups[g].write_quorum);
    atomic_store(&topo_version, t->version);
    pthread_mutex_unlock(&topo_mu);
    topo_unref(old);
    const struct topo_group *gr = &t->groups[g];
    log_info("topology %s version %llu: %s %u of group %s (%u copies, write "
             "quorum %u, read quorum %u%s%s)", t->origin, (unsigned long long)t->version,
             copy < gr->ncopies ? "copy" : "member", copy + 1, gr->name, gr->ncopies,
             gr->write_quorum, gr->read_quorum,
             gr->joint == TOPO_JOINT_NONE ? "" : "; changing copies with ",
             gr->joint == TOPO_JOINT_NONE ? ""
             : gr->joint == TOPO_JOINT_NEXT ? "copies_next" : "copies_prev");
    return 0;
}

struct topo *node_rpc__topo_get(int *group)
{
    pthread_mutex_lock(&topo_mu);
    struct topo *t = topo_ref(node_topo);
    if (group)
        *group = node_group;
    pthread_mutex_unlock(&topo_mu);
    return t;
}

bool node_rpc__is_self(const char *addr)
{
    pthread_mutex_lock(&topo_mu);
    bool self = strcmp(self_addr, addr) == 0;
    pthread_mutex_unlock(&topo_mu);
    return self;
}

void node_rpc__topo_clear(void)
{
    pthread_mutex_lock(&topo_mu);
    topo_unref(node_topo);
    node_topo = NULL;
    node_group = -1;
    pthread_mutex_unlock(&topo_mu);
}

unsigned node_rpc__group_copies(void)
{
    return atomic_load(&group_n);
}

bool node_rpc__refuse_public(struct rpc_reply *r, const char *what, bool write)
{
    unsigned n = atomic_load(&group_n), w = atomic_load(&group_w);
    if (n <= 1 || (!write && w == n))
        return false;
    if (write)
        rpc_reply_error(r, GRPC_STATUS_FAILED_PRECONDITION,
                        "%s refused: in a group of %u copies, keys go through a "
                        "router (a write must reach %u copies to be acknowledged; "
                        "docs/REPLICATION.md)", what, n, w);
    else
        rpc_reply_error(r, GRPC_STATUS_FAILED_PRECONDITION,
                        "%s refused: in a group of %u copies, keys go through a "
                        "router (one copy alone may lack a write that %u others "
                        "acknowledged; docs/REPLICATION.md)", what, n, w);
    return true;
}

bool node_rpc__refuse_public_catalog(struct rpc_reply *r, const char *what)
{
    unsigned n = atomic_load(&group_n);
    if (n <= 1)
        return false;
    rpc_reply_error(r, GRPC_STATUS_FAILED_PRECONDITION,
                    "%s refused: in a group of %u copies, filters are created and "
                    "dropped through a router (every copy must hold the same "
                    "filters; docs/REPLICATION.md)", what, n);
    return true;
}

bool node_rpc__refuse_version(struct rpc_reply *r, uint64_t version)
{
    uint64_t mine = atomic_load(&topo_version);
    if (!version || !mine || version == mine)
        return false;
    rpc_reply_error(r, GRPC_STATUS_FAILED_PRECONDITION,
                    "topology version %llu, this node has %llu: reload the "
                    "routers' or the node's topology", (unsigned long long)version,
                    (unsigned long long)mine);
    return true;
}

/* ---- SYNCING shards ---- */

uint64_t node_rpc__peer_heard(const Bloomgrid__V1__ListShardsRequest *m, bool *replaced)
{
    int g = -1;
    struct topo *t = node_rpc__topo_get(&g);
    uint64_t heard = 0;

    *replaced = false;
    if (t && g >= 0 && m->copy_id) {
        const struct topo_group *grp = &t->groups[g];
        /* An address is recorded only for a member of the group, and never
         * this node's own. */
        const char *addr = NULL;
        for (unsigned k = 0; m->address && k < grp->nmembers && !addr; k++)
            if (strcmp(topo_member(grp, k), m->address) == 0 &&
                !node_rpc__is_self(m->address))
                addr = m->address;
        struct node_sync_announce a = {
            .group = m->group, .id = m->copy_id, .epoch = m->copy_epoch, .addr = addr,
            .settled = m->copy_state == BLOOMGRID__V1__COPY_STATE__COPY_STATE_REFILLING ||
                       m->copy_state == BLOOMGRID__V1__COPY_STATE__COPY_STATE_CHECKED,
        };
        heard = node_sync_peer_heard(node_rpc__sync_get(), grp->name, &a, replaced);
    }
    topo_unref(t);
    return heard;
}

int node_rpc__copy_state(void)
{
    struct node_sync *ns = node_rpc__sync_get();

    if (!ns || atomic_load(&group_n) <= 1)
        return BLOOMGRID__V1__COPY_STATE__COPY_STATE_UNSPECIFIED;
    switch (node_sync_standing(ns)) {
    case NODE_SYNC_CHECKING: return BLOOMGRID__V1__COPY_STATE__COPY_STATE_CHECKING;
    case NODE_SYNC_NEW: return BLOOMGRID__V1__COPY_STATE__COPY_STATE_NEW;
    case NODE_SYNC_REFILLING: return BLOOMGRID__V1__COPY_STATE__COPY_STATE_REFILLING;
    case NODE_SYNC_CHECKED: break;
    }
    return BLOOMGRID__V1__COPY_STATE__COPY_STATE_CHECKED;
}

static _Atomic(struct node_sync *) node_syncs;

void node_rpc__sync_set(struct node_sync *ns)
{
    atomic_store(&node_syncs, ns);
}

struct node_sync *node_rpc__sync_get(void)
{
    return atomic_load(&node_syncs);
}

bool node_rpc__shard_syncing(struct store_filter *sf)
{
    struct node_sync *ns = atomic_load(&node_syncs);
    struct shard_facts facts;

    /* One atomic load on the hot path while nothing is SYNCING. */
    if (!node_sync_any(ns) || atomic_load(&group_n) <= 1)
        return false;
    node_rpc__shard_facts(sf, &facts);
    return node_sync_is(ns, store_filter_name(sf), facts.secret_id);
}

bool node_rpc__refuse_syncing(struct store_filter *sf, struct rpc_reply *r)
{
    if (!node_rpc__shard_syncing(sf))
        return false;
    rpc_reply_error(r, GRPC_STATUS_UNAVAILABLE,
                    "shard %s is syncing: it has not yet pulled its group's pages",
                    store_filter_name(sf));
    return true;
}
