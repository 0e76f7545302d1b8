/* Tests of name_index: names to pointers over striped uthash tables. */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "name_index.h"

START_TEST(add_get_set_remove)
{
    struct name_index *ix = name_index_create();
    int a = 1, b = 2, rc;
    ck_assert_ptr_nonnull(ix);
    ck_assert_ptr_null(name_index_get(ix, "x", NULL, NULL));
    ck_assert_int_eq(name_index_add(ix, "x", &a), 0);
    ck_assert_int_eq(name_index_add(ix, "x", &b), -EEXIST);
    ck_assert_ptr_eq(name_index_get(ix, "x", NULL, NULL), &a);
    /* A name is its bytes: no prefix or case matches. */
    ck_assert_ptr_null(name_index_get(ix, "X", NULL, NULL));
    ck_assert_ptr_null(name_index_get(ix, "x.", NULL, NULL));
    ck_assert_ptr_null(name_index_get(ix, "", NULL, NULL));
    ck_assert_ptr_eq(name_index_set(ix, "x", &b, &rc), &a);
    ck_assert_int_eq(rc, 0);
    ck_assert_ptr_eq(name_index_get(ix, "x", NULL, NULL), &b);
    ck_assert_ptr_null(name_index_set(ix, "y", &a, &rc));
    ck_assert_int_eq(rc, 0);
    ck_assert_uint_eq(name_index_count(ix), 2);
    /* Removed only when it holds the value named. */
    ck_assert_ptr_null(name_index_remove(ix, "x", &a));
    ck_assert_ptr_eq(name_index_remove(ix, "x", &b), &b);
    ck_assert_ptr_null(name_index_get(ix, "x", NULL, NULL));
    ck_assert_ptr_eq(name_index_remove(ix, "y", NULL), &a);
    ck_assert_ptr_null(name_index_remove(ix, "y", NULL));
    ck_assert_uint_eq(name_index_count(ix), 0);
    name_index_destroy(ix);
}
END_TEST

static void bump(void *value, void *ctx)
{
    (*(int *)value)++;
    (*(int *)ctx)++;
}

START_TEST(many_names_all_found_and_cleared)
{
    enum { N = 20000 };
    struct name_index *ix = name_index_create();
    static int v[N];
    char name[32];
    int calls = 0, bad = 0;
    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof name, "filter-%d.shard-%d", i / 64, i % 64);
        v[i] = 0;
        if (name_index_add(ix, name, &v[i]) != 0)
            bad++;
    }
    ck_assert_int_eq(bad, 0);
    ck_assert_uint_eq(name_index_count(ix), N);
    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof name, "filter-%d.shard-%d", i / 64, i % 64);
        if (name_index_get(ix, name, bump, &calls) != &v[i] || v[i] != 1)
            bad++;
    }
    ck_assert_int_eq(bad, 0);
    ck_assert_int_eq(calls, N);
    ck_assert(name_index_update(ix, "filter-0.shard-0", bump, &calls));
    ck_assert(!name_index_update(ix, "filter-0.shard-64", bump, &calls));
    ck_assert_int_eq(v[0], 2);
    calls = 0;
    name_index_clear(ix, bump, &calls);
    ck_assert_int_eq(calls, N);
    ck_assert_uint_eq(name_index_count(ix), 0);
    ck_assert_ptr_null(name_index_get(ix, "filter-1.shard-1", NULL, NULL));
    name_index_destroy(ix);
}
END_TEST

/* Readers take a reference inside the lookup while a writer removes and
 * adds names again: a lookup never hands out an entry after its removal
 * returned (the writer marks it removed only then, so a reader's take
 * never sees the mark), which is what lets the last reference free it. */
struct refd {
    atomic_int refs;
    atomic_bool removed;
};

static atomic_long taken_removed, found;

static void take(void *value, void *ctx)
{
    struct refd *e = value;
    (void)ctx;
    if (atomic_load(&e->removed))
        atomic_fetch_add(&taken_removed, 1);
    atomic_fetch_add(&e->refs, 1);
}

struct race {
    struct name_index *ix;
    atomic_bool stop;
};

static void *reader(void *arg)
{
    struct race *r = arg;
    char name[16];
    for (unsigned i = 0; !atomic_load(&r->stop); i++) {
        snprintf(name, sizeof name, "n%u", i % 64);
        struct refd *e = name_index_get(r->ix, name, take, NULL);
        if (!e)
            continue;
        atomic_fetch_add(&found, 1);
        atomic_fetch_sub(&e->refs, 1);
    }
    return NULL;
}

START_TEST(readers_hold_what_they_found_while_a_writer_changes)
{
    enum { K = 64, ROUNDS = 20000 };
    static struct refd v[K];
    struct race r = {.ix = name_index_create()};
    char name[16];
    ck_assert_ptr_nonnull(r.ix);
    for (int i = 0; i < K; i++) {
        snprintf(name, sizeof name, "n%d", i);
        atomic_init(&v[i].refs, 1);   /* the index's */
        ck_assert_int_eq(name_index_add(r.ix, name, &v[i]), 0);
    }
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        ck_assert_int_eq(pthread_create(&th[i], NULL, reader, &r), 0);
    long bad = 0;
    /* The readers running first, and the writer going on past ROUNDS until
     * they have found entries during its changes (on a busy machine the
     * readers may not be scheduled for the writer's first rounds). */
    while (atomic_load(&found) == 0)
        sched_yield();
    long found0 = atomic_load(&found);
    for (int round = 0; round < ROUNDS || (atomic_load(&found) - found0 < 1000 &&
                                           round < 100 * ROUNDS); round++) {
        int k = round % K;
        snprintf(name, sizeof name, "n%d", k);
        struct refd *old = name_index_remove(r.ix, name, NULL);
        bad += old != &v[k];
        atomic_store(&v[k].removed, true);
        atomic_fetch_sub(&v[k].refs, 1);
        /* The readers' references end; none is taken any more. */
        while (atomic_load(&v[k].refs) != 0)
            ;
        atomic_store(&v[k].removed, false);
        atomic_store(&v[k].refs, 1);
        bad += name_index_add(r.ix, name, &v[k]) != 0;
    }
    atomic_store(&r.stop, true);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    ck_assert_int_eq(bad, 0);
    ck_assert_int_eq(atomic_load(&taken_removed), 0);
    ck_assert_int_gt(atomic_load(&found) - found0, 0);
    name_index_destroy(r.ix);
}
END_TEST

Suite *name_index_suite(void)
{
    Suite *s = suite_create("name_index");
    TCase *tc = tcase_create("name_index");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, add_get_set_remove);
    tcase_add_test(tc, many_names_all_found_and_cleared);
    tcase_add_test(tc, readers_hold_what_they_found_while_a_writer_changes);
    suite_add_tcase(s, tc);
    return s;
}
