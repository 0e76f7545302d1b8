/* node_internal_rpc: the internal service (bloomgrid.v1.Internal) for
 * routers and the merger: shards by (filter, index) and operations on
 * precomputed hashes.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
#include "topo.h"

/* ---- internal service ---- */

/* isi points into ib and facts, which must outlive its packing. */
static void shard_info_fill(struct node *n, Bloomgrid__V1__InternalShardInfo *isi,
                            struct info_buf *ib, struct shard_facts *facts,
                            struct store_filter *sf, const char *filter,
                            unsigned index, bool secret)
{
    bloomgrid__v1__internal_shard_info__init(isi);
    node_rpc__info_fill(n, ib, sf, filter);
    isi->filter = ib->name;
    isi->shard_index = index;
    isi->info = &ib->fi;
    isi->hash_id = BF_HASH_XXH3_128;
    if (node_rpc__shard_facts(sf, facts) == 0) {
        isi->shard_count = facts->count;
        isi->shard_index = facts->index;
        isi->generation = store_generation(node_store(n), store_filter_name(sf),
                                           facts->secret_id);
        isi->placement = facts->placement;
        if (secret) {
            isi->secret.data = facts->secret;
            isi->secret.len = BF_SECRET_LEN;
        }
    }
}

/* Unless a router creates a new filter (new_filter), a shard created on a
 * copy of a group of N > 1 starts SYNCING (docs/REPLICATION.md): mark it
 * durably.  Returns 0, or -1 with r set. */
static int sync_before_create(struct store *s, const char *sname,
                              const Bloomgrid__V1__CreateShardRequest *m,
                              bool *marked, struct rpc_reply *r)
{
    struct node_sync *ns = node_rpc__sync_get();
    char err[NODE_SYNC_ERRLEN] = "";
    struct store_filter *old;

    if (m->new_filter || !ns || node_rpc__group_copies() <= 1)
        return 0;
    if ((old = store_get(s, sname))) {
        store_put(old);   /* store_create refuses it: nothing to mark */
        return 0;
    }
    uint64_t id = m->secret.len ? XXH3_64bits(m->secret.data, m->secret.len) : 0;
    if (node_sync_mark(ns, sname, id, err) < 0) {
        rpc_reply_error(r, GRPC_STATUS_UNAVAILABLE, "shard %s not created: "
                        "cannot record it as syncing: %s", sname, err);
        return -1;
    }
    *marked = true;
    return 0;
}

/* Tests only: BLOOMGRID_TEST_FAIL_CREATE_SHARD=P (1..100) makes P percent
 * of CreateShard calls fail with UNAVAILABLE before they create anything,
 * at random, so that tests can make a router's creation meet a copy that
 * refuses (tests/resp/test_resp_router.py).  Unset (every deployment): 0,
 * never. */
static unsigned fail_create_pct_v;
static pthread_once_t fail_create_once = PTHREAD_ONCE_INIT;

static void fail_create_read_env(void)
{
    const char *v = getenv("BLOOMGRID_TEST_FAIL_CREATE_SHARD");
    if (v && *v) {
        unsigned long p = strtoul(v, NULL, 10);
        fail_create_pct_v = p > 100 ? 100 : (unsigned)p;
        log_warn("BLOOMGRID_TEST_FAIL_CREATE_SHARD=%s: %u%% of CreateShard calls "
                 "fail (a test's fault injection)", v, fail_create_pct_v);
    }
}

static bool fail_create_now(void)
{
    static __thread unsigned seed;
    pthread_once(&fail_create_once, fail_create_read_env);
    unsigned pct = fail_create_pct_v;
    if (!pct)
        return false;
    if (!seed)
        seed = (unsigned)pthread_self() ^ (unsigned)getpid() ^ 0x9e3779b9u;
    return (unsigned)rand_r(&seed) % 100 < pct;
}

void node_rpc__h_create_shard(void *arg, const uint8_t *req, size_t len,
                           struct rpc_reply *r)
{
    struct node *n = arg;
    struct store *s = node_rpc__need_store(n, r);
    if (!s)
        return;
    if (fail_create_now()) {
        rpc_reply_error(r, GRPC_STATUS_UNAVAILABLE, "CreateShard failed on "
                        "purpose (BLOOMGRID_TEST_FAIL_CREATE_SHARD)");
        return;
    }
    UNPACK_OR_FAIL(Bloomgrid__V1__CreateShardRequest,
                   bloomgrid__v1__create_shard_request, m, req, len, r);
    struct bf_params p = {0};
    char sname[STORE_NAME_MAX + 1], err[STORE_ERRLEN] = "";
    if (node_rpc__refuse_version(r, m->topology_version) ||
        !node_rpc__public_name_ok(m->filter, r) ||
        !node_rpc__params_ok(m->capacity, m->error_rate, r) ||
        !node_rpc__kind_from_wire(m->kind, &p.kind, r))
        goto out;
    /* Counters do not OR and a retried Remove decrements twice, so copies of
     * these kinds could not converge (docs/REPLICATION.md). */
    if ((p.kind == BF_KIND_COUNTING || p.kind == BF_KIND_SCALABLE) &&
        node_rpc__group_copies() > 1) {
        rpc_reply_error(r, GRPC_STATUS_FAILED_PRECONDITION,
                        "filter \"%s\": the %s kind cannot have %u copies (its "
                        "operations are not idempotent and its pages do not "
                        "merge): create it on a group of one copy",
                        m->filter, p.kind == BF_KIND_COUNTING ? "counting" : "scalable",
                        node_rpc__group_copies());
        goto out;
    }
    if (rules_shard_name(sname, sizeof sname, m->filter, m->shard_index,
                         m->shard_count, err) < 0) {
        rpc_reply_error(r, GRPC_STATUS_INVALID_ARGUMENT, "%s", err);
        goto out;
    }
    if (rules_secret_check(m->secret.len, err) < 0) {
        rpc_reply_error(r, GRPC_STATUS_INVALID_ARGUMENT, "%s", err);
        goto out;
    }
    if (m->secret.len == 0 && m->shard_count > 1) {
        rpc_reply_error(r, GRPC_STATUS_INVALID_ARGUMENT,
                        "a sharded filter needs one secret shared by every shard");
        goto out;
    }
    if (m->secret.len == 0 && m->undrop_generation) {
        rpc_reply_error(r, GRPC_STATUS_INVALID_ARGUMENT,
                        "an undrop needs the dropped filter's secret");
        goto out;
    }
    p.capacity = m->capacity;
    p.error_rate = m->error_rate;
    p.shard_index = m->shard_index;
    p.shard_count = m->shard_count;
    p.secret = m->secret.len ? m->secret.data : NULL;
    /* Recorded, not used here: the node keeps any version a router may
     * know, so a newer router's filter survives on this node. */
    if (m->placement > TOPO_PLACEMENT_LIMIT) {
        rpc_reply_error(r, GRPC_STATUS_INVALID_ARGUMENT, "placement version %u "
                        "is above %u", m->placement, TOPO_PLACEMENT_LIMIT);
        goto out;
    }
    p.placement = m->placement;
    bf_params_default(&p);
    if (!node_rpc__create_begin(s, m->filter, m->shard_index, m->shard_count, r))
        goto out;
    /* Marked before it exists, so a crash between the two never leaves a
     * shard that answers reads it cannot vouch for. */
    bool marked = false;
    int rc = sync_before_create(s, sname, m, &marked, r);
    if (rc < 0) {
        node_rpc__create_end();
        goto out;
    }
    uint64_t gen = 0;
    if (m->undrop_generation) {
        /* Undo a drop (docs/REPLICATION.md, "Undoing a drop"). */
        char label[STORE_NAME_MAX + 48];
        snprintf(label, sizeof label, "shard %u of filter \"%s\"", m->shard_index,
                 m->filter);
        rc = node_rpc__undrop(s, sname, label, &p, m->undrop_generation, &gen, r);
    } else if ((rc = store_create(s, sname, &p, err)) < 0) {
        node_rpc__store_error(r, NULL, sname, rc, err);
    }
    node_rpc__create_end();
    if (rc < 0) {
        if (marked)
            node_sync_clear(node_rpc__sync_get(), sname, 0, NULL);
        goto out;
    }
    if (m->new_filter)
        node_sync_clear(node_rpc__sync_get(), sname, 0, NULL);
    if (gen)
        log_info("undropped shard %u/%u of filter %s: generation %" PRIu64,
                 m->shard_index, m->shard_count, m->filter, gen);
    else
        log_info("created shard %u/%u of filter %s", m->shard_index,
                 m->shard_count, m->filter);
    struct store_filter *sf = store_get(s, sname);
    if (!sf) {
        rpc_reply_error(r, GRPC_STATUS_NOT_FOUND, "shard dropped during creation");
        goto out;
    }
    Bloomgrid__V1__InternalShardInfo isi;
    struct info_buf ib;
    struct shard_facts facts;
    shard_info_fill(n, &isi, &ib, &facts, sf, m->filter, m->shard_index, false);
    rpc_reply_pack(r, &isi.base);
    store_put(sf);
out:
    bloomgrid__v1__create_shard_request__free_unpacked(m, NULL);
}

/* Has the shard taken anything: an add that set a bit, a key counted, or
 * any bit set at all (bits that came by copy-to-copy sync or a merge of
 * pages carry no counts). */
static void count_inserts(const struct bf *f, void *ctx)
{
    uint64_t any = bf_insert_count(f) | (bf_keys_added(f) != 0);
    for (uint32_t i = 0; !any && i < bf_layer_count(f); i++) {
        struct bf_layer_info li;
        const uint64_t *w = bf_layer_body_const(f, i);
        if (bf_layer_info(f, i, &li) < 0 || !w)
            continue;
        for (uint64_t j = 0; !any && j < li.body_bytes / 8; j++)
            any = w[j] != 0;
    }
    *(uint64_t *)ctx = any;
}

void node_rpc__h_drop_shard(void *arg, const uint8_t *req, size_t len,
                         struct rpc_reply *r)
{
    struct node *n = arg;
    struct store *s = node_rpc__need_store(n, r);
    if (!s)
        return;
    UNPACK_OR_FAIL(Bloomgrid__V1__ShardRef, bloomgrid__v1__shard_ref, m, req, len, r);
    struct store_filter *sf = NULL;
    struct shard_facts facts;
    char err[STORE_ERRLEN] = "";
    if (node_rpc__refuse_version(r, m->topology_version) ||
        !(sf = node_rpc__get_shard(s, m->filter, m->shard_index, r)))
        goto out;
    /* A shard still being created (its first snapshot is written) is
     * waited for, a bounded while, so a rollback can check its secret. */
    for (int i = 0; m->secret_id && i < 500 &&
                    store_filter_state(sf, NULL) == STORE_RECOVERING; i++)
        usleep(10000);
    if (m->secret_id && node_rpc__shard_facts(sf, &facts) < 0) {
        rpc_reply_error(r, GRPC_STATUS_UNAVAILABLE,
                        "shard %u of filter \"%s\" is not serving, so its "
                        "secret cannot be checked: not dropped",
                        m->shard_index, m->filter);
        goto out;
    }
    if (m->secret_id && facts.secret_id != m->secret_id) {
        rpc_reply_fail(r, GRPC_STATUS_FAILED_PRECONDITION, RPC_REASON_SECRET_MISMATCH,
                        "shard %u of filter \"%s\" has another secret than "
                        "the one named (another call created it): not dropped",
                        m->shard_index, m->filter);
        goto out;
    }
    if (m->generation && m->secret_id &&
        store_generation(s, store_filter_name(sf), facts.secret_id) < m->generation) {
        rpc_reply_fail(r, GRPC_STATUS_FAILED_PRECONDITION, RPC_REASON_SECRET_MISMATCH,
                       "shard %u of filter \"%s\" is of a generation before "
                       "%" PRIu64 " (it was here before that undrop): not "
                       "dropped", m->shard_index, m->filter, m->generation);
        goto out;
    }
    if (m->only_unwritten) {
        uint64_t inserts = 0;
        if (store_filter_read(sf, count_inserts, &inserts) < 0 || inserts) {
            rpc_reply_error(r, GRPC_STATUS_FAILED_PRECONDITION,
                            "shard %u of filter \"%s\" has taken keys (or cannot "
                            "be read): not dropped", m->shard_index, m->filter);
            goto out;
        }
    }
    if (!m->secret_id)
        node_rpc__shard_facts(sf, &facts);
    int rc = store_drop_handle(s, sf, err);
    if (rc < 0) {
        node_rpc__store_error(r, NULL, store_filter_name(sf), rc, err);
    } else {
        node_sync_forget(node_rpc__sync_get(), store_filter_name(sf),
                         facts.secret_id);
        log_info("dropped shard %u of filter %s", m->shard_index, m->filter);
        Bloomgrid__V1__DropShardResponse resp =
            BLOOMGRID__V1__DROP_SHARD_RESPONSE__INIT;
        rpc_reply_pack(r, &resp.base);
    }
out:
    if (sf)
        store_put(sf);
    bloomgrid__v1__shard_ref__free_unpacked(m, NULL);
}

void node_rpc__h_get_shard(void *arg, const uint8_t *req, size_t len,
                        struct rpc_reply *r)
{
    struct node *n = arg;
    struct store *s = node_rpc__need_store(n, r);
    if (!s)
        return;
    UNPACK_OR_FAIL(Bloomgrid__V1__GetShardRequest, bloomgrid__v1__get_shard_request,
                   m, req, len, r);
    struct store_filter *sf = node_rpc__refuse_version(r, m->topology_version)
                                  ? NULL
                                  : node_rpc__get_shard(s, m->filter, m->shard_index, r);
    if (sf) {
        Bloomgrid__V1__InternalShardInfo isi;
        struct info_buf ib;
        struct shard_facts facts;
        shard_info_fill(n, &isi, &ib, &facts, sf, m->filter, m->shard_index,
                        m->include_secret);
        /* A caller that would place the other shards by a rule older than
         * the filter's gets no secret: it would ask groups that do not
         * hold them and take their NOT_FOUND for "no such filter". */
        uint32_t known = topo_placement_norm(m->placement_known);
        if (m->include_secret && topo_placement_norm(facts.placement) > known)
            rpc_reply_fail(r, GRPC_STATUS_FAILED_PRECONDITION,
                           RPC_REASON_PLACEMENT_UNKNOWN, "filter \"%s\" places its "
                           "shards by placement version %u; the caller knows "
                           "versions 1 to %u: upgrade it (docs/TOPOLOGY.md, "
                           "\"Placement versions\")", m->filter,
                           topo_placement_norm(facts.placement), known);
        else
            rpc_reply_pack(r, &isi.base);
        store_put(sf);
    }
    bloomgrid__v1__get_shard_request__free_unpacked(m, NULL);
}

void node_rpc__h_list_shards(void *arg, const uint8_t *req, size_t len,
                          struct rpc_reply *r)
{
    struct node *n = arg;
    struct store *s = node_rpc__need_store(n, r);
    if (!s)
        return;
    UNPACK_OR_FAIL(Bloomgrid__V1__ListShardsRequest,
                   bloomgrid__v1__list_shards_request, m, req, len, r);
    bool refused = node_rpc__refuse_version(r, m->topology_version), replaced = false;
    uint64_t heard = refused ? 0 : node_rpc__peer_heard(m, &replaced);
    bloomgrid__v1__list_shards_request__free_unpacked(m, NULL);
    if (refused)
        return;
    char **names = NULL;
    size_t nn = 0;
    if (store_list(s, &names, &nn) < 0) {
        rpc_reply_error(r, GRPC_STATUS_UNAVAILABLE, "cannot list the shards");
        return;
    }
    struct info_buf *ibs = calloc(nn ? nn : 1, sizeof *ibs);
    Bloomgrid__V1__InternalShardInfo *isis = calloc(nn ? nn : 1, sizeof *isis);
    Bloomgrid__V1__InternalShardInfo **ptrs = calloc(nn ? nn : 1, sizeof *ptrs);
    size_t k = 0;
    if (!ibs || !isis || !ptrs) {
        rpc_reply_error(r, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < nn; i++) {
        char filter[STORE_NAME_MAX + 1];
        unsigned index;
        rules_shard_split(names[i], filter, sizeof filter, &index);
        struct store_filter *sf = store_get(s, names[i]);
        if (!sf)
            continue;
        struct shard_facts facts;
        shard_info_fill(n, &isis[k], &ibs[k], &facts, sf, filter, index, false);
        ibs[k].fi.shard_info = &ibs[k].sip;
        isis[k].info = &ibs[k].fi;
        isis[k].filter = ibs[k].name;
        ptrs[k] = &isis[k];
        store_put(sf);
        k++;
    }
    Bloomgrid__V1__ListShardsResponse resp = BLOOMGRID__V1__LIST_SHARDS_RESPONSE__INIT;
    resp.n_shards = k;
    resp.shards = ptrs;
    resp.heard_epoch = heard;
    resp.replaced = replaced;
    resp.copy_state = (Bloomgrid__V1__CopyState)node_rpc__copy_state();
    rpc_reply_pack(r, &resp.base);
out:
    free(ptrs);
    free(isis);
    free(ibs);
    store_list_free(names, nn);
}

static void hashes_call(struct node *n, enum key_op op, const uint8_t *req,
                        size_t len, struct rpc_reply *r)
{
    struct store *s = node_rpc__need_store(n, r);
    if (!s)
        return;
    UNPACK_OR_FAIL(Bloomgrid__V1__HashesRequest, bloomgrid__v1__hashes_request, m,
                   req, len, r);
    struct scratch *sc = node_rpc__thread_scratch();
    size_t cnt = m->hashes.len / NODE_CLIENT_HASH_LEN;
    uint64_t version = 0;
    if (!sc) {
        rpc_reply_error(r, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    if (node_rpc__refuse_version(r, m->topology_version))
        goto out;
    if (m->hashes.len % NODE_CLIENT_HASH_LEN) {
        rpc_reply_error(r, GRPC_STATUS_INVALID_ARGUMENT,
                        "hashes is %zu bytes: not a multiple of %d", m->hashes.len,
                        NODE_CLIENT_HASH_LEN);
        goto out;
    }
    if (cnt > n->cfg.max_batch_keys) {
        rpc_reply_error(r, GRPC_STATUS_RESOURCE_EXHAUSTED,
                        "%zu hashes in one batch; the limit is %llu (max_batch_keys)",
                        cnt, (unsigned long long)n->cfg.max_batch_keys);
        goto out;
    }
    if (node_rpc__scratch_reserve(sc, cnt ? cnt : 1) < 0) {
        rpc_reply_error(r, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    if (node_rpc__shard_hashes(s, op, m->filter, m->shard_index, m->hashes.data,
                               cnt, m->check_shard, m->secret_id, sc->hashes,
                               sc->out, &version, r) < 0)
        goto out;
    node_rpc__encode_bools(r, sc->out, cnt, true, version);
out:
    bloomgrid__v1__hashes_request__free_unpacked(m, NULL);
}

void node_rpc__h_add_hashes(void *arg, const uint8_t *req, size_t len,
                         struct rpc_reply *r)
{
    hashes_call(arg, OP_ADD, req, len, r);
}

void node_rpc__h_may_contain_hashes(void *arg, const uint8_t *req, size_t len,
                                 struct rpc_reply *r)
{
    hashes_call(arg, OP_MAY_CONTAIN, req, len, r);
}

void node_rpc__h_remove_hashes(void *arg, const uint8_t *req, size_t len,
                            struct rpc_reply *r)
{
    hashes_call(arg, OP_REMOVE, req, len, r);
}


void node_rpc__h_node_info(void *arg, const uint8_t *req, size_t len,
                           struct rpc_reply *r)
{
    struct node *n = arg;
    UNPACK_OR_FAIL(Bloomgrid__V1__NodeInfoRequest, bloomgrid__v1__node_info_request,
                   m, req, len, r);
    Bloomgrid__V1__NodeInfoResponse resp = BLOOMGRID__V1__NODE_INFO_RESPONSE__INIT;
    node_rpc__batch_counters(&resp);
    /* The budgets a router checks a new filter against; while the store
     * opens only the bounds are known. */
    struct store *s = node_store(n);
    struct store_budget b = {.max_memory_bytes = n->cfg.max_memory_mb << 20,
                             .max_filters = n->cfg.max_filters};
    if (s)
        store_budget(s, &b);
    resp.max_memory_bytes = b.max_memory_bytes;
    resp.charged_bytes = b.charged_bytes;
    resp.max_filters = b.max_filters;
    resp.filters = b.filters;
    rpc_reply_pack(r, &resp.base);
    bloomgrid__v1__node_info_request__free_unpacked(m, NULL);
}

/* ---- Resync (docs/REPLICATION.md, "Accepting a loss") ---- */

/* The answer, on the anti-entropy thread: ctx is the deferred call. */
static void resync_done(void *ctx, const struct node_resync_result *res)
{
    struct rpc_deferred *d = ctx;
    struct rpc_reply *r = rpc_deferred_reply(d);

    if (res->code != GRPC_STATUS_OK) {
        rpc_reply_error(r, (grpc_status_code)res->code, "%s", res->message);
    } else {
        Bloomgrid__V1__ResyncResponse resp = BLOOMGRID__V1__RESYNC_RESPONSE__INIT;
        char *used[16], *down[16], *fails[NODE_RESYNC_FAILURES_MAX + 1], more[96];
        resp.group = (char *)res->group;
        resp.copy = (char *)res->copy;
        for (unsigned i = 0; i < res->nused; i++)
            used[i] = (char *)res->used[i];
        for (unsigned i = 0; i < res->nunreachable; i++)
            down[i] = (char *)res->unreachable[i];
        size_t nf = 0;
        for (; nf < res->nfailures && nf < NODE_RESYNC_FAILURES_MAX; nf++)
            fails[nf] = (char *)res->failures[nf];
        if (res->nfailures > nf) {
            snprintf(more, sizeof more, "and %u more failures (the node's log has "
                     "them)", res->nfailures - (unsigned)nf);
            fails[nf++] = more;
        }
        resp.n_used = res->nused;
        resp.used = used;
        resp.n_unreachable = res->nunreachable;
        resp.unreachable = down;
        resp.n_failures = nf;
        resp.failures = fails;
        resp.shards = res->shards;
        resp.created = res->created;
        resp.left_syncing = res->left_syncing;
        resp.pages = res->pages;
        resp.bytes = res->bytes;
        if (rpc_reply_pack(r, &resp.base) < 0)
            rpc_reply_error(r, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    }
    rpc_deferred_finish(d);
}

void node_rpc__h_resync(void *arg, const uint8_t *req, size_t len, struct rpc_reply *r)
{
    struct node *n = arg;
    if (!node_rpc__need_store(n, r))
        return;
    UNPACK_OR_FAIL(Bloomgrid__V1__ResyncRequest, bloomgrid__v1__resync_request, m, req,
                   len, r);
    bool accept = m->accept_loss;
    uint64_t version = m->topology_version;
    bloomgrid__v1__resync_request__free_unpacked(m, NULL);
    if (node_rpc__refuse_version(r, version))
        return;
    if (!accept) {
        rpc_reply_error(r, GRPC_STATUS_FAILED_PRECONDITION,
                        "Resync refused: accept_loss is not set.  A resync makes this "
                        "copy serve what the reachable copies of its group hold: keys "
                        "acknowledged only on copies that lost their data are gone "
                        "for good (docs/REPLICATION.md, \"Accepting a loss\")");
        return;
    }
    struct node_replicate *repl = atomic_load(&n->repl);
    if (node_rpc__group_copies() <= 1 || !repl) {
        rpc_reply_error(r, GRPC_STATUS_FAILED_PRECONDITION,
                        "Resync refused: this node is not a copy of a group of several "
                        "copies: there is nothing to resync from");
        return;
    }
    struct rpc_deferred *d = rpc_reply_defer(r);
    if (!d)
        return;
    if (node_replicate_resync(repl, version, resync_done, d) < 0) {
        rpc_reply_error(rpc_deferred_reply(d), GRPC_STATUS_ABORTED,
                        "a resync already runs on this node: wait for its answer");
        rpc_deferred_finish(d);
    }
}
