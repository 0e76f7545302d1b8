/* bloomgrid-merger: merges every datacenter's shards and imported partial
 * files into one global snapshot and pushes the changes back to every
 * primary and read replica (docs/MERGER.md).
 *
 * Threads: the main thread waits for signals (SIGINT/SIGTERM stop,
 * SIGUSR1 asks for a round); one round thread runs a round every
 * interval_s seconds or when asked (SIGUSR1, the Merger.RunRound call);
 * the RPC server's threads answer Status and RunRound.  With --once the
 * merger runs one round, prints its report and exits (0 when the round had
 * no error, 1 otherwise), without serving.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <grpc/grpc.h>

#include "bloomgrid/v1/merger.pb-c.h"
#include "log.h"
#include "merger.h"
#include "rpc_server.h"
#include "settings.h"

#define F(f) SETTING_FIELD(struct merger_config, f)

static const struct setting settings[] = {
    {"listen", SETTING_STRING, 0, 0, NULL, "127.0.0.1:7600", F(listen),
     "address to serve the Merger status service and health on, host:port "
     "(port 0 picks a free port)"},
    {"state_dir", SETTING_STRING, 0, 0, NULL, "./bloomgrid-merger", F(state_dir),
     "directory of the global snapshots (<filter>/shard-<i>.bf) and of what "
     "was last pulled from each datacenter (<filter>/shard-<i>.state)"},
    {"sources", SETTING_STRING, 0, 0, NULL, "./merger-sources.ini", F(sources),
     "sources file: per filter, [filter NAME] with repeatable keys "
     "\"datacenter = NAME TOPOLOGY-FILE\" (a cluster: its primaries are "
     "pulled, its primaries and replicas pushed to; or HOST:PORT of a single "
     "node) and \"partial = FILE\" "
     "(a filter file of the same geometry and secret, ORed in whenever it "
     "changes)"},
    {"interval_s", SETTING_UINT, 1, 86400, NULL, "60", F(interval_s),
     "seconds between rounds (SIGUSR1 or Merger.RunRound start one at once)"},
    {"node_timeout_ms", SETTING_UINT, 100, 3600000, NULL, "10000",
     F(node_timeout_ms), "deadline of a unary call to a node; page streams get "
     "four times as much"},
    {"max_message_size", SETTING_UINT, 1u << 20, 1u << 30, NULL, "67108864",
     F(max_message_size), "largest gRPC message in bytes, both directions"},
    {"workers", SETTING_UINT, 1, 256, NULL, "4", F(workers),
     "shards pulled, merged and pushed at once (threads)"},
    {"log_level", SETTING_ENUM, 0, 0, "debug|info|warn|error", "info",
     F(log_level), "least severe log level printed"},
};

static const struct settings_spec spec = {
    .program = "bloomgrid-merger",
    .section = "merger",
    .intro =
        "bloomgrid-merger pulls the pages changed since its last round from every\n"
        "datacenter's primaries (and ORs in changed partial files), keeps the union\n"
        "as a versioned global snapshot on its own disk, and pushes the changed\n"
        "pages to every datacenter's primaries and read replicas.  A quiet round\n"
        "ships nothing.  SIGUSR1 runs a round now; SIGTERM/SIGINT stop.  Serves\n"
        "bloomgrid.v1.Merger (Status, RunRound) and grpc.health.v1.Health.\n"
        "\n"
        "  --once   run one round, print its report, exit (0: no error, 1: errors)\n",
    .table = settings,
    .count = sizeof settings / sizeof settings[0],
};

struct app {
    struct merger *m;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool want, running, stop;
    uint64_t started, finished;   /* round requests, under mu */
    uint64_t interval_ms;
};

static void report_print(FILE *out, const struct mg_report *r)
{
    fprintf(out, "round %" PRIu64 ": duration_ms %" PRIu64 " bytes_pulled %"
            PRIu64 " bytes_pushed %" PRIu64 " pages_pulled %" PRIu64
            " pages_pushed %" PRIu64 " pages_changed %" PRIu64 " errors %u\n",
            r->round, r->duration_ms, r->bytes_pulled, r->bytes_pushed,
            r->pages_pulled, r->pages_pushed, r->pages_changed, r->errors);
    for (unsigned i = 0; i < r->nmsg; i++)
        fprintf(out, "  message: %s\n", r->msg[i]);
    for (size_t i = 0; i < r->nlag; i++)
        fprintf(out, "  target %s shard %u %s %s %s version %" PRIu64
                " primary_version %" PRIu64 " lag_ms %" PRIu64 "%s%s\n",
                r->lag[i].filter, r->lag[i].shard, r->lag[i].dc,
                r->lag[i].replica ? "replica" : "primary", r->lag[i].node,
                r->lag[i].version, r->lag[i].primary_version, r->lag[i].lag_ms,
                r->lag[i].error[0] ? " error " : "", r->lag[i].error);
}

static void *round_main(void *arg)
{
    struct app *a = arg;

    pthread_mutex_lock(&a->mu);
    while (!a->stop) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += (time_t)(a->interval_ms / 1000);
        while (!a->stop && !a->want)
            if (pthread_cond_timedwait(&a->cv, &a->mu, &until) == ETIMEDOUT)
                break;
        if (a->stop)
            break;
        a->want = false;
        a->running = true;
        uint64_t id = ++a->started;
        pthread_mutex_unlock(&a->mu);
        struct mg_report rep;
        merger_round(a->m, &rep);
        mg_report_log(&rep);
        mg_report_free(&rep);
        pthread_mutex_lock(&a->mu);
        a->running = false;
        a->finished = id;
        pthread_cond_broadcast(&a->cv);
    }
    pthread_mutex_unlock(&a->mu);
    return NULL;
}

static void report_to_wire(const struct mg_report *r, Bloomgrid__V1__RoundReport *w,
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
static void reply_report(struct app *a, struct rpc_reply *reply, bool status)
{
    struct mg_report r;
    uint64_t rounds, total;
    char *msgs[16];
    Bloomgrid__V1__RoundReport w;

    merger_last_report(a->m, &r, &rounds, &total);
    Bloomgrid__V1__TargetLag *tl = calloc(r.nlag + 1, sizeof *tl);
    Bloomgrid__V1__TargetLag **tlp = calloc(r.nlag + 1, sizeof *tlp);
    if (!tl || !tlp) {
        rpc_reply_error(reply, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    } else {
        report_to_wire(&r, &w, tl, tlp, msgs);
        if (status) {
            Bloomgrid__V1__MergerStatus ms = BLOOMGRID__V1__MERGER_STATUS__INIT;
            ms.last = &w;
            ms.rounds = rounds;
            ms.bytes_shipped_total = total;
            pthread_mutex_lock(&a->mu);
            ms.running = a->running;
            pthread_mutex_unlock(&a->mu);
            rpc_reply_pack(reply, &ms.base);
        } else {
            rpc_reply_pack(reply, &w.base);
        }
    }
    free(tl);
    free(tlp);
    mg_report_free(&r);
}

static void h_status(void *arg, const uint8_t *req, size_t len,
                     struct rpc_reply *reply)
{
    (void)req;
    (void)len;
    reply_report(arg, reply, true);
}

/* RunRound: ask for a round and wait until a round started after the ask
 * has finished. */
static void h_run_round(void *arg, const uint8_t *req, size_t len,
                        struct rpc_reply *reply)
{
    struct app *a = arg;

    (void)req;
    (void)len;
    pthread_mutex_lock(&a->mu);
    uint64_t need = a->started + 1;
    a->want = true;
    pthread_cond_broadcast(&a->cv);
    while (!a->stop && a->finished < need)
        pthread_cond_wait(&a->cv, &a->mu);
    bool stopped = a->finished < need;
    pthread_mutex_unlock(&a->mu);
    if (stopped)
        rpc_reply_error(reply, GRPC_STATUS_UNAVAILABLE, "the merger is stopping");
    else
        reply_report(a, reply, false);
}

static const struct rpc_handler handlers[] = {
    {.unary = h_status},
    {.unary = h_run_round},
};

static int run_once(struct merger *m)
{
    struct mg_report rep;
    int errors = merger_round(m, &rep);

    mg_report_log(&rep);
    report_print(stdout, &rep);
    fflush(stdout);
    mg_report_free(&rep);
    return errors ? 1 : 0;
}

int main(int argc, char **argv)
{
    static struct mg_filter_conf filters[MG_MAX_FILTERS];
    struct merger_config cfg;
    char err[MG_ERRLEN];
    bool once = false;
    int nargs = 0, rc;
    enum log_level lvl;

    /* --once is a mode, not a setting: take it out before the table. */
    for (int i = 0; i < argc; i++)
        if (strcmp(argv[i], "--once") == 0)
            once = true;
        else
            argv[nargs++] = argv[i];
    memset(&cfg, 0, sizeof cfg);
    rc = settings_load(&spec, &cfg, nargs, argv);
    if (rc != 0)
        return rc > 0 ? 0 : 2;
    if (log_level_parse(cfg.log_level, &lvl) == 0)
        log_set_level(lvl);
    int nf = merger_sources_load(cfg.sources, filters, MG_MAX_FILTERS, err);
    if (nf < 0) {
        fprintf(stderr, "%s: %s\n", argv[0], err);
        return 2;
    }
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGUSR1);
    sigaddset(&set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    grpc_init();
    struct merger *m = merger_create(&cfg, filters, (size_t)nf, err);
    if (!m) {
        fprintf(stderr, "%s: %s\n", argv[0], err);
        grpc_shutdown();
        return 1;
    }
    if (once) {
        rc = run_once(m);
        merger_destroy(m);
        grpc_shutdown();
        return rc;
    }
    struct app a = {.m = m, .interval_ms = cfg.interval_s * 1000, .want = true};
    pthread_mutex_init(&a.mu, NULL);
    pthread_cond_init(&a.cv, NULL);
    struct rpc_server_config sc = {.listen = cfg.listen, .threads = 2,
                                   .max_message = cfg.max_message_size,
                                   .grace_ms = 1000};
    struct rpc_server *srv = rpc_server_create(&sc);
    int port = -1;
    if (!srv ||
        rpc_server_add_service(srv, &bloomgrid__v1__merger__descriptor, handlers,
                               &a) < 0 ||
        (port = rpc_server_start(srv)) < 0) {
        fprintf(stderr, "%s: cannot serve on %s: %s\n", argv[0], cfg.listen,
                port < 0 ? strerror(-port) : "bad settings");
        rpc_server_destroy(srv);
        merger_destroy(m);
        grpc_shutdown();
        return 1;
    }
    char host[256];
    snprintf(host, sizeof host, "%s", cfg.listen);
    char *colon = strrchr(host, ':');
    if (colon)
        *colon = 0;
    printf("bloomgrid-merger listening on %s:%d\n", host, port);
    fflush(stdout);
    log_info("merger listening on %s:%d, %d filters, state in %s, a round "
             "every %" PRIu64 " s", host, port, nf, cfg.state_dir, cfg.interval_s);
    rpc_server_set_health(srv, "", true);
    rpc_server_set_health(srv, "bloomgrid.v1.Merger", true);
    pthread_t th;
    pthread_create(&th, NULL, round_main, &a);
    for (;;) {
        int sig = 0;
        sigwait(&set, &sig);
        if (sig == SIGUSR1) {
            pthread_mutex_lock(&a.mu);
            a.want = true;
            pthread_cond_broadcast(&a.cv);
            pthread_mutex_unlock(&a.mu);
            continue;
        }
        if (sig == SIGINT || sig == SIGTERM)
            break;
    }
    log_info("merger stopping");
    rpc_server_set_health(srv, "", false);
    pthread_mutex_lock(&a.mu);
    a.stop = true;
    pthread_cond_broadcast(&a.cv);
    pthread_mutex_unlock(&a.mu);
    pthread_join(th, NULL);
    rpc_server_shutdown(srv);
    rpc_server_destroy(srv);
    merger_destroy(m);
    grpc_shutdown();
    return 0;
}
