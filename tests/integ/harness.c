/* harness: processes, keys and RPC wrappers for integration tests. */
#include "harness.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <grpc/grpc.h>

#include "grpc/health/v1/health.pb-c.h"

const char *harness_node_bin = "bloomgrid-node";
const char *harness_router_bin = "bloomgrid-router";

/* Nodes still running when the test exits (a failed CHECK) are killed, so a
 * failure never leaves processes behind. */
#define MAX_LIVE 64
static pid_t live[MAX_LIVE];

static void kill_live(void)
{
    for (int i = 0; i < MAX_LIVE; i++)
        if (live[i] > 0) {
            kill(live[i], SIGKILL);
            waitpid(live[i], NULL, 0);
            live[i] = 0;
        }
}

static void live_add(pid_t pid)
{
    static bool registered;
    if (!registered) {
        atexit(kill_live);
        registered = true;
    }
    for (int i = 0; i < MAX_LIVE; i++)
        if (live[i] == 0) {
            live[i] = pid;
            return;
        }
}

static void live_remove(pid_t pid)
{
    for (int i = 0; i < MAX_LIVE; i++)
        if (live[i] == pid)
            live[i] = 0;
}

void harness_tmpdir(char *out, size_t len, const char *tag)
{
    const char *base = getenv("BLOOMGRID_TEST_TMP");
    if (!base || !*base)
        base = "/tmp";
    mkdir(base, 0755);
    snprintf(out, len, "%s/integ-%s-XXXXXX", base, tag);
    CHECK(mkdtemp(out) != NULL, "mkdtemp %s: %s", out, strerror(errno));
}

uint64_t harness_status_bytes(pid_t pid, const char *name)
{
    char path[64], line[256], fmt[64];
    unsigned long long kb = 0;
    bool found = false;

    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    snprintf(fmt, sizeof fmt, "%s: %%llu kB", name);
    FILE *f = fopen(path, "r");
    CHECK(f != NULL, "cannot read %s", path);
    while (!found && fgets(line, sizeof line, f))
        found = sscanf(line, fmt, &kb) == 1;
    fclose(f);
    CHECK(found, "no %s line in %s", name, path);
    return (uint64_t)kb << 10;
}

void harness_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Is every thread of pid stopped (state T in /proc/pid/task/N/stat)? */
static bool all_stopped(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
    DIR *d = opendir(path);
    if (!d)
        return false;
    bool all = true;
    for (struct dirent *e; all && (e = readdir(d));) {
        if (e->d_name[0] == '.')
            continue;
        char stat[384], buf[512];
        snprintf(stat, sizeof stat, "%s/%s/stat", path, e->d_name);
        FILE *f = fopen(stat, "r");
        size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
        if (f)
            fclose(f);
        buf[n] = 0;
        const char *close_paren = strrchr(buf, ')');  /* "tid (comm) S ..." */
        if (close_paren && close_paren[1] == ' ' && close_paren[2] != 'T' &&
            close_paren[2] != 't')
            all = false;
    }
    closedir(d);
    return all;
}

int harness_sigstop(pid_t pid)
{
    if (kill(pid, SIGSTOP) < 0)
        return -1;
    for (int waited = 0; waited < 5000; waited += 2) {
        if (all_stopped(pid))
            return 0;
        harness_sleep_ms(2);
    }
    return -1;
}

int harness_run(const char *const *argv, const char *out, const char *err,
                const char *const *env, int timeout_ms)
{
    pid_t pid = fork();
    CHECK(pid >= 0, "fork");
    if (pid == 0) {
        int o = open(out ? out : "/dev/null", O_WRONLY | O_CREAT | O_APPEND, 0644);
        int e = !err ? open("/dev/null", O_WRONLY)
                : (out && strcmp(out, err) == 0) ? o
                : open(err, O_WRONLY | O_CREAT | O_APPEND, 0644);
        dup2(o, 1);
        dup2(e, 2);
        for (int i = 0; env && env[i]; i += 2)
            setenv(env[i], env[i + 1], 1);
        execv(argv[0], (char **)argv);
        _exit(127);
    }
    int ws = 0, waited = 0;
    while (waitpid(pid, &ws, timeout_ms ? WNOHANG : 0) == 0) {
        waited += 20;
        if (waited > timeout_ms)
            kill(pid, SIGKILL);
        harness_sleep_ms(20);
    }
    return WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
}

double harness_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static uint64_t du_bytes;

static int du_one(const char *p, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)p;
    (void)ftw;
    if (flag != FTW_NS)   /* a file removed during the walk */
        du_bytes += (uint64_t)st->st_blocks * 512;
    return 0;
}

static uint64_t du_once(const char *dir)
{
    du_bytes = 0;
    CHECK(nftw(dir, du_one, 16, FTW_PHYS) == 0, "cannot walk %s", dir);
    return du_bytes;
}

uint64_t harness_du(const char *dir)
{
    uint64_t now = du_once(dir), before;

    /* A node that starts a log segment allocates the new one's room
     * before it cuts the old one's: read once the size holds still. */
    for (int i = 0; i < 100; i++) {
        usleep(100 * 1000);
        before = now;
        if ((now = du_once(dir)) == before)
            break;
    }
    return now;
}

int harness_log_count(const char *path, const char *needle)
{
    FILE *f = fopen(path, "r");
    char line[2048];
    int n = 0;
    while (f && fgets(line, sizeof line, f))
        n += strstr(line, needle) != NULL;
    if (f)
        fclose(f);
    return n;
}

void proc_spawn(struct node_proc *p, const char *log, const char *const *argv)
{
    int pfd[2];
    char buf[1024];
    size_t got = 0;

    memset(p, 0, sizeof *p);
    snprintf(p->log, sizeof p->log, "%s", log);
    CHECK(pipe(pfd) == 0, "pipe");
    pid_t pid = fork();
    CHECK(pid >= 0, "fork");
    if (pid == 0) {
        int lfd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        dup2(pfd[1], 1);
        if (lfd >= 0)
            dup2(lfd, 2);
        close(pfd[0]);
        close(pfd[1]);
        execv(argv[0], (char **)argv);
        _exit(127);
    }
    close(pfd[1]);
    live_add(pid);
    /* Lines up to the "listening on" one (a metrics line may come first). */
    while (got < sizeof buf - 1) {
        ssize_t r = read(pfd[0], buf + got, sizeof buf - 1 - got);
        if (r <= 0)
            break;
        got += (size_t)r;
        buf[got] = 0;
        char *l = strstr(buf, "listening on ");
        if (l && strchr(l, '\n'))
            break;
    }
    close(pfd[0]);
    buf[got] = 0;
    char *m = strstr(buf, " metrics on ");
    if (m) {
        m += strlen(" metrics on ");
        snprintf(p->maddr, sizeof p->maddr, "%.*s", (int)strcspn(m, " \n"), m);
    }
    char *s = strstr(buf, "listening on ");
    CHECK(s != NULL, "%s did not start (see %s): \"%s\"", argv[0], log, buf);
    s += strlen("listening on ");
    s[strcspn(s, "\n")] = 0;
    char *health = strstr(s, " health ");
    if (health) {
        *health = 0;
        snprintf(p->haddr, sizeof p->haddr, "%s", health + strlen(" health "));
        char *hcolon = strrchr(p->haddr, ':');
        p->hport = hcolon ? atoi(hcolon + 1) : 0;
    }
    char *internal = strstr(s, " internal ");
    if (internal) {
        *internal = 0;
        snprintf(p->iaddr, sizeof p->iaddr, "%s", internal + strlen(" internal "));
        char *icolon = strrchr(p->iaddr, ':');
        p->iport = icolon ? atoi(icolon + 1) : 0;
    }
    snprintf(p->addr, sizeof p->addr, "%s", s);
    char *colon = strrchr(p->addr, ':');
    p->port = colon ? atoi(colon + 1) : 0;
    p->pid = pid;
    p->ch = rpc_channel_create(p->addr, 0);
    CHECK(p->ch != NULL, "channel");
    if (p->iaddr[0])
        CHECK((p->ich = rpc_channel_create(p->iaddr, 0)), "channel");
}

int harness_scrape(const char *addr, const char *name, const char *key,
                   const char *const *values, int n, double *out)
{
    char cmd[4096];
    int len = snprintf(cmd, sizeof cmd, "/usr/bin/python3 '%s/scrape.py' '%s' '%s'",
                       HARNESS_SRC_DIR, addr, name);
    for (int i = 0; i < n && len > 0 && (size_t)len < sizeof cmd; i++)
        len += snprintf(cmd + len, sizeof cmd - (size_t)len, key ? " '%s=%s'" : " '%s%s'",
                        key ? key : "", values[i]);
    CHECK(len > 0 && (size_t)len < sizeof cmd, "scrape command too long");
    FILE *p = popen(cmd, "r");
    CHECK(p, "cannot run %s", cmd);
    char line[128];
    int got = 0;
    while (got < n && fgets(line, sizeof line, p))
        out[got++] = strtod(line, NULL);
    int rc = pclose(p);
    for (; got < n; got++)
        out[got] = NAN;
    return rc == 0 ? 0 : -1;
}

void node_start(struct node_proc *np, const char *dir, const char *const *extra)
{
    const char *argv[64];
    char log[sizeof np->log];
    int a = 0;

    snprintf(log, sizeof log, "%s.log", dir);
    argv[a++] = harness_node_bin;
    argv[a++] = "--listen";
    argv[a++] = "127.0.0.1:0";
    argv[a++] = "--data-dir";
    argv[a++] = dir;
    for (int i = 0; extra && extra[i] && a < 62; i++)
        argv[a++] = extra[i];
    argv[a] = NULL;
    proc_spawn(np, log, argv);
    snprintf(np->dir, sizeof np->dir, "%s", dir);
}

void router_start(struct node_proc *p, const char *log, const char *topo,
                  const char *const *extra)
{
    const char *argv[64] = {harness_router_bin, "--listen", "127.0.0.1:0", "--topology",
                            topo};
    int a = 5;
    for (int i = 0; extra && extra[i]; i++) {
        CHECK(a < 63, "too many router flags");
        argv[a++] = extra[i];
    }
    argv[a] = NULL;
    proc_spawn(p, log, argv);
}

int node_stop(struct node_proc *np, int sig)
{
    int status = 0;
    if (np->ch) {
        rpc_channel_destroy(np->ch);
        np->ch = NULL;
    }
    if (np->ich) {
        rpc_channel_destroy(np->ich);
        np->ich = NULL;
    }
    if (np->pid <= 0)
        return -1;
    kill(np->pid, sig);
    CHECK(waitpid(np->pid, &status, 0) == np->pid, "waitpid");
    live_remove(np->pid);
    np->pid = 0;
    if (WIFEXITED(status))
        return WEXITSTATUS(status);
    return 128 + WTERMSIG(status);
}

int node_health(struct node_proc *np, const char *service)
{
    Grpc__Health__V1__HealthCheckRequest rq = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    Grpc__Health__V1__HealthCheckResponse *resp = NULL;
    struct rpc_status st;
    rq.service = (char *)service;
    if (rpc_call(np->ch, "/grpc.health.v1.Health/Check", &rq.base,
                 &grpc__health__v1__health_check_response__descriptor,
                 (ProtobufCMessage **)&resp, 2000, &st) < 0)
        return -(int)st.code;
    int s = resp->status;
    grpc__health__v1__health_check_response__free_unpacked(resp, NULL);
    return s;
}

bool node_wait_health(struct node_proc *np, bool serving, int timeout_ms)
{
    struct timespec ts = {0, 20 * 1000 * 1000};
    for (int waited = 0; waited < timeout_ms; waited += 20) {
        int h = node_health(np, "");
        if (h == (serving ? 1 : 2))
            return true;
        nanosleep(&ts, NULL);
    }
    return false;
}

/* ---- keys ---- */

char **keys_make(const char *prefix, size_t from, size_t n)
{
    size_t len = strlen(prefix) + 24;
    char **k = calloc(n ? n : 1, sizeof *k);
    CHECK(k, "out of memory");
    for (size_t i = 0; i < n; i++) {
        k[i] = malloc(len);
        CHECK(k[i], "out of memory");
        snprintf(k[i], len, "%s-%zu", prefix, from + i);
    }
    return k;
}

void keys_free(char **k, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(k[i]);
    free(k);
}

void keys_call(struct rpc_channel *ch, const char *method, const char *filter,
               char **keys, size_t n, size_t batch, bool *out)
{
    struct rpc_status st;
    bool *own = out ? NULL : calloc(batch, sizeof *own);
    for (size_t b = 0; b < n; b += batch) {
        size_t m = n - b < batch ? n - b : batch;
        CHECK(t_keys(ch, method, filter, keys + b, m, out ? out + b : own, &st) == 0,
              "%s %s (keys %zu..%zu): %s: %s", method, filter, b, b + m - 1,
              rpc_status_name(st.code), st.message);
    }
    free(own);
}

size_t keys_present(struct rpc_channel *ch, const char *filter, char **keys,
                    size_t n, bool *present)
{
    bool *out = present ? present : calloc(n ? n : 1, sizeof *out);
    size_t c = 0;
    keys_call(ch, "MayContain", filter, keys, n, 5000, out);
    for (size_t i = 0; i < n; i++)
        c += out[i];
    if (!present)
        free(out);
    return c;
}

int t_create(struct rpc_channel *ch, const char *name, uint64_t cap, double p,
             int kind, struct rpc_status *st)
{
    return t_create_sharded(ch, name, cap, p, kind, 0, NULL, st);
}

int t_create_sharded(struct rpc_channel *ch, const char *name, uint64_t cap,
                     double p, int kind, uint32_t shards,
                     Bloomgrid__V1__FilterInfo **out, struct rpc_status *st)
{
    Bloomgrid__V1__CreateFilterRequest rq = BLOOMGRID__V1__CREATE_FILTER_REQUEST__INIT;
    Bloomgrid__V1__FilterInfo *fi = NULL;
    rq.name = (char *)name;
    rq.capacity = cap;
    rq.error_rate = p;
    rq.kind = kind;
    rq.shards = shards;
    if (rpc_call(ch, "/bloomgrid.v1.BloomGrid/CreateFilter", &rq.base,
                 &bloomgrid__v1__filter_info__descriptor, (ProtobufCMessage **)&fi,
                 TIMEOUT_MS, st) < 0)
        return st->code;
    if (out)
        *out = fi;
    else
        bloomgrid__v1__filter_info__free_unpacked(fi, NULL);
    return 0;
}

int t_drop(struct rpc_channel *ch, const char *name, struct rpc_status *st)
{
    Bloomgrid__V1__DropFilterRequest rq = BLOOMGRID__V1__DROP_FILTER_REQUEST__INIT;
    ProtobufCMessage *resp = NULL;
    rq.name = (char *)name;
    if (rpc_call(ch, "/bloomgrid.v1.BloomGrid/DropFilter", &rq.base,
                 &bloomgrid__v1__drop_filter_response__descriptor, &resp,
                 TIMEOUT_MS, st) < 0)
        return st->code;
    protobuf_c_message_free_unpacked(resp, NULL);
    return 0;
}

int t_get(struct rpc_channel *ch, const char *name,
          Bloomgrid__V1__FilterInfo **out, struct rpc_status *st)
{
    Bloomgrid__V1__GetFilterRequest rq = BLOOMGRID__V1__GET_FILTER_REQUEST__INIT;
    rq.name = (char *)name;
    *out = NULL;
    if (rpc_call(ch, "/bloomgrid.v1.BloomGrid/GetFilter", &rq.base,
                 &bloomgrid__v1__filter_info__descriptor, (ProtobufCMessage **)out,
                 TIMEOUT_MS, st) < 0)
        return st->code;
    return 0;
}

/* keys[0, n) as the bytes fields of a request (the keys stay the caller's). */
static ProtobufCBinaryData *keys_wire(char **keys, size_t n)
{
    ProtobufCBinaryData *kd = calloc(n ? n : 1, sizeof *kd);
    CHECK(kd, "out of memory");
    for (size_t i = 0; i < n; i++) {
        kd[i].data = (uint8_t *)keys[i];
        kd[i].len = strlen(keys[i]);
    }
    return kd;
}

int t_keys(struct rpc_channel *ch, const char *method, const char *filter,
           char **keys, size_t n, bool *out, struct rpc_status *st)
{
    /* AddRequest, MayContainRequest and RemoveRequest share one layout. */
    Bloomgrid__V1__AddRequest rq = BLOOMGRID__V1__ADD_REQUEST__INIT;
    ProtobufCBinaryData *kd = keys_wire(keys, n);
    char path[128];
    rq.filter = (char *)filter;
    rq.n_keys = n;
    rq.keys = kd;
    snprintf(path, sizeof path, "/bloomgrid.v1.BloomGrid/%s", method);
    Bloomgrid__V1__AddResponse *resp = NULL;
    int rc = rpc_call(ch, path, &rq.base, &bloomgrid__v1__add_response__descriptor,
                      (ProtobufCMessage **)&resp, TIMEOUT_MS, st);
    free(kd);
    if (rc < 0)
        return st->code;
    CHECK(resp->n_added == n, "%s: %zu answers for %zu keys", method,
          resp->n_added, n);
    for (size_t i = 0; i < n; i++)
        out[i] = resp->added[i];
    bloomgrid__v1__add_response__free_unpacked(resp, NULL);
    return 0;
}

int t_hashes(struct rpc_channel *ch, const char *method, const char *filter,
             unsigned shard, const uint8_t *hashes, size_t n, bool check_shard,
             bool *out, struct rpc_status *st)
{
    Bloomgrid__V1__HashesRequest rq = BLOOMGRID__V1__HASHES_REQUEST__INIT;
    Bloomgrid__V1__HashesResponse *r = NULL;
    char path[128];
    rq.filter = (char *)filter;
    rq.shard_index = shard;
    rq.hashes.data = (uint8_t *)hashes;
    rq.hashes.len = 16 * n;
    rq.check_shard = check_shard;
    snprintf(path, sizeof path, "/bloomgrid.v1.Internal/%s", method);
    if (rpc_call(ch, path, &rq.base, &bloomgrid__v1__hashes_response__descriptor,
                 (ProtobufCMessage **)&r, TIMEOUT_MS, st) < 0)
        return st->code;
    CHECK(r->n_results == n, "%s: %zu answers for %zu hashes", method, r->n_results, n);
    for (size_t i = 0; i < n; i++)
        out[i] = r->results[i];
    bloomgrid__v1__hashes_response__free_unpacked(r, NULL);
    return 0;
}

int t_stream_keys(struct rpc_channel *ch, const char *method, const char *filter,
                  char **keys, size_t n, size_t nb, bool *out, struct rpc_status *st)
{
    char path[128];
    snprintf(path, sizeof path, "/bloomgrid.v1.BloomGrid/%s", method);
    struct rpc_cstream *cs = rpc_cstream_open(ch, path, TIMEOUT_MS);
    CHECK(cs, "open %s", method);
    for (size_t b = 0; b < nb; b++) {
        Bloomgrid__V1__AddRequest rq = BLOOMGRID__V1__ADD_REQUEST__INIT;
        ProtobufCBinaryData *kd = keys_wire(keys + b * n, n);
        rq.filter = b == 0 ? (char *)filter : "";
        rq.n_keys = n;
        rq.keys = kd;
        CHECK(rpc_cstream_write_msg(cs, &rq.base) == 0, "stream write %zu", b);
        free(kd);
    }
    rpc_cstream_close_send(cs);
    grpc_slice sl;
    size_t b = 0;
    while (rpc_cstream_read(cs, &sl) == 1) {
        Bloomgrid__V1__AddResponse *resp = bloomgrid__v1__add_response__unpack(
            NULL, GRPC_SLICE_LENGTH(sl), GRPC_SLICE_START_PTR(sl));
        CHECK(resp && resp->n_added == n && b < nb, "stream answer %zu", b);
        for (size_t i = 0; i < n; i++)
            out[b * n + i] = resp->added[i];
        b++;
        bloomgrid__v1__add_response__free_unpacked(resp, NULL);
        grpc_slice_unref(sl);
    }
    if (rpc_cstream_finish(cs, st) < 0)
        return st->code;
    CHECK(b == nb, "%zu answers for %zu messages", b, nb);
    return 0;
}

size_t t_export(struct rpc_channel *ch, const char *name, uint8_t **out,
                struct rpc_status *st)
{
    return t_export_ms(ch, name, out, TIMEOUT_MS, st);
}

size_t t_export_ms(struct rpc_channel *ch, const char *name, uint8_t **out,
                   int timeout_ms, struct rpc_status *st)
{
    Bloomgrid__V1__ExportRequest rq = BLOOMGRID__V1__EXPORT_REQUEST__INIT;
    rq.filter = (char *)name;
    rq.chunk_size = 100000;
    struct rpc_cstream *cs = rpc_cstream_open(ch, "/bloomgrid.v1.BloomGrid/Export",
                                              timeout_ms);
    CHECK(cs, "open Export");
    CHECK(rpc_cstream_write_msg(cs, &rq.base) == 0 && rpc_cstream_close_send(cs) == 0,
          "send ExportRequest");
    size_t len = 0, cap = 0;
    uint64_t total = 0;
    uint8_t *buf = NULL;
    grpc_slice sl;
    while (rpc_cstream_read(cs, &sl) == 1) {
        Bloomgrid__V1__FileChunk *fc = bloomgrid__v1__file_chunk__unpack(
            NULL, GRPC_SLICE_LENGTH(sl), GRPC_SLICE_START_PTR(sl));
        CHECK(fc && fc->offset == len, "chunk at %zu", len);
        if (len + fc->data.len > cap) {
            cap = cap ? cap : 1u << 20;
            while (cap < len + fc->data.len)
                cap *= 2;
            buf = realloc(buf, cap);
            CHECK(buf, "out of memory");
        }
        memcpy(buf + len, fc->data.data, fc->data.len);
        len += fc->data.len;
        /* 0: not known yet (a router says it on the last chunk). */
        CHECK(!fc->total_size || !total || fc->total_size == total, "total_size changed");
        if (fc->total_size)
            total = fc->total_size;
        CHECK(!total || total >= len, "total_size %" PRIu64 " < %zu", total, len);
        bloomgrid__v1__file_chunk__free_unpacked(fc, NULL);
        grpc_slice_unref(sl);
    }
    if (rpc_cstream_finish(cs, st) < 0) {
        free(buf);
        return 0;
    }
    CHECK(total == len, "Export OK after %zu bytes of %" PRIu64, len, total);
    *out = buf;
    return len;
}

int t_import(struct rpc_channel *ch, const char *name, const uint8_t *buf,
             size_t len, uint32_t *shards, struct rpc_status *st)
{
    return t_import_ms(ch, name, buf, len, shards, TIMEOUT_MS, st);
}

struct rpc_cstream *t_import_send(struct rpc_channel *ch, const char *name, bool shard,
                                  uint32_t index, const uint8_t *buf, size_t len,
                                  size_t msg, int timeout_ms)
{
    struct rpc_cstream *cs = rpc_cstream_open(
        ch, shard ? "/bloomgrid.v1.Internal/ImportShard" : "/bloomgrid.v1.BloomGrid/Import",
        timeout_ms);
    CHECK(cs, "open Import");
    for (size_t off = 0; off < len; off += msg) {
        /* ImportRequest is ImportShardRequest without shard_index. */
        Bloomgrid__V1__ImportShardRequest rq = BLOOMGRID__V1__IMPORT_SHARD_REQUEST__INIT;
        rq.filter = off == 0 ? (char *)name : "";
        rq.shard_index = shard ? index : 0;
        rq.data.data = (uint8_t *)buf + off;
        rq.data.len = len - off < msg ? len - off : msg;
        if (rpc_cstream_write_msg(cs, &rq.base) < 0)
            break;   /* refused early: the status says why */
    }
    return cs;
}

int t_import_answer(struct rpc_cstream *cs, size_t want, uint32_t *shards,
                    struct rpc_status *st)
{
    grpc_slice sl;
    if (shards)
        *shards = 0;
    while (rpc_cstream_read(cs, &sl) == 1) {
        Bloomgrid__V1__ImportResponse *ir = bloomgrid__v1__import_response__unpack(
            NULL, GRPC_SLICE_LENGTH(sl), GRPC_SLICE_START_PTR(sl));
        CHECK(ir && ir->bytes_received == want && ir->info,
              "ImportResponse: %zu bytes received of %zu",
              ir ? (size_t)ir->bytes_received : 0, want);
        if (shards)
            *shards = ir->info->shards;
        bloomgrid__v1__import_response__free_unpacked(ir, NULL);
        grpc_slice_unref(sl);
    }
    return rpc_cstream_finish(cs, st) < 0 ? (int)st->code : 0;
}

int t_import_ms(struct rpc_channel *ch, const char *name, const uint8_t *buf,
                size_t len, uint32_t *shards, int timeout_ms, struct rpc_status *st)
{
    struct rpc_cstream *cs = t_import_send(ch, name, false, 0, buf, len, 65536,
                                           timeout_ms);
    rpc_cstream_close_send(cs);
    return t_import_answer(cs, len, shards, st);
}

int t_create_shard(struct rpc_channel *ch, const char *filter, uint32_t index,
                   uint32_t count, uint64_t cap, double p, const uint8_t *secret,
                   struct rpc_status *st)
{
    Bloomgrid__V1__CreateShardRequest rq = BLOOMGRID__V1__CREATE_SHARD_REQUEST__INIT;
    Bloomgrid__V1__InternalShardInfo *isi = NULL;
    rq.filter = (char *)filter;
    rq.shard_index = index;
    rq.shard_count = count;
    rq.capacity = cap;
    rq.error_rate = p;
    rq.new_filter = true;
    if (secret) {
        rq.secret.data = (uint8_t *)secret;
        rq.secret.len = 32;
    }
    int rc = rpc_call(ch, "/bloomgrid.v1.Internal/CreateShard", &rq.base,
                      &bloomgrid__v1__internal_shard_info__descriptor,
                      (ProtobufCMessage **)&isi, TIMEOUT_MS, st);
    if (isi)
        bloomgrid__v1__internal_shard_info__free_unpacked(isi, NULL);
    return rc < 0 ? (int)st->code : 0;
}

int t_shard_count(struct rpc_channel *ch, const char *filter)
{
    Bloomgrid__V1__ListShardsRequest rq = BLOOMGRID__V1__LIST_SHARDS_REQUEST__INIT;
    Bloomgrid__V1__ListShardsResponse *resp = NULL;
    struct rpc_status st;
    CHECK(rpc_call(ch, "/bloomgrid.v1.Internal/ListShards", &rq.base,
                   &bloomgrid__v1__list_shards_response__descriptor,
                   (ProtobufCMessage **)&resp, TIMEOUT_MS, &st) == 0,
          "ListShards: %s", st.message);
    int n = 0;
    for (size_t i = 0; i < resp->n_shards; i++)
        n += strcmp(resp->shards[i]->filter, filter) == 0;
    bloomgrid__v1__list_shards_response__free_unpacked(resp, NULL);
    return n;
}

bool t_wait_shard_states(struct rpc_channel *ch, const char *filter, uint32_t shards,
                         int want, int timeout_ms)
{
    for (int t = 0; t < timeout_ms / 100; t++) {
        bool all = true;
        for (uint32_t s = 0; s < shards && all; s++)
            all = t_shard_state(ch, filter, s) == want;
        if (all)
            return true;
        harness_sleep_ms(100);
    }
    return false;
}

int t_shard_state(struct rpc_channel *ch, const char *filter, uint32_t s)
{
    Bloomgrid__V1__GetShardRequest q = BLOOMGRID__V1__GET_SHARD_REQUEST__INIT;
    Bloomgrid__V1__InternalShardInfo *isi = NULL;
    struct rpc_status st;
    q.filter = (char *)filter;
    q.shard_index = s;
    if (rpc_call(ch, "/bloomgrid.v1.Internal/GetShard", &q.base,
                 &bloomgrid__v1__internal_shard_info__descriptor,
                 (ProtobufCMessage **)&isi, TIMEOUT_MS, &st) != 0)
        return -1;
    int state = isi->info ? (int)isi->info->state : -1;
    bloomgrid__v1__internal_shard_info__free_unpacked(isi, NULL);
    return state;
}

bool t_never_no(struct rpc_channel *ch, const char *filter, char **k, size_t n,
                const char *when)
{
    bool *out = calloc(n ? n : 1, sizeof *out);
    struct rpc_status st;
    CHECK(out, "out of memory");
    int code = t_keys(ch, "MayContain", filter, k, n, out, &st);
    CHECK(code == 0 || code == GRPC_STATUS_UNAVAILABLE, "%s: %d %s", when, code,
          st.message);
    for (size_t i = 0; code == 0 && i < n; i++)
        CHECK(out[i], "%s: acknowledged key %s reads \"no\"", when, k[i]);
    free(out);
    return code == 0;
}

void t_node_info(struct rpc_channel *ch, struct node_info *out)
{
    Bloomgrid__V1__NodeInfoRequest rq = BLOOMGRID__V1__NODE_INFO_REQUEST__INIT;
    Bloomgrid__V1__NodeInfoResponse *resp = NULL;
    struct rpc_status st;
    CHECK(rpc_call(ch, "/bloomgrid.v1.Internal/NodeInfo", &rq.base,
                   &bloomgrid__v1__node_info_response__descriptor,
                   (ProtobufCMessage **)&resp, TIMEOUT_MS, &st) == 0,
          "NodeInfo: %s", st.message);
    out->messages = resp->batch_messages;
    out->entries = resp->batch_entries;
    out->hashes = resp->batch_hashes;
    out->streams = resp->batch_streams;
    out->read_streams = resp->read_streams;
    out->write_streams = resp->write_streams;
    out->mixed_streams = resp->mixed_streams;
    out->max_memory_bytes = resp->max_memory_bytes;
    out->charged_bytes = resp->charged_bytes;
    out->max_filters = resp->max_filters;
    out->filters = resp->filters;
    bloomgrid__v1__node_info_response__free_unpacked(resp, NULL);
}

static char *preload_saved_asan;
static bool preload_had_asan;

void harness_preload_begin(const char *lib)
{
    const char *ao = getenv("ASAN_OPTIONS");
    char asan[512];

    preload_had_asan = ao != NULL;
    preload_saved_asan = ao ? strdup(ao) : NULL;
    snprintf(asan, sizeof asan, "%s%sverify_asan_link_order=0", ao ? ao : "",
             ao && ao[0] ? ":" : "");
    setenv("ASAN_OPTIONS", asan, 1);
    setenv("LD_PRELOAD", lib, 1);
}

void harness_preload_end(void)
{
    unsetenv("LD_PRELOAD");
    if (preload_had_asan)
        setenv("ASAN_OPTIONS", preload_saved_asan, 1);
    else
        unsetenv("ASAN_OPTIONS");
    free(preload_saved_asan);
    preload_saved_asan = NULL;
}

void harness_fsync_gate(const char *gate, const char *match, char *held, size_t heldlen)
{
    snprintf(held, heldlen, "%s.held", gate);
    unlink(gate);
    unlink(held);
    setenv("SLOW_FSYNC_GATE", gate, 1);
    setenv("SLOW_FSYNC_MATCH", match, 1);
}
