/* node_sync: the durable list of SYNCING shards (node/node_sync.h). */
#include <check.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "log.h"
#include "node_sync.h"
#include "store.h"
#include "unit_tmpdir.h"
#include "unit_wal.h"

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

/* Write tdir/name with text. */
static void write_named(const char *name, const char *text)
{
    char path[600];
    snprintf(path, sizeof path, "%s/%s", tdir, name);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

static void write_file(const char *text)
{
    write_named(NODE_SYNC_FILE, text);
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

/* In a child that then exits without closing the store (a crash): five
 * acknowledged adds of 100 hashes to "a", one commit group each. */
static void crash_after_adds(void)
{
    int status;
    pid_t pid = fork();

    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        struct store *s = open_with(NULL);
        struct store_filter *sf = store_get(s, "a");
        struct bf_hash h[100];
        char err[STORE_ERRLEN];
        for (int b = 0; b < 5; b++) {
            for (int i = 0; i < 100; i++)
                h[i] = (struct bf_hash){(uint64_t)(b * 100 + i) * 0x9e3779b97f4a7c15ull + 1,
                                        (uint64_t)(b * 100 + i) * 0xbf58476d1ce4e5b9ull + 7};
            if (store_add_hashes(sf, h, 100, NULL, err) < 0)
                _exit(1);
        }
        _exit(0);
    }
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* A shard whose log lost records it had acknowledged (a unit zeroed in
 * the middle of the log, later groups vouching for it) is loaded by a copy
 * of a group and listed SYNCING, to be filled from the others. */
START_TEST(a_shard_whose_log_lost_acknowledged_records_is_syncing)
{
    const char *names[] = {"a", NULL};
    char wal[700];
    struct unit_wal_rec v[2];

    log_set_level(LOG_LEVEL_OFF);   /* the damage is logged, as it should */
    store_close(open_with(names));
    crash_after_adds();
    snprintf(wal, sizeof wal, "%s/.wal/wal-0000000000000001.log", tdir);
    uint32_t u = unit_wal_unit(wal);
    ck_assert_uint_gt(u, 0);
    ck_assert_uint_eq(unit_wal_records(wal, false, v, 2), 5);
    unsigned char *z = calloc(1, u);
    int fd = open(wal, O_WRONLY);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(pwrite(fd, z, u, v[1].off / u * u), (ssize_t)u);
    close(fd);
    free(z);

    struct store_options o = {.dir = tdir, .in_group = true};
    char err[STORE_ERRLEN];
    struct store *s = store_open(&o, err);
    ck_assert_msg(s, "%s", err);
    struct store_filter *sf = store_get(s, "a");
    ck_assert_int_eq(store_filter_state(sf, NULL), STORE_READY);
    store_put(sf);
    struct node_sync *ns = adopt(s, NULL);
    ck_assert(node_sync_listed(ns, "a", 0));
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

START_TEST(copy_identity_is_durable_and_only_grows)
{
    char err[NODE_SYNC_ERRLEN] = "";
    struct node_sync_copy c, d;
    struct node_sync *ns = node_sync_open(tdir, NULL, err);
    ck_assert_msg(ns, "%s", err);
    node_sync_copy_get(ns, &c);
    ck_assert_uint_ne(c.id, 0);
    ck_assert_uint_eq(c.epoch, 1);
    ck_assert_str_eq(c.group, "");
    ck_assert_int_eq(node_sync_copy_set(ns, 5, "g0", err), 0);
    ck_assert_int_eq(node_sync_copy_set(ns, 3, "g0", err), 0);
    node_sync_close(ns);
    ns = node_sync_open(tdir, NULL, err);
    node_sync_copy_get(ns, &d);
    ck_assert_uint_eq(d.id, c.id);
    ck_assert_uint_eq(d.epoch, 5);
    ck_assert_str_eq(d.group, "g0");
    node_sync_close(ns);
}
END_TEST

START_TEST(copy_file_in_doubt_marks_every_shard_and_draws_a_new_id)
{
    const char *names[] = {"a", "b", NULL};
    struct store *s = open_with(names);
    char err[NODE_SYNC_ERRLEN] = "";
    struct node_sync_copy c, d;
    struct node_sync *ns = adopt(s, NULL);
    node_sync_copy_get(ns, &c);
    node_sync_close(ns);
    const char *bad[] = {"", "bloomgrid-copy 1\n", "bloomgrid-copy 1\nzz 1 g\n",
                         "bloomgrid-copy 1\n0000000000000000 1 g\n",
                         "bloomgrid-copy 2\n00000000000000aa 1 g\n"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_named(NODE_SYNC_COPY_FILE, bad[i]);
        bool doubt = false;
        ns = node_sync_open(tdir, &doubt, err);
        ck_assert_msg(ns, "%s", err);
        ck_assert_msg(doubt, "COPY %zu parsed", i);
        ck_assert_int_eq(node_sync_adopt(ns, s, true, err), 0);
        ck_assert(node_sync_listed(ns, "a", 0) && node_sync_listed(ns, "b", 0));
        node_sync_copy_get(ns, &d);
        ck_assert_uint_ne(d.id, c.id);
        ck_assert_uint_eq(d.epoch, 1);
        node_sync_close(ns);
    }
    store_close(s);
}
END_TEST

/* An announcement of copy id at epoch from addr (settled or not). */
static uint64_t heard(struct node_sync *ns, const char *group, uint64_t id,
                      uint64_t epoch, const char *addr, bool settled, bool *replaced)
{
    struct node_sync_announce a = {.group = group, .id = id, .epoch = epoch,
                                   .addr = addr, .settled = settled};
    return node_sync_peer_heard(ns, "g0", &a, replaced);
}

START_TEST(peer_epochs_are_remembered_per_group)
{
    char err[NODE_SYNC_ERRLEN] = "";
    struct node_sync *ns = node_sync_open(tdir, NULL, err);
    ck_assert_msg(ns, "%s", err);
    ck_assert_uint_eq(heard(ns, "g0", 42, 4, NULL, false, NULL), 0);
    ck_assert_uint_eq(heard(ns, "g0", 42, 3, NULL, false, NULL), 4);
    ck_assert_uint_eq(heard(ns, "g0", 42, 6, NULL, false, NULL), 4);
    /* Another group is neither answered nor recorded. */
    ck_assert_uint_eq(heard(ns, "g1", 43, 9, NULL, false, NULL), 0);
    ck_assert_uint_eq(heard(ns, "g1", 43, 9, NULL, false, NULL), 0);
    node_sync_close(ns);
    ns = node_sync_open(tdir, NULL, err);
    ck_assert_uint_eq(heard(ns, "g0", 42, 1, NULL, false, NULL), 6);
    ck_assert_uint_eq(heard(ns, "g0", 43, 1, NULL, false, NULL), 0);
    node_sync_close(ns);
    /* A list that does not parse is forgotten, not fatal. */
    write_named(NODE_SYNC_PEERS_FILE, "bloomgrid-peers 1\nnot a line\n");
    ns = node_sync_open(tdir, NULL, err);
    ck_assert_msg(ns, "%s", err);
    ck_assert_uint_eq(heard(ns, "g0", 42, 1, NULL, false, NULL), 0);
    node_sync_close(ns);
}
END_TEST

START_TEST(another_copy_at_an_address_is_told_until_it_is_settled)
{
    char err[NODE_SYNC_ERRLEN] = "";
    bool replaced = true;
    struct node_sync *ns = node_sync_open(tdir, NULL, err);
    ck_assert_msg(ns, "%s", err);
    /* The first copy at A: nothing recorded there before. */
    heard(ns, "g0", 42, 5, "10.0.0.1:7400", true, &replaced);
    ck_assert(!replaced);
    heard(ns, "g0", 42, 6, "10.0.0.1:7400", true, &replaced);
    ck_assert(!replaced);
    /* Another copy at B does not touch A. */
    heard(ns, "g0", 50, 1, "10.0.0.2:7400", true, &replaced);
    ck_assert(!replaced);
    node_sync_close(ns);
    /* The addresses are durable, and an older PEERS line (no address)
     * still reads. */
    ns = node_sync_open(tdir, NULL, err);
    ck_assert_msg(ns, "%s", err);
    /* A new copy at A is told, and keeps being told while it is not
     * settled (new, or its epoch not checked: an answer may be lost). */
    heard(ns, "g0", 77, 1, "10.0.0.1:7400", false, &replaced);
    ck_assert(replaced);
    heard(ns, "g0", 77, 2, "10.0.0.1:7400", false, &replaced);
    ck_assert(replaced);
    /* Settled (refilling): told once more, then the earlier copy is
     * forgotten at A (its epochs are kept). */
    heard(ns, "g0", 77, 3, "10.0.0.1:7400", true, &replaced);
    ck_assert(replaced);
    heard(ns, "g0", 77, 4, "10.0.0.1:7400", true, &replaced);
    ck_assert(!replaced);
    ck_assert_uint_eq(heard(ns, "g0", 42, 1, NULL, false, &replaced), 6);
    /* Without an address nothing is said of one. */
    ck_assert(!replaced);
    node_sync_close(ns);
    ns = node_sync_open(tdir, NULL, err);
    heard(ns, "g0", 77, 5, "10.0.0.1:7400", false, &replaced);
    ck_assert(!replaced);
    /* Another group is never told. */
    heard(ns, "g1", 78, 1, "10.0.0.1:7400", false, &replaced);
    ck_assert(!replaced);
    node_sync_close(ns);
    write_named(NODE_SYNC_PEERS_FILE, "bloomgrid-peers 1\n000000000000002a 9\n"
                                      "0000000000000032 3 10.0.0.2:7400\n");
    ns = node_sync_open(tdir, NULL, err);
    ck_assert_uint_eq(heard(ns, "g0", 42, 1, NULL, false, NULL), 9);
    heard(ns, "g0", 51, 1, "10.0.0.2:7400", false, &replaced);
    ck_assert(replaced);
    node_sync_close(ns);
}
END_TEST

START_TEST(a_renewed_copy_id_is_new_and_durable)
{
    char err[NODE_SYNC_ERRLEN] = "";
    struct node_sync_copy c, d;
    struct node_sync *ns = node_sync_open(tdir, NULL, err);
    ck_assert_msg(ns, "%s", err);
    ck_assert_int_eq(node_sync_copy_set(ns, 9, "g0", err), 0);
    node_sync_copy_get(ns, &c);
    ck_assert_int_eq(node_sync_copy_renew(ns, "g0", err), 0);
    node_sync_copy_get(ns, &d);
    ck_assert_uint_ne(d.id, c.id);
    ck_assert_uint_eq(d.epoch, 1);
    node_sync_close(ns);
    ns = node_sync_open(tdir, NULL, err);
    node_sync_copy_get(ns, &c);
    ck_assert_uint_eq(c.id, d.id);
    ck_assert_str_eq(c.group, "g0");
    node_sync_close(ns);
}
END_TEST

START_TEST(an_empty_store_is_new_and_the_whole_is_durable)
{
    char err[NODE_SYNC_ERRLEN] = "";
    struct store *s = open_with(NULL);
    struct node_sync *ns = adopt(s, NULL);
    /* Empty, in a group: new, held. */
    ck_assert_int_eq(node_sync_whole_get(ns), NODE_SYNC_WHOLE_NEW);
    ck_assert_int_eq(node_sync_standing(ns), NODE_SYNC_NEW);
    node_sync_hold(ns, NODE_SYNC_HOLD_EPOCH, false);
    ck_assert(node_sync_held(ns) && node_sync_is(ns, "x", 0));
    ck_assert_int_eq(node_sync_whole_set(ns, NODE_SYNC_WHOLE_REFILLING, err), 0);
    ck_assert_int_eq(node_sync_standing(ns), NODE_SYNC_REFILLING);
    node_sync_close(ns);
    /* Refilling is durable: a restart, with or without shards, keeps it. */
    ns = adopt(s, NULL);
    ck_assert_int_eq(node_sync_whole_get(ns), NODE_SYNC_WHOLE_REFILLING);
    ck_assert_int_eq(node_sync_whole_set(ns, NODE_SYNC_WHOLE_NONE, err), 0);
    node_sync_hold(ns, NODE_SYNC_HOLD_EPOCH, false);
    ck_assert(!node_sync_held(ns));
    ck_assert_int_eq(node_sync_standing(ns), NODE_SYNC_CHECKED);
    node_sync_close(ns);
    /* Done: an empty store that was checked once is new again at the next
     * start (nothing in it to vouch for)... */
    ns = adopt(s, NULL);
    ck_assert_int_eq(node_sync_whole_get(ns), NODE_SYNC_WHOLE_NEW);
    node_sync_close(ns);
    store_close(s);
    /* ...and new is kept while its first filter comes in. */
    const char *names[] = {"a", NULL};
    s = open_with(names);
    ns = adopt(s, NULL);
    ck_assert_int_eq(node_sync_whole_get(ns), NODE_SYNC_WHOLE_NEW);
    ck_assert_int_eq(node_sync_whole_set(ns, NODE_SYNC_WHOLE_NONE, err), 0);
    node_sync_close(ns);
    ns = adopt(s, NULL);
    ck_assert_int_eq(node_sync_whole_get(ns), NODE_SYNC_WHOLE_NONE);
    node_sync_close(ns);
    store_close(s);
}
END_TEST

START_TEST(whole_lines_parse_and_a_doubt_refills)
{
    const char *names[] = {"a", NULL};
    struct store *s = open_with(names);
    write_file("bloomgrid-syncing 1\n* refilling\na 0000000000000000\n");
    bool doubt = true;
    struct node_sync *ns = adopt(s, &doubt);
    ck_assert(!doubt);
    ck_assert_int_eq(node_sync_whole_get(ns), NODE_SYNC_WHOLE_REFILLING);
    ck_assert(node_sync_listed(ns, "a", 0));
    ck_assert_uint_eq(node_sync_count(ns), 1);
    node_sync_close(ns);
    /* Two lines of the whole, or an unknown one: doubt, so refilling. */
    const char *bad[] = {"bloomgrid-syncing 1\n* new\n* refilling\n",
                         "bloomgrid-syncing 1\n* other\n"};
    for (size_t i = 0; i < 2; i++) {
        write_file(bad[i]);
        ns = adopt(s, &doubt);
        ck_assert_msg(doubt, "file %zu parsed", i);
        ck_assert_int_eq(node_sync_whole_get(ns), NODE_SYNC_WHOLE_REFILLING);
        ck_assert(node_sync_listed(ns, "a", 0));
        node_sync_close(ns);
    }
    store_close(s);
}
END_TEST

START_TEST(holds_make_every_shard_syncing_until_cleared)
{
    const char *names[] = {"a", NULL};
    struct store *s = open_with(names);
    struct node_sync *ns = adopt(s, NULL);
    /* Held from the start: the epoch is not checked yet. */
    ck_assert(node_sync_held(ns) && node_sync_any(ns));
    ck_assert(node_sync_is(ns, "a", 0) && !node_sync_listed(ns, "a", 0));
    node_sync_hold(ns, NODE_SYNC_HOLD_JOINING, true);
    node_sync_hold(ns, NODE_SYNC_HOLD_EPOCH, false);
    ck_assert(node_sync_is(ns, "a", 0));
    node_sync_hold(ns, NODE_SYNC_HOLD_JOINING, false);
    ck_assert(!node_sync_held(ns) && !node_sync_any(ns));
    ck_assert(!node_sync_is(ns, "a", 0));
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
    tcase_add_test(tc, copy_identity_is_durable_and_only_grows);
    tcase_add_test(tc, copy_file_in_doubt_marks_every_shard_and_draws_a_new_id);
    tcase_add_test(tc, peer_epochs_are_remembered_per_group);
    tcase_add_test(tc, another_copy_at_an_address_is_told_until_it_is_settled);
    tcase_add_test(tc, a_renewed_copy_id_is_new_and_durable);
    tcase_add_test(tc, an_empty_store_is_new_and_the_whole_is_durable);
    tcase_add_test(tc, whole_lines_parse_and_a_doubt_refills);
    tcase_add_test(tc, holds_make_every_shard_syncing_until_cleared);
    tcase_add_test(tc, a_shard_whose_log_lost_acknowledged_records_is_syncing);
    suite_add_tcase(s, tc);
    return s;
}
