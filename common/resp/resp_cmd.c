/* resp_cmd: the command table and dispatch of the Redis door, and the
 * commands of the connection itself: PING, ECHO, HELLO, AUTH, CLIENT,
 * SELECT, COMMAND, INFO, QUIT, RESET, MULTI, EXEC, DISCARD, UNWATCH.  The
 * BF.* commands and DEL are in resp_bf.c.
 *
 * Dispatch checks, in Redis's order: a MULTI queues (refusing an unknown
 * command or a wrong arity, which then aborts the EXEC); the command
 * exists; its arity; authentication (NOAUTH); the token still holds its
 * role (a SIGHUP may have removed it); the role (NOPERM); then, for a
 * command on a filter, whether it must wait for an earlier command of the
 * connection (resp_bf.c), and only then it runs.
 */
#include "resp_internal.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"

static void reply_err(struct resp_conn *c, const char *prefix, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void reply_err(struct resp_conn *c, const char *prefix, const char *fmt, ...)
{
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    c->cmd_error = true;
    struct resp_buf *b = resp__reply_buf(c);
    if (b)
        resp_add_error(b, prefix, msg);
}

void resp__err(struct resp_conn *c, const char *prefix, const char *fmt, ...)
{
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    reply_err(c, prefix, "%s", msg);
}

/* A printable copy of an argument for messages (cut, control bytes as ?). */
static const char *shown(const char *s, size_t n, char *buf, size_t cap)
{
    size_t k = 0;
    for (size_t i = 0; i < n && k + 4 < cap; i++)
        buf[k++] = (s[i] >= 32 && s[i] < 127 && s[i] != '\'') ? s[i] : '?';
    if (n && k < n && k + 4 <= cap) {
        memcpy(buf + k, "...", 3);
        k += 3;
    }
    buf[k] = 0;
    return buf;
}

static struct resp_buf *out(struct resp_conn *c)
{
    return resp__reply_buf(c);
}

/* ---- PING, ECHO, SELECT, QUIT, RESET ---- */

static void cmd_ping(struct resp_conn *c, const struct resp_args *a)
{
    struct resp_buf *b = out(c);
    if (!b)
        return;
    if (a->argc == 2)
        resp_add_bulk(b, a->argv[1], a->argl[1]);
    else
        resp_add_simple(b, "PONG");
}

static void cmd_echo(struct resp_conn *c, const struct resp_args *a)
{
    struct resp_buf *b = out(c);
    if (b)
        resp_add_bulk(b, a->argv[1], a->argl[1]);
}

static void cmd_select(struct resp_conn *c, const struct resp_args *a)
{
    long long db;
    if (resp_arg_ll(a->argv[1], a->argl[1], &db) < 0) {
        reply_err(c, "ERR", "value is not an integer or out of range");
        return;
    }
    if (db != 0) {
        reply_err(c, "ERR", "DB index is out of range (bloomgrid serves database 0 "
                  "only)");
        return;
    }
    struct resp_buf *b = out(c);
    if (b)
        resp_add_simple(b, "OK");
}

static void cmd_quit(struct resp_conn *c, const struct resp_args *a)
{
    (void)a;
    struct resp_buf *b = out(c);
    if (b)
        resp_add_simple(b, "OK");
    resp__close_after_reply(c);
}

static void session_reset(struct resp_conn *c)
{
    resp__session_free(c);
    c->multi = c->multi_dirty = false;
    c->proto = 2;
    c->name[0] = 0;
    c->db = 0;
    if (c->srv->be.auth) {
        c->authed = false;
        memset(&c->who, 0, sizeof c->who);
    }
}

static void cmd_reset(struct resp_conn *c, const struct resp_args *a)
{
    (void)a;
    session_reset(c);
    struct resp_buf *b = out(c);
    if (b)
        resp_add_simple(b, "RESET");
}

/* ---- AUTH, HELLO ---- */

/* Check a token: 0 (the connection is authenticated with its role) or -1
 * with the error replied. */
static int do_auth(struct resp_conn *c, const char *pass, size_t plen)
{
    struct resp_server *s = c->srv;
    struct resp_who who;
    if (!s->be.auth) {
        reply_err(c, "ERR", "AUTH <password> called without any password "
                  "configured for the default user. Are you sure your "
                  "configuration is correct?");
        return -1;
    }
    memset(&who, 0, sizeof who);
    if (s->be.auth(s->be.auth_arg, pass, plen, &who) < 0) {
        reply_err(c, "WRONGPASS", "invalid username-password pair or user is "
                  "disabled.");
        return -1;
    }
    c->who = who;
    c->authed = true;
    return 0;
}

static void cmd_auth(struct resp_conn *c, const struct resp_args *a)
{
    if (a->argc > 3) {
        reply_err(c, "ERR", "syntax error");
        return;
    }
    /* AUTH token, or AUTH user token: the user name is not checked (a
     * token alone says who the caller is). */
    if (do_auth(c, a->argv[a->argc - 1], a->argl[a->argc - 1]) == 0) {
        struct resp_buf *b = out(c);
        if (b)
            resp_add_simple(b, "OK");
    }
}

static void hello_reply(struct resp_conn *c)
{
    struct resp_server *s = c->srv;
    struct resp_buf *b = out(c);
    if (!b)
        return;
    resp_add_map(b, c->proto, 7);
    resp_add_bulk_str(b, "server");
    resp_add_bulk_str(b, "bloomgrid");
    resp_add_bulk_str(b, "version");
    resp_add_bulk_str(b, s->version[0] ? s->version : "0");
    resp_add_bulk_str(b, "proto");
    resp_add_int(b, c->proto);
    resp_add_bulk_str(b, "id");
    resp_add_int(b, (long long)c->id);
    resp_add_bulk_str(b, "mode");
    resp_add_bulk_str(b, "standalone");
    resp_add_bulk_str(b, "role");
    resp_add_bulk_str(b, "master");
    resp_add_bulk_str(b, "modules");
    resp_add_array(b, 0);
}

static bool name_ok(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] < '!' || s[i] > '~')
            return false;
    return true;
}

static void cmd_hello(struct resp_conn *c, const struct resp_args *a)
{
    long long ver = c->proto;
    size_t i = 1;
    const char *pass = NULL, *setname = NULL;
    size_t plen = 0, nlen = 0;

    if (a->argc >= 2) {
        if (resp_arg_ll(a->argv[1], a->argl[1], &ver) < 0) {
            reply_err(c, "ERR", "Protocol version is not an integer or out of range");
            return;
        }
        i = 2;
        if (ver < 2 || ver > 3) {
            reply_err(c, "NOPROTO", "unsupported protocol version");
            return;
        }
    }
    for (; i < a->argc; i++) {
        bool more = i + 1 < a->argc;
        if (resp_arg_is(a->argv[i], a->argl[i], "AUTH") && i + 2 < a->argc) {
            pass = a->argv[i + 2];
            plen = a->argl[i + 2];
            i += 2;
        } else if (resp_arg_is(a->argv[i], a->argl[i], "SETNAME") && more) {
            setname = a->argv[i + 1];
            nlen = a->argl[i + 1];
            i++;
        } else {
            char sh[64];
            reply_err(c, "ERR", "Syntax error in HELLO option '%s'",
                      shown(a->argv[i], a->argl[i], sh, sizeof sh));
            return;
        }
    }
    if (pass && do_auth(c, pass, plen) < 0)
        return;
    if (!c->authed) {
        reply_err(c, "NOAUTH", "HELLO must be called with the client already "
                  "authenticated, otherwise the HELLO <proto> AUTH <user> <pass> "
                  "option can be used to authenticate the client and select the "
                  "RESP protocol version at the same time");
        return;
    }
    if (setname) {
        if (!name_ok(setname, nlen) || nlen >= sizeof c->name) {
            reply_err(c, "ERR", "Client names cannot contain spaces, newlines or "
                      "special characters.");
            return;
        }
        memcpy(c->name, setname, nlen);
        c->name[nlen] = 0;
    }
    c->proto = (int)ver;
    hello_reply(c);
}

/* ---- CLIENT ---- */

static void client_line(struct resp_conn *c, char *buf, size_t cap)
{
    snprintf(buf, cap, "id=%llu addr=%s name=%s db=%u multi=%d resp=%d "
             "lib-name=%s lib-ver=%s user=%s", (unsigned long long)c->id, c->addr,
             c->name, c->db, c->multi ? (int)c->nqueue : -1, c->proto, c->lib_name,
             c->lib_ver, c->who.name[0] ? c->who.name : "default");
}

static void cmd_client(struct resp_conn *c, const struct resp_args *a)
{
    const char *sub = a->argv[1];
    size_t sl = a->argl[1];
    struct resp_buf *b;
    char line[512], sh[64];

    if (resp_arg_is(sub, sl, "SETNAME") && a->argc == 3) {
        if (!name_ok(a->argv[2], a->argl[2]) || a->argl[2] >= sizeof c->name) {
            reply_err(c, "ERR", "Client names cannot contain spaces, newlines or "
                      "special characters.");
            return;
        }
        memcpy(c->name, a->argv[2], a->argl[2]);
        c->name[a->argl[2]] = 0;
        if ((b = out(c)))
            resp_add_simple(b, "OK");
    } else if (resp_arg_is(sub, sl, "GETNAME") && a->argc == 2) {
        if ((b = out(c))) {
            if (c->name[0])
                resp_add_bulk_str(b, c->name);
            else
                resp_add_null(b, c->proto);
        }
    } else if (resp_arg_is(sub, sl, "ID") && a->argc == 2) {
        if ((b = out(c)))
            resp_add_int(b, (long long)c->id);
    } else if (resp_arg_is(sub, sl, "SETINFO") && a->argc == 4) {
        char *dst;
        size_t cap;
        if (resp_arg_is(a->argv[2], a->argl[2], "LIB-NAME")) {
            dst = c->lib_name;
            cap = sizeof c->lib_name;
        } else if (resp_arg_is(a->argv[2], a->argl[2], "LIB-VER")) {
            dst = c->lib_ver;
            cap = sizeof c->lib_ver;
        } else {
            reply_err(c, "ERR", "Unrecognized option '%s'",
                      shown(a->argv[2], a->argl[2], sh, sizeof sh));
            return;
        }
        if (!name_ok(a->argv[3], a->argl[3])) {
            reply_err(c, "ERR", "%s cannot contain spaces, newlines or special "
                      "characters.", dst == c->lib_name ? "lib-name" : "lib-ver");
            return;
        }
        snprintf(dst, cap, "%.*s", (int)a->argl[3], a->argv[3]);
        if ((b = out(c)))
            resp_add_simple(b, "OK");
    } else if (resp_arg_is(sub, sl, "INFO") && a->argc == 2) {
        client_line(c, line, sizeof line);
        strcat(line, "\n");
        if ((b = out(c)))
            resp_add_verbatim(b, c->proto, line);
    } else if (resp_arg_is(sub, sl, "LIST") && a->argc == 2) {
        /* This connection only: others' names and addresses are not a
         * token holder's business. */
        client_line(c, line, sizeof line);
        strcat(line, "\n");
        if ((b = out(c)))
            resp_add_verbatim(b, c->proto, line);
    } else if ((resp_arg_is(sub, sl, "NO-EVICT") || resp_arg_is(sub, sl, "NO-TOUCH")) &&
               a->argc == 3) {
        if ((b = out(c)))
            resp_add_simple(b, "OK");
    } else if (resp_arg_is(sub, sl, "HELP")) {
        static const char *const help[] = {
            "CLIENT <subcommand> [<arg> ...]. Subcommands are:",
            "ID", "    Return the ID of the current connection.",
            "GETNAME", "    Return the name of the current connection.",
            "SETNAME <name>", "    Assign the name <name> to the current connection.",
            "SETINFO <LIB-NAME|LIB-VER> <value>", "    Record the client library.",
            "INFO", "    Return information about the current connection.",
            "LIST", "    Return information about the current connection.",
        };
        size_t n = sizeof help / sizeof help[0];
        if ((b = out(c))) {
            resp_add_array(b, n);
            for (size_t i = 0; i < n; i++)
                resp_add_simple(b, help[i]);
        }
    } else {
        reply_err(c, "ERR", "unknown subcommand or wrong number of arguments for "
                  "'%s'. Try CLIENT HELP.", shown(sub, sl, sh, sizeof sh));
    }
}

/* ---- COMMAND ---- */

static const struct resp_command *command_at(size_t i)
{
    return i < resp_commands_count ? &resp_commands[i]
                                   : &resp_bf_commands[i - resp_commands_count];
}

static size_t command_total(void)
{
    return resp_commands_count + resp_bf_commands_count;
}

/* Looked up for every command: the BF.* table first (what clients send
 * most), the first letter before the rest.  Names are lower case ASCII
 * starting with a letter.  strncasecmp stops at the name's end, so
 * cmd->name[len] is only read when the name is at least len long. */
const struct resp_command *resp__lookup(const char *name, size_t len)
{
    size_t n = command_total();
    if (len == 0)
        return NULL;
    for (size_t k = 0; k < n; k++) {
        const struct resp_command *cmd = command_at((k + resp_commands_count) % n);
        if ((name[0] | 0x20) == cmd->name[0] && strncasecmp(name, cmd->name, len) == 0 &&
            cmd->name[len] == 0)
            return cmd;
    }
    return NULL;
}

static void command_info(struct resp_conn *c, struct resp_buf *b,
                         const struct resp_command *cmd)
{
    bool key = cmd->flags & RESP_CMD_FILTER;
    bool multikey = key && cmd->arity == -2;   /* DEL */
    size_t nf = 0;
    const char *flags[4];
    if (cmd->flags & RESP_CMD_WRITE)
        flags[nf++] = "write";
    if (cmd->flags & RESP_CMD_READONLY)
        flags[nf++] = "readonly";
    if (cmd->flags & RESP_CMD_FAST)
        flags[nf++] = "fast";
    if (cmd->flags & RESP_CMD_NOAUTH)
        flags[nf++] = "no_auth";
    resp_add_array(b, 10);
    resp_add_bulk_str(b, cmd->name);
    resp_add_int(b, cmd->arity);
    resp_add_set(b, c->proto, nf);
    for (size_t i = 0; i < nf; i++)
        resp_add_simple(b, flags[i]);
    resp_add_int(b, key ? 1 : 0);
    resp_add_int(b, key ? (multikey ? -1 : 1) : 0);
    resp_add_int(b, key ? 1 : 0);
    resp_add_set(b, c->proto, 0);
    resp_add_array(b, 0);       /* tips */
    resp_add_array(b, 0);       /* key specs */
    resp_add_array(b, 0);       /* subcommands */
}

static void command_docs(struct resp_conn *c, struct resp_buf *b,
                         const struct resp_command *cmd)
{
    resp_add_bulk_str(b, cmd->name);
    resp_add_map(b, c->proto, 4);
    resp_add_bulk_str(b, "summary");
    resp_add_bulk_str(b, cmd->summary ? cmd->summary : "");
    resp_add_bulk_str(b, "since");
    resp_add_bulk_str(b, "1.0.0");
    resp_add_bulk_str(b, "group");
    resp_add_bulk_str(b, cmd->group ? cmd->group : "connection");
    resp_add_bulk_str(b, "complexity");
    resp_add_bulk_str(b, "O(N) for N keys");
}

static void cmd_command(struct resp_conn *c, const struct resp_args *a)
{
    struct resp_buf *b;
    size_t n = command_total();
    char sh[64];

    if (a->argc == 1) {
        if ((b = out(c))) {
            resp_add_array(b, n);
            for (size_t i = 0; i < n; i++)
                command_info(c, b, command_at(i));
        }
        return;
    }
    const char *sub = a->argv[1];
    size_t sl = a->argl[1];
    if (resp_arg_is(sub, sl, "COUNT") && a->argc == 2) {
        if ((b = out(c)))
            resp_add_int(b, (long long)n);
    } else if (resp_arg_is(sub, sl, "LIST") && a->argc == 2) {
        if ((b = out(c))) {
            resp_add_array(b, n);
            for (size_t i = 0; i < n; i++)
                resp_add_bulk_str(b, command_at(i)->name);
        }
    } else if (resp_arg_is(sub, sl, "INFO")) {
        if (!(b = out(c)))
            return;
        if (a->argc == 2) {
            resp_add_array(b, n);
            for (size_t i = 0; i < n; i++)
                command_info(c, b, command_at(i));
            return;
        }
        resp_add_array(b, a->argc - 2);
        for (size_t i = 2; i < a->argc; i++) {
            const struct resp_command *cmd = resp__lookup(a->argv[i], a->argl[i]);
            if (cmd)
                command_info(c, b, cmd);
            else
                resp_add_null_array(b, c->proto);
        }
    } else if (resp_arg_is(sub, sl, "DOCS")) {
        if (!(b = out(c)))
            return;
        if (a->argc == 2) {
            resp_add_map(b, c->proto, n);
            for (size_t i = 0; i < n; i++)
                command_docs(c, b, command_at(i));
            return;
        }
        size_t k = 0;
        for (size_t i = 2; i < a->argc; i++)
            k += resp__lookup(a->argv[i], a->argl[i]) != NULL;
        resp_add_map(b, c->proto, k);
        for (size_t i = 2; i < a->argc; i++) {
            const struct resp_command *cmd = resp__lookup(a->argv[i], a->argl[i]);
            if (cmd)
                command_docs(c, b, cmd);
        }
    } else {
        reply_err(c, "ERR", "unknown subcommand or wrong number of arguments for "
                  "'%s'. Try COMMAND HELP.", shown(sub, sl, sh, sizeof sh));
    }
}

/* ---- INFO ---- */

static void cmd_info(struct resp_conn *c, const struct resp_args *a)
{
    struct resp_server *s = c->srv;
    char text[2048];
    size_t k = 0;
    bool all = a->argc == 1, any = false;
    for (size_t i = 1; i < a->argc; i++)
        if (resp_arg_is(a->argv[i], a->argl[i], "all") ||
            resp_arg_is(a->argv[i], a->argl[i], "everything") ||
            resp_arg_is(a->argv[i], a->argl[i], "default"))
            all = true;
#define WANT(sec)                                                              \
    (all || ({                                                                 \
         bool w_ = false;                                                      \
         for (size_t i_ = 1; i_ < a->argc; i_++)                               \
             w_ |= resp_arg_is(a->argv[i_], a->argl[i_], sec);                 \
         w_;                                                                   \
     }))
#define ADD(...) k += (size_t)snprintf(text + k, k < sizeof text ? sizeof text - k : 0, __VA_ARGS__)
    if (WANT("server")) {
        any = true;
        ADD("# Server\r\nredis_version:7.0.0\r\nbloomgrid_version:%s\r\n"
            "server_name:%s\r\nredis_mode:standalone\r\ntcp_port:%d\r\n"
            "uptime_in_seconds:%llu\r\n\r\n", s->version, s->prog,
            resp_server_port(s),
            (unsigned long long)((uint64_t)time(NULL) - s->started_s));
    }
    if (WANT("clients")) {
        any = true;
        ADD("# Clients\r\nconnected_clients:%u\r\nmaxclients:%u\r\n\r\n",
            resp_server_connections(s), s->cfg.max_connections);
    }
    if (WANT("modules")) {
        any = true;
        ADD("# Modules\r\nmodule:name=bf,ver=20423,api=1,filters=0,usedby=[],"
            "using=[],options=[]\r\n\r\n");
    }
    if (WANT("keyspace")) {
        any = true;
        ADD("# Keyspace\r\n\r\n");
    }
#undef ADD
#undef WANT
    if (k >= sizeof text)
        k = sizeof text - 1;
    text[k] = 0;
    (void)any;
    struct resp_buf *b = out(c);
    if (b)
        resp_add_verbatim(b, c->proto, text);
}

/* ---- MULTI, EXEC, DISCARD ---- */

void resp__session_free(struct resp_conn *c)
{
    for (size_t i = 0; i < c->nqueue; i++) {
        free(c->queue[i].argv);
        free(c->queue[i].len);
    }
    free(c->queue);
    c->queue = NULL;
    c->nqueue = c->queue_cap = c->qbytes = c->exec_next = 0;
}

static void cmd_multi(struct resp_conn *c, const struct resp_args *a)
{
    (void)a;
    if (c->multi) {
        reply_err(c, "ERR", "MULTI calls can not be nested");
        return;
    }
    c->multi = true;
    c->multi_dirty = false;
    struct resp_buf *b = out(c);
    if (b)
        resp_add_simple(b, "OK");
}

static void cmd_discard(struct resp_conn *c, const struct resp_args *a)
{
    (void)a;
    if (!c->multi) {
        reply_err(c, "ERR", "DISCARD without MULTI");
        return;
    }
    c->multi = false;
    resp__session_free(c);
    struct resp_buf *b = out(c);
    if (b)
        resp_add_simple(b, "OK");
}

static void cmd_exec(struct resp_conn *c, const struct resp_args *a)
{
    (void)a;
    if (!c->multi) {
        reply_err(c, "ERR", "EXEC without MULTI");
        return;
    }
    c->multi = false;
    if (c->multi_dirty) {
        resp__session_free(c);
        reply_err(c, "EXECABORT", "Transaction discarded because of previous errors.");
        return;
    }
    struct resp_buf *b = out(c);
    if (!b)
        return;
    /* The array's elements are the queued commands' replies, which follow
     * in order (each in its turn, as in a pipeline). */
    resp_add_array(b, c->nqueue);
    if (c->nqueue) {
        c->exec_running = true;
        c->exec_next = 0;
    }
}

static void cmd_unwatch(struct resp_conn *c, const struct resp_args *a)
{
    (void)a;
    struct resp_buf *b = out(c);
    if (b)
        resp_add_simple(b, "OK");
}

/* Queue a command inside MULTI: 0, or -1 with the error replied. */
static int queue_command(struct resp_conn *c, const struct resp_args *a)
{
    size_t bytes = 0;
    for (size_t i = 0; i < a->argc; i++)
        bytes += a->argl[i] + 1 + sizeof(char *) + sizeof(size_t);
    if (c->nqueue >= RESP_QUEUE_MAX || c->qbytes + bytes > c->srv->cfg.pipeline_bytes) {
        reply_err(c, "OOM", "the transaction is over its budget (%u commands or "
                  "resp_pipeline_bytes = %zu bytes): discarded at EXEC",
                  RESP_QUEUE_MAX, c->srv->cfg.pipeline_bytes);
        return -1;
    }
    if (c->nqueue == c->queue_cap) {
        size_t cap = c->queue_cap ? c->queue_cap * 2 : 8;
        struct resp_queued *q = realloc(c->queue, cap * sizeof *q);
        if (!q) {
            reply_err(c, "OOM", "out of memory");
            return -1;
        }
        c->queue = q;
        c->queue_cap = cap;
    }
    struct resp_queued *q = &c->queue[c->nqueue];
    size_t data = 0;
    for (size_t i = 0; i < a->argc; i++)
        data += a->argl[i] + 1;
    q->argv = malloc(a->argc * sizeof(char *) + data);
    q->len = malloc(a->argc * sizeof(size_t));
    if (!q->argv || !q->len) {
        free(q->argv);
        free(q->len);
        reply_err(c, "OOM", "out of memory");
        return -1;
    }
    char *p = (char *)(q->argv + a->argc);
    for (size_t i = 0; i < a->argc; i++) {
        memcpy(p, a->argv[i], a->argl[i]);
        p[a->argl[i]] = 0;
        q->argv[i] = p;
        q->len[i] = a->argl[i];
        p += a->argl[i] + 1;
    }
    q->argc = a->argc;
    c->nqueue++;
    c->qbytes += bytes;
    return 0;
}

/* ---- the table ---- */

struct resp_command resp_commands[] = {
    {"ping", -1, RESP_CMD_FAST, RESP_ROLE_READ, cmd_ping, "connection",
     "Returns PONG, or the message given.", "[message]", NULL, NULL, NULL},
    {"echo", 2, RESP_CMD_FAST, RESP_ROLE_READ, cmd_echo, "connection",
     "Returns the message given.", "message", NULL, NULL, NULL},
    {"hello", -1, RESP_CMD_NOAUTH | RESP_CMD_FAST, RESP_ROLE_NONE, cmd_hello,
     "connection", "Chooses RESP2 or RESP3, authenticates, names the connection.",
     "[protover [AUTH username password] [SETNAME clientname]]", NULL, NULL, NULL},
    {"auth", -2, RESP_CMD_NOAUTH | RESP_CMD_FAST, RESP_ROLE_NONE, cmd_auth,
     "connection", "Authenticates the connection with a bloomgrid token.",
     "[username] token", NULL, NULL, NULL},
    {"client", -2, 0, RESP_ROLE_READ, cmd_client, "connection",
     "SETNAME, GETNAME, ID, SETINFO, INFO, LIST of this connection.",
     "subcommand [arg ...]", NULL, NULL, NULL},
    {"select", 2, RESP_CMD_FAST, RESP_ROLE_READ, cmd_select, "connection",
     "Selects database 0 (the only one).", "index", NULL, NULL, NULL},
    {"command", -1, 0, RESP_ROLE_READ, cmd_command, "server",
     "Describes the commands (COUNT, LIST, INFO, DOCS).", "[subcommand [arg ...]]",
     NULL, NULL, NULL},
    {"info", -1, 0, RESP_ROLE_READ, cmd_info, "server",
     "Information about the server.", "[section ...]", NULL, NULL, NULL},
    {"quit", -1, RESP_CMD_NOAUTH | RESP_CMD_NOQUEUE | RESP_CMD_FAST, RESP_ROLE_NONE,
     cmd_quit, "connection", "Closes the connection.", "", NULL, NULL, NULL},
    {"reset", 1, RESP_CMD_NOAUTH | RESP_CMD_NOQUEUE | RESP_CMD_FAST, RESP_ROLE_NONE,
     cmd_reset, "connection", "Resets the connection.", "", NULL, NULL, NULL},
    {"multi", 1, RESP_CMD_NOQUEUE | RESP_CMD_FAST, RESP_ROLE_READ, cmd_multi,
     "transactions", "Starts queueing commands (run in order at EXEC, not "
     "isolated).", "", NULL, NULL, NULL},
    {"exec", 1, RESP_CMD_NOQUEUE, RESP_ROLE_READ, cmd_exec, "transactions",
     "Runs the queued commands in order.", "", NULL, NULL, NULL},
    {"discard", 1, RESP_CMD_NOQUEUE | RESP_CMD_FAST, RESP_ROLE_READ, cmd_discard,
     "transactions", "Discards the queued commands.", "", NULL, NULL, NULL},
    {"unwatch", 1, RESP_CMD_NOQUEUE | RESP_CMD_FAST, RESP_ROLE_READ, cmd_unwatch,
     "transactions", "Does nothing (WATCH is not supported).", "", NULL, NULL, NULL},
};
const size_t resp_commands_count = sizeof resp_commands / sizeof resp_commands[0];

void resp__commands_init(struct resp_server *s)
{
    (void)s;
    struct metrics *m = metrics_registry();
    for (size_t i = 0; i < command_total(); i++) {
        struct resp_command *cmd = (struct resp_command *)command_at(i);
        const char *labels[] = {"command", cmd->name, NULL};
        cmd->m_calls = metrics_counter(m, "bloomgrid_resp_commands_total",
                                       "RESP commands run, by command", labels);
        cmd->m_errors = metrics_counter(m, "bloomgrid_resp_errors_total",
                                        "RESP commands answered with an error, "
                                        "by command", labels);
        cmd->m_time = metrics_histogram(m, "bloomgrid_resp_duration_seconds",
                                        "RESP command time from the read that "
                                        "brought it to its reply, by command",
                                        labels,
                                        metrics_latency_bounds,
                                        metrics_latency_nbounds);
    }
    const char *ul[] = {"command", "unknown", NULL};
    s->m_unknown = metrics_counter(m, "bloomgrid_resp_errors_total",
                                   "RESP commands answered with an error, by "
                                   "command", ul);
}

int resp__dispatch(struct resp_conn *c, const struct resp_args *a)
{
    struct resp_server *s = c->srv;
    const struct resp_command *cmd = resp__lookup(a->argv[0], a->argl[0]);
    char sh[64], args[200];

    c->cmd_error = false;
    if (!cmd || (c->multi && !(cmd->flags & RESP_CMD_NOQUEUE))) {
        if (!cmd) {
            size_t k = 0;
            args[0] = 0;
            for (size_t i = 1; i < a->argc && k + 70 < sizeof args; i++) {
                char one[64];
                k += (size_t)snprintf(args + k, sizeof args - k, "'%s' ",
                                      shown(a->argv[i], a->argl[i], one, sizeof one));
            }
            metric_add(s->m_unknown, 1);
            reply_err(c, "ERR", "unknown command '%s', with args beginning with: %s",
                      shown(a->argv[0], a->argl[0], sh, sizeof sh), args);
            c->multi_dirty |= c->multi;
            return 1;
        }
    }
    int ar = cmd->arity;
    if ((ar > 0 && a->argc != (size_t)ar) || (ar < 0 && a->argc < (size_t)-ar)) {
        metric_add(cmd->m_calls, 1);
        metric_add(cmd->m_errors, 1);
        reply_err(c, "ERR", "wrong number of arguments for '%s' command", cmd->name);
        c->multi_dirty |= c->multi;
        return 1;
    }
    if (c->multi && !(cmd->flags & RESP_CMD_NOQUEUE)) {
        if (queue_command(c, a) < 0) {
            c->multi_dirty = true;
            return 1;
        }
        struct resp_buf *b = out(c);
        if (b)
            resp_add_simple(b, "QUEUED");
        return 1;
    }
    if (c->authed && s->be.recheck && s->be.recheck(s->be.auth_arg, &c->who) < 0 &&
        c->who.role == RESP_ROLE_NONE)
        c->authed = false;   /* the token was removed at a reload */
    if (!c->authed && !(cmd->flags & RESP_CMD_NOAUTH)) {
        metric_add(cmd->m_calls, 1);
        metric_add(cmd->m_errors, 1);
        reply_err(c, "NOAUTH", "Authentication required.");
        return 1;
    }
    if (c->who.role < cmd->role) {
        metric_add(cmd->m_calls, 1);
        metric_add(cmd->m_errors, 1);
        reply_err(c, "NOPERM", "this user has no permissions to run the '%s' "
                  "command (token %s has role %s; it needs %s)", cmd->name,
                  c->who.name[0] ? c->who.name : "?",
                  c->who.role == RESP_ROLE_READ ? "read"
                  : c->who.role == RESP_ROLE_WRITE ? "write" : "none",
                  cmd->role == RESP_ROLE_ADMIN ? "admin"
                  : cmd->role == RESP_ROLE_WRITE ? "write" : "read");
        return 1;
    }
    if ((cmd->flags & RESP_CMD_FILTER) && resp__bf_must_wait(c, cmd, a))
        return 0;
    metric_add(cmd->m_calls, 1);
    uint64_t t0 = c->t0_ns;
    c->cmd_error = false;
    c->cur = cmd;
    cmd->run(c, a);
    /* Backend calls count their errors and time when they end. */
    if (cmd->flags & RESP_CMD_CALL)
        return 1;
    if (c->cmd_error)
        metric_add(cmd->m_errors, 1);
    metric_observe(cmd->m_time, (double)(resp__now_ns() - t0) / 1e9);
    return 1;
}
