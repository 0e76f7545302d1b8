/* log: leveled logging to stderr (see log.h). */
#include "log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

volatile int log__level = LOG_LEVEL_INFO;
static const char *log_ident = "bloomgrid";

static const char *const level_names[] = {"debug", "info", "warn", "error"};
static const char syslog_prio[] = {'7', '6', '4', '3'};
static volatile int log_format = LOG_FORMAT_TEXT;

void log_set_level(enum log_level level)
{
    log__level = (int)level;
}

int log_level_parse(const char *name, enum log_level *out)
{
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(name, level_names[i]) == 0) {
            *out = (enum log_level)i;
            return 0;
        }
    }
    if (strcasecmp(name, "off") == 0) {
        *out = LOG_LEVEL_OFF;
        return 0;
    }
    return -EINVAL;
}

void log_set_ident(const char *ident)
{
    log_ident = ident;
}

void log_set_format(enum log_format format)
{
    log_format = (int)format;
}

int log_format_parse(const char *name, enum log_format *out)
{
    if (strcasecmp(name, "text") == 0)
        *out = LOG_FORMAT_TEXT;
    else if (strcasecmp(name, "json") == 0)
        *out = LOG_FORMAT_JSON;
    else
        return -EINVAL;
    return 0;
}

/* Append s to buf[*n..cap) as JSON string content. */
static void json_put(char *buf, size_t cap, size_t *n, const char *s)
{
    for (; *s && *n + 7 < cap; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            buf[(*n)++] = '\\';
            buf[(*n)++] = (char)c;
        } else if (c < 0x20) {
            *n += (size_t)snprintf(buf + *n, cap - *n, "\\u%04x", c);
        } else {
            buf[(*n)++] = (char)c;
        }
    }
}

static void write_json(int fd, enum log_level level, const char *src, int line,
                       const char *stamp, const char *msg)
{
    char buf[4200];
    size_t n = 0;
    char where[300];
    snprintf(where, sizeof where, "%s:%d", src, line);
    n += (size_t)snprintf(buf, sizeof buf, "{\"time\":\"%s\",\"level\":\"%s\",\"program\":\"",
                          stamp, level_names[level < 4 ? level : 3]);
    json_put(buf, sizeof buf, &n, log_ident);
    n += (size_t)snprintf(buf + n, sizeof buf - n, "\",\"source\":\"");
    json_put(buf, sizeof buf, &n, where);
    n += (size_t)snprintf(buf + n, sizeof buf - n, "\",\"msg\":\"");
    json_put(buf, sizeof buf - 3, &n, msg);
    buf[n++] = '"';
    buf[n++] = '}';
    buf[n++] = '\n';
    ssize_t w = write(fd, buf, n);
    (void)w;
}

static void time_stamp(char *stamp, size_t len)
{
    struct timeval tv;
    struct tm tm;

    gettimeofday(&tv, NULL);
    gmtime_r(&tv.tv_sec, &tm);
    snprintf(stamp, len, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ",
             tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
             tm.tm_sec, (int)(tv.tv_usec / 1000));
}

static const char *base_name(const char *file)
{
    const char *base = strrchr(file, '/');
    return base ? base + 1 : file;
}

void log__announce(const char *file, int line, const char *fmt, ...)
{
    char stamp[64], msg[2048];
    int saved = errno;
    va_list ap;

    va_start(ap, fmt);
    if (vsnprintf(msg, sizeof msg, fmt, ap) < 0)
        msg[0] = 0;
    va_end(ap);
    fflush(stdout);
    if (log_format == LOG_FORMAT_JSON) {
        time_stamp(stamp, sizeof stamp);
        write_json(STDOUT_FILENO, LOG_LEVEL_INFO, base_name(file), line, stamp, msg);
    } else {
        printf("%s\n", msg);
        fflush(stdout);
    }
    errno = saved;
}

void log__write(enum log_level level, const char *file, int line,
                const char *fmt, ...)
{
    char buf[2048], stamp[64], msg[2048];
    const char *src = base_name(file);
    int saved = errno;
    int lv = level < 4 ? (int)level : 3;

    time_stamp(stamp, sizeof stamp);
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (m < 0)
        msg[0] = 0;
    if (log_format == LOG_FORMAT_JSON) {
        write_json(STDERR_FILENO, level, src, line, stamp, msg);
        errno = saved;
        return;
    }
    int p;
    if (getenv("JOURNAL_STREAM"))
        p = snprintf(buf, sizeof buf, "<%c>%s %s %s:%d: ", syslog_prio[lv], log_ident,
                     level_names[lv], src, line);
    else
        p = snprintf(buf, sizeof buf, "%s %s %s %s:%d: ", stamp, log_ident,
                     level_names[lv], src, line);
    size_t n = p < 0 ? 0 : (size_t)p < sizeof buf - 2 ? (size_t)p : sizeof buf - 2;
    size_t ml = strlen(msg);
    if (ml > sizeof buf - 2 - n)
        ml = sizeof buf - 2 - n;
    memcpy(buf + n, msg, ml);
    n += ml;
    buf[n++] = '\n';
    ssize_t w = write(STDERR_FILENO, buf, n);
    (void)w;
    errno = saved;
}
