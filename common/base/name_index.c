/* name_index: uthash tables behind striped read-write locks (see
 * name_index.h).
 *
 * The name is hashed once with uthash's own function; the stripe is the
 * top bits of that hash and the bucket inside the stripe's table the low
 * bits (uthash's), so the two choices do not correlate.  uthash runs in
 * its non-fatal out-of-memory mode: an add that cannot grow a table is
 * undone and reported, never an exit.
 */
#include "name_index.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static __thread int oom;   /* set by uthash when an add ran out of memory */

#define HASH_NONFATAL_OOM 1
#define uthash_nonfatal_oom(obj) (oom = 1)
#include <uthash.h>

_Static_assert((NAME_INDEX_STRIPES & (NAME_INDEX_STRIPES - 1)) == 0,
               "a power of two");

struct ent {
    UT_hash_handle hh;
    void *value;
    char name[];
};

struct stripe {
    pthread_rwlock_t lock;
    struct ent *head;            /* uthash table, under lock */
} __attribute__((aligned(64)));

struct name_index {
    struct stripe s[NAME_INDEX_STRIPES];
};

/* The stripe of a hash: its top bits (uthash's hash is 32 bits). */
static unsigned stripe_of(unsigned hashv)
{
    return (unsigned)(((uint32_t)hashv * (uint64_t)NAME_INDEX_STRIPES) >> 32);
}

struct name_index *name_index_create(void)
{
    struct name_index *ix;

    if (posix_memalign((void **)&ix, 64, sizeof *ix) != 0)
        return NULL;
    for (unsigned i = 0; i < NAME_INDEX_STRIPES; i++) {
        pthread_rwlock_init(&ix->s[i].lock, NULL);
        ix->s[i].head = NULL;
    }
    return ix;
}

void name_index_destroy(struct name_index *ix)
{
    if (!ix)
        return;
    name_index_clear(ix, NULL, NULL);
    for (unsigned i = 0; i < NAME_INDEX_STRIPES; i++)
        pthread_rwlock_destroy(&ix->s[i].lock);
    free(ix);
}

/* Hash name: its length in *len, its stripe in *st. */
static unsigned hash_name(struct name_index *ix, const char *name, size_t *len,
                          struct stripe **st)
{
    unsigned hashv;

    *len = strlen(name);
    HASH_VALUE(name, *len, hashv);
    *st = &ix->s[stripe_of(hashv)];
    return hashv;
}

void *name_index_get(struct name_index *ix, const char *name, name_index_fn take,
                     void *ctx)
{
    struct stripe *st;
    struct ent *e;
    size_t len;
    unsigned hashv = hash_name(ix, name, &len, &st);
    void *v = NULL;

    pthread_rwlock_rdlock(&st->lock);
    HASH_FIND_BYHASHVALUE(hh, st->head, name, len, hashv, e);
    if (e) {
        v = e->value;
        if (take)
            take(v, ctx);
    }
    pthread_rwlock_unlock(&st->lock);
    return v;
}

/* Add a new entry for name (not there) under the write lock.  0 or
 * -ENOMEM. */
static int add_locked(struct stripe *st, const char *name, size_t len,
                      unsigned hashv, void *value)
{
    struct ent *e = malloc(sizeof *e + len + 1);

    if (!e)
        return -ENOMEM;
    memcpy(e->name, name, len + 1);
    e->value = value;
    oom = 0;
    HASH_ADD_KEYPTR_BYHASHVALUE(hh, st->head, e->name, len, hashv, e);
    if (oom) {
        free(e);
        return -ENOMEM;
    }
    return 0;
}

int name_index_add(struct name_index *ix, const char *name, void *value)
{
    struct stripe *st;
    struct ent *e;
    size_t len;
    unsigned hashv = hash_name(ix, name, &len, &st);
    int rc;

    pthread_rwlock_wrlock(&st->lock);
    HASH_FIND_BYHASHVALUE(hh, st->head, name, len, hashv, e);
    rc = e ? -EEXIST : add_locked(st, name, len, hashv, value);
    pthread_rwlock_unlock(&st->lock);
    return rc;
}

void *name_index_set(struct name_index *ix, const char *name, void *value, int *rc)
{
    struct stripe *st;
    struct ent *e;
    size_t len;
    unsigned hashv = hash_name(ix, name, &len, &st);
    void *old = NULL;

    *rc = 0;
    pthread_rwlock_wrlock(&st->lock);
    HASH_FIND_BYHASHVALUE(hh, st->head, name, len, hashv, e);
    if (e) {
        old = e->value;
        e->value = value;
    } else {
        *rc = add_locked(st, name, len, hashv, value);
    }
    pthread_rwlock_unlock(&st->lock);
    return old;
}

void *name_index_remove(struct name_index *ix, const char *name, const void *want)
{
    struct stripe *st;
    struct ent *e;
    size_t len;
    unsigned hashv = hash_name(ix, name, &len, &st);
    void *v = NULL;

    pthread_rwlock_wrlock(&st->lock);
    HASH_FIND_BYHASHVALUE(hh, st->head, name, len, hashv, e);
    if (e && (!want || e->value == want)) {
        v = e->value;
        HASH_DELETE(hh, st->head, e);
        free(e);
    }
    pthread_rwlock_unlock(&st->lock);
    return v;
}

bool name_index_update(struct name_index *ix, const char *name, name_index_fn fn,
                       void *ctx)
{
    struct stripe *st;
    struct ent *e;
    size_t len;
    unsigned hashv = hash_name(ix, name, &len, &st);

    pthread_rwlock_wrlock(&st->lock);
    HASH_FIND_BYHASHVALUE(hh, st->head, name, len, hashv, e);
    if (e)
        fn(e->value, ctx);
    pthread_rwlock_unlock(&st->lock);
    return e != NULL;
}

void name_index_clear(struct name_index *ix, name_index_fn fn, void *ctx)
{
    for (unsigned i = 0; i < NAME_INDEX_STRIPES; i++) {
        struct stripe *st = &ix->s[i];
        struct ent *e, *tmp;
        pthread_rwlock_wrlock(&st->lock);
        HASH_ITER(hh, st->head, e, tmp) {
            HASH_DELETE(hh, st->head, e);
            if (fn)
                fn(e->value, ctx);
            free(e);
        }
        pthread_rwlock_unlock(&st->lock);
    }
}

size_t name_index_count(struct name_index *ix)
{
    size_t n = 0;

    for (unsigned i = 0; i < NAME_INDEX_STRIPES; i++) {
        pthread_rwlock_rdlock(&ix->s[i].lock);
        n += HASH_COUNT(ix->s[i].head);
        pthread_rwlock_unlock(&ix->s[i].lock);
    }
    return n;
}
