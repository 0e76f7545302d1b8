/* Tests of the topology parser, the placement rules (rendezvous, version 1,
 * and rendezvous with a capacity bound, version 2) and the shard selection
 * of keys (known answers: a change of any rule moves data and must be
 * caught here). */
#include <check.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bf.h"
#include "topo.h"

/* Every text below starts with this line, so its lines count from 2. */
#define V "version = 1\n"

static const char *three =
    "; three groups\n"
    "version = 7\n"
    "[group g0]\n"
    "copies = 10.0.0.1:7400 10.0.1.1:7400\n"
    "datacenter = dc1\n"
    "\n"
    "[group g1]\n"
    "copies = 10.0.0.2:7400\n"
    "[group g2]\n"
    "copies = 10.0.0.3:7400  10.0.1.3:7400\t10.0.2.3:7400\n";

/* Parse text that must fail; return the message. */
static const char *parse_fails(const char *text)
{
    static char err[TOPO_ERRLEN];
    err[0] = 0;
    struct topo *t = topo_parse(text, "t.ini", err);
    ck_assert_msg(t == NULL, "parsed a bad topology: %s", text);
    topo_unref(t);
    return err;
}

/* Parse text that must parse. */
static struct topo *parse_ok(const char *text)
{
    char err[TOPO_ERRLEN] = "";
    struct topo *t = topo_parse(text, "t.ini", err);
    ck_assert_msg(t != NULL, "refused: %s", err);
    return t;
}

START_TEST(parse_reads_groups_sorted_with_copies)
{
    const char *shuffled = V "[group b]\ncopies=h2:2\n[group a]\ncopies=h1:1\n";
    struct topo *t = parse_ok(three);
    ck_assert_uint_eq(t->version, 7);
    ck_assert_uint_eq(t->ngroups, 3);
    ck_assert_str_eq(t->groups[0].name, "g0");
    ck_assert_uint_eq(t->groups[0].ncopies, 2);
    ck_assert_str_eq(t->groups[0].copies[0], "10.0.0.1:7400");
    ck_assert_str_eq(t->groups[0].copies[1], "10.0.1.1:7400");
    ck_assert_str_eq(t->groups[0].datacenter, "dc1");
    ck_assert_int_eq(t->groups[0].line, 3);
    ck_assert_uint_eq(t->groups[1].ncopies, 1);
    ck_assert_uint_eq(t->groups[2].ncopies, 3);
    ck_assert_str_eq(t->groups[2].copies[2], "10.0.2.3:7400");
    ck_assert_str_eq(t->groups[1].datacenter, "");
    unsigned copy = 99;
    ck_assert_int_eq(topo_group_of(t, "10.0.1.3:7400", &copy), 2);
    ck_assert_uint_eq(copy, 1);
    ck_assert_int_eq(topo_group_of(t, "10.0.0.2:7400", NULL), 1);
    ck_assert_int_eq(topo_group_of(t, "10.0.0.9:7400", &copy), -1);
    topo_unref(t);

    t = parse_ok(shuffled);
    ck_assert_str_eq(t->groups[0].name, "a");
    ck_assert_str_eq(t->groups[1].name, "b");
    topo_unref(t);
}
END_TEST

/* W defaults to a majority and R to N - W + 1; the file's defaults apply to
 * every group that does not set its own. */
START_TEST(quorums_default_to_majority_and_intersect)
{
    struct topo *t = parse_ok(V "[group a]\ncopies = h:1\n[group b]\ncopies = h:2 h:3\n"
                              "[group c]\ncopies = h:4 h:5 h:6\n[group d]\n"
                              "copies = h:7 h:8 h:9 h:10\n");
    static const unsigned w[4] = {1, 2, 2, 3}, r[4] = {1, 1, 2, 2};
    for (unsigned i = 0; i < 4; i++) {
        ck_assert_uint_eq(t->groups[i].write_quorum, w[i]);
        ck_assert_uint_eq(t->groups[i].read_quorum, r[i]);
    }
    topo_unref(t);

    t = parse_ok(V "write_quorum = 3\n[group a]\ncopies = h:4 h:5 h:6\n"
                 "[group b]\ncopies = h:1 h:2 h:3\nwrite_quorum = 2\nread_quorum = 3\n");
    ck_assert_uint_eq(t->groups[0].write_quorum, 3);
    ck_assert_uint_eq(t->groups[0].read_quorum, 1);
    ck_assert_uint_eq(t->groups[1].write_quorum, 2);
    ck_assert_uint_eq(t->groups[1].read_quorum, 3);
    topo_unref(t);

    t = parse_ok(V "read_quorum = 2\nwrite_quorum = 2\n[group a]\ncopies = h:1 h:2 h:3\n");
    ck_assert_uint_eq(t->groups[0].write_quorum, 2);
    ck_assert_uint_eq(t->groups[0].read_quorum, 2);
    topo_unref(t);
}
END_TEST

START_TEST(quorums_out_of_range_or_not_meeting_are_refused)
{
    ck_assert_str_eq(parse_fails(V "[group a]\ncopies = h:1 h:2 h:3\n"
                                 "write_quorum = 1\nread_quorum = 2\n"),
                     "t.ini:5: group a: read_quorum 2 + write_quorum 1 must exceed "
                     "its 3 copies, or a read quorum would not meet every write "
                     "quorum");
    ck_assert_str_eq(parse_fails(V "[group a]\ncopies = h:1 h:2 h:3\nwrite_quorum = 4\n"),
                     "t.ini:4: group a has 3 copies: write_quorum 4 must be 1..3");
    ck_assert_str_eq(parse_fails(V "read_quorum = 2\n[group a]\ncopies = h:1\n"),
                     "t.ini:2: group a has 1 copy: read_quorum 2 must be 1..1");
    ck_assert_str_eq(parse_fails(V "[group a]\ncopies = h:1\nwrite_quorum = 0\n"),
                     "t.ini:4: write_quorum \"0\" must be a number from 1 to 8");
    ck_assert_str_eq(parse_fails(V "[group a]\ncopies = h:1\nread_quorum = two\n"),
                     "t.ini:4: read_quorum \"two\" must be a number from 1 to 8");
    /* Defaults that do not meet in one group: the defaults' line. */
    ck_assert_str_eq(parse_fails(V "write_quorum = 1\nread_quorum = 1\n[group a]\n"
                                 "copies = h:1\n[group b]\ncopies = h:2 h:3\n"),
                     "t.ini:3: group b: read_quorum 1 + write_quorum 1 must exceed "
                     "its 2 copies, or a read quorum would not meet every write "
                     "quorum");
}
END_TEST

START_TEST(version_is_required_before_the_groups)
{
    ck_assert_str_eq(parse_fails("[group a]\ncopies = h:1\n"),
                     "t.ini:1: no version: a topology starts with version = N "
                     "(1..2^63), raised on every change so nodes can refuse calls "
                     "made under another one");
    ck_assert_str_eq(parse_fails("version = 0\n[group a]\ncopies = h:1\n"),
                     "t.ini:1: version \"0\" must be a number from 1 to 2^63");
    ck_assert_str_eq(parse_fails("version = 9223372036854775809\n[group a]\n"
                                 "copies = h:1\n"),
                     "t.ini:1: version \"9223372036854775809\" must be a number "
                     "from 1 to 2^63");
    ck_assert_str_eq(parse_fails("version = 1\nversion = 2\n[group a]\ncopies = h:1\n"),
                     "t.ini:2: version is set twice (first at line 1)");
    ck_assert_str_eq(parse_fails("[group a]\ncopies = h:1\nversion = 3\n"),
                     "t.ini:3: version belongs before the first [group] section");
    ck_assert_str_eq(parse_fails("version = 1\nprimary = h:1\n[group a]\ncopies = h:1\n"),
                     "t.ini:2: unknown setting \"primary\" before the first [group] "
                     "(expected version, write_quorum or read_quorum)");
    struct topo *t = parse_ok("version = 9223372036854775808\n[group a]\ncopies = h:1\n");
    ck_assert_uint_eq(t->version, 9223372036854775808ULL);
    topo_unref(t);
}
END_TEST

START_TEST(primary_and_replica_are_refused_with_the_new_form)
{
    ck_assert_str_eq(parse_fails(V "[group a]\nprimary = h:1\n"),
                     "t.ini:3: group a: \"primary\" is gone: a group is a list of "
                     "equal copies, written copies = HOST:PORT HOST:PORT ... "
                     "(docs/TOPOLOGY.md)");
    ck_assert_str_eq(parse_fails(V "[group a]\ncopies = h:1\nreplica = h:2\n"),
                     "t.ini:4: group a: \"replica\" is gone: a group is a list of "
                     "equal copies, written copies = HOST:PORT HOST:PORT ... "
                     "(docs/TOPOLOGY.md)");
}
END_TEST

START_TEST(parse_errors_name_the_line)
{
    ck_assert_str_eq(parse_fails(V "[group a]\ncopies = h:1\ncopis = h:2\n"),
                     "t.ini:4: unknown setting \"copis\" in group a (expected "
                     "copies, write_quorum, read_quorum, datacenter, or copies_next or "
                     "copies_prev with their quorums)");
    ck_assert_str_eq(parse_fails(V "[group a]\ncopies = h:1\n[nodes]\nx = 1\n"),
                     "t.ini:4: unknown section [nodes] (expected [group NAME])");
    ck_assert_str_eq(parse_fails(V "[group a]\ncopies = nohost\n"),
                     "t.ini:3: group a: copy \"nohost\" is not host:port");
    ck_assert_str_eq(parse_fails(V "[group a]\ncopies = h:70000\n"),
                     "t.ini:3: group a: copy \"h:70000\": the port must be a "
                     "number from 1 to 65535");
    ck_assert_str_eq(parse_fails(V "[group a]\ncopies = h:1\n\n[group b]\n"
                                 "copies = h:2 h:1\n"),
                     "t.ini:6: node h:1 is listed twice (already in group a)");
    ck_assert_str_eq(parse_fails(V "[group a]\ncopies = h:1 h:2 h:1\n"),
                     "t.ini:3: node h:1 is listed twice (already in group a)");
    ck_assert_str_eq(parse_fails(V "[group a]\ncopies = h:1\ncopies = h:2\n"),
                     "t.ini:4: group a has a second copies line (first at line 3): "
                     "list every copy on one line");
    ck_assert_str_eq(parse_fails(V "[group a]\ncopies = h:1 h:2 h:3 h:4 h:5 h:6 h:7 "
                                 "h:8 h:9\n"),
                     "t.ini:3: group a has more than 8 copies");
    ck_assert_str_eq(parse_fails(V "[group a]\ncopies = h:1\n[group a]\n"
                                 "copies = h:2\n"),
                     "t.ini:4: group \"a\" is defined twice (first at line 2)");
    ck_assert_str_eq(parse_fails(V "[group a]\ncopies = h:1\n[group b]\n"
                                 "datacenter = x\n"),
                     "t.ini:4: group b has no copies (expected copies = HOST:PORT "
                     "HOST:PORT ...)");
    ck_assert_str_eq(parse_fails(V "[group a]\ncopies = h:1\nthis is not ini\n"),
                     "t.ini:4: syntax error (expected [group NAME], name = value, "
                     "or a comment starting with ; or #)");
    ck_assert_str_eq(parse_fails(V "[group a/b]\ncopies = h:1\n"),
                     "t.ini:2: group name \"a/b\" must be 1..43 characters of "
                     "[A-Za-z0-9._-]");
    ck_assert_str_eq(parse_fails(V "; nothing\n"),
                     "t.ini:2: no [group NAME] section: a topology needs at "
                     "least one group");
}
END_TEST

START_TEST(load_reads_a_file_and_names_it_in_errors)
{
    char path[] = "/tmp/topo-XXXXXX", err[TOPO_ERRLEN];
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    const char *bad = V "[group a]\ncopies = h:1 :2\n";
    ck_assert_int_eq(write(fd, three, strlen(three)), (ssize_t)strlen(three));
    close(fd);
    struct topo *t = topo_load(path, err);
    ck_assert_ptr_nonnull(t);
    ck_assert_uint_eq(t->ngroups, 3);
    topo_unref(t);

    FILE *f = fopen(path, "w");
    fputs(bad, f);
    fclose(f);
    ck_assert_ptr_null(topo_load(path, err));
    char want[600];
    snprintf(want, sizeof want, "%s:3: group a: copy \":2\" has no host (host:port)",
             path);
    ck_assert_str_eq(err, want);
    unlink(path);
    ck_assert_ptr_null(topo_load(path, err));
    ck_assert_ptr_nonnull(strstr(err, "cannot open"));
}
END_TEST

/* Every address of a group goes through the one address rule: no port
 * above 65535 (it would wrap to another port), no empty or signed port, no
 * empty host. */
START_TEST(addresses_follow_the_address_rule)
{
    static const char *const bad[] = {"h:99999", "h:65536", "h:0", "h:", "h:abc",
                                      "h:+80", ":80", "h:123456"};
    char text[256];

    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(text, sizeof text, V "[group a]\ncopies = %s\n", bad[i]);
        const char *e = parse_fails(text);
        ck_assert_msg(strncmp(e, "t.ini:3: group a: copy \"", 24) == 0, "%s", e);
        snprintf(text, sizeof text, V "[group a]\ncopies = h:1 %s\n", bad[i]);
        e = parse_fails(text);
        ck_assert_msg(strncmp(e, "t.ini:3: group a: copy \"", 24) == 0, "%s", e);
    }
    ck_assert_str_eq(parse_fails(V "[group a]\ncopies = h:99999\n"),
                     "t.ini:3: group a: copy \"h:99999\": the port must be a "
                     "number from 1 to 65535");
    struct topo *t = parse_ok(V "[group a]\ncopies = h:65535 [::1]:1\n");
    topo_unref(t);
    ck_assert_int_eq(topo_addr_check("h:99999"), -EINVAL);
    ck_assert_int_eq(topo_addr_check("h:7400"), 0);
}
END_TEST

/* libinih keeps 49 characters of a section header: a longer group name
 * was cut silently, and the shards of the cut name went elsewhere. */
START_TEST(group_names_past_43_bytes_are_refused_not_cut)
{
    char name[64], text[256];

    memset(name, 'n', 43);
    name[43] = 0;
    snprintf(text, sizeof text, V "[group %s]\ncopies = h:1\n", name);
    struct topo *t = parse_ok(text);
    ck_assert_str_eq(t->groups[0].name, name);
    topo_unref(t);

    strcat(name, "x");
    snprintf(text, sizeof text, V "; a long name\n[group %s]\ncopies = h:1\n", name);
    ck_assert_str_eq(parse_fails(text),
                     "t.ini:3: section [group nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnx] "
                     "is 50 characters; at most 49 fit (a group name of 1..43 "
                     "characters after \"group \")");
    /* Two names that differ only past the cut are not one group. */
    snprintf(text, sizeof text, V "[group %s]\ncopies = h:1\n[group %.43sy]\n"
             "copies = h:2\n", name, name);
    ck_assert_ptr_nonnull(strstr(parse_fails(text), "t.ini:2: section [group "));
    /* A second space before the name counts too: refused, not cut. */
    snprintf(text, sizeof text, V "[group  %.43s]\ncopies = h:1\n", name);
    ck_assert_ptr_nonnull(strstr(parse_fails(text), "is 50 characters"));
}
END_TEST

/* Known answers of the placement rule: XXH3-64 of filter\0shard(le32)\0group. */
START_TEST(placement_known_answers)
{
    char err[TOPO_ERRLEN];
    static const unsigned want[16] = {1, 0, 0, 1, 0, 1, 2, 2, 0, 0, 2, 1, 1, 1, 2, 0};
    ck_assert_uint_eq(topo_score("f", 0, "g0"), 0xe4716220ac4c6db7ULL);
    struct topo *t = topo_parse(V "[group g0]\ncopies=a:1\n[group g1]\ncopies=b:1 b:2\n"
                                "[group g2]\ncopies=c:1\n", "t.ini", err);
    ck_assert_ptr_nonnull(t);
    for (uint32_t i = 0; i < 16; i++)
        ck_assert_uint_eq(topo_group_for(t, "slugs", i), want[i]);
    unsigned count[3] = {0};
    for (uint32_t i = 0; i < 64; i++)
        count[topo_group_for(t, "slugs", i)]++;
    ck_assert_uint_eq(count[0], 20);
    ck_assert_uint_eq(count[1], 20);
    ck_assert_uint_eq(count[2], 24);
    topo_unref(t);
}
END_TEST

START_TEST(placement_ignores_file_order_and_moves_little_on_a_new_group)
{
    char err[TOPO_ERRLEN];
    struct topo *a = topo_parse(V "[group g0]\ncopies=a:1\n[group g1]\ncopies=b:1\n"
                                "[group g2]\ncopies=c:1\n", "a", err);
    struct topo *b = topo_parse(V "[group g2]\ncopies=c:1\n[group g0]\ncopies=a:1\n"
                                "[group g1]\ncopies=b:1\n", "b", err);
    struct topo *c = topo_parse(V "[group g2]\ncopies=c:1\n[group g0]\ncopies=a:1\n"
                                "[group g1]\ncopies=b:1\n[group g3]\ncopies=d:1\n",
                                "c", err);
    ck_assert_ptr_nonnull(a);
    ck_assert_ptr_nonnull(b);
    ck_assert_ptr_nonnull(c);
    unsigned moved = 0;
    for (uint32_t i = 0; i < 1024; i++) {
        unsigned ga = topo_group_for(a, "f", i);
        ck_assert_str_eq(a->groups[ga].name, b->groups[topo_group_for(b, "f", i)].name);
        const char *gc = c->groups[topo_group_for(c, "f", i)].name;
        if (strcmp(gc, a->groups[ga].name) != 0) {
            ck_assert_str_eq(gc, "g3");   /* only to the new group */
            moved++;
        }
    }
    /* About a quarter moves. */
    ck_assert_uint_gt(moved, 200);
    ck_assert_uint_lt(moved, 320);
    topo_unref(a);
    topo_unref(b);
    topo_unref(c);
}
END_TEST

/* Known answers of key hashing and shard selection (bf_hash_key with the
 * secret 00 01 .. 1f; the shard is the high 32 bits of h2 scaled to S). */
START_TEST(shard_selection_known_answers)
{
    uint8_t secret[BF_SECRET_LEN];
    char err[BF_ERRLEN];
    for (int i = 0; i < BF_SECRET_LEN; i++)
        secret[i] = (uint8_t)i;
    struct bf_params p = {.capacity = 1, .error_rate = 0.5, .secret = secret};
    struct bf *f = bf_create(&p, err);
    ck_assert_ptr_nonnull(f);
    struct bf_hash h = bf_hash_key(f, "key-0", 5);
    ck_assert_uint_eq(h.h1, 0xe9b10cbec4a7e125ULL);
    ck_assert_uint_eq(h.h2, 0x63b351ed4ce5a93eULL);
    ck_assert_uint_eq(bf_hash_shard(h, 64), 24);
    h = bf_hash_key(f, "key-1", 5);
    ck_assert_uint_eq(h.h2, 0x341c3172070f9da8ULL);
    ck_assert_uint_eq(bf_hash_shard(h, 64), 13);
    h = bf_hash_key(f, "key-2", 5);
    ck_assert_uint_eq(bf_hash_shard(h, 64), 28);
    /* The low 32 bits of h2 never choose the shard. */
    struct bf_hash g = {0, 0x8000000000000000ULL};
    ck_assert_uint_eq(bf_hash_shard(g, 64), 32);
    g.h2 |= 0xffffffffULL;
    g.h1 = ~0ULL;
    ck_assert_uint_eq(bf_hash_shard(g, 64), 32);
    ck_assert_uint_eq(bf_hash_shard(g, 1), 0);
    bf_destroy(f);
}
END_TEST

/* A group changing its copies: copies_next (moving to it) and copies_prev
 * (coming from it) name the other set of a joint phase. */
START_TEST(joint_sets_parse_with_members_and_quorums)
{
    struct topo *t = parse_ok(V "[group g]\ncopies = a:1 b:1 x:1\n"
                                "copies_next = a:1 b:1 j:1\n");
    const struct topo_group *g = &t->groups[0];
    ck_assert_int_eq(g->joint, TOPO_JOINT_NEXT);
    ck_assert_uint_eq(g->ncopies, 3);
    ck_assert_uint_eq(g->write_quorum, 2);
    ck_assert_uint_eq(g->read_quorum, 2);
    ck_assert_uint_eq(g->nother, 3);
    ck_assert_uint_eq(g->other_write_quorum, 2);
    ck_assert_uint_eq(g->other_read_quorum, 2);
    /* Members: the copies, then the new one; a, b and j are the next set. */
    ck_assert_uint_eq(g->nmembers, 4);
    ck_assert_str_eq(topo_member(g, 2), "x:1");
    ck_assert_str_eq(topo_member(g, 3), "j:1");
    ck_assert_uint_eq(g->other_mask, 0x1 | 0x2 | 0x8);
    unsigned m = 99;
    ck_assert_int_eq(topo_group_of(t, "j:1", &m), 0);
    ck_assert_uint_eq(m, 3);
    ck_assert_int_eq(topo_group_of(t, "x:1", &m), 0);
    ck_assert_uint_eq(m, 2);
    topo_unref(t);

    /* The second step: reads from the new copies, writes to the old too. */
    t = parse_ok(V "[group g]\ncopies_prev = a:1 b:1 x:1\ncopies = a:1 b:1 j:1\n");
    g = &t->groups[0];
    ck_assert_int_eq(g->joint, TOPO_JOINT_PREV);
    ck_assert_str_eq(g->copies[2], "j:1");
    ck_assert_str_eq(topo_member(g, 3), "x:1");
    ck_assert_uint_eq(g->other_mask, 0x1 | 0x2 | 0x8);
    topo_unref(t);

    /* Adding a copy with its own quorums; no joint set: no other members. */
    t = parse_ok(V "[group g]\ncopies = a:1 b:1 c:1\ncopies_next = a:1 b:1 c:1 d:1\n"
                   "write_quorum_next = 3\nread_quorum_next = 2\n[group h]\ncopies = e:1\n");
    ck_assert_uint_eq(t->groups[0].other_write_quorum, 3);
    ck_assert_uint_eq(t->groups[0].other_read_quorum, 2);
    ck_assert_uint_eq(t->groups[1].nmembers, 1);
    ck_assert_uint_eq(t->groups[1].nother, 0);
    ck_assert_uint_eq(t->groups[1].other_write_quorum, 0);
    topo_unref(t);
}
END_TEST

START_TEST(joint_sets_are_checked)
{
    /* A read of the new set must meet every write of the old: removing c
     * from three copies at W = 2 needs R = 2 on the two left. */
    ck_assert_str_eq(parse_fails(V "[group g]\ncopies = a:1 b:1 c:1\n"
                                   "copies_next = a:1 b:1\n"),
                     "t.ini:4: group g: read quorum 1 of copies_next + write quorum 2 "
                     "of copies must exceed the 3 copies, or a read of the new copies "
                     "could miss a write the old ones acknowledged (raise "
                     "read_quorum_next)");
    struct topo *t = parse_ok(V "[group g]\ncopies = a:1 b:1 c:1\ncopies_next = a:1 b:1\n"
                                "read_quorum_next = 2\n");
    ck_assert_uint_eq(t->groups[0].nmembers, 3);
    ck_assert_uint_eq(t->groups[0].other_mask, 0x3);
    topo_unref(t);
    ck_assert_str_eq(parse_fails(V "[group g]\ncopies = a:1 b:1\ncopies_prev = a:1 b:1 c:1\n"),
                     "t.ini:4: group g: read quorum 1 of copies + write quorum 2 of "
                     "copies_prev must exceed the 3 copies_prev, or a read of the new "
                     "copies could miss a write the old ones acknowledged (raise "
                     "read_quorum)");
    /* One other set, with its own quorum keys only. */
    ck_assert_str_eq(parse_fails(V "[group g]\ncopies = a:1\ncopies_next = a:1 b:1\n"
                                   "copies_prev = c:1\n"),
                     "t.ini:5: group g: copies_prev after copies_next at line 4: a "
                     "group changes from one set of copies to one other set at a "
                     "time (docs/REPLICATION.md)");
    ck_assert_str_eq(parse_fails(V "[group g]\ncopies = a:1\nwrite_quorum_next = 1\n"),
                     "t.ini:4: group g: a quorum of copies_next without copies_next");
    ck_assert_str_eq(parse_fails(V "[group g]\ncopies = a:1\ncopies_next = a:1 b:1\n"
                                   "write_quorum_prev = 1\n"),
                     "t.ini:5: group g has copies_next: its quorums are "
                     "write_quorum_next and read_quorum_next");
    ck_assert_str_eq(parse_fails(V "[group g]\ncopies = a:1 b:1 c:1\ncopies_next = a:1 b:1 c:1\n"
                                   "write_quorum_next = 1\nread_quorum_next = 2\n"),
                     "t.ini:6: group g: read_quorum_next 2 + write_quorum_next 1 must "
                     "exceed its 3 next copies, or a read quorum would not meet every "
                     "write quorum");
    /* An address in the other set of another group, or twice in one set. */
    ck_assert_str_eq(parse_fails(V "[group g]\ncopies = a:1\ncopies_next = a:1 b:1\n"
                                   "[group h]\ncopies = b:1\n"),
                     "t.ini:6: node b:1 is listed twice (already in group g)");
    ck_assert_str_eq(parse_fails(V "[group g]\ncopies = a:1\ncopies_next = b:1 b:1\n"),
                     "t.ini:4: node b:1 is listed twice (already in group g)");
    ck_assert_str_eq(parse_fails(V "[group g]\ncopies = a:1 b:1 c:1 d:1 e:1\n"
                                   "copies_next = f:1 g:1 h:1 i:1\n"),
                     "t.ini:4: group g: copies and copies_next name more than 8 nodes "
                     "together; change fewer copies at once");
}
END_TEST

/* Long copies lists go on over indented lines; a line past the INI
 * reader's buffer is refused, naming it, never cut. */
START_TEST(long_copies_lists_span_lines_and_long_lines_are_refused)
{
    char a[3][80];
    for (int i = 0; i < 3; i++)
        snprintf(a[i], sizeof a[i], "bloomgrid-node-%d.bloomgrid-node.bloomgrid.svc.cluster.local:7401", i);
    char text[1024];
    snprintf(text, sizeof text, V "[group g0]\ncopies = %s\n  %s\n\t%s\nwrite_quorum = 2\n",
             a[0], a[1], a[2]);
    struct topo *t = parse_ok(text);
    ck_assert_uint_eq(t->groups[0].ncopies, 3);
    for (int i = 0; i < 3; i++)
        ck_assert_str_eq(t->groups[0].copies[i], a[i]);
    ck_assert_uint_eq(t->groups[0].write_quorum, 2);
    topo_unref(t);
    snprintf(text, sizeof text, V "[group g0]\ncopies = %s %s %s\n", a[0], a[1], a[2]);
    const char *err = parse_fails(text);
    ck_assert_msg(strstr(err, "t.ini:3:") && strstr(err, "longer than"), "%s", err);
    /* The same for a joint set. */
    snprintf(text, sizeof text, V "[group g0]\ncopies = h1:1 h2:2 h3:3\n"
             "copies_next = h1:1 h2:2\n  h4:4\nread_quorum_next = 2\n");
    t = parse_ok(text);
    ck_assert_uint_eq(t->groups[0].nother, 3);
    topo_unref(t);
}
END_TEST

/* Version 2's known answers: where no group is full yet a shard lands
 * where version 1 puts it, so "slugs" starts as above; its 64 shards end
 * 20/21/23 (at most ceil(64/3) + 1 = 23), and "old", 24/14/26 under
 * version 1, is 23/18/23. */
START_TEST(placement_v2_known_answers)
{
    char err[TOPO_ERRLEN];
    static const uint16_t want[16] = {1, 0, 0, 1, 0, 1, 2, 2, 0, 0, 2, 1, 1, 1, 2, 0};
    struct topo *t = topo_parse(V "[group g0]\ncopies=a:1\n[group g1]\ncopies=b:1 b:2\n"
                                "[group g2]\ncopies=c:1\n", "t.ini", err);
    ck_assert_ptr_nonnull(t);
    uint16_t g[64];
    ck_assert_int_eq(topo_place(t, "slugs", 64, TOPO_PLACEMENT_BOUNDED, g), 0);
    for (uint32_t i = 0; i < 16; i++)
        ck_assert_uint_eq(g[i], want[i]);
    static const struct {
        const char *filter;
        uint32_t placement;
        unsigned count[3];
    } cases[] = {
        {"slugs", 1, {20, 20, 24}}, {"slugs", 2, {20, 21, 23}},
        {"old", 1, {24, 14, 26}},   {"old", 2, {23, 18, 23}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        unsigned count[3] = {0};
        ck_assert_int_eq(topo_place(t, cases[c].filter, 64, cases[c].placement, g), 0);
        for (uint32_t i = 0; i < 64; i++) {
            count[g[i]]++;
            /* Version 1 through topo_place is topo_group_for. */
            if (cases[c].placement == 1)
                ck_assert_uint_eq(g[i], topo_group_for(t, cases[c].filter, i));
        }
        for (unsigned k = 0; k < 3; k++)
            ck_assert_msg(count[k] == cases[c].count[k], "%s v%u: group %u holds %u",
                          cases[c].filter, cases[c].placement, k, count[k]);
    }
    topo_unref(t);
}
END_TEST

START_TEST(placement_versions_are_checked)
{
    char err[TOPO_ERRLEN];
    struct topo *t = topo_parse(V "[group a]\ncopies=a:1\n[group b]\ncopies=b:1\n",
                                "t.ini", err);
    uint16_t g0[40], g1[40];
    ck_assert_ptr_nonnull(t);
    ck_assert(topo_placement_known(0));
    ck_assert(topo_placement_known(1));
    ck_assert(topo_placement_known(2));
    ck_assert(!topo_placement_known(3));
    ck_assert_uint_eq(topo_placement_norm(0), 1);
    ck_assert_uint_eq(topo_placement_norm(2), 2);
    ck_assert_int_eq(topo_place(t, "f", 40, 3, g0), -EINVAL);
    ck_assert_int_eq(topo_place(t, "f", 40, TOPO_PLACEMENT_LIMIT, g0), -EINVAL);
    ck_assert_int_eq(topo_place(t, "f", 0, 1, g0), -EINVAL);
    /* 0 (not recorded) is rendezvous. */
    ck_assert_int_eq(topo_place(t, "f", 40, 0, g0), 0);
    ck_assert_int_eq(topo_place(t, "f", 40, 1, g1), 0);
    ck_assert_int_eq(memcmp(g0, g1, sizeof g0), 0);
    topo_unref(t);
}
END_TEST

/* A topology of groups g0 .. g<n-1>. */
static struct topo *groups_of(unsigned n)
{
    static char text[64 * 40];
    char err[TOPO_ERRLEN];
    size_t off = (size_t)snprintf(text, sizeof text, V);
    for (unsigned i = 0; i < n; i++)
        off += (size_t)snprintf(text + off, sizeof text - off,
                                "[group g%u]\ncopies = h%u:1\n", i, i);
    struct topo *t = topo_parse(text, "t.ini", err);
    ck_assert_msg(t != NULL, "%s", err);
    return t;
}

/* Shard 0 is on one group under every version: a router that does not
 * know a filter's version finds it there. */
START_TEST(placement_v2_keeps_shard_0_on_its_rendezvous_group)
{
    static const unsigned G[] = {1, 2, 3, 7, 32};
    for (size_t k = 0; k < sizeof G / sizeof G[0]; k++) {
        struct topo *t = groups_of(G[k]);
        uint16_t g[300];
        for (unsigned f = 0; f < 200; f++) {
            char name[16];
            snprintf(name, sizeof name, "f%u", f);
            uint32_t S = 1 + f % 300;
            if (topo_place(t, name, S, 2, g) != 0 || g[0] != topo_group_for(t, name, 0))
                ck_abort_msg("%s, %u shards on %u groups: shard 0 on %u", name, S,
                             G[k], g[0]);
        }
        topo_unref(t);
    }
}
END_TEST

/* Version 2's bound, max shards per group <= ceil(S/G) + 1, for every G of
 * 1..32 and a dense sample of S in 1..4096, on the scores of real group
 * names (one matrix per G; S shards use its first S rows).  Version 2
 * places shards in index order with one capacity C for every S of
 * ((C - 2) G, (C - 1) G], so the placement of such an S is the first S
 * entries of the placement of the range's largest: one call per C checks
 * the whole range (every S up to 600, then every eighth range, and the
 * last), and the prefix rule itself is checked where S is placed on its
 * own.  Version 1 on the same scores is the plain highest score, and
 * topo_place agrees with topo_place_scored. */
START_TEST(placement_v2_bound_holds_for_every_shape)
{
    enum { SMAX = 4096, GMAX = 32 };
    uint64_t *scores = malloc((size_t)SMAX * GMAX * sizeof *scores);
    uint16_t *g = malloc(SMAX * sizeof *g), *h = malloc(SMAX * sizeof *h);
    unsigned load[GMAX], count[GMAX];
    ck_assert(scores && g && h);
    for (unsigned G = 1; G <= GMAX; G++) {
        struct topo *t = groups_of(G);
        for (uint32_t i = 0; i < SMAX; i++)
            for (unsigned k = 0; k < G; k++)
                scores[(size_t)i * G + k] = topo_score("bound", i, t->groups[k].name);
        unsigned checked = 0;
        for (unsigned C = 2; (C - 2) * G < SMAX; C++) {
            uint32_t lo = (C - 2) * G + 1, hi = (C - 1) * G < SMAX ? (C - 1) * G : SMAX;
            if (hi > 600 && C % 8 != 0 && hi != SMAX)
                continue;
            ck_assert_int_eq(topo_place_scored(scores, hi, G, 2, load, g), 0);
            memset(count, 0, sizeof count);
            unsigned most = 0;
            /* Check sends a message per assertion: one per range here. */
            for (uint32_t i = 0; i < hi; i++) {
                if (g[i] >= G)
                    ck_abort_msg("S %u G %u: shard %u on group %u", hi, G, i, g[i]);
                if (++count[g[i]] > most)
                    most = count[g[i]];
                /* S = i + 1 shards: the first i + 1 entries. */
                if (i + 1 >= lo) {
                    if (most > (i + G) / G + 1)
                        ck_abort_msg("S %u G %u: a group holds %u", i + 1, G, most);
                    checked++;
                }
            }
            if (C % 16 == 0 || hi == SMAX) {
                ck_assert_int_eq(topo_place_scored(scores, lo, G, 2, load, h), 0);
                ck_assert_int_eq(memcmp(g, h, lo * sizeof *g), 0);
                ck_assert_int_eq(topo_place(t, "bound", hi, 2, h), 0);
                ck_assert_int_eq(memcmp(g, h, hi * sizeof *g), 0);
                ck_assert_int_eq(topo_place_scored(scores, hi, G, 1, load, g), 0);
                for (uint32_t i = 0; i < hi; i++)
                    if (g[i] != topo_group_for(t, "bound", i))
                        ck_abort_msg("version 1, shard %u: not rendezvous", i);
            }
        }
        ck_assert_uint_gt(checked, 1000);
        topo_unref(t);
    }
    free(scores);
    free(g);
    free(h);
}
END_TEST

/* A group added: version 2 moves 261 of 1024 shards (257 of them to the
 * new group), version 1 267 (all to the new group); both are pinned so a
 * change of either rule is caught. */
START_TEST(placement_v2_moves_pinned_on_a_new_group)
{
    char err[TOPO_ERRLEN];
    struct topo *a = topo_parse(V "[group g0]\ncopies=a:1\n[group g1]\ncopies=b:1\n"
                                "[group g2]\ncopies=c:1\n", "a", err);
    struct topo *c = topo_parse(V "[group g2]\ncopies=c:1\n[group g0]\ncopies=a:1\n"
                                "[group g1]\ncopies=b:1\n[group g3]\ncopies=d:1\n",
                                "c", err);
    static uint16_t ga[1024], gc[1024];
    ck_assert_ptr_nonnull(a);
    ck_assert_ptr_nonnull(c);
    static const unsigned moved_want[3] = {0, 267, 261}, to_new_want[3] = {0, 267, 257};
    for (uint32_t v = 1; v <= 2; v++) {
        unsigned moved = 0, to_new = 0;
        ck_assert_int_eq(topo_place(a, "f", 1024, v, ga), 0);
        ck_assert_int_eq(topo_place(c, "f", 1024, v, gc), 0);
        for (uint32_t i = 0; i < 1024; i++)
            if (strcmp(a->groups[ga[i]].name, c->groups[gc[i]].name) != 0) {
                moved++;
                to_new += strcmp(c->groups[gc[i]].name, "g3") == 0;
            }
        ck_assert_uint_eq(moved, moved_want[v]);
        ck_assert_uint_eq(to_new, to_new_want[v]);
    }
    topo_unref(a);
    topo_unref(c);
}
END_TEST

Suite *topo_suite(void)
{
    Suite *s = suite_create("topo");
    TCase *tc = tcase_create("topo");
    tcase_add_test(tc, parse_reads_groups_sorted_with_copies);
    tcase_add_test(tc, quorums_default_to_majority_and_intersect);
    tcase_add_test(tc, quorums_out_of_range_or_not_meeting_are_refused);
    tcase_add_test(tc, version_is_required_before_the_groups);
    tcase_add_test(tc, primary_and_replica_are_refused_with_the_new_form);
    tcase_add_test(tc, parse_errors_name_the_line);
    tcase_add_test(tc, load_reads_a_file_and_names_it_in_errors);
    tcase_add_test(tc, addresses_follow_the_address_rule);
    tcase_add_test(tc, group_names_past_43_bytes_are_refused_not_cut);
    tcase_add_test(tc, placement_known_answers);
    tcase_add_test(tc, placement_ignores_file_order_and_moves_little_on_a_new_group);
    tcase_add_test(tc, placement_v2_known_answers);
    tcase_add_test(tc, placement_versions_are_checked);
    tcase_add_test(tc, placement_v2_keeps_shard_0_on_its_rendezvous_group);
    tcase_add_test(tc, placement_v2_moves_pinned_on_a_new_group);
    tcase_add_test(tc, shard_selection_known_answers);
    tcase_add_test(tc, joint_sets_parse_with_members_and_quorums);
    tcase_add_test(tc, joint_sets_are_checked);
    tcase_add_test(tc, long_copies_lists_span_lines_and_long_lines_are_refused);
    suite_add_tcase(s, tc);
    /* The bound over some million shapes: seconds, more under sanitizers. */
    TCase *slow = tcase_create("bound");
    tcase_set_timeout(slow, 120);
    tcase_add_test(slow, placement_v2_bound_holds_for_every_shape);
    suite_add_tcase(s, slow);
    return s;
}
