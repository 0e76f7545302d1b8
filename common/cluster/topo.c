/* topo: topology file parsing and shard placement (see topo.h).
 *
 * The file is read with libinih through a line reader of our own, so every
 * handler call knows the line it comes from and every message names it.
 *
 * Placement version 1 is rendezvous (highest-random-weight) hashing, Thaler
 * and Ravishankar 1996: each (filter, shard) scores every group with a hash
 * and goes to the highest.  Unlike "shard i mod G", adding a group moves only
 * the shards that now score highest on it (about S/(G+1)) and removing one
 * moves only its own; but S shards over G groups spread as a binomial does,
 * so with few shards per group some group holds far more than S/G.
 *
 * Version 2 bounds the load as "consistent hashing with bounded loads" does
 * (Mirrokni, Thorup and Zadimoghaddam, 2018), on rendezvous scores instead
 * of a ring: shards are placed in index order, each on its highest-scoring
 * group among those below the capacity C = ceil(S/G) + 1.  G * C >= S + G,
 * so every shard finds a group, and no group holds more than C.  The
 * result depends only on the filter name, S and the set of group names.  A
 * shard whose best group still has room lands where version 1 puts it
 * (shard 0 always does).  The price is a few more moves when the groups
 * change: a group that fills up sends later shards to their next choice, so
 * a change moves some shards besides those it must (docs/TOPOLOGY.md has
 * the figures).  The slack of one above ceil(S/G) halves those extra moves
 * compared with C = ceil(S/G).
 */
#include "topo.h"

#include <ctype.h>
#include <errno.h>
#include <ini.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "rules.h"

/* The section name buffer of libinih (MAX_SECTION in ini.c, 50 bytes with
 * the NUL): "[group " + a name of TOPO_GROUP_NAME_MAX fits exactly. */
#define INI_SECTION_MAX 49
_Static_assert(6 + TOPO_GROUP_NAME_MAX == INI_SECTION_MAX, "group name limit");

struct reader {
    const char *p;             /* next unread byte */
    int line;                  /* line last handed to inih */
    int section_line;          /* line of the last [section] header */
    int sections;              /* headers seen so far */
    char section[256];         /* its text between the brackets, uncut */
    bool cont;                 /* the line continues the previous value */
    int too_long;              /* first line longer than inih's buffer, or 0 */
};

/* A quorum as the file sets it: 0 when not set, with the line that did. */
struct quorum_set {
    unsigned w, r;
    int wline, rline;
};

/* What parsing keeps per group besides the group itself. */
struct group_parse {
    int section;               /* which header (rd.sections) opened it */
    struct quorum_set q;       /* as its section set them */
    struct quorum_set oq;      /* ..._next or ..._prev */
    int copies_line;           /* line of its copies (0: none) */
    int other_line;            /* line of copies_next or copies_prev */
    enum topo_joint oq_joint;  /* which suffix the quorums of oq had */
    int oq_line;
};

struct parse_ctx {
    struct reader rd;
    const char *origin;
    struct topo_group *groups;
    struct group_parse *gp;    /* per group */
    unsigned ngroups, cap;
    struct quorum_set dflt;    /* set before the first section */
    uint64_t version;
    int version_line;
    char err[TOPO_ERRLEN];
    bool failed;
};

static char *read_line(char *str, int num, void *stream)
{
    struct reader *rd = stream;
    int n = 0;

    if (!*rd->p)
        return NULL;
    while (*rd->p && n < num - 1) {
        char c = *rd->p++;
        str[n++] = c;
        if (c == '\n')
            break;
    }
    rd->line++;
    /* A line longer than the buffer: drop the rest, it is refused (inih
     * would cut it silently, and a cut address list places shards
     * elsewhere). */
    if (n == num - 1 && str[n - 1] != '\n') {
        while (*rd->p && *rd->p++ != '\n')
            ;
        if (!rd->too_long)
            rd->too_long = rd->line;
    }
    str[n] = 0;
    const char *s = str;
    while (*s == ' ' || *s == '\t')
        s++;
    /* inih joins an indented line to the value above it (and hands it over
     * under the same name): copies lists may go on over several lines. */
    rd->cont = s != str && *s && *s != '\r' && *s != '\n' && *s != ';' && *s != '#';
    if (*s == '[') {
        rd->section_line = rd->line;
        rd->sections++;
        size_t len = strcspn(s + 1, "]\r\n");
        snprintf(rd->section, sizeof rd->section, "%.*s", (int)len, s + 1);
    }
    return str;
}

static bool fail(struct parse_ctx *x, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static bool fail(struct parse_ctx *x, int line, const char *fmt, ...)
{
    if (x->failed)
        return false;
    int n = snprintf(x->err, sizeof x->err, "%s:%d: ", x->origin, line);
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof x->err)
        vsnprintf(x->err + n, sizeof x->err - (size_t)n, fmt, ap);
    va_end(ap);
    x->failed = true;
    return false;
}

static bool name_ok(const char *s, size_t max)
{
    size_t n = strlen(s);
    if (n == 0 || n > max)
        return false;
    for (; *s; s++)
        if (!isalnum((unsigned char)*s) && *s != '.' && *s != '_' && *s != '-')
            return false;
    return true;
}

int topo_addr_check(const char *addr)
{
    if (strlen(addr) > TOPO_ADDR_MAX)
        return -EINVAL;
    return rules_addr_check("address", addr, false, NULL);
}

static const char *joint_key(enum topo_joint j)
{
    return j == TOPO_JOINT_NEXT ? "copies_next" : "copies_prev";
}

/* Is addr already listed where a new listing in group self's copies (or,
 * when other, its other set) would list it twice?  An address may be both
 * a copy and in the other set of one group; nowhere else twice. */
static const char *addr_owner(const struct parse_ctx *x, const struct topo_group *self,
                              bool other, const char *addr)
{
    for (unsigned i = 0; i < x->ngroups; i++) {
        const struct topo_group *g = &x->groups[i];
        for (unsigned c = 0; c < g->ncopies; c++)
            if (strcmp(g->copies[c], addr) == 0 && !(other && g == self))
                return g->name;
        for (unsigned c = 0; c < g->nother; c++)
            if (strcmp(g->other[c], addr) == 0 && (other || g != self))
                return g->name;
    }
    return NULL;
}

static struct topo_group *group_get(struct parse_ctx *x, const char *name)
{
    int line = x->rd.line;
    for (unsigned i = 0; i < x->ngroups; i++) {
        if (strcmp(x->groups[i].name, name) != 0)
            continue;
        if (x->gp[i].section != x->rd.sections) {
            fail(x, x->rd.section_line,
                 "group \"%s\" is defined twice (first at line %d)", name,
                 x->groups[i].line);
            return NULL;
        }
        return &x->groups[i];
    }
    if (!name_ok(name, TOPO_GROUP_NAME_MAX)) {
        fail(x, x->rd.section_line,
             "group name \"%s\" must be 1..%d characters of [A-Za-z0-9._-]", name,
             TOPO_GROUP_NAME_MAX);
        return NULL;
    }
    if (x->ngroups >= TOPO_MAX_GROUPS) {
        fail(x, line, "more than %d groups", TOPO_MAX_GROUPS);
        return NULL;
    }
    if (x->ngroups == x->cap) {
        unsigned cap = x->cap ? 2 * x->cap : 8;
        struct topo_group *g = realloc(x->groups, cap * sizeof *g);
        if (g)
            x->groups = g;
        struct group_parse *gp = realloc(x->gp, cap * sizeof *gp);
        if (gp)
            x->gp = gp;
        if (!g || !gp) {
            fail(x, line, "out of memory");
            return NULL;
        }
        x->cap = cap;
    }
    struct topo_group *g = &x->groups[x->ngroups];
    memset(g, 0, sizeof *g);
    snprintf(g->name, sizeof g->name, "%s", name);
    g->line = x->rd.section_line;
    x->gp[x->ngroups] = (struct group_parse){.section = x->rd.sections};
    x->ngroups++;
    return g;
}

/* Add one copy address to g (to its other set when other). */
static bool add_copy(struct parse_ctx *x, struct topo_group *g, bool other,
                     const char *value)
{
    int line = x->rd.line;
    const char *owner;
    char why[RULES_ERRLEN];
    char (*list)[TOPO_ADDR_MAX + 1] = other ? g->other : g->copies;
    unsigned *n = other ? &g->nother : &g->ncopies;
    if (strlen(value) > TOPO_ADDR_MAX)
        return fail(x, line, "group %s: copy \"%.40s...\" is longer than %d "
                    "characters", g->name, value, TOPO_ADDR_MAX);
    if (rules_addr_check("copy", value, false, why) < 0)
        return fail(x, line, "group %s: %s", g->name, why);
    if ((owner = addr_owner(x, g, other, value)) != NULL)
        return fail(x, line, "node %s is listed twice (already in group %s)",
                    value, owner);
    if (*n >= TOPO_MAX_COPIES)
        return fail(x, line, "group %s has more than %d %s", g->name,
                    TOPO_MAX_COPIES, other ? joint_key(g->joint) : "copies");
    snprintf(list[(*n)++], TOPO_ADDR_MAX + 1, "%s", value);
    return true;
}

/* "copies = A B ...": space-separated addresses (copies_next or
 * copies_prev when other). */
static bool set_copies(struct parse_ctx *x, struct topo_group *g, bool other,
                       const char *value)
{
    const char *key = other ? joint_key(g->joint) : "copies";
    char addr[TOPO_ADDR_MAX + 2];
    const char *p = value;
    while (*p) {
        p += strspn(p, " \t");
        size_t len = strcspn(p, " \t");
        if (!len)
            break;
        if (len >= sizeof addr)
            return fail(x, x->rd.line, "group %s: copy \"%.40s...\" is longer "
                        "than %d characters", g->name, p, TOPO_ADDR_MAX);
        memcpy(addr, p, len);
        addr[len] = 0;
        if (!add_copy(x, g, other, addr))
            return false;
        p += len;
    }
    if ((other ? g->nother : g->ncopies) == 0)
        return fail(x, x->rd.line, "group %s: %s lists no address (expected "
                    "%s = HOST:PORT HOST:PORT ...)", g->name, key, key);
    return true;
}

/* A decimal number in [lo, hi] with nothing else. */
static bool parse_num(const char *v, uint64_t lo, uint64_t hi, uint64_t *out)
{
    uint64_t n = 0;
    if (!*v)
        return false;
    for (const char *p = v; *p; p++) {
        if (*p < '0' || *p > '9' || n > (UINT64_MAX - 9) / 10)
            return false;
        n = n * 10 + (uint64_t)(*p - '0');
    }
    if (n < lo || n > hi)
        return false;
    *out = n;
    return true;
}

/* write_quorum / read_quorum into q (global defaults or a group's). */
static bool set_quorum(struct parse_ctx *x, struct quorum_set *q, const char *name,
                       const char *value)
{
    uint64_t n;
    if (!parse_num(value, 1, TOPO_MAX_COPIES, &n))
        return fail(x, x->rd.line, "%s \"%s\" must be a number from 1 to %d",
                    name, value, TOPO_MAX_COPIES);
    if (name[0] == 'w') {
        q->w = (unsigned)n;
        q->wline = x->rd.line;
    } else {
        q->r = (unsigned)n;
        q->rline = x->rd.line;
    }
    return true;
}

static bool is_quorum(const char *name)
{
    return strcmp(name, "write_quorum") == 0 || strcmp(name, "read_quorum") == 0;
}

/* write_quorum_next and the like: which joint key they belong to, or
 * TOPO_JOINT_NONE. */
static enum topo_joint joint_quorum(const char *name)
{
    static const char *const keys[] = {"write_quorum_next", "read_quorum_next",
                                       "write_quorum_prev", "read_quorum_prev"};
    for (unsigned i = 0; i < 4; i++)
        if (strcmp(name, keys[i]) == 0)
            return i < 2 ? TOPO_JOINT_NEXT : TOPO_JOINT_PREV;
    return TOPO_JOINT_NONE;
}


/* Lines past inih's buffer (INI_MAX_LINE) are refused, naming the line. */
static int too_long(struct parse_ctx *x)
{
    return fail(x, x->rd.too_long, "line longer than %d characters: put a long "
                "copies list on several lines, each further line indented "
                "(docs/TOPOLOGY.md)", INI_MAX_LINE - 1);
}

/* An entry before the first section: version and the quorum defaults. */
static int on_global(struct parse_ctx *x, const char *name, const char *value)
{
    int line = x->rd.line;
    if (strcmp(name, "version") == 0) {
        if (x->version_line)
            return fail(x, line, "version is set twice (first at line %d)",
                        x->version_line);
        if (!parse_num(value, 1, (uint64_t)1 << 63, &x->version))
            return fail(x, line, "version \"%s\" must be a number from 1 to "
                        "2^63", value);
        x->version_line = line;
        return 1;
    }
    if (is_quorum(name))
        return set_quorum(x, &x->dflt, name, value);
    return fail(x, line, "unknown setting \"%s\" before the first [group] "
                "(expected version, write_quorum or read_quorum)", name);
}

static int on_entry(void *user, const char *section, const char *name,
                    const char *value)
{
    struct parse_ctx *x = user;
    int line = x->rd.line;

    if (x->failed)
        return 0;
    if (x->rd.too_long)
        return too_long(x);
    if (!section[0] && name)
        return on_global(x, name, value);
    if (strncmp(section, "group ", 6) != 0)
        return fail(x, x->rd.section_line,
                    "unknown section [%s] (expected [group NAME])", section);
    /* libinih keeps only INI_SECTION_MAX characters of a header and cuts
     * the rest silently: a cut name would place shards on another group. */
    size_t raw = strlen(x->rd.section);
    if (raw > INI_SECTION_MAX && strlen(section) == INI_SECTION_MAX &&
        strncmp(section, x->rd.section, INI_SECTION_MAX) == 0)
        return fail(x, x->rd.section_line,
                    "section [%s] is %zu characters; at most %d fit (a group "
                    "name of 1..%d characters after \"group \")", x->rd.section,
                    raw, INI_SECTION_MAX, TOPO_GROUP_NAME_MAX);
    const char *gname = section + 6;
    while (*gname == ' ')
        gname++;
    struct topo_group *g = group_get(x, gname);
    if (!g)
        return 0;
    if (!name)   /* a new section with no entry yet */
        return 1;
    unsigned gi = (unsigned)(g - x->groups);
    if (x->rd.cont && (strcmp(name, "copies") == 0 || strcmp(name, "copies_next") == 0 ||
                       strcmp(name, "copies_prev") == 0))
        return set_copies(x, g, strcmp(name, "copies") != 0, value);
    if (strcmp(name, "copies") == 0) {
        if (x->gp[gi].copies_line)
            return fail(x, line, "group %s has a second copies line (first at "
                        "line %d): list every copy on one line", g->name,
                        x->gp[gi].copies_line);
        x->gp[gi].copies_line = line;
        return set_copies(x, g, false, value);
    }
    if (strcmp(name, "primary") == 0 || strcmp(name, "replica") == 0)
        return fail(x, line, "group %s: \"%s\" is gone: a group is a list of "
                    "equal copies, written copies = HOST:PORT HOST:PORT ... "
                    "(docs/TOPOLOGY.md)", g->name, name);
    if (is_quorum(name))
        return set_quorum(x, &x->gp[gi].q, name, value);
    if (strcmp(name, "copies_next") == 0 || strcmp(name, "copies_prev") == 0) {
        enum topo_joint j = name[7] == 'n' ? TOPO_JOINT_NEXT : TOPO_JOINT_PREV;
        if (x->gp[gi].other_line)
            return fail(x, line, "group %s: %s after %s at line %d: a group "
                        "changes from one set of copies to one other set at a "
                        "time (docs/REPLICATION.md)", g->name, name,
                        joint_key(g->joint), x->gp[gi].other_line);
        x->gp[gi].other_line = line;
        g->joint = j;
        return set_copies(x, g, true, value);
    }
    enum topo_joint jq = joint_quorum(name);
    if (jq != TOPO_JOINT_NONE) {
        if (x->gp[gi].oq_joint && x->gp[gi].oq_joint != jq)
            return fail(x, line, "group %s: %s and a quorum of %s in one group",
                        g->name, name, joint_key(x->gp[gi].oq_joint));
        x->gp[gi].oq_joint = jq;
        x->gp[gi].oq_line = line;
        return set_quorum(x, &x->gp[gi].oq, name, value);
    }
    if (strcmp(name, "datacenter") == 0) {
        if (!name_ok(value, TOPO_NAME_MAX))
            return fail(x, line, "datacenter \"%s\" must be 1..%d characters of "
                        "[A-Za-z0-9._-]", value, TOPO_NAME_MAX);
        snprintf(g->datacenter, sizeof g->datacenter, "%s", value);
        return 1;
    }
    if (strcmp(name, "version") == 0)
        return fail(x, line, "version belongs before the first [group] section");
    return fail(x, line, "unknown setting \"%s\" in group %s (expected copies, "
                "write_quorum, read_quorum, datacenter, or copies_next or "
                "copies_prev with their quorums)", name, g->name);
}

/* Resolve the W and R of a set of N copies of group g (its own q, the
 * file's defaults, or majority and N - W + 1) and check them; suffix names
 * the set's keys in messages ("" or "_next" or "_prev"). */
static bool set_quorums(struct parse_ctx *x, const struct topo_group *g,
                        const struct quorum_set *q, unsigned N, const char *suffix,
                        unsigned *wout, unsigned *rout)
{
    unsigned w = q->w ? q->w : x->dflt.w ? x->dflt.w : N / 2 + 1;
    int wline = q->w ? q->wline : x->dflt.w ? x->dflt.wline : g->line;
    unsigned r = q->r ? q->r : x->dflt.r ? x->dflt.r : N - w + 1;
    int rline = q->r ? q->rline : x->dflt.r ? x->dflt.rline : g->line;

    char set[8] = "";
    if (*suffix)
        snprintf(set, sizeof set, "%s ", suffix + 1);
    if (w > N)
        return fail(x, wline, "group %s has %u %scop%s: write_quorum%s %u must be "
                    "1..%u", g->name, N, set, N == 1 ? "y" : "ies", suffix, w, N);
    if (r > N)
        return fail(x, rline, "group %s has %u %scop%s: read_quorum%s %u must be "
                    "1..%u", g->name, N, set, N == 1 ? "y" : "ies", suffix, r, N);
    if (r + w <= N)
        return fail(x, rline > wline ? rline : wline, "group %s: read_quorum%s %u + "
                    "write_quorum%s %u must exceed its %u %scopies, or a read quorum "
                    "would not meet every write quorum", g->name, suffix, r, suffix,
                    w, N, set);
    *wout = w;
    *rout = r;
    return true;
}

static bool quorums_resolve(struct parse_ctx *x, unsigned i)
{
    struct topo_group *g = &x->groups[i];
    return set_quorums(x, g, &x->gp[i].q, g->ncopies, "", &g->write_quorum,
                       &g->read_quorum);
}

/* The other set of group i: its quorums, the members, and the rule that
 * joins the phases: a read of the new set meets every write the old set
 * acknowledged (R_new + W_old > N_old, docs/REPLICATION.md). */
static bool joint_resolve(struct parse_ctx *x, unsigned i)
{
    struct topo_group *g = &x->groups[i];
    struct group_parse *gp = &x->gp[i];

    if (!g->nother) {
        if (gp->oq_joint)
            return fail(x, gp->oq_line, "group %s: a quorum of %s without %s",
                        g->name, joint_key(gp->oq_joint), joint_key(gp->oq_joint));
        return true;
    }
    if (gp->oq_joint && gp->oq_joint != g->joint)
        return fail(x, gp->oq_line, "group %s has %s: its quorums are "
                    "write_quorum%s and read_quorum%s", g->name, joint_key(g->joint),
                    g->joint == TOPO_JOINT_NEXT ? "_next" : "_prev",
                    g->joint == TOPO_JOINT_NEXT ? "_next" : "_prev");
    bool next = g->joint == TOPO_JOINT_NEXT;
    /* The file's defaults apply to every set; the other set's own keys win. */
    if (!set_quorums(x, g, &gp->oq, g->nother, next ? "_next" : "_prev",
                     &g->other_write_quorum, &g->other_read_quorum))
        return false;
    g->nmembers = g->ncopies;
    for (unsigned o = 0; o < g->nother; o++) {
        unsigned m = 0;
        while (m < g->ncopies && strcmp(g->copies[m], g->other[o]) != 0)
            m++;
        if (m == g->ncopies) {
            if (g->nmembers >= TOPO_MAX_COPIES)
                return fail(x, gp->other_line, "group %s: copies and %s name more "
                            "than %d nodes together; change fewer copies at once",
                            g->name, joint_key(g->joint), TOPO_MAX_COPIES);
            memcpy(g->extra[g->nmembers - g->ncopies], g->other[o],
                   sizeof g->other[o]);
            m = g->nmembers++;
        }
        g->other_mask |= 1u << m;
    }
    unsigned r_new = next ? g->other_read_quorum : g->read_quorum;
    unsigned w_old = next ? g->write_quorum : g->other_write_quorum;
    unsigned n_old = next ? g->ncopies : g->nother;
    if (r_new + w_old <= n_old)
        return fail(x, gp->other_line, "group %s: read quorum %u of %s + write "
                    "quorum %u of %s must exceed the %u %s, or a read of the new "
                    "copies could miss a write the old ones acknowledged "
                    "(raise read_quorum%s)", g->name, r_new,
                    next ? "copies_next" : "copies", w_old,
                    next ? "copies" : "copies_prev", n_old,
                    next ? "copies" : "copies_prev", next ? "_next" : "");
    return true;
}

static int group_cmp(const void *a, const void *b)
{
    return strcmp(((const struct topo_group *)a)->name,
                  ((const struct topo_group *)b)->name);
}

struct topo *topo_parse(const char *text, const char *origin, char *err)
{
    struct parse_ctx x;
    struct topo *t = NULL;

    memset(&x, 0, sizeof x);
    x.rd.p = text;
    x.origin = origin;
    int rc = ini_parse_stream(read_line, &x.rd, on_entry, &x);
    if (x.rd.too_long && !x.failed)
        too_long(&x);
    if (rc > 0 && !x.failed)
        fail(&x, rc, "syntax error (expected [group NAME], name = value, or a "
             "comment starting with ; or #)");
    if (rc < 0 && !x.failed)
        fail(&x, 0, "cannot parse (out of memory)");
    if (x.failed)
        goto out;
    if (x.ngroups == 0) {
        fail(&x, x.rd.line, "no [group NAME] section: a topology needs at least "
             "one group");
        goto out;
    }
    for (unsigned i = 0; i < x.ngroups; i++) {
        if (!x.groups[i].ncopies) {
            fail(&x, x.groups[i].line, "group %s has no copies (expected copies "
                 "= HOST:PORT HOST:PORT ...)", x.groups[i].name);
            goto out;
        }
        if (!quorums_resolve(&x, i))
            goto out;
        x.groups[i].nmembers = x.groups[i].ncopies;
        if (!joint_resolve(&x, i))
            goto out;
    }
    if (!x.version_line) {
        fail(&x, 1, "no version: a topology starts with version = N (1..2^63), "
             "raised on every change so nodes can refuse calls made under "
             "another one");
        goto out;
    }
    qsort(x.groups, x.ngroups, sizeof *x.groups, group_cmp);
    t = calloc(1, sizeof *t);
    if (!t) {
        fail(&x, 0, "out of memory");
        goto out;
    }
    atomic_init(&t->refs, 1);
    t->groups = x.groups;
    t->ngroups = x.ngroups;
    t->version = x.version;
    snprintf(t->origin, sizeof t->origin, "%s", origin);
    x.groups = NULL;
out:
    if (!t && err)
        snprintf(err, TOPO_ERRLEN, "%s", x.err);
    free(x.groups);
    free(x.gp);
    return t;
}

struct topo *topo_load(const char *path, char *err)
{
    FILE *f = fopen(path, "r");
    char *buf = NULL;
    size_t len = 0;
    struct topo *t = NULL;

    if (!f) {
        snprintf(err, TOPO_ERRLEN, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    FILE *mem = open_memstream(&buf, &len);
    char chunk[4096];
    size_t n;
    while (mem && (n = fread(chunk, 1, sizeof chunk, f)) > 0)
        fwrite(chunk, 1, n, mem);
    bool rerr = ferror(f);
    fclose(f);
    if (!mem || fclose(mem) != 0 || rerr) {
        snprintf(err, TOPO_ERRLEN, "%s: cannot read", path);
        goto out;
    }
    if (memchr(buf, 0, len)) {
        snprintf(err, TOPO_ERRLEN, "%s: contains a NUL byte: not a text file", path);
        goto out;
    }
    t = topo_parse(buf, path, err);
out:
    free(buf);
    return t;
}

struct topo *topo_ref(struct topo *t)
{
    if (t)
        atomic_fetch_add(&t->refs, 1);
    return t;
}

void topo_unref(struct topo *t)
{
    if (t && atomic_fetch_sub(&t->refs, 1) == 1) {
        free(t->groups);
        free(t);
    }
}

uint64_t topo_score(const char *filter, uint32_t shard, const char *group)
{
    size_t fl = strlen(filter), gl = strlen(group);
    uint8_t stackbuf[512];
    size_t len = fl + 1 + 4 + 1 + gl;
    uint8_t *buf = len <= sizeof stackbuf ? stackbuf : malloc(len);
    if (!buf)
        return 0;
    uint8_t *p = buf;
    memcpy(p, filter, fl);
    p += fl;
    *p++ = 0;
    for (int i = 0; i < 4; i++)
        *p++ = (uint8_t)(shard >> (8 * i));
    *p++ = 0;
    memcpy(p, group, gl);
    uint64_t h = XXH3_64bits(buf, len);
    if (buf != stackbuf)
        free(buf);
    return h;
}

unsigned topo_group_for(const struct topo *t, const char *filter, uint32_t shard)
{
    unsigned best = 0;
    uint64_t best_score = 0;
    for (unsigned i = 0; i < t->ngroups; i++) {
        uint64_t s = topo_score(filter, shard, t->groups[i].name);
        /* Groups are sorted by name: a tie keeps the smaller name. */
        if (i == 0 || s > best_score) {
            best = i;
            best_score = s;
        }
    }
    return best;
}

uint32_t topo_placement_norm(uint32_t placement)
{
    return placement ? placement : TOPO_PLACEMENT_RENDEZVOUS;
}

bool topo_placement_known(uint32_t v)
{
    return topo_placement_norm(v) <= TOPO_PLACEMENT_NEWEST;
}

_Static_assert(TOPO_MAX_GROUPS <= UINT16_MAX + 1, "group indexes fit uint16_t");

/* The capacity of a group under version 2: ceil(S/G) + 1. */
static unsigned bounded_cap(uint32_t shards, unsigned ngroups)
{
    return (unsigned)(((uint64_t)shards + ngroups - 1) / ngroups) + 1;
}

/* The group of one shard given its scores on every group: the highest
 * (the first of equals, groups being in name order) among those below cap
 * (cap 0: no bound). */
static unsigned place_one(const uint64_t *score, unsigned ngroups,
                          const unsigned *load, unsigned cap)
{
    unsigned best = ngroups;
    for (unsigned g = 0; g < ngroups; g++)
        if ((!cap || load[g] < cap) && (best == ngroups || score[g] > score[best]))
            best = g;
    return best;   /* < ngroups: G * cap > S leaves room for every shard */
}

int topo_place_scored(const uint64_t *scores, uint32_t shards, unsigned ngroups,
                      uint32_t placement, unsigned *load, uint16_t *groups)
{
    if (!shards || !ngroups || ngroups > TOPO_MAX_GROUPS ||
        !topo_placement_known(placement))
        return -EINVAL;
    unsigned cap = topo_placement_norm(placement) == TOPO_PLACEMENT_BOUNDED
                       ? bounded_cap(shards, ngroups) : 0;
    memset(load, 0, ngroups * sizeof *load);
    for (uint32_t i = 0; i < shards; i++) {
        unsigned g = place_one(scores + (size_t)i * ngroups, ngroups, load, cap);
        load[g]++;
        groups[i] = (uint16_t)g;
    }
    return 0;
}

int topo_place(const struct topo *t, const char *filter, uint32_t shards,
               uint32_t placement, uint16_t *groups)
{
    if (!shards || !topo_placement_known(placement))
        return -EINVAL;
    unsigned G = t->ngroups;
    /* One shard's scores at a time: S x G of them would be 32 MiB at the
     * limits. */
    uint64_t *score = malloc(G * sizeof *score);
    unsigned *load = calloc(G, sizeof *load);
    if (!score || !load) {
        free(score);
        free(load);
        return -ENOMEM;
    }
    unsigned cap = topo_placement_norm(placement) == TOPO_PLACEMENT_BOUNDED
                       ? bounded_cap(shards, G) : 0;
    for (uint32_t i = 0; i < shards; i++) {
        for (unsigned g = 0; g < G; g++)
            score[g] = topo_score(filter, i, t->groups[g].name);
        unsigned g = place_one(score, G, load, cap);
        load[g]++;
        groups[i] = (uint16_t)g;
    }
    free(score);
    free(load);
    return 0;
}

const char *topo_member(const struct topo_group *g, unsigned m)
{
    return m < g->ncopies ? g->copies[m] : g->extra[m - g->ncopies];
}

int topo_group_of(const struct topo *t, const char *addr, unsigned *copy)
{
    for (unsigned i = 0; i < t->ngroups; i++)
        for (unsigned c = 0; c < t->groups[i].nmembers; c++)
            if (strcmp(topo_member(&t->groups[i], c), addr) == 0) {
                if (copy)
                    *copy = c;
                return (int)i;
            }
    return -1;
}
