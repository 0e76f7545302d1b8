/* log: leveled logging to stderr (see log.h). */
#include "log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

volatile int log__level = LOG_LEVEL_INFO;
static const char *log_ident = "bloomgrid";

static const char *const level_names[] = {"debug", "info", "warn", "error"};

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

void log__write(enum log_level level, const char *file, int line,
                const char *fmt, ...)
{
    char buf[2048];
    struct timeval tv;
    struct tm tm;
    const char *base = strrchr(file, '/');
    int saved = errno;

    gettimeofday(&tv, NULL);
    gmtime_r(&tv.tv_sec, &tm);
    int n = snprintf(buf, sizeof buf,
                     "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ %s %s %s:%d: ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
                     tm.tm_min, tm.tm_sec, (int)(tv.tv_usec / 1000), log_ident,
                     level_names[level < 4 ? level : 3], base ? base + 1 : file,
                     line);
    if (n < 0)
        n = 0;
    if ((size_t)n < sizeof buf - 1) {
        va_list ap;
        va_start(ap, fmt);
        int m = vsnprintf(buf + n, sizeof buf - 1 - (size_t)n, fmt, ap);
        va_end(ap);
        if (m > 0)
            n += (size_t)m < sizeof buf - 1 - (size_t)n
                     ? m : (int)(sizeof buf - 2 - (size_t)n);
    }
    if ((size_t)n > sizeof buf - 2)
        n = (int)sizeof buf - 2;
    buf[n++] = '\n';
    ssize_t w = write(STDERR_FILENO, buf, (size_t)n);
    (void)w;
    errno = saved;
}
