/* merger: one round of pulls, ORs and pushes over every configured filter
 * (see merger.h for what is kept and docs/MERGER.md for why it is safe).
 *
 * OR is idempotent, commutative and associative, so every step may be
 * repeated or reordered: a round interrupted anywhere leaves every copy a
 * subset of the union, and the next round completes it.  The only thing
 * that must never happen is forgetting a page that a node will not send
 * again; hence the order: pull, OR into the snapshot, save the snapshot,
 * and only then save the since_version of that pull (the sidecar) and push.
 */
#include "merger.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bf.h"
#include "bf_file.h"
#include "log.h"
#include "merger_internal.h"
#include "node_client.h"
#include "quorum.h"
#include "rpc_client.h"
#include "rules.h"
#include "topo.h"

/* The receive window of each call to a node (rpc_channel_create_window). */
#define MERGER_PULL_WINDOW (1u << 20)

/* snprintf for messages and paths that may be cut short. */
void merger__strfmt(char *buf, size_t size, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(buf, size, fmt, ap);
    va_end(ap);
}

uint64_t merger__now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

void merger__text_clean(char *s)
{
    size_t n = strlen(s);

    for (size_t i = 0; i < n;) {
        /* The shortest valid sequence at i is the character there. */
        size_t k = 1;
        while (k <= 4 && i + k <= n && !rules_utf8_valid(s + i, k))
            k++;
        if (k <= 4 && i + k <= n)
            i += k;
        else
            s[i++] = '?';
    }
}

void merger__rep_msg(struct mg_report *rep, bool error, const char *fmt, ...)
{
    char buf[MG_ERRLEN];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    merger__text_clean(buf);
    if (error) {
        rep->errors++;
        log_error("merger: %s", buf);
    } else {
        log_warn("merger: %s", buf);
    }
    if (rep->nmsg < MG_REPORT_MSGS)
        merger__strfmt(rep->msg[rep->nmsg++], MG_ERRLEN, "%s", buf);
}

/* The channel to a node (kept for the merger's life); thread-safe. */
struct rpc_channel *merger__chan(struct merger *m, const char *addr)
{
    struct rpc_channel *ch = NULL;

    pthread_mutex_lock(&m->chan_mu);
    for (size_t i = 0; i < m->nchans && !ch; i++)
        if (!strcmp(m->chans[i].addr, addr))
            ch = m->chans[i].ch;
    if (!ch && m->nchans == m->capchans) {
        size_t cap = m->capchans ? 2 * m->capchans : 16;
        void *nv = realloc(m->chans, cap * sizeof *m->chans);
        if (!nv)
            goto out;
        m->chans = nv;
        m->capchans = cap;
    }
    /* Each call's receive window stays 1 MiB: gRPC's BDP probes would grow
     * it to tens of MiB of a shard sent ahead of a worker still merging,
     * held by the channel beside the worker's snapshot. */
    if (!ch && (ch = rpc_channel_create_window(addr, m->cfg.max_message_size,
                                               MERGER_PULL_WINDOW))) {
        merger__strfmt(m->chans[m->nchans].addr, TOPO_ADDR_MAX + 1, "%s", addr);
        m->chans[m->nchans++].ch = ch;
    }
out:
    pthread_mutex_unlock(&m->chan_mu);
    return ch;
}

/* ---- a round ---- */

/* The template (shard 0's geometry and secret) from the first datacenter
 * that has the filter. */
static int filter_prepare(struct merger *m, struct mg_filter *f,
                          struct topo **topos, struct mg_report *rep)
{
    char err[MG_ERRLEN];

    if (!f->have_tmpl) {
        for (unsigned d = 0; d < f->c.ndc && !f->have_tmpl; d++) {
            struct rpc_status st = {.code = GRPC_STATUS_RESOURCE_EXHAUSTED,
                                    .message = "out of memory for a channel"};
            const struct topo_group *grp =
                &topos[d]->groups[topo_group_for(topos[d], f->c.name, 0)];
            for (unsigned c = 0; c < grp->ncopies && !f->have_tmpl; c++) {
                struct rpc_channel *ch = merger__chan(m, grp->copies[c]);
                if (ch && node_client_get_shard(ch, f->c.name, 0, &f->tmpl,
                                                (int)m->cfg.node_timeout_ms,
                                                &st) == 0)
                    f->have_tmpl = true;
            }
            if (!f->have_tmpl && st.code != GRPC_STATUS_NOT_FOUND)
                merger__rep_msg(rep, true, "filter \"%s\" in %s: %s: %s",
                                f->c.name, f->c.dc[d], rpc_status_name(st.code),
                                st.message);
        }
        if (!f->have_tmpl) {
            merger__rep_msg(rep, true,
                            "filter \"%s\" exists in no datacenter yet",
                            f->c.name);
            return -1;
        }
    }
    if (!f->sh) {
        char dir[MG_PATH_MAX + 200];
        merger__strfmt(dir, sizeof dir, "%s/%s", m->cfg.state_dir, f->c.name);
        if (merger__dir_make(dir, err) < 0) {
            merger__rep_msg(rep, true, "%s", err);
            return -1;
        }
        f->nshards = f->tmpl.shard_count;
        f->sh = calloc(f->nshards, sizeof *f->sh);
        if (!f->sh) {
            merger__rep_msg(rep, true, "filter \"%s\": out of memory for %u "
                            "shards", f->c.name, f->nshards);
            return -1;
        }
        for (uint32_t i = 0; i < f->nshards; i++) {
            f->sh[i].index = i;
            if (merger__shard_init(m, f, &f->sh[i], rep, err) < 0) {
                merger__rep_msg(rep, true, "%s", err);
                for (uint32_t j = 0; j <= i; j++) {
                    merger__shard_unload(&f->sh[j]);
                    free(f->sh[j].stamp);
                    free(f->sh[j].cp);
                }
                free(f->sh);
                f->sh = NULL;
                return -1;
            }
        }
    }
    return 0;
}

/* Where every shard of f is in each datacenter this round (f->place),
 * by the filter's placement version (shard 0's).  Returns 0, or -1 with
 * the error reported. */
static int filter_place(struct mg_filter *f, struct topo **topos,
                        struct mg_report *rep)
{
    for (unsigned d = 0; d < f->c.ndc; d++) {
        free(f->place[d]);
        f->place[d] = malloc(f->nshards * sizeof *f->place[d]);
        int rc = f->place[d] ? topo_place(topos[d], f->c.name, f->nshards,
                                          f->tmpl.placement, f->place[d])
                             : -ENOMEM;
        if (rc < 0) {
            merger__rep_msg(rep, true, "filter \"%s\" in %s: %s", f->c.name,
                            f->c.dc[d], rc == -ENOMEM ? "out of memory"
                            : "placement version unknown to this merger: "
                              "upgrade it");
            return -1;
        }
    }
    return 0;
}

/* Pull shard s from copy cp, the c-th of its group, with slot: its state
 * in g (and g's count of in-sync copies); *moved set when its cursor
 * moved.  Returns merger__pull_one's. */
static int pull_copy(struct merger *m, struct mg_filter *f, struct mg_shard *s,
                     struct mg_pull_rep *g, unsigned c, struct mg_copy *cp, int slot,
                     uint64_t round, struct mg_report *rep, bool *moved)
{
    uint64_t epoch = cp->epoch, since = cp->since;

    if (merger__pull_one(m, f, s, cp, slot, round, rep) < 0) {
        g->state[c] = MG_FAILED;
        return -1;
    }
    *moved |= cp->epoch != epoch || cp->since != since;
    g->state[c] = cp->in_sync ? MG_PULLED : MG_SYNCING;
    g->in_sync += cp->in_sync;
    return 0;
}

/* Pull shard s from R in-sync copies of its group in datacenter d: the
 * copies in topology order until R that are not SYNCING have answered
 * (docs/MERGER.md: a key acknowledged by W copies is then on one of them).
 * Fewer: the pages pulled are kept, but the round does not cover d for the
 * shard (an error; the next round asks again).  *slot numbers the copies
 * pulled in this round of the shard.  Returns whether a cursor moved. */
static bool pull_group(struct merger *m, struct mg_filter *f,
                       struct mg_shard *s, unsigned d,
                       const struct topo_group *grp, int *slot,
                       uint64_t round, struct mg_report *rep)
{
    struct mg_pull_rep *g = &s->gp[d];
    uint64_t t0 = merger__now_ms();
    bool moved = false;
    char failed[MG_ERRLEN] = "", syncing[MG_ERRLEN] = "";
    char *list;

    memset(g, 0, sizeof *g);
    g->round = round;
    merger__strfmt(g->filter, sizeof g->filter, "%s", f->c.name);
    g->shard = s->index;
    merger__strfmt(g->dc, sizeof g->dc, "%s", f->c.dc[d]);
    merger__strfmt(g->group, sizeof g->group, "%s", grp->name);
    g->read_quorum = grp->read_quorum;
    g->ncopies = grp->ncopies;
    for (unsigned c = 0; c < grp->ncopies; c++) {
        merger__strfmt(g->copy[c], sizeof g->copy[c], "%s", grp->copies[c]);
        if (quorum_covered(grp, g->in_sync))
            continue;
        struct mg_copy *cp = merger__copy_get(s, grp->copies[c], d);
        if (!cp) {
            merger__rep_msg(rep, true, "out of memory for copy %s",
                            grp->copies[c]);
            g->state[c] = MG_FAILED;
            continue;
        }
        if (pull_copy(m, f, s, g, c, cp, (*slot)++, round, rep, &moved) < 0)
            list = failed;
        else
            list = cp->in_sync ? NULL : syncing;
        if (list)
            merger__strfmt(list + strlen(list), MG_ERRLEN - strlen(list),
                           " %s", cp->addr);
    }
    /* A copy whose acked round was dropped while it re-synced, and which
     * was not pulled because R others answered first: once it serves
     * again it is pulled too, so that the round pushes it only what it
     * did not send whole, not every page (docs/MERGER.md, "Copies that
     * re-sync"). */
    for (unsigned c = 0; quorum_covered(grp, g->in_sync) && c < grp->ncopies; c++) {
        if (g->state[c] != MG_NOT_ASKED)
            continue;   /* asked already (each copy takes one slot at most) */
        struct mg_copy *cp = merger__copy_get(s, grp->copies[c], d);
        if (!cp || cp->slot >= 0 || !merger__copy_back(m, f, s, cp))
            continue;
        pull_copy(m, f, s, g, c, cp, (*slot)++, round, rep, &moved);
    }
    if ((g->covered = quorum_covered(grp, g->in_sync))) {
        s->covered_ms[d] = t0;
        return moved;
    }
    rep->uncovered++;
    merger__rep_msg(rep, true,
                    "filter \"%s\" shard %u in %s (group %s): %u of %u copies "
                    "pulled in sync, read quorum %u (failed:%s; syncing:%s): "
                    "this round does not cover %s for the shard, the next "
                    "one asks again", f->c.name, s->index, f->c.dc[d],
                    grp->name, g->in_sync, grp->ncopies, grp->read_quorum,
                    failed[0] ? failed : " none",
                    syncing[0] ? syncing : " none", f->c.dc[d]);
    return moved;
}

/* One shard's round: pulls, partials, save, pushes.  The snapshot comes
 * into memory (merger__shard_load) only when a step needs its bits, and
 * the caller frees it after. */
static void shard_steps(struct merger *m, struct mg_filter *f,
                        struct mg_shard *s, struct topo **topos,
                        uint64_t round, struct mg_report *rep)
{
    uint64_t before = rep->pages_changed;
    char path[MG_PATH_MAX + 64], e2[BF_ERRLEN], err[MG_ERRLEN];
    bool moved = false;
    int slot = 0;

    for (size_t i = 0; i < s->ncp; i++) {
        s->cp[i].slot = -1;
        s->cp[i].in_sync = false;
    }
    for (unsigned d = 0; d < f->c.ndc; d++)
        moved |= pull_group(
            m, f, s, d,
            &topos[d]->groups[f->place[d][s->index]],
            &slot, round, rep);
    for (unsigned i = 0; i < f->c.npart; i++)
        merger__partial_one(m, f, s, i, round, rep);
    if (rep->pages_changed != before && s->g) {
        struct bf_stats bs;
        bf_stats(s->g, &bs);
        if (bs.estimated_fpr > bf_error_rate(s->g))
            merger__rep_msg(
                rep, false,
                "filter \"%s\" shard %u: merged fill %.3f "
                "gives an estimated FPR of %.4g, past the target %.4g",
                f->c.name, s->index, bs.fill_ratio, bs.estimated_fpr,
                bf_error_rate(s->g));
        s->dirty = true;
    }
    if (s->dirty && merger__shard_load(m, f, s, rep) < 0)
        return;
    if (s->dirty) {
        merger__shard_path(m, f, s->index, "bf", path, sizeof path);
        if (bf_file_save(s->g, path, e2) < 0) {
            /* Without the snapshot on disk, nothing may be acknowledged:
             * the sidecar keeps the old cursors, and as the snapshot in
             * memory goes at the end of the round, so do the cursors of
             * this run (the next round pulls every page again). */
            merger__rep_msg(rep, true, "cannot save %s: %s", path, e2);
            merger__shard_forget(s);
            s->dirty = false;
            return;
        }
        s->dirty = false;
        moved = true;   /* the sidecar's T lines describe the old one */
    }
    if (moved && merger__state_save(m, f, s, err) < 0)
        merger__rep_msg(rep, true, "cannot save the state of \"%s\" shard "
                        "%u: %s", f->c.name, s->index, err);
    const char *pause = getenv("BLOOMGRID_MERGER_TEST_PAUSE_MS");
    if (pause && *pause)
        usleep((useconds_t)atoi(pause) * 1000);
    /* Every copy everywhere, pulled or not, in-sync or not: a push only
     * adds bits.  In a joint phase the other set's copies too: a push is a
     * write, and writes reach both sets. */
    for (unsigned d = 0; d < f->c.ndc; d++) {
        struct topo_group *grp = &topos[d]->groups[f->place[d][s->index]];
        for (unsigned c = 0; c < grp->nmembers; c++) {
            struct mg_copy *cp = merger__copy_get(s, topo_member(grp, c), d);
            if (cp)
                merger__push_one(m, f, s, cp, round, rep);
        }
    }
    /* Record which copies are now complete (a restart then pushes them
     * only what changes later). */
    bool changed = false;
    for (size_t i = 0; i < s->ncp; i++)
        changed |= merger__copy_synced(s, &s->cp[i]) != s->cp[i].was_synced;
    if (changed && merger__state_save(m, f, s, err) < 0)
        merger__rep_msg(rep, true, "cannot save the state of \"%s\" shard "
                        "%u: %s", f->c.name, s->index, err);
}

static void shard_round(struct merger *m, struct mg_filter *f,
                        struct mg_shard *s, struct topo **topos, uint64_t round,
                        struct mg_report *rep)
{
    /* What the round holds (the have bits, the snapshot once a step needs
     * it) goes at its end: between rounds a shard costs its page stamps
     * and cursors only. */
    s->have = calloc(s->npages ? s->npages : 1, sizeof *s->have);
    if (!s->have) {
        merger__rep_msg(rep, true, "filter \"%s\" shard %u: out of memory",
                        f->c.name, s->index);
        return;
    }
    /* A copy that acked the highest stamp held the snapshot whole as the
     * round began (what it may be pushed as keys: merger__push_one). */
    s->prev_max = 0;
    for (uint64_t p = 0; p < s->npages; p++)
        if (s->stamp[p] > s->prev_max)
            s->prev_max = s->stamp[p];
    shard_steps(m, f, s, topos, round, rep);
    merger__shard_unload(s);
}

/* The copies of every shard, and the group pulls of this round. */
static void report_lag(struct merger *m, struct mg_report *rep)
{
    size_t n = 0, np = 0, k = 0, kp = 0;
    uint64_t now = merger__now_ms();

    for (size_t i = 0; i < m->nf; i++)
        for (uint32_t j = 0; m->f[i].sh && j < m->f[i].nshards; j++) {
            n += m->f[i].sh[j].ncp;
            np += m->f[i].c.ndc;
        }
    rep->lag = calloc(n ? n : 1, sizeof *rep->lag);
    rep->pull = calloc(np ? np : 1, sizeof *rep->pull);
    if (!rep->lag || !rep->pull)
        return;
    for (size_t i = 0; i < m->nf; i++) {
        struct mg_filter *f = &m->f[i];
        for (uint32_t j = 0; f->sh && j < f->nshards; j++) {
            struct mg_shard *s = &f->sh[j];
            for (size_t t = 0; t < s->ncp; t++) {
                struct mg_copy *c = &s->cp[t];
                struct mg_lag *l = &rep->lag[k++];
                merger__strfmt(l->filter, sizeof l->filter, "%s", f->c.name);
                l->shard = j;
                merger__strfmt(l->dc, sizeof l->dc, "%s", f->c.dc[c->dc]);
                merger__strfmt(l->node, sizeof l->node, "%s", c->addr);
                l->replica = c->slot < 0 || !c->in_sync;
                l->version = c->store_version;
                l->lag_ms = c->data_ms ? now - c->data_ms : 0;
                merger__strfmt(l->error, sizeof l->error, "%s", c->error);
            }
            for (unsigned d = 0; d < f->c.ndc; d++)
                if (s->gp[d].round == rep->round)
                    rep->pull[kp++] = s->gp[d];
        }
    }
    rep->nlag = k;
    rep->npull = kp;
}

/* Shards of one filter are independent: workers take them in turn from one
 * counter, each with a report of its own, added up at the end. */
struct shard_pool {
    struct merger *m;
    struct mg_filter *f;
    struct topo **topos;
    uint64_t round;
    atomic_uint next;
};

struct shard_work {
    struct shard_pool *pool;
    pthread_t th;
    bool started;
    struct mg_report rep;
};

static void rep_add(struct mg_report *to, const struct mg_report *from)
{
    to->bytes_pulled += from->bytes_pulled;
    to->bytes_pushed += from->bytes_pushed;
    to->pages_pulled += from->pages_pulled;
    to->pages_pushed += from->pages_pushed;
    to->pages_changed += from->pages_changed;
    to->keys_pulled += from->keys_pulled;
    to->keys_pushed += from->keys_pushed;
    to->errors += from->errors;
    to->uncovered += from->uncovered;
    to->pushes_later += from->pushes_later;
    for (unsigned i = 0; i < from->nmsg && to->nmsg < MG_REPORT_MSGS; i++)
        memcpy(to->msg[to->nmsg++], from->msg[i], MG_ERRLEN);
}

static void *shard_worker(void *arg)
{
    struct shard_work *w = arg;
    struct shard_pool *p = w->pool;
    unsigned j;

    while ((j = atomic_fetch_add(&p->next, 1)) < p->f->nshards)
        shard_round(p->m, p->f, &p->f->sh[j], p->topos, p->round, &w->rep);
    return NULL;
}

static void filter_round(struct merger *m, struct mg_filter *f,
                         struct topo **topos, struct mg_report *rep)
{
    struct shard_pool pool = {
        .m = m, .f = f, .topos = topos, .round = rep->round};
    unsigned nw = (unsigned)m->cfg.workers;
    struct shard_work *w;

    if (nw < 1)
        nw = 1;
    if (nw > f->nshards)
        nw = f->nshards;
    atomic_init(&pool.next, 0);
    if (!(w = calloc(nw, sizeof *w))) {
        merger__rep_msg(rep, true, "out of memory for %u workers", nw);
        return;
    }
    for (unsigned i = 0; i < nw; i++) {
        w[i].pool = &pool;
        w[i].rep.round = rep->round;
        /* Worker 0 is this thread; a worker that cannot start is not
         * needed (the others take its shards). */
        if (i > 0)
            w[i].started =
                pthread_create(&w[i].th, NULL, shard_worker, &w[i]) == 0;
    }
    shard_worker(&w[0]);
    for (unsigned i = 0; i < nw; i++) {
        if (w[i].started)
            pthread_join(w[i].th, NULL);
        rep_add(rep, &w[i].rep);
    }
    free(w);
}

/* A datacenter is a topology file, or the address of its one node (a
 * single-node deployment: one group of one copy). */
static struct topo *dc_topology(const char *where, char *err)
{
    char text[TOPO_ADDR_MAX + 64];

    if (strchr(where, '/') || topo_addr_check(where) != 0)
        return topo_load(where, err);
    merger__strfmt(text, sizeof text, "version = 1\n[group single]\ncopies = %s\n",
                   where);
    return topo_parse(text, where, err);
}

/* *to = *from with copies of its arrays (none when out of memory). */
static void report_copy(struct mg_report *to, const struct mg_report *from)
{
    *to = *from;
    to->lag = from->nlag ? malloc(from->nlag * sizeof *from->lag) : NULL;
    to->pull = from->npull ? malloc(from->npull * sizeof *from->pull) : NULL;
    if (to->lag)
        memcpy(to->lag, from->lag, from->nlag * sizeof *from->lag);
    else
        to->nlag = 0;
    if (to->pull)
        memcpy(to->pull, from->pull, from->npull * sizeof *from->pull);
    else
        to->npull = 0;
}

int merger_round(struct merger *m, struct mg_report *rep)
{
    char err[TOPO_ERRLEN];

    memset(rep, 0, sizeof *rep);
    rep->round = ++m->round;
    rep->started_ms = merger__now_ms();
    for (size_t i = 0; i < m->nf; i++) {
        struct mg_filter *f = &m->f[i];
        struct topo *topos[MG_MAX_DC] = {0};
        bool ok = true;
        /* Topologies are read every round: a changed file takes effect. */
        for (unsigned d = 0; d < f->c.ndc; d++)
            if (!(topos[d] = dc_topology(f->c.topo[d], err))) {
                merger__rep_msg(rep, true, "datacenter %s: %s", f->c.dc[d],
                                err);
                ok = false;
            }
        if (ok && filter_prepare(m, f, topos, rep) == 0 &&
            filter_place(f, topos, rep) == 0)
            filter_round(m, f, topos, rep);
        for (unsigned d = 0; d < f->c.ndc; d++)
            topo_unref(topos[d]);
    }
    rep->duration_ms = merger__now_ms() - rep->started_ms;
    report_lag(m, rep);
    pthread_mutex_lock(&m->mu);
    mg_report_free(&m->last);
    report_copy(&m->last, rep);
    m->rounds_done++;
    m->total += rep->bytes_pulled + rep->bytes_pushed;
    pthread_mutex_unlock(&m->mu);
    return (int)rep->errors;
}

void merger_last_report(struct merger *m, struct mg_report *rep,
                        uint64_t *rounds, uint64_t *total)
{
    pthread_mutex_lock(&m->mu);
    report_copy(rep, &m->last);
    if (rounds)
        *rounds = m->rounds_done;
    if (total)
        *total = m->total;
    pthread_mutex_unlock(&m->mu);
}

void mg_report_free(struct mg_report *rep)
{
    free(rep->lag);
    free(rep->pull);
    rep->lag = NULL;
    rep->pull = NULL;
    rep->nlag = rep->npull = 0;
}

static const char *const pull_state_name[] = {
    [MG_NOT_ASKED] = "not-asked", [MG_PULLED] = "pulled",
    [MG_SYNCING] = "syncing", [MG_FAILED] = "failed"};

void mg_report_print(FILE *out, const struct mg_report *r)
{
    fprintf(out, "round %" PRIu64 ": duration_ms %" PRIu64 " bytes_pulled %"
            PRIu64 " bytes_pushed %" PRIu64 " pages_pulled %" PRIu64
            " pages_pushed %" PRIu64 " pages_changed %" PRIu64 " errors %u"
            " keys_pulled %" PRIu64 " keys_pushed %" PRIu64 " uncovered %u pushes_later %u\n",
            r->round, r->duration_ms, r->bytes_pulled, r->bytes_pushed,
            r->pages_pulled, r->pages_pushed, r->pages_changed, r->errors,
            r->keys_pulled, r->keys_pushed, r->uncovered, r->pushes_later);
    for (unsigned i = 0; i < r->nmsg; i++)
        fprintf(out, "  message: %s\n", r->msg[i]);
    for (size_t i = 0; i < r->npull; i++) {
        const struct mg_pull_rep *p = &r->pull[i];
        fprintf(out, "  pull %s shard %u %s group %s read_quorum %u %s:",
                p->filter, p->shard, p->dc, p->group, p->read_quorum,
                p->covered ? "covered" : "not-covered");
        for (unsigned c = 0; c < p->ncopies; c++)
            fprintf(out, " %s=%s", p->copy[c], pull_state_name[p->state[c]]);
        fprintf(out, "\n");
    }
    for (size_t i = 0; i < r->nlag; i++)
        fprintf(out, "  target %s shard %u %s %s %s version %" PRIu64
                " lag_ms %" PRIu64 "%s%s\n",
                r->lag[i].filter, r->lag[i].shard, r->lag[i].dc,
                r->lag[i].replica ? "not-pulled" : "pulled", r->lag[i].node,
                r->lag[i].version, r->lag[i].lag_ms,
                r->lag[i].error[0] ? " error " : "", r->lag[i].error);
}

void mg_report_log(const struct mg_report *rep)
{
    uint64_t worst = 0;

    for (size_t i = 0; i < rep->nlag; i++)
        if (rep->lag[i].lag_ms > worst)
            worst = rep->lag[i].lag_ms;
    log_info("merger: round %" PRIu64 ": %" PRIu64 " ms, pulled %" PRIu64
             " pages and %" PRIu64 " keys (%" PRIu64 " bytes), %" PRIu64
             " pages changed, pushed %" PRIu64 " pages and %" PRIu64
             " keys (%" PRIu64 " bytes), %u errors, %u pulls short of the "
             "read quorum, %u pushes left for copies that re-sync, lag max %" PRIu64
             " ms",
             rep->round, rep->duration_ms, rep->pages_pulled, rep->keys_pulled,
             rep->bytes_pulled,
             rep->pages_changed, rep->pages_pushed, rep->keys_pushed,
             rep->bytes_pushed,
             rep->errors, rep->uncovered, rep->pushes_later, worst);
}

struct merger *merger_create(const struct merger_config *cfg,
                             const struct mg_filter_conf *filters, size_t n,
                             char *err)
{
    struct merger *m = calloc(1, sizeof *m);

    if (!m || !(m->f = calloc(n ? n : 1, sizeof *m->f))) {
        free(m);
        merger__strfmt(err, MG_ERRLEN, "out of memory");
        return NULL;
    }
    m->cfg = *cfg;
    if (merger__dir_make(cfg->state_dir, err) < 0) {
        free(m->f);
        free(m);
        return NULL;
    }
    for (size_t i = 0; i < n; i++)
        m->f[i].c = filters[i];
    m->nf = n;
    pthread_mutex_init(&m->chan_mu, NULL);
    /* Round 1 is what was loaded from disk: the first round is 2. */
    m->round = 1;
    pthread_mutex_init(&m->mu, NULL);
    return m;
}

void merger_destroy(struct merger *m)
{
    if (!m)
        return;
    for (size_t i = 0; i < m->nf; i++) {
        for (uint32_t j = 0; m->f[i].sh && j < m->f[i].nshards; j++) {
            merger__shard_unload(&m->f[i].sh[j]);
            free(m->f[i].sh[j].stamp);
            free(m->f[i].sh[j].cp);
        }
        free(m->f[i].sh);
        for (unsigned d = 0; d < MG_MAX_DC; d++)
            free(m->f[i].place[d]);
    }
    for (size_t i = 0; i < m->nchans; i++)
        rpc_channel_destroy(m->chans[i].ch);
    free(m->chans);
    mg_report_free(&m->last);
    pthread_mutex_destroy(&m->mu);
    pthread_mutex_destroy(&m->chan_mu);
    free(m->f);
    free(m);
}
