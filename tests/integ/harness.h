/* harness: start and stop real bloomgrid-node processes for integration
 * tests, and small typed wrappers around the RPCs they call.
 *
 * A node is started with --listen 127.0.0.1:0 (a free port, read back from
 * the "listening on" line it prints) and its log goes to <dir>.log.  Test
 * failures print file:line and exit 1 (CHECK).
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

extern const char *harness_node_bin;

struct node_proc {
    pid_t pid;
    int port;
    char addr[64];
    char dir[512];
    char log[600];
    struct rpc_channel *ch;
};

/* A fresh temporary directory (under $BLOOMGRID_TEST_TMP or /tmp). */
void harness_tmpdir(char *out, size_t len, const char *tag);

/* Start a node on dir with extra flags (NULL-terminated, may be NULL).
 * Opens np->ch.  Dies on failure. */
/* Start argv[0] with stdout read until its "listening on HOST:PORT" line and
 * stderr appended to log; fills p (address, port, pid, channel).  The process
 * is killed at exit if a test fails before stopping it. */
void proc_spawn(struct node_proc *p, const char *log, const char *const *argv);

void node_start(struct node_proc *np, const char *dir, const char *const *extra);
/* Send sig and wait; returns the exit status (or 128+signal). */
int node_stop(struct node_proc *np, int sig);
/* Wait until health "" answers want (true: SERVING); false on timeout. */
bool node_wait_health(struct node_proc *np, bool serving, int timeout_ms);
/* The health status: 1 SERVING, 2 NOT_SERVING, negative: -grpc code. */
int node_health(struct node_proc *np, const char *service);

/* RPC wrappers: return the grpc status code; st gets the message. */
int t_create(struct rpc_channel *ch, const char *name, uint64_t cap, double p,
             int kind, struct rpc_status *st);
int t_drop(struct rpc_channel *ch, const char *name, struct rpc_status *st);
/* Info: caller frees with bloomgrid__v1__filter_info__free_unpacked. */
int t_get(struct rpc_channel *ch, const char *name,
          Bloomgrid__V1__FilterInfo **out, struct rpc_status *st);
/* Add / MayContain / Remove: keys[i] NUL-terminated; out[i] answers. */
int t_keys(struct rpc_channel *ch, const char *method, const char *filter,
           char **keys, size_t n, bool *out, struct rpc_status *st);

#endif
