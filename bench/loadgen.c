/* loadgen: load generator for bloomgrid-node, side by side with redis-server.
 *
 * Starts (or connects to) one node and one redis-server on loopback and runs,
 * for a bounded time each, the same workloads against both with several
 * client threads:
 *   single   one key per call (unary gRPC call / one BITFIELD round trip);
 *   batch    --batch keys per call (one gRPC message / a pipeline of
 *            --batch BITFIELD commands written at once);
 *   stream   gRPC only: AddStream / MayContainStream with --window batches
 *            in flight per stream.
 * for MayContain and Add.  Redis runs the equivalent Bloom filter by hand:
 * the client hashes each key (XXH3-128, double hashing) into k bit offsets of
 * one bitmap, BITFIELD SET for add and BITFIELD_RO GET for query.  The node
 * runs with durability fsync unless --durability none: its adds are on disk
 * when acknowledged, redis (no persistence) keeps them in memory only.
 *
 * Prints one Markdown table: keys/s, calls/s and latency percentiles per call.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <grpc/grpc.h>
#include <xxhash.h>

#include "bloomgrid/v1/bloomgrid.pb-c.h"
#include "rpc_client.h"

#define KEYLEN 16

struct opts {
    const char *node_addr, *node_bin, *redis_bin, *redis_addr, *durability;
    double duration;
    int threads, batch, window;
    uint64_t capacity;
    double error_rate;
    bool no_redis;
    const char *only;            /* run only workloads whose name has this */
    const char *node_threads;    /* --threads of the started node */
};

static struct opts o = {
    .node_bin = "./node/bloomgrid-node",
    .redis_bin = "redis-server",
    .durability = "fsync",
    .duration = 3.0,
    .threads = 4,
    .batch = 1000,
    .window = 4,
    .capacity = 10000000,
    .error_rate = 0.01,
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "loadgen: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(1);
}

/* ---- latencies ---- */

struct lat {
    uint64_t *v;
    size_t n, cap;
};

static void lat_add(struct lat *l, uint64_t ns)
{
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 4096;
        l->v = realloc(l->v, l->cap * sizeof *l->v);
    }
    l->v[l->n++] = ns;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static double pct(const struct lat *l, double q)
{
    if (!l->n)
        return 0;
    size_t i = (size_t)(q * (double)(l->n - 1));
    return (double)l->v[i] / 1000.0;
}

/* ---- keys ---- */

/* Key i of thread t: 16 bytes, unique per (run, thread, i). */
static void make_key(uint8_t *k, unsigned run, unsigned t, uint64_t i)
{
    /* Binary and cheap: the client shares the machine with the server, so
     * its own cost per key must stay small. */
    k[0] = 'k';
    k[1] = (uint8_t)run;
    k[2] = (uint8_t)t;
    k[3] = (uint8_t)(run >> 8);
    memcpy(k + 4, &i, 8);
    memcpy(k + 12, "bgrd", 4);
}

/* ---- gRPC request encoding (AddRequest / MayContainRequest layout) ---- */

static size_t put_varint(uint8_t *p, uint64_t v)
{
    size_t n = 0;
    while (v >= 0x80) {
        p[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    p[n++] = (uint8_t)v;
    return n;
}

/* Encode a batch of n keys starting at index i; returns the length. */
static size_t encode_batch(uint8_t *buf, const char *filter, unsigned run, unsigned t,
                           uint64_t i, size_t n)
{
    size_t len = 0, fl = strlen(filter);
    buf[len++] = 0x0a;
    len += put_varint(buf + len, fl);
    memcpy(buf + len, filter, fl);
    len += fl;
    for (size_t j = 0; j < n; j++) {
        buf[len++] = 0x12;
        buf[len++] = KEYLEN;
        make_key(buf + len, run, t, i + j);
        len += KEYLEN;
    }
    return len;
}

/* Count the answers of a reply (packed bools in field 1). */
static size_t count_answers(const uint8_t *p, size_t len)
{
    if (len < 2 || p[0] != 0x0a)
        return 0;
    uint64_t v = 0;
    int shift = 0;
    size_t i = 1;
    while (i < len) {
        v |= (uint64_t)(p[i] & 0x7f) << shift;
        if (!(p[i++] & 0x80))
            break;
        shift += 7;
    }
    return (size_t)v;
}

/* ---- workloads ---- */

enum sys { SYS_NODE, SYS_REDIS };
enum mode { M_SINGLE, M_BATCH, M_STREAM };

struct run {
    enum sys sys;
    enum mode mode;
    bool add;
    int batch;
    int threads;                 /* client threads of this run */
    unsigned id;                 /* keeps keys unique between runs */
    struct rpc_channel *ch;
    struct sockaddr_in redis;
    uint64_t m;                  /* redis bitmap bits */
    uint32_t k;
    uint64_t deadline;
    atomic_bool failed;
};

struct worker {
    struct run *r;
    unsigned t;
    uint64_t keys, calls;
    struct lat lat;
    pthread_t thr;
};

static void node_unary(struct worker *w)
{
    struct run *r = w->r;
    const char *method = r->add ? "/bloomgrid.v1.BloomGrid/Add"
                                : "/bloomgrid.v1.BloomGrid/MayContain";
    uint8_t *buf = malloc((size_t)r->batch * (KEYLEN + 2) + 64);
    uint64_t i = 0;
    while (now_ns() < r->deadline) {
        size_t len = encode_batch(buf, "bench", r->id, w->t, i, (size_t)r->batch);
        grpc_slice resp;
        struct rpc_status st;
        uint64_t t0 = now_ns();
        if (rpc_call_raw(r->ch, method, buf, len, &resp, 10000, &st) < 0) {
            fprintf(stderr, "loadgen: %s: %s %s\n", method, rpc_status_name(st.code),
                    st.message);
            atomic_store(&r->failed, true);
            break;
        }
        lat_add(&w->lat, now_ns() - t0);
        if (count_answers(GRPC_SLICE_START_PTR(resp), GRPC_SLICE_LENGTH(resp)) !=
            (size_t)r->batch) {
            fprintf(stderr, "loadgen: wrong number of answers\n");
            atomic_store(&r->failed, true);
        }
        grpc_slice_unref(resp);
        i += (uint64_t)r->batch;
        w->keys += (uint64_t)r->batch;
        w->calls++;
    }
    free(buf);
}

/* A stream with up to --window batches in flight: this thread writes, a
 * helper thread reads; send times go through a ring for the latencies. */
struct stream_ctx {
    struct worker *w;
    struct rpc_cstream *s;
    uint64_t *sent;              /* ring of send times */
    atomic_ulong written, read;
    atomic_bool done;
};

static void *stream_reader(void *p)
{
    struct stream_ctx *c = p;
    struct worker *w = c->w;
    for (;;) {
        grpc_slice sl;
        int rc = rpc_cstream_read(c->s, &sl);
        if (rc <= 0)
            break;
        unsigned long n = atomic_load(&c->read);
        lat_add(&w->lat, now_ns() - c->sent[n % (unsigned long)o.window]);
        if (count_answers(GRPC_SLICE_START_PTR(sl), GRPC_SLICE_LENGTH(sl)) !=
            (size_t)w->r->batch)
            atomic_store(&w->r->failed, true);
        grpc_slice_unref(sl);
        w->keys += (uint64_t)w->r->batch;
        w->calls++;
        atomic_store(&c->read, n + 1);
    }
    return NULL;
}

static void node_stream(struct worker *w)
{
    struct run *r = w->r;
    struct stream_ctx c = {.w = w};
    const char *method = r->add ? "/bloomgrid.v1.BloomGrid/AddStream"
                                : "/bloomgrid.v1.BloomGrid/MayContainStream";
    c.s = rpc_cstream_open(r->ch, method, (int)(o.duration * 1000) + 30000);
    if (!c.s) {
        atomic_store(&r->failed, true);
        return;
    }
    c.sent = calloc((size_t)o.window, sizeof *c.sent);
    uint8_t *buf = malloc((size_t)r->batch * (KEYLEN + 2) + 64);
    pthread_t rd;
    pthread_create(&rd, NULL, stream_reader, &c);
    uint64_t i = 0;
    struct timespec tiny = {0, 20000};
    while (now_ns() < r->deadline) {
        unsigned long wr = atomic_load(&c.written);
        if (wr - atomic_load(&c.read) >= (unsigned long)o.window) {
            nanosleep(&tiny, NULL);
            continue;
        }
        size_t len = encode_batch(buf, wr == 0 ? "bench" : "", r->id, w->t, i,
                                  (size_t)r->batch);
        c.sent[wr % (unsigned long)o.window] = now_ns();
        if (rpc_cstream_write(c.s, buf, len) < 0) {
            atomic_store(&r->failed, true);
            break;
        }
        atomic_store(&c.written, wr + 1);
        i += (uint64_t)r->batch;
    }
    rpc_cstream_close_send(c.s);
    pthread_join(rd, NULL);
    struct rpc_status st;
    if (rpc_cstream_finish(c.s, &st) < 0) {
        fprintf(stderr, "loadgen: %s: %s %s\n", method, rpc_status_name(st.code),
                st.message);
        atomic_store(&r->failed, true);
    }
    free(buf);
    free(c.sent);
}

/* ---- redis ---- */

static int redis_connect(const struct sockaddr_in *a)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    if (fd < 0 || connect(fd, (const struct sockaddr *)a, sizeof *a) < 0)
        return -1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

static bool write_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w <= 0)
            return false;
        p += w;
        n -= (size_t)w;
    }
    return true;
}

/* Reads `replies` RESP arrays of integers; returns false on error. */
struct rbuf {
    char *p;
    size_t len, pos, cap;
};

static int rbuf_getc(int fd, struct rbuf *b)
{
    if (b->pos == b->len) {
        ssize_t n = read(fd, b->p, b->cap);
        if (n <= 0)
            return -1;
        b->len = (size_t)n;
        b->pos = 0;
    }
    return (unsigned char)b->p[b->pos++];
}

/* One line (without CRLF) into line; returns its length or -1. */
static int rbuf_line(int fd, struct rbuf *b, char *line, int max)
{
    int n = 0, c;
    while ((c = rbuf_getc(fd, b)) >= 0) {
        if (c == '\r')
            continue;
        if (c == '\n') {
            line[n] = 0;
            return n;
        }
        if (n < max - 1)
            line[n++] = (char)c;
    }
    return -1;
}

static bool redis_read_replies(int fd, struct rbuf *b, int replies, uint32_t k)
{
    char line[128];
    for (int r = 0; r < replies; r++) {
        if (rbuf_line(fd, b, line, sizeof line) < 0 || line[0] != '*' ||
            (uint32_t)atoi(line + 1) != k) {
            fprintf(stderr, "loadgen: redis reply \"%s\"\n", line);
            return false;
        }
        for (uint32_t j = 0; j < k; j++)
            if (rbuf_line(fd, b, line, sizeof line) < 0 || line[0] != ':')
                return false;
    }
    return true;
}

/* Append BITFIELD(_RO) for one key. */
static size_t redis_cmd(char *out, const struct run *r, const uint8_t *key)
{
    XXH128_hash_t h = XXH3_128bits(key, KEYLEN);
    uint64_t h1 = h.low64, h2 = h.high64 | 1;
    size_t len = 0;
    char num[32];
    uint32_t argc = 2 + 3 * r->k + (r->add ? r->k : 0);
    len += (size_t)sprintf(out + len, "*%u\r\n", argc);
    if (r->add)
        len += (size_t)sprintf(out + len, "$8\r\nBITFIELD\r\n$2\r\nbf\r\n");
    else
        len += (size_t)sprintf(out + len, "$11\r\nBITFIELD_RO\r\n$2\r\nbf\r\n");
    for (uint32_t j = 0; j < r->k; j++) {
        uint64_t off = (h1 + j * h2) % r->m;
        int nl = sprintf(num, "%llu", (unsigned long long)off);
        if (r->add)
            len += (size_t)sprintf(out + len, "$3\r\nSET\r\n$2\r\nu1\r\n$%d\r\n%s\r\n$1\r\n1\r\n",
                                   nl, num);
        else
            len += (size_t)sprintf(out + len, "$3\r\nGET\r\n$2\r\nu1\r\n$%d\r\n%s\r\n", nl,
                                   num);
    }
    return len;
}

static void redis_work(struct worker *w)
{
    struct run *r = w->r;
    int fd = redis_connect(&r->redis);
    if (fd < 0) {
        atomic_store(&r->failed, true);
        return;
    }
    size_t per = 64 + 60 * r->k;
    char *buf = malloc(per * (size_t)r->batch);
    struct rbuf rb = {.cap = 1 << 16};
    rb.p = malloc(rb.cap);
    uint8_t key[KEYLEN];
    uint64_t i = 0;
    while (now_ns() < r->deadline) {
        size_t len = 0;
        for (int j = 0; j < r->batch; j++) {
            make_key(key, r->id, w->t, i + (uint64_t)j);
            len += redis_cmd(buf + len, r, key);
        }
        uint64_t t0 = now_ns();
        if (!write_all(fd, buf, len) || !redis_read_replies(fd, &rb, r->batch, r->k)) {
            atomic_store(&r->failed, true);
            break;
        }
        lat_add(&w->lat, now_ns() - t0);
        i += (uint64_t)r->batch;
        w->keys += (uint64_t)r->batch;
        w->calls++;
    }
    close(fd);
    free(buf);
    free(rb.p);
}

static void *worker_main(void *p)
{
    struct worker *w = p;
    if (w->r->sys == SYS_REDIS)
        redis_work(w);
    else if (w->r->mode == M_STREAM)
        node_stream(w);
    else
        node_unary(w);
    return NULL;
}

static void run_one(struct run *r, const char *sysname)
{
    static unsigned next_id = 1;
    struct worker *ws = calloc((size_t)r->threads, sizeof *ws);
    r->id = next_id++;
    atomic_store(&r->failed, false);
    uint64_t t0 = now_ns();
    r->deadline = t0 + (uint64_t)(o.duration * 1e9);
    for (int t = 0; t < r->threads; t++) {
        ws[t].r = r;
        ws[t].t = (unsigned)t;
        pthread_create(&ws[t].thr, NULL, worker_main, &ws[t]);
    }
    struct lat all = {0};
    uint64_t keys = 0, calls = 0;
    for (int t = 0; t < r->threads; t++) {
        pthread_join(ws[t].thr, NULL);
        keys += ws[t].keys;
        calls += ws[t].calls;
        for (size_t i = 0; i < ws[t].lat.n; i++)
            lat_add(&all, ws[t].lat.v[i]);
        free(ws[t].lat.v);
    }
    double secs = (double)(now_ns() - t0) / 1e9;
    qsort(all.v, all.n, sizeof *all.v, cmp_u64);
    static const char *const modes[] = {"single", "batch", "stream"};
    char work[64];
    snprintf(work, sizeof work, "%s %s", r->add ? "Add" : "MayContain", modes[r->mode]);
    printf("| %-6s | %-18s | %7d | %5d | %12.0f | %9.0f | %8.1f | %8.1f | %8.1f |%s\n",
           sysname, work, r->threads, r->batch, (double)keys / secs, (double)calls / secs,
           pct(&all, 0.5), pct(&all, 0.99), pct(&all, 0.999),
           atomic_load(&r->failed) ? " FAILED" : "");
    fflush(stdout);
    free(all.v);
    free(ws);
}

/* ---- processes ---- */

static pid_t node_pid, redis_pid;
static char tmpdir[256];

static void start_node(char *addr, size_t len)
{
    int pfd[2];
    char data[300], logp[300];
    snprintf(tmpdir, sizeof tmpdir, "/tmp/loadgen-XXXXXX");
    if (!mkdtemp(tmpdir))
        die("mkdtemp: %s", strerror(errno));
    snprintf(data, sizeof data, "%s/data", tmpdir);
    snprintf(logp, sizeof logp, "%s/node.log", tmpdir);
    if (pipe(pfd) < 0)
        die("pipe");
    node_pid = fork();
    if (node_pid == 0) {
        int lfd = open(logp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(pfd[1], 1);
        dup2(lfd, 2);
        close(pfd[0]);
        execl(o.node_bin, o.node_bin, "--listen", "127.0.0.1:0", "--data-dir", data,
              "--durability", o.durability, "--log-level", "warn", "--threads",
              o.node_threads ? o.node_threads : "8", (char *)NULL);
        _exit(127);
    }
    close(pfd[1]);
    char buf[256];
    ssize_t n = read(pfd[0], buf, sizeof buf - 1);
    close(pfd[0]);
    if (n <= 0)
        die("%s did not start (log %s)", o.node_bin, logp);
    buf[n] = 0;
    char *p = strstr(buf, "listening on ");
    if (!p)
        die("unexpected node output: %s", buf);
    p += 13;
    p[strcspn(p, "\r\n")] = 0;
    snprintf(addr, len, "%s", p);
}

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    bind(fd, (struct sockaddr *)&a, sizeof a);
    getsockname(fd, (struct sockaddr *)&a, &al);
    close(fd);
    return ntohs(a.sin_port);
}

static void start_redis(struct sockaddr_in *a)
{
    int port = free_port();
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    redis_pid = fork();
    if (redis_pid == 0) {
        int nul = open("/dev/null", O_WRONLY);
        dup2(nul, 1);
        execlp(o.redis_bin, o.redis_bin, "--port", ps, "--bind", "127.0.0.1", "--save",
               "", "--appendonly", "no", "--daemonize", "no", (char *)NULL);
        _exit(127);
    }
    memset(a, 0, sizeof *a);
    a->sin_family = AF_INET;
    a->sin_port = htons((uint16_t)port);
    a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    for (int i = 0; i < 200; i++) {
        int fd = redis_connect(a);
        if (fd >= 0) {
            close(fd);
            return;
        }
        usleep(20000);
    }
    die("redis-server did not start on port %d", port);
}

static void stop_children(void)
{
    if (node_pid > 0) {
        kill(node_pid, SIGTERM);
        waitpid(node_pid, NULL, 0);
    }
    if (redis_pid > 0) {
        kill(redis_pid, SIGTERM);
        waitpid(redis_pid, NULL, 0);
    }
    if (tmpdir[0]) {
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
        if (system(cmd) != 0)
            fprintf(stderr, "loadgen: could not remove %s\n", tmpdir);
    }
}

static void usage(void)
{
    printf("usage: loadgen [options]\n"
           "  --node ADDR         use a running node (default: start --node-bin)\n"
           "  --node-bin PATH     bloomgrid-node to start [%s]\n"
           "  --durability MODE   fsync|none for the started node [%s]\n"
           "  --redis ADDR        use a running redis (host must be 127.0.0.1)\n"
           "  --redis-bin PATH    redis-server to start [%s]\n"
           "  --no-redis          skip the redis side\n"
           "  --duration SECONDS  per workload [%.1f]\n"
           "  --threads N         client threads (connections, streams) [%d]\n"
           "  --batch N           keys per batched call [%d]\n"
           "  --window N          batches in flight per stream [%d]\n"
           "  --capacity N        filter capacity [%llu]\n"
           "  --node-threads N    RPC worker threads of the started node [8]\n"
           "  --only TEXT         run only workloads whose name contains TEXT\n"
           "                      (e.g. \"MayContain batch\")\n",
           o.node_bin, o.durability, o.redis_bin, o.duration, o.threads, o.batch,
           o.window, (unsigned long long)o.capacity);
}

int main(int argc, char **argv)
{
    static const struct option lo[] = {
        {"node", 1, 0, 'n'},     {"node-bin", 1, 0, 'b'}, {"durability", 1, 0, 'd'},
        {"redis", 1, 0, 'r'},    {"redis-bin", 1, 0, 'R'}, {"no-redis", 0, 0, 'N'},
        {"duration", 1, 0, 't'}, {"threads", 1, 0, 'T'}, {"batch", 1, 0, 'B'},
        {"window", 1, 0, 'w'},   {"capacity", 1, 0, 'c'}, {"help", 0, 0, 'h'},
        {"only", 1, 0, 'o'},     {"node-threads", 1, 0, 'W'},
        {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (c) {
        case 'n': o.node_addr = optarg; break;
        case 'b': o.node_bin = optarg; break;
        case 'd': o.durability = optarg; break;
        case 'r': o.redis_addr = optarg; break;
        case 'R': o.redis_bin = optarg; break;
        case 'N': o.no_redis = true; break;
        case 't': o.duration = atof(optarg); break;
        case 'T': o.threads = atoi(optarg); break;
        case 'B': o.batch = atoi(optarg); break;
        case 'w': o.window = atoi(optarg); break;
        case 'c': o.capacity = strtoull(optarg, NULL, 10); break;
        case 'o': o.only = optarg; break;
        case 'W': o.node_threads = optarg; break;
        case 'h': usage(); return 0;
        default: usage(); return 2;
        }
    }
    if (o.threads < 1 || o.batch < 1 || o.window < 1 || o.duration <= 0 || o.duration > 600)
        die("bad options (see --help)");
    signal(SIGPIPE, SIG_IGN);
    atexit(stop_children);
    grpc_init();

    char addr[128];
    if (o.node_addr)
        snprintf(addr, sizeof addr, "%s", o.node_addr);
    else
        start_node(addr, sizeof addr);
    struct run r = {0};
    r.ch = rpc_channel_create(addr, 0);

    /* A fresh filter (wait for the node to be ready). */
    Bloomgrid__V1__DropFilterRequest drq = BLOOMGRID__V1__DROP_FILTER_REQUEST__INIT;
    Bloomgrid__V1__CreateFilterRequest crq = BLOOMGRID__V1__CREATE_FILTER_REQUEST__INIT;
    struct rpc_status st;
    ProtobufCMessage *resp = NULL;
    drq.name = crq.name = "bench";
    crq.capacity = o.capacity;
    crq.error_rate = o.error_rate;
    int rc = -1;
    for (int i = 0; i < 250 && rc < 0; i++) {
        rc = rpc_call(r.ch, "/bloomgrid.v1.BloomGrid/DropFilter", &drq.base,
                      &bloomgrid__v1__drop_filter_response__descriptor, &resp, 5000, &st);
        if (rc == 0)
            protobuf_c_message_free_unpacked(resp, NULL);
        if (rc < 0 && st.code == GRPC_STATUS_UNAVAILABLE) {
            usleep(20000);
            continue;
        }
        rc = rpc_call(r.ch, "/bloomgrid.v1.BloomGrid/CreateFilter", &crq.base,
                      &bloomgrid__v1__filter_info__descriptor, &resp, 5000, &st);
        if (rc == 0)
            protobuf_c_message_free_unpacked(resp, NULL);
        else
            die("CreateFilter: %s %s", rpc_status_name(st.code), st.message);
    }
    if (rc < 0)
        die("node at %s not ready: %s", addr, st.message);

    struct sockaddr_in redis = {0};
    if (!o.no_redis) {
        if (o.redis_addr) {
            const char *colon = strrchr(o.redis_addr, ':');
            redis.sin_family = AF_INET;
            redis.sin_port = htons((uint16_t)atoi(colon ? colon + 1 : "6379"));
            redis.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        } else {
            start_redis(&redis);
        }
    }
    /* Redis bitmap sized like a classic filter for (capacity, p). */
    double ln2 = log(2.0);
    uint64_t m = (uint64_t)ceil(-(double)o.capacity * log(o.error_rate) / (ln2 * ln2));
    uint32_t k = (uint32_t)lround((double)m / (double)o.capacity * ln2);

    printf("node %s (durability %s), %d client threads (unless 1), %.1f s per workload, "
           "%d keys per batch, stream window %d, %u-byte keys\n",
           addr, o.durability, o.threads, o.duration, o.batch, o.window, KEYLEN);
    /* Other work on the machine moves every figure: say how busy it was. */
    FILE *la = fopen("/proc/loadavg", "r");
    double l1 = 0;
    if (la && fscanf(la, "%lf", &l1) == 1)
        printf("load average at start %.2f on %ld CPUs\n", l1, sysconf(_SC_NPROCESSORS_ONLN));
    if (la)
        fclose(la);
    printf("\n");
    printf("| system | workload           | threads | keys/call | keys/s | calls/s | p50 µs | p99 µs | p999 µs |\n");
    printf("|---|---|---:|---:|---:|---:|---:|---:|---:|\n");
    /* Single keys run twice: one client thread (latency without queueing)
     * and --threads (throughput). */
    struct {
        enum mode mode;
        bool add;
        bool one_thread;
    } plan[] = {{M_SINGLE, false, true}, {M_SINGLE, false, false},
                {M_SINGLE, true, true},  {M_SINGLE, true, false},
                {M_BATCH, true, false},  {M_BATCH, false, false},
                {M_STREAM, true, false}, {M_STREAM, false, false}};
    static const char *const mode_names[] = {"single", "batch", "stream"};
    for (size_t i = 0; i < sizeof plan / sizeof plan[0]; i++) {
        char name[64];
        snprintf(name, sizeof name, "%s %s", plan[i].add ? "Add" : "MayContain",
                 mode_names[plan[i].mode]);
        if (o.only && !strstr(name, o.only))
            continue;
        r.sys = SYS_NODE;
        r.mode = plan[i].mode;
        r.add = plan[i].add;
        r.batch = r.mode == M_SINGLE ? 1 : o.batch;
        r.threads = plan[i].one_thread ? 1 : o.threads;
        run_one(&r, "node");
        if (!o.no_redis && r.mode != M_STREAM) {
            struct run rr = r;
            rr.sys = SYS_REDIS;
            rr.redis = redis;
            rr.m = m;
            rr.k = k;
            run_one(&rr, "redis");
        }
    }
    rpc_channel_destroy(r.ch);
    grpc_shutdown();
    return 0;
}
