/* node_sync: the durable list of SYNCING shards (see node_sync.h). */
#include "node_sync.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include <xxhash.h>

#include "bf.h"
#include "errmsg.h"
#include "log.h"
#include "name_index.h"
#include "rules.h"

#define SYNC_HEADER "bloomgrid-syncing 1"
/* The lines of the node as a whole: "*" is no store name, so a node of an
 * earlier version finds the list in doubt (every shard SYNCING). */
#define WHOLE_NEW "* new"
#define WHOLE_REFILLING "* refilling"
#define COPY_HEADER "bloomgrid-copy 1"
#define PEERS_HEADER "bloomgrid-peers 1"

struct sync_ent {
    char name[STORE_NAME_MAX + 1];
    uint64_t secret_id;    /* 0: any */
    uint64_t since_ms;     /* marked or adopted */
};

struct node_sync {
    pthread_mutex_t mu;
    char path[DURABLE_PATH_MAX];
    bool doubt;                  /* the file did not parse */
    enum node_sync_whole whole;  /* under mu; mirrored in held */
    struct sync_ent *v;          /* under mu */
    size_t n, cap;
    atomic_size_t count;         /* n, read without mu */
    /* The names of v with their secret ids (name -> a uint64_t of the
     * index's), changed with v under mu and read without it on the key
     * path (node_sync_listed); ix_broken: an update ran out of memory, so
     * readers take mu and v instead. */
    struct name_index *ix;
    atomic_bool ix_broken;
    struct sync_ent *gone;       /* dropped since the start, under mu */
    size_t ngone, capgone;
    atomic_uint held;            /* enum node_sync_hold bits */
    /* The identity: under idmu, which is never held with mu. */
    pthread_mutex_t idmu;
    char copy_path[DURABLE_PATH_MAX], peers_path[DURABLE_PATH_MAX];
    struct node_sync_copy copy;
    struct peer_ent {
        uint64_t id, epoch;
        char addr[NODE_SYNC_ADDR_MAX + 1];   /* "" unknown or superseded */
    } *peers;
    size_t npeers, cappeers;
};

uint64_t node_sync_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static int ent_push(struct sync_ent **v, size_t *n, size_t *cap,
                    const char *name, uint64_t id)
{
    if (*n == *cap) {
        size_t c = *cap ? 2 * *cap : 16;
        void *nv = realloc(*v, c * sizeof **v);
        if (!nv)
            return -ENOMEM;
        *v = nv;
        *cap = c;
    }
    struct sync_ent *e = &(*v)[(*n)++];
    snprintf(e->name, sizeof e->name, "%s", name);
    e->secret_id = id;
    e->since_ms = node_sync_now_ms();
    return 0;
}

/* v's entry name with secret id was added or changed: the same in ix
 * (mu held). */
static void ix_put(struct node_sync *ns, const char *name, uint64_t id)
{
    uint64_t *p = malloc(sizeof *p);
    int rc = -ENOMEM;

    if (p) {
        *p = id;
        free(name_index_set(ns->ix, name, p, &rc));
    }
    if (rc < 0) {
        free(p);
        atomic_store(&ns->ix_broken, true);   /* never a name left out */
    }
}

/* v's entry name goes (mu held). */
static void ix_del(struct node_sync *ns, const char *name)
{
    free(name_index_remove(ns->ix, name, NULL));
}

static void free_value(void *value, void *ctx)
{
    (void)ctx;
    free(value);
}

static struct sync_ent *ent_find(struct node_sync *ns, const char *name)
{
    for (size_t i = 0; i < ns->n; i++)
        if (strcmp(ns->v[i].name, name) == 0)
            return &ns->v[i];
    return NULL;
}

static void ent_remove(struct node_sync *ns, struct sync_ent *e)
{
    ix_del(ns, e->name);
    *e = ns->v[--ns->n];
    atomic_store(&ns->count, ns->n);
}

/* Parse the file's text.  Returns 0, or -EBADMSG (the list stays empty). */
static int sync_parse(struct node_sync *ns, char *text)
{
    char *save = NULL, *line = strtok_r(text, "\n", &save);

    if (!line || strcmp(line, SYNC_HEADER) != 0)
        return -EBADMSG;
    while ((line = strtok_r(NULL, "\n", &save))) {
        /* The node as a whole (one line at most). */
        if (strcmp(line, WHOLE_NEW) == 0 || strcmp(line, WHOLE_REFILLING) == 0) {
            if (ns->whole != NODE_SYNC_WHOLE_NONE)
                goto bad;
            ns->whole = strcmp(line, WHOLE_NEW) == 0 ? NODE_SYNC_WHOLE_NEW
                                                     : NODE_SYNC_WHOLE_REFILLING;
            continue;
        }
        char *sp = strchr(line, ' '), *hex = sp ? sp + 1 : NULL;
        if (!sp || (size_t)(sp - line) > STORE_NAME_MAX || strlen(hex) != 16 ||
            strspn(hex, "0123456789abcdef") != 16)
            goto bad;
        *sp = 0;
        const char *name = line;
        if (store_name_check(name, NULL) < 0)
            goto bad;
        uint64_t id = strtoull(hex, NULL, 16);
        if (ent_find(ns, name) || ent_push(&ns->v, &ns->n, &ns->cap, name, id) < 0)
            goto bad;
        ix_put(ns, name, id);
    }
    return 0;
bad:
    ns->n = 0;
    name_index_clear(ns->ix, free_value, NULL);
    ns->whole = NODE_SYNC_WHOLE_NONE;
    return -EBADMSG;
}

/* Read the whole of path into *text (NUL-terminated; a NUL inside makes
 * it not parse: *len says how much was read).  Returns 0, -ENOENT, or
 * another negative errno with err set. */
static int read_text(const char *path, char **text, size_t *len, char *err)
{
    FILE *f = fopen(path, "r");
    size_t cap = 1 << 16, n = 0;
    char *t = NULL;

    *text = NULL;
    if (!f) {
        if (errno == ENOENT)
            return -ENOENT;
        errmsg_set(err, "cannot read %s: %s", path, strerror(errno));
        return -errno;
    }
    /* Bounded: one line per shard or peer of this node. */
    if (!(t = malloc(cap + 1)))
        goto nomem;
    for (size_t got; (got = fread(t + n, 1, cap - n, f)) > 0;) {
        n += got;
        if (n == cap) {
            char *nt = realloc(t, 2 * cap + 1);
            if (!nt)
                goto nomem;
            t = nt;
            cap *= 2;
        }
    }
    if (ferror(f)) {
        errmsg_set(err, "cannot read %s: I/O error", path);
        fclose(f);
        free(t);
        return -EIO;
    }
    fclose(f);
    t[n] = 0;
    *text = t;
    *len = n;
    return 0;
nomem:
    errmsg_set(err, "out of memory");
    fclose(f);
    free(t);
    return -ENOMEM;
}

/* Parse COPY: its header, then "ID EPOCH GROUP" ("-": no group). */
static int copy_parse(struct node_sync_copy *c, char *text)
{
    char *save = NULL, *line = strtok_r(text, "\n", &save);
    char hex[17], group[NODE_SYNC_GROUP_MAX + 2];
    unsigned long long epoch;

    if (!line || strcmp(line, COPY_HEADER) != 0 || !(line = strtok_r(NULL, "\n", &save)))
        return -EBADMSG;
    if (sscanf(line, "%16s %llu %64s", hex, &epoch, group) != 3 || strlen(hex) != 16 ||
        strspn(hex, "0123456789abcdef") != 16 || strlen(group) > NODE_SYNC_GROUP_MAX ||
        strtok_r(NULL, "\n", &save))
        return -EBADMSG;
    c->id = strtoull(hex, NULL, 16);
    c->epoch = epoch;
    size_t gl = strcmp(group, "-") ? strlen(group) : 0;   /* checked above */
    memcpy(c->group, group, gl);
    c->group[gl] = 0;
    return c->id ? 0 : -EBADMSG;
}

static int peers_push(struct node_sync *ns, uint64_t id, uint64_t epoch,
                      const char *addr)
{
    if (ns->npeers == ns->cappeers) {
        size_t c = ns->cappeers ? 2 * ns->cappeers : 8;
        void *nv = realloc(ns->peers, c * sizeof *ns->peers);
        if (!nv)
            return -ENOMEM;
        ns->peers = nv;
        ns->cappeers = c;
    }
    struct peer_ent *p = &ns->peers[ns->npeers++];
    *p = (struct peer_ent){.id = id, .epoch = epoch};
    snprintf(p->addr, sizeof p->addr, "%s", addr ? addr : "");
    return 0;
}

/* Parse PEERS, "ID EPOCH [ADDRESS]" per line (a node of an earlier version
 * wrote no address, and reads past it); a list that does not parse is
 * forgotten (it only helps to find a restored or replaced peer). */
static void peers_parse(struct node_sync *ns, char *text)
{
    char *save = NULL, *line = strtok_r(text, "\n", &save);
    char hex[17], addr[NODE_SYNC_ADDR_MAX + 2];
    unsigned long long epoch;

    if (!line || strcmp(line, PEERS_HEADER) != 0)
        goto bad;
    while ((line = strtok_r(NULL, "\n", &save))) {
        addr[0] = 0;
        int got = sscanf(line, "%16s %llu %128s", hex, &epoch, addr);
        if (got < 2 || strlen(hex) != 16 || strspn(hex, "0123456789abcdef") != 16 ||
            strlen(addr) > NODE_SYNC_ADDR_MAX ||
            peers_push(ns, strtoull(hex, NULL, 16), epoch, addr) < 0)
            goto bad;
    }
    return;
bad:
    log_warn("%s does not parse: the epochs and addresses heard from peers are "
             "forgotten", ns->peers_path);
    ns->npeers = 0;
}

static int copy_fill(int fd, void *ctx)
{
    const struct node_sync_copy *c = ctx;
    char text[128 + NODE_SYNC_GROUP_MAX];
    int len = snprintf(text, sizeof text, COPY_HEADER "\n%016" PRIx64 " %" PRIu64 " %s\n",
                       c->id, c->epoch, c->group[0] ? c->group : "-");
    return durable_write_all(fd, text, (size_t)len);
}

static int peers_fill(int fd, void *ctx)
{
    struct node_sync *ns = ctx;
    char line[64 + NODE_SYNC_ADDR_MAX];
    int rc = durable_write_all(fd, PEERS_HEADER "\n", sizeof PEERS_HEADER);

    for (size_t i = 0; rc == 0 && i < ns->npeers; i++) {
        const struct peer_ent *p = &ns->peers[i];
        int len = snprintf(line, sizeof line, "%016" PRIx64 " %" PRIu64 "%s%s\n",
                           p->id, p->epoch, p->addr[0] ? " " : "", p->addr);
        rc = durable_write_all(fd, line, (size_t)len);
    }
    return rc;
}

/* A random copy id, never 0.  Returns 0 or -EIO with err. */
static int id_draw(uint64_t *id, char *err)
{
    *id = 0;
    while (!*id)
        if (getrandom(id, sizeof *id, 0) != sizeof *id) {
            errmsg_set(err, "cannot draw a copy id: %s", strerror(errno));
            return -EIO;
        }
    return 0;
}

/* Read COPY and PEERS, or draw a new identity.  Returns 0 or an error. */
static int identity_open(struct node_sync *ns, const char *dir, char *err)
{
    char *text = NULL;
    size_t len = 0;
    int rc;

    snprintf(ns->copy_path, sizeof ns->copy_path, "%s/%s", dir, NODE_SYNC_COPY_FILE);
    snprintf(ns->peers_path, sizeof ns->peers_path, "%s/%s", dir, NODE_SYNC_PEERS_FILE);
    if ((rc = read_text(ns->peers_path, &text, &len, err)) == 0)
        peers_parse(ns, text);
    free(text);
    if (rc < 0 && rc != -ENOENT)
        return rc;
    rc = read_text(ns->copy_path, &text, &len, err);
    if (rc < 0 && rc != -ENOENT)
        return rc;
    if (rc == 0 && (strlen(text) != len || copy_parse(&ns->copy, text) < 0)) {
        log_error("%s does not parse: every shard of this node is SYNCING until "
                  "it has pulled its group's pages, and the directory gets a new "
                  "copy id", ns->copy_path);
        ns->doubt = true;
        rc = -ENOENT;
    }
    free(text);
    if (rc == -ENOENT) {
        /* A new directory (or one in doubt): a new id, never one a peer
         * has heard of. */
        memset(&ns->copy, 0, sizeof ns->copy);
        if ((rc = id_draw(&ns->copy.id, err)) < 0)
            return rc;
        ns->copy.epoch = 1;
        if ((rc = durable_write_with(ns->copy_path, copy_fill, &ns->copy, 0644, err)) < 0)
            return rc;
    }
    return 0;
}

struct node_sync *node_sync_open(const char *dir, bool *doubt, char *err)
{
    struct node_sync *ns = calloc(1, sizeof *ns);
    char *text = NULL;
    size_t len = 0;
    int rc;

    if (doubt)
        *doubt = false;
    if (!ns) {
        errmsg_set(err, "out of memory");
        return NULL;
    }
    pthread_mutex_init(&ns->mu, NULL);
    pthread_mutex_init(&ns->idmu, NULL);
    if (!(ns->ix = name_index_create())) {
        errmsg_set(err, "out of memory");
        goto fail;
    }
    /* Until anti-entropy has checked the epoch with the peers, nothing is
     * vouched for (ignored in a group of one copy). */
    atomic_init(&ns->held, NODE_SYNC_HOLD_EPOCH);
    snprintf(ns->path, sizeof ns->path, "%s/%s", dir, NODE_SYNC_FILE);
    rc = read_text(ns->path, &text, &len, err);
    if (rc < 0 && rc != -ENOENT)
        goto fail;
    if (rc == 0 && (strlen(text) != len || sync_parse(ns, text) < 0)) {
        log_error("%s does not parse: every shard of this node is SYNCING "
                  "until it has pulled its group's pages", ns->path);
        ns->doubt = true;
    }
    free(text);
    if (identity_open(ns, dir, err) < 0)
        goto fail;
    if (doubt)
        *doubt = ns->doubt;
    atomic_store(&ns->count, ns->n);
    return ns;
fail:
    node_sync_close(ns);
    return NULL;
}

void node_sync_close(struct node_sync *ns)
{
    if (!ns)
        return;
    pthread_mutex_destroy(&ns->mu);
    pthread_mutex_destroy(&ns->idmu);
    if (ns->ix)
        name_index_clear(ns->ix, free_value, NULL);
    name_index_destroy(ns->ix);
    free(ns->v);
    free(ns->gone);
    free(ns->peers);
    free(ns);
}

static int fill(int fd, void *ctx)
{
    struct node_sync *ns = ctx;
    char line[STORE_NAME_MAX + 32];
    int rc = durable_write_all(fd, SYNC_HEADER "\n", sizeof SYNC_HEADER);

    if (rc == 0 && ns->whole == NODE_SYNC_WHOLE_NEW)
        rc = durable_write_all(fd, WHOLE_NEW "\n", sizeof WHOLE_NEW);
    else if (rc == 0 && ns->whole == NODE_SYNC_WHOLE_REFILLING)
        rc = durable_write_all(fd, WHOLE_REFILLING "\n", sizeof WHOLE_REFILLING);
    for (size_t i = 0; rc == 0 && i < ns->n; i++) {
        int len = snprintf(line, sizeof line, "%s %016" PRIx64 "\n", ns->v[i].name,
                           ns->v[i].secret_id);
        rc = durable_write_all(fd, line, (size_t)len);
    }
    return rc;
}

/* Write the list (under mu). */
static int sync_write(struct node_sync *ns, char *err)
{
    return durable_write_with(ns->path, fill, ns, 0644, err);
}

/* The hold bits of the node as a whole follow ns->whole (under mu). */
static void whole_mirror(struct node_sync *ns)
{
    unsigned on = ns->whole == NODE_SYNC_WHOLE_NEW         ? NODE_SYNC_HOLD_NEW
                  : ns->whole == NODE_SYNC_WHOLE_REFILLING ? NODE_SYNC_HOLD_REFILL
                                                           : 0;
    unsigned off = (NODE_SYNC_HOLD_NEW | NODE_SYNC_HOLD_REFILL) & ~on;
    atomic_fetch_or(&ns->held, on);
    atomic_fetch_and(&ns->held, ~off);
}

struct secret_read {
    uint64_t id;
};

static void secret_of(const struct bf *f, void *ctx)
{
    ((struct secret_read *)ctx)->id = XXH3_64bits(bf_secret(f), BF_SECRET_LEN);
}

int node_sync_adopt(struct node_sync *ns, struct store *s, bool mark, char *err)
{
    char **names = NULL;
    size_t nn = 0;
    int rc;

    if ((rc = store_list(s, &names, &nn)) < 0) {
        errmsg_set(err, "cannot list the store's filters");
        return rc;
    }
    pthread_mutex_lock(&ns->mu);
    for (size_t i = 0; i < ns->n;) {
        struct store_filter *sf = store_get(s, ns->v[i].name);
        struct secret_read sr = {0};
        bool keep = sf != NULL;
        if (sf && ns->v[i].secret_id && store_filter_inspect(sf, secret_of, &sr) == 0)
            keep = sr.id == ns->v[i].secret_id;
        if (sf)
            store_put(sf);
        if (keep)
            ns->v[i++].since_ms = node_sync_now_ms();
        else
            ent_remove(ns, &ns->v[i]);
    }
    for (size_t i = 0; mark && i < nn; i++) {
        struct store_filter *sf = store_get(s, names[i]);
        if (!sf)
            continue;
        struct secret_read sr = {0};
        if ((ns->doubt || store_filter_recovery_cut(sf)) && !ent_find(ns, names[i])) {
            store_filter_inspect(sf, secret_of, &sr);
            log_warn("shard %s is SYNCING: %s", names[i],
                     ns->doubt ? "the list of SYNCING shards did not parse"
                               : "its recovery cut records it may have acknowledged");
            if ((rc = ent_push(&ns->v, &ns->n, &ns->cap, names[i], sr.id)) < 0)
                errmsg_set(err, "out of memory");
            else
                ix_put(ns, names[i], sr.id);
        }
        store_put(sf);
        if (rc < 0)
            goto out;
    }
    if (mark && ns->doubt && ns->whole != NODE_SYNC_WHOLE_REFILLING) {
        /* Whether the node was refilling is not known either. */
        log_warn("the node as a whole is SYNCING (refilling): the list of SYNCING "
                 "shards did not parse");
        ns->whole = NODE_SYNC_WHOLE_REFILLING;
    } else if (mark && nn == 0 && ns->whole == NODE_SYNC_WHOLE_NONE) {
        log_info("empty data directory: held (reads refused) until enough copies "
                 "of the group have said whether it holds anything");
        ns->whole = NODE_SYNC_WHOLE_NEW;
    }
    whole_mirror(ns);
    atomic_store(&ns->count, ns->n);
    ns->doubt = false;
    rc = sync_write(ns, err);
out:
    pthread_mutex_unlock(&ns->mu);
    store_list_free(names, nn);
    return rc;
}

bool node_sync_is(struct node_sync *ns, const char *name, uint64_t secret_id)
{
    return ns && (atomic_load(&ns->held) || node_sync_listed(ns, name, secret_id));
}

static void id_read(void *value, void *ctx)
{
    *(uint64_t *)ctx = *(const uint64_t *)value;
}

bool node_sync_listed(struct node_sync *ns, const char *name, uint64_t secret_id)
{
    if (!ns || atomic_load_explicit(&ns->count, memory_order_acquire) == 0)
        return false;
    if (!atomic_load(&ns->ix_broken)) {
        /* Every read of a node with a shard SYNCING asks: by hash, and
         * without mu. */
        uint64_t id = 0;
        if (!name_index_get(ns->ix, name, id_read, &id))
            return false;
        return !id || !secret_id || id == secret_id;
    }
    pthread_mutex_lock(&ns->mu);
    struct sync_ent *e = ent_find(ns, name);
    bool is = e && (!e->secret_id || !secret_id || e->secret_id == secret_id);
    pthread_mutex_unlock(&ns->mu);
    return is;
}

size_t node_sync_count(struct node_sync *ns)
{
    return ns ? atomic_load(&ns->count) : 0;
}

int node_sync_mark(struct node_sync *ns, const char *name, uint64_t secret_id,
                   char *err)
{
    int rc = 0;

    pthread_mutex_lock(&ns->mu);
    struct sync_ent *e = ent_find(ns, name);
    if (e) {
        e->secret_id = secret_id;
        e->since_ms = node_sync_now_ms();
        ix_put(ns, name, secret_id);
    } else if ((rc = ent_push(&ns->v, &ns->n, &ns->cap, name, secret_id)) < 0) {
        errmsg_set(err, "out of memory");
    } else {
        ix_put(ns, name, secret_id);
    }
    atomic_store(&ns->count, ns->n);
    if (rc == 0)
        rc = sync_write(ns, err);
    pthread_mutex_unlock(&ns->mu);
    return rc;
}

int node_sync_clear(struct node_sync *ns, const char *name, uint64_t secret_id,
                    char *err)
{
    int rc = 0;

    pthread_mutex_lock(&ns->mu);
    struct sync_ent *e = ent_find(ns, name);
    if (e && (!secret_id || !e->secret_id || e->secret_id == secret_id)) {
        ent_remove(ns, e);
        rc = sync_write(ns, err);
    }
    pthread_mutex_unlock(&ns->mu);
    return rc;
}

uint64_t node_sync_since(struct node_sync *ns, const char *name)
{
    pthread_mutex_lock(&ns->mu);
    struct sync_ent *e = ent_find(ns, name);
    uint64_t since = e ? e->since_ms : 0;
    pthread_mutex_unlock(&ns->mu);
    return since;
}

void node_sync_forget(struct node_sync *ns, const char *name, uint64_t secret_id)
{
    char err[NODE_SYNC_ERRLEN] = "";

    if (!ns)
        return;
    pthread_mutex_lock(&ns->mu);
    if (ent_push(&ns->gone, &ns->ngone, &ns->capgone, name, secret_id) < 0)
        log_warn("shard %s: out of memory remembering its drop", name);
    pthread_mutex_unlock(&ns->mu);
    /* A list that keeps a dropped shard's entry only costs a re-created
     * shard of that name a sync; the next start drops the entry. */
    if (node_sync_clear(ns, name, 0, err) < 0)
        log_warn("shard %s dropped, but %s", name, err);
}

bool node_sync_dropped(struct node_sync *ns, const char *name, uint64_t secret_id)
{
    bool gone = false;

    pthread_mutex_lock(&ns->mu);
    for (size_t i = 0; i < ns->ngone && !gone; i++)
        gone = strcmp(ns->gone[i].name, name) == 0 &&
               (!ns->gone[i].secret_id || ns->gone[i].secret_id == secret_id);
    pthread_mutex_unlock(&ns->mu);
    return gone;
}

void node_sync_copy_get(struct node_sync *ns, struct node_sync_copy *out)
{
    pthread_mutex_lock(&ns->idmu);
    *out = ns->copy;
    pthread_mutex_unlock(&ns->idmu);
}

int node_sync_copy_set(struct node_sync *ns, uint64_t epoch, const char *group,
                       char *err)
{
    int rc = 0;

    pthread_mutex_lock(&ns->idmu);
    struct node_sync_copy c = ns->copy;
    if (epoch > c.epoch)
        c.epoch = epoch;
    snprintf(c.group, sizeof c.group, "%s", group);
    if (c.epoch != ns->copy.epoch || strcmp(c.group, ns->copy.group) != 0) {
        /* Durable first: no peer hears of an epoch a restart could lose. */
        rc = durable_write_with(ns->copy_path, copy_fill, &c, 0644, err);
        if (rc == 0)
            ns->copy = c;
    }
    pthread_mutex_unlock(&ns->idmu);
    return rc;
}

uint64_t node_sync_peer_heard(struct node_sync *ns, const char *mine,
                              const struct node_sync_announce *a, bool *replaced)
{
    char err[NODE_SYNC_ERRLEN] = "";
    uint64_t before = 0;
    bool other = false, changed = false;

    if (replaced)
        *replaced = false;
    if (!ns || !a || !a->id || !mine || !a->group || strcmp(mine, a->group) != 0)
        return 0;
    const char *addr = a->addr && strlen(a->addr) <= NODE_SYNC_ADDR_MAX ? a->addr : "";
    pthread_mutex_lock(&ns->idmu);
    struct peer_ent *p = NULL;
    for (size_t i = 0; i < ns->npeers; i++) {
        struct peer_ent *q = &ns->peers[i];
        if (q->id == a->id)
            p = q;
        else if (addr[0] && strcmp(q->addr, addr) == 0)
            other = true;
    }
    before = p ? p->epoch : 0;
    /* Kept to undo what a failed write would lose. */
    struct peer_ent *saved = NULL;
    size_t nsaved = ns->npeers;
    if (!p && peers_push(ns, a->id, 0, "") < 0)
        goto out;
    if (!p)
        p = &ns->peers[ns->npeers - 1];
    if ((saved = malloc(nsaved ? nsaved * sizeof *saved : 1)))
        memcpy(saved, ns->peers, nsaved * sizeof *saved);
    if (a->epoch > p->epoch) {
        p->epoch = a->epoch;
        changed = true;
    }
    if (addr[0] && strcmp(p->addr, addr) != 0) {
        snprintf(p->addr, sizeof p->addr, "%s", addr);
        changed = true;
    }
    /* The caller knows it is not the copy that was at addr before: that
     * one is forgotten there (its epochs are kept). */
    for (size_t i = 0; other && a->settled && i < ns->npeers; i++)
        if (ns->peers[i].id != a->id && strcmp(ns->peers[i].addr, addr) == 0) {
            ns->peers[i].addr[0] = 0;
            changed = true;
        }
    if (changed && durable_write_with(ns->peers_path, peers_fill, ns, 0644, err) < 0) {
        /* Not recorded: the next announcement tries again. */
        log_warn("cannot record a peer's epoch and address: %s", err);
        if (saved) {
            memcpy(ns->peers, saved, nsaved * sizeof *saved);
            ns->npeers = nsaved;
        }
    }
    free(saved);
out:
    pthread_mutex_unlock(&ns->idmu);
    if (replaced)
        *replaced = other;
    return before;
}

void node_sync_hold(struct node_sync *ns, enum node_sync_hold why, bool on)
{
    if (!ns)
        return;
    if (on)
        atomic_fetch_or(&ns->held, (unsigned)why);
    else
        atomic_fetch_and(&ns->held, ~(unsigned)why);
}

bool node_sync_held(struct node_sync *ns)
{
    return ns && atomic_load(&ns->held) != 0;
}

bool node_sync_any(struct node_sync *ns)
{
    return ns && (atomic_load(&ns->held) != 0 || atomic_load(&ns->count) != 0);
}

enum node_sync_whole node_sync_whole_get(struct node_sync *ns)
{
    if (!ns)
        return NODE_SYNC_WHOLE_NONE;
    pthread_mutex_lock(&ns->mu);
    enum node_sync_whole w = ns->whole;
    pthread_mutex_unlock(&ns->mu);
    return w;
}

int node_sync_whole_set(struct node_sync *ns, enum node_sync_whole w, char *err)
{
    int rc = 0;

    pthread_mutex_lock(&ns->mu);
    enum node_sync_whole was = ns->whole;
    if (w != was) {
        ns->whole = w;
        rc = sync_write(ns, err);
        if (rc < 0)
            ns->whole = was;
        else
            whole_mirror(ns);
    }
    pthread_mutex_unlock(&ns->mu);
    return rc;
}

enum node_sync_standing node_sync_standing(struct node_sync *ns)
{
    unsigned h = ns ? atomic_load(&ns->held) : 0;

    if (h & NODE_SYNC_HOLD_REFILL)
        return NODE_SYNC_REFILLING;
    if (h & NODE_SYNC_HOLD_NEW)
        return NODE_SYNC_NEW;
    if (h & NODE_SYNC_HOLD_EPOCH)
        return NODE_SYNC_CHECKING;
    return NODE_SYNC_CHECKED;
}

int node_sync_copy_renew(struct node_sync *ns, const char *group, char *err)
{
    struct node_sync_copy c = {.epoch = 1};
    int rc;

    if ((rc = id_draw(&c.id, err)) < 0)
        return rc;
    snprintf(c.group, sizeof c.group, "%s", group);
    pthread_mutex_lock(&ns->idmu);
    if ((rc = durable_write_with(ns->copy_path, copy_fill, &c, 0644, err)) == 0)
        ns->copy = c;
    pthread_mutex_unlock(&ns->idmu);
    return rc;
}
