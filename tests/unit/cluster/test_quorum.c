/* Unit tests of quorum: pinned answers for N = 1..5 and every valid W and
 * R, and the property the rule exists for, checked over every subset of
 * copies: a read that may decide meets every acknowledged write. */
#include <check.h>
#include <stdio.h>
#include <string.h>

#include "quorum.h"
#include "topo.h"

static struct topo_group group(unsigned n, unsigned w, unsigned r)
{
    struct topo_group g;
    memset(&g, 0, sizeof g);
    snprintf(g.name, sizeof g.name, "g");
    g.ncopies = n;
    g.nmembers = n;
    g.write_quorum = w;
    g.read_quorum = r;
    for (unsigned c = 0; c < n; c++)
        snprintf(g.copies[c], sizeof g.copies[c], "10.0.0.%u:7400", c + 1);
    return g;
}

static unsigned popcount(unsigned v)
{
    return (unsigned)__builtin_popcount(v);
}

START_TEST(pinned_answers_for_common_groups)
{
    /* N, W, R: what a write waits for, what a read needs, what a wiped
     * copy pulls from (of N - 1 others). */
    static const struct {
        unsigned n, w, r, sync;
    } cases[] = {
        {1, 1, 1, 0}, {2, 1, 2, 1}, {2, 2, 1, 1}, {3, 2, 2, 2}, {3, 3, 1, 1},
        {3, 1, 3, 2}, {4, 3, 2, 2}, {5, 3, 3, 3}, {5, 4, 2, 2}, {5, 5, 1, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct topo_group g = group(cases[i].n, cases[i].w, cases[i].r);
        ck_assert_uint_eq(quorum_write_need(&g), cases[i].w);
        ck_assert_uint_eq(quorum_write_need_other(&g), 0);
        ck_assert_uint_eq(quorum_read_need(&g), cases[i].r);
        ck_assert_uint_eq(quorum_sync_need(&g, cases[i].n - 1), cases[i].sync);
        ck_assert(quorum_write_met(&g, cases[i].w, 0));
        ck_assert(!quorum_write_met(&g, cases[i].w - 1, 0));
        ck_assert(quorum_read_met(&g, cases[i].r));
        ck_assert(!quorum_read_met(&g, cases[i].r - 1));
    }
}
END_TEST

/* For every N <= 5, W and R with R + W > N, every set of copies that
 * acknowledged a write and every set whose answers let a read decide
 * share a copy. */
START_TEST(every_deciding_read_meets_every_acknowledged_write)
{
    unsigned checked = 0;
    for (unsigned n = 1; n <= 5; n++)
        for (unsigned w = 1; w <= n; w++)
            for (unsigned r = n - w + 1; r <= n; r++) {
                struct topo_group g = group(n, w, r);
                for (unsigned acked = 0; acked < 1u << n; acked++) {
                    if (!quorum_write_met(&g, popcount(acked), 0))
                        continue;
                    for (unsigned read = 0; read < 1u << n; read++) {
                        if (!quorum_read_met(&g, popcount(read)))
                            continue;
                        ck_assert_msg(acked & read, "N %u W %u R %u: write %x read %x", n,
                                      w, r, acked, read);
                        checked++;
                    }
                }
            }
    ck_assert_uint_gt(checked, 1000);
}
END_TEST

/* A copy that lost everything (copy 0) and then pulled in full from any
 * quorum_sync_need of the others holds every write that W copies
 * acknowledged, unless the write's only copies were itself. */
START_TEST(leaving_syncing_sees_every_acknowledged_write)
{
    for (unsigned n = 2; n <= 5; n++)
        for (unsigned w = 1; w <= n; w++) {
            struct topo_group g = group(n, w, n - w + 1);
            unsigned others = n - 1;
            for (unsigned acked = 0; acked < 1u << n; acked++) {
                if (!quorum_write_met(&g, popcount(acked), 0) || acked == 1u)
                    continue;
                for (unsigned pulled = 0; pulled < 1u << n; pulled += 2) {
                    if (!quorum_sync_met(&g, popcount(pulled), others))
                        continue;
                    ck_assert_msg(acked & pulled, "N %u W %u: write %x pulled %x", n, w,
                                  acked, pulled);
                }
            }
            /* One fewer is not enough: some write is on none of them. */
            unsigned need = quorum_sync_need(&g, others);
            ck_assert(!quorum_sync_met(&g, need - 1, others));
        }
}
END_TEST

/* A SYNCING shard (copy 0, which lost everything) that pulled in full
 * from quorum_shard_sync_need of the others holds every write that W
 * copies acknowledged, with no exception: with W = 1 the need is more than
 * the others (the write may be on copy 0 alone), so it never leaves by
 * itself. */
START_TEST(a_syncing_shard_leaves_only_when_every_write_is_pulled)
{
    static const struct {
        unsigned n, w, need;
    } pinned[] = {
        {2, 1, 2}, {2, 2, 1}, {3, 1, 3}, {3, 2, 2}, {3, 3, 1},
        {4, 3, 2}, {5, 1, 5}, {5, 3, 3}, {5, 4, 2}, {5, 5, 1},
    };
    for (size_t i = 0; i < sizeof pinned / sizeof pinned[0]; i++) {
        struct topo_group g = group(pinned[i].n, pinned[i].w, pinned[i].n - pinned[i].w + 1);
        ck_assert_uint_eq(quorum_shard_sync_need(&g), pinned[i].need);
        ck_assert(quorum_shard_sync_met(&g, pinned[i].need));
        ck_assert(!quorum_shard_sync_met(&g, pinned[i].need - 1));
    }
    for (unsigned n = 2; n <= 5; n++)
        for (unsigned w = 1; w <= n; w++) {
            struct topo_group g = group(n, w, n - w + 1);
            /* W = 1: not even every other copy is enough. */
            ck_assert(quorum_shard_sync_met(&g, n - 1) == (w > 1));
            for (unsigned acked = 0; acked < 1u << n; acked++) {
                if (!quorum_write_met(&g, popcount(acked), 0))
                    continue;
                for (unsigned pulled = 0; pulled < 1u << n; pulled += 2) {
                    if (!quorum_shard_sync_met(&g, popcount(pulled)))
                        continue;
                    ck_assert_msg(acked & pulled, "N %u W %u: write %x pulled %x", n, w,
                                  acked, pulled);
                }
            }
        }
}
END_TEST

START_TEST(a_read_asks_for_the_answers_it_misses)
{
    struct topo_group g = group(3, 2, 2);

    ck_assert_uint_eq(quorum_read_ask(&g, 0, 0, 3), 2);   /* first round: R */
    ck_assert_uint_eq(quorum_read_ask(&g, 1, 1, 1), 0);   /* a slow one still out */
    ck_assert_uint_eq(quorum_read_ask(&g, 1, 0, 1), 1);   /* one failed: ask the third */
    ck_assert_uint_eq(quorum_read_ask(&g, 1, 0, 0), 0);   /* nothing left to ask */
    ck_assert_uint_eq(quorum_read_ask(&g, 2, 0, 1), 0);   /* decided */
    ck_assert(quorum_read_reachable(&g, 1));
    ck_assert(!quorum_read_reachable(&g, 2));             /* two SYNCING or down */

    struct topo_group one = group(5, 5, 1);
    ck_assert_uint_eq(quorum_read_ask(&one, 0, 0, 5), 1);
    ck_assert_uint_eq(quorum_read_ask(&one, 0, 0, 0), 0);
    ck_assert(quorum_read_reachable(&one, 4));
    ck_assert(!quorum_write_reachable(&one, 1, 0));       /* W = N: one down stops writes */
}
END_TEST

START_TEST(readable_and_covered_follow_the_read_quorum)
{
    for (unsigned n = 1; n <= 5; n++)
        for (unsigned w = 1; w <= n; w++)
            for (unsigned r = n - w + 1; r <= n; r++) {
                struct topo_group g = group(n, w, r);
                for (unsigned s = 0; s <= n; s++) {
                    ck_assert(quorum_readable(&g, s) == (s >= r));
                    ck_assert(quorum_covered(&g, s) == (s >= r));
                    ck_assert(quorum_read_reachable(&g, n - s) == (s >= r));
                }
            }
}
END_TEST

/* A joint phase: the group moving from 3 copies to a set of 3 with W' =
 * 2: a write needs W of the copies and W' of the other set. */
START_TEST(a_joint_phase_needs_both_write_quorums)
{
    char err[TOPO_ERRLEN];
    struct topo *t = topo_parse("version = 2\n[group g]\n"
                                "copies = a:1 b:1 c:1\n"
                                "copies_next = a:1 b:1 d:1\n",
                                "joint", err);
    ck_assert_msg(t, "%s", err);
    const struct topo_group *g = &t->groups[0];
    ck_assert_int_eq(g->joint, TOPO_JOINT_NEXT);
    ck_assert_uint_eq(quorum_write_need(g), 2);
    ck_assert_uint_eq(quorum_write_need_other(g), 2);
    ck_assert(quorum_write_met(g, 2, 2));
    ck_assert(!quorum_write_met(g, 3, 1));
    ck_assert(!quorum_write_met(g, 1, 3));
    ck_assert(quorum_write_reachable(g, 1, 1));
    ck_assert(!quorum_write_reachable(g, 0, 2));
    ck_assert_uint_eq(quorum_read_need(g), 2);            /* reads use copies alone */
    topo_unref(t);
}
END_TEST

Suite *quorum_suite(void)
{
    Suite *s = suite_create("quorum");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, pinned_answers_for_common_groups);
    tcase_add_test(tc, every_deciding_read_meets_every_acknowledged_write);
    tcase_add_test(tc, leaving_syncing_sees_every_acknowledged_write);
    tcase_add_test(tc, a_syncing_shard_leaves_only_when_every_write_is_pulled);
    tcase_add_test(tc, a_read_asks_for_the_answers_it_misses);
    tcase_add_test(tc, readable_and_covered_follow_the_read_quorum);
    tcase_add_test(tc, a_joint_phase_needs_both_write_quorums);
    suite_add_tcase(s, tc);
    return s;
}
