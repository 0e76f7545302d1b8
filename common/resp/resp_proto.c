/* resp_proto: the RESP request parser and reply writer (resp_proto.h).
 *
 * The parser is a small state machine over the bytes of one command:
 * START decides between an array and an inline command, then each
 * argument is a header line ("$L\r\n") followed by L bytes and CRLF.
 * Header lines are at most HDR_MAX bytes, so a client cannot make the
 * parser scan far for a line end; numbers are checked before use.
 */
#include "resp_proto.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { ST_START, ST_BULK_HDR, ST_BULK_DATA };

#define HDR_MAX 32          /* "*4294967295\r\n" and then some */

void resp_parser_init(struct resp_parser *p, const struct resp_limits *lim)
{
    memset(p, 0, sizeof *p);
    p->lim = lim;
}

void resp_parser_deinit(struct resp_parser *p)
{
    free(p->off);
    free(p->len);
    p->off = p->len = NULL;
    p->cap = 0;
}

void resp_parser_reset(struct resp_parser *p)
{
    p->pos = 0;
    p->state = ST_START;
    p->nargs = p->bulk = p->argc = p->used = 0;
    p->empty = false;
    p->err[0] = 0;
}

static int fail(struct resp_parser *p, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static int fail(struct resp_parser *p, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->err, sizeof p->err, fmt, ap);
    va_end(ap);
    return RESP_PARSE_ERROR;
}

/* Append argument (off, len); false when out of memory. */
static bool push_arg(struct resp_parser *p, size_t off, size_t len)
{
    if (p->argc == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 16;
        size_t *o = realloc(p->off, cap * sizeof *o);
        if (!o)
            return false;
        p->off = o;
        size_t *l = realloc(p->len, cap * sizeof *l);
        if (!l)
            return false;
        p->len = l;
        p->cap = cap;
    }
    p->off[p->argc] = off;
    p->len[p->argc] = len;
    p->argc++;
    return true;
}

/* The header line at buf[pos]: its number after the type byte, and the
 * position after its CRLF.  1 found, 0 incomplete, -1 malformed. */
static int header(const char *buf, size_t len, size_t pos, long long *num, size_t *next)
{
    size_t end = len - pos < HDR_MAX ? len : pos + HDR_MAX;
    const char *cr = memchr(buf + pos, '\r', end - pos);
    if (!cr)
        return end - pos >= HDR_MAX ? -1 : 0;
    size_t at = (size_t)(cr - buf);
    if (at + 1 >= len)
        return 0;
    if (buf[at + 1] != '\n')
        return -1;
    const char *s = buf + pos + 1, *e = cr;
    bool neg = false;
    long long v = 0;
    if (s < e && *s == '-') {
        neg = true;
        s++;
    }
    if (s == e)
        return -1;
    for (; s < e; s++) {
        if (*s < '0' || *s > '9' || v > (LLONG_MAX - 9) / 10)
            return -1;
        v = v * 10 + (*s - '0');
    }
    *num = neg ? -v : v;
    *next = at + 2;
    return 1;
}

static int parse_inline(struct resp_parser *p, const char *buf, size_t len)
{
    size_t lim = RESP_INLINE_MAX < p->lim->max_command ? RESP_INLINE_MAX
                                                       : p->lim->max_command;
    const char *nl = memchr(buf, '\n', len < lim ? len : lim);
    if (!nl)
        return len >= lim ? fail(p, "Protocol error: too big inline request")
                          : RESP_PARSE_MORE;
    size_t end = (size_t)(nl - buf);
    p->used = end + 1;
    if (end > 0 && buf[end - 1] == '\r')
        end--;
    p->argc = 0;
    for (size_t i = 0; i < end;) {
        while (i < end && (buf[i] == ' ' || buf[i] == '\t'))
            i++;
        if (i == end)
            break;
        size_t start = i, stop;
        if (buf[i] == '"' || buf[i] == '\'') {
            char q = buf[i++];
            start = i;
            while (i < end && buf[i] != q)
                i++;
            if (i == end)
                return fail(p, "Protocol error: unbalanced quotes in request");
            stop = i++;
            if (i < end && buf[i] != ' ' && buf[i] != '\t')
                return fail(p, "Protocol error: unbalanced quotes in request");
        } else {
            while (i < end && buf[i] != ' ' && buf[i] != '\t')
                i++;
            stop = i;
        }
        if (p->argc >= p->lim->max_args)
            return fail(p, "Protocol error: inline command of more than %zu "
                        "arguments", p->lim->max_args);
        if (stop - start > p->lim->max_bulk)
            return fail(p, "Protocol error: invalid bulk length: an inline "
                        "argument of %zu bytes, more than the %zu allowed",
                        stop - start, p->lim->max_bulk);
        if (!push_arg(p, start, stop - start))
            return fail(p, "out of memory");
    }
    p->empty = p->argc == 0;
    return RESP_PARSE_DONE;
}

int resp_parse(struct resp_parser *p, const char *buf, size_t len)
{
    long long v;
    size_t next;
    int rc;

    if (p->state == ST_START) {
        if (len == 0)
            return RESP_PARSE_MORE;
        if (buf[0] != '*')
            return parse_inline(p, buf, len);
        rc = header(buf, len, 0, &v, &next);
        if (rc == 0)
            return RESP_PARSE_MORE;
        if (rc < 0)
            return fail(p, "Protocol error: invalid multibulk length");
        if (v <= 0) {
            p->used = next;
            p->empty = true;
            return RESP_PARSE_DONE;
        }
        if ((unsigned long long)v > p->lim->max_args)
            return fail(p, "Protocol error: invalid multibulk length: %lld "
                        "arguments, more than the %zu allowed", v, p->lim->max_args);
        p->nargs = (size_t)v;
        p->argc = 0;
        p->pos = next;
        p->state = ST_BULK_HDR;
    }
    for (;;) {
        if (p->state == ST_BULK_HDR) {
            if (p->argc == p->nargs) {
                p->used = p->pos;
                return RESP_PARSE_DONE;
            }
            if (p->pos >= len)
                return RESP_PARSE_MORE;
            if (buf[p->pos] != '$')
                return fail(p, "Protocol error: expected '$', got '%c'",
                            isprint((unsigned char)buf[p->pos]) ? buf[p->pos] : '?');
            rc = header(buf, len, p->pos, &v, &next);
            if (rc == 0)
                return RESP_PARSE_MORE;
            if (rc < 0 || v < 0)
                return fail(p, "Protocol error: invalid bulk length");
            if ((unsigned long long)v > p->lim->max_bulk)
                return fail(p, "Protocol error: invalid bulk length: %lld bytes, "
                            "more than the %zu allowed", v, p->lim->max_bulk);
            if (next + (size_t)v + 2 > p->lim->max_command)
                return fail(p, "Protocol error: command longer than the %zu "
                            "bytes allowed", p->lim->max_command);
            p->bulk = (size_t)v;
            p->pos = next;
            p->state = ST_BULK_DATA;
        }
        /* ST_BULK_DATA */
        if (len - p->pos < p->bulk + 2)
            return RESP_PARSE_MORE;
        if (buf[p->pos + p->bulk] != '\r' || buf[p->pos + p->bulk + 1] != '\n')
            return fail(p, "Protocol error: bulk string not ended by CRLF");
        if (!push_arg(p, p->pos, p->bulk))
            return fail(p, "out of memory");
        p->pos += p->bulk + 2;
        p->state = ST_BULK_HDR;
    }
}

/* ---- replies ---- */

void resp_buf_init(struct resp_buf *b)
{
    memset(b, 0, sizeof *b);
}

void resp_buf_free(struct resp_buf *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

int resp_buf_reserve(struct resp_buf *b, size_t n)
{
    if (b->cap - b->len >= n)
        return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap - b->len < n)
        cap *= 2;
    char *q = realloc(b->p, cap);
    if (!q) {
        b->oom = true;
        return -ENOMEM;
    }
    b->p = q;
    b->cap = cap;
    return 0;
}

int resp_buf_append(struct resp_buf *b, const void *p, size_t n)
{
    if (resp_buf_reserve(b, n) < 0)
        return -ENOMEM;
    if (n)
        memcpy(b->p + b->len, p, n);
    b->len += n;
    return 0;
}

/* type byte, text cleaned of CR/LF, CRLF */
static int add_line(struct resp_buf *b, char type, const char *prefix, const char *s)
{
    size_t pl = prefix ? strlen(prefix) : 0, sl = strlen(s);
    if (resp_buf_reserve(b, pl + sl + 4) < 0)
        return -ENOMEM;
    char *o = b->p + b->len;
    *o++ = type;
    if (pl) {
        memcpy(o, prefix, pl);
        o += pl;
        if (sl)
            *o++ = ' ';
    }
    for (size_t i = 0; i < sl; i++)
        *o++ = s[i] == '\r' || s[i] == '\n' ? ' ' : s[i];
    *o++ = '\r';
    *o++ = '\n';
    b->len = (size_t)(o - b->p);
    return 0;
}

int resp_add_simple(struct resp_buf *b, const char *s)
{
    return add_line(b, '+', NULL, s);
}

int resp_add_error(struct resp_buf *b, const char *prefix, const char *text)
{
    return add_line(b, '-', prefix, text ? text : "");
}

int resp_add_errorf(struct resp_buf *b, const char *prefix, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return resp_add_error(b, prefix, msg);
}

static int add_num(struct resp_buf *b, char type, long long v)
{
    if (resp_buf_reserve(b, 24) < 0)
        return -ENOMEM;
    char *o = b->p + b->len;
    char tmp[24];
    int n = 0;
    unsigned long long u = v < 0 ? 0ull - (unsigned long long)v : (unsigned long long)v;
    do {
        tmp[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    *o++ = type;
    if (v < 0)
        *o++ = '-';
    while (n)
        *o++ = tmp[--n];
    *o++ = '\r';
    *o++ = '\n';
    b->len = (size_t)(o - b->p);
    return 0;
}

int resp_add_int(struct resp_buf *b, long long v)
{
    /* The common replies of BF.ADD and BF.EXISTS, without formatting. */
    if (v == 0 || v == 1)
        return resp_buf_append(b, v ? ":1\r\n" : ":0\r\n", 4);
    return add_num(b, ':', v);
}

int resp_add_bool(struct resp_buf *b, int proto, bool v)
{
    if (proto >= 3)
        return resp_buf_append(b, v ? "#t\r\n" : "#f\r\n", 4);
    return resp_buf_append(b, v ? ":1\r\n" : ":0\r\n", 4);
}

int resp_add_bulk(struct resp_buf *b, const void *p, size_t n)
{
    if (add_num(b, '$', (long long)n) < 0 || resp_buf_append(b, p, n) < 0 ||
        resp_buf_append(b, "\r\n", 2) < 0)
        return -ENOMEM;
    return 0;
}

int resp_add_bulk_str(struct resp_buf *b, const char *s)
{
    return resp_add_bulk(b, s, strlen(s));
}

int resp_add_verbatim(struct resp_buf *b, int proto, const char *s)
{
    if (proto < 3)
        return resp_add_bulk_str(b, s);
    size_t n = strlen(s);
    if (add_num(b, '=', (long long)n + 4) < 0 || resp_buf_append(b, "txt:", 4) < 0 ||
        resp_buf_append(b, s, n) < 0 || resp_buf_append(b, "\r\n", 2) < 0)
        return -ENOMEM;
    return 0;
}

int resp_add_null(struct resp_buf *b, int proto)
{
    return proto >= 3 ? resp_buf_append(b, "_\r\n", 3) : resp_buf_append(b, "$-1\r\n", 5);
}

int resp_add_null_array(struct resp_buf *b, int proto)
{
    return proto >= 3 ? resp_buf_append(b, "_\r\n", 3) : resp_buf_append(b, "*-1\r\n", 5);
}

int resp_add_array(struct resp_buf *b, size_t n)
{
    return add_num(b, '*', (long long)n);
}

int resp_add_map(struct resp_buf *b, int proto, size_t n)
{
    return proto >= 3 ? add_num(b, '%', (long long)n) : add_num(b, '*', (long long)n * 2);
}

int resp_add_set(struct resp_buf *b, int proto, size_t n)
{
    return add_num(b, proto >= 3 ? '~' : '*', (long long)n);
}

int resp_add_double(struct resp_buf *b, int proto, double v)
{
    char s[64];
    snprintf(s, sizeof s, "%.17g", v);
    if (proto < 3)
        return resp_add_bulk_str(b, s);
    return add_line(b, ',', NULL, s);
}

bool resp_arg_is(const char *arg, size_t len, const char *word)
{
    return strlen(word) == len && strncasecmp(arg, word, len) == 0;
}

/* arg[0..len) as a C string in tmp (of size), or false when empty or too
 * long to be a number. */
static bool arg_cstr(const char *arg, size_t len, char *tmp, size_t size)
{
    if (len == 0 || len >= size)
        return false;
    memcpy(tmp, arg, len);
    tmp[len] = 0;
    return true;
}

int resp_arg_ll(const char *arg, size_t len, long long *out)
{
    char tmp[32];
    if (!arg_cstr(arg, len, tmp, sizeof tmp))
        return -EINVAL;
    char *end;
    errno = 0;
    long long v = strtoll(tmp, &end, 10);
    if (errno || *end || isspace((unsigned char)tmp[0]))
        return -EINVAL;
    *out = v;
    return 0;
}

int resp_arg_double(const char *arg, size_t len, double *out)
{
    char tmp[64];
    if (!arg_cstr(arg, len, tmp, sizeof tmp))
        return -EINVAL;
    char *end;
    errno = 0;
    double v = strtod(tmp, &end);
    if (errno || *end || isspace((unsigned char)tmp[0]) || !isfinite(v))
        return -EINVAL;
    *out = v;
    return 0;
}
