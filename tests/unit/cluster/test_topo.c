/* Tests of the topology parser, the rendezvous placement rule and the shard
 * selection of keys (known answers: a change of either rule moves data and
 * must be caught here). */
#include <check.h>
#include <errno.h>
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
    tcase_add_test(tc, shard_selection_known_answers);
    tcase_add_test(tc, joint_sets_parse_with_members_and_quorums);
    tcase_add_test(tc, joint_sets_are_checked);
    tcase_add_test(tc, long_copies_lists_span_lines_and_long_lines_are_refused);
    suite_add_tcase(s, tc);
    return s;
}
