/* node_resync: an operator's way out of a group that lost more copies than
 * it can vouch for (docs/REPLICATION.md, "Accepting a loss"; the internal
 * Resync, `bloomgrid resync --accept-loss`).
 *
 * A copy leaves SYNCING after full pulls from N - W + 1 copies that are
 * not SYNCING.  When more than N - W copies of a group lost their data
 * directories, fewer than that are left, and the group refuses reads for
 * good: keys acknowledged only on the lost copies may be gone, and no rule
 * can tell which.  Resync is the operator saying so.  On the replicate
 * thread (the rounds wait meanwhile), it
 *   1. lists the shards of every other member of the group (copies and a
 *      joint phase's other set); a member that does not answer
 *      (UNAVAILABLE, DEADLINE_EXCEEDED) is not used, one that answers with
 *      another error stops the resync before anything changed;
 *   2. creates, SYNCING, the shards those members list and this node lacks
 *      (not the ones dropped here);
 *   3. makes a full pull of every shard held here from every member that
 *      answered, SYNCING ones included (pulls only add bits);
 *   4. takes off SYNCING each shard whose pulls all succeeded, and, when
 *      every pull and create did, lifts the node's holds (new, refilling,
 *      its epoch check): it serves what the reachable members held.
 * It logs which members it used and which it could not reach.  A shard
 * whose pull failed stays SYNCING and the node stays held: running it
 * again is safe.  The other SYNCING copies of the group then leave SYNCING
 * by the usual rule once enough copies are in sync again, or by a Resync
 * of their own.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/status.h>

#include "log.h"
#include "node.h"
#include "node_client.h"
#include "node_rpc.h"
#include "rpc_client.h"
#include "rules.h"
#include "store.h"
#include "topo.h"

#include "bloomgrid/v1/internal.pb-c.h"

#include "node_replicate_int.h"

#define FAIL_LEN (NODE_RESYNC_MSGLEN)

static void failure(struct node_resync_result *res, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void failure(struct node_resync_result *res, const char *fmt, ...)
{
    va_list ap;

    if (res->nfailures < NODE_RESYNC_FAILURES_MAX) {
        va_start(ap, fmt);
        vsnprintf(res->failures[res->nfailures], FAIL_LEN, fmt, ap);
        va_end(ap);
        log_warn("resync: %s", res->failures[res->nfailures]);
    }
    res->nfailures++;
}

static void refuse(struct node_resync_result *res, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void refuse(struct node_resync_result *res, int code, const char *fmt, ...)
{
    va_list ap;

    res->code = code;
    va_start(ap, fmt);
    vsnprintf(res->message, sizeof res->message, fmt, ap);
    va_end(ap);
    log_warn("resync refused: %s", res->message);
}

/* "a, b, c" of n addresses, or "none". */
static void addr_list(char *out, size_t len, char (*v)[128], unsigned n)
{
    size_t at = 0;

    out[0] = 0;
    for (unsigned i = 0; i < n && at < len; i++)
        at += (size_t)snprintf(out + at, len - at, "%s%s", i ? ", " : "", v[i]);
    if (!n)
        snprintf(out, len, "none");
}

/* Step 1: ListShards of every other member.  lists[k] is the answer of
 * res->used[k].  Returns false when the resync stops here (res says why). */
static bool list_members(struct node_replicate *r, const struct topo *t,
                         const struct topo_group *grp,
                         Bloomgrid__V1__ListShardsResponse **lists,
                         struct node_resync_result *res)
{
    for (unsigned m = 0; m < grp->nmembers && m < TOPO_MAX_COPIES; m++) {
        const char *addr = topo_member(grp, m);
        Bloomgrid__V1__ListShardsResponse *resp = NULL;
        struct rpc_status st = {0};
        struct rpc_channel *ch;

        if (node_rpc__is_self(addr))
            continue;
        if (!(ch = repl__peer_channel(r, addr))) {
            refuse(res, GRPC_STATUS_RESOURCE_EXHAUSTED, "no channel to member %s "
                   "(out of memory): nothing changed", addr);
            return false;
        }
        if (node_client_list_shards(ch, t->version, NULL, &resp, REPL_LIST_TIMEOUT_MS,
                                    &st) == 0) {
            lists[res->nused] = resp;
            snprintf(res->used[res->nused++], sizeof res->used[0], "%s", addr);
        } else if (st.code == GRPC_STATUS_UNAVAILABLE ||
                   st.code == GRPC_STATUS_DEADLINE_EXCEEDED) {
            snprintf(res->unreachable[res->nunreachable++], sizeof res->unreachable[0],
                     "%s", addr);
        } else {
            refuse(res, GRPC_STATUS_FAILED_PRECONDITION, "member %s of group %s "
                   "answered the listing with %s: %s; nothing changed (set it "
                   "right, or stop it, and run the resync again)", addr, grp->name,
                   rpc_status_name(st.code), st.message);
            return false;
        }
    }
    if (!res->nused) {
        char down[1200];
        addr_list(down, sizeof down, res->unreachable, res->nunreachable);
        refuse(res, GRPC_STATUS_UNAVAILABLE, "no other member of group %s answered "
               "(%s): nothing to pull from, nothing changed; start them (a copy "
               "that lost its disk may come back empty) and run the resync again",
               grp->name, down);
        return false;
    }
    return true;
}

/* Step 2: create the shards the members list and this node lacks. */
static void create_missing(struct node_replicate *r, Bloomgrid__V1__ListShardsResponse **lists,
                           struct node_resync_result *res)
{
    struct store *s = node_store(r->n);

    for (unsigned k = 0; k < res->nused && !atomic_load(&r->n->stopping); k++) {
        const Bloomgrid__V1__ListShardsResponse *resp = lists[k];
        for (size_t i = 0; i < resp->n_shards; i++) {
            const Bloomgrid__V1__InternalShardInfo *isi = resp->shards[i];
            char sname[STORE_NAME_MAX + 1], why[NODE_RESYNC_MSGLEN];
            struct store_filter *sf;
            if (!isi->filter ||
                rules_shard_name(sname, sizeof sname, isi->filter, isi->shard_index,
                                 isi->shard_count ? isi->shard_count : 1, NULL) < 0)
                continue;
            if ((sf = store_get(s, sname))) {
                store_put(sf);
                continue;
            }
            const char *fp = isi->info && isi->info->fingerprint ? isi->info->fingerprint
                                                                 : NULL;
            if (fp && fp[0] && store_dropped(s, sname, 0, fp))
                continue;
            int rc = repl__create_shard(r->n, repl__peer_channel(r, res->used[k]),
                                        res->used[k], isi->filter, isi->shard_index,
                                        sname, why, sizeof why);
            if (rc == 0)
                res->created++;
            else if (rc < 0)
                failure(res, "shard %s from %s: not created: %s", sname, res->used[k],
                        why);
        }
    }
}

/* Step 3 and 4 for one shard: a full pull from every member used, then off
 * SYNCING when they all succeeded. */
static void resync_shard(struct node_replicate *r, struct store_filter *sf,
                         uint64_t topo_version, struct node_resync_result *res)
{
    const char *name = store_filter_name(sf);
    char why[NODE_RESYNC_MSGLEN], err[NODE_SYNC_ERRLEN] = "";
    struct node_sync *ns = node_rpc__sync_get();
    struct shard_facts facts;
    bool ok = true;

    res->shards++;
    for (unsigned k = 0; k < res->nused; k++) {
        size_t pages = 0;
        uint64_t bytes = 0;
        if (atomic_load(&r->n->stopping)) {
            failure(res, "shard %s: the node is stopping", name);
            return;
        }
        int rc = repl__pull_full(repl__peer_channel(r, res->used[k]), res->used[k], sf,
                                 topo_version, &pages, &bytes, why, sizeof why);
        if (rc < 0) {
            failure(res, "shard %s from %s: %s", name, res->used[k], why);
            ok = false;
        }
        res->pages += pages;
        res->bytes += bytes;
    }
    if (!ok || node_rpc__shard_facts(sf, &facts) < 0 ||
        !node_sync_listed(ns, name, facts.secret_id))
        return;
    if (node_sync_clear(ns, name, facts.secret_id, err) < 0)
        failure(res, "shard %s: pulled, but still SYNCING: %s", name, err);
    else
        res->left_syncing++;
}

/* The whole of it, under topology t (res->code OK unless refused). */
static void resync(struct node_replicate *r, const struct topo *t, const struct topo_group *grp,
                   struct node_resync_result *res)
{
    Bloomgrid__V1__ListShardsResponse *lists[TOPO_MAX_COPIES] = {NULL};
    struct node_sync *ns = node_rpc__sync_get();
    struct store *s = node_store(r->n);
    char used[1200], down[1200], err[NODE_SYNC_ERRLEN] = "";
    char **names = NULL;
    size_t nn = 0;

    if (!list_members(r, t, grp, lists, res))
        goto out;
    addr_list(used, sizeof used, res->used, res->nused);
    addr_list(down, sizeof down, res->unreachable, res->nunreachable);
    log_warn("resync of this copy of group %s, loss accepted: pulling every shard from "
             "%s (SYNCING ones included); not reachable, not used: %s", grp->name,
             used, down);
    create_missing(r, lists, res);
    if (store_list(s, &names, &nn) < 0) {
        failure(res, "cannot list this node's shards (out of memory)");
        goto out;
    }
    for (size_t i = 0; i < nn && !atomic_load(&r->n->stopping); i++) {
        struct store_filter *sf = store_get(s, names[i]);
        if (!sf)
            continue;
        resync_shard(r, sf, t->version, res);
        store_put(sf);
    }
    store_list_free(names, nn);
    if (atomic_load(&r->n->stopping))
        failure(res, "the node is stopping: the resync was cut short");
    if (res->nfailures) {
        log_warn("resync of group %s: %u shards took off SYNCING, %u failures: those "
                 "shards stay SYNCING and the copy stays held (run it again)",
                 grp->name, res->left_syncing, res->nfailures);
        goto out;
    }
    if (node_sync_whole_set(ns, NODE_SYNC_WHOLE_NONE, err) < 0) {
        failure(res, "every shard pulled, but the copy stays held: %s", err);
        goto out;
    }
    node_sync_hold(ns, NODE_SYNC_HOLD_EPOCH, false);
    r->verified = true;
    log_warn("resync of group %s done, loss accepted: %u shards (%u created here) "
             "pulled from %s, %u taken off SYNCING; keys acknowledged only on "
             "copies that lost their data are gone", grp->name, res->shards,
             res->created, used, res->left_syncing);
out:
    for (unsigned k = 0; k < TOPO_MAX_COPIES; k++)
        if (lists[k])
            protobuf_c_message_free_unpacked(&lists[k]->base, NULL);
}

void repl__resync_run(struct node_replicate *r, bool stopping)
{
    static struct node_resync_result nomem = {
        .code = GRPC_STATUS_RESOURCE_EXHAUSTED,
        .message = "out of memory: nothing changed"};

    pthread_mutex_lock(&r->mu);
    bool queued = r->resync_queued;
    uint64_t version = r->resync_version;
    node_resync_done done = r->resync_done;
    void *ctx = r->resync_ctx;
    pthread_mutex_unlock(&r->mu);
    if (!queued)
        return;
    struct node_resync_result *res = calloc(1, sizeof *res);
    int g = -1;
    struct topo *t = node_rpc__topo_get(&g);
    if (!res) {
        done(ctx, &nomem);
    } else if (stopping) {
        refuse(res, GRPC_STATUS_UNAVAILABLE, "the node is stopping: nothing changed");
    } else if (!t || g < 0 || t->groups[g].nmembers < 2) {
        refuse(res, GRPC_STATUS_FAILED_PRECONDITION, "this node is not a copy of a "
               "group of several copies: there is nothing to resync from");
    } else if (version && version != t->version) {
        refuse(res, GRPC_STATUS_FAILED_PRECONDITION, "topology version %" PRIu64
               ", this node has %" PRIu64 ": reload the topology", version, t->version);
    } else if (!node_store(r->n) || !node_rpc__sync_get()) {
        refuse(res, GRPC_STATUS_UNAVAILABLE, "the data directory is still being "
               "opened: run the resync again in a moment");
    } else {
        const struct topo_group *grp = &t->groups[g];
        snprintf(res->group, sizeof res->group, "%s", grp->name);
        for (unsigned m = 0; m < grp->nmembers; m++)
            if (node_rpc__is_self(topo_member(grp, m)))
                snprintf(res->copy, sizeof res->copy, "%s", topo_member(grp, m));
        resync(r, t, grp, res);
    }
    if (res)
        done(ctx, res);
    free(res);
    topo_unref(t);
    pthread_mutex_lock(&r->mu);
    r->resync_queued = false;
    pthread_mutex_unlock(&r->mu);
}
