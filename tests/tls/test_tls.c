/* TLS, listeners and the start-up rule, with real processes on loopback and
 * certificates made at test time by gen-certs.sh (the openssl command).
 *
 * usage: test_tls NODE_BIN ROUTER_BIN MERGER_BIN GEN_CERTS TEST
 *   refuse     a node with TLS and internal_listen: a plaintext client, a
 *              client trusting another CA, and a server certificate that
 *              has expired are refused; on the internal listener a client
 *              without a certificate, or with one of another CA, is
 *              refused and one with a certificate of the cluster CA
 *              accepted; the public listener does not serve Internal (nor
 *              the internal one BloomGrid): UNIMPLEMENTED
 *   cluster    a group of 3 copies with TLS and internal listeners, a
 *              router with TLS and a merger: keys written through the
 *              router read back through it; a merger round carries them to
 *              a second datacenter (a single TLS node), and keys added
 *              there come back through the router after the next round;
 *              the merger's listener accepts clients with and without a
 *              certificate of the CA, and refuses one of another CA
 *   reload     SIGHUP replaces the node's certificate for new connections
 *              (seen by which CA a new client must trust); a broken file on
 *              a later SIGHUP is refused and the running certificate stays
 *   client_reload
 *              a router's links to a node take a renewed client certificate
 *              at their next connection, without a restart or SIGHUP
 *   insecure   a non-loopback listen address without TLS is refused at
 *              start (node, router, merger) and served with --insecure;
 *              half a TLS setting, TLS without internal_listen and
 *              "insecure" in a config file are refused too
 *   reuseport  a node on a router's port fails at start naming the address,
 *              and a router on a node's port too; the first keeps serving
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <grpc/grpc.h>

#include "cluster.h"
#include "harness.h"
#include "rpc_tls.h"

#define LIST_PUBLIC "/bloomgrid.v1.BloomGrid/ListFilters"
#define LIST_INTERNAL "/bloomgrid.v1.Internal/ListShards"
#define MERGER_STATUS "/bloomgrid.v1.Merger/Status"

static const char *merger_bin, *gen_certs;
static char tdir[512], certs[600];

/* certs/<name>, in a static ring of buffers (several per call). */
static const char *cert(const char *name)
{
    static char ring[16][700];
    static unsigned next;
    char *p = ring[next++ % 16];
    snprintf(p, sizeof ring[0], "%s/%s", certs, name);
    return p;
}

static void make_certs(const char *tag)
{
    char cmd[1400];
    harness_tmpdir(tdir, sizeof tdir, tag);
    snprintf(certs, sizeof certs, "%s/certs", tdir);
    snprintf(cmd, sizeof cmd, "sh '%s' '%s'", gen_certs, certs);
    CHECK(system(cmd) == 0, "%s failed", cmd);
}

/* A client TLS: CA file name, and a certificate name (NULL: none). */
static struct rpc_tls *client_tls(const char *name, const char *ca)
{
    char err[RPC_TLS_ERRLEN], crt[64], key[64];
    snprintf(crt, sizeof crt, "%s.pem", name ? name : "");
    snprintf(key, sizeof key, "%s.key", name ? name : "");
    struct rpc_tls *t = rpc_tls_load(name ? cert(crt) : NULL, name ? cert(key) : NULL,
                                     cert(ca), NULL, err);
    CHECK(t, "client TLS: %s", err);
    return t;
}

/* One unary call (an empty request) on a fresh channel to addr with tls
 * (NULL: plaintext).  Returns the status code. */
static int call_with(const char *addr, struct rpc_tls *tls, const char *method,
                     struct rpc_status *st)
{
    struct rpc_channel *ch = rpc_channel_create_tls(addr, 0, tls);
    grpc_slice resp;
    CHECK(ch, "channel to %s", addr);
    int rc = rpc_call_raw(ch, method, "", 0, &resp, 5000, st);
    if (rc == 0)
        grpc_slice_unref(resp);
    rpc_channel_destroy(ch);
    return rc == 0 ? 0 : (int)st->code;
}

/* call_with, sending token (NULL: none). */
static int call_token(const char *addr, struct rpc_tls *tls, const char *token,
                      const char *method, struct rpc_status *st)
{
    struct rpc_channel *ch = rpc_channel_create_tls(addr, 0, tls);
    grpc_slice resp;
    CHECK(ch, "channel to %s", addr);
    CHECK(rpc_channel_set_token(ch, token) == 0, "token");
    int rc = rpc_call_raw(ch, method, "", 0, &resp, 5000, st);
    if (rc == 0)
        grpc_slice_unref(resp);
    rpc_channel_destroy(ch);
    return rc == 0 ? 0 : (int)st->code;
}

/* A fixed admin token and its sha256sum (pinned, not computed by the code
 * under test). */
#define ADMIN_TOKEN "bgt-admin-0001"
#define ADMIN_SHA256 "75c3d3777c1e033c564c3ca76cbaa744866ec9b7cca48ca17c4ff53aa4872d9c"

/* The node flags of TLS with certificate name (name.pem, name.key) and an
 * internal listener on a free port. */
#define NODE_TLS_FLAGS(name)                                                  \
    "--tls-cert", cert(name ".pem"), "--tls-key", cert(name ".key"),          \
        "--tls-ca", cert("ca.pem"), "--internal-listen", "127.0.0.1:0"

/* Run argv to its end (it is expected not to start); stderr goes to
 * err[len].  Returns its exit status (128 + signal if killed after 10 s). */
static int run_refused(const char *const *argv, char *err, size_t len)
{
    char path[700];
    snprintf(path, sizeof path, "%s/refused.err", tdir);
    unlink(path);
    int rc = harness_run(argv, NULL, path, NULL, 10000);
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(err, 1, len - 1, f) : 0;
    err[n] = 0;
    if (f)
        fclose(f);
    return rc;
}

/* ---- refuse ---------------------------------------------------------- */

static void test_refuse(void)
{
    struct node_proc n, old;
    struct rpc_status st;
    char dir[700];

    make_certs("tls-refuse");
    struct rpc_tls *client = client_tls("client", "ca.pem");
    struct rpc_tls *anon = client_tls(NULL, "ca.pem");
    struct rpc_tls *wrong_ca = client_tls("client", "other-ca.pem");
    struct rpc_tls *stranger = client_tls("stranger", "ca.pem");
    rpc_tls_set_client(client);

    snprintf(dir, sizeof dir, "%s/node", tdir);
    const char *flags[] = {NODE_TLS_FLAGS("node"), NULL};
    node_start(&n, dir, flags);
    CHECK(n.iaddr[0] && n.ich, "no internal address in the node's line");
    CHECK(node_wait_health(&n, true, 20000), "node not serving over TLS");

    /* The public listener: TLS with the cluster CA, no client certificate
     * needed. */
    CHECK(call_with(n.addr, anon, LIST_PUBLIC, &st) == 0, "public, CA: %s", st.message);
    CHECK(call_with(n.addr, NULL, LIST_PUBLIC, &st) == GRPC_STATUS_UNAVAILABLE,
          "plaintext client to the TLS port: %s %s", rpc_status_name(st.code),
          st.message);
    CHECK(call_with(n.addr, wrong_ca, LIST_PUBLIC, &st) == GRPC_STATUS_UNAVAILABLE,
          "client trusting another CA: %s %s", rpc_status_name(st.code), st.message);

    /* The internal listener: a certificate of the cluster CA, or nothing. */
    CHECK(call_with(n.iaddr, client, LIST_INTERNAL, &st) == 0, "internal, client "
          "certificate: %s", st.message);
    CHECK(call_with(n.iaddr, anon, LIST_INTERNAL, &st) == GRPC_STATUS_UNAVAILABLE,
          "internal without a client certificate: %s %s", rpc_status_name(st.code),
          st.message);
    CHECK(call_with(n.iaddr, stranger, LIST_INTERNAL, &st) == GRPC_STATUS_UNAVAILABLE,
          "internal with a certificate of another CA: %s %s",
          rpc_status_name(st.code), st.message);
    CHECK(call_with(n.iaddr, NULL, LIST_INTERNAL, &st) == GRPC_STATUS_UNAVAILABLE,
          "plaintext to the internal port: %s %s", rpc_status_name(st.code),
          st.message);

    /* Each listener serves its own services (health on both). */
    CHECK(call_with(n.addr, client, LIST_INTERNAL, &st) == GRPC_STATUS_UNIMPLEMENTED,
          "Internal on the public listener: %s %s", rpc_status_name(st.code),
          st.message);
    CHECK(call_with(n.iaddr, client, LIST_PUBLIC, &st) == GRPC_STATUS_UNIMPLEMENTED,
          "BloomGrid on the internal listener: %s %s", rpc_status_name(st.code),
          st.message);
    struct node_proc ip = n;
    ip.ch = n.ich;
    CHECK(node_health(&ip, "bloomgrid.v1.Internal") == 1, "health on the internal "
          "listener");

    /* An expired server certificate starts (with a warning) but no client
     * accepts it. */
    snprintf(dir, sizeof dir, "%s/old", tdir);
    const char *oflags[] = {NODE_TLS_FLAGS("expired"), NULL};
    node_start(&old, dir, oflags);
    CHECK(call_with(old.addr, anon, LIST_PUBLIC, &st) == GRPC_STATUS_UNAVAILABLE,
          "expired server certificate: %s %s", rpc_status_name(st.code), st.message);
    CHECK(call_with(old.iaddr, client, LIST_INTERNAL, &st) == GRPC_STATUS_UNAVAILABLE,
          "expired server certificate, internal: %s %s", rpc_status_name(st.code),
          st.message);

    CHECK(node_stop(&old, SIGTERM) == 0, "expired node exit status");
    CHECK(node_stop(&n, SIGTERM) == 0, "node exit status");
    rpc_tls_set_client(NULL);
    rpc_tls_destroy(client);
    rpc_tls_destroy(anon);
    rpc_tls_destroy(wrong_ca);
    rpc_tls_destroy(stranger);
}

/* ---- cluster --------------------------------------------------------- */

static char mcfg[700];

static void write_merger(const char *topo, const char *dc2)
{
    char sources[700], state[700];
    snprintf(sources, sizeof sources, "%s/sources.ini", tdir);
    snprintf(state, sizeof state, "%s/merger-state", tdir);
    snprintf(mcfg, sizeof mcfg, "%s/merger.ini", tdir);
    FILE *f = fopen(sources, "w");
    CHECK(f, "sources");
    fprintf(f, "[filter f]\ndatacenter = dc1 %s\ndatacenter = dc2 %s\n", topo, dc2);
    fclose(f);
    CHECK((f = fopen(mcfg, "w")), "merger config");
    fprintf(f, "[merger]\nlisten = 127.0.0.1:0\nstate_dir = %s\nsources = %s\n"
            "interval_s = 3600\nnode_timeout_ms = 5000\ntls_cert = %s\n"
            "tls_key = %s\ntls_ca = %s\n", state, sources, cert("merger.pem"),
            cert("merger.key"), cert("ca.pem"));
    fclose(f);
}

/* One merger round (--once); returns its exit status. */
static int merger_round(void)
{
    char log[700], out[700];
    snprintf(log, sizeof log, "%s/merger.log", tdir);
    snprintf(out, sizeof out, "%s/merger.out", tdir);
    const char *argv[] = {merger_bin, "--config", mcfg, "--once", NULL};
    return harness_run(argv, out, log, NULL, 0);
}

static void copy_file(const char *from, const char *to);

static void test_cluster(void)
{
    struct cluster c;
    struct node_proc dc2, mp;
    struct rpc_status st;
    char dir[700];
    enum { N = 1000 };

    make_certs("tls-cluster");
    struct rpc_tls *client = client_tls("client", "ca.pem");
    rpc_tls_set_client(client);
    cluster_init(&c, "tls-cluster-c", "fsync");
    const char *nflags[] = {"--tls-cert", cert("node.pem"), "--tls-key", cert("node.key"),
                            "--tls-ca", cert("ca.pem"), NULL};
    const char *rflags[] = {"--tls-cert", cert("router.pem"), "--tls-key",
                            cert("router.key"), "--tls-ca", cert("ca.pem"), NULL};
    c.node_flags = nflags;
    c.router_flags = rflags;
    c.internal = true;
    cluster_run_copies(&c, 1, 3, NULL, 1);
    for (int i = 0; i < 3; i++)
        CHECK(c.node[i].iaddr[0], "node %d has no internal listener", i);

    /* Through the router: the client's TLS to it, its mTLS to the copies. */
    Bloomgrid__V1__FilterInfo *fi = NULL;
    CHECK(t_create_sharded(c.router[0].ch, "f", 100000, 0.01, 1, 1, &fi, &st) == 0,
          "create through the router: %s", st.message);
    CHECK(fi->n_shard_info == 1, "%zu shards", fi->n_shard_info);
    bloomgrid__v1__filter_info__free_unpacked(fi, NULL);
    char **ka = keys_make("dc1", 0, N), **kb = keys_make("dc2", 0, N);
    keys_call(c.router[0].ch, "Add", "f", ka, N, 250, NULL);
    CHECK(keys_present(c.router[0].ch, "f", ka, N, NULL) == N, "router lost keys");
    for (int i = 0; i < 3; i++)
        CHECK(t_shard_count(c.node[i].ich, "f") == 1, "copy %d lacks the shard", i);

    /* A second datacenter: one TLS node the merger fills. */
    snprintf(dir, sizeof dir, "%s/dc2", tdir);
    const char *dflags[] = {NODE_TLS_FLAGS("node"), NULL};
    node_start(&dc2, dir, dflags);
    CHECK(node_wait_health(&dc2, true, 20000), "dc2 node not serving");
    write_merger(c.topo, dc2.iaddr);
    CHECK(merger_round() == 0, "merger round 1 failed (see %s/merger.log)", tdir);
    CHECK(keys_present(dc2.ch, "f", ka, N, NULL) == N, "dc2 lacks dc1's keys");
    keys_call(dc2.ch, "Add", "f", kb, N, 500, NULL);
    CHECK(merger_round() == 0, "merger round 2 failed (see %s/merger.log)", tdir);
    CHECK(keys_present(c.router[0].ch, "f", kb, N, NULL) == N,
          "dc1 lacks dc2's keys after the round");
    CHECK(keys_present(c.router[0].ch, "f", ka, N, NULL) == N, "dc1 lost keys");

    /* The merger's own listener: a certificate of the CA is verified when
     * offered, none is needed; one of another CA is refused. */
    const char *margv[] = {merger_bin, "--config", mcfg, NULL};
    char mlog[700];
    snprintf(mlog, sizeof mlog, "%s/merger-daemon.log", tdir);
    proc_spawn(&mp, mlog, margv);
    struct rpc_tls *anon = client_tls(NULL, "ca.pem");
    struct rpc_tls *stranger = client_tls("stranger", "ca.pem");
    CHECK(call_with(mp.addr, client, MERGER_STATUS, &st) == 0, "merger, client "
          "certificate: %s", st.message);
    CHECK(call_with(mp.addr, anon, MERGER_STATUS, &st) == 0, "merger, no client "
          "certificate: %s", st.message);
    CHECK(call_with(mp.addr, stranger, MERGER_STATUS, &st) == GRPC_STATUS_UNAVAILABLE,
          "merger, certificate of another CA: %s %s", rpc_status_name(st.code),
          st.message);
    CHECK(node_stop(&mp, SIGTERM) == 0, "merger exit status");

    /* With TLS and a tokens file, SIGHUP reloads both: a removed admin
     * token stops working for a client without a cluster certificate. */
    char tokens[700], mcfg_tok[800];
    snprintf(tokens, sizeof tokens, "%s/merger-tokens", tdir);
    snprintf(mcfg_tok, sizeof mcfg_tok, "%s.tokens", mcfg);
    FILE *f = fopen(tokens, "w");
    CHECK(f, "tokens file");
    fputs("admin ops " ADMIN_SHA256 "\n", f);
    fclose(f);
    copy_file(mcfg, mcfg_tok);
    CHECK((f = fopen(mcfg_tok, "a")), "merger config");
    fprintf(f, "tokens_file = %s\n", tokens);
    fclose(f);
    const char *targv[] = {merger_bin, "--config", mcfg_tok, NULL};
    proc_spawn(&mp, mlog, targv);
    CHECK(call_token(mp.addr, anon, ADMIN_TOKEN, MERGER_STATUS, &st) == 0,
          "merger, admin token: %s", st.message);
    CHECK(call_token(mp.addr, anon, NULL, MERGER_STATUS, &st) ==
              GRPC_STATUS_UNAUTHENTICATED,
          "merger, no token: %s %s", rpc_status_name(st.code), st.message);
    CHECK((f = fopen(tokens, "w")), "tokens file");
    fputs("# emptied\n", f);
    fclose(f);
    kill(mp.pid, SIGHUP);
    int code = 0;
    for (int i = 0; i < 200 && code == 0; i++) {
        code = call_token(mp.addr, anon, ADMIN_TOKEN, MERGER_STATUS, &st);
        if (code == 0)
            harness_sleep_ms(50);
    }
    CHECK(code == GRPC_STATUS_UNAUTHENTICATED,
          "a removed token still works after SIGHUP: %s %s", rpc_status_name(st.code),
          st.message);
    CHECK(call_with(mp.addr, client, MERGER_STATUS, &st) == 0,
          "merger, cluster certificate after the reload: %s", st.message);
    CHECK(node_stop(&mp, SIGTERM) == 0, "merger exit status");

    keys_free(ka, N);
    keys_free(kb, N);
    CHECK(node_stop(&dc2, SIGTERM) == 0, "dc2 exit status");
    cluster_stop(&c);
    rpc_tls_set_client(NULL);
    rpc_tls_destroy(client);
    rpc_tls_destroy(anon);
    rpc_tls_destroy(stranger);
}

/* ---- reload ---------------------------------------------------------- */

static void copy_file(const char *from, const char *to)
{
    char cmd[1500];
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", from, to);
    CHECK(system(cmd) == 0, "%s", cmd);
}

static void test_reload(void)
{
    struct node_proc n;
    struct rpc_status st;
    char dir[700], crt[700], key[700];

    make_certs("tls-reload");
    struct rpc_tls *client = client_tls("client", "ca.pem");
    struct rpc_tls *other = client_tls("client", "other-ca.pem");
    rpc_tls_set_client(client);
    snprintf(crt, sizeof crt, "%s/live.pem", tdir);
    snprintf(key, sizeof key, "%s/live.key", tdir);
    copy_file(cert("node.pem"), crt);
    copy_file(cert("node.key"), key);
    snprintf(dir, sizeof dir, "%s/node", tdir);
    const char *flags[] = {"--tls-cert", crt, "--tls-key", key, "--tls-ca",
                           cert("ca.pem"), "--internal-listen", "127.0.0.1:0", NULL};
    node_start(&n, dir, flags);
    CHECK(node_wait_health(&n, true, 20000), "node not serving");
    CHECK(call_with(n.addr, client, LIST_PUBLIC, &st) == 0, "before: %s", st.message);
    CHECK(call_with(n.addr, other, LIST_PUBLIC, &st) != 0, "before: another CA accepted");

    /* A certificate of the other CA, without a restart. */
    copy_file(cert("node-b.pem"), crt);
    copy_file(cert("node-b.key"), key);
    kill(n.pid, SIGHUP);
    bool switched = false;
    for (int i = 0; i < 250 && !switched; i++) {
        switched = call_with(n.addr, other, LIST_PUBLIC, &st) == 0;
        if (!switched)
            harness_sleep_ms(20);
    }
    CHECK(switched, "the reloaded certificate is not served: %s", st.message);
    CHECK(call_with(n.addr, client, LIST_PUBLIC, &st) == GRPC_STATUS_UNAVAILABLE,
          "the old certificate is still served");

    /* A key that does not match: refused, the running pair stays. */
    copy_file(cert("node.key"), key);
    kill(n.pid, SIGHUP);
    harness_sleep_ms(500);
    CHECK(call_with(n.addr, other, LIST_PUBLIC, &st) == 0, "after a refused reload: "
          "%s %s", rpc_status_name(st.code), st.message);
    /* A file that is not PEM: the same. */
    FILE *f = fopen(crt, "w");
    CHECK(f, "open %s", crt);
    fputs("not a certificate\n", f);
    fclose(f);
    kill(n.pid, SIGHUP);
    harness_sleep_ms(500);
    CHECK(call_with(n.addr, other, LIST_PUBLIC, &st) == 0, "after a refused reload: "
          "%s %s", rpc_status_name(st.code), st.message);
    CHECK(node_stop(&n, SIGTERM) == 0, "node exit status");
    rpc_tls_set_client(NULL);
    rpc_tls_destroy(client);
    rpc_tls_destroy(other);
}

/* ---- client reload ----------------------------------------------------- */

/* A router's open links to a node take its renewed client certificate at
 * their next connection, without a restart or SIGHUP: the node comes back
 * trusting only another CA, and the router's files now hold a certificate
 * of that CA. */
static void test_client_reload(void)
{
    struct node_proc n, r;
    struct rpc_status st;
    char dir[700], crt[700], key[700], nca[700], topo[700], rlog[700], iaddr[64];
    enum { N = 200 };

    make_certs("tls-client-reload");
    struct rpc_tls *client = client_tls("client", "ca.pem");
    rpc_tls_set_client(client);
    snprintf(crt, sizeof crt, "%s/router-live.pem", tdir);
    snprintf(key, sizeof key, "%s/router-live.key", tdir);
    snprintf(nca, sizeof nca, "%s/node-ca.pem", tdir);
    copy_file(cert("router.pem"), crt);
    copy_file(cert("router.key"), key);
    copy_file(cert("ca.pem"), nca);
    snprintf(dir, sizeof dir, "%s/node", tdir);
    const char *nflags[] = {"--tls-cert", cert("node.pem"), "--tls-key", cert("node.key"),
                            "--tls-ca", nca, "--internal-listen", "127.0.0.1:0", NULL};
    node_start(&n, dir, nflags);
    CHECK(node_wait_health(&n, true, 20000), "node not serving");
    snprintf(iaddr, sizeof iaddr, "%s", n.iaddr);
    snprintf(topo, sizeof topo, "%s/topology.ini", tdir);
    FILE *f = fopen(topo, "w");
    CHECK(f, "topology");
    fprintf(f, "version = 1\n[group g0]\ncopies = %s\n", iaddr);
    fclose(f);
    snprintf(rlog, sizeof rlog, "%s/router.log", tdir);
    const char *rflags[] = {"--tls-cert", crt, "--tls-key", key, "--tls-ca",
                            cert("ca.pem"), NULL};
    router_start(&r, rlog, topo, rflags);
    CHECK(node_wait_health(&r, true, 20000), "router not serving");
    CHECK(t_create(r.ch, "f", 10000, 0.01, 0, &st) == 0, "create: %s", st.message);
    char **k = keys_make("c", 0, N);
    keys_call(r.ch, "Add", "f", k, N, 100, NULL);
    CHECK(keys_present(r.ch, "f", k, N, NULL) == N, "keys lost before the change");

    /* The node stops; its CA and the router's certificate change; the node
     * comes back on the same internal address trusting only other-ca. */
    CHECK(node_stop(&n, SIGTERM) == 0, "node exit status");
    copy_file(cert("stranger.pem"), crt);
    copy_file(cert("stranger.key"), key);
    copy_file(cert("other-ca.pem"), nca);
    const char *nflags2[] = {"--tls-cert", cert("node.pem"), "--tls-key", cert("node.key"),
                             "--tls-ca", nca, "--internal-listen", iaddr, NULL};
    node_start(&n, dir, nflags2);
    CHECK(node_wait_health(&n, true, 20000), "node not serving after the change");
    /* Reads fail (UNAVAILABLE) until the link reconnects with the new
     * files (read again every few seconds); then every key is there. */
    size_t got = 0;
    bool out[N];
    for (int i = 0; i < 300 && got != N; i++) {
        got = 0;
        if (t_keys(r.ch, "MayContain", "f", k, N, out, &st) == 0)
            for (int j = 0; j < N; j++)
                got += out[j];
        if (got != N)
            harness_sleep_ms(100);
    }
    CHECK(got == N, "the router's link never took its new certificate (%zu of %d keys "
          "read: %s; see %s)", got, (int)N, st.message, rlog);
    keys_free(k, N);
    CHECK(node_stop(&r, SIGTERM) == 0, "router exit status");
    CHECK(node_stop(&n, SIGTERM) == 0, "node exit status");
    rpc_tls_set_client(NULL);
    rpc_tls_destroy(client);
}

/* ---- insecure -------------------------------------------------------- */

/* argv must be refused at start (exit 2) with a message holding want. */
static void expect_refused(const char *const *argv, const char *want)
{
    char err[4096];
    int rc = run_refused(argv, err, sizeof err);
    CHECK(rc == 2, "%s %s: exit %d, not 2: %s", argv[0], argv[1], rc, err);
    CHECK(strstr(err, want), "%s: the message does not name \"%s\": %s", argv[0],
          want, err);
}

static void test_insecure(void)
{
    char dir[700], topo[700], ini[700];
    struct node_proc n, r;
    struct rpc_status st;

    make_certs("tls-insecure");
    snprintf(dir, sizeof dir, "%s/node", tdir);
    const char *bin = harness_node_bin;

    /* Without TLS: loopback only. */
    const char *a1[] = {bin, "--listen", "0.0.0.0:0", "--data-dir", dir, NULL};
    expect_refused(a1, "--insecure");
    const char *a2[] = {bin, "--listen", "127.0.0.1:0", "--internal-listen",
                        "0.0.0.0:0", "--data-dir", dir, NULL};
    expect_refused(a2, "internal_listen 0.0.0.0:0");
    snprintf(topo, sizeof topo, "%s/topology.ini", tdir);
    FILE *f = fopen(topo, "w");
    CHECK(f, "topology");
    fprintf(f, "version = 1\n[group g0]\ncopies = 127.0.0.1:1\n");
    fclose(f);
    const char *r1[] = {harness_router_bin, "--listen", "[::]:0", "--topology", topo,
                        NULL};
    expect_refused(r1, "--insecure");
    const char *m1[] = {merger_bin, "--listen", "0.0.0.0:0", NULL};
    expect_refused(m1, "--insecure");

    /* Half of TLS, and TLS without an internal listener. */
    const char *h1[] = {bin, "--data-dir", dir, "--tls-cert", cert("node.pem"),
                        "--tls-ca", cert("ca.pem"), NULL};
    expect_refused(h1, "tls_key");
    const char *h2[] = {bin, "--data-dir", dir, "--tls-cert", cert("node.pem"),
                        "--tls-key", cert("node.key"), "--tls-ca", cert("ca.pem"), NULL};
    expect_refused(h2, "internal_listen");
    const char *h3[] = {harness_router_bin, "--topology", topo, "--tls-cert",
                        cert("router.pem"), "--tls-key", cert("node.key"), "--tls-ca",
                        cert("ca.pem"), NULL};
    expect_refused(h3, "does not match");
    /* --insecure belongs on the command line, not in a file. */
    snprintf(ini, sizeof ini, "%s/node.ini", tdir);
    CHECK((f = fopen(ini, "w")), "ini");
    fprintf(f, "[node]\nlisten = 0.0.0.0:0\ninsecure = true\n");
    fclose(f);
    const char *h4[] = {bin, "--config", ini, "--data-dir", dir, NULL};
    expect_refused(h4, "command-line flag");

    /* With --insecure: served, in plaintext. */
    const char *ok[] = {"--listen", "0.0.0.0:0", "--insecure", NULL};
    node_start(&n, dir, ok);
    CHECK(node_wait_health(&n, true, 20000), "--insecure node not serving");
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", n.port);
    CHECK(call_with(addr, NULL, LIST_PUBLIC, &st) == 0, "--insecure node: %s",
          st.message);
    f = fopen(topo, "w");
    CHECK(f, "topology");
    fprintf(f, "version = 1\n[group g0]\ncopies = %s\n", addr);
    fclose(f);
    char rlog[700];
    snprintf(rlog, sizeof rlog, "%s/router.log", tdir);
    const char *rok[] = {"--listen", "0.0.0.0:0", "--insecure", NULL};
    const char *rargv[] = {harness_router_bin, "--topology", topo, rok[0], rok[1],
                           rok[2], NULL};
    proc_spawn(&r, rlog, rargv);
    snprintf(addr, sizeof addr, "127.0.0.1:%d", r.port);
    CHECK(call_with(addr, NULL, "/grpc.health.v1.Health/Check", &st) == 0,
          "--insecure router: %s", st.message);
    CHECK(node_stop(&r, SIGTERM) == 0, "router exit status");
    CHECK(node_stop(&n, SIGTERM) == 0, "node exit status");
}

/* ---- reuseport ------------------------------------------------------- */

static void test_reuseport(void)
{
    struct node_proc n, r;
    char dir[700], topo[700], rlog[700], listen[64], err[4096];

    harness_tmpdir(tdir, sizeof tdir, "tls-reuseport");
    snprintf(dir, sizeof dir, "%s/node", tdir);
    node_start(&n, dir, NULL);
    CHECK(node_wait_health(&n, true, 20000), "node not serving");
    snprintf(topo, sizeof topo, "%s/topology.ini", tdir);
    FILE *f = fopen(topo, "w");
    CHECK(f, "topology");
    fprintf(f, "version = 1\n[group g0]\ncopies = %s\n", n.addr);
    fclose(f);

    /* A router on the node's port. */
    const char *ra[] = {harness_router_bin, "--listen", n.addr, "--topology", topo, NULL};
    int rc = run_refused(ra, err, sizeof err);
    CHECK(rc != 0 && rc < 128, "a router on the node's port: exit %d", rc);
    CHECK(strstr(err, n.addr), "the router's message does not name %s: %s", n.addr, err);
    CHECK(node_health(&n, "") == 1, "the node stopped serving");

    /* A node on a router's port. */
    snprintf(rlog, sizeof rlog, "%s/router.log", tdir);
    router_start(&r, rlog, topo, NULL);
    CHECK(node_wait_health(&r, true, 10000), "router not serving");
    snprintf(listen, sizeof listen, "%s", r.addr);
    char dir2[700];
    snprintf(dir2, sizeof dir2, "%s/node2", tdir);
    const char *na[] = {harness_node_bin, "--listen", listen, "--data-dir", dir2, NULL};
    rc = run_refused(na, err, sizeof err);
    CHECK(rc != 0 && rc < 128, "a node on the router's port: exit %d", rc);
    CHECK(strstr(err, listen), "the node's message does not name %s: %s", listen, err);
    /* Its internal listener on the router's port: the same. */
    const char *ia[] = {harness_node_bin, "--internal-listen", listen, "--data-dir",
                        dir2, "--listen", "127.0.0.1:0", NULL};
    rc = run_refused(ia, err, sizeof err);
    CHECK(rc != 0 && rc < 128, "a node's internal listener on the router's port: "
          "exit %d", rc);
    CHECK(strstr(err, listen), "the node's message does not name %s: %s", listen, err);
    /* Every call still reaches the router. */
    for (int i = 0; i < 20; i++)
        CHECK(node_health(&r, "bloomgrid.v1.BloomGrid") == 1, "call %d did not reach "
              "the router", i);
    CHECK(node_stop(&r, SIGTERM) == 0, "router exit status");
    CHECK(node_stop(&n, SIGTERM) == 0, "node exit status");
}

int main(int argc, char **argv)
{
    CHECK(argc == 6, "usage: test_tls NODE_BIN ROUTER_BIN MERGER_BIN GEN_CERTS TEST");
    harness_node_bin = argv[1];
    harness_router_bin = argv[2];
    merger_bin = argv[3];
    gen_certs = argv[4];
    signal(SIGPIPE, SIG_IGN);
    grpc_init();
    if (!strcmp(argv[5], "refuse"))
        test_refuse();
    else if (!strcmp(argv[5], "cluster"))
        test_cluster();
    else if (!strcmp(argv[5], "reload"))
        test_reload();
    else if (!strcmp(argv[5], "client_reload"))
        test_client_reload();
    else if (!strcmp(argv[5], "insecure"))
        test_insecure();
    else if (!strcmp(argv[5], "reuseport"))
        test_reuseport();
    else
        CHECK(0, "unknown test %s", argv[5]);
    grpc_shutdown();
    printf("ok\n");
    return 0;
}
