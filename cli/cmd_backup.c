/* cmd_backup: `backup DIR` (every filter of a server exported into DIR, with
 * a manifest) and `restore DIR` (those filters re-created with their
 * geometry and secret, and their files imported).  docs/BACKUP.md is the
 * operator's side of both.
 *
 * A backup directory holds NAME.filter per filter (an Export, written
 * through common/base/durable.h, mode 0600: it holds the filter's secret) and
 * manifest.ini, written last: a backup cut short has no manifest and is not
 * taken for one.  The manifest names each file with what it must hold
 * (geometry, inserts, the fingerprint id FilterInfo shows, its size and an
 * XXH3-64 of its bytes); restore checks every file against it before it
 * asks the server anything, so a damaged or missing file changes nothing.
 *
 * restore then compares each filter with the server's: one that does not
 * exist is created (CreateFilter with the file's secret) and the file
 * imported; one that exists with other geometry or another secret refuses
 * the whole restore before any change, naming the field; one that exists
 * alike gets the import only when it lacks some bit (or counter) of the
 * file, found by exporting it.  An import adds the file's inserts (and a
 * counting filter's counters), so this check is what makes a second run of
 * the same restore change nothing.
 *
 * A filter dropped on the server (a tombstone of its name and the backup's
 * secret) is not created again by a plain restore: CreateFilter refuses it
 * (reason DROPPED) and restore names --undrop, which asks CreateFilter to
 * undo the drop (docs/BACKUP.md, "Undoing a drop").
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <ini.h>
#define XXH_STATIC_LINKING_ONLY   /* XXH3_state_t on the stack */
#include <xxhash.h>

#include "bundle.h"
#include "cli.h"
#include "durable.h"
#include "online.h"
#include "online_cmd.h"
#include "rules.h"

#define MANIFEST "manifest.ini"
#define FILE_SUFFIX ".filter"
#define BACKUP_FORMAT 1

/* One filter of a backup: as the manifest says, or as its file holds. */
struct entry {
    char name[RULES_FILTER_NAME_MAX + 1];
    char file[RULES_FILTER_NAME_MAX + sizeof FILE_SUFFIX];
    char kind[16];
    char fingerprint[17];
    uint64_t capacity, m, inserts, bytes, xxh3;
    double error_rate;
    uint32_t shards, layers, k;
    unsigned keys;              /* manifest keys seen (bit per key) */
    /* From the file only. */
    double growth, tightening;
    uint32_t placement;         /* bf_placement of shard 0 (0: not recorded) */
    uint8_t secret[BF_SECRET_LEN];
};

/* ---- a filter file described ----------------------------------------- */

/* XXH3-64 and size of the file at path.  0 or CLI_ERR (printed). */
static int file_digest(const char *path, uint64_t *xxh3, uint64_t *bytes)
{
    static char buf[1 << 16];
    XXH3_state_t xs;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t n;

    if (fd < 0)
        return cli_fail("%s: cannot open: %s", path, strerror(errno));
    XXH3_64bits_reset(&xs);
    *bytes = 0;
    while ((n = read(fd, buf, sizeof buf)) != 0) {
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            int e = errno;
            close(fd);
            return cli_fail("%s: cannot read: %s", path, strerror(e));
        }
        XXH3_64bits_update(&xs, buf, (size_t)n);
        *bytes += (uint64_t)n;
    }
    close(fd);
    *xxh3 = XXH3_64bits_digest(&xs);
    return 0;
}

/* Shard index of count, as bf_file_scan's meta gives it: its share of what
 * a server's FilterInfo of the filter shows (geometry from shard 0; sizes
 * and counts summed). */
static int describe_shard(void *ctx, uint32_t index, uint32_t count,
                          const struct bf *f)
{
    struct entry *e = ctx;
    struct bf_layer_info li = {0};
    uint32_t layers = 0;

    if (index == 0) {
        snprintf(e->kind, sizeof e->kind, "%s", bf_kind_name(bf_kind(f)));
        bf_layer_info(f, 0, &li);
        e->k = li.k;
        e->error_rate = bf_error_rate(f);
        e->shards = count;
        e->growth = bf_growth(f);
        e->tightening = bf_tightening(f);
        memcpy(e->secret, bf_secret(f), BF_SECRET_LEN);
        e->placement = bf_placement(f);
        e->capacity = e->m = e->inserts = 0;
        e->layers = 0;
    }
    e->capacity += bf_capacity(f);
    e->inserts += bf_insert_count(f);
    while (bf_layer_info(f, layers, &li) == 0) {
        e->m += li.m;
        layers++;
    }
    if (layers > e->layers)
        e->layers = layers;
    return 0;
}

/* Describe the file at path, verified a piece at a time (never held
 * whole: an export is as large as the filter), with its digest. */
static int describe_file(const char *path, struct entry *e)
{
    char err[BF_ERRLEN] = "";

    if (file_digest(path, &e->xxh3, &e->bytes))
        return CLI_ERR;
    if (bundle_file_describe(path, describe_shard, e, e->fingerprint, err) < 0)
        return cli_fail("%s: %s", path, err);
    return 0;
}

static void dir_path(char *out, size_t len, const char *dir, const char *file)
{
    snprintf(out, len, "%s/%s", dir, file);
}

/* ---- the manifest ---------------------------------------------------- */

/* The keys of a [filter NAME] section, each once. */
enum {
    K_FILE, K_KIND, K_CAPACITY, K_ERROR_RATE, K_SHARDS, K_LAYERS, K_M, K_K,
    K_INSERTS, K_FINGERPRINT, K_BYTES, K_XXH3, K_COUNT
};
static const char *const key_names[K_COUNT] = {
    "file", "kind", "capacity", "error_rate", "shards", "layers", "m", "k",
    "inserts", "fingerprint", "bytes", "xxh3",
};

static void manifest_write_entry(FILE *out, const struct entry *e)
{
    fprintf(out, "\n[filter %s]\nfile = %s\nkind = %s\ncapacity = %llu\n"
            "error_rate = %.17g\nshards = %u\nlayers = %u\nm = %llu\nk = %u\n"
            "inserts = %llu\nfingerprint = %s\nbytes = %llu\nxxh3 = %016llx\n",
            e->name, e->file, e->kind, (unsigned long long)e->capacity,
            e->error_rate, e->shards, e->layers, (unsigned long long)e->m, e->k,
            (unsigned long long)e->inserts, e->fingerprint,
            (unsigned long long)e->bytes, (unsigned long long)e->xxh3);
}

struct manifest {
    struct entry *e;
    size_t n, cap;
    bool have_format;
    char msg[300];              /* the first problem */
};

static int parse_u64(const char *v, int base, uint64_t *out)
{
    char *end;

    errno = 0;
    unsigned long long x = strtoull(v, &end, base);
    if (errno || end == v || *end || v[0] == '-')
        return -1;
    *out = x;
    return 0;
}

static int entry_set(struct entry *e, int key, const char *v)
{
    uint64_t u = 0;
    char *end;

    switch (key) {
    case K_FILE:
        /* A file inside the directory, never a path out of it. */
        if (strchr(v, '/') || v[0] == '.' || !v[0] ||
            strlen(v) >= sizeof e->file)
            return -1;
        snprintf(e->file, sizeof e->file, "%s", v);
        return 0;
    case K_KIND:
        if (strlen(v) >= sizeof e->kind)
            return -1;
        snprintf(e->kind, sizeof e->kind, "%s", v);
        return 0;
    case K_FINGERPRINT:
        if (strlen(v) != 16)
            return -1;
        snprintf(e->fingerprint, sizeof e->fingerprint, "%s", v);
        return 0;
    case K_ERROR_RATE:
        e->error_rate = strtod(v, &end);
        return end == v || *end ? -1 : 0;
    case K_XXH3:
        return parse_u64(v, 16, &e->xxh3);
    }
    if (parse_u64(v, 10, &u) < 0)
        return -1;
    switch (key) {
    case K_CAPACITY: e->capacity = u; break;
    case K_M: e->m = u; break;
    case K_INSERTS: e->inserts = u; break;
    case K_BYTES: e->bytes = u; break;
    default:
        if (u > UINT32_MAX)
            return -1;
        if (key == K_SHARDS)
            e->shards = (uint32_t)u;
        else if (key == K_LAYERS)
            e->layers = (uint32_t)u;
        else
            e->k = (uint32_t)u;
    }
    return 0;
}

/* inih's handler: 1 to go on, 0 after noting the problem in m->msg. */
static int manifest_on_entry(void *ctx, const char *section, const char *name,
                             const char *value)
{
    struct manifest *m = ctx;
    char err[RULES_ERRLEN];

    if (m->msg[0])
        return 0;
    if (strcmp(section, "backup") == 0) {
        if (strcmp(name, "format") == 0) {
            if (strcmp(value, "1") != 0) {
                snprintf(m->msg, sizeof m->msg, "format %.20s: this bloomgrid "
                         "reads format %d", value, BACKUP_FORMAT);
                return 0;
            }
            m->have_format = true;
        }
        return 1;   /* server, created, filters: for people */
    }
    if (strncmp(section, "filter ", 7) != 0) {
        snprintf(m->msg, sizeof m->msg, "unknown section [%.150s]", section);
        return 0;
    }
    const char *fname = section + 7;
    if (!m->n || strcmp(m->e[m->n - 1].name, fname) != 0) {
        if (rules_filter_name_check(fname, strlen(fname), err) < 0) {
            snprintf(m->msg, sizeof m->msg, "[%.150s]: %.120s", section, err);
            return 0;
        }
        for (size_t i = 0; i < m->n; i++)
            if (strcmp(m->e[i].name, fname) == 0) {
                snprintf(m->msg, sizeof m->msg, "filter \"%s\" listed twice", fname);
                return 0;
            }
        if (m->n == m->cap) {
            size_t nc = m->cap ? 2 * m->cap : 16;
            struct entry *ne = realloc(m->e, nc * sizeof *ne);
            if (!ne) {
                snprintf(m->msg, sizeof m->msg, "out of memory");
                return 0;
            }
            m->e = ne;
            m->cap = nc;
        }
        memset(&m->e[m->n], 0, sizeof m->e[0]);
        snprintf(m->e[m->n++].name, sizeof m->e[0].name, "%s", fname);
    }
    struct entry *e = &m->e[m->n - 1];
    int key = 0;
    while (key < K_COUNT && strcmp(key_names[key], name) != 0)
        key++;
    if (key == K_COUNT || (e->keys & (1u << key)) || entry_set(e, key, value) < 0) {
        snprintf(m->msg, sizeof m->msg, "filter \"%s\": %s %.40s = %.60s",
                 e->name, key == K_COUNT ? "unknown key" :
                 (e->keys & (1u << key)) ? "key given twice:" : "bad value:",
                 name, value);
        return 0;
    }
    e->keys |= 1u << key;
    return 1;
}

/* Read DIR/manifest.ini.  Returns 0 with m filled (free m->e), or CLI_ERR
 * (printed). */
static int manifest_read(const char *dir, struct manifest *m)
{
    char path[DURABLE_PATH_MAX];
    int rc;

    memset(m, 0, sizeof *m);
    dir_path(path, sizeof path, dir, MANIFEST);
    if (access(path, R_OK) < 0)
        return cli_fail("%s: cannot open: %s (not a backup directory, or a "
                        "backup that did not finish)", path, strerror(errno));
    rc = ini_parse(path, manifest_on_entry, m);
    if (rc < 0)
        return cli_fail("%s: cannot read it", path);
    if (m->msg[0])
        return cli_fail("%s:%d: %s", path, rc, m->msg);
    if (rc > 0)
        return cli_fail("%s:%d: syntax error", path, rc);
    if (!m->have_format)
        return cli_fail("%s: no [backup] format = %d: not a bloomgrid backup "
                        "manifest", path, BACKUP_FORMAT);
    for (size_t i = 0; i < m->n; i++)
        for (int k = 0; k < K_COUNT; k++)
            if (!(m->e[i].keys & (1u << k)))
                return cli_fail("%s: filter \"%s\" has no %s", path,
                                m->e[i].name, key_names[k]);
    return 0;
}

/* The first field in which the file's description f differs from the
 * manifest's m, printed into why; NULL when they agree. */
static const char *entry_mismatch(const struct entry *m, const struct entry *f,
                                  char *why, size_t len)
{
#define DIFF_U(field, fmt)                                                   \
    if (m->field != f->field) {                                              \
        snprintf(why, len, #field " " fmt " in the file, " fmt " in the "    \
                 "manifest", (unsigned long long)f->field,                   \
                 (unsigned long long)m->field);                              \
        return why;                                                          \
    }
    DIFF_U(bytes, "%llu")
    DIFF_U(xxh3, "%016llx")
    if (strcmp(m->kind, f->kind) != 0) {
        snprintf(why, len, "kind %s in the file, %s in the manifest", f->kind, m->kind);
        return why;
    }
    DIFF_U(shards, "%llu")
    DIFF_U(capacity, "%llu")
    if (m->error_rate != f->error_rate) {
        snprintf(why, len, "error_rate %.17g in the file, %.17g in the manifest",
                 f->error_rate, m->error_rate);
        return why;
    }
    DIFF_U(layers, "%llu")
    DIFF_U(m, "%llu")
    DIFF_U(k, "%llu")
    DIFF_U(inserts, "%llu")
#undef DIFF_U
    if (strcmp(m->fingerprint, f->fingerprint) != 0) {
        snprintf(why, len, "fingerprint %s in the file, %s in the manifest",
                 f->fingerprint, m->fingerprint);
        return why;
    }
    return NULL;
}

/* ---- backup ------------------------------------------------------------ */

/* DIR ready for a backup: made (0700) when missing; when it holds anything,
 * only with force.  0 or CLI_ERR (printed). */
static int backup_dir(const char *dir, bool force)
{
    struct stat sb;
    DIR *d;
    struct dirent *de;
    size_t n = 0;

    if (mkdir(dir, 0700) == 0)
        return durable_fsync_parent(dir) < 0
                   ? cli_fail("%s: cannot sync its parent directory", dir) : 0;
    if (errno != EEXIST)
        return cli_fail("%s: cannot create: %s", dir, strerror(errno));
    if (stat(dir, &sb) < 0 || !S_ISDIR(sb.st_mode))
        return cli_fail("%s: not a directory", dir);
    if (!(d = opendir(dir)))
        return cli_fail("%s: cannot read: %s", dir, strerror(errno));
    while ((de = readdir(d)))
        if (strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0)
            n++;
    closedir(d);
    if (n && !force)
        return cli_fail("backup: %s is not empty (%zu entries): give an empty "
                        "or new directory, or --force to write into it "
                        "(files of the same names are replaced)", dir, n);
    /* An earlier manifest goes first, so that a backup cut short never
     * leaves one naming files it replaced. */
    char path[DURABLE_PATH_MAX];
    dir_path(path, sizeof path, dir, MANIFEST);
    if (unlink(path) < 0 && errno != ENOENT)
        return cli_fail("%s: cannot remove: %s", path, strerror(errno));
    if (durable_fsync_dir(dir) < 0)
        return cli_fail("%s: cannot sync the directory", dir);
    if (sb.st_mode & 077)
        fprintf(stderr, "bloomgrid: warning: %s is open to other users (mode "
                "%04o); a backup holds the filters' secrets: chmod 700 it\n",
                dir, (unsigned)(sb.st_mode & 07777));
    return 0;
}

/* Export one filter into dir and describe it into e. */
static int backup_one(struct online *o, const char *dir,
                      const struct online_info *f, struct entry *e)
{
    char path[DURABLE_PATH_MAX];

    if (strcmp(f->state, "ready") != 0)
        return cli_fail("backup: %s is %s%s%s: it cannot be exported whole",
                        f->name, f->state, f->reason[0] ? ": " : "", f->reason);
    memset(e, 0, sizeof *e);
    snprintf(e->name, sizeof e->name, "%s", f->name);
    snprintf(e->file, sizeof e->file, "%s" FILE_SUFFIX, f->name);
    dir_path(path, sizeof path, dir, e->file);
    if (online_export_file(o, f->name, path, 0600) || describe_file(path, e))
        return CLI_ERR;
    /* The id restore compares with the server's FilterInfo. */
    if (f->fingerprint[0] && strcmp(f->fingerprint, e->fingerprint) != 0)
        return cli_fail("backup: %s: the server shows fingerprint %s, its "
                        "export %s: restore could not match them", f->name,
                        f->fingerprint, e->fingerprint);
    return 0;
}

static int manifest_save(const char *dir, const char *server,
                         const struct entry *e, size_t n)
{
    char path[DURABLE_PATH_MAX], derr[DURABLE_ERRLEN] = "", when[32];
    char *buf = NULL;
    size_t len = 0;
    time_t now = time(NULL);
    FILE *out = open_memstream(&buf, &len);
    int rc;

    if (!out)
        return cli_fail("out of memory");
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    fprintf(out, "# bloomgrid backup (docs/BACKUP.md): one [filter NAME] per "
            "file.  The files\n# hold the filters' secrets: keep this "
            "directory as a credential.\n[backup]\nformat = %d\nserver = %s\n"
            "created = %s\nfilters = %zu\n", BACKUP_FORMAT, server, when, n);
    for (size_t i = 0; i < n; i++)
        manifest_write_entry(out, &e[i]);
    if (fclose(out) != 0) {
        free(buf);
        return cli_fail("out of memory");
    }
    dir_path(path, sizeof path, dir, MANIFEST);
    rc = durable_write_file(path, buf, len, 0600, derr) < 0 ? cli_fail("%s", derr) : 0;
    free(buf);
    return rc;
}

static const struct option backup_longopts[] = {
    {"force", no_argument, NULL, 'f'},
    ONLINE_COMMON_LONGOPTS,
};

static const struct option restore_longopts[] = {
    {"undrop", no_argument, NULL, 'u'},
    ONLINE_COMMON_LONGOPTS,
};

/* Options of backup and restore: common ones, --force for backup (flag:
 * force) and --undrop for restore (flag: undrop). */
static int parse_opts(struct online *o, const char *cmd, int argc, char **argv,
                      bool *flag)
{
    bool backup = strcmp(cmd, "backup") == 0;
    int c, rc;

    online_cmd_init(o);
    cli_getopt_reset();
    while ((c = getopt_long(argc, argv, backup ? ":fh" : ":h",
                            backup ? backup_longopts : restore_longopts,
                            NULL)) != -1) {
        if ((c == 'f' && backup) || (c == 'u' && !backup)) {
            *flag = true;
            continue;
        }
        if ((rc = online_common_opt(o, cmd, c, argv)))
            return rc;
    }
    return online_need_args(cmd, argc - optind, 1, "DIR");
}

/* Calls of both kinds: the catalog's deadline, or a whole transfer's,
 * unless --deadline chose one for all. */
static void deadline(struct online *o, int given, bool transfer)
{
    o->deadline_ms = given > 0 ? given
                     : transfer ? ONLINE_TRANSFER_DEADLINE_MS : ONLINE_DEADLINE_MS;
}

int cmd_backup(int argc, char **argv)
{
    struct online o;
    struct online_info *list = NULL;
    struct entry *e = NULL;
    struct rpc_status st;
    bool force = false;
    size_t n = 0;
    int rc = parse_opts(&o, "backup", argc, argv, &force), given;

    if (rc)
        return rc == CLI_HELP_SHOWN ? CLI_OK : rc;
    const char *dir = argv[optind];
    given = o.deadline_ms;
    if ((rc = backup_dir(dir, force)) || (rc = online_open(&o)))
        return rc;
    deadline(&o, given, false);
    if (online_list(&o, &list, &n, &st) < 0) {
        rc = online_report(&o, &st);
        goto out;
    }
    if (!(e = calloc(n ? n : 1, sizeof *e))) {
        rc = cli_fail("out of memory");
        goto out;
    }
    deadline(&o, given, true);
    for (size_t i = 0; i < n && rc == 0; i++) {
        if ((rc = backup_one(&o, dir, &list[i], &e[i])))
            break;
        printf("backup: %s: %s, %u shards, %llu inserts, %llu bytes in %s\n",
               e[i].name, e[i].kind, e[i].shards,
               (unsigned long long)e[i].inserts, (unsigned long long)e[i].bytes,
               e[i].file);
        fflush(stdout);
    }
    if (rc == 0)
        rc = manifest_save(dir, o.server, e, n);
    /* On failure the one error line says why; no manifest was written. */
    if (rc == 0)
        printf("backup: %zu filters in %s (%s)\n", n, dir, MANIFEST);
out:
    free(e);
    online_info_list_free(list, n);
    online_close(&o);
    return rc;
}

/* ---- restore ----------------------------------------------------------- */

enum plan { PLAN_CREATE, PLAN_MERGE };

/* Every file against the manifest, each problem on its own line.  Returns
 * how many do not verify. */
static size_t verify_all(const char *dir, struct entry *m, size_t n)
{
    char path[DURABLE_PATH_MAX], why[200];
    size_t bad = 0;

    for (size_t i = 0; i < n; i++) {
        struct entry f = {0};
        dir_path(path, sizeof path, dir, m[i].file);
        if (describe_file(path, &f)) {
            bad++;
            continue;
        }
        if (entry_mismatch(&m[i], &f, why, sizeof why)) {
            cli_fail("%s: does not match the manifest: %s", path, why);
            bad++;
            continue;
        }
        memcpy(m[i].secret, f.secret, sizeof f.secret);
        m[i].placement = f.placement;
        m[i].growth = f.growth;
        m[i].tightening = f.tightening;
    }
    return bad;
}

/* Can e become (or is it alike) the server's filter f (NULL: none)?  0 with
 * *plan set, or CLI_ERR after naming the field that differs. */
static int plan_one(const struct entry *e, const struct online_info *f,
                    enum plan *plan)
{
    int kind;

    if (!f) {
        struct bf_params p = {.kind = BF_KIND_SCALABLE};
        bf_params_default(&p);
        *plan = PLAN_CREATE;
        if (!online_kind_parse(e->kind, &kind))
            return cli_fail("restore: %s: kind %s cannot be created on a "
                            "server", e->name, e->kind);
        if (strcmp(e->kind, "scalable") == 0 &&
            (e->growth != p.growth || e->tightening != p.tightening))
            return cli_fail("restore: %s: a scalable filter of growth %g and "
                            "tightening %g cannot be re-created (CreateFilter "
                            "makes %g and %g)", e->name, e->growth,
                            e->tightening, p.growth, p.tightening);
        return 0;
    }
    *plan = PLAN_MERGE;
    if (strcmp(f->state, "ready") != 0)
        return cli_fail("restore: %s exists and is %s%s%s", e->name, f->state,
                        f->reason[0] ? ": " : "", f->reason);
#define REFUSE(field, fmt, here, there)                                       \
    return cli_fail("restore: %s exists with another " field " (" fmt " on "  \
                    "the server, " fmt " in the backup); drop it or restore "  \
                    "elsewhere", e->name, here, there)
    if (strcmp(f->kind, e->kind) != 0)
        REFUSE("kind", "%s", f->kind, e->kind);
    if (f->shards != e->shards)
        REFUSE("shard count", "%u", f->shards, e->shards);
    if (f->capacity != e->capacity)
        REFUSE("capacity", "%llu", (unsigned long long)f->capacity,
               (unsigned long long)e->capacity);
    if (f->error_rate != e->error_rate)
        REFUSE("error rate", "%g", f->error_rate, e->error_rate);
    if (f->hashes != e->k)
        REFUSE("hash count (k)", "%u", f->hashes, e->k);
    /* Same geometry, another fingerprint: the secret. */
    if (strcmp(f->fingerprint, e->fingerprint) != 0)
        REFUSE("secret", "fingerprint %s", f->fingerprint, e->fingerprint);
#undef REFUSE
    return 0;
}

/* An Export received into memory. */
struct mem_export {
    uint8_t *buf;
    uint64_t len, cap, total;   /* total: 0 until the server says it */
};

/* A chunk of an export held in memory; total as export_chunk takes it (0:
 * not known yet, a router says it on the last chunk). */
static int mem_chunk(void *ctx, uint64_t offset, const void *data, size_t len,
                     uint64_t total)
{
    struct mem_export *x = ctx;

    if (offset != x->len || (total && x->total && total != x->total))
        return cli_fail("export: the server sent bytes out of order");
    if (total)
        x->total = total;
    if (x->total && len > x->total - offset)
        return cli_fail("export: the server sent more than the announced %llu bytes",
                        (unsigned long long)x->total);
    if (x->len + len > x->cap) {
        uint64_t cap = x->total ? x->total : (x->cap ? x->cap : 1u << 20);
        while (cap < x->len + len)
            cap *= 2;
        uint8_t *nb = cap <= SIZE_MAX ? realloc(x->buf, (size_t)cap) : NULL;
        if (!nb)
            return cli_fail("out of memory for an export of %llu bytes",
                            (unsigned long long)cap);
        x->buf = nb;
        x->cap = cap;
    }
    memcpy(x->buf + offset, data, len);
    x->len += len;
    return 0;
}

/* Does every bit (a counting filter: every counter's value) of src show in
 * dst?  Both of one fingerprint. */
static bool holds_all(const struct bundle *dst, const struct bundle *src)
{
    if (dst->count != src->count)
        return false;
    for (uint32_t i = 0; i < src->count; i++) {
        const struct bf *d = dst->shard[i], *s = src->shard[i];
        bool counting = bf_kind(s) == BF_KIND_COUNTING;
        if (bf_layer_count(s) > bf_layer_count(d))
            return false;
        for (uint32_t l = 0; l < bf_layer_count(s); l++) {
            struct bf_layer_info ld, ls;
            bf_layer_info(d, l, &ld);
            bf_layer_info(s, l, &ls);
            if (ld.m != ls.m || ld.body_bytes != ls.body_bytes)
                return false;
            const uint64_t *a = bf_layer_body_const(d, l), *b = bf_layer_body_const(s, l);
            for (uint64_t w = 0; w < ls.body_bytes / 8; w++) {
                if (!counting) {
                    if (b[w] & ~a[w])
                        return false;
                    continue;
                }
                for (int q = 0; q < 64; q += 4)
                    if (((b[w] >> q) & 15) > ((a[w] >> q) & 15))
                        return false;
            }
        }
    }
    return true;
}

/* Does the server's filter already hold everything of the file at path? */
static int already_holds(struct online *o, const struct entry *e,
                         const char *path, bool *holds)
{
    char err[BF_ERRLEN] = "";
    struct mem_export x = {0};
    struct rpc_status st;
    struct bundle *have = NULL, *want = NULL;
    int rc = online_export(o, e->name, mem_chunk, &x, &st);

    if (rc < 0)
        rc = online_report(o, &st);
    else if (rc == 0 && !x.total)
        rc = cli_fail("restore: %s: its export ended after %llu bytes without the "
                      "server saying the file's size", e->name,
                      (unsigned long long)x.len);
    else if (rc == 0 && x.len != x.total)
        rc = cli_fail("restore: %s: its export ended after %llu of %llu bytes",
                      e->name, (unsigned long long)x.len,
                      (unsigned long long)x.total);
    if (rc == 0 && !(have = bundle_parse(x.buf, x.len, err)))
        rc = cli_fail("restore: %s: its export does not verify: %s", e->name, err);
    if (rc == 0 && !(want = cli_load(path)))
        rc = CLI_ERR;
    if (rc == 0)
        *holds = holds_all(have, want);
    bundle_destroy(want);
    bundle_destroy(have);
    free(x.buf);
    return rc;
}

/* Create (when planned; undrop: undoing a drop) and fill one filter, with
 * its summary line. */
static int restore_one(struct online *o, int given, const char *dir,
                       const struct entry *e, enum plan plan, bool undrop)
{
    char path[DURABLE_PATH_MAX];
    struct online_import_result res;
    struct online_info info;
    struct rpc_status st;
    bool holds = false;
    int kind = 0;

    dir_path(path, sizeof path, dir, e->file);
    if (plan == PLAN_CREATE) {
        online_kind_parse(e->kind, &kind);
        deadline(o, given, false);
        /* An undrop puts the shards back where the dropped filter had
         * them: its placement version, as the export recorded it (a file
         * that records none is from a filter placed by rendezvous, 1).  A
         * plain restore makes a new filter: the router's newest. */
        uint32_t placement = e->shards > 1 && undrop
                                 ? (e->placement ? e->placement : 1) : 0;
        int crc = undrop ? online_undrop(o, e->name, e->capacity, e->error_rate,
                                         kind, e->shards, e->secret, placement,
                                         &info, &st)
                         : online_create(o, e->name, e->capacity, e->error_rate,
                                         kind, e->shards, e->secret, placement,
                                         &info, &st);
        if (crc < 0 && st.reason == RPC_REASON_DROPPED) {
            online_report(o, &st);
            return cli_fail("restore: %s was dropped on the server (a filter of "
                            "this name with the backup's secret): a restore "
                            "undoes a drop only when asked to: bloomgrid "
                            "restore --undrop %s (admin)", e->name, dir);
        }
        if (crc < 0)
            return online_report(o, &st);
        bool same = strcmp(info.fingerprint, e->fingerprint) == 0;
        char fp[17];
        snprintf(fp, sizeof fp, "%s", info.fingerprint);
        online_info_deinit(&info);
        if (!same)
            return cli_fail("restore: %s: created with fingerprint %s, not the "
                            "backup's %s: nothing imported; drop it (a router's "
                            "backup restores through a router, a node's through "
                            "a node)", e->name, fp, e->fingerprint);
    }
    deadline(o, given, true);
    if (plan == PLAN_MERGE) {
        if (already_holds(o, e, path, &holds))
            return CLI_ERR;
        if (holds) {
            printf("restore: %s: unchanged (it holds every key of the backup)\n",
                   e->name);
            return 0;
        }
    }
    if (online_import_file(o, e->name, path, &res))
        return cli_fail("restore: %s: the import failed (above)%s", e->name,
                        plan == PLAN_CREATE ? "; the filter was created: run the "
                        "restore again to fill it" : "");
    printf("restore: %s: %s, %llu inserts now, %llu bytes imported\n", e->name,
           plan != PLAN_CREATE ? "imported into the existing filter"
           : undrop ? "created (undropped where it was dropped) and imported"
                    : "created and imported", (unsigned long long)res.info.insert_count,
           (unsigned long long)res.bytes_received);
    fflush(stdout);
    online_info_deinit(&res.info);
    return 0;
}

static const struct online_info *find_info(const struct online_info *list,
                                           size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(list[i].name, name) == 0)
            return &list[i];
    return NULL;
}

int cmd_restore(int argc, char **argv)
{
    struct online o;
    struct manifest m;
    struct online_info *list = NULL;
    struct rpc_status st;
    enum plan *plan = NULL;
    size_t n = 0, bad = 0, done;
    bool undrop = false;
    int rc = parse_opts(&o, "restore", argc, argv, &undrop), given;

    if (rc)
        return rc == CLI_HELP_SHOWN ? CLI_OK : rc;
    const char *dir = argv[optind];
    given = o.deadline_ms;
    if ((rc = manifest_read(dir, &m)))
        goto out;
    /* Every file first: nothing changes unless all of them verify. */
    if ((bad = verify_all(dir, m.e, m.n))) {
        rc = cli_fail("restore: %zu of %zu files of %s do not verify (above); "
                      "nothing was changed", bad, m.n, dir);
        goto out;
    }
    if ((rc = online_open(&o)))
        goto out;
    deadline(&o, given, false);
    if (online_list(&o, &list, &n, &st) < 0) {
        rc = online_report(&o, &st);
        goto out;
    }
    if (!(plan = calloc(m.n ? m.n : 1, sizeof *plan))) {
        rc = cli_fail("out of memory");
        goto out;
    }
    for (size_t i = 0; i < m.n; i++)
        bad += plan_one(&m.e[i], find_info(list, n, m.e[i].name), &plan[i]) != 0;
    if (bad) {
        rc = cli_fail("restore: %zu of %zu filters cannot be restored (above); "
                      "nothing was changed", bad, m.n);
        goto out;
    }
    /* The first failure stops the restore: what failed one filter (a
     * token, a node down) would most often fail the next, and running the
     * restore again leaves the filters done so far as they are. */
    for (done = 0; done < m.n; done++)
        if (restore_one(&o, given, dir, &m.e[done], plan[done], undrop))
            break;
    if (done < m.n)
        rc = cli_fail("restore: stopped at %s (above) after %zu of %zu "
                      "filters; run it again once the cause is fixed",
                      m.e[done].name, done, m.n);
    else
        printf("restore: %zu filters from %s\n", m.n, dir);
out:
    free(plan);
    free(m.e);
    online_info_list_free(list, n);
    online_close(&o);
    return rc;
}
