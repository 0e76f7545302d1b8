/* Integration tests of bloomgrid-merger's edges: its own service, the files
 * it writes, what it accepts from nodes and from its sources file.
 *
 * usage: test_merger_api NODE_BIN MERGER_BIN SPY_LIB TEST
 *   malformed  Status and RunRound with bytes that are not their request
 *              message get INVALID_ARGUMENT and run nothing; a well-formed
 *              request with an unknown field is served
 *   durable    every file the merger publishes (snapshot, sidecar) is
 *              synced before its rename and its directory after it, and
 *              every directory it creates is made durable in its parent
 *              (SPY_LIB records the calls); a sidecar that cannot be
 *              renamed into place leaves no temp file behind
 *   hostile    a fake node answering what no node should: node_client
 *              refuses a shard count beyond the rules, another shard, a
 *              bad geometry, a malformed fingerprint, a message after the
 *              last one, a push answered without a response; the merger
 *              reports (exit 1) a filter whose shard count is absurd,
 *              refuses a pull of more bytes than the shard holds, and keeps
 *              its report valid UTF-8 when a node's message is not
 *   sources    a sources file naming a filter the rules refuse (a path), a
 *              datacenter name that does not fit, or a datacenter line with
 *              extra words is refused at start (exit 2)
 */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <grpc/grpc.h>
#include <xxhash.h>

#include "bf.h"
#include "bf_file.h"
#include "bloomgrid/v1/internal.pb-c.h"
#include "bloomgrid/v1/merger.pb-c.h"
#include "harness.h"
#include "merger_once.h"
#include "node_client.h"
#include "rpc_server.h"
#include "rules.h"

#define M_STATUS "/bloomgrid.v1.Merger/Status"
#define M_RUN "/bloomgrid.v1.Merger/RunRound"

static const char *merger_bin, *spy_lib;
static char tdir[PATH_MAX], cfg[PATH_MAX + 32], state_dir[PATH_MAX + 32];

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* A fresh test directory, as an absolute path without symlinks (the spy
 * reports the paths the kernel resolved). */
static void setup(const char *tag)
{
    char made[PATH_MAX];
    harness_tmpdir(made, sizeof made, tag);
    CHECK(realpath(made, tdir), "realpath %s", made);
    snprintf(state_dir, sizeof state_dir, "%s/state", tdir);
    snprintf(cfg, sizeof cfg, "%s/merger.ini", tdir);
}

/* The merger's config and a sources file with text. */
static void write_config(const char *sources_text)
{
    char sources[PATH_MAX + 32];
    FILE *f;

    snprintf(sources, sizeof sources, "%s/sources.ini", tdir);
    CHECK((f = fopen(sources, "w")), "sources");
    fputs(sources_text, f);
    fclose(f);
    CHECK((f = fopen(cfg, "w")), "config");
    fprintf(f, "[merger]\nlisten = 127.0.0.1:0\nstate_dir = %s\nsources = %s\n"
            "interval_s = 3600\nnode_timeout_ms = 3000\nlog_level = debug\n",
            state_dir, sources);
    fclose(f);
}

/* Run "bloomgrid-merger --once"; spy_log (may be NULL) records its file
 * calls through SPY_LIB. */
static void once(struct round_out *o, const char *spy_log)
{
    /* A sanitizer build wants its runtime first; the spy only wraps five
     * calls. */
    const char *env[] = {"FSYNC_SPY_LOG", spy_log, "LD_PRELOAD", spy_lib,
                         "ASAN_OPTIONS", "verify_asan_link_order=0", NULL};
    merger_once_run(merger_bin, cfg, tdir, o, spy_log ? env : NULL, 0, NULL);
}

static void merger_start(struct node_proc *p)
{
    char log[PATH_MAX + 32];
    snprintf(log, sizeof log, "%s/merger.log", tdir);
    const char *argv[] = {merger_bin, "--config", cfg, NULL};
    proc_spawn(p, log, argv);
}

/* Merger.Status, unpacked (the caller frees it). */
static Bloomgrid__V1__MergerStatus *status_get(struct rpc_channel *ch)
{
    Bloomgrid__V1__MergerStatusRequest rq =
        BLOOMGRID__V1__MERGER_STATUS_REQUEST__INIT;
    Bloomgrid__V1__MergerStatus *ms = NULL;
    struct rpc_status st;
    CHECK(rpc_call(ch, M_STATUS, &rq.base,
                   &bloomgrid__v1__merger_status__descriptor,
                   (ProtobufCMessage **)&ms, TIMEOUT_MS, &st) == 0,
          "Status: %s", st.message);
    return ms;
}

static uint64_t rounds_done(struct rpc_channel *ch)
{
    Bloomgrid__V1__MergerStatus *ms = status_get(ch);
    uint64_t n = ms->rounds;
    bloomgrid__v1__merger_status__free_unpacked(ms, NULL);
    return n;
}

/* Wait (at most a minute) for the merger's first round to end. */
static void wait_first_round(struct rpc_channel *ch)
{
    for (int i = 0; i < 3000 && rounds_done(ch) < 1; i++)
        sleep_ms(20);
    CHECK(rounds_done(ch) == 1, "no first round");
}

static int node_with_filter(struct node_proc *n, int nkeys)
{
    const char *fast[] = {"--durability", "none", NULL};
    char dir[PATH_MAX + 32], key[32], *keys[1] = {key};
    struct rpc_status st;
    bool out;

    snprintf(dir, sizeof dir, "%s/node", tdir);
    node_start(n, dir, fast);
    CHECK(node_wait_health(n, true, 30000), "node not serving");
    CHECK(t_create(n->ch, "f", 10000, 0.01, 1, &st) == 0, "create: %s",
          st.message);
    for (int i = 0; i < nkeys; i++) {
        snprintf(key, sizeof key, "key-%d", i);
        CHECK(t_keys(n->ch, "Add", "f", keys, 1, &out, &st) == 0, "Add: %s",
              st.message);
    }
    return 0;
}

/* ---- malformed ---- */

static void expect_invalid(struct rpc_channel *ch, const char *method,
                           const void *body, size_t len)
{
    struct rpc_status st;
    grpc_slice resp;
    int rc = rpc_call_raw(ch, method, body, len, &resp, TIMEOUT_MS, &st);
    if (rc == 0)
        grpc_slice_unref(resp);
    CHECK(rc < 0 && st.code == GRPC_STATUS_INVALID_ARGUMENT && st.message[0],
          "%s with %zu malformed bytes: rc %d code %d \"%s\"", method, len, rc,
          st.code, rc < 0 ? st.message : "");
}

static void test_malformed(void)
{
    struct node_proc n, m;
    struct rpc_status st;
    char src[256];
    grpc_slice resp;
    static const struct {
        const char *bytes;
        size_t len;
    } bad[] = {
        {"\xff", 1},              /* a tag whose varint never ends */
        {"\x08", 1},              /* field 1 without its value */
        {"\x0a\x05" "ab", 4},     /* 5 bytes announced, 2 sent */
        {"\x0f\x00", 2},          /* wire type 7 does not exist */
    };

    setup("merger-malformed");
    node_with_filter(&n, 10);
    snprintf(src, sizeof src, "[filter f]\ndatacenter = a %s\n", n.addr);
    write_config(src);
    merger_start(&m);
    wait_first_round(m.ch);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        expect_invalid(m.ch, M_STATUS, bad[i].bytes, bad[i].len);
        expect_invalid(m.ch, M_RUN, bad[i].bytes, bad[i].len);
    }
    CHECK(rounds_done(m.ch) == 1, "a malformed RunRound ran a round");
    /* Unknown fields are how a newer client talks to this merger: served. */
    CHECK(rpc_call_raw(m.ch, M_RUN, "\x08\x01", 2, &resp, TIMEOUT_MS, &st) == 0,
          "RunRound with an unknown field: %s", st.message);
    Bloomgrid__V1__RoundReport *rr = bloomgrid__v1__round_report__unpack(
        NULL, GRPC_SLICE_LENGTH(resp), GRPC_SLICE_START_PTR(resp));
    grpc_slice_unref(resp);
    CHECK(rr && rr->errors == 0, "RunRound report");
    bloomgrid__v1__round_report__free_unpacked(rr, NULL);
    CHECK(rpc_call_raw(m.ch, M_STATUS, "\x08\x01", 2, &resp, TIMEOUT_MS,
                       &st) == 0, "Status with an unknown field: %s",
          st.message);
    grpc_slice_unref(resp);
    CHECK(rounds_done(m.ch) == 2, "the well-formed RunRound ran one round");
    CHECK(node_stop(&m, SIGTERM) == 0, "merger exit status");
    node_stop(&n, SIGTERM);
}

/* ---- durable ---- */

struct spy_line {
    char what[8];
    char a[PATH_MAX], b[PATH_MAX];
};

static size_t spy_read(const char *path, struct spy_line **out)
{
    FILE *f = fopen(path, "r");
    size_t n = 0, cap = 0;
    char line[2 * PATH_MAX + 16];

    CHECK(f, "spy log %s missing (is %s preloaded?)", path, spy_lib);
    *out = NULL;
    while (fgets(line, sizeof line, f)) {
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            *out = realloc(*out, cap * sizeof **out);
            CHECK(*out, "realloc");
        }
        struct spy_line *l = &(*out)[n];
        l->a[0] = l->b[0] = 0;
        line[strcspn(line, "\n")] = 0;
        if (sscanf(line, "%7s %4095s %4095s", l->what, l->a, l->b) >= 2)
            n++;
    }
    fclose(f);
    return n;
}

static void dir_of(const char *path, char *dir, size_t len)
{
    snprintf(dir, len, "%s", path);
    char *slash = strrchr(dir, '/');
    CHECK(slash && slash != dir, "no directory in %s", path);
    *slash = 0;
}

static bool under(const char *path, const char *dir)
{
    size_t n = strlen(dir);
    return strncmp(path, dir, n) == 0 && path[n] == '/';
}

/* Is there a "fsync path" among l[from, to)? */
static bool synced(const struct spy_line *l, size_t from, size_t to,
                   const char *path)
{
    for (size_t i = from; i < to; i++)
        if (!strcmp(l[i].what, "fsync") && !strcmp(l[i].a, path))
            return true;
    return false;
}

/* Every rename into state_dir: the file synced before it, its directory
 * after it and before the next rename.  Every directory created: its
 * parent synced after it. */
static void spy_check(const char *log, int *renames_bf, int *renames_state)
{
    struct spy_line *l;
    size_t n = spy_read(log, &l);
    char dir[PATH_MAX];

    for (size_t i = 0; i < n; i++) {
        if (!strcmp(l[i].what, "rename") && under(l[i].b, state_dir)) {
            size_t next = i + 1;
            while (next < n && strcmp(l[next].what, "rename"))
                next++;
            CHECK(synced(l, 0, i, l[i].a), "%s renamed to %s unsynced",
                  l[i].a, l[i].b);
            dir_of(l[i].b, dir, sizeof dir);
            CHECK(synced(l, i + 1, next, dir), "rename to %s: directory %s "
                  "not synced after it", l[i].b, dir);
            size_t bl = strlen(l[i].b);
            *renames_bf += bl > 3 && !strcmp(l[i].b + bl - 3, ".bf");
            *renames_state += bl > 6 && !strcmp(l[i].b + bl - 6, ".state");
        }
        if (!strcmp(l[i].what, "mkdir") && under(l[i].a, tdir)) {
            dir_of(l[i].a, dir, sizeof dir);
            CHECK(synced(l, i + 1, n, dir), "mkdir %s: parent %s never synced",
                  l[i].a, dir);
        }
    }
    free(l);
}

static void test_durable(void)
{
    struct node_proc n;
    struct round_out o;
    char src[256], spy[PATH_MAX + 32], path[PATH_MAX + 64], key[32];
    char *keys[1] = {key}, err[BF_ERRLEN];
    struct rpc_status st;
    bool out;
    int nbf = 0, nstate = 0;

    setup("merger-durable");
    node_with_filter(&n, 100);
    snprintf(src, sizeof src, "[filter f]\ndatacenter = a %s\n", n.addr);
    write_config(src);
    snprintf(spy, sizeof spy, "%s/spy.log", tdir);
    once(&o, spy);
    CHECK(o.status == 0 && o.changed > 0, "round:\n%s", o.text);
    spy_check(spy, &nbf, &nstate);
    CHECK(nbf >= 1 && nstate >= 1, "the round published %d snapshots and %d "
          "sidecars", nbf, nstate);

    /* A directory where the sidecar goes: the save fails, and leaves no
     * temp file in the state directory. */
    snprintf(path, sizeof path, "%s/f/shard-0000.state", state_dir);
    CHECK(unlink(path) == 0 && mkdir(path, 0755) == 0, "replace %s", path);
    snprintf(key, sizeof key, "more");
    CHECK(t_keys(n.ch, "Add", "f", keys, 1, &out, &st) == 0, "Add: %s",
          st.message);
    once(&o, NULL);
    CHECK(o.status == 1 && o.errors >= 1, "round with the sidecar blocked:\n%s",
          o.text);
    snprintf(path, sizeof path, "%s/f", state_dir);
    DIR *d = opendir(path);
    CHECK(d, "opendir %s", path);
    struct dirent *e;
    while ((e = readdir(d)))
        CHECK(!strstr(e->d_name, ".tmp"), "temp file %s/%s left behind", path,
              e->d_name);
    closedir(d);
    snprintf(path, sizeof path, "%s/f/shard-0000.bf", state_dir);
    struct bf *b = bf_file_load(path, err, NULL);
    CHECK(b, "snapshot after the failed round: %s", err);
    bf_destroy(b);
    node_stop(&n, SIGTERM);
}

/* ---- hostile: a fake node ---- */

enum fake_pull { PULL_GOOD, PULL_LONG_FP, PULL_AFTER_LAST, PULL_TWICE };

static struct fake {
    uint32_t count, index;        /* GetShard: shard_count, shard_index */
    uint64_t capacity;
    const char *fail;             /* GetShard fails UNAVAILABLE with this */
    enum fake_pull pull;
    bool push_reply;              /* PushPages sends its response */
    uint8_t secret[BF_SECRET_LEN];
    char fp[NODE_CLIENT_FP_LEN + 1];
    uint8_t *body;                /* the shard's body (PULL_TWICE) */
    size_t body_len;
} fake;

static void fake_get_shard(void *arg, const uint8_t *req, size_t len,
                           struct rpc_reply *r)
{
    Bloomgrid__V1__InternalShardInfo isi =
        BLOOMGRID__V1__INTERNAL_SHARD_INFO__INIT;
    Bloomgrid__V1__FilterInfo fi = BLOOMGRID__V1__FILTER_INFO__INIT;
    (void)arg;
    (void)req;
    (void)len;
    if (fake.fail) {
        rpc_reply_error(r, GRPC_STATUS_UNAVAILABLE, "%s", fake.fail);
        return;
    }
    fi.name = "f";
    fi.kind = 1;
    fi.capacity = fake.capacity;
    fi.error_rate = 0.01;
    isi.filter = "f";
    isi.shard_index = fake.index;
    isi.shard_count = fake.count;
    isi.info = &fi;
    isi.secret.data = fake.secret;
    isi.secret.len = BF_SECRET_LEN;
    rpc_reply_pack(r, &isi.base);
}

static void fake_page(struct rpc_stream *s, const uint8_t *data, size_t len)
{
    Bloomgrid__V1__Page pg = BLOOMGRID__V1__PAGE__INIT;
    pg.data.data = (uint8_t *)data;
    pg.data.len = len;
    pg.checksum = XXH64(data, len, 0);
    rpc_stream_write(s, &pg.base);
}

static void fake_pull(void *arg, struct rpc_stream *s)
{
    Bloomgrid__V1__Page last = BLOOMGRID__V1__PAGE__INIT;
    const uint8_t *buf;
    size_t len;
    (void)arg;
    if (rpc_stream_read(s, &buf, &len) != 1)
        return;
    if (fake.pull == PULL_TWICE) {
        fake_page(s, fake.body, fake.body_len);
        fake_page(s, fake.body, fake.body_len);
    }
    last.last = true;
    last.version = 7;
    last.epoch = 99;
    last.fingerprint = fake.pull == PULL_LONG_FP ? "0123456789abcdef0123"
                                                 : fake.fp;
    rpc_stream_write(s, &last.base);
    if (fake.pull == PULL_AFTER_LAST)
        fake_page(s, (const uint8_t *)"\0\0\0\0\0\0\0\0", 8);
    rpc_stream_finish(s, GRPC_STATUS_OK, "%s", "");
}

static void fake_push(void *arg, struct rpc_stream *s)
{
    Bloomgrid__V1__PushPagesResponse resp =
        BLOOMGRID__V1__PUSH_PAGES_RESPONSE__INIT;
    const uint8_t *buf;
    size_t len;
    (void)arg;
    while (rpc_stream_read(s, &buf, &len) == 1)
        ;
    resp.version = 1;
    if (fake.push_reply)
        rpc_stream_write(s, &resp.base);
    rpc_stream_finish(s, GRPC_STATUS_OK, "%s", "");
}

static struct rpc_server *fake_start(char *addr, size_t len)
{
    static struct rpc_handler table[64];
    const ProtobufCServiceDescriptor *sd = &bloomgrid__v1__internal__descriptor;
    struct rpc_server_config sc = {.listen = "127.0.0.1:0", .threads = 2,
                                   .max_message = 64u << 20, .grace_ms = 100};
    struct rpc_server *srv = rpc_server_create(&sc);

    CHECK(srv && sd->n_methods <= 64, "fake server");
    for (unsigned i = 0; i < sd->n_methods; i++) {
        if (!strcmp(sd->methods[i].name, "GetShard"))
            table[i].unary = fake_get_shard;
        else if (!strcmp(sd->methods[i].name, "PullPages"))
            table[i].stream = fake_pull;
        else if (!strcmp(sd->methods[i].name, "PushPages"))
            table[i].stream = fake_push;
    }
    CHECK(rpc_server_add_service(srv, sd, table, NULL) == 0, "add service");
    int port = rpc_server_start(srv);
    CHECK(port > 0, "fake server start: %d", port);
    snprintf(addr, len, "127.0.0.1:%d", port);
    return srv;
}

/* The fake's shard as the client sees it, and its fingerprint. */
static void fake_good(void)
{
    struct node_client_shard sh = {.shard_index = 0, .shard_count = 1,
                                   .kind = 1, .capacity = 10000,
                                   .error_rate = 0.01};
    struct bf_layer_info li;
    char err[BF_ERRLEN];

    fake.count = 1;
    fake.index = 0;
    fake.capacity = 10000;
    fake.fail = NULL;
    fake.pull = PULL_GOOD;
    fake.push_reply = true;
    memset(fake.secret, 0x5a, sizeof fake.secret);
    memcpy(sh.secret, fake.secret, sizeof sh.secret);
    struct bf *b = node_client_shard_filter(&sh, err);
    CHECK(b, "%s", err);
    bf_fingerprint_id(b, fake.fp);
    bf_layer_info(b, 0, &li);
    free(fake.body);
    fake.body_len = (size_t)li.body_bytes;
    fake.body = calloc(1, fake.body_len);
    CHECK(fake.body, "calloc");
    fake.body[0] = 1;
    bf_destroy(b);
}

static void expect_internal(int rc, const struct rpc_status *st,
                            const char *what)
{
    CHECK(rc < 0 && st->code == GRPC_STATUS_INTERNAL, "%s: rc %d code %d %s",
          what, rc, st->code, st->message);
    printf("%s: refused: %s\n", what, st->message);
}

static void client_checks(struct rpc_channel *ch)
{
    struct node_client_shard sh;
    struct node_client_pull_end end;
    struct node_client_page pg = {0, "\0\0\0\0\0\0\0\0", 8};
    struct rpc_status st;

    fake_good();
    CHECK(node_client_get_shard(ch, "f", 0, &sh, TIMEOUT_MS, &st) == 0 &&
              sh.shard_count == 1 && sh.capacity == 10000,
          "a sound GetShard: %s", st.message);
    fake.count = RULES_SHARDS_MAX + 1;
    expect_internal(node_client_get_shard(ch, "f", 0, &sh, TIMEOUT_MS, &st),
                    &st, "shard count beyond the rules");
    fake.count = 4;
    fake.index = 2;
    expect_internal(node_client_get_shard(ch, "f", 0, &sh, TIMEOUT_MS, &st),
                    &st, "another shard than asked");
    fake.index = 0;
    fake.capacity = 0;
    expect_internal(node_client_get_shard(ch, "f", 0, &sh, TIMEOUT_MS, &st),
                    &st, "capacity 0");

    fake_good();
    CHECK(node_client_pull(ch, "f", 0, 0, 0, NULL, NULL, &end, TIMEOUT_MS,
                           &st) == 0 && !strcmp(end.fp, fake.fp),
          "a sound pull: %s", st.message);
    fake.pull = PULL_LONG_FP;
    expect_internal(node_client_pull(ch, "f", 0, 0, 0, NULL, NULL, &end,
                                     TIMEOUT_MS, &st),
                    &st, "fingerprint of 20 bytes");
    fake.pull = PULL_AFTER_LAST;
    expect_internal(node_client_pull(ch, "f", 0, 0, 0, NULL, NULL, &end,
                                     TIMEOUT_MS, &st),
                    &st, "a page after the last message");

    CHECK(node_client_push(ch, "f", 0, fake.fp, 0, &pg, 1, NULL, TIMEOUT_MS,
                           &st) == 0, "a sound push: %s", st.message);
    fake.push_reply = false;
    expect_internal(node_client_push(ch, "f", 0, fake.fp, 0, &pg, 1, NULL,
                                     TIMEOUT_MS, &st),
                    &st, "a push answered without a response");
}

static void test_hostile(void)
{
    char addr[64], src[256];
    struct round_out o;
    struct node_proc m;
    struct stat sb;

    setup("merger-hostile");
    struct rpc_server *srv = fake_start(addr, sizeof addr);
    struct rpc_channel *ch = rpc_channel_create(addr, 0);
    CHECK(ch, "channel");
    client_checks(ch);
    rpc_channel_destroy(ch);
    snprintf(src, sizeof src, "[filter f]\ndatacenter = a %s\n", addr);
    write_config(src);

    /* A shard count no merger can hold: reported, nothing written. */
    fake_good();
    fake.count = UINT32_MAX;
    once(&o, NULL);
    CHECK(o.status == 1 && o.errors >= 1, "absurd shard count:\n%s", o.text);
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/f", state_dir);
    CHECK(stat(path, &sb) < 0, "%s created for an absurd shard count", path);

    /* A pull of the whole body twice: more than the shard holds. */
    fake_good();
    fake.pull = PULL_TWICE;
    once(&o, NULL);
    CHECK(o.status == 1 && o.errors >= 1 && o.changed == 0,
          "a pull of twice the body:\n%s", o.text);
    fake.pull = PULL_GOOD;
    once(&o, NULL);
    CHECK(o.status == 0, "sound round:\n%s", o.text);

    /* A node's message that is not UTF-8, and one cut in a character:
     * every string of the report stays valid UTF-8. */
    char msg[700] = "bad \xff\xfe bytes ";
    while (strlen(msg) + 2 < sizeof msg)
        strcat(msg, "\xc3\xa9");
    fake_good();
    fake.fail = msg;
    merger_start(&m);
    wait_first_round(m.ch);
    Bloomgrid__V1__MergerStatus *ms = status_get(m.ch);
    CHECK(ms->last && ms->last->errors >= 1 && ms->last->n_messages >= 1,
          "the failing GetShard is reported");
    for (size_t i = 0; i < ms->last->n_messages; i++)
        CHECK(rules_utf8_valid(ms->last->messages[i],
                               strlen(ms->last->messages[i])),
              "message %zu of the report is not UTF-8: %s", i,
              ms->last->messages[i]);
    bloomgrid__v1__merger_status__free_unpacked(ms, NULL);
    CHECK(node_stop(&m, SIGTERM) == 0, "merger exit status");
    rpc_server_shutdown(srv);
    rpc_server_destroy(srv);
    free(fake.body);
}

/* ---- sources ---- */

static void test_sources(void)
{
    struct round_out o;
    char src[512], name[80], escaped[PATH_MAX + 32];
    struct stat sb;

    setup("merger-sources");
    write_config("[filter ../escape]\ndatacenter = a 127.0.0.1:1\n");
    once(&o, NULL);
    CHECK(o.status == 2, "filter named ../escape: exit %d", o.status);
    snprintf(escaped, sizeof escaped, "%s/escape", tdir);
    CHECK(stat(escaped, &sb) < 0, "%s created", escaped);

    memset(name, 'd', 70);
    name[70] = 0;
    snprintf(src, sizeof src, "[filter f]\ndatacenter = %s 127.0.0.1:1\n",
             name);
    write_config(src);
    once(&o, NULL);
    CHECK(o.status == 2, "datacenter name of 70 bytes: exit %d", o.status);

    write_config("[filter f]\ndatacenter = a 127.0.0.1:1 127.0.0.1:2\n");
    once(&o, NULL);
    CHECK(o.status == 2, "datacenter line with three words: exit %d",
          o.status);

    /* The same file with a sound line runs (and fails to reach the node). */
    write_config("[filter f]\ndatacenter = a 127.0.0.1:1\n");
    once(&o, NULL);
    CHECK(o.status == 1, "sound sources file: exit %d\n%s", o.status, o.text);
}

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: %s NODE_BIN MERGER_BIN SPY_LIB TEST\n",
                argv[0]);
        return 2;
    }
    harness_node_bin = argv[1];
    merger_bin = argv[2];
    spy_lib = argv[3];
    grpc_init();
    if (!strcmp(argv[4], "malformed"))
        test_malformed();
    else if (!strcmp(argv[4], "durable"))
        test_durable();
    else if (!strcmp(argv[4], "hostile"))
        test_hostile();
    else if (!strcmp(argv[4], "sources"))
        test_sources();
    else {
        fprintf(stderr, "unknown test %s\n", argv[4]);
        return 2;
    }
    grpc_shutdown();
    printf("%s: ok\n", argv[4]);
    return 0;
}
