/* Tests of resp_server with a backend made here: replies in order whatever
 * order calls finish in, reads that wait for a connection's writes,
 * MULTI/EXEC, AUTH and roles, and the budgets (arguments, connections,
 * pipeline bytes, idle connections), over real sockets on loopback. */
#include <check.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "metrics.h"
#include "resp_server.h"

/* ---- the backend ----
 * filter "sync": answered at once (EXISTS: key "yes" is present).
 * filter "slow": answered by the finisher thread, newest first, once
 *   release is set or 30 ms after the call.
 * filter "hold": answered only when release is set. */
#define QMAX 100000
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct resp_call *queue[QMAX];
static int nq;
static atomic_int calls, adds_started, adds_done, read_before_write;
static atomic_bool release, stop_finisher;
static pthread_t finisher;

static void answer(struct resp_call *c)
{
    for (size_t i = 0; i < c->n; i++)
        c->out[i] = c->op == RESP_BF_ADD ||
                    (c->lens[i] == 3 && memcmp(c->keys[i], "yes", 3) == 0);
    if (c->op == RESP_BF_ADD)
        atomic_fetch_add(&adds_done, 1);
    resp_call_done(c);
}

static void *finisher_main(void *arg)
{
    (void)arg;
    while (!atomic_load(&stop_finisher)) {
        struct timespec ts = {0, 30 * 1000 * 1000};
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&mu);
        int k = nq;
        bool rel = atomic_load(&release);
        static struct resp_call *batch[QMAX];
        int nb = 0;
        for (int i = k - 1; i >= 0; i--)
            if (queue[i]->bval[0] == 1 || rel)
                batch[nb++] = queue[i];
        /* keep the held ones */
        int m = 0;
        for (int i = 0; i < k; i++)
            if (!(queue[i]->bval[0] == 1 || rel))
                queue[m++] = queue[i];
        nq = m;
        pthread_mutex_unlock(&mu);
        for (int i = 0; i < nb; i++)
            answer(batch[i]);
    }
    return NULL;
}

/* filter "pool": run on the pool with a 50 ms bound, answered only once
 * release is set (so the bound answers first); "claimed": the same, but
 * claimed at once, then answered after 100 ms (past the bound). */
static atomic_int pool_ran;

static void pool_work(struct resp_call *c)
{
    bool claimed = strcmp(c->filter, "claimed") == 0;
    if (claimed)
        ck_assert(resp_call_claim(c));
    if (claimed) {
        usleep(100000);
    } else {
        while (!atomic_load(&release))
            usleep(1000);
        /* The bound answered it: the claim fails, the answer is ignored. */
        ck_assert(!resp_call_claim(c));
    }
    for (size_t i = 0; i < c->n; i++)
        c->out[i] = true;
    atomic_fetch_add(&pool_ran, 1);
    resp_call_done(c);
}

/* filter "pass" (with_pass): held by the backend and answered at the end
 * of the loop pass (pass_end), as the node's joined adds are. */
static bool with_pass;
static struct resp_call *passq[64];
static int npass;
static atomic_int pass_ends;

/* with_wait: the wait for the answered (pass_wait_ns returns wait_ns);
 * the size of each group pass_end answered, in order. */
static bool with_wait;
static _Atomic uint64_t wait_ns;
static int groups[64], ngroups;

static uint64_t be_pass_wait(void *arg)
{
    (void)arg;
    return atomic_load(&wait_ns);
}

static void be_pass_end(void *arg)
{
    (void)arg;
    struct resp_call *v[64];
    int n = npass;
    memcpy(v, passq, (size_t)n * sizeof *v);
    npass = 0;
    if (n && ngroups < 64)
        groups[ngroups++] = n;
    if (n)
        atomic_fetch_add(&pass_ends, 1);
    for (int i = 0; i < n; i++)
        answer(v[i]);   /* may resume a connection: more may be held */
}

static bool be_pass_held(void *arg)
{
    (void)arg;
    return npass > 0;
}

static void be_bf(void *arg, struct resp_call *c)
{
    (void)arg;
    if (with_pass && strcmp(c->filter, "pass") == 0 && npass < 64) {
        atomic_fetch_add(&calls, 1);
        if (c->op == RESP_BF_ADD)
            atomic_fetch_add(&adds_started, 1);
        else if (atomic_load(&adds_started) != atomic_load(&adds_done))
            atomic_fetch_add(&read_before_write, 1);
        passq[npass++] = c;
        return;
    }
    if (strcmp(c->filter, "pool") == 0 || strcmp(c->filter, "claimed") == 0) {
        atomic_fetch_add(&calls, 1);
        if (resp_call_offload_bounded(c, pool_work, 50, "the test holds it") < 0) {
            resp_call_fail(c, RESP_RESOURCE_EXHAUSTED, "oom");
            resp_call_done(c);
        }
        return;
    }
    atomic_fetch_add(&calls, 1);
    if (c->op == RESP_BF_ADD)
        atomic_fetch_add(&adds_started, 1);
    else if (c->op == RESP_BF_EXISTS &&
             atomic_load(&adds_started) != atomic_load(&adds_done))
        atomic_fetch_add(&read_before_write, 1);
    if (strcmp(c->filter, "sync") == 0) {
        answer(c);
        return;
    }
    if (strcmp(c->filter, "missing") == 0) {
        resp_call_fail(c, RESP_NOT_FOUND, "filter \"missing\" does not exist");
        resp_call_done(c);
        return;
    }
    if (strcmp(c->filter, "down") == 0) {
        resp_call_fail(c, RESP_UNAVAILABLE, "shard 0: 1 of 2 copies answered");
        resp_call_done(c);
        return;
    }
    if (resp_call_keep(c) < 0) {
        resp_call_fail(c, RESP_RESOURCE_EXHAUSTED, "oom");
        resp_call_done(c);
        return;
    }
    c->bval[0] = strcmp(c->filter, "slow") == 0;
    pthread_mutex_lock(&mu);
    queue[nq++] = c;
    pthread_mutex_unlock(&mu);
}

static int be_auth(void *arg, const char *tok, size_t len, struct resp_who *who)
{
    (void)arg;
    if (len == 4 && memcmp(tok, "rtok", 4) == 0)
        who->role = RESP_ROLE_READ;
    else if (len == 4 && memcmp(tok, "atok", 4) == 0)
        who->role = RESP_ROLE_ADMIN;
    else
        return -EACCES;
    snprintf(who->name, sizeof who->name, "%.4s", tok);
    return 0;
}

static struct resp_server *srv;
static int port;
/* be.answer_in_place for the servers of a test (the "in_place" case runs
 * every test of "core" again with it). */
static bool in_place;

static void set_in_place(void)
{
    in_place = true;
}

static void start_server(bool tokens, unsigned max_conns, size_t pipeline, uint64_t idle)
{
    char err[RESP_SERVER_ERRLEN];
    struct resp_server_config cfg = {
        .listen = "127.0.0.1:0", .prog = "test", .version = "1",
        .max_connections = max_conns, .max_args = 100, .max_bulk = 64,
        .max_command = 4096, .max_key = 32, .pipeline_bytes = pipeline,
        .idle_ms = idle, .autocreate = true, .autocreate_error_rate = 0.01,
        .autocreate_capacity = 100,
    };
    struct resp_backend be = {.bf = be_bf, .reads_wait_writes = true,
                              .auth = tokens ? be_auth : NULL,
                              .answer_in_place = in_place};
    if (with_pass) {
        be.pass_end = be_pass_end;
        be.pass_held = be_pass_held;
        be.pass_drain = 4;
        if (with_wait)
            be.pass_wait_ns = be_pass_wait;
        npass = 0;
        ngroups = 0;
        atomic_store(&pass_ends, 0);
    }
    atomic_store(&release, false);
    atomic_store(&stop_finisher, false);
    atomic_store(&calls, 0);
    atomic_store(&read_before_write, 0);
    atomic_store(&adds_started, 0);
    atomic_store(&adds_done, 0);
    nq = 0;
    pthread_create(&finisher, NULL, finisher_main, NULL);
    srv = resp_server_create(&cfg, &be, err);
    ck_assert_msg(srv, "%s", err);
    port = resp_server_start(srv, err);
    ck_assert_msg(port > 0, "%s", err);
}

static void stop_server(void)
{
    atomic_store(&release, true);
    resp_server_destroy(srv);
    atomic_store(&stop_finisher, true);
    pthread_join(finisher, NULL);
}

static int dial(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    return fd;
}

static void send_all(int fd, const char *s, size_t n)
{
    while (n) {
        ssize_t k = send(fd, s, n, MSG_NOSIGNAL);
        ck_assert(k > 0);
        s += k;
        n -= (size_t)k;
    }
}

/* Read until want arrives (exactly: the bytes read are compared) or the
 * peer closes; 10 s at most. */
static void expect(int fd, const char *want)
{
    size_t n = strlen(want), got = 0;
    char *buf = calloc(1, n + 1);
    while (got < n) {
        struct pollfd p = {fd, POLLIN, 0};
        ck_assert_msg(poll(&p, 1, 10000) == 1, "no reply; have \"%.*s\", want \"%s\"",
                      (int)got, buf, want);
        ssize_t k = recv(fd, buf + got, n - got, 0);
        ck_assert_msg(k > 0, "closed; have \"%.*s\", want \"%s\"", (int)got, buf, want);
        got += (size_t)k;
    }
    ck_assert_msg(memcmp(buf, want, n) == 0, "have \"%s\", want \"%s\"", buf, want);
    free(buf);
}

/* The peer closes (after anything still unread) within 10 s. */
static void expect_closed(int fd)
{
    char buf[4096];
    for (;;) {
        struct pollfd p = {fd, POLLIN, 0};
        ck_assert_msg(poll(&p, 1, 10000) == 1, "the connection stayed open");
        ssize_t k = recv(fd, buf, sizeof buf, 0);
        if (k <= 0)
            return;
    }
}

static const char *cmd(char *buf, const char *w0, const char *w1, const char *w2)
{
    const char *w[3] = {w0, w1, w2};
    int n = w2 ? 3 : w1 ? 2 : 1;
    size_t k = (size_t)sprintf(buf, "*%d\r\n", n);
    for (int i = 0; i < n; i++)
        k += (size_t)sprintf(buf + k, "$%zu\r\n%s\r\n", strlen(w[i]), w[i]);
    return buf;
}

START_TEST(replies_keep_the_order_of_commands)
{
    char b[3][128], all[512];
    start_server(false, 100, 1 << 20, 0);
    int fd = dial();
    /* slow ones finish newest first; sync at once */
    snprintf(all, sizeof all, "%s%s%s%s", cmd(b[0], "BF.ADD", "slow", "a"),
             cmd(b[1], "BF.EXISTS", "sync", "yes"), cmd(b[2], "BF.MADD", "slow", "b"),
             "PING\r\n");
    send_all(fd, all, strlen(all));
    expect(fd, ":1\r\n:1\r\n*1\r\n:1\r\n+PONG\r\n");
    close(fd);
    stop_server();
}
END_TEST

START_TEST(a_read_waits_for_the_connections_writes_to_its_filter)
{
    char b[4][128], all[512];
    start_server(false, 100, 1 << 20, 0);
    int fd = dial();
    snprintf(all, sizeof all, "%s%s%s%s", cmd(b[0], "BF.ADD", "slow", "a"),
             cmd(b[1], "BF.EXISTS", "slow", "a"), cmd(b[2], "BF.ADD", "slow", "b"),
             cmd(b[3], "BF.MEXISTS", "slow", "b"));
    send_all(fd, all, strlen(all));
    expect(fd, ":1\r\n:0\r\n:1\r\n*1\r\n:0\r\n");
    ck_assert_int_eq(atomic_load(&read_before_write), 0);
    ck_assert_int_eq(atomic_load(&calls), 4);
    close(fd);
    stop_server();
}
END_TEST

/* A call held for the pass's end whose answer (given in pass_end) lets its
 * connection dispatch a command that is held too (a read waiting for the
 * connection's write to its filter): the loop calls pass_end again before
 * it sleeps, so both are answered (with one pass_end per pass the read
 * would wait for the next event, here none).  With draining on: draining
 * ends when a poll brings nothing. */
START_TEST(a_call_held_by_the_pass_end_it_resumed_is_answered)
{
    char b[3][128], all[512];
    with_pass = true;
    start_server(false, 100, 1 << 20, 0);
    int fd = dial();
    snprintf(all, sizeof all, "%s%s%s", cmd(b[0], "BF.ADD", "pass", "a"),
             cmd(b[1], "BF.EXISTS", "pass", "yes"), cmd(b[2], "BF.MADD", "pass", "c"));
    send_all(fd, all, strlen(all));
    expect(fd, ":1\r\n:1\r\n*1\r\n:1\r\n");
    ck_assert_int_eq(atomic_load(&read_before_write), 0);
    ck_assert_int_eq(atomic_load(&calls), 3);
    ck_assert_int_ge(atomic_load(&pass_ends), 2);   /* the read came after */
    close(fd);
    stop_server();
    with_pass = false;
}
END_TEST

START_TEST(errors_are_whole_replies)
{
    char b[4][128], all[512];
    start_server(false, 100, 1 << 20, 0);
    int fd = dial();
    snprintf(all, sizeof all, "%s%s%s%s", cmd(b[0], "BF.MEXISTS", "down", "a"),
             cmd(b[1], "BF.EXISTS", "missing", "a"), cmd(b[2], "BF.ADD", "bad:name", "a"),
             cmd(b[3], "NOPE", "x", NULL));
    send_all(fd, all, strlen(all));
    expect(fd, "-UNAVAILABLE shard 0: 1 of 2 copies answered\r\n"
               "-ERR not found: filter \"missing\" does not exist\r\n"
               "-ERR filter name \"bad:name\" may contain only letters, digits, '.', "
               "'_' and '-' (bad byte 0x3a at position 3)\r\n"
               "-ERR unknown command 'NOPE', with args beginning with: 'x' \r\n");
    close(fd);
    stop_server();
}
END_TEST

START_TEST(multi_exec_runs_the_queue_in_order)
{
    char b[3][128], all[512];
    start_server(false, 100, 1 << 20, 0);
    int fd = dial();
    snprintf(all, sizeof all, "MULTI\r\n%s%sPING\r\nEXEC\r\n",
             cmd(b[0], "BF.ADD", "slow", "a"), cmd(b[1], "BF.EXISTS", "slow", "a"));
    send_all(fd, all, strlen(all));
    expect(fd, "+OK\r\n+QUEUED\r\n+QUEUED\r\n+QUEUED\r\n*3\r\n:1\r\n:0\r\n+PONG\r\n");
    ck_assert_int_eq(atomic_load(&read_before_write), 0);
    snprintf(all, sizeof all, "MULTI\r\nBF.ADD sync\r\nPING\r\nEXEC\r\nEXEC\r\nDISCARD\r\n");
    send_all(fd, all, strlen(all));
    expect(fd, "+OK\r\n-ERR wrong number of arguments for 'bf.add' command\r\n"
               "+QUEUED\r\n-EXECABORT Transaction discarded because of previous "
               "errors.\r\n-ERR EXEC without MULTI\r\n-ERR DISCARD without MULTI\r\n");
    close(fd);
    stop_server();
}
END_TEST

START_TEST(auth_and_roles)
{
    start_server(true, 100, 1 << 20, 0);
    int fd = dial();
    const char *s = "PING\r\nAUTH wrong\r\nAUTH rtok\r\nPING\r\nBF.EXISTS sync yes\r\n"
                    "BF.ADD sync a\r\nHELLO 3 AUTH x atok\r\nBF.ADD sync a\r\n"
                    "RESET\r\nPING\r\n";
    send_all(fd, s, strlen(s));
    expect(fd, "-NOAUTH Authentication required.\r\n"
               "-WRONGPASS invalid username-password pair or user is disabled.\r\n"
               "+OK\r\n+PONG\r\n:1\r\n"
               "-NOPERM this user has no permissions to run the 'bf.add' command "
               "(token rtok has role read; it needs write)\r\n"
               "%7\r\n$6\r\nserver\r\n$9\r\nbloomgrid\r\n");
    /* the rest of HELLO's map, then BF.ADD as admin, RESET, NOAUTH again */
    char rest[512];
    size_t got = 0;
    /* RESP3 after HELLO 3: BF.ADD answers a boolean */
    const char *tail = "#t\r\n+RESET\r\n-NOAUTH Authentication required.\r\n";
    while (got < sizeof rest - 1) {
        struct pollfd p = {fd, POLLIN, 0};
        ck_assert(poll(&p, 1, 10000) == 1);
        ssize_t k = recv(fd, rest + got, sizeof rest - 1 - got, 0);
        ck_assert(k > 0);
        got += (size_t)k;
        rest[got] = 0;
        if (got >= strlen(tail) && strcmp(rest + got - strlen(tail), tail) == 0)
            break;
    }
    ck_assert_ptr_nonnull(strstr(rest, "$5\r\nproto\r\n:3\r\n"));
    close(fd);
    stop_server();
}
END_TEST

START_TEST(oversized_commands_close_the_connection)
{
    start_server(false, 100, 1 << 20, 0);
    int fd = dial();
    send_all(fd, "*101\r\n", 6);
    expect(fd, "-ERR Protocol error: invalid multibulk length: 101 arguments, more "
               "than the 100 allowed\r\n");
    expect_closed(fd);
    close(fd);
    fd = dial();
    send_all(fd, "*2\r\n$65\r\n", 9);
    expect(fd, "-ERR Protocol error: invalid bulk length: 65 bytes, more than the 64 "
               "allowed\r\n");
    expect_closed(fd);
    close(fd);
    /* a key past max_key: an error for the command, the connection stays */
    fd = dial();
    char k[128];
    sprintf(k, "*3\r\n$6\r\nBF.ADD\r\n$4\r\nsync\r\n$33\r\n%033d\r\nPING\r\n", 0);
    send_all(fd, k, strlen(k));
    expect(fd, "-ERR key 0 is 33 bytes; the limit is 32 (max_key_size)\r\n+PONG\r\n");
    close(fd);
    stop_server();
}
END_TEST

START_TEST(connections_past_the_budget_are_refused)
{
    start_server(false, 2, 1 << 20, 0);
    int a = dial(), b = dial();
    send_all(a, "PING\r\n", 6);
    expect(a, "+PONG\r\n");
    send_all(b, "PING\r\n", 6);
    expect(b, "+PONG\r\n");
    int c = dial();
    expect(c, "-ERR max number of clients reached\r\n");
    expect_closed(c);
    close(c);
    close(a);
    /* a place is free again once the server has seen a close */
    for (int i = 0; i < 200 && resp_server_connections(srv) > 1; i++)
        usleep(10000);
    c = dial();
    send_all(c, "PING\r\n", 6);
    expect(c, "+PONG\r\n");
    close(b);
    close(c);
    stop_server();
}
END_TEST

/* A client that pipelines without reading makes the server stop reading
 * it: the calls in flight stay bounded by the pipeline budget. */
START_TEST(a_pipeline_past_its_budget_is_not_read)
{
    start_server(false, 10, 65536, 0);
    int fd = dial();
    enum { N = 5000 };
    static char all[N * 40];
    size_t k = 0;
    for (int i = 0; i < N; i++)
        k += (size_t)sprintf(all + k, "BF.ADD hold k%d\r\n", i);
    send_all(fd, all, k);
    /* The loop takes commands in (10 s at most: a loaded machine), then
     * stops reading at the budget. */
    for (int i = 0; i < 1000 && atomic_load(&calls) == 0; i++)
        usleep(10000);
    usleep(300000);
    int seen = atomic_load(&calls);
    ck_assert_msg(seen > 0 && seen < 200, "%d calls taken in", seen);
    atomic_store(&release, true);
    /* every command is answered once the backend lets go */
    size_t want = (size_t)N * 4, got = 0;
    char buf[65536];
    while (got < want) {
        struct pollfd p = {fd, POLLIN, 0};
        ck_assert(poll(&p, 1, 10000) == 1);
        ssize_t r = recv(fd, buf, sizeof buf, 0);
        ck_assert(r > 0);
        got += (size_t)r;
    }
    ck_assert_uint_eq(got, want);
    ck_assert_int_eq(atomic_load(&calls), N);
    close(fd);
    stop_server();
}
END_TEST

/* Read n replies of one line each (or the peer closes: fails). */
static void read_lines(int fd, char *buf, size_t cap, int n)
{
    size_t got = 0;
    int lines = 0;
    while (lines < n) {
        struct pollfd p = {fd, POLLIN, 0};
        ck_assert_msg(poll(&p, 1, 10000) == 1, "no reply; have \"%.*s\"", (int)got, buf);
        ssize_t k = recv(fd, buf + got, cap - 1 - got, 0);
        ck_assert_msg(k > 0, "closed; have \"%.*s\"", (int)got, buf);
        for (ssize_t i = 0; i < k; i++)
            lines += buf[got + (size_t)i] == '\n';
        got += (size_t)k;
    }
    buf[got] = 0;
}

START_TEST(a_bounded_offload_is_answered_by_its_bound)
{
    start_server(false, 10, 1 << 20, 0);
    atomic_store(&pool_ran, 0);
    int fd = dial();
    /* The two on "pool" wait for release; the bound answers each, in
     * order, and the commands after them (another filter, PING) go on. */
    const char *cmds = "BF.ADD pool a\r\nBF.EXISTS pool a\r\nPING\r\n"
                       "BF.EXISTS sync yes\r\n";
    send_all(fd, cmds, strlen(cmds));
    char buf[4096];
    read_lines(fd, buf, sizeof buf, 4);
    const char *want1 = "-UNAVAILABLE bf.add on filter \"pool\" not answered within ";
    ck_assert_msg(strncmp(buf, want1, strlen(want1)) == 0, "have \"%s\"", buf);
    ck_assert_msg(strstr(buf, "(resp_slow_timeout_ms): the test holds it; retry\r\n"
                              "-UNAVAILABLE bf.exists on filter \"pool\""),
                  "have \"%s\"", buf);
    ck_assert_msg(strstr(buf, "retry\r\n+PONG\r\n:1\r\n"), "have \"%s\"", buf);
    ck_assert_int_eq(atomic_load(&pool_ran), 0);
    /* A claimed call is answered by its work, past the bound. */
    send_all(fd, "BF.EXISTS claimed x\r\n", 21);
    expect(fd, ":1\r\n");
    /* The held works end; their answers are dropped. */
    atomic_store(&release, true);
    while (atomic_load(&pool_ran) < 3)
        usleep(1000);
    send_all(fd, "PING\r\n", 6);
    expect(fd, "+PONG\r\n");
    close(fd);
    stop_server();
}
END_TEST

START_TEST(idle_connections_are_closed)
{
    start_server(false, 10, 1 << 20, 100);
    int fd = dial();
    send_all(fd, "*2\r\n$4\r\nECHO", 13);   /* half a command */
    expect_closed(fd);
    close(fd);
    stop_server();
}
END_TEST

/* The groups a pass_end answers (sizes in groups[]), as the node's led
 * commits: the clients the last group answered are waited for (bound
 * wait_ns, from that group's end) while adds are held, so that a client
 * answered with the others joins their next group instead of making one
 * of its own; one that closed, or that a later group did not answer, is
 * not waited for. */
static void ngroups_are(int n, const int *want)
{
    char have[256] = "";
    size_t k = 0;
    for (int i = 0; i < ngroups && k < sizeof have - 16; i++)
        k += (size_t)snprintf(have + k, sizeof have - k, " %d", groups[i]);
    ck_assert_msg(ngroups == n, "groups:%s", have);
    for (int i = 0; i < n; i++)
        ck_assert_msg(groups[i] == want[i], "groups:%s", have);
}

START_TEST(the_clients_a_group_answered_join_the_next_one)
{
    char b[128];
    const struct timespec later = {0, 100 * 1000 * 1000};
    with_pass = with_wait = true;
    atomic_store(&wait_ns, UINT64_C(30000000000));   /* 30 s: never reached */
    start_server(false, 100, 1 << 20, 0);
    int x = dial(), y = dial();

    cmd(b, "BF.ADD", "pass", "a");
    send_all(x, b, strlen(b));
    expect(x, ":1\r\n");
    ngroups_are(1, (int[]){1});
    /* x is awaited: y's add waits for it (100 ms later) and both make one
     * group; without the wait y's would go alone, then x's. */
    cmd(b, "BF.ADD", "pass", "b");
    send_all(y, b, strlen(b));
    nanosleep(&later, NULL);
    cmd(b, "BF.ADD", "pass", "c");
    send_all(x, b, strlen(b));
    expect(y, ":1\r\n");
    expect(x, ":1\r\n");
    ngroups_are(2, (int[]){1, 2});
    /* Both were answered by it: both are waited for. */
    cmd(b, "BF.ADD", "pass", "d");
    send_all(x, b, strlen(b));
    nanosleep(&later, NULL);
    cmd(b, "BF.MADD", "pass", "e");
    send_all(y, b, strlen(b));
    expect(x, ":1\r\n");
    expect(y, "*1\r\n:1\r\n");
    ngroups_are(3, (int[]){1, 2, 2});
    /* y closes: x's add goes without waiting for it (30 s). */
    close(y);
    cmd(b, "BF.ADD", "pass", "f");
    send_all(x, b, strlen(b));
    expect(x, ":1\r\n");
    ngroups_are(4, (int[]){1, 2, 2, 1});

    /* A client that does not come back costs one wait (here 50 ms), and
     * is not waited for once a later group answered others. */
    int z = dial();
    cmd(b, "BF.ADD", "pass", "g");
    send_all(z, b, strlen(b));
    nanosleep(&later, NULL);
    atomic_store(&wait_ns, UINT64_C(50000000));
    cmd(b, "BF.ADD", "pass", "h");
    send_all(x, b, strlen(b));
    expect(z, ":1\r\n");
    expect(x, ":1\r\n");
    ngroups_are(5, (int[]){1, 2, 2, 1, 2});
    atomic_store(&wait_ns, UINT64_C(30000000000));
    cmd(b, "BF.ADD", "pass", "i");
    send_all(x, b, strlen(b));
    expect(x, ":1\r\n");   /* after 50 ms: z stays silent */
    ngroups_are(6, (int[]){1, 2, 2, 1, 2, 1});
    cmd(b, "BF.ADD", "pass", "j");
    send_all(x, b, strlen(b));
    expect(x, ":1\r\n");   /* at once: only x is waited for */
    ngroups_are(7, (int[]){1, 2, 2, 1, 2, 1, 1});
    close(x);
    close(z);
    stop_server();
    with_pass = with_wait = false;
}
END_TEST

static uint64_t answered(const char *where)
{
    const char *l[] = {"where", where, NULL};
    return metric_count(metrics_counter(metrics_registry(), "bloomgrid_resp_answers_total",
                                        "RESP calls finished on another thread, by where "
                                        "their replies were made: by the loop, or in place "
                                        "by the thread that finished them", l));
}

/* Calls the finisher thread answers while the loop waits for I/O: with
 * answer_in_place their replies are written by that thread (nearly every
 * one: a call that finds the loop awake goes to it), else by the loop. */
START_TEST(replies_are_written_where_the_answer_comes)
{
    char b[128];
    start_server(false, 100, 1 << 20, 0);
    uint64_t here0 = answered("in_place"), loop0 = answered("loop");
    int fd = dial();
    enum { N = 100 };
    for (int i = 0; i < N; i++) {
        cmd(b, "BF.EXISTS", "slow", i % 3 ? "no" : "yes");
        send_all(fd, b, strlen(b));
        expect(fd, i % 3 ? ":0\r\n" : ":1\r\n");
    }
    uint64_t here = answered("in_place") - here0, loop = answered("loop") - loop0;
    ck_assert_uint_eq(here + loop, N);
    if (in_place)
        ck_assert_msg(here >= N * 9 / 10, "%llu of %d answered in place",
                      (unsigned long long)here, N);
    else
        ck_assert_uint_eq(here, 0);
    close(fd);
    stop_server();
}
END_TEST

/* Replies written in place to a client that does not read: the socket
 * fills, a send comes up short or cannot send, and the loop writes the
 * rest, in order. */
static const char *big_cmd;
static size_t big_len;

static void *send_big(void *arg)
{
    send_all(*(int *)arg, big_cmd, big_len);
    return NULL;
}

START_TEST(replies_to_a_client_that_does_not_read_keep_their_order)
{
    start_server(false, 100, 64u << 20, 0);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    int small = 4096;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    /* N BF.MEXISTS slow of K keys: key j of command i is "yes" when
     * (i + j) % 3 == 0. */
    enum { N = 12000, K = 90 };
    size_t cap = (size_t)N * (K * 10 + 64), k = 0, wk = 0;
    char *all = malloc(cap), *want = malloc((size_t)N * (K * 4 + 16));
    for (int i = 0; i < N; i++) {
        k += (size_t)sprintf(all + k, "*%d\r\n$10\r\nBF.MEXISTS\r\n$4\r\nslow\r\n", K + 2);
        wk += (size_t)sprintf(want + wk, "*%d\r\n", K);
        for (int j = 0; j < K; j++) {
            bool yes = (i + j) % 3 == 0;
            k += (size_t)sprintf(all + k, yes ? "$3\r\nyes\r\n" : "$2\r\nno\r\n");
            wk += (size_t)sprintf(want + wk, yes ? ":1\r\n" : ":0\r\n");
        }
    }
    big_cmd = all;
    big_len = k;
    pthread_t th;
    pthread_create(&th, NULL, send_big, &fd);
    usleep(500000);   /* the replies pile up unread */
    char *got = malloc(wk + 1);
    size_t n = 0;
    while (n < wk) {
        struct pollfd p = {fd, POLLIN, 0};
        ck_assert_msg(poll(&p, 1, 20000) == 1, "no reply after %zu of %zu bytes", n, wk);
        /* slowly at first: the socket fills and drains by turns */
        ssize_t r = recv(fd, got + n, n < wk / 2 ? 8192 : wk - n, 0);
        ck_assert_msg(r > 0, "closed after %zu of %zu bytes", n, wk);
        n += (size_t)r;
        if (n < wk / 2)
            usleep(200);
    }
    pthread_join(th, NULL);
    ck_assert_msg(memcmp(got, want, wk) == 0, "the replies differ from the answers");
    free(all);
    free(want);
    free(got);
    close(fd);
    stop_server();
}
END_TEST

Suite *resp_server_suite(void)
{
    Suite *s = suite_create("resp_server");
    TCase *t = tcase_create("core");
    tcase_set_timeout(t, 60);
    tcase_add_test(t, replies_keep_the_order_of_commands);
    tcase_add_test(t, a_read_waits_for_the_connections_writes_to_its_filter);
    tcase_add_test(t, errors_are_whole_replies);
    tcase_add_test(t, multi_exec_runs_the_queue_in_order);
    tcase_add_test(t, auth_and_roles);
    tcase_add_test(t, oversized_commands_close_the_connection);
    tcase_add_test(t, connections_past_the_budget_are_refused);
    tcase_add_test(t, a_pipeline_past_its_budget_is_not_read);
    tcase_add_test(t, idle_connections_are_closed);
    tcase_add_test(t, a_bounded_offload_is_answered_by_its_bound);
    tcase_add_test(t, a_call_held_by_the_pass_end_it_resumed_is_answered);
    tcase_add_test(t, the_clients_a_group_answered_join_the_next_one);
    tcase_add_test(t, replies_are_written_where_the_answer_comes);
    tcase_add_test(t, replies_to_a_client_that_does_not_read_keep_their_order);
    suite_add_tcase(s, t);
    /* The same with the backend's calls answered in place. */
    TCase *p = tcase_create("in_place");
    tcase_set_timeout(p, 60);
    tcase_add_checked_fixture(p, set_in_place, NULL);
    tcase_add_test(p, replies_keep_the_order_of_commands);
    tcase_add_test(p, a_read_waits_for_the_connections_writes_to_its_filter);
    tcase_add_test(p, errors_are_whole_replies);
    tcase_add_test(p, multi_exec_runs_the_queue_in_order);
    tcase_add_test(p, auth_and_roles);
    tcase_add_test(p, oversized_commands_close_the_connection);
    tcase_add_test(p, connections_past_the_budget_are_refused);
    tcase_add_test(p, a_pipeline_past_its_budget_is_not_read);
    tcase_add_test(p, idle_connections_are_closed);
    tcase_add_test(p, a_bounded_offload_is_answered_by_its_bound);
    tcase_add_test(p, a_call_held_by_the_pass_end_it_resumed_is_answered);
    tcase_add_test(p, the_clients_a_group_answered_join_the_next_one);
    tcase_add_test(p, replies_are_written_where_the_answer_comes);
    tcase_add_test(p, replies_to_a_client_that_does_not_read_keep_their_order);
    suite_add_tcase(s, p);
    return s;
}
