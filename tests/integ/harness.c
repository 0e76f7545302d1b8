/* harness: node processes and RPC wrappers for integration tests. */
#include "harness.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "grpc/health/v1/health.pb-c.h"

const char *harness_node_bin = "bloomgrid-node";

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

void proc_spawn(struct node_proc *p, const char *log, const char *const *argv)
{
    int pfd[2];
    char buf[256];
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
    while (got < sizeof buf - 1) {
        ssize_t r = read(pfd[0], buf + got, sizeof buf - 1 - got);
        if (r <= 0)
            break;
        got += (size_t)r;
        buf[got] = 0;
        if (strchr(buf, '\n'))
            break;
    }
    close(pfd[0]);
    buf[got] = 0;
    char *s = strstr(buf, "listening on ");
    CHECK(s != NULL, "%s did not start (see %s): \"%s\"", argv[0], log, buf);
    s += strlen("listening on ");
    s[strcspn(s, "\n")] = 0;
    snprintf(p->addr, sizeof p->addr, "%s", s);
    char *colon = strrchr(p->addr, ':');
    p->port = colon ? atoi(colon + 1) : 0;
    p->pid = pid;
    p->ch = rpc_channel_create(p->addr, 0);
    CHECK(p->ch != NULL, "channel");
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

int node_stop(struct node_proc *np, int sig)
{
    int status = 0;
    if (np->ch) {
        rpc_channel_destroy(np->ch);
        np->ch = NULL;
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

int t_create(struct rpc_channel *ch, const char *name, uint64_t cap, double p,
             int kind, struct rpc_status *st)
{
    Bloomgrid__V1__CreateFilterRequest rq = BLOOMGRID__V1__CREATE_FILTER_REQUEST__INIT;
    Bloomgrid__V1__FilterInfo *fi = NULL;
    rq.name = (char *)name;
    rq.capacity = cap;
    rq.error_rate = p;
    rq.kind = kind;
    if (rpc_call(ch, "/bloomgrid.v1.BloomGrid/CreateFilter", &rq.base,
                 &bloomgrid__v1__filter_info__descriptor, (ProtobufCMessage **)&fi,
                 TIMEOUT_MS, st) < 0)
        return st->code;
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

int t_keys(struct rpc_channel *ch, const char *method, const char *filter,
           char **keys, size_t n, bool *out, struct rpc_status *st)
{
    /* AddRequest, MayContainRequest and RemoveRequest share one layout. */
    Bloomgrid__V1__AddRequest rq = BLOOMGRID__V1__ADD_REQUEST__INIT;
    ProtobufCBinaryData *kd = calloc(n ? n : 1, sizeof *kd);
    char path[128];
    rq.filter = (char *)filter;
    rq.n_keys = n;
    rq.keys = kd;
    for (size_t i = 0; i < n; i++) {
        kd[i].data = (uint8_t *)keys[i];
        kd[i].len = strlen(keys[i]);
    }
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
