/* bloomgrid-router: the public BloomGrid API in front of many nodes.
 *
 * Start-up: parse settings, load the topology (refusing to start on a bad
 * one), block SIGINT/SIGTERM/SIGHUP (before grpc_init so every gRPC thread
 * inherits the mask), start listening.  The main thread waits for signals:
 * SIGHUP reloads the topology (calls in flight keep the one they started
 * with; a bad file is refused and logged with its line) and the TLS files,
 * SIGTERM/SIGINT stop the server (in-flight calls finish or are cancelled)
 * and exit 0.  With TLS the router serves TLS and calls the nodes'
 * internal listeners with its certificate (tls_cert) as the client's.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/grpc.h>

#include "bloomgrid/v1/bloomgrid.pb-c.h"
#include "log.h"
#include "proc_accept.h"
#include "proc_malloc.h"
#include "router.h"
#include "router_resp.h"
#include "resp_door.h"
#include "router_canary.h"
#include "router_config.h"
#include "router_health.h"
#include "router_rpc.h"
#include "metrics.h"
#include "metrics_http.h"
#include "rpc_listen.h"
#include "rpc_metrics.h"
#include "rpc_auth.h"
#include "rpc_server.h"
#include "rpc_reflect.h"
#include "rpc_runtime.h"
#include "rpc_tls.h"
#include "topo.h"
#include "svc_notify.h"


static void log_topology(const struct topo *t)
{
    log_info("topology version %llu, %u groups", (unsigned long long)t->version,
             t->ngroups);
    for (unsigned i = 0; i < t->ngroups; i++)
        log_info("group %s: %u copies from %s, write quorum %u, read quorum %u%s%s",
                 t->groups[i].name, t->groups[i].ncopies, t->groups[i].copies[0],
                 t->groups[i].write_quorum, t->groups[i].read_quorum,
                 t->groups[i].datacenter[0] ? ", datacenter " : "",
                 t->groups[i].datacenter);
}

/* At every scrape: what max_memory_mb counts now, and its bound. */
static void budget_sampler(void *arg, struct metrics_out *out)
{
    struct router *r = arg;
    uint64_t used, max;
    if (!r->srv)
        return;
    rpc_server_budget(r->srv, &used, &max);
    metrics_emit(out, METRIC_GAUGE, "bloomgrid_router_memory_charged_bytes",
                 "bytes of requests the router holds, counted against max_memory_mb",
                 NULL, (double)used);
    metrics_emit(out, METRIC_GAUGE, "bloomgrid_router_memory_max_bytes",
                 "max_memory_mb in bytes", NULL, (double)max);
}

/* SIGHUP: calls in flight keep the topology they started with. */
static void reload_topology(void *arg)
{
    struct router *r = arg;
    char err[TOPO_ERRLEN];

    if (router_reload(r, err) < 0) {
        log_error("SIGHUP: topology refused, the old one stays: %s", err);
        return;
    }
    struct topo *nt = router_topo(r);
    log_info("SIGHUP: topology %s reloaded: %u groups", r->cfg.topology, nt->ngroups);
    log_topology(nt);
    topo_unref(nt);
}

int main(int argc, char **argv)
{
    static struct router r;
    struct router_config cfg;
    char err[TOPO_ERRLEN];
    /* Before any thread: see proc_malloc.h (TLB shootdowns per call). */
    proc_malloc_tune();
    /* A connection past the descriptor limit must not close the listener. */
    proc_accept_guard();

    int rc = router_config_load(&cfg, argc, argv);
    if (rc != 0)
        return rc > 0 ? 0 : 2;
    enum log_level lvl;
    if (log_level_parse(cfg.log_level, &lvl) == 0)
        log_set_level(lvl);
    enum log_format lf;
    if (log_format_parse(cfg.log_format, &lf) == 0)
        log_set_format(lf);
    log_set_ident("bloomgrid-router");
    struct rpc_listen_rule rule = {
        .listen = cfg.listen, .tls_cert = cfg.tls_cert, .tls_key = cfg.tls_key,
        .tls_ca = cfg.tls_ca, .insecure = cfg.insecure,
        .tokens = cfg.tokens_file[0] != 0,
    };
    struct rpc_tls *tls = NULL;
    if (rpc_listen_setup(&rule, argv[0], &tls) < 0)
        return 2;

    /* The tokens callers present and the one the router's calls to the
     * nodes send: a file that does not parse stops the start. */
    struct rpc_auth *auth = NULL;
    char aerr[RPC_AUTH_ERRLEN];
    if (rpc_auth_setup(cfg.tokens_file, cfg.token_file, &auth, aerr) < 0) {
        fprintf(stderr, "%s: %s\n", argv[0], aerr);
        return 2;
    }

    struct topo *t = topo_load(cfg.topology, err);
    if (!t) {
        fprintf(stderr, "%s: bad topology: %s\n", argv[0], err);
        return 2;
    }
    if (router_init(&r, &cfg, t) < 0) {
        fprintf(stderr, "%s: out of memory\n", argv[0]);
        return 1;
    }
    if (cfg.default_shards <= t->ngroups)
        log_warn("default_shards %llu is not more than the %u groups: some groups "
                 "get no shard of a filter created with the default",
                 (unsigned long long)cfg.default_shards, t->ngroups);
    log_info("topology %s: %u groups", cfg.topology, t->ngroups);
    log_topology(t);

    /* The Redis door (docs/RESP.md): its listening rule before anything
     * listens. */
    struct resp_settings_in rs = {
        .resp_listen = cfg.resp_listen,
        .resp_max_connections = cfg.resp_max_connections,
        .resp_pipeline_bytes = cfg.resp_pipeline_bytes,
        .resp_autocreate = cfg.resp_autocreate,
        .resp_autocreate_capacity = cfg.resp_autocreate_capacity,
        .resp_autocreate_error_rate = cfg.resp_autocreate_error_rate,
        .max_batch_keys = cfg.max_batch_keys, .max_key_size = cfg.max_key_size,
        .max_message_size = cfg.max_message_size, .conn_idle_ms = cfg.conn_idle_ms,
    };
    struct resp_backend rbe;
    struct router_resp *rr = router_resp_new(&r);
    if (!rr) {
        log_error("out of memory");
        return 1;
    }
    router_resp_backend(rr, &rbe);
    struct resp_door_conf rdc = {.set = &rs, .prog = "bloomgrid-router", .tls = tls,
                                 .auth = auth, .insecure = cfg.insecure, .be = &rbe};
    struct resp_door *door = NULL;
    if (resp_door_check(&rdc) < 0)
        return 2;
    /* The door's commands that wait for the nodes (a filter not yet seen
     * complete, a creation, BF.INFO, DEL) run on libuv's pool: as many
     * threads as the server's workers for such calls, unless the
     * environment says otherwise (read by libuv at its first use). */
    char pool[24];
    snprintf(pool, sizeof pool, "%llu", (unsigned long long)cfg.threads);
    setenv("UV_THREADPOOL_SIZE", pool, 0);

    rpc_signals_block();
    rpc_signals_on_hup(reload_topology, &r);
    if (tls)
        rpc_signals_on_hup(rpc_tls_reload_hook, tls);
    if (auth)
        rpc_signals_on_hup(rpc_auth_reload_hook, auth);
    rpc_runtime_init();
    grpc_init();
    struct metrics_http *mh;
    struct rpc_metrics_conf mc = {cfg.metrics_listen, cfg.metrics_tls, tls, cfg.insecure};
    if (rpc_metrics_start(&mc, "bloomgrid-router", &mh) < 0)
        return 2;

    struct rpc_server_config sc = {
        .listen = cfg.listen,
        .tls = tls,
        .threads = (int)cfg.threads,
        .loops = (int)cfg.loops,
        .max_deferred = (int)cfg.max_deferred,
        .max_message = cfg.max_message_size,
        .grace_ms = (int)cfg.shutdown_grace_ms,
        .max_streams = (int)cfg.max_streams,
        .stream_idle_ms = (int)cfg.stream_idle_ms,
        .conn_idle_ms = (int)cfg.conn_idle_ms,
        .request_budget = (size_t)cfg.max_memory_mb << 20,
        .budget_setting = "max_memory_mb",
    };
    r.srv = rpc_server_create(&sc);
    if (!r.srv) {
        log_error("cannot create the gRPC server");
        return 1;
    }
    metrics_add_sampler(metrics_registry(), budget_sampler, &r);
    /* The links' streams live on the loops: closed before the loops stop. */
    rpc_server_on_drain(r.srv, router_close_links, &r);
    if (bloomgrid__v1__bloom_grid__descriptor.n_methods != router_rpc_public_count) {
        log_error("handler table does not match the service descriptor");
        return 1;
    }
    int hli = rpc_listen_add_health(r.srv, cfg.health_listen);
    if (hli < 0)
        return 1;
    rpc_server_add_service_on(r.srv, &bloomgrid__v1__bloom_grid__descriptor,
                              router_rpc_public, &r, rpc_listen_not(hli));
    rpc_server_set_auth(r.srv, auth);
    static const char *const served[] = {"bloomgrid.v1.BloomGrid", "grpc.health.v1.Health",
                                         NULL};
    if (rpc_reflect_add_on(r.srv, served, rpc_listen_not(hli)) != 0)
        log_warn("gRPC reflection unavailable");
    /* The canary's first round is one interval away: after the start
     * (a state file refused stops it before any thread runs). */
    struct router_canary *canary;
    char cerr[CANARY_ERRLEN];
    if (router_canary_start(&r, &canary, cerr) < 0) {
        fprintf(stderr, "%s: not starting: %s\n", argv[0], cerr);
        return 2;
    }
    /* "" is liveness; readiness and the filters' names follow the probe
     * of the nodes (router_health.h). */
    struct router_health *health = router_health_start(&r);
    if (!health) {
        log_error("cannot start the health probe thread");
        return 1;
    }
    int port = rpc_server_start(r.srv);
    if (port < 0) {
        log_error("not starting: cannot listen on %s (see above)", cfg.listen);
        /* The probe thread sets health on the server: stopped first. */
        router_health_stop(health);
        router_canary_stop(canary);
        metrics_http_stop(mh);    /* its sampler reads the server */
        rpc_server_destroy(r.srv);
        grpc_shutdown();
        return 1;
    }
    rpc_server_set_health(r.srv, "", true);
    if (resp_door_start(&rdc, &door) < 0) {
        router_health_stop(health);
        router_canary_stop(canary);
        rpc_server_shutdown(r.srv);
        rpc_server_destroy(r.srv);
        return 2;
    }
    if (door && tls)
        rpc_signals_on_hup(resp_door_reload_tls, door);   /* after tls's own */
    /* Tests and scripts read the bound ports from this line. */
    char host[256], hnote[300], rnote[300];
    rpc_listen_host(cfg.listen, host, sizeof host);
    rpc_listen_health_note(r.srv, hli, cfg.health_listen, hnote, sizeof hnote);
    resp_door_note(door, rnote, sizeof rnote);
    log_announce("bloomgrid-router listening on %s:%d%s%s", host, port, hnote, rnote);
    char snote[128];
    if (cfg.default_shard_mb)
        snprintf(snote, sizeof snote, "one shard per %llu MiB of bits, at least one "
                 "per group, at most %llu", (unsigned long long)cfg.default_shard_mb,
                 (unsigned long long)cfg.default_shards);
    else
        snprintf(snote, sizeof snote, "%llu shards", (unsigned long long)cfg.default_shards);
    log_info("listening on %s:%d (%s; topology %s; a filter made without a shard count: "
             "%s)", host, port, tls ? "TLS" : "plaintext", cfg.topology, snote);
    svc_notify_ready("routing on %s:%d, topology %s", host, port, cfg.topology);

    int sig = rpc_signals_wait();
    log_info("%s: shutting down", strsignal(sig));
    rpc_server_set_health(r.srv, "", false);
    rpc_server_set_health(r.srv, "bloomgrid.v1.BloomGrid", false);
    /* The probe and the canary call the nodes: stopped before the links
     * close (in the shutdown). */
    router_health_stop(health);
    router_canary_stop(canary);
    /* The door's calls in flight end on the links, still open. */
    resp_door_stop(door);
    router_resp_free(rr);
    rpc_server_shutdown(r.srv);
    /* Scrapes end before the server their sampler reads is freed. */
    metrics_http_stop(mh);
    rpc_server_destroy(r.srv);
    router_deinit(&r);
    rpc_tls_destroy(tls);
    rpc_auth_destroy(auth);
    /* No grpc_shutdown(): every call and the server are gone and the data
     * is closed, but the core's executor thread may sleep until its next
     * timer (up to 10 s measured) before the shutdown can join it, and the
     * process is about to exit anyway. */
    log_info("stopped");
    return 0;
}
