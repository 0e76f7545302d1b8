/* canary: canary keys, their state file and the keys a round checks
 * (canary.h). */
#include "canary.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "durable.h"

#define STATE_HEADER "# bloomgrid canary state: do not edit\n"

int canary_name_check(const char *what, const char *name, char *err)
{
    size_t len = strlen(name);

    if (len == 0 || len > CANARY_NAME_MAX) {
        errmsg_set(err, "%s \"%s\" is %zu bytes long; it must be 1 to %d", what,
                   name, len, CANARY_NAME_MAX);
        return -EINVAL;
    }
    for (size_t i = 0; i < len; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-')) {
            errmsg_set(err, "%s \"%s\" may contain only letters, digits, '.', "
                       "'_' or '-'", what, name);
            return -EINVAL;
        }
    }
    return 0;
}

size_t canary_key(char *buf, const char *name, uint64_t seq)
{
    int n = snprintf(buf, CANARY_KEY_MAX, CANARY_KEY_PREFIX "%s/%" PRIu64, name, seq);
    return n < 0 ? 0 : (size_t)n < CANARY_KEY_MAX ? (size_t)n : CANARY_KEY_MAX - 1;
}

/* One "key value" line of the state file into st; 0 or -EINVAL. */
static int state_line(struct canary_state *st, char *line, unsigned *seen,
                      char *why, size_t whylen)
{
    char *val = strchr(line, ' ');

    if (!val) {
        snprintf(why, whylen, "expected \"KEY VALUE\"");
        return -EINVAL;
    }
    *val++ = 0;
    if (strcmp(line, "filter") == 0) {
        if (rules_filter_name_check(val, strlen(val), NULL) < 0) {
            snprintf(why, whylen, "\"%.140s\" is not a filter name", val);
            return -EINVAL;
        }
        snprintf(st->filter, sizeof st->filter, "%s", val);
        *seen |= 1;
    } else if (strcmp(line, "canary") == 0) {
        if (canary_name_check("canary", val, NULL) < 0) {
            snprintf(why, whylen, "\"%.140s\" is not a canary name", val);
            return -EINVAL;
        }
        snprintf(st->name, sizeof st->name, "%s", val);
        *seen |= 2;
    } else if (strcmp(line, "next") == 0) {
        char *end;
        errno = 0;
        unsigned long long v = strtoull(val, &end, 10);
        if (errno || end == val || *end || val[0] < '0' || val[0] > '9') {
            snprintf(why, whylen, "next \"%.140s\" is not a whole number", val);
            return -EINVAL;
        }
        st->next = v;
        *seen |= 4;
    } else {
        snprintf(why, whylen, "unknown key \"%.100s\"", line);
        return -EINVAL;
    }
    return 0;
}

int canary_state_load(const char *path, struct canary_state *out, char *err)
{
    struct canary_state st;
    char line[512], why[200];
    unsigned seen = 0, lineno = 0;
    FILE *f = fopen(path, "r");
    int rc = 0;

    if (!f) {
        rc = -errno;
        if (rc != -ENOENT)
            errmsg_set(err, "canary state %s: cannot read: %s", path, strerror(-rc));
        return rc;
    }
    memset(&st, 0, sizeof st);
    while (fgets(line, sizeof line, f)) {
        size_t len = strlen(line);
        lineno++;
        if (len && line[len - 1] == '\n')
            line[--len] = 0;
        else if (!feof(f)) {
            snprintf(why, sizeof why, "line too long");
            rc = -EINVAL;
            break;
        }
        if (len == 0 || line[0] == '#')
            continue;
        if ((rc = state_line(&st, line, &seen, why, sizeof why)) < 0)
            break;
    }
    if (rc == 0 && ferror(f)) {
        rc = -EIO;
        errmsg_set(err, "canary state %s: cannot read", path);
    } else if (rc < 0) {
        errmsg_set(err, "canary state %s, line %u: %s", path, lineno, why);
    } else if (seen != 7) {
        rc = -EINVAL;
        errmsg_set(err, "canary state %s: incomplete (it needs filter, canary "
                   "and next lines)", path);
    }
    fclose(f);
    if (rc == 0)
        *out = st;
    return rc;
}

int canary_state_match(const char *path, const struct canary_state *st,
                       const char *filter, const char *name, char *err)
{
    if (strcmp(st->filter, filter) != 0) {
        errmsg_set(err, "canary state %s is for filter \"%s\", not \"%s\" (give "
                   "another state file)", path, st->filter, filter);
        return -EINVAL;
    }
    if (strcmp(st->name, name) != 0) {
        errmsg_set(err, "canary state %s is for canary \"%s\", not \"%s\" (give "
                   "another state file)", path, st->name, name);
        return -EINVAL;
    }
    return 0;
}

int canary_state_save(const char *path, const struct canary_state *st, char *err)
{
    char buf[512];
    int n = snprintf(buf, sizeof buf, STATE_HEADER "filter %s\ncanary %s\nnext %" PRIu64 "\n",
                     st->filter, st->name, st->next);

    return durable_write_file(path, buf, (size_t)n, 0644, err);
}

static uint64_t rng_next(uint64_t *s)
{
    uint64_t x = *s ? *s : 0x9e3779b97f4a7c15ull;   /* xorshift64* */
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545f4914f6cdd1dull;
}

size_t canary_pick(uint64_t next, size_t max, uint64_t *out, uint64_t *rng)
{
    size_t n = 0;

    if (next <= max) {
        for (uint64_t i = 0; i < next; i++)
            out[n++] = i;
        return n;
    }
    size_t newest = (max + 1) / 2, sample = max - newest;
    uint64_t older = next - newest;     /* more than sample: next > max */
    if (sample) {
        /* A step over 1 keeps the picks distinct and below older. */
        double step = (double)older / (double)sample;
        double off = (double)(rng_next(rng) >> 11) / 9007199254740992.0 * step;
        for (size_t i = 0; i < sample; i++) {
            uint64_t v = (uint64_t)(off + (double)i * step);
            out[n++] = v < older ? v : older - 1;
        }
    }
    for (uint64_t i = older; i < next; i++)
        out[n++] = i;
    return n;
}
