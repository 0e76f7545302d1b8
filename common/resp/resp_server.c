/* resp_server: the loop, the listener and the connections of the Redis
 * door (resp_server.h; the commands are in resp_cmd.c and resp_bf.c).
 *
 * One libuv loop thread owns every connection.  A read appends to the
 * connection's input buffer (decrypting first with TLS), then commands
 * are parsed and dispatched one after the other until the input runs
 * out, a command must wait for an earlier one of its connection, or the
 * connection is over its pipeline budget (then it is not read until its
 * replies drain).  Replies are appended to the connection's output, or to
 * a slot in line behind an unanswered command, and flushed once per loop
 * pass: a pipeline of commands costs one write, tried at once with
 * uv_try_write (the rest waits for the socket).  Calls that finish on
 * other threads are queued under a mutex and the loop woken (uv_async).
 * With be.answer_in_place, the thread that finishes calls may instead
 * answer them itself when the loop is waiting for I/O: the loop's state is
 * one mutex (loop_mu) that the loop thread holds while it runs and lets go
 * just before it polls; that thread takes it with a try-lock, finishes the
 * calls whose connections are in the plain case and writes their replies
 * with one send() each, and hands the rest to the loop (resp__answer_here).
 * A backend with pass_end is called before every poll (uv_prepare), so
 * that it can join the calls of a pass (every connection's) into one;
 * what is answered is flushed before it and again after it.  While it
 * holds calls, the loop may first drain (polls that do not sleep) and wait
 * for the connections the last pass end answered (pass_wait_ns).
 */
#include "resp_internal.h"

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <openssl/err.h>
#include <openssl/pem.h>

#include "log.h"

#define READ_CHUNK (64u << 10)

uint64_t resp__now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t resp__now_ms(void)
{
    return resp__now_ns() / 1000000u;
}

static void conn_close(struct resp_conn *c);
#define flush_dirty resp__flush_dirty
static void conn_flush(struct resp_conn *c);
static void process(struct resp_conn *c);

/* ---- TLS ---- */

static SSL_CTX *tls_ctx_make(const char *cert_pem, const char *key_pem, char *err)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    BIO *cb = NULL, *kb = NULL;
    X509 *x = NULL;
    EVP_PKEY *k = NULL;

    if (!ctx) {
        snprintf(err, RESP_SERVER_ERRLEN, "cannot create a TLS context");
        return NULL;
    }
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_RELEASE_BUFFERS);
    cb = BIO_new_mem_buf(cert_pem, -1);
    kb = BIO_new_mem_buf(key_pem, -1);
    if (!cb || !kb || !(x = PEM_read_bio_X509(cb, NULL, NULL, NULL)) ||
        SSL_CTX_use_certificate(ctx, x) != 1) {
        snprintf(err, RESP_SERVER_ERRLEN, "tls_cert: no certificate could be read");
        goto fail;
    }
    /* The rest of the chain. */
    X509 *extra;
    while ((extra = PEM_read_bio_X509(cb, NULL, NULL, NULL)))
        if (SSL_CTX_add_extra_chain_cert(ctx, extra) != 1) {
            X509_free(extra);
            break;
        }
    ERR_clear_error();
    if (!(k = PEM_read_bio_PrivateKey(kb, NULL, NULL, NULL)) ||
        SSL_CTX_use_PrivateKey(ctx, k) != 1 || SSL_CTX_check_private_key(ctx) != 1) {
        snprintf(err, RESP_SERVER_ERRLEN, "tls_key: the key cannot be read or does "
                 "not match tls_cert");
        goto fail;
    }
    X509_free(x);
    EVP_PKEY_free(k);
    BIO_free(cb);
    BIO_free(kb);
    return ctx;
fail:
    X509_free(x);
    EVP_PKEY_free(k);
    BIO_free(cb);
    BIO_free(kb);
    SSL_CTX_free(ctx);
    return NULL;
}

int resp_server_set_tls(struct resp_server *s, const char *cert_pem,
                        const char *key_pem, char *err)
{
    pthread_mutex_lock(&s->tls_mu);
    bool had = s->ssl_ctx != NULL;
    pthread_mutex_unlock(&s->tls_mu);
    if (!had) {
        snprintf(err, RESP_SERVER_ERRLEN, "the RESP listener was started without TLS");
        return -ENOENT;
    }
    SSL_CTX *ctx = tls_ctx_make(cert_pem, key_pem, err);
    if (!ctx)
        return -EINVAL;
    pthread_mutex_lock(&s->tls_mu);
    SSL_CTX *old = s->ssl_ctx;
    s->ssl_ctx = ctx;
    pthread_mutex_unlock(&s->tls_mu);
    SSL_CTX_free(old);   /* connections made with it hold their own reference */
    return 0;
}

/* Move what OpenSSL wrote (handshake, records) into the connection's
 * socket output. */
static int tls_drain(struct resp_conn *c, struct resp_buf *to)
{
    int pend;
    while ((pend = (int)BIO_ctrl_pending(c->wbio)) > 0) {
        if (resp_buf_reserve(to, (size_t)pend) < 0)
            return -ENOMEM;
        int n = BIO_read(c->wbio, to->p + to->len, pend);
        if (n <= 0)
            break;
        to->len += (size_t)n;
    }
    return 0;
}

/* ---- buffers ---- */

static bool over_budget(const struct resp_conn *c)
{
    return c->pending + c->out.len + c->wbuf.len > c->srv->cfg.pipeline_bytes;
}

/* Room for n more bytes of input. */
static int in_reserve(struct resp_conn *c, size_t n)
{
    if (c->in_start > 0 && (c->in_start == c->in_len || c->in_cap - c->in_len < n)) {
        /* The parser keeps offsets from the command start: moving the
         * unread bytes to the front keeps them valid. */
        memmove(c->in, c->in + c->in_start, c->in_len - c->in_start);
        c->in_len -= c->in_start;
        c->in_start = 0;
    }
    if (c->in_cap - c->in_len >= n)
        return 0;
    size_t cap = c->in_cap ? c->in_cap : READ_CHUNK;
    while (cap - c->in_len < n)
        cap *= 2;
    char *p = realloc(c->in, cap);
    if (!p)
        return -ENOMEM;
    c->in = p;
    c->in_cap = cap;
    return 0;
}

/* ---- replies in order ---- */

struct resp_buf *resp__reply_buf(struct resp_conn *c)
{
    resp__mark_dirty(c);
    if (!c->head)
        return &c->out;
    struct resp_slot *s = calloc(1, sizeof *s);
    if (!s) {
        conn_close(c);
        return NULL;
    }
    s->ready = true;
    c->tail->next = s;
    c->tail = s;
    return &s->buf;
}

struct resp_slot *resp__slot_new(struct resp_conn *c)
{
    struct resp_slot *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    if (c->tail)
        c->tail->next = s;
    else
        c->head = s;
    c->tail = s;
    return s;
}

void resp__slot_ready(struct resp_conn *c, struct resp_slot *s)
{
    s->ready = true;
    while (c->head && c->head->ready) {
        struct resp_slot *h = c->head;
        c->head = h->next;
        if (!c->head)
            c->tail = NULL;
        if (!c->closed && resp_buf_append(&c->out, h->buf.p, h->buf.len) < 0)
            resp__conn_fail(c);
        c->pending -= h->charge;
        resp_buf_free(&h->buf);
        free(h);
    }
    resp__mark_dirty(c);
}

void resp__mark_dirty(struct resp_conn *c)
{
    if (c->dirty || c->closed)
        return;
    c->dirty = true;
    c->dnext = c->srv->dirty;
    c->srv->dirty = c;
}

/* Flush every connection with new output (end of a loop pass). */
void resp__flush_dirty(struct resp_server *s)
{
    while (s->dirty) {
        struct resp_conn *c = s->dirty;
        s->dirty = c->dnext;
        c->dirty = false;
        conn_flush(c);
    }
}

/* ---- connections ---- */

static void conn_free(struct resp_conn *c)
{
    struct resp_slot *s = c->head;
    while (s) {
        struct resp_slot *n = s->next;
        resp_buf_free(&s->buf);
        free(s);
        s = n;
    }
    resp__session_free(c);
    resp_parser_deinit(&c->parser);
    resp_buf_free(&c->out);
    resp_buf_free(&c->wbuf);
    if (c->ssl)
        SSL_free(c->ssl);   /* frees its BIOs */
    free(c->flights);
    free(c->in);
    free(c);
}

static void on_closed(uv_handle_t *h)
{
    struct resp_conn *c = h->data;
    resp__loop_enter(c->srv);
    c->tcp.data = NULL;
    if (c->inflight == 0)
        conn_free(c);
    /* else the last call to finish frees it (resp__conn_release) */
}

void resp__conn_release(struct resp_conn *c)
{
    c->inflight--;
    if (c->closed && c->inflight == 0 && c->tcp.data == NULL)
        conn_free(c);
}

/* ---- the answered, awaited (be.pass_wait_ns) ---- */

void resp__answered(struct resp_conn *c)
{
    struct resp_server *s = c->srv;
    if (!s->answering || c->closed)
        return;
    if (s->answer_fresh) {   /* the first answer of this pass end */
        s->answer_fresh = false;
        s->answer_gen++;
        s->awaited = 0;
    }
    if (c->await_gen != s->answer_gen) {
        c->await_gen = s->answer_gen;
        s->awaited++;
    }
}

/* c dispatches a command, or is closed: no longer awaited. */
static void came_back(struct resp_conn *c)
{
    struct resp_server *s = c->srv;
    if (c->await_gen && c->await_gen == s->answer_gen)
        s->awaited--;
    c->await_gen = 0;
}

static void conn_close(struct resp_conn *c)
{
    if (c->closed)
        return;
    struct resp_server *s = c->srv;
    came_back(c);
    c->closed = true;
    if (c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    atomic_fetch_sub(&s->nconns, 1);
    metric_gauge_add(s->m_conns, -1);
    uv_close((uv_handle_t *)&c->tcp, on_closed);
}

void resp__conn_fail(struct resp_conn *c)
{
    if (!c->srv->in_place) {
        conn_close(c);
        return;
    }
    c->closing = true;   /* the loop closes it once its replies are out */
    resp__mark_dirty(c);
}

void resp__close_after_reply(struct resp_conn *c)
{
    c->closing = true;
    if (c->reading) {
        uv_read_stop((uv_stream_t *)&c->tcp);
        c->reading = false;
    }
    resp__mark_dirty(c);
}

static void on_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf)
{
    (void)hint;
    struct resp_conn *c = h->data;
    static __thread char tls_in[READ_CHUNK];
    resp__loop_enter(c->srv);
    if (c->ssl) {
        buf->base = tls_in;
        buf->len = sizeof tls_in;
        return;
    }
    if (in_reserve(c, READ_CHUNK / 4) < 0) {
        buf->base = NULL;
        buf->len = 0;
        return;
    }
    buf->base = c->in + c->in_len;
    buf->len = c->in_cap - c->in_len;
}

static void start_reading(struct resp_conn *c);

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    struct resp_conn *c = st->data;
    struct resp_server *s = c->srv;

    resp__loop_enter(s);
    if (nread == UV_ENOBUFS) {
        log_warn("resp: %s: out of memory for its input: closed", c->addr);
        conn_close(c);
        return;
    }
    if (nread < 0) {
        conn_close(c);
        flush_dirty(s);
        return;
    }
    if (nread == 0)
        return;
    c->last_ms = resp__now_ms();
    if (c->ssl) {
        if (BIO_write(c->rbio, buf->base, (int)nread) != (int)nread) {
            conn_close(c);
            return;
        }
        for (;;) {
            if (in_reserve(c, 16384) < 0) {
                conn_close(c);
                return;
            }
            int n = SSL_read(c->ssl, c->in + c->in_len,
                             (int)(c->in_cap - c->in_len > INT32_MAX ? INT32_MAX
                                                                    : c->in_cap - c->in_len));
            if (n > 0) {
                c->in_len += (size_t)n;
                continue;
            }
            int e = SSL_get_error(c->ssl, n);
            if (e == SSL_ERROR_WANT_READ)
                break;
            if (e != SSL_ERROR_ZERO_RETURN)
                log_debug("resp: %s: TLS: %s", c->addr,
                          ERR_reason_error_string(ERR_peek_last_error())
                              ? ERR_reason_error_string(ERR_peek_last_error())
                              : "handshake or record error");
            ERR_clear_error();
            /* Answer what the handshake wrote (an alert), then close. */
            tls_drain(c, &c->wbuf);
            if (c->wbuf.len && !c->writing) {
                uv_buf_t b = uv_buf_init(c->wbuf.p, (unsigned)c->wbuf.len);
                uv_try_write(st, &b, 1);
            }
            conn_close(c);
            return;
        }
        resp__mark_dirty(c);   /* handshake bytes to send */
    } else {
        c->in_len += (size_t)nread;
    }
    process(c);
    flush_dirty(s);
}

static void start_reading(struct resp_conn *c)
{
    if (c->reading || c->closing || c->closed)
        return;
    if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) == 0)
        c->reading = true;
}

static void on_written(uv_write_t *w, int status)
{
    struct resp_conn *c = w->data;
    resp__loop_enter(c->srv);
    c->writing = false;
    c->wbuf.len = 0;
    if (status < 0) {
        if (status != UV_ECANCELED)
            conn_close(c);
        return;
    }
    c->last_ms = resp__now_ms();
    conn_flush(c);
    flush_dirty(c->srv);
}

static void conn_flush(struct resp_conn *c)
{
    if (c->closed || c->writing)
        return;
    uv_stream_t *st = (uv_stream_t *)&c->tcp;
    if (c->ssl) {
        if (c->out.len) {
            int n = SSL_write(c->ssl, c->out.p, (int)c->out.len);
            if (n <= 0) {
                conn_close(c);
                return;
            }
            memmove(c->out.p, c->out.p + n, c->out.len - (size_t)n);
            c->out.len -= (size_t)n;
        }
        if (tls_drain(c, &c->wbuf) < 0) {
            conn_close(c);
            return;
        }
    } else if (c->out.len) {
        uv_buf_t b = uv_buf_init(c->out.p, (unsigned)c->out.len);
        int n = uv_try_write(st, &b, 1);
        if (n < 0 && n != UV_EAGAIN) {
            conn_close(c);
            return;
        }
        size_t done = n > 0 ? (size_t)n : 0;
        if (done)
            c->last_ms = resp__now_ms();
        if (done == c->out.len) {
            c->out.len = 0;
        } else {
            /* The rest goes with uv_write, from wbuf. */
            struct resp_buf t = c->wbuf;
            c->wbuf = c->out;
            c->out = t;
            c->out.len = 0;
            memmove(c->wbuf.p, c->wbuf.p + done, c->wbuf.len - done);
            c->wbuf.len -= done;
        }
    }
    if (c->wbuf.len) {
        uv_buf_t b = uv_buf_init(c->wbuf.p, (unsigned)c->wbuf.len);
        c->wreq.data = c;
        if (uv_write(&c->wreq, st, &b, 1, on_written) < 0) {
            conn_close(c);
            return;
        }
        c->writing = true;
        return;
    }
    if (c->closing && !c->head && c->inflight == 0) {
        conn_close(c);
        return;
    }
    /* The replies have drained: read again. */
    if (c->paused && !c->blocked && !over_budget(c)) {
        c->paused = false;
        process(c);   /* its replies mark c dirty again */
    }
}

/* Dispatch what the input holds, as far as the connection may go. */
static void process(struct resp_conn *c)
{
    struct resp_server *s = c->srv;

    c->t0_ns = resp__now_ns();
    while (!c->closing && !c->closed) {
        if (over_budget(c)) {
            c->paused = true;
            if (c->reading) {
                uv_read_stop((uv_stream_t *)&c->tcp);
                c->reading = false;
            }
            return;
        }
        if (c->exec_running) {
            struct resp_queued *q = &c->queue[c->exec_next];
            struct resp_args a = {q->argc, (const char **)q->argv, q->len};
            s->dispatched++;
            came_back(c);
            if (!resp__dispatch(c, &a)) {
                c->blocked = true;
                return;
            }
            if (++c->exec_next == c->nqueue) {
                resp__session_free(c);
                c->exec_running = false;
            }
            continue;
        }
        if (!c->parsed) {
            int rc = resp_parse(&c->parser, c->in + c->in_start, c->in_len - c->in_start);
            if (rc == RESP_PARSE_MORE)
                break;
            if (rc == RESP_PARSE_ERROR) {
                metric_add(s->m_proto_err, 1);
                struct resp_buf *b = resp__reply_buf(c);
                if (b)
                    resp_add_error(b, "ERR", c->parser.err);
                log_debug("resp: %s: %s: closed", c->addr, c->parser.err);
                resp__close_after_reply(c);
                return;
            }
            c->parsed = true;
        }
        struct resp_parser *p = &c->parser;
        if (!p->empty) {
            if (p->argc > s->acap) {
                size_t cap = s->acap ? s->acap : 64;
                while (cap < p->argc)
                    cap *= 2;
                const char **v = realloc(s->argv, cap * sizeof *v);
                size_t *l = v ? realloc(s->argl, cap * sizeof *l) : NULL;
                if (v)
                    s->argv = v;
                if (l)
                    s->argl = l;
                if (!v || !l) {
                    conn_close(c);
                    return;
                }
                s->acap = cap;
            }
            const char *base = c->in + c->in_start;
            for (size_t i = 0; i < p->argc; i++) {
                s->argv[i] = base + p->off[i];
                s->argl[i] = p->len[i];
            }
            struct resp_args a = {p->argc, s->argv, s->argl};
            s->dispatched++;
            came_back(c);
            if (!resp__dispatch(c, &a)) {
                c->blocked = true;
                return;
            }
        }
        c->in_start += p->used;
        c->parsed = false;
        resp_parser_reset(p);
    }
    if (c->in_start == c->in_len)
        c->in_start = c->in_len = 0;
    if (!c->closed && !c->closing && !c->blocked && !over_budget(c))
        start_reading(c);
}

void resp__resume(struct resp_conn *c)
{
    if (c->closed)
        return;
    c->blocked = false;
    process(c);
    resp__mark_dirty(c);
}

static void reject(struct resp_server *s, uv_stream_t *server)
{
    uv_tcp_t *t = malloc(sizeof *t);
    if (!t)
        return;
    uv_tcp_init(&s->loop, t);
    if (uv_accept(server, (uv_stream_t *)t) == 0) {
        static const char msg[] = "-ERR max number of clients reached\r\n";
        uv_buf_t b = uv_buf_init((char *)msg, sizeof msg - 1);
        uv_try_write((uv_stream_t *)t, &b, 1);
    }
    uv_close((uv_handle_t *)t, (uv_close_cb)free);
}

static void on_connection(uv_stream_t *server, int status)
{
    struct resp_server *s = server->data;
    resp__loop_enter(s);
    if (status < 0 || atomic_load(&s->stopping))
        return;
    if (atomic_load(&s->nconns) >= s->cfg.max_connections) {
        metric_add(s->m_rejected, 1);
        static uint64_t last_log;
        uint64_t now = resp__now_ms();
        if (now - last_log > 10000) {
            last_log = now;
            log_warn("resp: a connection past max_connections (%u) refused",
                     s->cfg.max_connections);
        }
        reject(s, server);
        return;
    }
    struct resp_conn *c = calloc(1, sizeof *c);
    if (!c) {
        reject(s, server);
        return;
    }
    c->srv = s;
    c->fd = -1;
    c->proto = 2;
    c->id = ++s->next_id;
    resp_parser_init(&c->parser, &s->lim);
    uv_tcp_init(&s->loop, &c->tcp);
    c->tcp.data = c;
    if (uv_accept(server, (uv_stream_t *)&c->tcp) != 0) {
        uv_close((uv_handle_t *)&c->tcp, (uv_close_cb)free);
        resp_parser_deinit(&c->parser);
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1);
    uv_os_fd_t fd;
    if (uv_fileno((uv_handle_t *)&c->tcp, &fd) == 0)
        c->fd = fd;
    struct sockaddr_storage ss;
    int sl = sizeof ss;
    if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&ss, &sl) == 0) {
        char host[48] = "?";
        int port = 0;
        if (ss.ss_family == AF_INET6) {
            uv_ip6_name((struct sockaddr_in6 *)&ss, host, sizeof host);
            port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
        } else {
            uv_ip4_name((struct sockaddr_in *)&ss, host, sizeof host);
            port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
        }
        snprintf(c->addr, sizeof c->addr, "%s:%d", host, port);
    }
    pthread_mutex_lock(&s->tls_mu);
    if (s->ssl_ctx) {
        c->ssl = SSL_new(s->ssl_ctx);
        c->rbio = BIO_new(BIO_s_mem());
        c->wbio = BIO_new(BIO_s_mem());
    }
    pthread_mutex_unlock(&s->tls_mu);
    if (s->ssl_ctx) {
        if (!c->ssl || !c->rbio || !c->wbio) {
            BIO_free(c->rbio);
            BIO_free(c->wbio);
            if (c->ssl)
                SSL_free(c->ssl);
            c->ssl = NULL;
            c->closed = true;
            uv_close((uv_handle_t *)&c->tcp, on_closed);
            return;
        }
        SSL_set_bio(c->ssl, c->rbio, c->wbio);
        SSL_set_accept_state(c->ssl);
    }
    c->authed = s->be.auth == NULL;
    c->who.role = c->authed ? RESP_ROLE_ADMIN : RESP_ROLE_NONE;
    c->last_ms = resp__now_ms();
    c->next = s->conns;
    if (s->conns)
        s->conns->prev = c;
    s->conns = c;
    atomic_fetch_add(&s->nconns, 1);
    metric_gauge_add(s->m_conns, 1);
    metric_add(s->m_conns_total, 1);
    start_reading(c);
}

/* ---- the loop ---- */

static void stop_now(struct resp_server *s);

static void on_wake(uv_async_t *a)
{
    struct resp_server *s = a->data;
    resp__loop_enter(s);
    pthread_mutex_lock(&s->qmu);
    struct resp_call_box *b = s->qhead;
    s->qhead = s->qtail = NULL;
    pthread_mutex_unlock(&s->qmu);
    uint64_t n_here = 0;
    s->finish_ns = b ? resp__now_ns() : 0;
    while (b) {
        struct resp_call_box *n = b->qnext;
        resp__call_finish(b);
        n_here++;
        b = n;
    }
    s->finish_ns = 0;
    if (n_here)
        metric_add(s->m_answered_loop, n_here);
    if (atomic_load(&s->stopping))
        stop_now(s);
    flush_dirty(s);
}

/* Append the calls head .. tail (tail->qnext NULL) to the loop's queue. */
static void queue_append(struct resp_server *s, struct resp_call_box *head,
                         struct resp_call_box *tail)
{
    pthread_mutex_lock(&s->qmu);
    if (s->qtail)
        s->qtail->qnext = head;
    else
        s->qhead = head;
    s->qtail = tail;
    pthread_mutex_unlock(&s->qmu);
}

void resp__call_post_list(struct resp_server *s, struct resp_call_box *head,
                          struct resp_call_box *tail)
{
    tail->qnext = NULL;
    queue_append(s, head, tail);
    uv_async_send(&s->wake);
}

/* ---- answering in place (be.answer_in_place) ---- */

void resp__loop_enter(struct resp_server *s)
{
    if (!s->loop_owned) {
        pthread_mutex_lock(&s->loop_mu);
        s->loop_owned = true;
    }
}

void resp__loop_leave(struct resp_server *s)
{
    if (s->loop_owned) {
        s->loop_owned = false;
        pthread_mutex_unlock(&s->loop_mu);
    }
}

/* Write c's output from this thread: true when nothing is left for the
 * loop to do for c (all written, or c closed), false when the loop must
 * flush it (TLS, a write under way, closing, paused, a short or failed
 * send: the loop's own write then meets the error). */
static bool flush_here(struct resp_conn *c)
{
    if (c->closed)
        return true;
    if (c->writing || c->ssl || c->closing || c->paused || c->fd < 0)
        return false;
    if (!c->out.len)
        return true;
    ssize_t n = send(c->fd, c->out.p, c->out.len, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n <= 0)
        return false;
    c->last_ms = resp__now_ms();
    if ((size_t)n < c->out.len) {
        memmove(c->out.p, c->out.p + n, c->out.len - (size_t)n);
        c->out.len -= (size_t)n;
        return false;
    }
    c->out.len = 0;
    return true;
}

void resp__answer_here(struct resp_server *s, struct resp_call_box *head)
{
    struct resp_call_box *back = NULL, *btail = NULL, *b, *n;

    if (!head)
        return;
    /* Calls of many connections (an answer to a group that joined their
     * commands) go to the loop: it writes their replies in the pass that
     * reads their next commands, and this thread goes back to the next
     * answer instead of making a send() for each. */
    unsigned conns = 0;
    struct resp_conn *last = NULL;
    for (b = head; b && conns <= RESP_IN_PLACE_CONNS; b = b->qnext)
        if (b->conn != last) {
            last = b->conn;
            conns++;
        }
    if (!s->be.answer_in_place || conns > RESP_IN_PLACE_CONNS ||
        atomic_load(&s->stopping) || pthread_mutex_trylock(&s->loop_mu) != 0) {
        for (btail = head; btail->qnext; btail = btail->qnext)
            ;
        resp__call_post_list(s, head, btail);
        return;
    }
    /* The loop is in its poll (or about to be): its state is ours. */
    s->in_place = true;
    s->finish_ns = resp__now_ns();
    uint64_t n_here = 0;
    for (b = head; b; b = n) {
        n = b->qnext;
        struct resp_conn *c = b->conn;
        /* A blocked connection resumes (dispatches: the loop's work), a
         * closed one may be freed, a call of the pool is the loop's. */
        if (!c || c->closed || c->blocked || b->bounded || b->in_start ||
            atomic_load(&b->work_state) != 0) {
            b->qnext = NULL;
            if (btail)
                btail->qnext = b;
            else
                back = b;
            btail = b;
            continue;
        }
        resp__call_finish(b);
        n_here++;
    }
    s->finish_ns = 0;
    if (n_here)   /* counted before the replies leave */
        metric_add(s->m_answered_in_place, n_here);
    /* Write what they answered; what cannot be written here stays dirty
     * for the loop. */
    struct resp_conn *left = NULL, *c;
    while ((c = s->dirty)) {
        s->dirty = c->dnext;
        c->dirty = false;
        if (!flush_here(c) && !c->closed) {
            c->dirty = true;
            c->dnext = left;
            left = c;
        }
    }
    s->dirty = left;
    bool wake = left || back || atomic_load(&s->stopping);
    s->in_place = false;
    if (back)
        queue_append(s, back, btail);
    /* The wake handle is open: it closes only once no call is in flight,
     * and the loop cannot close it while this thread holds its state. */
    if (wake)
        uv_async_send(&s->wake);
    pthread_mutex_unlock(&s->loop_mu);
}

static void on_idle(uv_timer_t *t)
{
    struct resp_server *s = t->data;
    resp__loop_enter(s);
    uint64_t now = resp__now_ms();
    struct resp_conn *c = s->conns;
    while (c) {
        struct resp_conn *n = c->next;
        if (c->inflight == 0 && now - c->last_ms >= s->cfg.idle_ms) {
            log_debug("resp: %s: idle for %llu ms: closed", c->addr,
                      (unsigned long long)(now - c->last_ms));
            conn_close(c);
        }
        c = n;
    }
}

static void stop_now(struct resp_server *s)
{
    if (s->running) {
        s->running = false;
        uv_close((uv_handle_t *)&s->listener, NULL);
        if (s->cfg.idle_ms)
            uv_close((uv_handle_t *)&s->idle, NULL);
        while (s->conns)
            conn_close(s->conns);
    }
    if (s->calls == 0 && !uv_is_closing((uv_handle_t *)&s->wake)) {
        uv_close((uv_handle_t *)&s->wake, NULL);
        uv_close((uv_handle_t *)&s->slow_timer, NULL);
        uv_close((uv_handle_t *)&s->pass, NULL);
        if (s->be.pass_end && (s->be.pass_drain || s->be.pass_wait_ns))
            uv_close((uv_handle_t *)&s->drain, NULL);
    }
}

static void on_drain(uv_idle_t *h)
{
    (void)h;   /* active, it makes the next poll not wait */
}

/* Waiting for the answered (be.pass_wait_ns): while connections the last
 * pass end answered have not come back and its bound has not passed, wait
 * until the loop's poll has something (any handle: a command, a call
 * finished elsewhere, a stop) or the bound passes.  True when something
 * came: the loop then polls (at once) and the pass goes on. */
static bool wait_answered(struct resp_server *s)
{
    if (!s->be.pass_wait_ns || !s->awaited || !s->running ||
        atomic_load(&s->stopping) || !s->be.pass_held(s->be.arg))
        return false;
    uint64_t now = resp__now_ns();
    if (now >= s->wait_until_ns)
        return false;
    uint64_t left = s->wait_until_ns - now;
    struct timespec ts = {(time_t)(left / 1000000000u), (long)(left % 1000000000u)};
    struct pollfd pfd = {.fd = uv_backend_fd(&s->loop), .events = POLLIN};
    int rc;
    while ((rc = ppoll(&pfd, 1, &ts, NULL)) < 0 && errno == EINTR)
        ;
    return rc > 0;
}

/* Before the loop polls: what is answered is written first (the
 * backend's pass end may take a while: the node commits the pass's
 * writes here), then the backend starts the calls it held back to join
 * them, and what they answered is written.  Writing may let paused
 * connections dispatch more (from input already read): then again. */
static void pass_end(struct resp_server *s)
{
    uint64_t d;
    flush_dirty(s);
    /* Draining (be.pass_drain): while the backend holds calls and the
     * last pass brought commands, look once more for input without
     * sleeping before ending the pass, at most pass_drain times. */
    if (s->be.pass_drain && s->running && s->dispatched != s->drain_mark &&
        s->drains < s->be.pass_drain && s->be.pass_held(s->be.arg)) {
        s->drain_mark = s->dispatched;
        if (s->drains++ == 0)
            uv_idle_start(&s->drain, on_drain);
        return;
    }
    if (s->drains || s->wait_idle) {
        s->drains = 0;
        s->wait_idle = false;
        uv_idle_stop(&s->drain);
    }
    if (wait_answered(s)) {
        /* The poll must not sleep past the bound (what woke this wait
         * may be nothing the loop acts on): this callback runs again. */
        s->wait_idle = true;
        uv_idle_start(&s->drain, on_drain);
        return;
    }
    /* The bound of the wait for the clients answered here is asked before
     * their replies are written, and runs from when they are. */
    uint64_t bound = 0;
    s->answering = true;
    s->answer_fresh = true;
    do {
        d = s->dispatched;
        s->be.pass_end(s->be.arg);
        if (!s->answer_fresh && s->be.pass_wait_ns)
            bound = s->be.pass_wait_ns(s->be.arg);
        flush_dirty(s);
    } while (d != s->dispatched && s->running);
    s->answering = false;
    if (!s->answer_fresh)
        s->wait_until_ns = resp__now_ns() + bound;
    s->drain_mark = s->dispatched;
}

/* Before every poll: the backend's pass end, then the loop lets its state
 * go while it waits for I/O. */
static void on_prepare(uv_prepare_t *p)
{
    struct resp_server *s = p->data;
    resp__loop_enter(s);
    if (s->be.pass_end)
        pass_end(s);
    else
        flush_dirty(s);
    resp__loop_leave(s);
}

void resp__calls_changed(struct resp_server *s)
{
    /* Answering in place: the loop stops, woken by resp__answer_here. */
    if (!s->in_place && atomic_load(&s->stopping) && s->calls == 0)
        stop_now(s);
}

static void *loop_main(void *arg)
{
    struct resp_server *s = arg;
    uv_run(&s->loop, UV_RUN_DEFAULT);
    resp__loop_leave(s);
    return NULL;
}

/* host:port into a socket address ("localhost" is 127.0.0.1). */
static int parse_addr(const char *addr, struct sockaddr_storage *ss, char *err)
{
    char host[256];
    const char *colon = strrchr(addr, ':');
    if (!colon || colon == addr || (size_t)(colon - addr) >= sizeof host) {
        snprintf(err, RESP_SERVER_ERRLEN, "resp_listen = %s: not host:port", addr);
        return -EINVAL;
    }
    memcpy(host, addr, (size_t)(colon - addr));
    host[colon - addr] = 0;
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (*end || port < 0 || port > 65535) {
        snprintf(err, RESP_SERVER_ERRLEN, "resp_listen = %s: bad port", addr);
        return -EINVAL;
    }
    if (host[0] == '[' && host[strlen(host) - 1] == ']') {
        memmove(host, host + 1, strlen(host));
        host[strlen(host) - 1] = 0;
    }
    if (strcmp(host, "localhost") == 0)
        snprintf(host, sizeof host, "127.0.0.1");
    memset(ss, 0, sizeof *ss);
    if (uv_ip4_addr(host, (int)port, (struct sockaddr_in *)ss) == 0)
        return 0;
    if (uv_ip6_addr(host, (int)port, (struct sockaddr_in6 *)ss) == 0)
        return 0;
    snprintf(err, RESP_SERVER_ERRLEN, "resp_listen = %s: %s is not an IP address",
             addr, host);
    return -EINVAL;
}

struct resp_server *resp_server_create(const struct resp_server_config *cfg,
                                       const struct resp_backend *be, char *err)
{
    struct resp_server *s = calloc(1, sizeof *s);
    struct sockaddr_storage ss;
    if (!s) {
        snprintf(err, RESP_SERVER_ERRLEN, "out of memory");
        return NULL;
    }
    s->cfg = *cfg;
    s->be = *be;
    if (!s->be.pass_end || !s->be.pass_held) {
        s->be.pass_drain = 0;
        s->be.pass_wait_ns = NULL;
    }
    snprintf(s->listen, sizeof s->listen, "%s", cfg->listen);
    snprintf(s->prog, sizeof s->prog, "%s", cfg->prog ? cfg->prog : "bloomgrid");
    snprintf(s->version, sizeof s->version, "%s", cfg->version ? cfg->version : "");
    s->cfg.listen = s->listen;
    s->cfg.prog = s->prog;
    s->cfg.version = s->version;
    s->cfg.tls_cert_pem = s->cfg.tls_key_pem = NULL;
    if (!s->cfg.max_connections)
        s->cfg.max_connections = 10000;
    if (!s->cfg.pipeline_bytes)
        s->cfg.pipeline_bytes = 4u << 20;
    s->lim.max_args = cfg->max_args;
    s->lim.max_bulk = cfg->max_bulk;
    s->lim.max_command = cfg->max_command;
    pthread_mutex_init(&s->qmu, NULL);
    pthread_mutex_init(&s->tls_mu, NULL);
    pthread_mutex_init(&s->loop_mu, NULL);
    if (parse_addr(cfg->listen, &ss, err) < 0)
        goto fail;
    if (cfg->tls_cert_pem && cfg->tls_key_pem &&
        !(s->ssl_ctx = tls_ctx_make(cfg->tls_cert_pem, cfg->tls_key_pem, err)))
        goto fail;
    struct metrics *m = metrics_registry();
    s->m_conns = metrics_gauge(m, "bloomgrid_resp_connections",
                               "RESP connections open now", NULL);
    s->m_conns_total = metrics_counter(m, "bloomgrid_resp_connections_total",
                                       "RESP connections accepted", NULL);
    const char *rl[] = {"reason", "max_connections", NULL};
    s->m_rejected = metrics_counter(m, "bloomgrid_resp_rejected_connections_total",
                                    "RESP connections refused, by reason", rl);
    s->m_proto_err = metrics_counter(m, "bloomgrid_resp_protocol_errors_total",
                                     "RESP connections closed for a malformed or "
                                     "oversized command", NULL);
    const char *al[] = {"where", "loop", NULL};
    s->m_answered_loop = metrics_counter(m, "bloomgrid_resp_answers_total",
                                         "RESP calls finished on another thread, by "
                                         "where their replies were made: by the loop, "
                                         "or in place by the thread that finished them",
                                         al);
    const char *ah[] = {"where", "in_place", NULL};
    s->m_answered_in_place = metrics_counter(m, "bloomgrid_resp_answers_total",
                                             "RESP calls finished on another thread, "
                                             "by where their replies were made: by the "
                                             "loop, or in place by the thread that "
                                             "finished them", ah);
    resp__commands_init(s);
    return s;
fail:
    pthread_mutex_destroy(&s->qmu);
    pthread_mutex_destroy(&s->tls_mu);
    pthread_mutex_destroy(&s->loop_mu);
    free(s);
    return NULL;
}

int resp_server_start(struct resp_server *s, char *err)
{
    struct sockaddr_storage ss;
    int rc;

    if (parse_addr(s->cfg.listen, &ss, err) < 0)
        return -EINVAL;
    if ((rc = uv_loop_init(&s->loop)) < 0) {
        snprintf(err, RESP_SERVER_ERRLEN, "event loop: %s", uv_strerror(rc));
        return rc;
    }
    uv_tcp_init(&s->loop, &s->listener);
    s->listener.data = s;
    if ((rc = uv_tcp_bind(&s->listener, (struct sockaddr *)&ss, 0)) < 0 ||
        (rc = uv_listen((uv_stream_t *)&s->listener, 511, on_connection)) < 0) {
        snprintf(err, RESP_SERVER_ERRLEN, "resp_listen = %s: cannot listen: %s",
                 s->cfg.listen, uv_strerror(rc));
        uv_close((uv_handle_t *)&s->listener, NULL);
        uv_run(&s->loop, UV_RUN_DEFAULT);
        uv_loop_close(&s->loop);
        return rc;
    }
    struct sockaddr_storage bound;
    int bl = sizeof bound;
    uv_tcp_getsockname(&s->listener, (struct sockaddr *)&bound, &bl);
    int port = bound.ss_family == AF_INET6
                   ? ntohs(((struct sockaddr_in6 *)&bound)->sin6_port)
                   : ntohs(((struct sockaddr_in *)&bound)->sin_port);
    atomic_store(&s->port, port);
    uv_async_init(&s->loop, &s->wake, on_wake);
    s->wake.data = s;
    uv_timer_init(&s->loop, &s->slow_timer);
    s->slow_timer.data = s;
    uv_prepare_init(&s->loop, &s->pass);
    s->pass.data = s;
    uv_prepare_start(&s->pass, on_prepare);
    if (s->be.pass_end) {
        if (s->be.pass_drain || s->be.pass_wait_ns) {
            uv_idle_init(&s->loop, &s->drain);
            s->drain.data = s;
        }
    }
    if (s->cfg.idle_ms) {
        uint64_t every = s->cfg.idle_ms / 4;
        if (every > 1000)
            every = 1000;
        if (every < 10)
            every = 10;
        uv_timer_init(&s->loop, &s->idle);
        s->idle.data = s;
        uv_timer_start(&s->idle, on_idle, every, every);
    }
    s->running = true;
    s->started_s = (uint64_t)time(NULL);
    if (pthread_create(&s->thread, NULL, loop_main, s) != 0) {
        snprintf(err, RESP_SERVER_ERRLEN, "cannot start the RESP loop thread");
        return -EAGAIN;
    }
    s->started = true;
    return port;
}

int resp_server_port(const struct resp_server *s)
{
    return atomic_load(&s->port);
}

unsigned resp_server_connections(const struct resp_server *s)
{
    return atomic_load(&s->nconns);
}

void resp_server_stop(struct resp_server *s)
{
    if (!s || !s->started)
        return;
    atomic_store(&s->stopping, true);
    uv_async_send(&s->wake);
    pthread_join(s->thread, NULL);
    uv_loop_close(&s->loop);
    s->started = false;
}

void resp_server_destroy(struct resp_server *s)
{
    if (!s)
        return;
    resp_server_stop(s);
    while (s->box_cache) {
        struct resp_call_box *b = s->box_cache;
        s->box_cache = b->qnext;
        free(b);
    }
    SSL_CTX_free(s->ssl_ctx);
    free(s->argv);
    free(s->argl);
    pthread_mutex_destroy(&s->qmu);
    pthread_mutex_destroy(&s->tls_mu);
    pthread_mutex_destroy(&s->loop_mu);
    free(s);
}
