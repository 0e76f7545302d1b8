/* log: leveled logging to stderr with file:line, and the servers' line on
 * stdout that says where they listen (log_announce).
 *
 * One process-wide level; the log_* macros test it before evaluating their
 * arguments, so a disabled debug line costs one load and one compare.  Lines
 * are written with one write(2) each, so lines from several threads never
 * interleave.  Any thread may log; log_set_level may be called at any time.
 */
#ifndef BLOOMGRID_LOG_H
#define BLOOMGRID_LOG_H

enum log_level {
    LOG_LEVEL_DEBUG = 0,
    LOG_LEVEL_INFO = 1,
    LOG_LEVEL_WARN = 2,
    LOG_LEVEL_ERROR = 3,
    LOG_LEVEL_OFF = 4,
};

extern volatile int log__level;

/* Set the level; messages below it are dropped. */
void log_set_level(enum log_level level);

/* Parse "debug", "info", "warn", "error" or "off".  Returns 0 or -EINVAL. */
int log_level_parse(const char *name, enum log_level *out);

/* Set the program name printed on every line (kept by pointer). */
void log_set_ident(const char *ident);

/* Line formats.  LOG_FORMAT_TEXT: "TIME PROGRAM LEVEL FILE:LINE: message";
 * when stderr is the systemd journal ($JOURNAL_STREAM set), the time is
 * left to the journal and the line starts with the syslog priority
 * ("<3>" error, "<4>" warn, "<6>" info, "<7>" debug), which journald
 * reads.  LOG_FORMAT_JSON: one JSON object per line with "time", "level",
 * "program", "source" and "msg" (control characters, quotes and
 * backslashes escaped). */
enum log_format { LOG_FORMAT_TEXT = 0, LOG_FORMAT_JSON = 1 };
void log_set_format(enum log_format format);
/* Parse "text" or "json".  Returns 0 or -EINVAL. */
int log_format_parse(const char *name, enum log_format *out);

void log__write(enum log_level level, const char *file, int line,
                const char *fmt, ...) __attribute__((format(printf, 4, 5)));
void log__announce(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* A line a server writes on stdout once it listens ("bloomgrid-node
 * listening on HOST:PORT ...", "... metrics on HOST:PORT"), from which
 * scripts and tests read the ports it bound; written whatever the level,
 * in the line format: the message alone in LOG_FORMAT_TEXT, and in
 * LOG_FORMAT_JSON the same JSON object as a log line at level info.
 * stdout is flushed first and after. */
#define log_announce(...) log__announce(__FILE__, __LINE__, __VA_ARGS__)

#define log__at(lvl, ...)                                                    \
    do {                                                                     \
        if ((int)(lvl) >= log__level)                                        \
            log__write((lvl), __FILE__, __LINE__, __VA_ARGS__);              \
    } while (0)

#define log_debug(...) log__at(LOG_LEVEL_DEBUG, __VA_ARGS__)
#define log_info(...) log__at(LOG_LEVEL_INFO, __VA_ARGS__)
#define log_warn(...) log__at(LOG_LEVEL_WARN, __VA_ARGS__)
#define log_error(...) log__at(LOG_LEVEL_ERROR, __VA_ARGS__)

#endif
