/* merger_rpc: Merger.Status and Merger.RunRound (see merger_rpc.h).
 *
 * Both requests are empty messages, but they are parsed all the same: bytes
 * that are not the request message are a client's mistake (another method's
 * message, a broken encoder) and get INVALID_ARGUMENT before anything runs.
 */
#include "merger_rpc.h"

#include <stdlib.h>

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

/* The wire form of a report; tl and tlp have r->nlag entries, msgs 16.
 * Every pointer of w points into r, tl, tlp or msgs. */
static void report_to_wire(const struct mg_report *r,
                           Bloomgrid__V1__RoundReport *w,
                           Bloomgrid__V1__TargetLag *tl,
                           Bloomgrid__V1__TargetLag **tlp, char **msgs)
{
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
    for (unsigned i = 0; i < r->nmsg; i++)
        msgs[i] = (char *)r->msg[i];
    w->n_messages = r->nmsg;
    w->messages = msgs;
    for (size_t i = 0; i < r->nlag; i++) {
        bloomgrid__v1__target_lag__init(&tl[i]);
        tl[i].filter = (char *)r->lag[i].filter;
        tl[i].shard_index = r->lag[i].shard;
        tl[i].datacenter = (char *)r->lag[i].dc;
        tl[i].node = (char *)r->lag[i].node;
        tl[i].replica = r->lag[i].replica;
        tl[i].version = r->lag[i].version;
        tl[i].primary_version = r->lag[i].primary_version;
        tl[i].lag_ms = r->lag[i].lag_ms;
        tl[i].error = (char *)r->lag[i].error;
        tlp[i] = &tl[i];
    }
    w->n_targets = r->nlag;
    w->targets = tlp;
}

/* Reply with the last report (and, for Status, the totals). */
static void reply_report(struct merger_rpc *mr, struct rpc_reply *reply,
                         bool status)
{
    struct mg_report r;
    uint64_t rounds, total;
    char *msgs[MG_REPORT_MSGS];
    Bloomgrid__V1__RoundReport w;

    merger_last_report(mr->m, &r, &rounds, &total);
    Bloomgrid__V1__TargetLag *tl = calloc(r.nlag + 1, sizeof *tl);
    Bloomgrid__V1__TargetLag **tlp = calloc(r.nlag + 1, sizeof *tlp);
    if (!tl || !tlp) {
        rpc_reply_error(reply, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    report_to_wire(&r, &w, tl, tlp, msgs);
    if (status) {
        Bloomgrid__V1__MergerStatus ms = BLOOMGRID__V1__MERGER_STATUS__INIT;
        ms.last = &w;
        ms.rounds = rounds;
        ms.bytes_shipped_total = total;
        ms.running = merger_runner_busy(mr->run);
        rpc_reply_pack(reply, &ms.base);
    } else {
        rpc_reply_pack(reply, &w.base);
    }
out:
    free(tl);
    free(tlp);
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
