/* cli_util: argument parsing, error reporting and file helpers shared by
 * the bloomgrid commands. */
#include "cli.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "progress.h"

int cli_fail(const char *fmt, ...)
{
    va_list ap;

    fflush(stdout);
    progress_interrupt();
    fputs("bloomgrid: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return CLI_ERR;
}

int cli_bad_option(const char *cmd, int c, char **argv)
{
    const char *arg = argv[optind - 1];

    if (c == ':')
        return cli_fail("%s: option '%s' needs a value (see 'bloomgrid help "
                        "%s')", cmd, arg, cmd);
    if (optopt)
        return cli_fail("%s: unknown option '-%c' (see 'bloomgrid help %s')",
                        cmd, optopt, cmd);
    return cli_fail("%s: unknown option '%s' (see 'bloomgrid help %s')", cmd,
                    arg, cmd);
}

void cli_getopt_reset(void)
{
    /* 0, not 1: makes glibc's getopt forget all state of a previous scan. */
    optind = 0;
    opterr = 0;
}

/* Decimal multiplier for a size suffix, 0 if the suffix is not one. */
static uint64_t suffix_scale(const char *s)
{
    if (*s == '\0')
        return 1;
    if (s[1] != '\0')
        return 0;
    switch (*s) {
    case 'k': case 'K': return 1000ull;
    case 'm': case 'M': return 1000000ull;
    case 'g': case 'G': return 1000000000ull;
    case 't': case 'T': return 1000000000000ull;
    }
    return 0;
}

/* "2.5M" or "1e6": allowed when the result is a whole number. */
static int parse_fraction(const char *s, uint64_t *out)
{
    char *end;
    double v = strtod(s, &end);
    uint64_t scale = suffix_scale(end);

    if (end == s || scale == 0 || !isfinite(v))
        return -1;
    v *= (double)scale;
    if (v != floor(v) || v > 1e18)
        return -1;
    *out = (uint64_t)v;
    return 0;
}

int cli_parse_capacity(const char *s, uint64_t *out)
{
    char *end;
    unsigned long long v;
    uint64_t scale, n;

    if (!isdigit((unsigned char)s[0]))
        goto bad;
    errno = 0;
    v = strtoull(s, &end, 10);
    if (*end == '.' || *end == 'e' || *end == 'E') {
        if (parse_fraction(s, &n) < 0)
            goto bad;
    } else {
        scale = suffix_scale(end);
        if (errno || scale == 0 || v > UINT64_MAX / scale)
            goto bad;
        n = (uint64_t)v * scale;
    }
    if (n == 0)
        goto bad;
    *out = n;
    return 0;
bad:
    return cli_fail("--capacity must be a positive whole number of keys "
                    "(e.g. 1000000 or 1M), got '%s'", s);
}

int cli_parse_rate(const char *s, double *out)
{
    char *end;
    double v;

    errno = 0;
    v = strtod(s, &end);
    if (end != s && strcmp(end, "%") == 0)
        v /= 100;
    else if (end == s || *end != '\0')
        goto bad;
    if (errno || !isfinite(v) || !(v > 0 && v < 1))
        goto bad;
    *out = v;
    return 0;
bad:
    return cli_fail("--error-rate must be a number between 0 and 1, both "
                    "excluded (e.g. 0.01 or 1%%), got '%s'", s);
}

bool cli_exists(const char *path)
{
    struct stat st;

    return lstat(path, &st) == 0;
}

bool cli_same_file(const char *a, const char *b)
{
    struct stat sa, sb;

    if (stat(a, &sa) < 0 || stat(b, &sb) < 0)
        return false;
    return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

struct bundle *cli_load(const char *path)
{
    char err[BF_ERRLEN] = "";
    struct bundle *b = bundle_load(path, err);

    if (!b)
        cli_fail("%s: %s", path, err);
    return b;
}

int cli_save(const struct bundle *b, const char *path)
{
    char err[BF_ERRLEN] = "";

    if (bundle_save(b, path, err) < 0)
        return cli_fail("%s: cannot save: %s", path, err);
    return 0;
}

void cli_adding_start(struct cli_adding *a, struct bundle *b)
{
    a->b = b;
    bundle_set_exclusive(b, true);
    /* Fill can be predicted for one filter, not across shards. */
    progress_init(&a->prog, b->count == 1 ? b->shard[0] : NULL);
}

int cli_add_batch(void *ctx, const void *const *keys, const size_t *lens,
                  size_t n)
{
    struct cli_adding *a = ctx;

    bundle_add_keys(a->b, keys, lens, n);
    progress_tick(&a->prog, n);
    return 0;
}

int cli_refuse_bundle(const char *path)
{
    return cli_fail("%s: a shard bundle (a router's export of every shard): "
                    "only query, add, inspect and --like take one", path);
}

void cli_json_str(const char *s)
{
    putchar('"');
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c < 0x20)
            printf("\\u%04x", c);
        else
            putchar(c);
    }
    putchar('"');
}
