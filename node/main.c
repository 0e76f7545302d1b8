/* bloomgrid-node: serves named Bloom filters over gRPC.
 *
 * Start-up: parse settings, block SIGINT/SIGTERM/SIGHUP (before grpc_init so
 * every gRPC thread inherits the mask), start listening with health NOT_SERVING,
 * then open the store (recovering every filter) on a background thread; the
 * main thread waits for a signal.  With a topology (setting topology), the
 * node finds its group there once it knows its port (refusing to start when
 * no group lists it) and runs the thread that pulls changed pages from the
 * other copies of its group (node_replicate.c).  A housekeeping thread keeps health in
 * step with the filters' states (the store itself retries recovery of
 * filters failed by a write error; damaged files stay refused).
 * SIGHUP: re-read the settings and apply the live ones (node_config.h), and
 * re-read the topology and the TLS files, while the server keeps serving; a
 * refused file changes nothing.
 * Listeners (rpc_listen.h has the rule checked at start): listen serves the
 * public service and health; with internal_listen, the internal service
 * is served there alone (client certificates of tls_ca required with TLS),
 * and the topology lists that address; without it, on listen too.
 * Shutdown: stop the server (in-flight calls finish or are cancelled), close
 * the store (final snapshots), exit 0.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <grpc/grpc.h>

#include "bloomgrid/v1/bloomgrid.pb-c.h"
#include "bloomgrid/v1/internal.pb-c.h"
#include "log.h"
#include "proc_accept.h"
#include "proc_malloc.h"
#include "node.h"
#include "node_rpc.h"
#include "node_resp.h"
#include "resp_door.h"
#include "metrics_http.h"
#include "node_metrics.h"
#include "rpc_listen.h"
#include "rpc_metrics.h"
#include "rpc_auth.h"
#include "rpc_server.h"
#include "rpc_reflect.h"
#include "rpc_runtime.h"
#include "rpc_tls.h"
#include "settings.h"
#include "svc_notify.h"
#include "store.h"
#include "topo.h"

static atomic_int exit_code;

/* This node's address as the topology lists it (advertise, or the listen
 * host with the bound port). */
static char self_addr[TOPO_ADDR_MAX + 1];

/* Read the topology file; NULL with a message logged. */
static struct topo *topology_read(const struct node_config *c)
{
    char err[TOPO_ERRLEN];
    struct topo *t = topo_load(c->topology, err);
    if (!t) {
        log_error("topology refused: %s", err);
        return NULL;
    }
    /* Without durable writes a copy that crashed would count towards W with
     * acknowledged writes it no longer has. */
    int g = topo_group_of(t, self_addr[0] ? self_addr : c->advertise, NULL);
    if (g >= 0 && t->groups[g].ncopies > 1 && strcmp(c->durability, "none") == 0) {
        log_error("topology refused: %s: group %s has %u copies, and a copy with "
                  "durability = none would count towards the write quorum with "
                  "writes a crash loses: set durability = fsync", c->topology,
                  t->groups[g].name, t->groups[g].ncopies);
        topo_unref(t);
        return NULL;
    }
    return t;
}

/* Take t as the node's topology; false (logged, t dropped) when no group
 * lists this node. */
static bool topology_install(struct topo *t)
{
    char err[TOPO_ERRLEN + 300];
    if (node_rpc__topo_install(t, self_addr, err, sizeof err) < 0) {
        log_error("topology refused: %s", err);
        return false;
    }
    return true;
}

/* argv as given, for reloads: flags keep overriding the file. */
static struct {
    int argc;
    char **argv;
} reload_args;

static void apply_log_level(const struct node_config *c)
{
    enum log_level lvl;
    if (log_level_parse(c->log_level, &lvl) == 0)
        log_set_level(lvl);
    enum log_format lf;
    if (log_format_parse(c->log_format, &lf) == 0)
        log_set_format(lf);
}

/* SIGHUP, on the main thread. */
static void reload_settings(void *arg)
{
    struct node *n = arg;
    char err[SETTINGS_ERRLEN];
    int changed = node_config_reload(&n->cfg, reload_args.argc, reload_args.argv, err);

    if (changed < 0) {
        log_error("SIGHUP: settings refused, the running ones stay: %s", err);
        return;
    }
    apply_log_level(&n->cfg);
    log_info("SIGHUP: settings reloaded, %d changed", changed);
    if (n->cfg.topology[0]) {
        struct topo *t = topology_read(&n->cfg);
        if (!t || !topology_install(t))
            log_error("SIGHUP: the running topology stays");
    }
}

static const char *const health_names[] = {"", "bloomgrid.v1.BloomGrid",
                                           "bloomgrid.v1.Internal"};

/* Readiness and liveness (docs/ROUTER.md, "Health"): while a shard is
 * SYNCING the public service (reads) is NOT_SERVING; the overall ("",
 * liveness) and internal health follow the filters' states only, so a
 * SYNCING copy is alive and keeps taking writes and pulls. */
static void set_health(struct node *n, bool serving)
{
    bool syncing = node_sync_any(node_rpc__sync_get()) &&
                   node_rpc__group_copies() > 1;
    for (size_t i = 0; i < sizeof health_names / sizeof health_names[0]; i++)
        rpc_server_set_health(n->srv, health_names[i],
                              serving && !(syncing && i == 1));
}

/* Returns true when every filter is READY; a name reserved by a create
 * whose files are not yet in place does not count (it is not served yet,
 * and the filters that are served decide the node's health). */
static bool check_filters(struct node *n)
{
    struct store *s = node_store(n);
    char **names = NULL;
    size_t nn = 0;
    bool all_ready = true;

    if (!s || store_list(s, &names, &nn) < 0)
        return false;
    for (size_t i = 0; i < nn; i++) {
        struct store_filter *sf = store_get(s, names[i]);
        if (!sf)
            continue;
        /* creating before the state: a create that ends between the two
         * reads then shows READY, never RECOVERING without its mark. */
        bool creating = store_filter_creating(sf);
        enum store_state st = store_filter_state(sf, NULL);
        if (st != STORE_READY && st != STORE_DROPPED &&
            !(st == STORE_RECOVERING && creating))
            all_ready = false;
        store_put(sf);
    }
    store_list_free(names, nn);
    return all_ready;
}

/* Every MALLOC_CHECK_TICKS housekeeping ticks (of 200 ms), the memory
 * the allocator keeps free in its heaps goes back to the system when it
 * exceeds MALLOC_FREE_MAX: what a burst of calls (pulls, pushes, Imports,
 * large batches) freed in the arenas of many threads would otherwise stay
 * resident for good, and the next burst's peak would come on top of it. */
#define MALLOC_CHECK_TICKS 10
#define MALLOC_FREE_MAX ((size_t)32 << 20)

/* Housekeeping thread only.  Free bytes that were given back stay counted
 * free (the heaps keep their size): a trim is done again only when the
 * free bytes moved by a quarter of MALLOC_FREE_MAX since the last one (new
 * frees, or memory taken again and freed), so a quiet node does not trim
 * every tick. */
static void release_free_memory(void)
{
    static size_t at_last_trim;
    struct proc_malloc_stats ms;

    proc_malloc_stats(&ms);
    size_t moved = ms.free > at_last_trim ? ms.free - at_last_trim
                                          : at_last_trim - ms.free;
    if (ms.free <= MALLOC_FREE_MAX || moved < MALLOC_FREE_MAX / 4)
        return;
    at_last_trim = ms.free;
    if (proc_malloc_release())
        log_debug("allocator: free memory of its heaps (%zu MiB) given back "
                  "to the system", ms.free >> 20);
}

static void *housekeeping_main(void *arg)
{
    struct node *n = arg;
    char err[STORE_ERRLEN] = "";
    struct store_options o = {
        .dir = n->cfg.data_dir,
        .durability = strcmp(n->cfg.durability, "none") == 0 ? STORE_DURABLE_NONE
                                                             : STORE_DURABLE_FSYNC,
        .snapshot_interval_ms = (unsigned)(n->cfg.snapshot_interval_s * 1000),
        .snapshot_wal_bytes = n->cfg.snapshot_wal_mb << 20,
        .checkpoint_log_percent = (unsigned)n->cfg.checkpoint_log_percent,
        .max_memory_bytes = n->cfg.max_memory_mb << 20,
        .max_filters = n->cfg.max_filters,
        .wal_block_bytes = (uint32_t)n->cfg.wal_block_bytes,
        .commit_delay_us = (uint32_t)n->cfg.wal_commit_delay_us,
        .in_group = node_rpc__group_copies() > 1,
    };

    log_info("opening data directory %s", n->cfg.data_dir);
    struct store *s = store_open(&o, err);
    if (!s) {
        log_error("cannot open data directory %s: %s", n->cfg.data_dir, err);
        atomic_store(&exit_code, 1);
        kill(getpid(), SIGTERM);
        return NULL;
    }
    /* Which shards are SYNCING is known before the first call is served. */
    bool doubt = false;
    struct node_sync *ns = node_sync_open(n->cfg.data_dir, &doubt, err);
    if (!ns || node_sync_adopt(ns, s, node_rpc__group_copies() > 1, err) < 0) {
        log_error("cannot read or write the list of syncing shards in %s: %s",
                  n->cfg.data_dir, err);
        node_sync_close(ns);
        store_close(s);
        atomic_store(&exit_code, 1);
        kill(getpid(), SIGTERM);
        return NULL;
    }
    node_rpc__sync_set(ns);
    if (node_sync_count(ns))
        log_warn("%zu shards are SYNCING: they take writes and refuse reads "
                 "until they have pulled their group's pages", node_sync_count(ns));
    atomic_store_explicit(&n->store, s, memory_order_release);
    bool ready = check_filters(n);
    set_health(n, ready);
    bool held = node_sync_any(ns) && node_rpc__group_copies() > 1;
    log_info("data directory %s open; %s", n->cfg.data_dir,
             !ready ? "some filters are not ready: NOT_SERVING"
             : held ? "every filter is ready, reads held (bloomgrid.v1.BloomGrid "
                      "NOT_SERVING) until the copy has checked with its group and "
                      "no shard is SYNCING"
                    : "every filter is ready: SERVING");
    /* Ready for the service manager once the data is loaded, SYNCING or
     * not: a SYNCING copy takes writes and pulls (it is alive). */
    svc_notify_ready("%s; %zu shards SYNCING", ready ? "serving" : "some filters not ready",
                     node_sync_count(ns));

    unsigned tick = 0;
    while (!atomic_load(&n->stopping)) {
        struct timespec ts = {.tv_sec = 0, .tv_nsec = 200 * 1000 * 1000};
        nanosleep(&ts, NULL);
        if (++tick % MALLOC_CHECK_TICKS == 0)
            release_free_memory();
        bool now = check_filters(n);
        if (now != ready) {
            log_info("health: %s", now ? "SERVING" : "NOT_SERVING");
            svc_notify_status("%s", now ? "serving" : "some filters not ready");
            ready = now;
        }
        set_health(n, ready);
    }
    return NULL;
}

/* Descriptors: filters hold none (one log for all), so what the node
 * spends them on is connections, checkpoint files and log segments.  The
 * soft limit is raised to the hard one so that connections do not run the
 * log out of descriptors. */
static void raise_nofile(void)
{
    struct rlimit rl;

    if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
        return;
    if (rl.rlim_cur < rl.rlim_max) {
        rlim_t was = rl.rlim_cur;
        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) == 0)
            log_info("file descriptors: soft limit raised from %llu to %llu",
                     (unsigned long long)was, (unsigned long long)rl.rlim_cur);
    }
}

int main(int argc, char **argv)
{
    static struct node n;
    /* Before any thread: see proc_malloc.h (TLB shootdowns per call). */
    proc_malloc_tune();
    /* And bounded against the filters' bits (proc_malloc.h). */
    proc_malloc_bound();
    /* A connection past the descriptor limit must not close the listener. */
    proc_accept_guard();
    int rc = node_config_load(&n.cfg, argc, argv);
    if (rc != 0)
        return rc > 0 ? 0 : 2;
    struct rpc_listen_rule rule = {
        .listen = n.cfg.listen, .internal_listen = n.cfg.internal_listen,
        .has_internal = true, .tls_cert = n.cfg.tls_cert, .tls_key = n.cfg.tls_key,
        .tls_ca = n.cfg.tls_ca, .insecure = n.cfg.insecure,
        .tokens = n.cfg.tokens_file[0] != 0,
    };
    struct rpc_tls *tls = NULL;
    if (rpc_listen_setup(&rule, argv[0], &tls) < 0)
        return 2;

    apply_log_level(&n.cfg);
    log_set_ident("bloomgrid-node");
    raise_nofile();
    if (n.cfg.max_memory_mb == 0) {
        n.cfg.max_memory_mb = node_config_default_memory_mb();
        log_info("max_memory_mb = %llu (three quarters of this machine's memory)",
                 (unsigned long long)n.cfg.max_memory_mb);
    }
    if (strcmp(n.cfg.durability, "none") == 0)
        log_warn("durability none: writes are acknowledged before they reach "
                 "the disk; a machine crash loses the most recent ones");

    /* A topology that does not parse stops the start before anything
     * listens; the node's group is looked up once its port is known. */
    struct topo *topo = NULL;
    if (n.cfg.topology[0] && !(topo = topology_read(&n.cfg)))
        return 2;

    /* The tokens callers present and the one this node's calls send: a
     * file that does not parse stops the start. */
    struct rpc_auth *auth = NULL;
    char aerr[RPC_AUTH_ERRLEN];
    if (rpc_auth_setup(n.cfg.tokens_file, n.cfg.token_file, &auth, aerr) < 0) {
        log_error("not starting: %s", aerr);
        return 2;
    }

    /* The Redis door (docs/RESP.md): its listening rule is checked before
     * anything listens. */
    struct resp_settings_in rs = {
        .resp_listen = n.cfg.resp_listen,
        .resp_max_connections = n.cfg.resp_max_connections,
        .resp_pipeline_bytes = n.cfg.resp_pipeline_bytes,
        .resp_autocreate = n.cfg.resp_autocreate,
        .resp_autocreate_capacity = n.cfg.resp_autocreate_capacity,
        .resp_autocreate_error_rate = n.cfg.resp_autocreate_error_rate,
        .max_batch_keys = n.cfg.max_batch_keys, .max_key_size = n.cfg.max_key_size,
        .max_message_size = n.cfg.max_message_size, .conn_idle_ms = n.cfg.conn_idle_ms,
    };
    struct resp_backend rbe;
    node_resp_backend(&n, &rbe);
    struct resp_door_conf rdc = {.set = &rs, .prog = "bloomgrid-node", .tls = tls,
                                 .auth = auth, .insecure = n.cfg.insecure, .be = &rbe};
    struct resp_door *door = NULL;
    if (resp_door_check(&rdc) < 0)
        return 2;

    rpc_signals_block();
    reload_args.argc = argc;
    reload_args.argv = argv;
    rpc_signals_on_hup(reload_settings, &n);
    if (tls)
        rpc_signals_on_hup(rpc_tls_reload_hook, tls);
    if (auth)
        rpc_signals_on_hup(rpc_auth_reload_hook, auth);
    rpc_runtime_init();
    grpc_init();
    struct metrics_http *mh;
    struct rpc_metrics_conf mc = {n.cfg.metrics_listen, n.cfg.metrics_tls, tls,
                                  n.cfg.insecure};
    if (rpc_metrics_start(&mc, "bloomgrid-node", &mh) < 0)
        return 2;
    node_metrics_start(&n);
    if (mh)
        node_metrics_sample_start(&n);

    struct rpc_server_config sc = {
        .listen = n.cfg.listen,
        .tls = tls,
        .threads = (int)n.cfg.threads,
        .loops = (int)n.cfg.loops,
        .max_message = n.cfg.max_message_size,
        .grace_ms = (int)n.cfg.shutdown_grace_ms,
        .max_streams = (int)n.cfg.max_streams,
        .stream_idle_ms = (int)n.cfg.stream_idle_ms,
        .internal_streams = (int)n.cfg.internal_streams,
        .conn_idle_ms = (int)n.cfg.conn_idle_ms,
        .stream_window = (size_t)n.cfg.stream_window_kb << 10,
    };
    n.srv = rpc_server_create(&sc);
    if (!n.srv) {
        log_error("cannot create the gRPC server");
        grpc_shutdown();
        return 1;
    }
    if (bloomgrid__v1__bloom_grid__descriptor.n_methods != node_rpc_public_count ||
        bloomgrid__v1__internal__descriptor.n_methods != node_rpc_internal_count) {
        log_error("handler tables do not match the service descriptors");
        return 1;
    }
    int ili = RPC_LISTENER_MAIN;   /* the listener of the internal service */
    if (n.cfg.internal_listen[0]) {
        struct rpc_listener il = {.listen = n.cfg.internal_listen, .tls = tls,
                                  .peer = RPC_TLS_PEER_REQUIRE};
        int li = rpc_server_add_listener(n.srv, &il);
        if (li < 0) {
            log_error("cannot add the listener %s: %s", n.cfg.internal_listen,
                      strerror(-li));
            return 1;
        }
        ili = li;
    }
    int hli = rpc_listen_add_health(n.srv, n.cfg.health_listen);
    if (hli < 0)
        return 1;
    rpc_server_add_service_on(n.srv, &bloomgrid__v1__bloom_grid__descriptor,
                              node_rpc_public, &n, 1u << RPC_LISTENER_MAIN);
    rpc_server_add_service_on(n.srv, &bloomgrid__v1__internal__descriptor,
                              node_rpc_internal, &n, 1u << ili);
    rpc_server_set_auth(n.srv, auth);
    /* Reflection is on every listener; with an internal listener it lists
     * what the public one serves. */
    static const char *const served[] = {"bloomgrid.v1.BloomGrid", "grpc.health.v1.Health",
                                         "bloomgrid.v1.Internal", NULL};
    static const char *const served_public[] = {"bloomgrid.v1.BloomGrid",
                                                "grpc.health.v1.Health", NULL};
    if (rpc_reflect_add_on(n.srv, ili == RPC_LISTENER_MAIN ? served : served_public,
                           rpc_listen_not(hli)) != 0)
        log_warn("gRPC reflection unavailable");
    set_health(&n, false);

    int port = rpc_server_start(n.srv);
    if (port < 0) {
        log_error("not starting: a listener could not be bound (see above)");
        rpc_server_destroy(n.srv);
        grpc_shutdown();
        return 1;
    }
    /* Tests and scripts read the bound ports from this line. */
    char host[256], ihost[256] = "", iaddr[sizeof ihost + 16] = "";
    rpc_listen_host(n.cfg.listen, host, sizeof host);
    if (n.cfg.internal_listen[0]) {
        rpc_listen_host(n.cfg.internal_listen, ihost, sizeof ihost);
        snprintf(iaddr, sizeof iaddr, "%s:%d", ihost,
                 rpc_server_port(n.srv, ili));
    }
    char hnote[300], rnote[300];
    rpc_listen_health_note(n.srv, hli, n.cfg.health_listen, hnote, sizeof hnote);
    if (resp_door_start(&rdc, &door) < 0) {
        rpc_server_shutdown(n.srv);
        rpc_server_destroy(n.srv);
        return 2;
    }
    if (door && tls)
        rpc_signals_on_hup(resp_door_reload_tls, door);   /* after tls's own */
    resp_door_note(door, rnote, sizeof rnote);
    log_announce("bloomgrid-node listening on %s:%d%s%s%s%s", host, port,
                 iaddr[0] ? " internal " : "", iaddr, hnote, rnote);
    svc_notify_status("listening on %s:%d; opening data directory %s", host, port,
                      n.cfg.data_dir);
    log_info("listening on %s:%d%s%s (%s; data %s, durability %s)", host, port,
             iaddr[0] ? ", internal service on " : "", iaddr,
             tls ? "TLS" : "plaintext", n.cfg.data_dir, n.cfg.durability);
    char self[sizeof host + 16];
    if (n.cfg.advertise[0])
        snprintf(self, sizeof self, "%s", n.cfg.advertise);
    else if (iaddr[0])
        snprintf(self, sizeof self, "%s", iaddr);
    else
        snprintf(self, sizeof self, "%s:%d", host, port);
    if (strlen(self) >= sizeof self_addr && n.cfg.topology[0]) {
        log_error("not starting: address %s is longer than a topology allows", self);
        return 2;
    }
    snprintf(self_addr, sizeof self_addr, "%.*s", (int)sizeof self_addr - 1, self);
    if (topo) {
        /* Checked again now that the address is known. */
        topo_unref(topo);
        if (!(topo = topology_read(&n.cfg)) || !topology_install(topo)) {
            log_error("not starting: this node (%s) must be a copy of a group of "
                      "%s", self_addr, n.cfg.topology);
            rpc_server_shutdown(n.srv);
            rpc_server_destroy(n.srv);
            return 2;
        }
    }

    pthread_t hk;
    if (pthread_create(&hk, NULL, housekeeping_main, &n) != 0) {
        log_error("cannot start the housekeeping thread");
        return 1;
    }

    struct node_replicate *repl = NULL;
    if (n.cfg.topology[0] && !(repl = node_replicate_start(&n))) {
        log_error("cannot start the anti-entropy thread");
        return 1;
    }
    atomic_store(&n.repl, repl);

    int sig = rpc_signals_wait();
    log_info("%s: shutting down", strsignal(sig));
    atomic_store(&n.stopping, true);
    set_health(&n, false);
    /* The door's calls in flight finish on the store, which is still open. */
    resp_door_stop(door);
    door = NULL;
    rpc_server_shutdown(n.srv);
    node_metrics_sample_stop();
    pthread_join(hk, NULL);
    /* No handler runs any more (the server is shut down). */
    atomic_store(&n.repl, NULL);
    node_replicate_stop(repl);
    node_rpc__topo_clear();
    struct store *s = node_store(&n);
    if (s)
        store_close(s);
    node_sync_close(node_rpc__sync_get());
    node_rpc__sync_set(NULL);
    rpc_server_destroy(n.srv);
    rpc_tls_destroy(tls);
    rpc_auth_destroy(auth);
    metrics_http_stop(mh);
    /* No grpc_shutdown(): every call and the server are gone and the data
     * is closed, but the core's executor thread may sleep until its next
     * timer (up to 10 s measured) before the shutdown can join it, and the
     * process is about to exit anyway. */
    log_info("stopped");
    return atomic_load(&exit_code);
}
