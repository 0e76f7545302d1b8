/* merger_rpc: Merger.Status and Merger.RunRound (see merger_rpc.h).
 *
 * Both requests are empty messages, but they are parsed all the same: bytes
 * that are not the request message are a client's mistake (another method's
 * message, a broken encoder) and get INVALID_ARGUMENT before anything runs.
 */
#include "merger_rpc.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "bloomgrid/v1/merger.pb-c.h"

/* Does the request parse as a message of desc?  Sets the reply when not. */
static bool request_ok(const ProtobufCMessageDescriptor *desc,
                       const uint8_t *req, size_t len, struct rpc_reply *reply)
{
    ProtobufCMessage *msg = protobuf_c_message_unpack(desc, NULL, len, req);

    if (!msg) {
        rpc_reply_error(reply, GRPC_STATUS_INVALID_ARGUMENT,
                        "the request (%zu bytes) is not a valid %s message; "
                        "nothing was done", len, desc->name);
        return false;
    }
    protobuf_c_message_free_unpacked(msg, NULL);
    return true;
}

/* The wire form of a report: tl and tlp have r->nlag entries, gp and gpp
 * r->npull, names r->npull * MG_MAX_COPIES, msgs MG_REPORT_MSGS.  Every
 * pointer of w points into r or those arrays. */
struct wire_report {
    Bloomgrid__V1__RoundReport w;
    Bloomgrid__V1__TargetLag *tl, **tlp;
    Bloomgrid__V1__GroupPull *gp, **gpp;
    char **names;
    char *msgs[MG_REPORT_MSGS];
};

static void wire_free(struct wire_report *x)
{
    free(x->tl);
    free(x->tlp);
    free(x->gp);
    free(x->gpp);
    free(x->names);
}

/* The copies of p in state st, as a repeated string taken from names. */
static char **pull_list(const struct mg_pull_rep *p, enum mg_pull_state st,
                        char ***names, size_t *n)
{
    char **first = *names;

    *n = 0;
    for (unsigned c = 0; c < p->ncopies; c++)
        if (p->state[c] == st) {
            *(*names)++ = (char *)p->copy[c];
            (*n)++;
        }
    return first;
}

static int report_to_wire(const struct mg_report *r, struct wire_report *x)
{
    Bloomgrid__V1__RoundReport *w = &x->w;

    memset(x, 0, sizeof *x);
    x->tl = calloc(r->nlag + 1, sizeof *x->tl);
    x->tlp = calloc(r->nlag + 1, sizeof *x->tlp);
    x->gp = calloc(r->npull + 1, sizeof *x->gp);
    x->gpp = calloc(r->npull + 1, sizeof *x->gpp);
    x->names = calloc(r->npull * MG_MAX_COPIES + 1, sizeof *x->names);
    if (!x->tl || !x->tlp || !x->gp || !x->gpp || !x->names) {
        wire_free(x);
        return -ENOMEM;
    }
    bloomgrid__v1__round_report__init(w);
    w->round = r->round;
    w->started_unix_ms = r->started_ms;
    w->duration_ms = r->duration_ms;
    w->bytes_pulled = r->bytes_pulled;
    w->bytes_pushed = r->bytes_pushed;
    w->pages_pulled = r->pages_pulled;
    w->pages_pushed = r->pages_pushed;
    w->pages_changed = r->pages_changed;
    w->errors = r->errors;
    w->uncovered = r->uncovered;
    w->keys_pulled = r->keys_pulled;
    w->keys_pushed = r->keys_pushed;
    w->pushes_later = r->pushes_later;
    for (unsigned i = 0; i < r->nmsg; i++)
        x->msgs[i] = (char *)r->msg[i];
    w->n_messages = r->nmsg;
    w->messages = x->msgs;
    for (size_t i = 0; i < r->nlag; i++) {
        Bloomgrid__V1__TargetLag *t = &x->tl[i];
        bloomgrid__v1__target_lag__init(t);
        t->filter = (char *)r->lag[i].filter;
        t->shard_index = r->lag[i].shard;
        t->datacenter = (char *)r->lag[i].dc;
        t->node = (char *)r->lag[i].node;
        t->replica = r->lag[i].replica;
        t->version = r->lag[i].version;
        t->lag_ms = r->lag[i].lag_ms;
        t->error = (char *)r->lag[i].error;
        x->tlp[i] = t;
    }
    w->n_targets = r->nlag;
    w->targets = x->tlp;
    char **names = x->names;
    for (size_t i = 0; i < r->npull; i++) {
        const struct mg_pull_rep *p = &r->pull[i];
        Bloomgrid__V1__GroupPull *g = &x->gp[i];
        bloomgrid__v1__group_pull__init(g);
        g->filter = (char *)p->filter;
        g->shard_index = p->shard;
        g->datacenter = (char *)p->dc;
        g->group = (char *)p->group;
        g->read_quorum = p->read_quorum;
        g->pulled = pull_list(p, MG_PULLED, &names, &g->n_pulled);
        g->syncing = pull_list(p, MG_SYNCING, &names, &g->n_syncing);
        g->failed = pull_list(p, MG_FAILED, &names, &g->n_failed);
        g->not_asked = pull_list(p, MG_NOT_ASKED, &names, &g->n_not_asked);
        g->covered = p->covered;
        x->gpp[i] = g;
    }
    w->n_pulls = r->npull;
    w->pulls = x->gpp;
    return 0;
}

/* Reply with the last report (and, for Status, the totals). */
static void reply_report(struct merger_rpc *mr, struct rpc_reply *reply,
                         bool status)
{
    struct mg_report r;
    uint64_t rounds, total;
    struct wire_report x;

    merger_last_report(mr->m, &r, &rounds, &total);
    if (report_to_wire(&r, &x) < 0) {
        rpc_reply_error(reply, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        mg_report_free(&r);
        return;
    }
    if (status) {
        Bloomgrid__V1__MergerStatus ms = BLOOMGRID__V1__MERGER_STATUS__INIT;
        ms.last = &x.w;
        ms.rounds = rounds;
        ms.bytes_shipped_total = total;
        ms.running = merger_runner_busy(mr->run);
        rpc_reply_pack(reply, &ms.base);
    } else {
        rpc_reply_pack(reply, &x.w.base);
    }
    wire_free(&x);
    mg_report_free(&r);
}

static void h_status(void *arg, const uint8_t *req, size_t len,
                     struct rpc_reply *reply)
{
    if (request_ok(&bloomgrid__v1__merger_status_request__descriptor, req,
                   len, reply))
        reply_report(arg, reply, true);
}

/* RunRound: ask for a round and wait until a round started after the ask
 * has finished. */
static void h_run_round(void *arg, const uint8_t *req, size_t len,
                        struct rpc_reply *reply)
{
    struct merger_rpc *mr = arg;

    if (!request_ok(&bloomgrid__v1__run_round_request__descriptor, req, len,
                    reply))
        return;
    if (merger_runner_wait(mr->run) < 0)
        rpc_reply_error(reply, GRPC_STATUS_UNAVAILABLE,
                        "the merger is stopping");
    else
        reply_report(mr, reply, false);
}

const struct rpc_handler merger_rpc_handlers[] = {
    {.unary = h_status},
    {.unary = h_run_round},
};

const size_t merger_rpc_handler_count =
    sizeof merger_rpc_handlers / sizeof merger_rpc_handlers[0];
