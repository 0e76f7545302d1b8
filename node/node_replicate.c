/* node_replicate: anti-entropy between the copies of a shard group
 * (setting topology; docs/REPLICATION.md).
 *
 * One thread wakes every replicate_interval_ms and has, for each other
 * copy of its group, that copy's puller (one thread per peer, made with
 * its channel) call PullPages for each blocked or classic shard this node
 * holds, with the epoch and version it got last from that copy (0 at
 * first, so the first pull after a start, or after the peer restarted
 * with a new epoch, ships every non-empty page): one cursor per peer and
 * shard.  The pull carries the hashes of this copy's pages
 * (store_pages_hashes), and the peer skips the pages that hash the same:
 * copies that took the same writes ship little; the merge of what came
 * (none included) returns once the bits here are durable.  The pages of a
 * pull are checked by their checksums
 * (node_client) and buffered; only when the whole pull succeeded and its
 * fingerprint is the shard's are they ORed in with store_pages_merge (the
 * durable path PushPages takes).  Nothing a peer claims is kept: no
 * version is reported from a pull, so a pull can only add bits.  A failed
 * pull changes nothing and is retried at the next wake-up; failures are
 * logged once per change of state.  A peer without the shard (NOT_FOUND) is
 * passed over.
 *
 * A peer that is down or hung (stopped, its port still open) must not hold
 * back the others: each round first asks every peer's health at once, with
 * a short deadline (REPL_PROBE_TIMEOUT_MS), and lists and pulls only from
 * those that answered; the pullers run side by side, so a peer that hangs
 * in the middle of a pull costs its own puller the pull's deadline and no
 * other peer anything; a puller still busy when a round starts is passed
 * over, and its pass ends at its first pull that finds the peer down.
 * Channels, pullers and cursors are dropped once their peer has left the
 * group (a topology reloaded by SIGHUP) or their shard is gone, so their
 * number follows the topology and the shards held.
 *
 * SYNCING shards (node_sync.h): each pull of a SYNCING shard from a peer
 * is a full one (since 0) until one succeeded that started after the shard
 * took writes and whose peer said it is not SYNCING itself; once N - W + 1
 * peers gave one, the shard leaves SYNCING (docs/REPLICATION.md says why
 * that number and that order).  Shards a peer holds and this node lacks
 * (ListShards, then GetShard with the secret) are created here SYNCING and
 * filled the same way, once a shard has been missing for
 * REPL_RECREATE_DELAY_MS (a router's CreateFilter reaches the copies one by
 * one) and unless it was dropped here: the store's durable tombstones, and
 * drops since start (repl_tombstoned).  A peer's shard undropped after the
 * drop here (a higher generation than the tombstone's) lifts the tombstone
 * and is re-created the same way; a live shard takes a peer's higher
 * generation of the same fingerprint (docs/REPLICATION.md, "Undoing a
 * drop").
 *
 * While the group changes its copies (copies_next or copies_prev), every
 * member is pulled from, but only full pulls from the group's copies
 * count towards leaving SYNCING (each version a member can meet needs W of
 * those copies for a write: docs/REPLICATION.md), and pulls carry the
 * topology version, so a peer under another version is not counted.  A
 * member that is not one of the copies (it joins) is held (reads refused,
 * NOT_SERVING) until N - W + 1 copies listed no shard it lacks and none of
 * its own is SYNCING: its health says when it may become a copy.
 *
 * Restored copies (node_sync.h, docs/REPLICATION.md): each listing
 * announces this directory's copy id and epoch to the copies, which answer
 * with the highest epoch of that id they heard before.  The epoch is bumped
 * (durably, then announced) every REPL_LIST_EVERY_MS and at a clean stop.
 * A peer's first answer since the start above the epoch the directory had
 * at the start (later ones: above the current epoch) means this node runs
 * on an older copy of its directory: every shard becomes SYNCING and the
 * epoch moves past what was heard.  Until the first answers of N - W + 1
 * copies are in, the node is held.
 *
 * Re-created copies (docs/REPLICATION.md): a listing also announces this
 * node's address and where it stands (ListShardsRequest.copy_state), and
 * the answer says where the peer stands and whether it recorded another
 * copy id at this node's address.  A node that started on an empty store
 * is new (node_sync_whole_get): held until N - W + 1 copies that are not
 * refilling listed nothing it lacks in one round (a new group: it serves),
 * or refilling as soon as a shard of its copies has been missing here for
 * REPL_RECREATE_DELAY_MS or a copy recorded another copy at its address.
 * A node not yet checked that hears the latter draws a new copy id and
 * marks every shard SYNCING.  A refilling node lists its copies every
 * round and serves again once N - W + 1 copies that are not refilling list
 * nothing it lacks and none of its shards is SYNCING (whole_decide).
 *
 * An operator's Resync (node_resync.c) runs on this thread between rounds.
 *
 * Queries never wait for these threads: they hold no lock of their own
 * across a call (mu guards the cursors and the pullers' work; it may be
 * held while taking a store lock, never the reverse), and the store's
 * locks only for the OR itself.
 *
 * The pullers, their cursors and the probes are in node_replicate_pull.c;
 * node_replicate_int.h is what the two files share.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <xxhash.h>

#include "bf.h"
#include "log.h"
#include "node.h"
#include "node_client.h"
#include "node_rpc.h"
#include "quorum.h"
#include "rpc_client.h"
#include "rules.h"
#include "store.h"
#include "topo.h"

#include "bloomgrid/v1/internal.pb-c.h"

#include "node_replicate_int.h"

/* When shard sf was marked SYNCING (node_sync_since), 0 when it is not
 * listed (a hold alone does not make pulls full). */
uint64_t repl__shard_listed(struct store_filter *sf)
{
    struct node_sync *ns = node_rpc__sync_get();
    struct shard_facts facts;

    if (!ns || node_sync_count(ns) == 0 || node_rpc__shard_facts(sf, &facts) < 0 ||
        !node_sync_listed(ns, store_filter_name(sf), facts.secret_id))
        return 0;
    return node_sync_since(ns, store_filter_name(sf));
}

/* Is addr one of grp's copies (not only a member of its other set)? */
static bool is_copy(const struct topo_group *grp, const char *addr)
{
    for (unsigned c = 0; c < grp->ncopies; c++)
        if (strcmp(grp->copies[c], addr) == 0)
            return true;
    return false;
}

/* How many copies other than this node answer for the group: N - W + 1,
 * or every other copy when there are fewer (W = 1). */
unsigned repl__copies_needed(const struct topo_group *grp)
{
    unsigned others = 0;
    for (unsigned c = 0; c < grp->ncopies; c++)
        others += !node_rpc__is_self(grp->copies[c]);
    return quorum_sync_need(grp, others);
}

/* Has the shard left SYNCING?  It has when full pulls (full_ms) from
 * N - W + 1 of the group's copies succeeded for the shard object sf since
 * it was marked. */
static void sync_check(struct node_replicate *r, struct store_filter *sf,
                       const struct topo_group *grp)
{
    const char *name = store_filter_name(sf);
    char err[NODE_SYNC_ERRLEN] = "";
    unsigned got = 0;
    struct shard_facts facts;

    uint64_t since = repl__shard_listed(sf);
    if (!since)
        return;
    pthread_mutex_lock(&r->mu);
    for (struct repl_shard *rs = r->shards; rs; rs = rs->next)
        if (rs->sf_id == (const void *)sf && rs->full_ms >= since &&
            !strcmp(rs->name, name) && is_copy(grp, rs->peer))
            got++;
    pthread_mutex_unlock(&r->mu);
    if (!quorum_shard_sync_met(grp, got) || node_rpc__shard_facts(sf, &facts) < 0)
        return;
    if (node_sync_clear(node_rpc__sync_get(), name, facts.secret_id, err) < 0)
        log_warn("shard %s filled but still SYNCING: %s", name, err);
    else
        log_info("shard %s left SYNCING: every page pulled from %u copies "
                 "that are not syncing", name, got);
}

/* Is (store name, secret id) a dropped shard that a peer's shard of
 * generation gen must not bring back?  A durable tombstone decides: only a
 * later undrop (a higher generation) lifts it (docs/REPLICATION.md,
 * "Undoing a drop"); without one, the drops made here since the start. */
static bool repl_tombstoned(struct node *n, const char *name, uint64_t secret_id,
                            uint64_t gen)
{
    uint64_t dropped_gen;

    if (store_dropped_gen(node_store(n), name, secret_id, NULL, &dropped_gen))
        return dropped_gen >= gen;
    return node_sync_dropped(node_rpc__sync_get(), name, secret_id);
}

int repl__create_shard(struct node *n, struct rpc_channel *ch, const char *peer,
                       const char *filter, unsigned index, const char *sname,
                       char *why, size_t whylen)
{
    struct store *s = node_store(n);
    struct node_client_shard sh;
    struct rpc_status st = {0};
    char err[STORE_ERRLEN] = "";
    struct bf *f;

    if (node_client_get_shard_to_copy(ch, filter, index, &sh, REPL_LIST_TIMEOUT_MS,
                                      &st) < 0) {
        snprintf(why, whylen, "GetShard: %s: %s", rpc_status_name(st.code), st.message);
        return -1;
    }
    /* From here a failure is this node's. */
    uint64_t id = XXH3_64bits(sh.secret, BF_SECRET_LEN);
    if ((sh.kind != BF_KIND_BLOCKED && sh.kind != BF_KIND_CLASSIC) ||
        repl_tombstoned(n, sname, id, sh.generation))
        return 1;
    bool lifts = sh.generation && store_dropped(s, sname, id, NULL);
    if (!(f = node_client_shard_filter(&sh, err))) {
        snprintf(why, whylen, "%s", err);
        return -2;
    }
    /* SYNCING before it exists: it never answers a read it cannot vouch for. */
    if (node_sync_mark(node_rpc__sync_get(), sname, id, err) < 0) {
        snprintf(why, whylen, "%s", err);
        bf_destroy(f);
        return -2;
    }
    /* A peer's generation goes with it, and lifts a tombstone of an
     * earlier one (an undrop this copy was down for). */
    if (store_undrop_from(s, sname, f, sh.generation, err) < 0) {
        bf_destroy(f);
        /* Created meanwhile (by anti-entropy or a router): that one stays
         * as it is, marked or not. */
        struct store_filter *sf = store_get(s, sname);
        if (sf) {
            store_put(sf);
            return 1;
        }
        node_sync_clear(node_rpc__sync_get(), sname, id, NULL);
        snprintf(why, whylen, "%s", err);
        return -2;
    }
    log_info("re-created shard %s, which %s holds%s, SYNCING until it has pulled "
             "its group's pages", sname, peer,
             lifts ? " undropped after its drop here (its tombstone is lifted)" : "");
    return 0;
}

/* Create shard (filter, index) as peer holds it, SYNCING. */
static void recreate_shard(struct node_replicate *r, struct rpc_channel *ch,
                           const char *peer, const char *filter, unsigned index,
                           const char *sname)
{
    char why[RPC_CLIENT_MSGLEN + STORE_ERRLEN] = "";

    /* A peer that fails to describe it is asked again at the next listing. */
    if (repl__create_shard(r->n, ch, peer, filter, index, sname, why, sizeof why) == -2)
        log_warn("anti-entropy: shard %s of %s not re-created: %s", sname, peer, why);
}

static struct repl_missing *missing_note(struct node_replicate *r, const char *name)
{
    struct repl_missing *m;

    for (m = r->missing; m && strcmp(m->name, name); m = m->next)
        ;
    if (!m && (m = calloc(1, sizeof *m))) {
        snprintf(m->name, sizeof m->name, "%s", name);
        m->first_ms = node_sync_now_ms();
        m->next = r->missing;
        r->missing = m;
    }
    if (m)
        m->seen = true;
    return m;
}

/* Mark every shard of the store SYNCING, durably.  Returns 0 or the
 * first error (logged). */
int repl__mark_all(struct node_replicate *r, const char *why)
{
    struct store *s = node_store(r->n);
    char **names = NULL, err[NODE_SYNC_ERRLEN] = "";
    size_t nn = 0;
    int rc = 0;

    if (store_list(s, &names, &nn) < 0)
        return -ENOMEM;
    for (size_t i = 0; i < nn && rc == 0; i++) {
        struct store_filter *sf = store_get(s, names[i]);
        struct shard_facts facts;
        if (!sf)
            continue;
        if (node_rpc__shard_facts(sf, &facts) == 0 &&
            (rc = node_sync_mark(node_rpc__sync_get(), names[i], facts.secret_id,
                                 err)) < 0)
            log_error("shard %s: cannot mark it SYNCING: %s", names[i], err);
        store_put(sf);
    }
    store_list_free(names, nn);
    if (rc == 0 && nn)
        log_warn("every shard (%zu) is SYNCING: %s", nn, why);
    return rc;
}

/* Once the store is open: the directory's epoch at the start, and the
 * group it was a copy of (another group's directory vouches for nothing
 * here).  Returns false until it could be done. */
static bool identity_read(struct node_replicate *r, const struct topo_group *grp)
{
    struct node_sync *ns = node_rpc__sync_get();
    struct node_sync_copy c;
    char err[NODE_SYNC_ERRLEN] = "", why[256];

    if (r->identity_read)
        return true;
    if (!ns || !node_store(r->n))
        return false;
    node_sync_copy_get(ns, &c);
    if (c.group[0] && strcmp(c.group, grp->name) != 0) {
        snprintf(why, sizeof why, "the data directory was a copy of group %s, "
                 "this node is one of group %s", c.group, grp->name);
        if (repl__mark_all(r, why) < 0)
            return false;
    }
    if (node_sync_copy_set(ns, c.epoch, grp->name, err) < 0) {
        log_warn("cannot record this copy's group: %s", err);
        return false;
    }
    r->start_epoch = c.epoch;
    r->identity_read = true;
    return true;
}

/* Raise this copy's epoch by one, durably (before any peer hears of it). */
static void epoch_bump(struct node_replicate *r, const struct topo_group *grp)
{
    struct node_sync *ns = node_rpc__sync_get();
    struct node_sync_copy c;
    char err[NODE_SYNC_ERRLEN] = "";

    node_sync_copy_get(ns, &c);
    if (node_sync_copy_set(ns, c.epoch + 1, grp->name, err) < 0)
        log_warn("cannot raise this copy's epoch: %s", err);
    r->bumped_ms = node_sync_now_ms();
}

/* What copy peer answered about this directory's epoch: heard, the highest
 * epoch of its id it had heard before the call. */
static void epoch_heard(struct node_replicate *r, const struct topo_group *grp,
                        const char *peer, uint64_t heard)
{
    struct node_sync *ns = node_rpc__sync_get();
    struct node_sync_copy c;
    char err[NODE_SYNC_ERRLEN] = "", why[256];
    unsigned i;

    for (i = 0; i < r->nheard && strcmp(r->heard[i], peer); i++)
        ;
    bool first = i == r->nheard;
    node_sync_copy_get(ns, &c);
    /* A first answer may know epochs of the runs before this one only;
     * later ones also those this run announced, which are <= c.epoch. */
    if (heard > (first ? r->start_epoch : c.epoch)) {
        snprintf(why, sizeof why, "copy %s heard epoch %" PRIu64 " of this data "
                 "directory, which started at %" PRIu64 ": it runs on an older "
                 "copy of its directory (a restored backup)", peer, heard,
                 r->start_epoch);
        log_error("%s", why);
        if (repl__mark_all(r, why) < 0)
            return;    /* the next answer tries again */
        /* From here the directory is current again (every shard SYNCING). */
        if (node_sync_copy_set(ns, heard + 1, grp->name, err) < 0) {
            log_warn("cannot raise this copy's epoch: %s", err);
            return;
        }
        r->start_epoch = heard + 1;
    }
    if (first && r->nheard < TOPO_MAX_COPIES)
        snprintf(r->heard[r->nheard++], TOPO_ADDR_MAX + 1, "%s", peer);
    if (!r->verified && r->nheard >= repl__copies_needed(grp)) {
        r->verified = true;
        node_sync_hold(ns, NODE_SYNC_HOLD_EPOCH, false);
        log_info("epoch %" PRIu64 " of this copy checked with %u copies: it "
                 "holds what it acknowledged", c.epoch, r->nheard);
    }
}

/* This node's address in grp (a member: node_rpc__is_self), or "". */
static const char *self_in(const struct topo_group *grp)
{
    for (unsigned m = 0; m < grp->nmembers; m++)
        if (node_rpc__is_self(topo_member(grp, m)))
            return topo_member(grp, m);
    return "";
}

static Bloomgrid__V1__CopyState wire_state(enum node_sync_standing st)
{
    switch (st) {
    case NODE_SYNC_CHECKING: return BLOOMGRID__V1__COPY_STATE__COPY_STATE_CHECKING;
    case NODE_SYNC_NEW: return BLOOMGRID__V1__COPY_STATE__COPY_STATE_NEW;
    case NODE_SYNC_REFILLING: return BLOOMGRID__V1__COPY_STATE__COPY_STATE_REFILLING;
    case NODE_SYNC_CHECKED: break;
    }
    return BLOOMGRID__V1__COPY_STATE__COPY_STATE_CHECKED;
}

/* The node as a whole becomes refilling (durably): it holds less than its
 * group, and stays held until it has created and filled every shard the
 * group's copies list (whole_decide).  Returns 0 or the write error. */
static int refill_begin(const char *why)
{
    char err[NODE_SYNC_ERRLEN] = "";
    int rc = node_sync_whole_set(node_rpc__sync_get(), NODE_SYNC_WHOLE_REFILLING, err);

    if (rc < 0)
        log_error("cannot record that this copy refills (tried again at the next "
                  "listing): %s", err);
    else
        log_warn("this copy is SYNCING as a whole (reads refused) until it has "
                 "created and filled every shard of its group: %s", why);
    return rc;
}

/* Copy peer recorded another copy id at this node's address: this data
 * directory is not the one the group knew here (docs/REPLICATION.md,
 * "Re-created copies").  Acted on while the node is new or not yet
 * checked; a checked copy was vouched for by the first answers of
 * N - W + 1 copies.  A directory that holds shards gets a new copy id and
 * every shard SYNCING.  *renewed says whether the id changed.  Returns
 * false when that could not be written (the answer is not counted: the
 * next listing tries again). */
static bool replaced_heard(struct node_replicate *r, const struct topo_group *grp,
                           const char *peer, bool *renewed)
{
    struct node_sync *ns = node_rpc__sync_get();
    enum node_sync_standing st = node_sync_standing(ns);
    char err[NODE_SYNC_ERRLEN] = "", why[256];

    *renewed = false;
    if (st != NODE_SYNC_NEW && st != NODE_SYNC_CHECKING)
        return true;
    snprintf(why, sizeof why, "copy %s had recorded another copy at this address: "
             "this data directory is not the one the group knew here (lost, "
             "replaced or copied from elsewhere)", peer);
    if (st == NODE_SYNC_CHECKING) {
        if (node_sync_copy_renew(ns, grp->name, err) < 0) {
            log_error("cannot draw a new copy id: %s", err);
            return false;
        }
        *renewed = true;
        r->start_epoch = 1;
        if (repl__mark_all(r, why) < 0)
            return false;
    }
    return refill_begin(why) == 0;
}

/* ListShards on peer, announcing this copy; *resp (freed by the caller)
 * or NULL.  Returns false when peer is down. */
static bool list_peer(struct node_replicate *r, const struct topo_group *grp,
                      uint64_t topo_version, const char *peer, int timeout_ms,
                      Bloomgrid__V1__ListShardsResponse **resp)
{
    struct rpc_channel *ch = repl__peer_channel(r, peer);
    struct rpc_status st = {0};
    struct node_sync_copy c;

    *resp = NULL;
    node_sync_copy_get(node_rpc__sync_get(), &c);
    struct node_client_announce a = {
        .group = grp->name, .copy_id = c.id, .copy_epoch = c.epoch,
        .address = self_in(grp),
        .copy_state = wire_state(node_sync_standing(node_rpc__sync_get()))};
    if (!ch || node_client_list_shards(ch, topo_version, &a, resp, timeout_ms, &st) < 0) {
        log_debug("ListShards of %s: %s: %s", peer, rpc_status_name(st.code),
                  st.message);
        *resp = NULL;
        return st.code != GRPC_STATUS_UNAVAILABLE &&
               st.code != GRPC_STATUS_DEADLINE_EXCEEDED;
    }
    bool renewed = false;
    if ((*resp)->replaced && !replaced_heard(r, grp, peer, &renewed))
        return true;
    /* An epoch heard of the id this directory no longer has says nothing. */
    epoch_heard(r, grp, peer, renewed ? 0 : (*resp)->heard_epoch);
    return true;
}

/* What one round's listings said (list_round). */
struct list_tally {
    unsigned listed;       /* copies that answered */
    unsigned counting;     /* of them, not refilling themselves */
    unsigned missing;      /* shards listed that this node lacks */
    unsigned missing_old;  /* of them, missing for REPL_RECREATE_DELAY_MS */
};

/* Shards a listing of peer holds that this node lacks: noted, re-created
 * once they have been missing long enough; counted in *t. */
static void recreate_from(struct node_replicate *r, const char *peer,
                          const Bloomgrid__V1__ListShardsResponse *resp,
                          struct list_tally *t)
{
    struct store *s = node_store(r->n);
    struct rpc_channel *ch = repl__peer_channel(r, peer);

    for (size_t i = 0; ch && i < resp->n_shards && !atomic_load(&r->n->stopping); i++) {
        const Bloomgrid__V1__InternalShardInfo *isi = resp->shards[i];
        char sname[STORE_NAME_MAX + 1];
        struct store_filter *sf;
        if (!isi->filter || rules_shard_name(sname, sizeof sname, isi->filter,
                                             isi->shard_index,
                                             isi->shard_count ? isi->shard_count : 1,
                                             NULL) < 0)
            continue;
        const char *fp = isi->info && isi->info->fingerprint ? isi->info->fingerprint
                                                             : NULL;
        uint64_t dropped_gen;
        /* Only the kinds whose pages OR have copies (the others are never
         * re-created: not missing). */
        int kind = isi->info ? (int)isi->info->kind : 0;
        if (kind != 0 && kind != BF_KIND_BLOCKED && kind != BF_KIND_CLASSIC)
            continue;
        if ((sf = store_get(s, sname))) {
            /* The same filter undropped later than this copy knows (it
             * held the filter, missing the drop and the undrop): its
             * generation, for its next drop. */
            if (isi->generation && fp && fp[0])
                store_generation_raise(s, sf, fp, isi->generation, NULL);
            store_put(sf);
            continue;
        }
        /* Dropped here, and the peer's is the filter as it was before (the
         * drop has not reached peer yet): not missing, never re-created. */
        if (fp && fp[0] && store_dropped_gen(s, sname, 0, fp, &dropped_gen) &&
            dropped_gen >= isi->generation)
            continue;
        t->missing++;
        struct repl_missing *m = missing_note(r, sname);
        if (m && node_sync_now_ms() - m->first_ms >= REPL_RECREATE_DELAY_MS) {
            t->missing_old++;
            recreate_shard(r, ch, peer, isi->filter, isi->shard_index, sname);
        }
    }
}
/* Forget shards no peer listed this round (created here or dropped). */
static void missing_sweep(struct node_replicate *r)
{
    for (struct repl_missing **p = &r->missing; *p;) {
        struct repl_missing *m = *p;
        if (!m->seen) {
            *p = m->next;
            free(m);
            continue;
        }
        m->seen = false;
        p = &m->next;
    }
}

/* Is the node still finding out where it stands: its epoch not checked, or
 * new (the copies are then listed every REPL_CHECK_EVERY_MS)? */
static bool checking(const struct node_replicate *r)
{
    return !r->verified || node_sync_standing(node_rpc__sync_get()) == NODE_SYNC_NEW;
}

/* Is a listing of the copies' shards due: every REPL_LIST_EVERY_MS, every
 * REPL_CHECK_EVERY_MS while checking, and every round while refilling (it
 * is done as soon as its last shard leaves SYNCING)? */
static bool list_due(const struct node_replicate *r)
{
    if (node_sync_standing(node_rpc__sync_get()) == NODE_SYNC_REFILLING)
        return true;
    return node_sync_now_ms() - r->listed_ms >=
           (checking(r) ? REPL_CHECK_EVERY_MS : REPL_LIST_EVERY_MS);
}

/* The node as a whole after a round's listings (docs/REPLICATION.md,
 * "Re-created copies").  New: a shard of the group missing here for
 * REPL_RECREATE_DELAY_MS (a router's CreateFilter reaches the copies one
 * by one) makes it refilling; N - W + 1 copies that are not refilling
 * themselves listing nothing it lacks make it a copy of a new group (or of
 * one that holds nothing), serving.  Refilling: it is done once N - W + 1
 * such copies list nothing it lacks and none of its shards is SYNCING (each
 * left SYNCING by the usual rule). */
static void whole_decide(const struct topo_group *grp, const struct list_tally *t)
{
    struct node_sync *ns = node_rpc__sync_get();
    enum node_sync_whole w = node_sync_whole_get(ns);
    char err[NODE_SYNC_ERRLEN] = "", why[160];
    unsigned need = repl__copies_needed(grp);

    if (w == NODE_SYNC_WHOLE_NEW && t->missing_old) {
        snprintf(why, sizeof why, "it started on an empty data directory and its "
                 "group holds %u shards it lacks", t->missing_old);
        refill_begin(why);
    } else if (w == NODE_SYNC_WHOLE_NEW && t->counting >= need && t->missing == 0) {
        if (node_sync_whole_set(ns, NODE_SYNC_WHOLE_NONE, err) < 0)
            log_error("cannot record that this copy is checked: %s", err);
        else
            log_info("empty data directory, and %u copies of group %s that are not "
                     "refilling hold nothing it lacks: it serves", t->counting,
                     grp->name);
    } else if (w == NODE_SYNC_WHOLE_REFILLING && t->counting >= need &&
               t->missing == 0 && node_sync_count(ns) == 0) {
        if (node_sync_whole_set(ns, NODE_SYNC_WHOLE_NONE, err) < 0)
            log_error("cannot record that this copy has refilled: %s", err);
        else
            log_info("refilled: every shard that %u copies of group %s list is here "
                     "and in sync; it serves again", t->counting, grp->name);
    }
}

/* List the shards of the group's copies that are not down (announcing
 * this copy); down[m] is set for members found down. */
static void list_round(struct node_replicate *r, const struct topo *t,
                       const struct topo_group *grp, bool *down, struct list_tally *tally)
{
    struct node_sync *ns = node_rpc__sync_get();
    uint64_t now = node_sync_now_ms();
    bool self_copy = false;

    r->listed_ms = now;
    for (unsigned c = 0; c < grp->ncopies; c++)
        self_copy |= node_rpc__is_self(grp->copies[c]);
    if (!self_copy && !r->joined)
        node_sync_hold(ns, NODE_SYNC_HOLD_JOINING, true);
    if (now - r->bumped_ms >= REPL_LIST_EVERY_MS)
        epoch_bump(r, grp);
    for (unsigned c = 0; c < grp->ncopies; c++) {
        Bloomgrid__V1__ListShardsResponse *resp = NULL;
        /* Copies come first among the members: down[c] is copy c's. */
        if (down[c] || node_rpc__is_self(grp->copies[c]))
            continue;
        down[c] = !list_peer(r, grp, t->version, grp->copies[c], REPL_LIST_TIMEOUT_MS,
                             &resp);
        if (!resp)
            continue;
        tally->listed++;
        /* A copy that refills lacks what it has not re-created yet. */
        tally->counting +=
            resp->copy_state != BLOOMGRID__V1__COPY_STATE__COPY_STATE_REFILLING;
        recreate_from(r, grp->copies[c], resp, tally);
        protobuf_c_message_free_unpacked(&resp->base, NULL);
    }
    missing_sweep(r);
    /* A member joining the copies may become one once enough copies listed
     * nothing it lacks and none of its shards is SYNCING. */
    bool ready = self_copy || (tally->counting >= repl__copies_needed(grp) &&
                               tally->missing == 0 && node_sync_count(ns) == 0);
    if (ready != r->joined && !self_copy)
        log_info("joining group %s: %s", grp->name,
                 ready ? "every shard of its copies is here and in sync: it may "
                         "become a copy"
                       : "shards missing or SYNCING");
    r->joined = ready;
    node_sync_hold(ns, NODE_SYNC_HOLD_JOINING, !ready);
}

static void replicate_round(struct node_replicate *r, bool pull)
{
    struct store *s = node_store(r->n);
    char **names = NULL;
    size_t nn = 0;
    int g = -1;
    struct topo *t = node_rpc__topo_get(&g);

    if (!t || g < 0)
        goto out;
    const struct topo_group *grp = &t->groups[g];
    repl__prune(r, grp);
    if (grp->nmembers < 2 || !s || !identity_read(r, grp))
        goto out;
    bool listing = list_due(r);
    if (!pull && !listing)
        goto out;
    /* A peer that is down or stopped costs the round one short probe, and
     * pulls from the others never wait for it (they run on each peer's
     * puller). */
    bool down[TOPO_MAX_COPIES] = {false};
    struct list_tally tally = {0};
    repl__probe(r, grp, down);
    if (listing)
        list_round(r, t, grp, down, &tally);
    if (!pull)
        goto decide;
    for (unsigned m = 0; m < grp->nmembers; m++) {
        struct repl_peer *p;
        if (!down[m] && !node_rpc__is_self(topo_member(grp, m)) &&
            (p = repl__peer_get(r, topo_member(grp, m))))
            repl__peer_kick(r, p, t->version);
    }
    /* What the pullers' passes up to now brought: SYNCING shards filled. */
    if (store_list(s, &names, &nn) == 0) {
        for (size_t i = 0; i < nn && !atomic_load(&r->n->stopping); i++) {
            struct store_filter *sf = store_get(s, names[i]);
            if (!sf)
                continue;
            sync_check(r, sf, grp);
            store_put(sf);
        }
        store_list_free(names, nn);
    }
    repl__gauges_set(r);
decide:
    /* After sync_check: a refilling copy whose last shard just left
     * SYNCING is done in this round. */
    if (listing)
        whole_decide(grp, &tally);
out:
    topo_unref(t);
}

/* A clean stop: a last epoch, announced to the copies, so that a copy of
 * the directory taken before it is known as older (docs/REPLICATION.md). */
static void farewell(struct node_replicate *r)
{
    int g = -1;
    struct topo *t = node_rpc__topo_get(&g);

    if (t && g >= 0 && t->groups[g].nmembers > 1 && r->identity_read) {
        const struct topo_group *grp = &t->groups[g];
        epoch_bump(r, grp);
        for (unsigned c = 0; c < grp->ncopies; c++) {
            Bloomgrid__V1__ListShardsResponse *resp = NULL;
            struct repl_peer *p;
            /* A peer that did not answer the last probe would only cost
             * the stop its deadline. */
            if (node_rpc__is_self(grp->copies[c]) || !(p = repl__peer_get(r, grp->copies[c])) ||
                !p->answered)
                continue;
            list_peer(r, grp, t->version, grp->copies[c], REPL_FAREWELL_TIMEOUT_MS,
                      &resp);
            if (resp)
                protobuf_c_message_free_unpacked(&resp->base, NULL);
        }
    }
    topo_unref(t);
}

static void *replicate_main(void *arg)
{
    struct node_replicate *r = arg;
    uint64_t slept = 0;

    while (!atomic_load(&r->n->stopping)) {
        /* Sleep in short steps so shutdown does not wait a whole interval. */
        struct timespec ts = {.tv_sec = 0, .tv_nsec = 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
        slept += 10;
        /* An operator's Resync first: the rounds wait for it. */
        repl__resync_run(r, false);
        bool pull = slept >= r->n->cfg.replicate_interval_ms;
        /* Where the copy stands is found out at once, whatever the
         * interval of pulls. */
        if (!pull && (!checking(r) || slept % REPL_CHECK_EVERY_MS))
            continue;
        if (pull)
            slept = 0;
        replicate_round(r, pull);
    }
    repl__resync_run(r, true);
    farewell(r);
    return NULL;
}

int node_replicate_resync(struct node_replicate *r, uint64_t topo_version,
                          node_resync_done done, void *ctx)
{
    int rc = 0;

    pthread_mutex_lock(&r->mu);
    if (r->resync_queued) {
        rc = -EBUSY;
    } else {
        r->resync_queued = true;
        r->resync_version = topo_version;
        r->resync_done = done;
        r->resync_ctx = ctx;
    }
    pthread_mutex_unlock(&r->mu);
    return rc;
}

struct node_replicate *node_replicate_start(struct node *n)
{
    struct node_replicate *r = calloc(1, sizeof *r);

    if (!r)
        return NULL;
    r->n = n;
    pthread_mutex_init(&r->mu, NULL);
    if (pthread_create(&r->thread, NULL, replicate_main, r) != 0) {
        pthread_mutex_destroy(&r->mu);
        free(r);
        return NULL;
    }
    log_info("anti-entropy: pulling changed pages from the other copies of "
             "this node's group every %" PRIu64 " ms", n->cfg.replicate_interval_ms);
    return r;
}

void node_replicate_stop(struct node_replicate *r)
{
    if (!r)
        return;
    pthread_join(r->thread, NULL);
    /* A Resync queued after the thread's last look is answered too. */
    repl__resync_run(r, true);
    while (r->peers) {
        struct repl_peer *next = r->peers->next;
        repl__peer_free(r, r->peers);
        r->peers = next;
    }
    while (r->shards) {
        struct repl_shard *next = r->shards->next;
        free(r->shards);
        r->shards = next;
    }
    while (r->missing) {
        struct repl_missing *next = r->missing->next;
        free(r->missing);
        r->missing = next;
    }
    pthread_mutex_destroy(&r->mu);
    free(r);
}
