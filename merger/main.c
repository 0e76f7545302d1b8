/* bloomgrid-merger: merges every datacenter's shards and imported partial
 * files into one global snapshot and pushes the changes back to every
 * copy of every group (docs/MERGER.md).
 *
 * Start-up: parse settings (merger_config) and the sources file, block
 * SIGINT/SIGTERM/SIGUSR1 (before grpc_init so every gRPC thread inherits
 * the mask), load the saved state, start the round thread (merger_runner)
 * and serve bloomgrid.v1.Merger (merger_rpc) and health.  The main thread
 * waits for signals: SIGUSR1 asks for a round, SIGHUP re-reads the TLS
 * files and the tokens file, SIGTERM/SIGINT stop (the running round
 * finishes, waiting RunRound calls get UNAVAILABLE) and exit 0.  With TLS
 * the merger calls the nodes' internal listeners with its certificate as
 * the client's, and its own listener verifies a client certificate when one
 * is offered (a cluster process) without requiring one.  With --once the merger runs one round, prints its report and exits
 * (0 when the round had no error, 1 otherwise), without serving.
 */
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/grpc.h>

#include "bloomgrid/v1/merger.pb-c.h"
#include "log.h"
#include "proc_accept.h"
#include "proc_malloc.h"
#include "svc_notify.h"
#include "merger.h"
#include "merger_config.h"
#include "merger_metrics.h"
#include "merger_rpc.h"
#include "merger_runner.h"
#include "metrics_http.h"
#include "rpc_listen.h"
#include "rpc_metrics.h"
#include "rpc_auth.h"
#include "rpc_server.h"
#include "rpc_reflect.h"
#include "rpc_runtime.h"
#include "rpc_tls.h"

static const char *const health_names[] = {"", "bloomgrid.v1.Merger"};

static void set_health(struct rpc_server *srv, bool serving)
{
    for (size_t i = 0; i < sizeof health_names / sizeof health_names[0]; i++)
        rpc_server_set_health(srv, health_names[i], serving);
}

static int run_once(struct merger *m)
{
    struct mg_report rep;
    int errors = merger_round(m, &rep);

    mg_report_log(&rep);
    mg_report_print(stdout, &rep);
    fflush(stdout);
    mg_report_free(&rep);
    return errors ? 1 : 0;
}

/* SIGUSR1: a round now. */
static void ask_round(void *runner)
{
    merger_runner_ask(runner);
}

/* Serve until SIGTERM/SIGINT.  Returns the exit code. */
static int serve(struct merger *m, const struct merger_config *cfg, int nf,
                 struct rpc_tls *tls, struct rpc_auth *auth)
{
    struct rpc_server_config sc = {.listen = cfg->listen, .threads = 2,
                                   .max_message = cfg->max_message_size,
                                   .grace_ms = 1000, .tls = tls,
                                   .peer = RPC_TLS_PEER_VERIFY};
    struct merger_rpc mr = {.m = m};
    struct rpc_server *srv = NULL;
    int port = -1, sig = 0;

    if (bloomgrid__v1__merger__descriptor.n_methods !=
        merger_rpc_handler_count) {
        log_error("handler table does not match the service descriptor");
        return 1;
    }
    if (!(mr.run = merger_runner_start(m, cfg->interval_s * 1000))) {
        log_error("cannot start the round thread");
        return 1;
    }
    static const char *const served[] = {"bloomgrid.v1.Merger", "grpc.health.v1.Health",
                                         NULL};
    int hli = -1;
    if ((srv = rpc_server_create(&sc))) {
        rpc_server_set_auth(srv, auth);
        hli = rpc_listen_add_health(srv, cfg->health_listen);
    }
    if (!srv || hli < 0 ||
        rpc_server_add_service_on(srv, &bloomgrid__v1__merger__descriptor,
                                  merger_rpc_handlers, &mr, rpc_listen_not(hli)) < 0 ||
        rpc_reflect_add_on(srv, served, rpc_listen_not(hli)) < 0 ||
        (port = rpc_server_start(srv)) < 0) {
        fprintf(stderr, "bloomgrid-merger: cannot serve on %s: %s\n",
                cfg->listen, port < 0 ? strerror(-port) : "bad settings");
        merger_runner_destroy(mr.run);
        rpc_server_destroy(srv);
        return 1;
    }
    /* Tests and scripts read the bound port from this line. */
    char host[256], hnote[300];
    rpc_listen_host(cfg->listen, host, sizeof host);
    rpc_listen_health_note(srv, hli, cfg->health_listen, hnote, sizeof hnote);
    log_announce("bloomgrid-merger listening on %s:%d%s", host, port, hnote);
    log_info("merger listening on %s:%d, %d filters, state in %s, a round "
             "every %" PRIu64 " s", host, port, nf, cfg->state_dir,
             cfg->interval_s);
    set_health(srv, true);
    svc_notify_ready("merging %d filters, a round every %" PRIu64 " s", nf, cfg->interval_s);
    rpc_signals_on_usr1(ask_round, mr.run);
    if (tls)
        rpc_signals_on_hup(rpc_tls_reload_hook, tls);
    if (auth)
        rpc_signals_on_hup(rpc_auth_reload_hook, auth);
    sig = rpc_signals_wait();
    log_info("merger stopping (%s)", strsignal(sig));
    set_health(srv, false);
    /* The runner first: RunRound calls waiting for a round end at once. */
    merger_runner_stop(mr.run);
    rpc_server_shutdown(srv);
    rpc_server_destroy(srv);
    merger_runner_destroy(mr.run);
    return 0;
}

int main(int argc, char **argv)
{
    static struct mg_filter_conf filters[MG_MAX_FILTERS];
    struct merger_config cfg;
    char err[MG_ERRLEN];
    /* Before any thread: see proc_malloc.h (TLB shootdowns per call). */
    proc_malloc_tune();
    /* A connection past the descriptor limit must not close the listener. */
    proc_accept_guard();
    bool once;
    enum log_level lvl;
    sigset_t set;

    int rc = merger_config_load(&cfg, &once, argc, argv);
    if (rc != 0)
        return rc > 0 ? 0 : 2;
    if (log_level_parse(cfg.log_level, &lvl) == 0)
        log_set_level(lvl);
    enum log_format lf;
    if (log_format_parse(cfg.log_format, &lf) == 0)
        log_set_format(lf);
    log_set_ident("bloomgrid-merger");
    struct rpc_listen_rule rule = {
        .listen = once ? NULL : cfg.listen, .tls_cert = cfg.tls_cert,
        .tls_key = cfg.tls_key, .tls_ca = cfg.tls_ca, .insecure = cfg.insecure,
        .tokens = cfg.tokens_file[0] != 0,
    };
    struct rpc_tls *tls = NULL;
    if (rpc_listen_setup(&rule, argv[0], &tls) < 0)
        return 2;
    int nf = merger_sources_load(cfg.sources, filters, MG_MAX_FILTERS, err);
    if (nf < 0) {
        fprintf(stderr, "%s: %s\n", argv[0], err);
        return 2;
    }
    /* The tokens callers present and the one the merger's calls to the
     * nodes send: a file that does not parse stops the start. */
    struct rpc_auth *auth = NULL;
    if (rpc_auth_setup(cfg.tokens_file, cfg.token_file, &auth, err) < 0) {
        fprintf(stderr, "%s: %s\n", argv[0], err);
        return 2;
    }
    /* SIGUSR1 runs a round (rpc_signals_on_usr1): blocked in every thread. */
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    rpc_signals_block();
    rpc_runtime_init();
    grpc_init();
    struct metrics_http *mh;
    struct rpc_metrics_conf mc = {once ? "" : cfg.metrics_listen, cfg.metrics_tls, tls,
                                  cfg.insecure};
    if (rpc_metrics_start(&mc, "bloomgrid-merger", &mh) < 0)
        return 2;
    merger_metrics_register();
    struct merger *m = merger_create(&cfg, filters, (size_t)nf, err);
    if (!m) {
        fprintf(stderr, "%s: %s\n", argv[0], err);
        grpc_shutdown();
        return 1;
    }
    rc = once ? run_once(m) : serve(m, &cfg, nf, tls, auth);
    merger_destroy(m);
    rpc_tls_destroy(tls);
    rpc_auth_destroy(auth);
    metrics_http_stop(mh);
    /* No grpc_shutdown(): every call and the server are gone and the data
     * is closed, but the core's executor thread may sleep until its next
     * timer (up to 10 s measured) before the shutdown can join it, and the
     * process is about to exit anyway. */
    return rc;
}
