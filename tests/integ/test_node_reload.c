/* Integration tests of bloomgrid-node's settings, with real processes:
 *
 *   reload      SIGHUP re-reads the --config file: a live setting
 *               (max_key_size) takes its new value, flags still override the
 *               file, a setting that needs a restart (listen) is not
 *               applied, a malformed file changes nothing, and calls keep
 *               being answered through the reloads.
 *   bad_listen  --listen 127.0.0.1:99999 is refused at start (exit 2)
 *               instead of binding port 99999 mod 65536.
 *
 * A reload has no answer of its own, so the test waits until the node has
 * taken the SIGHUP and is back waiting for signals (its main thread in
 * rt_sigtimedwait with nothing pending): the reload is then complete.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <grpc/grpc.h>

#include "harness.h"

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    CHECK(f != NULL, "open %s: %s", path, strerror(errno));
    fputs(text, f);
    CHECK(fclose(f) == 0, "write %s", path);
}

/* Is SIGHUP pending for pid, and is its main thread blocked in
 * rt_sigtimedwait?  Returns 1 when the signal was handled and the thread
 * waits again, 0 otherwise; fails the test when the node died. */
static int hup_handled(pid_t pid)
{
    char path[64], line[256];
    unsigned long long pending = ~0ULL;
    FILE *f;

    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    CHECK((f = fopen(path, "r")) != NULL, "%s: %s", path, strerror(errno));
    bool dead = false;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "ShdPnd:", 7) == 0)
            pending = strtoull(line + 7, NULL, 16);
        if (strncmp(line, "State:", 6) == 0 && strchr(line, 'Z'))
            dead = true;
    }
    fclose(f);
    CHECK(!dead, "node %d exited on SIGHUP", (int)pid);
    if (pending & (1ULL << (SIGHUP - 1)))
        return 0;
    /* Read after the pending mask: blocked now means the hook ran. */
    snprintf(path, sizeof path, "/proc/%d/task/%d/syscall", (int)pid, (int)pid);
    if ((f = fopen(path, "r")) != NULL) {
        long nr = -1;
        int ok = fscanf(f, "%ld", &nr) == 1 && nr == SYS_rt_sigtimedwait;
        fclose(f);
        return ok;
    }
    snprintf(path, sizeof path, "/proc/%d/task/%d/wchan", (int)pid, (int)pid);
    CHECK((f = fopen(path, "r")) != NULL, "%s: %s", path, strerror(errno));
    int ok = fgets(line, sizeof line, f) && strstr(line, "sigtimedwait");
    fclose(f);
    return ok;
}

static void sighup_and_wait(struct node_proc *np)
{
    CHECK(kill(np->pid, SIGHUP) == 0, "kill: %s", strerror(errno));
    for (int i = 0; i < TIMEOUT_MS / 5; i++) {
        if (hup_handled(np->pid))
            return;
        sleep_ms(5);
    }
    CHECK(0, "node %d did not finish its reload", (int)np->pid);
}

/* Add one key of len bytes; returns the status code, msg gets the text. */
static int add_key_of(struct node_proc *np, size_t len, struct rpc_status *st)
{
    char *key = malloc(len + 1);
    bool out;
    memset(key, 'k', len);
    key[len] = 0;
    int rc = t_keys(np->ch, "Add", "f", &key, 1, &out, st);
    free(key);
    return rc;
}

/* A key of len bytes must be refused naming the limit in force. */
static void expect_key_limit(struct node_proc *np, size_t len, unsigned limit,
                             const char *when)
{
    struct rpc_status st;
    char want[64];
    snprintf(want, sizeof want, "the limit is %u (max_key_size)", limit);
    CHECK(add_key_of(np, len, &st) == GRPC_STATUS_INVALID_ARGUMENT,
          "a %zu-byte key %s: code %d %s", len, when, st.code, st.message);
    CHECK(strstr(st.message, want) != NULL, "%s: message \"%s\"", when, st.message);
}

static void reload_with(struct node_proc *np, const char *conf, const char *text)
{
    write_file(conf, text);
    sighup_and_wait(np);
}

static int add_batch(struct node_proc *np, size_t n, struct rpc_status *st)
{
    char *keys[16], buf[16][24];
    bool out[16];
    for (size_t i = 0; i < n; i++) {
        snprintf(buf[i], sizeof buf[i], "b%zu", i);
        keys[i] = buf[i];
    }
    return t_keys(np->ch, "Add", "f", keys, n, out, st);
}

/* The node address the filter's shard reports: the listen setting in
 * force. */
static void check_node_address(struct node_proc *np, const char *want)
{
    Bloomgrid__V1__FilterInfo *fi = NULL;
    struct rpc_status st;
    CHECK(t_get(np->ch, "f", &fi, &st) == 0, "GetFilter: %s", st.message);
    CHECK(fi->n_shard_info == 1, "shard info");
    CHECK(strcmp(fi->shard_info[0]->node, want) == 0, "node address \"%s\", want \"%s\"",
          fi->shard_info[0]->node, want);
    bloomgrid__v1__filter_info__free_unpacked(fi, NULL);
}

struct caller {
    struct node_proc *np;
    atomic_bool stop;
    size_t calls, failures;
    char msg[sizeof ((struct rpc_status *)0)->message];
};

/* MayContain calls while the main thread reloads. */
static void *caller_main(void *arg)
{
    struct caller *c = arg;
    char key[] = "k1";
    char *keys[] = {key};
    bool out;
    while (!atomic_load(&c->stop)) {
        struct rpc_status st;
        if (t_keys(c->np->ch, "MayContain", "f", keys, 1, &out, &st) != 0) {
            c->failures++;
            snprintf(c->msg, sizeof c->msg, "%s", st.message);
        }
        c->calls++;
    }
    return NULL;
}

static void test_reload(const char *dir)
{
    char conf[600], data[600], log[700], text[1024];
    struct node_proc np;
    struct rpc_status st;

    snprintf(conf, sizeof conf, "%s/node.ini", dir);
    snprintf(data, sizeof data, "%s/data", dir);
    snprintf(log, sizeof log, "%s/node.log", dir);
    snprintf(text, sizeof text, "[node]\nlisten = 127.0.0.1:0\ndata_dir = %s\n"
             "max_key_size = 200\nmax_batch_keys = 5\n", data);
    write_file(conf, text);
    /* The flag keeps max_batch_keys at 5 whatever the file says later. */
    const char *argv[] = {harness_node_bin, "--config", conf, "--max-batch-keys", "5",
                          NULL};
    proc_spawn(&np, log, argv);
    CHECK(node_wait_health(&np, true, TIMEOUT_MS), "node not SERVING");
    CHECK(t_create(np.ch, "f", 10000, 0.01, 0, &st) == 0, "create: %s", st.message);
    CHECK(add_key_of(&np, 100, &st) == 0, "a 100-byte key under max_key_size 200: %s",
          st.message);

    /* max_key_size is live; listen needs a restart; the file's
     * max_batch_keys loses to the flag. */
    snprintf(text, sizeof text, "[node]\nlisten = 127.0.0.1:1\ndata_dir = %s\n"
             "max_key_size = 50\nmax_batch_keys = 1000\n", data);
    reload_with(&np, conf, text);
    expect_key_limit(&np, 100, 50, "after max_key_size = 50");
    CHECK(kill(np.pid, 0) == 0, "the node died on SIGHUP");
    CHECK(add_key_of(&np, 50, &st) == 0, "a 50-byte key: %s", st.message);
    CHECK(add_batch(&np, 6, &st) == GRPC_STATUS_RESOURCE_EXHAUSTED,
          "6 keys with --max-batch-keys 5: code %d %s", st.code, st.message);
    check_node_address(&np, "127.0.0.1:0");

    /* A malformed file is refused as a whole: its max_key_size is not
     * taken even though it comes before the bad line. */
    snprintf(text, sizeof text, "[node]\ndata_dir = %s\nmax_key_size = 1000\n"
             "threads = lots\n", data);
    reload_with(&np, conf, text);
    expect_key_limit(&np, 100, 50, "after a malformed file");
    reload_with(&np, conf, "not an ini file\n");
    expect_key_limit(&np, 100, 50, "after a file of garbage");

    /* Calls keep being answered while the node reloads. */
    struct caller c = {.np = &np};
    pthread_t th;
    CHECK(pthread_create(&th, NULL, caller_main, &c) == 0, "thread");
    for (int i = 0; i < 20; i++) {
        snprintf(text, sizeof text, "[node]\ndata_dir = %s\nmax_key_size = %d\n", data,
                 i % 2 ? 70 : 60);
        reload_with(&np, conf, text);
    }
    atomic_store(&c.stop, true);
    pthread_join(th, NULL);
    CHECK(c.failures == 0, "%zu of %zu calls failed during reloads: %s", c.failures,
          c.calls, c.msg);
    CHECK(add_key_of(&np, 65, &st) == 0, "a 65-byte key under max_key_size 70: %s",
          st.message);
    expect_key_limit(&np, 71, 70, "after the last reload");
    printf("  %zu calls answered during 20 reloads\n", c.calls);
    CHECK(node_stop(&np, SIGTERM) == 0, "exit status after the reloads");
}

static void test_bad_listen(const char *dir)
{
    char data[600], log[700], out[256] = "";
    struct stat sb;
    int pfd[2];
    size_t got = 0;

    snprintf(data, sizeof data, "%s/data", dir);
    snprintf(log, sizeof log, "%s/node.log", dir);
    CHECK(pipe(pfd) == 0, "pipe");
    pid_t pid = fork();
    CHECK(pid >= 0, "fork");
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(pfd[1], 1);
        if (fd >= 0)
            dup2(fd, 2);
        close(pfd[0]);
        close(pfd[1]);
        execl(harness_node_bin, harness_node_bin, "--listen", "127.0.0.1:99999",
              "--data-dir", data, (char *)NULL);
        _exit(127);
    }
    close(pfd[1]);
    /* A node that listens prints its address; one that refuses exits and
     * closes its stdout. */
    while (got < sizeof out - 1 && !strchr(out, '\n')) {
        ssize_t r = read(pfd[0], out + got, sizeof out - 1 - got);
        if (r <= 0)
            break;
        got += (size_t)r;
        out[got] = 0;
    }
    close(pfd[0]);
    if (strstr(out, "listening on")) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        CHECK(0, "--listen 127.0.0.1:99999 was accepted: %s", out);
    }
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid, "waitpid");
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 2,
          "--listen 127.0.0.1:99999: exit status %d, want 2 (see %s)", status, log);
    CHECK(stat(data, &sb) != 0, "the refused node created its data directory");
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s NODE_BINARY reload|bad_listen\n", argv[0]);
        return 2;
    }
    harness_node_bin = argv[1];
    signal(SIGPIPE, SIG_IGN);
    grpc_init();
    char dir[512];
    harness_tmpdir(dir, sizeof dir, argv[2]);
    if (strcmp(argv[2], "reload") == 0)
        test_reload(dir);
    else if (strcmp(argv[2], "bad_listen") == 0)
        test_bad_listen(dir);
    else
        CHECK(0, "unknown test %s", argv[2]);
    grpc_shutdown();
    printf("%s: ok\n", argv[2]);
    return 0;
}
