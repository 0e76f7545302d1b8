/* rpc_frame: unary calls over plain TCP frames (see rpc_frame.h). */
#include "rpc_check.h"
#include "rpc_frame.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "log.h"

#define MAX_STATUS_MSG 4096     /* longest status message a client accepts */
#define POOL_IDLE_MAX 16        /* idle connections kept per pool */

static inline uint32_t get_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
           (uint32_t)p[3] << 24;
}

static inline void put_le32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

static void header(uint8_t *h, uint32_t magic, uint32_t a, uint32_t b, uint32_t c)
{
    put_le32(h, magic);
    put_le32(h + 4, a);
    put_le32(h + 8, b);
    put_le32(h + 12, c);
}

int rpc_frame_split_addr(const char *addr, char *host, size_t hostlen, int *port)
{
    const char *colon = strrchr(addr, ':');
    const char *h = addr;
    size_t hl;
    char *end;

    if (!colon || colon == addr)
        return -1;
    hl = (size_t)(colon - addr);
    if (addr[0] == '[') {
        if (hl < 2 || addr[hl - 1] != ']')
            return -1;
        h = addr + 1;
        hl -= 2;
    }
    if (hl == 0 || hl >= hostlen)
        return -1;
    long p = strtol(colon + 1, &end, 10);
    if (*end || end == colon + 1 || p < 0 || p > 65535)
        return -1;
    memcpy(host, h, hl);
    host[hl] = 0;
    *port = (int)p;
    return 0;
}

static void set_nodelay(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* ================================ server ================================ */

struct conn {
    int fd;
    struct conn *next;
};

struct rpc_frame_server {
    int lfd;
    pthread_t accept_th;
    const struct rpc_handler *handlers;
    size_t n;
    const ProtobufCServiceDescriptor *sd;
    void *arg;
    size_t max_message;
    int max_conns;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct conn *conns;
    int nconns;
    bool stopping;
};

struct conn_arg {
    struct rpc_frame_server *s;
    struct conn *c;
};

/* Read len bytes.  With started, the bytes are the rest of a frame that has
 * begun and must come within stall_ms; otherwise the first read may wait as
 * long as the connection stays idle. */
static atomic_int stall_ms = 10000;

void rpc_frame_set_stall_ms(int ms)
{
    atomic_store(&stall_ms, ms > 0 ? ms : 1);
}

static int read_full(int fd, void *buf, size_t len, bool started)
{
    uint8_t *p = buf;

    while (len > 0) {
        ssize_t r = started ? recv(fd, p, len, MSG_DONTWAIT) : read(fd, p, len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && started && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            struct pollfd pf = {.fd = fd, .events = POLLIN};
            int ms = atomic_load(&stall_ms);
            int pr = poll(&pf, 1, ms);
            if (pr == 0) {
                log_warn("frame connection: a frame stalled for %d ms; closing it", ms);
                return -1;
            }
            if (pr < 0 && errno != EINTR)
                return -1;
            continue;
        }
        if (r <= 0)
            return -1;
        p += r;
        len -= (size_t)r;
        started = true;
    }
    return 0;
}

/* writev without SIGPIPE: a peer that went away is an error, not a signal. */
static ssize_t send_iov(int fd, struct iovec *iov, int n)
{
    struct msghdr mh;

    memset(&mh, 0, sizeof mh);
    mh.msg_iov = iov;
    mh.msg_iovlen = (size_t)n;
    return sendmsg(fd, &mh, MSG_NOSIGNAL);
}

/* Drop the first w bytes from an iovec array of n entries, after a short write. */
static void iov_advance(struct iovec **iov, int *n, size_t w)
{
    while (*n > 0 && w >= (*iov)->iov_len) {
        w -= (*iov)->iov_len;
        (*iov)++;
        (*n)--;
    }
    if (*n > 0) {
        (*iov)->iov_base = (uint8_t *)(*iov)->iov_base + w;
        (*iov)->iov_len -= w;
    }
}

static int writev_full(int fd, struct iovec *iov, int n)
{
    while (n > 0) {
        ssize_t w = send_iov(fd, iov, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return -1;
        iov_advance(&iov, &n, (size_t)w);
    }
    return 0;
}

static int send_response(int fd, const struct rpc_reply *rep)
{
    uint8_t h[RPC_FRAME_HDR];
    struct iovec iov[3];
    int n = 1;

    if (rep->st.code == GRPC_STATUS_OK) {
        size_t len = rep->has_body ? GRPC_SLICE_LENGTH(rep->body) : 0;
        header(h, RPC_FRAME_MAGIC, GRPC_STATUS_OK, 0, (uint32_t)len);
        if (len) {
            iov[n].iov_base = (void *)GRPC_SLICE_START_PTR(rep->body);
            iov[n++].iov_len = len;
        }
    } else {
        size_t ml = strnlen(rep->st.message, sizeof rep->st.message);
        header(h, RPC_FRAME_MAGIC, (uint32_t)rep->st.code, (uint32_t)ml, 0);
        if (ml) {
            iov[n].iov_base = (void *)rep->st.message;
            iov[n++].iov_len = ml;
        }
    }
    iov[0].iov_base = h;
    iov[0].iov_len = sizeof h;
    return writev_full(fd, iov, n);
}

static void serve_conn(struct rpc_frame_server *s, int fd)
{
    uint8_t h[RPC_FRAME_HDR];
    uint8_t *buf = NULL;
    size_t cap = 0;

    for (;;) {
        if (read_full(fd, h, sizeof h, false) < 0)
            break;
        if (get_le32(h) != RPC_FRAME_MAGIC) {
            log_warn("frame connection: bad magic 0x%08x; closing it", get_le32(h));
            break;
        }
        uint32_t method = get_le32(h + 4), len = get_le32(h + 12);
        struct rpc_reply rep;
        memset(&rep, 0, sizeof rep);
        rep.st.code = GRPC_STATUS_OK;
        if (len > s->max_message) {
            rpc_reply_error(&rep, GRPC_STATUS_RESOURCE_EXHAUSTED,
                            "request of %u bytes; the limit is %zu (max_message_size)",
                            len, s->max_message);
            send_response(fd, &rep);
            break;
        }
        if (len > cap) {
            uint8_t *nb = realloc(buf, len);
            if (!nb) {
                rpc_reply_error(&rep, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
                send_response(fd, &rep);
                break;
            }
            buf = nb;
            cap = len;
        }
        if (len && read_full(fd, buf, len, true) < 0)
            break;
        char msg[RPC_MSGLEN];
        if (method >= s->n || !s->handlers[method].unary)
            rpc_reply_error(&rep, GRPC_STATUS_UNIMPLEMENTED,
                            "method %u is not served over frames", method);
        else if (s->sd && method < s->sd->n_methods &&
                 !s->handlers[method].checks_strings &&
                 rpc_check_strings(s->sd->methods[method].input, buf ? buf : h,
                                   len, msg, sizeof msg) < 0)
            rpc_reply_error(&rep, GRPC_STATUS_INVALID_ARGUMENT, "%s", msg);
        else
            s->handlers[method].unary(s->arg, buf ? buf : h, len, &rep);
        int w = send_response(fd, &rep);
        if (rep.has_body)
            grpc_slice_unref(rep.body);
        if (w < 0)
            break;
        if (cap > (4u << 20)) {
            /* An idle connection does not keep a big batch's buffer. */
            free(buf);
            buf = NULL;
            cap = 0;
        }
    }
    free(buf);
}

static void *conn_main(void *p)
{
    struct conn_arg *ca = p;
    struct rpc_frame_server *s = ca->s;
    struct conn *c = ca->c;

    free(ca);
    serve_conn(s, c->fd);
    pthread_mutex_lock(&s->mu);
    for (struct conn **pp = &s->conns; *pp; pp = &(*pp)->next) {
        if (*pp == c) {
            *pp = c->next;
            break;
        }
    }
    close(c->fd);
    free(c);
    s->nconns--;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static void *accept_main(void *p)
{
    struct rpc_frame_server *s = p;

    for (;;) {
        int fd = accept4(s->lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) {
            pthread_mutex_lock(&s->mu);
            bool stop = s->stopping;
            pthread_mutex_unlock(&s->mu);
            if (stop)
                break;
            if (errno == EMFILE || errno == ENFILE || errno == ENOMEM) {
                struct timespec ts = {0, 10 * 1000 * 1000};
                nanosleep(&ts, NULL);
            }
            continue;
        }
        set_nodelay(fd);
        pthread_mutex_lock(&s->mu);
        if (s->stopping || s->nconns >= s->max_conns) {
            int max = s->max_conns;
            bool stopping = s->stopping;
            pthread_mutex_unlock(&s->mu);
            /* Tell the caller its request will not run, so that it can go
             * another way; then close. */
            char msg[96];
            uint8_t h[RPC_FRAME_HDR];
            int ml = snprintf(msg, sizeof msg, stopping ? "shutting down"
                              : "at the limit of %d frame connections", max);
            header(h, RPC_FRAME_REFUSED, GRPC_STATUS_UNAVAILABLE, (uint32_t)ml, 0);
            struct iovec iov[2] = {{h, sizeof h}, {msg, (size_t)ml}};
            struct timeval tv = {0, 100 * 1000};
            setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
            writev_full(fd, iov, 2);
            close(fd);
            continue;
        }
        struct conn *c = calloc(1, sizeof *c);
        struct conn_arg *ca = calloc(1, sizeof *ca);
        pthread_t th;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        bool ok = c && ca;
        if (ok) {
            c->fd = fd;
            c->next = s->conns;
            ca->s = s;
            ca->c = c;
            s->conns = c;
            s->nconns++;
            if (pthread_create(&th, &at, conn_main, ca) != 0) {
                s->conns = c->next;
                s->nconns--;
                ok = false;
            }
        }
        pthread_attr_destroy(&at);
        pthread_mutex_unlock(&s->mu);
        if (!ok) {
            free(c);
            free(ca);
            close(fd);
        }
    }
    return NULL;
}

struct rpc_frame_server *rpc_frame_server_start(const char *host, int port,
                                                const struct rpc_handler *handlers,
                                                size_t n,
                                                const ProtobufCServiceDescriptor *sd,
                                                void *arg,
                                                size_t max_message, int max_conns,
                                                int *bound_port, char *err)
{
    char h[256], ps[16];
    struct addrinfo hints, *ai = NULL;
    struct rpc_frame_server *s;
    int fd = -1, one = 1, e;

    snprintf(h, sizeof h, "%s", host);
    size_t hl = strlen(h);
    if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']') {
        memmove(h, h + 1, hl - 2);
        h[hl - 2] = 0;
    }
    snprintf(ps, sizeof ps, "%d", port);
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    if ((e = getaddrinfo(h[0] ? h : NULL, ps, &hints, &ai)) != 0) {
        snprintf(err, 256, "frame port: cannot resolve %s: %s", host, gai_strerror(e));
        return NULL;
    }
    fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0 ||
        bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 || listen(fd, 128) < 0) {
        snprintf(err, 256, "frame port: cannot listen on %s:%d: %s", host, port,
                 strerror(errno));
        if (fd >= 0)
            close(fd);
        freeaddrinfo(ai);
        return NULL;
    }
    freeaddrinfo(ai);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) < 0) {
        snprintf(err, 256, "frame port: getsockname: %s", strerror(errno));
        close(fd);
        return NULL;
    }
    *bound_port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                 : ((struct sockaddr_in *)&ss)->sin_port);
    s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, 256, "out of memory");
        close(fd);
        return NULL;
    }
    s->lfd = fd;
    s->handlers = handlers;
    s->n = n;
    s->sd = sd;
    s->arg = arg;
    s->max_message = max_message;
    s->max_conns = max_conns > 0 ? max_conns : 1;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    if (pthread_create(&s->accept_th, NULL, accept_main, s) != 0) {
        snprintf(err, 256, "frame port: cannot start a thread");
        close(fd);
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->cv);
        free(s);
        return NULL;
    }
    return s;
}

void rpc_frame_server_stop(struct rpc_frame_server *s)
{
    if (!s)
        return;
    pthread_mutex_lock(&s->mu);
    s->stopping = true;
    pthread_mutex_unlock(&s->mu);
    shutdown(s->lfd, SHUT_RDWR);
    pthread_join(s->accept_th, NULL);
    close(s->lfd);
    pthread_mutex_lock(&s->mu);
    for (struct conn *c = s->conns; c; c = c->next)
        shutdown(c->fd, SHUT_RDWR);
    while (s->nconns > 0)
        pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}

/* ================================ client ================================ */

struct rpc_frame_pool {
    char host[256];
    size_t max_message;
    pthread_mutex_t mu;
    int port;
    unsigned gen;           /* bumped by set_port: older connections close */
    int idle[POOL_IDLE_MAX];
    size_t nidle;
};

struct rpc_frame_pool *rpc_frame_pool_create(const char *host, int port,
                                             size_t max_message)
{
    struct rpc_frame_pool *p = calloc(1, sizeof *p);

    if (!p)
        return NULL;
    snprintf(p->host, sizeof p->host, "%s", host);
    p->port = port;
    p->max_message = max_message ? max_message : 64u << 20;
    pthread_mutex_init(&p->mu, NULL);
    return p;
}

static void close_idle(struct rpc_frame_pool *p)
{
    for (size_t i = 0; i < p->nidle; i++)
        close(p->idle[i]);
    p->nidle = 0;
}

void rpc_frame_pool_destroy(struct rpc_frame_pool *p)
{
    if (!p)
        return;
    close_idle(p);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

void rpc_frame_pool_set_port(struct rpc_frame_pool *p, int port)
{
    pthread_mutex_lock(&p->mu);
    if (p->port != port) {
        p->port = port;
        p->gen++;
        close_idle(p);
    }
    pthread_mutex_unlock(&p->mu);
}

int rpc_frame_pool_port(struct rpc_frame_pool *p)
{
    pthread_mutex_lock(&p->mu);
    int port = p->port;
    pthread_mutex_unlock(&p->mu);
    return port;
}

static int64_t now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* An idle connection the server has not closed meanwhile: nothing to read
 * yet (a closed one reads 0; stray bytes mean it is out of step). */
static bool conn_alive(int fd)
{
    char c;
    ssize_t r = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);

    return r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

static int connect_to(const char *host, int port, int64_t deadline, char *why, size_t wl)
{
    struct addrinfo hints, *ai = NULL, *a;
    char ps[16];
    int fd = -1, e;

    snprintf(ps, sizeof ps, "%d", port);
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    if ((e = getaddrinfo(host, ps, &hints, &ai)) != 0) {
        snprintf(why, wl, "%s", gai_strerror(e));
        return -1;
    }
    snprintf(why, wl, "no address");
    for (a = ai; a; a = a->ai_next) {
        fd = socket(a->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            snprintf(why, wl, "%s", strerror(errno));
            continue;
        }
        if (connect(fd, a->ai_addr, a->ai_addrlen) == 0)
            break;
        if (errno == EINPROGRESS) {
            struct pollfd pf = {.fd = fd, .events = POLLOUT};
            int64_t left = deadline - now_ms();
            int pr = left > 0 ? poll(&pf, 1, (int)left) : 0;
            int soerr = 0;
            socklen_t sl = sizeof soerr;
            if (pr == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) == 0 &&
                soerr == 0)
                break;
            snprintf(why, wl, "%s", pr == 0 ? "connect timed out" : strerror(soerr ? soerr : errno));
        } else {
            snprintf(why, wl, "%s", strerror(errno));
        }
        close(fd);
        fd = -1;
    }
    freeaddrinfo(ai);
    if (fd >= 0)
        set_nodelay(fd);
    return fd;
}

static int conn_get(struct rpc_frame_pool *p, int64_t deadline, unsigned *gen, int *port,
                    char *why, size_t wl)
{
    int fd = -1;

    pthread_mutex_lock(&p->mu);
    *gen = p->gen;
    *port = p->port;
    while (p->nidle > 0 && fd < 0) {
        fd = p->idle[--p->nidle];
        if (!conn_alive(fd)) {
            close(fd);
            fd = -1;
        }
    }
    pthread_mutex_unlock(&p->mu);
    if (fd >= 0)
        return fd;
    if (*port <= 0) {
        snprintf(why, wl, "no frame port known");
        return -1;
    }
    return connect_to(p->host, *port, deadline, why, wl);
}

static void conn_put(struct rpc_frame_pool *p, int fd, unsigned gen)
{
    pthread_mutex_lock(&p->mu);
    if (gen == p->gen && p->nidle < POOL_IDLE_MAX) {
        p->idle[p->nidle++] = fd;
        fd = -1;
    }
    pthread_mutex_unlock(&p->mu);
    if (fd >= 0)
        close(fd);
}

/* Per-call progress of rpc_frame_call_many. */
struct cstate {
    int fd;
    unsigned gen;
    int port;
    int64_t deadline;
    bool done;
    uint8_t hdr[RPC_FRAME_HDR];
    size_t got;             /* bytes of the current part read */
    int part;               /* 0 header, 1 message, 2 body */
    uint32_t code, mlen, blen;
    char *msg;
    grpc_slice body;
};

static void fail(struct rpc_frame_call *c, grpc_status_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void fail(struct rpc_frame_call *c, grpc_status_code code, const char *fmt, ...)
{
    va_list ap;

    c->rc = -1;
    c->st.code = code;
    va_start(ap, fmt);
    vsnprintf(c->st.message, sizeof c->st.message, fmt, ap);
    va_end(ap);
}

static void end_call(struct rpc_frame_call *c, struct cstate *cs, bool reuse)
{
    if (cs->fd >= 0) {
        if (reuse)
            conn_put(c->pool, cs->fd, cs->gen);
        else
            close(cs->fd);
    }
    cs->fd = -1;
    cs->done = true;
    free(cs->msg);
    cs->msg = NULL;
    if (c->rc != 0 && !GRPC_SLICE_IS_EMPTY(cs->body)) {
        grpc_slice_unref(cs->body);
        cs->body = grpc_empty_slice();
    }
}

/* Write the whole request; false on failure (c filled in). */
static bool send_request(struct rpc_frame_call *c, struct cstate *cs)
{
    uint8_t h[RPC_FRAME_HDR];
    struct iovec iov[2] = {{h, sizeof h}, {(void *)c->req, c->len}};
    struct iovec *v = iov;
    int n = c->len ? 2 : 1;

    header(h, RPC_FRAME_MAGIC, c->method, c->timeout_ms > 0 ? (uint32_t)c->timeout_ms : 0,
           (uint32_t)c->len);
    while (n > 0) {
        ssize_t w = send_iov(cs->fd, v, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            struct pollfd pf = {.fd = cs->fd, .events = POLLOUT};
            int64_t left = cs->deadline - now_ms();
            if (left <= 0 || poll(&pf, 1, (int)left) == 0) {
                fail(c, GRPC_STATUS_DEADLINE_EXCEEDED, "%s:%d: request not sent within %d ms",
                     c->pool->host, cs->port, c->timeout_ms);
                return false;
            }
            continue;
        }
        if (w < 0) {
            fail(c, GRPC_STATUS_UNAVAILABLE, "%s:%d: %s", c->pool->host, cs->port,
                 strerror(errno));
            return false;
        }
        c->sent = true;
        iov_advance(&v, &n, (size_t)w);
    }
    return true;
}

/* Read what is there; returns 1 when the response is complete, 0 when more
 * is to come, -1 on failure (c filled in). */
static int recv_some(struct rpc_frame_call *c, struct cstate *cs)
{
    for (;;) {
        uint8_t *dst;
        size_t want;
        if (cs->part == 0) {
            dst = cs->hdr + cs->got;
            want = RPC_FRAME_HDR - cs->got;
        } else if (cs->part == 1) {
            dst = (uint8_t *)cs->msg + cs->got;
            want = cs->mlen - cs->got;
        } else {
            dst = GRPC_SLICE_START_PTR(cs->body) + cs->got;
            want = cs->blen - cs->got;
        }
        if (want > 0) {
            ssize_t r = read(cs->fd, dst, want);
            if (r < 0 && errno == EINTR)
                continue;
            if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
                return 0;
            if (r <= 0) {
                fail(c, GRPC_STATUS_UNAVAILABLE, "%s:%d: connection lost (%s)",
                     c->pool->host, cs->port, r == 0 ? "closed by the node" : strerror(errno));
                return -1;
            }
            cs->got += (size_t)r;
            if ((size_t)r < want)
                continue;
        }
        /* This part is complete. */
        cs->got = 0;
        if (cs->part == 0) {
            cs->code = get_le32(cs->hdr + 4);
            cs->mlen = get_le32(cs->hdr + 8);
            cs->blen = get_le32(cs->hdr + 12);
            if (get_le32(cs->hdr) == RPC_FRAME_REFUSED) {
                c->sent = false;
                c->refused = true;
                fail(c, GRPC_STATUS_UNAVAILABLE, "%s:%d: refused the connection",
                     c->pool->host, cs->port);
                return -1;
            }
            if (get_le32(cs->hdr) != RPC_FRAME_MAGIC || cs->mlen > MAX_STATUS_MSG ||
                cs->blen > c->pool->max_message) {
                fail(c, GRPC_STATUS_INTERNAL, "%s:%d: malformed response frame",
                     c->pool->host, cs->port);
                return -1;
            }
            cs->msg = malloc(cs->mlen + 1);
            cs->body = cs->blen ? grpc_slice_malloc(cs->blen) : grpc_empty_slice();
            if (!cs->msg) {
                fail(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
                return -1;
            }
            cs->part = 1;
        } else if (cs->part == 1) {
            cs->msg[cs->mlen] = 0;
            cs->part = 2;
        } else {
            c->answered = true;
            c->st.code = (grpc_status_code)cs->code;
            snprintf(c->st.message, sizeof c->st.message, "%s", cs->msg);
            if (cs->code == GRPC_STATUS_OK) {
                c->rc = 0;
                c->resp = cs->body;
                cs->body = grpc_empty_slice();
            } else {
                c->rc = -1;
            }
            return 1;
        }
    }
}

/* Busy-wait budget, and how many threads are busy-waiting (at most one at a
 * time, so that waiting callers never crowd out the work they wait for). */
static atomic_long spin_us;
static atomic_int spinning;

void rpc_frame_set_spin(long us)
{
    atomic_store(&spin_us, us > 0 ? us : 0);
}

size_t rpc_frame_call_many(struct rpc_frame_call *calls, size_t n)
{
    size_t m = n ? n : 1;
    struct cstate *cs = calloc(m, sizeof *cs);
    struct pollfd *pf = calloc(m, sizeof *pf);
    size_t *which = calloc(m, sizeof *which);
    size_t pending = 0, failed = 0;
    char why[160];

    if (!cs || !pf || !which) {
        for (size_t i = 0; i < n; i++) {
            calls[i].sent = false;
            calls[i].resp = grpc_empty_slice();
            fail(&calls[i], GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        }
        failed = n;
        n = 0;
    }
    int64_t t0 = now_ms();
    for (size_t i = 0; i < n; i++) {
        struct rpc_frame_call *c = &calls[i];
        struct cstate *s = &cs[i];
        c->rc = -1;
        c->sent = false;
        c->answered = false;
        c->refused = false;
        c->resp = grpc_empty_slice();
        c->st.code = GRPC_STATUS_UNKNOWN;
        c->st.message[0] = 0;
        s->body = grpc_empty_slice();
        s->deadline = t0 + (c->timeout_ms > 0 ? c->timeout_ms : 1);
        s->fd = conn_get(c->pool, s->deadline, &s->gen, &s->port, why, sizeof why);
        c->port = s->port;
        if (s->fd < 0) {
            fail(c, GRPC_STATUS_UNAVAILABLE, "%s:%d: cannot connect to the frame port: %s",
                 c->pool->host, s->port, why);
            end_call(c, s, false);
            continue;
        }
        if (!send_request(c, s)) {
            end_call(c, s, false);
            continue;
        }
        pending++;
    }
    while (pending > 0) {
        size_t np = 0;
        int64_t first = INT64_MAX, now = now_ms();
        for (size_t i = 0; i < n; i++) {
            struct cstate *s = &cs[i];
            if (s->done)
                continue;
            if (now >= s->deadline) {
                fail(&calls[i], GRPC_STATUS_DEADLINE_EXCEEDED,
                     "%s:%d: no answer within %d ms", calls[i].pool->host, s->port,
                     calls[i].timeout_ms);
                end_call(&calls[i], s, false);
                pending--;
                continue;
            }
            if (s->deadline < first)
                first = s->deadline;
            pf[np].fd = s->fd;
            pf[np].events = POLLIN;
            pf[np].revents = 0;
            which[np++] = i;
        }
        if (np == 0)
            break;
        /* Busy-wait a little first (one caller at a time): an answer from a
         * nearby node usually comes within tens of microseconds, and waking
         * a sleeping thread costs about as much again. */
        int pr = 0;
        long spin = atomic_load_explicit(&spin_us, memory_order_relaxed);
        if (spin > 0 && atomic_fetch_add(&spinning, 1) == 0) {
            struct timespec a, b;
            clock_gettime(CLOCK_MONOTONIC, &a);
            for (;;) {
                pr = poll(pf, (nfds_t)np, 0);
                if (pr != 0)
                    break;
                clock_gettime(CLOCK_MONOTONIC, &b);
                if ((b.tv_sec - a.tv_sec) * 1000000L + (b.tv_nsec - a.tv_nsec) / 1000 >= spin)
                    break;
            }
            atomic_fetch_sub(&spinning, 1);
        } else if (spin > 0) {
            atomic_fetch_sub(&spinning, 1);
        }
        if (pr == 0)
            pr = poll(pf, (nfds_t)np, (int)(first - now));
        if (pr < 0 && errno != EINTR)
            break;
        for (size_t k = 0; pr > 0 && k < np; k++) {
            if (!pf[k].revents)
                continue;
            size_t i = which[k];
            int r = recv_some(&calls[i], &cs[i]);
            if (r != 0) {
                end_call(&calls[i], &cs[i], r > 0);
                pending--;
            }
        }
    }
    for (size_t i = 0; i < n; i++) {
        if (!cs[i].done) {
            fail(&calls[i], GRPC_STATUS_INTERNAL, "%s:%d: poll failed: %s",
                 calls[i].pool->host, cs[i].port, strerror(errno));
            end_call(&calls[i], &cs[i], false);
        }
        failed += calls[i].rc != 0;
    }
    free(cs);
    free(pf);
    free(which);
    return failed;
}
