/* node_sync: the durable list of SYNCING shards (node/node_sync.h). */
#include <check.h>
#include <stdio.h>
#include <string.h>

#include "node_sync.h"
#include "store.h"
#include "unit_tmpdir.h"

static char tdir[512];

static void setup(void)
{
    unit_tmpdir_make(tdir, sizeof(tdir), "node-sync");
}

static void teardown(void)
{
    unit_tmpdir_remove(tdir);
}

static struct store *open_with(const char *const *names)
{
    struct store_options o = {.dir = tdir};
    char err[STORE_ERRLEN];
    struct store *s = store_open(&o, err);
    ck_assert_msg(s, "%s", err);
    for (; names && *names; names++) {
        struct bf_params p = {.capacity = 1000, .error_rate = 0.01};
        bf_params_default(&p);
        ck_assert_int_eq(store_create(s, *names, &p, err), 0);
    }
    return s;
}

static void write_file(const char *text)
{
    char path[600];
    snprintf(path, sizeof path, "%s/%s", tdir, NODE_SYNC_FILE);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

/* Open the list on tdir and adopt s (as a copy of a group of N > 1). */
static struct node_sync *adopt(struct store *s, bool *doubt)
{
    char err[NODE_SYNC_ERRLEN] = "";
    struct node_sync *ns = node_sync_open(tdir, doubt, err);
    ck_assert_msg(ns, "%s", err);
    ck_assert_int_eq(node_sync_adopt(ns, s, true, err), 0);
    return ns;
}

START_TEST(sync_missing_file_is_empty)
{
    const char *names[] = {"a", "b", NULL};
    struct store *s = open_with(names);
    bool doubt = true;
    struct node_sync *ns = adopt(s, &doubt);
    ck_assert(!doubt);
    ck_assert_uint_eq(node_sync_count(ns), 0);
    ck_assert(!node_sync_listed(ns, "a", 0));
    node_sync_close(ns);
    store_close(s);
}
END_TEST

START_TEST(sync_bad_file_marks_every_shard)
{
    const char *bad[] = {"", "garbage\n", "bloomgrid-syncing 1\na 12\n",
                         "bloomgrid-syncing 1\nbad/name 0000000000000000\n",
                         "bloomgrid-syncing 2\n",
                         "bloomgrid-syncing 1\na 0000000000000000 extra\n"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *names[] = {"a", "b", NULL};
        struct store *s = open_with(i == 0 ? names : NULL);
        write_file(bad[i]);
        bool doubt = false;
        struct node_sync *ns = adopt(s, &doubt);
        ck_assert_msg(doubt, "file %zu parsed", i);
        ck_assert_msg(node_sync_listed(ns, "a", 0) && node_sync_listed(ns, "b", 0),
                      "file %zu: not every shard SYNCING", i);
        node_sync_close(ns);
        /* The rewritten list keeps them after a restart. */
        ns = adopt(s, &doubt);
        ck_assert(!doubt);
        ck_assert_uint_eq(node_sync_count(ns), 2);
        node_sync_close(ns);
        store_close(s);
    }
}
END_TEST

START_TEST(sync_marks_survive_and_clear)
{
    const char *names[] = {"a", "b", NULL};
    struct store *s = open_with(names);
    char err[NODE_SYNC_ERRLEN];
    struct node_sync *ns = adopt(s, NULL);
    ck_assert_int_eq(node_sync_mark(ns, "a", 0, err), 0);
    ck_assert(node_sync_listed(ns, "a", 0));
    ck_assert(!node_sync_listed(ns, "b", 0));
    ck_assert_uint_gt(node_sync_since(ns, "a"), 0);
    node_sync_close(ns);
    ns = adopt(s, NULL);
    ck_assert(node_sync_listed(ns, "a", 0));
    ck_assert_int_eq(node_sync_clear(ns, "a", 0, err), 0);
    ck_assert(!node_sync_listed(ns, "a", 0));
    node_sync_close(ns);
    ns = adopt(s, NULL);
    ck_assert_uint_eq(node_sync_count(ns), 0);
    node_sync_close(ns);
    store_close(s);
}
END_TEST

START_TEST(sync_adopt_drops_entries_of_gone_shards)
{
    const char *names[] = {"a", NULL};
    struct store *s = open_with(names);
    write_file("bloomgrid-syncing 1\na 0000000000000000\ngone 0000000000000000\n"
               "a.shard-1 00000000000000ff\n");
    struct node_sync *ns = adopt(s, NULL);
    ck_assert(node_sync_listed(ns, "a", 0));
    ck_assert(!node_sync_listed(ns, "gone", 0));
    ck_assert_uint_eq(node_sync_count(ns), 1);
    node_sync_close(ns);
    store_close(s);
}
END_TEST

START_TEST(sync_forget_remembers_drops)
{
    const char *names[] = {"a", NULL};
    struct store *s = open_with(names);
    char err[NODE_SYNC_ERRLEN];
    struct node_sync *ns = adopt(s, NULL);
    ck_assert_int_eq(node_sync_mark(ns, "a", 7, err), 0);
    ck_assert(!node_sync_listed(ns, "a", 8));
    ck_assert(node_sync_listed(ns, "a", 7));
    node_sync_forget(ns, "a", 7);
    ck_assert(!node_sync_listed(ns, "a", 0));
    ck_assert(node_sync_dropped(ns, "a", 7));
    ck_assert(!node_sync_dropped(ns, "a", 8));
    node_sync_close(ns);
    store_close(s);
}
END_TEST

Suite *node_sync_suite(void)
{
    Suite *s = suite_create("node_sync");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, sync_missing_file_is_empty);
    tcase_add_test(tc, sync_bad_file_marks_every_shard);
    tcase_add_test(tc, sync_marks_survive_and_clear);
    tcase_add_test(tc, sync_adopt_drops_entries_of_gone_shards);
    tcase_add_test(tc, sync_forget_remembers_drops);
    suite_add_tcase(s, tc);
    return s;
}
