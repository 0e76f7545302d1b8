/* merger_sources: the sources file of bloomgrid-merger (libinih).
 *
 *     [filter events]
 *     datacenter = dc1 /etc/bloomgrid/topology-dc1.ini   ; repeatable
 *     datacenter = dc2 10.0.2.1:7400    ; a single node serving the filter
 *     partial = /data/partials/events-batch-7.bf         ; repeatable
 */
#include <ini.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "merger.h"
#include "rules.h"

struct parse {
    struct mg_filter_conf *out;
    size_t max, n;
    const char *path;
    char *err;
    char msg[300];
    bool failed;
};

/* libinih returns the line of the first entry a handler refused. */
static int fail(struct parse *p, const char *what, const char *v)
{
    if (!p->failed)
        snprintf(p->msg, sizeof p->msg, "%s%s%.200s", what, v ? ": " : "",
                 v ? v : "");
    p->failed = true;
    return 0;
}

static int on_entry(void *user, const char *section, const char *name,
                    const char *value)
{
    struct parse *p = user;
    struct mg_filter_conf *f;

    if (strncmp(section, "filter ", 7) != 0 || !section[7])
        return fail(p, "sections must be [filter NAME]", section);
    if (p->n == 0 || strcmp(p->out[p->n - 1].name, section + 7) != 0) {
        for (size_t i = 0; i < p->n; i++)
            if (!strcmp(p->out[i].name, section + 7))
                return fail(p, "filter listed twice", section + 7);
        if (p->n == p->max)
            return fail(p, "too many filters", NULL);
        /* The name becomes a directory under state_dir: the rule every
         * node applies keeps it one plain path component. */
        char why[RULES_ERRLEN];
        if (rules_filter_name_check(section + 7, strlen(section + 7),
                                    why) < 0)
            return fail(p, why, NULL);
        f = &p->out[p->n++];
        memset(f, 0, sizeof *f);
        snprintf(f->name, sizeof f->name, "%s", section + 7);
    }
    f = &p->out[p->n - 1];
    if (!strcmp(name, "datacenter")) {
        const char *dc = value, *path;
        size_t dl = strcspn(dc, " \t"), pl;
        path = dc + dl + strspn(dc + dl, " \t");
        pl = strcspn(path, " \t");
        if (f->ndc == MG_MAX_DC)
            return fail(p, "too many datacenters", NULL);
        if (dl == 0 || pl == 0 || path[pl + strspn(path + pl, " \t")])
            return fail(p, "expected \"datacenter = NAME TOPOLOGY-FILE\"",
                        value);
        if (dl >= sizeof f->dc[0])
            return fail(p, "datacenter name longer than 63 bytes", value);
        if (pl >= MG_PATH_MAX)
            return fail(p, "topology path too long", value);
        for (unsigned i = 0; i < f->ndc; i++)
            if (strlen(f->dc[i]) == dl && !memcmp(f->dc[i], dc, dl))
                return fail(p, "datacenter listed twice", value);
        memcpy(f->dc[f->ndc], dc, dl);
        f->dc[f->ndc][dl] = 0;
        memcpy(f->topo[f->ndc], path, pl);
        f->topo[f->ndc++][pl] = 0;
    } else if (!strcmp(name, "partial")) {
        if (f->npart == MG_MAX_PARTIALS)
            return fail(p, "too many partials", NULL);
        if (strlen(value) >= MG_PATH_MAX)
            return fail(p, "partial path too long", value);
        snprintf(f->part[f->npart++], MG_PATH_MAX, "%s", value);
    } else {
        return fail(p, "unknown key (datacenter, partial)", name);
    }
    return 1;
}

int merger_sources_load(const char *path, struct mg_filter_conf *out,
                        size_t max, char *err)
{
    struct parse p = {.out = out, .max = max, .path = path, .err = err};
    int rc = ini_parse(path, on_entry, &p);

    if (rc < 0) {
        snprintf(err, MG_ERRLEN, "cannot read sources file %.400s", path);
        return -1;
    }
    if (p.failed) {
        snprintf(err, MG_ERRLEN, "%.180s:%d: %.300s", path, rc, p.msg);
        return -1;
    }
    if (rc > 0) {
        snprintf(err, MG_ERRLEN, "%.400s:%d: syntax error", path, rc);
        return -1;
    }
    if (p.n == 0) {
        snprintf(err, MG_ERRLEN, "%.400s: no [filter NAME] section", path);
        return -1;
    }
    for (size_t i = 0; i < p.n; i++)
        if (out[i].ndc == 0 && out[i].npart == 0) {
            snprintf(err, MG_ERRLEN, "%.200s: filter \"%.128s\" has no datacenter "
                     "and no partial", path, out[i].name);
            return -1;
        }
        else if (out[i].ndc == 0) {
            snprintf(err, MG_ERRLEN, "%.200s: filter \"%.128s\" needs at least one "
                     "datacenter (the shards' template and where the merged "
                     "result goes)", path, out[i].name);
            return -1;
        }
    return (int)p.n;
}
