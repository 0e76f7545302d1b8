/* cmd_status: `bloomgrid status`, the cluster as its processes report it:
 * every copy of every group of a topology file asked for its health (a
 * copy is serving, SYNCING, not ready or unreachable) and its shards (a
 * copy that lacks a shard another copy of its group holds never reads as
 * serving), the router's readiness, and the merger's last round.  Only
 * grpc.health.v1, Internal.ListShards (announcing nothing) and
 * Merger.Status are called: nothing is changed. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bloomgrid/v1/internal.pb-c.h"
#include "bloomgrid/v1/merger.pb-c.h"
#include "cli.h"
#include "grpc/health/v1/health.pb-c.h"
#include "node_client.h"
#include "online.h"
#include "online_cmd.h"
#include "quorum.h"
#include "rpc_client.h"
#include "topo.h"

#define STATUS_DEADLINE_MS 2000
#define READY_NAME "bloomgrid.v1.BloomGrid"

enum { OPT_TOPOLOGY = 0x200, OPT_MERGER };

static const struct option status_longopts[] = {
    {"topology", required_argument, NULL, OPT_TOPOLOGY},
    {"merger", required_argument, NULL, OPT_MERGER},
    ONLINE_COMMON_LONGOPTS,
};

/* Open o (its TLS and token options) on addr. */
static int open_on(struct online *o, const struct online *opts, const char *addr)
{
    *o = *opts;
    o->server = addr;
    o->ch = NULL;
    return online_open(o);
}

/* 1 SERVING, 0 NOT_SERVING, -1 the call failed (st says why). */
static int health_of(struct online *o, const char *service, struct rpc_status *st)
{
    Grpc__Health__V1__HealthCheckRequest rq = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    Grpc__Health__V1__HealthCheckResponse *resp = NULL;
    rq.service = (char *)service;
    if (rpc_call(o->ch, "/grpc.health.v1.Health/Check", &rq.base,
                 &grpc__health__v1__health_check_response__descriptor,
                 (ProtobufCMessage **)&resp, o->deadline_ms, st) < 0)
        return -1;
    int v = resp->status == GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
    grpc__health__v1__health_check_response__free_unpacked(resp, NULL);
    return v;
}

/* What one copy of a group reports. */
struct copy_view {
    const char *addr;
    int live, ready;               /* health_of: "" and READY_NAME */
    struct rpc_status st;          /* of the health call that failed */
    /* Its shards (Internal/ListShards), when it could be asked. */
    Bloomgrid__V1__ListShardsResponse *shards;
    struct rpc_status lst;         /* of ListShards when it failed */
};

/* Ask addr its health and its shards. */
static void view_copy(const struct online *opts, const char *addr, struct copy_view *v)
{
    struct online o;

    memset(v, 0, sizeof *v);
    v->addr = addr;
    v->live = v->ready = -1;
    if (open_on(&o, opts, addr) != 0) {
        snprintf(v->st.message, sizeof v->st.message, "cannot open a channel");
        return;
    }
    v->live = health_of(&o, "", &v->st);
    if (v->live > 0)
        v->ready = health_of(&o, READY_NAME, &v->st);
    if (v->live >= 0) {
        /* Nothing announced: a listing changes nothing on the node. */
        if (node_client_list_shards(o.ch, 0, NULL, &v->shards, o.deadline_ms, &v->lst) < 0)
            v->shards = NULL;
    }
    online_close(&o);
}

static bool holds(const Bloomgrid__V1__ListShardsResponse *l, const char *filter,
                  uint32_t index)
{
    for (size_t i = 0; i < l->n_shards; i++)
        if (l->shards[i]->filter && strcmp(l->shards[i]->filter, filter) == 0 &&
            l->shards[i]->shard_index == index)
            return true;
    return false;
}

/* Shards some other copy of the group lists and v lacks; the first one
 * goes to *filter, *index, *where. */
static unsigned lacking(const struct copy_view *views, unsigned n, unsigned self,
                        const char **filter, uint32_t *index, const char **where)
{
    unsigned missing = 0;
    const Bloomgrid__V1__ListShardsResponse *mine = views[self].shards;

    for (unsigned c = 0; mine && c < n; c++) {
        const Bloomgrid__V1__ListShardsResponse *l = views[c].shards;
        for (size_t i = 0; c != self && l && i < l->n_shards; i++) {
            const Bloomgrid__V1__InternalShardInfo *isi = l->shards[i];
            bool counted = false;
            /* Counted once, at the first copy that lists it. */
            for (unsigned d = 0; d < c && !counted; d++)
                counted = d != self && views[d].shards &&
                          holds(views[d].shards, isi->filter, isi->shard_index);
            if (!isi->filter || counted || holds(mine, isi->filter, isi->shard_index))
                continue;
            if (!missing++) {
                *filter = isi->filter;
                *index = isi->shard_index;
                *where = views[c].addr;
            }
        }
    }
    return missing;
}

/* Why a copy refuses reads, from where it says it stands. */
static const char *standing(const struct copy_view *v)
{
    if (!v->shards)
        return "";
    switch (v->shards->copy_state) {
    case BLOOMGRID__V1__COPY_STATE__COPY_STATE_CHECKING:
        return " (checking its data directory with its group)";
    case BLOOMGRID__V1__COPY_STATE__COPY_STATE_NEW:
        return " (empty data directory: waiting to hear whether its group holds "
               "anything)";
    case BLOOMGRID__V1__COPY_STATE__COPY_STATE_REFILLING:
        return " (refilling: it lost or had its data directory replaced, and "
               "creates and fills its group's shards)";
    default:
        return "";
    }
}

/* Print one copy's state; returns whether it serves reads. */
static bool show_copy(const struct copy_view *views, unsigned n, unsigned self)
{
    const struct copy_view *v = &views[self];
    const char *filter = NULL, *where = NULL;
    uint32_t index = 0;

    if (v->live < 0 || (v->live > 0 && v->ready < 0)) {
        printf("  %-28s unreachable: %s: %s\n", v->addr, rpc_status_name(v->st.code),
               v->st.message);
        return false;
    }
    if (v->live == 0) {
        printf("  %-28s not ready\n", v->addr);
        return false;
    }
    /* A copy never reads as serving while it lacks a shard its group
     * holds (a router would find it NOT_FOUND there). */
    unsigned missing = lacking(views, n, self, &filter, &index, &where);
    if (v->ready == 0 || missing) {
        printf("  %-28s SYNCING%s", v->addr, standing(v));
        if (missing)
            printf("; lacks %u shard%s its group holds (shard %u of %s, on %s)",
                   missing, missing == 1 ? "" : "s", index, filter, where);
        printf("\n");
        return false;
    }
    printf("  %-28s serving\n", v->addr);
    return true;
}

/* Every group of the topology; returns how many have fewer serving copies
 * than their read quorum, or -1 when the file does not parse. */
static int show_groups(const struct online *opts, const char *path)
{
    char err[TOPO_ERRLEN];
    struct topo *t = topo_load(path, err);
    int short_groups = 0;

    if (!t) {
        cli_fail("status: %s", err);
        return -1;
    }
    printf("topology %s, version %llu, %u groups\n", path,
           (unsigned long long)t->version, t->ngroups);
    for (unsigned g = 0; g < t->ngroups; g++) {
        const struct topo_group *gr = &t->groups[g];
        struct copy_view views[TOPO_MAX_COPIES];
        printf("group %s%s%s: %u copies, write quorum %u, read quorum %u\n",
               gr->name, gr->datacenter[0] ? ", datacenter " : "", gr->datacenter,
               gr->ncopies, gr->write_quorum, gr->read_quorum);
        for (unsigned c = 0; c < gr->ncopies; c++)
            view_copy(opts, gr->copies[c], &views[c]);
        unsigned serving = 0;
        for (unsigned c = 0; c < gr->ncopies; c++)
            serving += show_copy(views, gr->ncopies, c);
        /* Shard lists need the internal service: an admin token or a
         * cluster certificate. */
        const struct rpc_status *refused = NULL;
        for (unsigned c = 0; c < gr->ncopies; c++)
            if (views[c].live > 0 && !views[c].shards &&
                views[c].lst.code != GRPC_STATUS_UNAVAILABLE &&
                views[c].lst.code != GRPC_STATUS_DEADLINE_EXCEEDED)
                refused = &views[c].lst;
        if (refused && gr->ncopies > 1)
            printf("  (shard lists not compared: ListShards: %s: %s; an admin token "
                   "or a cluster certificate lets status compare them)\n",
                   rpc_status_name(refused->code), refused->message);
        bool readable = quorum_readable(gr, serving);
        printf("  %u of %u copies serving: %s\n", serving, gr->ncopies,
               readable ? "readable" : "NOT READABLE (fewer than the read quorum)");
        short_groups += !readable;
        for (unsigned c = 0; c < gr->ncopies; c++)
            if (views[c].shards)
                protobuf_c_message_free_unpacked(&views[c].shards->base, NULL);
    }
    topo_unref(t);
    return short_groups;
}

static void show_time(uint64_t unix_ms)
{
    time_t s = (time_t)(unix_ms / 1000);
    struct tm tm;
    char buf[32];
    gmtime_r(&s, &tm);
    strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
    fputs(buf, stdout);
}

/* The merger's last round; returns 0 when it answered and its last round
 * had no error and covered every pull. */
static int show_merger(const struct online *opts, const char *addr)
{
    struct online o;
    struct rpc_status st;
    Bloomgrid__V1__MergerStatusRequest rq = BLOOMGRID__V1__MERGER_STATUS_REQUEST__INIT;
    Bloomgrid__V1__MergerStatus *ms = NULL;

    if (open_on(&o, opts, addr) != 0)
        return -1;
    if (rpc_call(o.ch, "/bloomgrid.v1.Merger/Status", &rq.base,
                 &bloomgrid__v1__merger_status__descriptor, (ProtobufCMessage **)&ms,
                 o.deadline_ms, &st) < 0) {
        printf("merger %s: Status failed: %s: %s\n", addr, rpc_status_name(st.code),
               st.message);
        online_close(&o);
        return -1;
    }
    int rc = 0;
    const Bloomgrid__V1__RoundReport *r = ms->last;
    if (!r || !r->round) {
        printf("merger %s: no round yet\n", addr);
    } else {
        uint64_t lag = 0;
        for (size_t i = 0; i < r->n_targets; i++)
            if (r->targets[i]->lag_ms > lag)
                lag = r->targets[i]->lag_ms;
        printf("merger %s: %llu rounds; last round %llu at ", addr,
               (unsigned long long)ms->rounds, (unsigned long long)r->round);
        show_time(r->started_unix_ms);
        printf(", %llu ms: %llu pages pulled (%llu bytes), %llu pushed (%llu bytes), "
               "%u errors, %u pulls short of the read quorum; largest lag %llu ms\n",
               (unsigned long long)r->duration_ms, (unsigned long long)r->pages_pulled,
               (unsigned long long)r->bytes_pulled, (unsigned long long)r->pages_pushed,
               (unsigned long long)r->bytes_pushed, r->errors, r->uncovered,
               (unsigned long long)lag);
        for (size_t i = 0; i < r->n_messages; i++)
            printf("  %s\n", r->messages[i]);
        rc = r->errors || r->uncovered ? -1 : 0;
    }
    protobuf_c_message_free_unpacked(&ms->base, NULL);
    online_close(&o);
    return rc;
}

int cmd_online_status(int argc, char **argv)
{
    struct online o;
    const char *topology = NULL, *merger = NULL;
    int c, rc;

    online_cmd_init(&o);
    cli_getopt_reset();
    while ((c = getopt_long(argc, argv, ":h", status_longopts, NULL)) != -1) {
        if (c == OPT_TOPOLOGY) {
            topology = optarg;
        } else if (c == OPT_MERGER) {
            merger = optarg;
        } else if ((rc = online_common_opt(&o, "status", c, argv))) {
            return rc == CLI_HELP_SHOWN ? CLI_OK : rc;
        }
    }
    if ((rc = online_need_args("status", argc - optind, 0, "")))
        return rc;
    if (!topology && !o.server && !merger)
        return cli_fail("status: name --topology FILE, --server ROUTER or --merger "
                        "HOST:PORT (see 'bloomgrid help status')");
    if (!o.deadline_ms)
        o.deadline_ms = STATUS_DEADLINE_MS;
    bool healthy = true;
    if (o.server) {
        struct online r;
        struct rpc_status st;
        if (open_on(&r, &o, o.server) != 0)
            return CLI_ERR;
        int ready = health_of(&r, READY_NAME, &st);
        if (ready < 0)
            printf("router %s: unreachable: %s: %s\n", o.server,
                   rpc_status_name(st.code), st.message);
        else
            printf("router %s: %s\n", o.server,
                   ready ? "serving" : "NOT_SERVING (a group has fewer serving "
                                       "copies than its read quorum)");
        healthy = healthy && ready > 0;
        online_close(&r);
    }
    if (topology) {
        int n = show_groups(&o, topology);
        if (n < 0)
            return CLI_ERR;
        healthy = healthy && n == 0;
    }
    if (merger && show_merger(&o, merger) < 0)
        healthy = false;
    if (fflush(stdout) == EOF)
        return cli_fail("cannot write the output");
    return healthy ? CLI_OK : CLI_NO;
}
