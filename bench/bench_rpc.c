/* bench_rpc: what a deferred unary reply costs against an immediate one.
 *
 * One in-process rpc_server on loopback serves three methods with empty
 * answers:
 *   immediate  the handler fills the reply and returns (today's path);
 *   deferred   the handler defers the reply and finishes it itself before
 *              returning (the cost of the mechanism alone);
 *   handoff    the handler defers and hands the handle to a finisher thread
 *              that finishes whatever has queued up, as a commit loop would.
 * Each runs for --seconds with one client thread calling sequentially
 * (calls/s, p50, p99) and with --inflight calls at once (rpc_call_many on
 * one client thread).  The modes take turns for --rounds rounds and each
 * figure is the median of its rounds, so that load from elsewhere on the
 * machine falls on every mode alike.  Beside the rates, the CPU time of the
 * whole process (client and server) per call, which load from other
 * processes disturbs less than wall-clock rates.  Prints one Markdown
 * table; read the rows against each other, not as absolutes.
 */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <grpc/grpc.h>

#include "bloomgrid/v1/bloomgrid.pb-c.h"
#include "rpc_client.h"
#include "rpc_server.h"

#define MAX_ROUNDS 15

static struct {
    double seconds;
    int inflight, threads, rounds;
} o = {1.0, 32, 2, 5};

/* ---- server side ---- */

static void h_immediate(void *arg, const uint8_t *req, size_t len, struct rpc_reply *r)
{
    (void)arg, (void)req, (void)len;
    rpc_reply_alloc(r, 0);
}

static void h_deferred(void *arg, const uint8_t *req, size_t len, struct rpc_reply *r)
{
    (void)arg, (void)req, (void)len;
    struct rpc_deferred *d = rpc_reply_defer(r);
    if (!d)
        return;
    rpc_reply_alloc(rpc_deferred_reply(d), 0);
    rpc_deferred_finish(d);
}

/* The finisher: takes everything queued at once, like a commit loop. */
static struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    struct rpc_deferred **q;
    size_t n, cap;
    bool quit;
} fin = {.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};

static void h_handoff(void *arg, const uint8_t *req, size_t len, struct rpc_reply *r)
{
    (void)arg, (void)req, (void)len;
    struct rpc_deferred *d = rpc_reply_defer(r);
    if (!d)
        return;
    pthread_mutex_lock(&fin.lock);
    if (fin.n == fin.cap) {
        size_t cap = fin.cap ? 2 * fin.cap : 1024;
        struct rpc_deferred **q = realloc(fin.q, cap * sizeof *q);
        if (!q) {
            pthread_mutex_unlock(&fin.lock);
            rpc_reply_error(rpc_deferred_reply(d), GRPC_STATUS_RESOURCE_EXHAUSTED,
                            "out of memory");
            rpc_deferred_finish(d);
            return;
        }
        fin.q = q;
        fin.cap = cap;
    }
    fin.q[fin.n++] = d;
    pthread_cond_signal(&fin.cond);
    pthread_mutex_unlock(&fin.lock);
}

static void *finisher_main(void *p)
{
    struct rpc_deferred **batch = NULL;
    size_t cap = 0;
    (void)p;
    pthread_mutex_lock(&fin.lock);
    for (;;) {
        while (!fin.n && !fin.quit)
            pthread_cond_wait(&fin.cond, &fin.lock);
        if (!fin.n)
            break;
        if (cap < fin.n) {
            cap = fin.cap;
            batch = realloc(batch, cap * sizeof *batch);
            if (!batch)
                abort();
        }
        size_t n = fin.n;
        memcpy(batch, fin.q, n * sizeof *batch);
        fin.n = 0;
        pthread_mutex_unlock(&fin.lock);
        for (size_t i = 0; i < n; i++) {
            rpc_reply_alloc(rpc_deferred_reply(batch[i]), 0);
            rpc_deferred_finish(batch[i]);
        }
        pthread_mutex_lock(&fin.lock);
    }
    pthread_mutex_unlock(&fin.lock);
    free(batch);
    return NULL;
}

/* ---- client side ---- */

static double clock_s(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double now_s(void)
{
    return clock_s(CLOCK_MONOTONIC);
}

static double cpu_s(void)
{
    return clock_s(CLOCK_PROCESS_CPUTIME_ID);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

struct result {
    double seq_rate, p50_us, p99_us, seq_cpu_us;
    double inflight_rate, inflight_cpu_us;
    long failed;
};

static void run(struct rpc_channel *ch, const char *method, struct result *res)
{
    size_t cap = 1 << 20, n = 0;
    double *lat = malloc(cap * sizeof *lat);
    struct rpc_status st;
    grpc_slice out;

    memset(res, 0, sizeof *res);
    if (!lat)
        abort();
    double t0 = now_s(), end = t0 + o.seconds, c0 = cpu_s();
    for (double t = t0; t < end;) {
        double a = now_s();
        if (rpc_call_raw(ch, method, "", 0, &out, 10000, &st) == 0)
            grpc_slice_unref(out);
        else
            res->failed++;
        t = now_s();
        if (n < cap)
            lat[n++] = t - a;
    }
    res->seq_rate = (double)n / (now_s() - t0);
    res->seq_cpu_us = n ? (cpu_s() - c0) * 1e6 / (double)n : 0;
    qsort(lat, n, sizeof *lat, cmp_double);
    res->p50_us = n ? lat[n / 2] * 1e6 : 0;
    res->p99_us = n ? lat[n * 99 / 100] * 1e6 : 0;
    free(lat);

    struct rpc_multi *c = calloc((size_t)o.inflight, sizeof *c);
    if (!c)
        abort();
    long calls = 0;
    t0 = now_s();
    c0 = cpu_s();
    end = t0 + o.seconds;
    while (now_s() < end) {
        for (int i = 0; i < o.inflight; i++) {
            c[i].ch = ch;
            c[i].method = method;
            c[i].req = grpc_empty_slice();
            c[i].timeout_ms = 10000;
        }
        res->failed += (long)rpc_call_many(c, (size_t)o.inflight);
        for (int i = 0; i < o.inflight; i++)
            grpc_slice_unref(c[i].resp);
        calls += o.inflight;
    }
    res->inflight_rate = (double)calls / (now_s() - t0);
    res->inflight_cpu_us = calls ? (cpu_s() - c0) * 1e6 / (double)calls : 0;
    free(c);
}

static void usage(void)
{
    fprintf(stderr, "usage: bench_rpc [--seconds S] [--rounds R] [--inflight N] "
                    "[--threads T]\n"
                    "  --seconds   per mode, pattern and round (default 1)\n"
                    "  --rounds    rounds of every mode, medians reported (default 5, "
                    "max 15)\n"
                    "  --inflight  calls at once in the second pattern (default 32)\n"
                    "  --threads   server worker threads (default 2)\n");
    exit(2);
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"seconds", required_argument, NULL, 's'},
        {"rounds", required_argument, NULL, 'r'},
        {"inflight", required_argument, NULL, 'n'},
        {"threads", required_argument, NULL, 't'},
        {"help", no_argument, NULL, 'h'},
        {0, 0, 0, 0},
    };
    for (int ch; (ch = getopt_long(argc, argv, "s:r:n:t:h", opts, NULL)) != -1;) {
        switch (ch) {
        case 's': o.seconds = atof(optarg); break;
        case 'r': o.rounds = atoi(optarg); break;
        case 'n': o.inflight = atoi(optarg); break;
        case 't': o.threads = atoi(optarg); break;
        default: usage();
        }
    }
    if (o.seconds <= 0 || o.inflight < 1 || o.inflight > 1000 || o.threads < 1 ||
        o.rounds < 1 || o.rounds > MAX_ROUNDS)
        usage();

    rpc_signals_block();
    grpc_init();
    /* Methods of the public service, each with one handler shape. */
    struct rpc_handler h[11];
    memset(h, 0, sizeof h);
    h[3].unary = h_immediate;   /* GetFilter */
    h[1].unary = h_deferred;    /* DropFilter */
    h[2].unary = h_handoff;     /* ListFilters */
    static const struct {
        const char *name, *method;
    } modes[] = {
        {"immediate", "/bloomgrid.v1.BloomGrid/GetFilter"},
        {"deferred", "/bloomgrid.v1.BloomGrid/DropFilter"},
        {"handoff", "/bloomgrid.v1.BloomGrid/ListFilters"},
    };
    struct rpc_server_config c = {.listen = "127.0.0.1:0", .threads = o.threads,
                                  .max_message = 1 << 20, .grace_ms = 1000};
    struct rpc_server *srv = rpc_server_create(&c);
    if (!srv || rpc_server_add_service(srv, &bloomgrid__v1__bloom_grid__descriptor,
                                       h, NULL) < 0) {
        fprintf(stderr, "bench_rpc: cannot create the server\n");
        return 1;
    }
    int port = rpc_server_start(srv);
    if (port <= 0) {
        fprintf(stderr, "bench_rpc: cannot listen on loopback\n");
        return 1;
    }
    pthread_t ft;
    pthread_create(&ft, NULL, finisher_main, NULL);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    struct rpc_channel *ch = rpc_channel_create(addr, 0);

    struct result warm;
    double keep = o.seconds;
    o.seconds = 0.3;
    run(ch, modes[0].method, &warm);
    o.seconds = keep;

    enum { NMODES = sizeof modes / sizeof modes[0] };
    static struct result res[NMODES][MAX_ROUNDS];
    for (int k = 0; k < o.rounds; k++)
        for (int i = 0; i < NMODES; i++)
            run(ch, modes[i].method, &res[i][k]);

    printf("| path | sequential calls/s | p50 µs | p99 µs | CPU µs/call "
           "| %d in flight calls/s | CPU µs/call |\n", o.inflight);
    printf("|---|---:|---:|---:|---:|---:|---:|\n");
    for (int i = 0; i < NMODES; i++) {
        double v[6][MAX_ROUNDS];
        long failed = 0;
        for (int k = 0; k < o.rounds; k++) {
            v[0][k] = res[i][k].seq_rate;
            v[1][k] = res[i][k].p50_us;
            v[2][k] = res[i][k].p99_us;
            v[3][k] = res[i][k].seq_cpu_us;
            v[4][k] = res[i][k].inflight_rate;
            v[5][k] = res[i][k].inflight_cpu_us;
            failed += res[i][k].failed;
        }
        for (int j = 0; j < 6; j++)
            qsort(v[j], (size_t)o.rounds, sizeof v[j][0], cmp_double);
        int mid = o.rounds / 2;
        printf("| %s | %.0f | %.1f | %.1f | %.1f | %.0f | %.1f |%s\n", modes[i].name,
               v[0][mid], v[1][mid], v[2][mid], v[3][mid], v[4][mid], v[5][mid],
               failed ? " (calls failed)" : "");
    }

    rpc_channel_destroy(ch);
    rpc_server_destroy(srv);
    pthread_mutex_lock(&fin.lock);
    fin.quit = true;
    pthread_cond_signal(&fin.cond);
    pthread_mutex_unlock(&fin.lock);
    pthread_join(ft, NULL);
    free(fin.q);
    grpc_shutdown();
    return 0;
}
