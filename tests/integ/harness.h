/* harness: start and stop real bloomgrid processes for integration tests,
 * make keys, and small typed wrappers
 * around the RPCs the tests call.
 *
 * A node or router is started with --listen 127.0.0.1:0 (a free port, read
 * back from the "listening on" line it prints); its stderr goes to a log
 * file.  Processes still running when a test exits are killed.  Test
 * failures print file:line and exit 1 (CHECK): the functions that say "dies"
 * fail the test that way.  Single-threaded use, except keys_* and the t_*
 * wrappers, which any thread may call on a channel of its own or a shared
 * one.  tests/integ/cluster.h builds clusters of nodes and routers on this.
 */
#ifndef BLOOMGRID_TEST_HARNESS_H
#define BLOOMGRID_TEST_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "bloomgrid/v1/bloomgrid.pb-c.h"
#include "bloomgrid/v1/internal.pb-c.h"
#include "rpc_client.h"

#define CHECK(cond, ...)                                                      \
    do {                                                                      \
        if (!(cond)) {                                                        \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__,  \
                    #cond);                                                   \
            fprintf(stderr, __VA_ARGS__);                                     \
            fprintf(stderr, "\n");                                            \
            exit(1);                                                          \
        }                                                                     \
    } while (0)

#define TIMEOUT_MS 10000

/* The binaries node_start and router_start run (set by each test's main). */
extern const char *harness_node_bin;
extern const char *harness_router_bin;

struct node_proc {
    pid_t pid;
    int port;
    char addr[64];
    char dir[512];
    char log[600];
    struct rpc_channel *ch;
    /* A node with internal_listen: that listener's address and a channel to
     * it (iaddr "", iport 0 and ich NULL otherwise). */
    int iport;
    char iaddr[64];
    struct rpc_channel *ich;
    /* A process with health_listen: that listener's address ("" without). */
    int hport;
    char haddr[64];
    /* A process with metrics_listen: its "PROG metrics on HOST:PORT" ("" without). */
    char maddr[64];
};

/* ---- time and files ---- */

/* A fresh temporary directory (under $BLOOMGRID_TEST_TMP or /tmp). */
void harness_tmpdir(char *out, size_t len, const char *tag);
void harness_sleep_ms(int ms);
/* A line "name: N kB" of /proc/pid/status (VmRSS, VmHWM, ...), in bytes;
 * dies when it cannot be read. */
uint64_t harness_status_bytes(pid_t pid, const char *name);
/* Stop process pid with SIGSTOP and wait (up to 5 s) until every one of its
 * threads is stopped, so that it answers nothing from then on (the signal
 * takes effect in each thread when it next runs).  0, or -1. */
int harness_sigstop(pid_t pid);

/* Run argv (argv[0] the program's path) to its end, with stdout appended
 * to out and stderr to err (NULL: /dev/null; the same path: one file), and
 * env (name, value pairs, NULL-terminated, or NULL) added to its
 * environment.  A process still running after timeout_ms (0: no bound) is
 * killed.  Returns its exit status, 128 + the signal when killed. */
int harness_run(const char *const *argv, const char *out, const char *err,
                const char *const *env, int timeout_ms);
/* Monotonic seconds, for the timings tests print (never for assertions). */
double harness_now_s(void);
/* Bytes the files under dir take on disk (allocated blocks, as du), once
 * that holds still for 100 ms (a node starting a log segment allocates its
 * room before it cuts the old one's). */
uint64_t harness_du(const char *dir);
/* Lines of the file at path that contain needle (0 when it cannot be read).
 * Only for what a process reports nowhere but its log: say why where used. */
int harness_log_count(const char *path, const char *needle);

/* Scrape http://addr/metrics with tests/integ/scrape.py (prometheus_client's
 * parser) and put in out[i] the value of sample name with label key =
 * values[i] (NAN when not served), for n values.  With key NULL, values[i]
 * is a whole selector, "LABEL=VALUE[,LABEL=VALUE...]" ("filter=f,shard=3"),
 * or "" for the first sample of name.  Returns 0, or -1 when the endpoint
 * does not answer. */
int harness_scrape(const char *addr, const char *name, const char *key,
                   const char *const *values, int n, double *out);

/* ---- processes ---- */

/* Start argv[0] with stdout read until its "listening on HOST:PORT" line
 * (a "metrics on HOST:PORT" line before it fills maddr)
 * (a node's may go on with " internal HOST:PORT", any process's with
 * " health HOST:PORT") and stderr appended to
 * log; fills p (addresses, ports, pid, channels, with the process-wide
 * client TLS of rpc_channel_create).  The process is killed at exit if a
 * test fails before stopping it.  Dies on failure. */
void proc_spawn(struct node_proc *p, const char *log, const char *const *argv);

/* Start a node on dir (log <dir>.log) with extra flags (NULL-terminated,
 * may be NULL).  Opens np->ch.  Dies on failure. */
void node_start(struct node_proc *np, const char *dir, const char *const *extra);
/* Start a router on topo, logging to log, with extra flags (NULL-terminated,
 * may be NULL).  Dies on failure. */
void router_start(struct node_proc *p, const char *log, const char *topo,
                  const char *const *extra);
/* Close p's channels, send sig and wait; returns the exit status (or
 * 128+signal), -1 when p is not running.  p keeps its addresses and ports. */
int node_stop(struct node_proc *np, int sig);
/* Wait until health "" answers want (true: SERVING); false on timeout. */
bool node_wait_health(struct node_proc *np, bool serving, int timeout_ms);
/* The health status: 1 SERVING, 2 NOT_SERVING, negative: -grpc code. */
int node_health(struct node_proc *np, const char *service);

/* ---- keys ---- */

/* Keys "PREFIX-N" for N in [from, from + n); free with keys_free. */
char **keys_make(const char *prefix, size_t from, size_t n);
void keys_free(char **k, size_t n);
/* Call method (Add, MayContain, Remove) on filter for keys[0, n) in calls
 * of at most batch keys; answers in out[n] (may be NULL).  Dies naming the
 * status when a call fails. */
void keys_call(struct rpc_channel *ch, const char *method, const char *filter,
               char **keys, size_t n, size_t batch, bool *out);
/* How many of keys[0, n) filter may contain (MayContain in batches of
 * 5000); the answers go to present[n] (may be NULL).  Dies on failure. */
size_t keys_present(struct rpc_channel *ch, const char *filter, char **keys,
                    size_t n, bool *present);

/* ---- RPC wrappers: return 0 or the grpc status code; st gets the message ---- */

int t_create(struct rpc_channel *ch, const char *name, uint64_t cap, double p,
             int kind, struct rpc_status *st);
/* CreateFilter with a shard count (0: the server's default); on success the
 * answer goes to *out when out is not NULL (caller frees with
 * bloomgrid__v1__filter_info__free_unpacked). */
int t_create_sharded(struct rpc_channel *ch, const char *name, uint64_t cap,
                     double p, int kind, uint32_t shards,
                     Bloomgrid__V1__FilterInfo **out, struct rpc_status *st);
int t_drop(struct rpc_channel *ch, const char *name, struct rpc_status *st);
/* Info: caller frees with bloomgrid__v1__filter_info__free_unpacked. */
int t_get(struct rpc_channel *ch, const char *name,
          Bloomgrid__V1__FilterInfo **out, struct rpc_status *st);
/* Internal AddHashes / MayContainHashes / RemoveHashes of n hashes (16
 * bytes each) on shard `shard` of filter (check_shard: refuse hashes of
 * another shard); out[i] answers. */
int t_hashes(struct rpc_channel *ch, const char *method, const char *filter,
             unsigned shard, const uint8_t *hashes, size_t n, bool check_shard,
             bool *out, struct rpc_status *st);
/* Add / MayContain / Remove: keys[i] NUL-terminated; out[i] answers. */
int t_keys(struct rpc_channel *ch, const char *method, const char *filter,
           char **keys, size_t n, bool *out, struct rpc_status *st);
/* A bidirectional key stream (AddStream, MayContainStream): nb messages of n
 * keys each, keys[b * n + i] (the first names the filter, later ones leave
 * it empty), all sent before any answer is read; answers in out[nb * n]. */
int t_stream_keys(struct rpc_channel *ch, const char *method, const char *filter,
                  char **keys, size_t n, size_t nb, bool *out, struct rpc_status *st);
/* Export name in chunks of 100 000 bytes, checking each chunk's offset and
 * total_size (0: not known yet, as a router's Export says until its last
 * chunk; once said, never changing) and, on OK, that the bytes received are
 * the size said; returns the bundle's length (*out: malloc'd, caller
 * frees), 0 on failure (st says why). */
size_t t_export(struct rpc_channel *ch, const char *name, uint8_t **out,
                struct rpc_status *st);
/* t_export within timeout_ms (large filters on a busy machine). */
size_t t_export_ms(struct rpc_channel *ch, const char *name, uint8_t **out,
                   int timeout_ms, struct rpc_status *st);
/* Import buf[0, len) into name in messages of 64 KiB.  On success the answer
 * must count len bytes received and carry the filter's info; its shard count
 * goes to *shards (may be NULL). */
int t_import(struct rpc_channel *ch, const char *name, const uint8_t *buf,
             size_t len, uint32_t *shards, struct rpc_status *st);
/* t_import within timeout_ms. */
int t_import_ms(struct rpc_channel *ch, const char *name, const uint8_t *buf,
                size_t len, uint32_t *shards, int timeout_ms, struct rpc_status *st);
/* The parts of an Import, for a test that stops half-way: open the call
 * (public Import, or with shard internal ImportShard of shard index) and
 * send buf[0, len) in messages of msg bytes, the first naming name; the
 * sending stops early when the call was refused.  Then (after
 * rpc_cstream_close_send) t_import_answer reads the answer (checked: want
 * bytes received, the filter's info; its shard count to *shards, may be
 * NULL) and finishes the call: 0 or the status code. */
struct rpc_cstream *t_import_send(struct rpc_channel *ch, const char *name, bool shard,
                                  uint32_t index, const uint8_t *buf, size_t len,
                                  size_t msg, int timeout_ms);
int t_import_answer(struct rpc_cstream *cs, size_t want, uint32_t *shards,
                    struct rpc_status *st);

/* Internal CreateShard of shard index of count of filter (count 1: the
 * store name is the filter's own), blocked, with secret (32 bytes; NULL:
 * the node draws one): filters made with one secret and geometry take
 * each other's files (Import). */
int t_create_shard(struct rpc_channel *ch, const char *filter, uint32_t index,
                   uint32_t count, uint64_t cap, double p, const uint8_t *secret,
                   struct rpc_status *st);

/* Shards of filter the node on ch holds (Internal/ListShards).  Dies on
 * failure. */
int t_shard_count(struct rpc_channel *ch, const char *filter);
/* The state (bloomgrid.v1.FilterState) node ch reports for shard s of
 * filter (Internal/GetShard), -1 when it has no such shard. */
int t_shard_state(struct rpc_channel *ch, const char *filter, uint32_t s);
/* Wait until shards [0, shards) of filter on ch are all in state want;
 * false when they are not within timeout_ms. */
bool t_wait_shard_states(struct rpc_channel *ch, const char *filter, uint32_t shards,
                         int want, int timeout_ms);
/* Read the n keys k of filter through the router on ch: answered with every
 * key "maybe" (dies on a "no", naming when) or UNAVAILABLE (any other
 * answer dies).  Returns whether it was answered. */
bool t_never_no(struct rpc_channel *ch, const char *filter, char **k, size_t n,
                const char *when);
/* What the node on ch counted of the routers' Batches streams
 * (Internal/NodeInfo).  Dies on failure. */
struct node_info {
    uint64_t messages, entries, hashes;
    uint64_t streams, read_streams, write_streams, mixed_streams;
    /* The node's budgets (docs/SECURITY.md, "Budgets"). */
    uint64_t max_memory_bytes, charged_bytes, max_filters, filters;
};
void t_node_info(struct rpc_channel *ch, struct node_info *out);

/* Children started between harness_preload_begin(lib) and
 * harness_preload_end() run with LD_PRELOAD=lib (a sanitized child is told
 * that the library comes ahead of its runtime on purpose). */
void harness_preload_begin(const char *lib);
void harness_preload_end(void);

/* The fsync gate of slow_fsync.c for the children started next: their
 * fsyncs of files whose path holds match wait while the file gate exists,
 * and held (gate + ".held", heldlen bytes at most) exists while one waits.
 * Neither file exists on return. */
void harness_fsync_gate(const char *gate, const char *match, char *held, size_t heldlen);

#endif
