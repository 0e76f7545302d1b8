/* node_sync: the durable list of SYNCING shards (see node_sync.h). */
#include "node_sync.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <xxhash.h>

#include "bf.h"
#include "errmsg.h"
#include "log.h"
#include "rules.h"

#define SYNC_HEADER "bloomgrid-syncing 1"

struct sync_ent {
    char name[STORE_NAME_MAX + 1];
    uint64_t secret_id;    /* 0: any */
    uint64_t since_ms;     /* marked or adopted */
};

struct node_sync {
    pthread_mutex_t mu;
    char path[DURABLE_PATH_MAX];
    bool doubt;                  /* the file did not parse */
    struct sync_ent *v;          /* under mu */
    size_t n, cap;
    atomic_size_t count;         /* n, read without mu */
    struct sync_ent *gone;       /* dropped since the start, under mu */
    size_t ngone, capgone;
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

static struct sync_ent *ent_find(struct node_sync *ns, const char *name)
{
    for (size_t i = 0; i < ns->n; i++)
        if (strcmp(ns->v[i].name, name) == 0)
            return &ns->v[i];
    return NULL;
}

static void ent_remove(struct node_sync *ns, struct sync_ent *e)
{
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
    }
    return 0;
bad:
    ns->n = 0;
    return -EBADMSG;
}

struct node_sync *node_sync_open(const char *dir, bool *doubt, char *err)
{
    struct node_sync *ns = calloc(1, sizeof *ns);
    char *text = NULL;
    FILE *f = NULL;

    if (doubt)
        *doubt = false;
    if (!ns) {
        errmsg_set(err, "out of memory");
        return NULL;
    }
    pthread_mutex_init(&ns->mu, NULL);
    snprintf(ns->path, sizeof ns->path, "%s/%s", dir, NODE_SYNC_FILE);
    if (!(f = fopen(ns->path, "r"))) {
        if (errno == ENOENT)
            return ns;
        errmsg_set(err, "cannot read %s: %s", ns->path, strerror(errno));
        goto fail;
    }
    /* Bounded: one line per shard of this node. */
    size_t cap = 1 << 16, len = 0;
    if (!(text = malloc(cap + 1))) {
        errmsg_set(err, "out of memory");
        goto fail;
    }
    for (size_t got; (got = fread(text + len, 1, cap - len, f)) > 0;) {
        len += got;
        if (len == cap) {
            char *nt = realloc(text, 2 * cap + 1);
            if (!nt) {
                errmsg_set(err, "out of memory");
                goto fail;
            }
            text = nt;
            cap *= 2;
        }
    }
    if (ferror(f)) {
        errmsg_set(err, "cannot read %s: I/O error", ns->path);
        goto fail;
    }
    text[len] = 0;
    if (strlen(text) != len || sync_parse(ns, text) < 0) {
        log_error("%s does not parse: every shard of this node is SYNCING "
                  "until it has pulled its group's pages", ns->path);
        ns->doubt = true;
        if (doubt)
            *doubt = true;
    }
    atomic_store(&ns->count, ns->n);
    fclose(f);
    free(text);
    return ns;
fail:
    if (f)
        fclose(f);
    free(text);
    node_sync_close(ns);
    return NULL;
}

void node_sync_close(struct node_sync *ns)
{
    if (!ns)
        return;
    pthread_mutex_destroy(&ns->mu);
    free(ns->v);
    free(ns->gone);
    free(ns);
}

static int fill(int fd, void *ctx)
{
    struct node_sync *ns = ctx;
    char line[STORE_NAME_MAX + 32];
    int rc = durable_write_all(fd, SYNC_HEADER "\n", sizeof SYNC_HEADER);

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
        }
        store_put(sf);
        if (rc < 0)
            goto out;
    }
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
    if (!ns || atomic_load_explicit(&ns->count, memory_order_acquire) == 0)
        return false;
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
    } else if ((rc = ent_push(&ns->v, &ns->n, &ns->cap, name, secret_id)) < 0) {
        errmsg_set(err, "out of memory");
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
