/* Integration tests of tokens and roles (common/rpc/rpc_auth.h): real nodes,
 * routers and a merger with a tokens file, called with no token, an unknown
 * token and every role.
 *
 * usage: test_auth NODE_BIN ROUTER_BIN MERGER_BIN TEST
 *   node     every BloomGrid and Internal method of a node: no token and an
 *            unknown token are UNAUTHENTICATED, each too weak a role
 *            PERMISSION_DENIED, a strong enough one passes the check;
 *            refused DropFilter, CreateFilter, Remove, Add, AddStream,
 *            Import and DropShard change nothing (the filter and its keys
 *            are there, no key appears), and the same calls with an admin
 *            token do change it; health answers without a token
 *   revoke   a token removed from the file and SIGHUP: refused on new calls
 *            and on its AddStream and MayContainStream already open, while
 *            other tokens and their open streams go on; a tokens file that
 *            does not parse at a reload changes nothing
 *   router   every BloomGrid method of a router with a tokens file; a router
 *            with a tokens file in front of nodes without one, and one
 *            sending an admin token (token_file) to nodes with one: keys
 *            added and read through them
 *   merger   both Merger methods; a merger with token_file runs rounds
 *            against a node with a tokens file, one without it gets the
 *            node's refusal in its report
 *   start    a tokens file that does not parse stops node, router and
 *            merger at start (exit 2)
 *
 * Tokens are fixed strings; the tokens file lists their SHA-256 as the
 * sha256sum command prints it (pinned here, not computed by the code under
 * test).
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

#include "bf.h"
#include "bf_file.h"
#include "bloomgrid/v1/bloomgrid.pb-c.h"
#include "bloomgrid/v1/internal.pb-c.h"
#include "bloomgrid/v1/merger.pb-c.h"
#include "cluster.h"
#include "harness.h"

static const char *merger_bin;
static char tdir[512], tokens[600], admin_file[600];

enum who { W_NONE, W_UNKNOWN, W_READ, W_WRITE, W_ADMIN, W_COUNT };
static const char *const who_name[] = {"no token", "an unknown token", "read",
                                       "write", "admin"};
static const char *const tok[W_COUNT] = {NULL, "bgt-nobody-0001", "bgt-read-0001",
                                         "bgt-write-0001", "bgt-admin-0001"};
#define TOK_WRITE2 "bgt-write-0002"

/* sha256sum of each token above (and of TOK_WRITE2). */
#define LINE_READ "read reader f4e97fa3e78f773c111d108e174c7197656c5a68f26cce2f8dfc9bc0de41d33f\n"
#define LINE_WRITE "write ci 53c7268a661edbea4ecafe830861f89bb8eb4d95f0a64fbbc0d069ad885bca71\n"
#define LINE_ADMIN "admin ops 75c3d3777c1e033c564c3ca76cbaa744866ec9b7cca48ca17c4ff53aa4872d9c\n"
#define LINE_WRITE2 "write batch bb53b9cc6ef23ee6bdfa30d2d65f0996886bff1686d5b132dde816a36326a55a\n"

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    CHECK(f, "open %s: %s", path, strerror(errno));
    fputs(text, f);
    CHECK(fclose(f) == 0, "write %s", path);
}

/* A fresh directory with the tokens file (read, write, admin) and the admin
 * token in a file of its own. */
static void setup(const char *tag)
{
    harness_tmpdir(tdir, sizeof tdir, tag);
    snprintf(tokens, sizeof tokens, "%s/tokens", tdir);
    snprintf(admin_file, sizeof admin_file, "%s/admin.token", tdir);
    write_file(tokens, "# role name sha256\n\n" LINE_READ LINE_WRITE "  " LINE_ADMIN);
    write_file(admin_file, "bgt-admin-0001\n");
}

static struct rpc_channel *chan_token(const char *addr, const char *token)
{
    struct rpc_channel *ch = rpc_channel_create(addr, 0);
    CHECK(ch, "channel");
    CHECK(rpc_channel_set_token(ch, token) == 0, "token");
    return ch;
}

static struct rpc_channel *chan(const char *addr, enum who w)
{
    return chan_token(addr, tok[w]);
}

/* ---- every method with every caller ---- */

struct method {
    const char *name;
    enum who need;
    bool stream;
};

static const struct method public_methods[] = {
    {"CreateFilter", W_ADMIN, false}, {"DropFilter", W_ADMIN, false},
    {"ListFilters", W_READ, false},   {"GetFilter", W_READ, false},
    {"Add", W_WRITE, false},          {"MayContain", W_READ, false},
    {"Remove", W_ADMIN, false},       {"AddStream", W_WRITE, true},
    {"MayContainStream", W_READ, true}, {"Export", W_ADMIN, true},
    {"Import", W_WRITE, true},
};

static const struct method internal_methods[] = {
    {"CreateShard", W_ADMIN, false},      {"DropShard", W_ADMIN, false},
    {"GetShard", W_ADMIN, false},         {"ListShards", W_ADMIN, false},
    {"AddHashes", W_ADMIN, false},        {"MayContainHashes", W_ADMIN, false},
    {"RemoveHashes", W_ADMIN, false},     {"PullPages", W_ADMIN, true},
    {"PushPages", W_ADMIN, true},         {"ExportShard", W_ADMIN, true},
    {"ImportShard", W_ADMIN, true},       {"Batches", W_ADMIN, true},
    {"NodeInfo", W_ADMIN, false},         {"Resync", W_ADMIN, false},
};

static const struct method merger_methods[] = {
    {"Status", W_ADMIN, false},
    {"RunRound", W_ADMIN, false},
};

/* The status of one call of m with an empty request message (enough for
 * the check, which comes before the message is looked at). */
static grpc_status_code call_code(struct rpc_channel *ch, const char *service,
                                  const struct method *m, char *msg, size_t msglen)
{
    char path[256];
    struct rpc_status st = {0};

    snprintf(path, sizeof path, "/%s/%s", service, m->name);
    if (!m->stream) {
        grpc_slice resp;
        if (rpc_call_raw(ch, path, "", 0, &resp, TIMEOUT_MS, &st) == 0)
            grpc_slice_unref(resp);
    } else {
        struct rpc_cstream *s = rpc_cstream_open(ch, path, TIMEOUT_MS);
        CHECK(s, "stream %s", path);
        rpc_cstream_write(s, "", 0);
        rpc_cstream_close_send(s);
        grpc_slice in;
        while (rpc_cstream_read(s, &in) == 1)
            grpc_slice_unref(in);
        rpc_cstream_finish(s, &st);
    }
    snprintf(msg, msglen, "%s", st.message);
    return st.code;
}

/* Every method of sd is in methods (a method added later gets its rule
 * tested here too), and each answers each caller as its role says. */
static void walk(const char *addr, const ProtobufCServiceDescriptor *sd,
                 const struct method *methods, size_t n)
{
    for (unsigned i = 0; i < sd->n_methods; i++) {
        bool found = false;
        for (size_t j = 0; j < n; j++)
            found |= strcmp(methods[j].name, sd->methods[i].name) == 0;
        CHECK(found, "%s/%s has no expected role in this test", sd->name,
              sd->methods[i].name);
    }
    for (int w = W_NONE; w < W_COUNT; w++) {
        struct rpc_channel *ch = chan(addr, (enum who)w);
        for (size_t j = 0; j < n; j++) {
            char msg[RPC_MSGLEN];
            grpc_status_code code = call_code(ch, sd->name, &methods[j], msg, sizeof msg);
            if (w <= W_UNKNOWN)
                CHECK(code == GRPC_STATUS_UNAUTHENTICATED, "%s/%s with %s: %s: %s",
                      sd->name, methods[j].name, who_name[w], rpc_status_name(code), msg);
            else if (w < (int)methods[j].need)
                CHECK(code == GRPC_STATUS_PERMISSION_DENIED, "%s/%s with %s: %s: %s",
                      sd->name, methods[j].name, who_name[w], rpc_status_name(code), msg);
            else
                CHECK(code != GRPC_STATUS_UNAUTHENTICATED &&
                          code != GRPC_STATUS_PERMISSION_DENIED,
                      "%s/%s with %s: %s: %s", sd->name, methods[j].name,
                      who_name[w], rpc_status_name(code), msg);
        }
        rpc_channel_destroy(ch);
    }
}

/* ---- key streams ---- */

struct kstream {
    struct rpc_cstream *s;
    bool add;
};

static struct kstream kstream_open(struct rpc_channel *ch, bool add)
{
    struct kstream k = {.add = add};
    k.s = rpc_cstream_open(ch, add ? "/bloomgrid.v1.BloomGrid/AddStream"
                                   : "/bloomgrid.v1.BloomGrid/MayContainStream",
                           TIMEOUT_MS * 3);
    CHECK(k.s, "stream");
    return k;
}

/* Send one key and read its answer: 1 answered, 0 the stream ended. */
static int kstream_one(struct kstream *k, const char *filter, const char *key)
{
    ProtobufCBinaryData kb = {strlen(key), (uint8_t *)key};
    int rc;
    if (k->add) {
        Bloomgrid__V1__AddRequest rq = BLOOMGRID__V1__ADD_REQUEST__INIT;
        rq.filter = (char *)filter;
        rq.n_keys = 1;
        rq.keys = &kb;
        rc = rpc_cstream_write_msg(k->s, &rq.base);
    } else {
        Bloomgrid__V1__MayContainRequest rq = BLOOMGRID__V1__MAY_CONTAIN_REQUEST__INIT;
        rq.filter = (char *)filter;
        rq.n_keys = 1;
        rq.keys = &kb;
        rc = rpc_cstream_write_msg(k->s, &rq.base);
    }
    if (rc < 0)
        return 0;
    grpc_slice in;
    if (rpc_cstream_read(k->s, &in) != 1)
        return 0;
    grpc_slice_unref(in);
    return 1;
}

static grpc_status_code kstream_end(struct kstream *k, struct rpc_status *st)
{
    rpc_cstream_finish(k->s, st);
    return st->code;
}

/* ---- node ---- */

static void node_with_tokens(struct node_proc *np, const char *tag)
{
    char dir[600];
    snprintf(dir, sizeof dir, "%s/%s", tdir, tag);
    const char *extra[] = {"--tokens-file", tokens, "--durability", "none", NULL};
    node_start(np, dir, extra);
    /* np->ch has no token: health answers it all the same. */
    CHECK(node_wait_health(np, true, TIMEOUT_MS), "node not SERVING");
}

/* buf[0, len) (a filter file) with keys added: what an Import would bring. */
static uint8_t *file_with_keys(const uint8_t *buf, size_t len, char **keys, size_t n,
                               size_t *out_len)
{
    char err[BF_ERRLEN];
    struct bf *f = bf_file_parse(buf, len, err);
    CHECK(f, "export does not parse: %s", err);
    const void *kp[64];
    size_t kl[64];
    CHECK(n <= 64, "keys");
    for (size_t i = 0; i < n; i++) {
        kp[i] = keys[i];
        kl[i] = strlen(keys[i]);
    }
    bool added[64];
    bf_add_keys(f, kp, kl, n, added);
    char path[700];
    snprintf(path, sizeof path, "%s/import.bf", tdir);
    CHECK(bf_file_save(f, path, err) == 0, "save: %s", err);
    bf_destroy(f);
    FILE *fp = fopen(path, "rb");
    CHECK(fp, "open %s", path);
    fseek(fp, 0, SEEK_END);
    *out_len = (size_t)ftell(fp);
    rewind(fp);
    uint8_t *out = malloc(*out_len);
    CHECK(out && fread(out, 1, *out_len, fp) == *out_len, "read %s", path);
    fclose(fp);
    return out;
}

static void test_node(void)
{
    struct node_proc np;
    struct rpc_status st;
    setup("auth-node");
    node_with_tokens(&np, "node");
    CHECK(node_health(&np, "") == 1, "health without a token");

    struct rpc_channel *r = chan(np.addr, W_READ), *w = chan(np.addr, W_WRITE),
                       *a = chan(np.addr, W_ADMIN), *none = chan(np.addr, W_NONE);
    char **keys = keys_make("keep", 0, 100), **fresh = keys_make("fresh", 0, 10),
         **imp = keys_make("imported", 0, 10);
    CHECK(t_create(a, "keep", 100000, 0.001, BLOOMGRID__V1__FILTER_KIND__FILTER_KIND_COUNTING,
                   &st) == 0, "create: %s", st.message);
    keys_call(a, "Add", "keep", keys, 100, 100, NULL);
    uint8_t *exp = NULL;
    size_t elen = t_export(a, "keep", &exp, &st);
    CHECK(elen > 0, "export: %s", st.message);
    size_t ilen;
    uint8_t *ibuf = file_with_keys(exp, elen, imp, 10, &ilen);

    walk(np.addr, &bloomgrid__v1__bloom_grid__descriptor, public_methods,
         sizeof public_methods / sizeof public_methods[0]);
    walk(np.addr, &bloomgrid__v1__internal__descriptor, internal_methods,
         sizeof internal_methods / sizeof internal_methods[0]);

    /* Refused calls that would change the filter change nothing. */
    CHECK(t_drop(w, "keep", &st) == GRPC_STATUS_PERMISSION_DENIED, "drop: %s", st.message);
    CHECK(t_drop(none, "keep", &st) == GRPC_STATUS_UNAUTHENTICATED, "drop: %s", st.message);
    CHECK(t_create(w, "other", 1000, 0.01, 0, &st) == GRPC_STATUS_PERMISSION_DENIED,
          "create: %s", st.message);
    bool out[100];
    CHECK(t_keys(w, "Remove", "keep", keys, 100, out, &st) == GRPC_STATUS_PERMISSION_DENIED,
          "remove: %s", st.message);
    CHECK(t_keys(r, "Add", "keep", fresh, 10, out, &st) == GRPC_STATUS_PERMISSION_DENIED,
          "add: %s", st.message);
    struct kstream ks = kstream_open(r, true);
    CHECK(!kstream_one(&ks, "keep", fresh[0]), "add stream served a read token");
    CHECK(kstream_end(&ks, &st) == GRPC_STATUS_PERMISSION_DENIED, "add stream: %s",
          st.message);
    CHECK(t_import(r, "keep", ibuf, ilen, NULL, &st) == GRPC_STATUS_PERMISSION_DENIED,
          "import: %s", st.message);
    Bloomgrid__V1__ShardRef ref = BLOOMGRID__V1__SHARD_REF__INIT;
    ref.filter = "keep";
    Bloomgrid__V1__DropShardResponse *dr = NULL;
    CHECK(rpc_call(w, "/bloomgrid.v1.Internal/DropShard", &ref.base,
                   &bloomgrid__v1__drop_shard_response__descriptor,
                   (ProtobufCMessage **)&dr, TIMEOUT_MS, &st) < 0 &&
              st.code == GRPC_STATUS_PERMISSION_DENIED, "drop shard: %s", st.message);
    Bloomgrid__V1__FilterInfo *info = NULL;
    CHECK(t_get(r, "other", &info, &st) == GRPC_STATUS_NOT_FOUND, "other: %s", st.message);
    CHECK(t_get(r, "keep", &info, &st) == 0, "keep is gone: %s", st.message);
    bloomgrid__v1__filter_info__free_unpacked(info, NULL);
    CHECK(keys_present(r, "keep", keys, 100, NULL) == 100, "keys of keep lost");
    CHECK(keys_present(r, "keep", fresh, 10, NULL) == 0, "a refused add added keys");
    CHECK(keys_present(r, "keep", imp, 10, NULL) == 0, "a refused import added keys");

    /* The same calls with the admin token do change it (so the checks above
     * can tell). */
    CHECK(t_import(a, "keep", ibuf, ilen, NULL, &st) == 0, "import: %s", st.message);
    CHECK(keys_present(r, "keep", imp, 10, NULL) == 10, "import had no effect");
    CHECK(t_keys(a, "Add", "keep", fresh, 10, out, &st) == 0, "add: %s", st.message);
    CHECK(t_drop(a, "keep", &st) == 0, "drop: %s", st.message);
    CHECK(t_get(r, "keep", &info, &st) == GRPC_STATUS_NOT_FOUND, "keep: %s", st.message);

    free(exp);
    free(ibuf);
    keys_free(keys, 100);
    keys_free(fresh, 10);
    keys_free(imp, 10);
    rpc_channel_destroy(r);
    rpc_channel_destroy(w);
    rpc_channel_destroy(a);
    rpc_channel_destroy(none);
    CHECK(node_stop(&np, SIGTERM) == 0, "node exit status");
}

/* ---- revoke ---- */

static void test_revoke(void)
{
    struct node_proc np;
    struct rpc_status st;
    setup("auth-revoke");
    write_file(tokens, LINE_READ LINE_WRITE LINE_WRITE2 LINE_ADMIN);
    node_with_tokens(&np, "node");
    struct rpc_channel *a = chan(np.addr, W_ADMIN), *w = chan(np.addr, W_WRITE),
                       *w2 = chan_token(np.addr, TOK_WRITE2);
    char **k = keys_make("k", 0, 2);
    CHECK(t_create(a, "f", 10000, 0.001, 0, &st) == 0, "create: %s", st.message);

    struct kstream add = kstream_open(w, true), read = kstream_open(w, false),
                   add2 = kstream_open(w2, true);
    CHECK(kstream_one(&add, "f", "before-1"), "add stream");
    CHECK(kstream_one(&read, "f", "before-1"), "read stream");
    CHECK(kstream_one(&add2, "f", "other-1"), "add stream of the other token");

    /* A file that does not parse changes nothing.  A refused reload shows
     * nowhere but in the node's log, hence the log is read here. */
    write_file(tokens, LINE_READ LINE_WRITE2 LINE_ADMIN "write\n");
    kill(np.pid, SIGHUP);
    for (int i = 0; i < 200 && !harness_log_count(np.log, "tokens file refused"); i++)
        harness_sleep_ms(50);
    CHECK(harness_log_count(np.log, "tokens file refused") == 1, "bad file not refused");
    bool out[2];
    CHECK(t_keys(w, "Add", "f", k, 1, out, &st) == 0, "after a bad file: %s", st.message);
    CHECK(kstream_one(&add, "f", "before-2"), "add stream after a bad file");
    CHECK(kstream_one(&read, "f", "before-2"), "read stream after a bad file");

    /* The write token removed: refused from the reload on. */
    write_file(tokens, LINE_READ LINE_WRITE2 LINE_ADMIN);
    kill(np.pid, SIGHUP);
    int code = 0;
    for (int i = 0; i < 200; i++) {
        code = t_keys(w, "MayContain", "f", k, 1, out, &st);
        if (code != 0)
            break;
        harness_sleep_ms(50);
    }
    CHECK(code == GRPC_STATUS_UNAUTHENTICATED, "removed token: %s: %s",
          rpc_status_name(code), st.message);
    CHECK(!kstream_one(&add, "f", "after-1"), "open add stream still served");
    CHECK(kstream_end(&add, &st) == GRPC_STATUS_UNAUTHENTICATED, "add stream: %s: %s",
          rpc_status_name(st.code), st.message);
    CHECK(!kstream_one(&read, "f", "after-1"), "open read stream still served");
    CHECK(kstream_end(&read, &st) == GRPC_STATUS_UNAUTHENTICATED, "read stream: %s: %s",
          rpc_status_name(st.code), st.message);
    char *after[] = {"after-1"};
    bool present = true;
    CHECK(t_keys(a, "MayContain", "f", after, 1, &present, &st) == 0, "%s", st.message);
    CHECK(!present, "the refused stream message added its key");

    /* The other token and its stream go on. */
    CHECK(kstream_one(&add2, "f", "other-2"), "the other token's stream stopped");
    CHECK(kstream_end(&add2, &st) == GRPC_STATUS_OK, "%s", st.message);
    CHECK(t_keys(w2, "Add", "f", k, 2, out, &st) == 0, "other token: %s", st.message);

    /* A stream that only sends (Export) ends too: its token is checked
     * before every chunk.  The filter is large enough that flow control
     * holds the export back while the client does not read. */
    CHECK(t_create(a, "big", 40000000, 0.01, 0, &st) == 0, "create big: %s", st.message);
    struct rpc_cstream *ex = rpc_cstream_open(a, "/bloomgrid.v1.BloomGrid/Export", 60000);
    Bloomgrid__V1__ExportRequest er = BLOOMGRID__V1__EXPORT_REQUEST__INIT;
    er.filter = (char *)"big";
    er.chunk_size = 64 * 1024;
    CHECK(ex && rpc_cstream_write_msg(ex, &er.base) == 0 && rpc_cstream_close_send(ex) == 0,
          "export request");
    grpc_slice chunk;
    CHECK(rpc_cstream_read(ex, &chunk) == 1, "first export chunk");
    size_t got = GRPC_SLICE_LENGTH(chunk);
    grpc_slice_unref(chunk);
    write_file(tokens, LINE_READ LINE_WRITE2);
    kill(np.pid, SIGHUP);
    for (int i = 0; i < 200; i++) {
        code = t_create(a, "probe", 1000, 0.01, 0, &st);
        if (code != 0)
            break;
        harness_sleep_ms(50);
    }
    CHECK(code == GRPC_STATUS_UNAUTHENTICATED, "removed admin token: %s: %s",
          rpc_status_name(code), st.message);
    int r;
    while ((r = rpc_cstream_read(ex, &chunk)) == 1) {
        got += GRPC_SLICE_LENGTH(chunk);
        grpc_slice_unref(chunk);
    }
    CHECK(rpc_cstream_finish(ex, &st) != 0 && st.code == GRPC_STATUS_UNAUTHENTICATED,
          "export after its token was removed: %s: %s (%zu bytes read)",
          rpc_status_name(st.code), st.message, got);
    CHECK(got < 40u << 20, "the export sent %zu bytes after its token was removed", got);
    printf("export cut after %zu bytes\n", got);

    keys_free(k, 2);
    rpc_channel_destroy(a);
    rpc_channel_destroy(w);
    rpc_channel_destroy(w2);
    CHECK(node_stop(&np, SIGTERM) == 0, "node exit status");
}

/* ---- router ---- */

/* Keys added and read through the router at addr with the right roles. */
static void through_router(const char *addr, const char *filter)
{
    struct rpc_status st;
    struct rpc_channel *a = chan(addr, W_ADMIN), *w = chan(addr, W_WRITE),
                       *r = chan(addr, W_READ);
    char **keys = keys_make(filter, 0, 200);
    CHECK(t_create_sharded(a, filter, 10000, 0.01, 0, 4, NULL, &st) == 0, "create: %s",
          st.message);
    keys_call(w, "Add", filter, keys, 200, 50, NULL);
    CHECK(keys_present(r, filter, keys, 200, NULL) == 200, "keys through the router");
    bool out[1];
    CHECK(t_keys(r, "Add", filter, keys, 1, out, &st) == GRPC_STATUS_PERMISSION_DENIED,
          "read token adds: %s", st.message);
    keys_free(keys, 200);
    rpc_channel_destroy(a);
    rpc_channel_destroy(w);
    rpc_channel_destroy(r);
}

static void test_router(void)
{
    struct cluster open_nodes, token_nodes;
    setup("auth-router");

    /* Nodes without a tokens file behind a router with one. */
    cluster_init(&open_nodes, "auth-router-open", "none");
    for (int i = 0; i < 2; i++)
        cluster_node_start(&open_nodes, i, 0, NULL);
    cluster_write_topo(&open_nodes, 2, false, NULL);
    const char *rflags[] = {"--tokens-file", tokens, NULL};
    cluster_router_start(&open_nodes, 0, rflags);
    walk(open_nodes.router[0].addr, &bloomgrid__v1__bloom_grid__descriptor,
         public_methods, sizeof public_methods / sizeof public_methods[0]);
    through_router(open_nodes.router[0].addr, "open");
    cluster_stop(&open_nodes);

    /* Nodes with a tokens file: the router's calls carry its admin token. */
    cluster_init(&token_nodes, "auth-router-tokens", "none");
    const char *nflags[] = {"--tokens-file", tokens, NULL};
    for (int i = 0; i < 2; i++)
        cluster_node_start(&token_nodes, i, 0, nflags);
    cluster_write_topo(&token_nodes, 2, false, NULL);
    const char *tflags[] = {"--tokens-file", tokens, "--token-file", admin_file, NULL};
    cluster_router_start(&token_nodes, 0, tflags);
    through_router(token_nodes.router[0].addr, "tokens");
    cluster_stop(&token_nodes);
}

/* ---- merger ---- */

static void merger_config(const char *name, const char *node_addr, bool with_token)
{
    char path[700], sources[700], state[700], text[4096];
    snprintf(sources, sizeof sources, "%s/%s.sources", tdir, name);
    snprintf(text, sizeof text, "[filter m]\ndatacenter = dc1 %s\n", node_addr);
    write_file(sources, text);
    snprintf(state, sizeof state, "%s/%s.state", tdir, name);
    snprintf(path, sizeof path, "%s/%s.ini", tdir, name);
    snprintf(text, sizeof text,
             "[merger]\nlisten = 127.0.0.1:0\nstate_dir = %s\nsources = %s\n"
             "interval_s = 3600\nnode_timeout_ms = 3000\ntokens_file = %s\n%s%s\n",
             state, sources, tokens, with_token ? "token_file = " : "",
             with_token ? admin_file : "");
    write_file(path, text);
}

static void merger_start(struct node_proc *p, const char *name)
{
    char cfg[700], log[700];
    snprintf(cfg, sizeof cfg, "%s/%s.ini", tdir, name);
    snprintf(log, sizeof log, "%s/%s.log", tdir, name);
    const char *argv[] = {merger_bin, "--config", cfg, NULL};
    proc_spawn(p, log, argv);
    CHECK(node_wait_health(p, true, TIMEOUT_MS), "merger not SERVING");
}

static Bloomgrid__V1__RoundReport *run_round(const char *addr)
{
    struct rpc_status st;
    struct rpc_channel *a = chan(addr, W_ADMIN);
    Bloomgrid__V1__RunRoundRequest rq = BLOOMGRID__V1__RUN_ROUND_REQUEST__INIT;
    Bloomgrid__V1__RoundReport *rep = NULL;
    CHECK(rpc_call(a, "/bloomgrid.v1.Merger/RunRound", &rq.base,
                   &bloomgrid__v1__round_report__descriptor, (ProtobufCMessage **)&rep,
                   TIMEOUT_MS * 3, &st) == 0, "RunRound: %s", st.message);
    rpc_channel_destroy(a);
    return rep;
}

static void test_merger(void)
{
    struct node_proc np, mg, bare;
    struct rpc_status st;
    setup("auth-merger");
    node_with_tokens(&np, "node");
    struct rpc_channel *a = chan(np.addr, W_ADMIN);
    char **keys = keys_make("m", 0, 50);
    CHECK(t_create(a, "m", 10000, 0.01, 0, &st) == 0, "create: %s", st.message);
    keys_call(a, "Add", "m", keys, 50, 50, NULL);

    merger_config("merger", np.addr, true);
    merger_start(&mg, "merger");
    walk(mg.addr, &bloomgrid__v1__merger__descriptor, merger_methods,
         sizeof merger_methods / sizeof merger_methods[0]);
    /* The walk's RunRound pulled the keys so far: new ones for this round. */
    char **more = keys_make("m-more", 0, 50);
    keys_call(a, "Add", "m", more, 50, 50, NULL);
    keys_free(more, 50);
    Bloomgrid__V1__RoundReport *rep = run_round(mg.addr);
    /* The new keys come as pages or as their hashes, whichever is smaller:
     * either way bytes were pulled. */
    CHECK(rep->errors == 0 && rep->bytes_pulled > 0,
          "round with the token: %u errors, %llu pages, %llu bytes: %s", rep->errors,
          (unsigned long long)rep->pages_pulled, (unsigned long long)rep->bytes_pulled,
          rep->n_messages ? rep->messages[0] : "");
    bloomgrid__v1__round_report__free_unpacked(rep, NULL);

    /* Without token_file the node refuses the merger's calls. */
    merger_config("bare", np.addr, false);
    merger_start(&bare, "bare");
    rep = run_round(bare.addr);
    CHECK(rep->errors > 0 && rep->n_messages > 0 &&
              strstr(rep->messages[0], "UNAUTHENTICATED"),
          "round without a token: %u errors: %s", rep->errors,
          rep->n_messages ? rep->messages[0] : "");
    bloomgrid__v1__round_report__free_unpacked(rep, NULL);

    keys_free(keys, 50);
    rpc_channel_destroy(a);
    CHECK(node_stop(&bare, SIGTERM) == 0, "merger exit status");
    CHECK(node_stop(&mg, SIGTERM) == 0, "merger exit status");
    CHECK(node_stop(&np, SIGTERM) == 0, "node exit status");
}

/* ---- start ---- */

static int run_status(const char *const *argv, const char *log)
{
    return harness_run(argv, log, log, NULL, 0);
}

static void test_start(void)
{
    char bad[700], dir[700], log[700], topo[700], cfg[700];
    setup("auth-start");
    snprintf(bad, sizeof bad, "%s/bad-tokens", tdir);
    write_file(bad, LINE_READ "admin ops not-a-hash\n");
    snprintf(dir, sizeof dir, "%s/data", tdir);
    snprintf(log, sizeof log, "%s/start.log", tdir);
    snprintf(topo, sizeof topo, "%s/topology.ini", tdir);
    write_file(topo, "version = 1\n[group g0]\ncopies = 127.0.0.1:1\n");
    const char *node[] = {harness_node_bin, "--listen", "127.0.0.1:0", "--data-dir", dir,
                          "--tokens-file", bad, NULL};
    CHECK(run_status(node, log) == 2, "node started with a bad tokens file");
    const char *router[] = {harness_router_bin, "--listen", "127.0.0.1:0", "--topology",
                            topo, "--tokens-file", bad, NULL};
    CHECK(run_status(router, log) == 2, "router started with a bad tokens file");
    merger_config("merger", "127.0.0.1:1", true);
    snprintf(cfg, sizeof cfg, "%s/merger.ini", tdir);
    const char *merger[] = {merger_bin, "--config", cfg, "--tokens-file", bad, NULL};
    CHECK(run_status(merger, log) == 2, "merger started with a bad tokens file");
    /* A token file that is not a token. */
    write_file(admin_file, "two words\n");
    const char *node2[] = {harness_node_bin, "--listen", "127.0.0.1:0", "--data-dir", dir,
                           "--token-file", admin_file, NULL};
    CHECK(run_status(node2, log) == 2, "node started with a bad token file");
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: %s NODE_BIN ROUTER_BIN MERGER_BIN TEST\n", argv[0]);
        return 2;
    }
    harness_node_bin = argv[1];
    harness_router_bin = argv[2];
    merger_bin = argv[3];
    grpc_init();
    if (strcmp(argv[4], "node") == 0)
        test_node();
    else if (strcmp(argv[4], "revoke") == 0)
        test_revoke();
    else if (strcmp(argv[4], "router") == 0)
        test_router();
    else if (strcmp(argv[4], "merger") == 0)
        test_merger();
    else if (strcmp(argv[4], "start") == 0)
        test_start();
    else {
        fprintf(stderr, "unknown test %s\n", argv[4]);
        return 2;
    }
    printf("ok\n");
    return 0;
}
