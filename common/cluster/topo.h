/* topo: the cluster topology (shard groups) and the shard placement rule.
 *
 * A topology file (INI, read with libinih; docs/TOPOLOGY.md) carries a
 * version and names the shard groups.  Each group is N symmetric copies (no
 * primary: docs/REPLICATION.md), a write quorum W and a read quorum R
 * (R + W > N, so every read quorum meets every write quorum) and an optional
 * datacenter tag:
 *
 *     version = 7
 *     [group g0]
 *     copies = 10.0.0.1:7400 10.0.1.1:7400 10.0.2.1:7400
 *     datacenter = eu-west
 *
 * W defaults to a majority (floor(N/2) + 1) and R to N - W + 1; both may be
 * set for every group before the first section and per group.
 *
 * A change of a group's copies goes through joint phases
 * (docs/REPLICATION.md, "Changing a group's copies"): next to copies, a
 * group may name the set it is moving to (copies_next, with
 * write_quorum_next and read_quorum_next) or the one it comes from
 * (copies_prev, write_quorum_prev, read_quorum_prev).  A write then goes to
 * both sets and needs W of each; reads use copies alone.  The addresses of
 * both sets are the group's members: copies first, then the other set's
 * addresses that are not copies (topo_member).
 *
 * Placement: where shard i of filter F lives is a pure function of F, the
 * shard count S, the group names and the filter's placement version, a
 * number the filter records when it is created and keeps for life (so a
 * new rule never moves a shard of an existing filter):
 *   1  rendezvous: the group with the highest score topo_score(F, i,
 *      group name) (highest-random-weight hashing; ties go to the smaller
 *      name).  Filters created before versions were recorded are version 1.
 *   2  rendezvous with a capacity bound: shards 0, 1, ..., S - 1 in turn,
 *      each on the group with the highest score among those that hold
 *      fewer than ceil(S/G) + 1 of the filter's shards, so no group holds
 *      more than ceil(S/G) + 1 (version 1 gives 27/17/20 for 64 shards on 3
 *      groups).
 * Shard 0 is on the same group under every version (it is placed first,
 * on its highest score): a caller that does not know a filter's version
 * yet asks shard 0 (topo_group_for) and learns it there.  The order of the
 * groups in the file does not matter; docs/TOPOLOGY.md says what moves
 * when a group is added or removed.
 *
 * A struct topo is immutable once parsed: any number of threads may read it.
 * Callers that swap topologies at run time (SIGHUP) keep them alive with
 * topo_ref/topo_unref.
 *
 * Errors: topo_load and topo_parse return NULL and write a sentence naming
 * the file and line into err.
 */
#ifndef BLOOMGRID_TOPO_H
#define BLOOMGRID_TOPO_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TOPO_NAME_MAX 63        /* datacenter names (and the name buffers) */
#define TOPO_GROUP_NAME_MAX 43  /* group names: what libinih keeps of "[group NAME]" */
#define TOPO_ADDR_MAX 127       /* "host:port" */
#define TOPO_MAX_COPIES 8
#define TOPO_MAX_GROUPS 1024          /* fits the uint16_t of topo_place */
#define TOPO_ERRLEN 512

/* Which other set of copies a group names during a change. */
enum topo_joint {
    TOPO_JOINT_NONE,
    TOPO_JOINT_NEXT,                         /* copies_next: moving to it */
    TOPO_JOINT_PREV,                         /* copies_prev: coming from it */
};

struct topo_group {
    char name[TOPO_NAME_MAX + 1];
    char datacenter[TOPO_NAME_MAX + 1];      /* "" when not tagged */
    char copies[TOPO_MAX_COPIES][TOPO_ADDR_MAX + 1];
    unsigned ncopies;                        /* N, 1..TOPO_MAX_COPIES */
    unsigned write_quorum;                   /* W, 1..N */
    unsigned read_quorum;                    /* R, 1..N, R + W > N */
    int line;                                /* line of its [group] header */
    /* The other set of a joint phase (joint != TOPO_JOINT_NONE): written
     * with its own quorum W', never read.  R' + W' > N'; the new set's R
     * plus the old set's W exceeds the old set's N. */
    enum topo_joint joint;
    char other[TOPO_MAX_COPIES][TOPO_ADDR_MAX + 1];
    unsigned nother;                         /* 0 without a joint phase */
    unsigned other_write_quorum, other_read_quorum;
    /* Members: copies[0..ncopies), then extra[0..nmembers - ncopies), the
     * addresses of other that are not copies.  At most TOPO_MAX_COPIES. */
    char extra[TOPO_MAX_COPIES][TOPO_ADDR_MAX + 1];
    unsigned nmembers;
    unsigned other_mask;                     /* bit m: member m is in other */
};

struct topo {
    atomic_int refs;
    unsigned ngroups;
    struct topo_group *groups;               /* sorted by name */
    uint64_t version;                        /* the file's, 1..2^63 */
    char origin[256];                        /* file name, for messages */
};

/* Parse a topology file.  Returns a topology holding one reference, or NULL
 * with a message ("FILE:LINE: ...") in err (TOPO_ERRLEN bytes). */
struct topo *topo_load(const char *path, char *err);

/* Parse topology text; origin names it in messages. */
struct topo *topo_parse(const char *text, const char *origin, char *err);

/* Take / drop a reference.  The last unref frees.  NULL is allowed. */
struct topo *topo_ref(struct topo *t);
void topo_unref(struct topo *t);

/* Placement versions (above).  0 on the wire or in a file means "not
 * recorded" and reads as 1. */
#define TOPO_PLACEMENT_RENDEZVOUS 1u
#define TOPO_PLACEMENT_BOUNDED 2u
#define TOPO_PLACEMENT_NEWEST TOPO_PLACEMENT_BOUNDED   /* new filters get it */
/* The most a filter may record (a node stores any version up to it, so
 * that a newer router's filters survive on an older node). */
#define TOPO_PLACEMENT_LIMIT 255u

/* The version a recorded value stands for (0 reads as 1). */
uint32_t topo_placement_norm(uint32_t placement);

/* Does this build know placement version v (0 counts as 1)? */
bool topo_placement_known(uint32_t v);

/* Rendezvous score of (filter, shard) on a group name: XXH3-64 (seed 0) of
 * the bytes  filter '\0' shard (4 bytes, little-endian) '\0' group. */
uint64_t topo_score(const char *filter, uint32_t shard, const char *group);

/* Index (into t->groups) of the group holding shard of filter under
 * placement version 1, which is also where shard 0 is under every
 * version. */
unsigned topo_group_for(const struct topo *t, const char *filter, uint32_t shard);

/* Where every shard of a filter of `shards` shards lives under placement
 * version `placement`: groups[i] gets the index (into t->groups) of shard
 * i's group, for i < shards (the caller's array).  Costs shards x ngroups
 * scores.  Returns 0, -EINVAL (shards 0, or a version this build does not
 * know: topo_placement_known) or -ENOMEM. */
int topo_place(const struct topo *t, const char *filter, uint32_t shards,
               uint32_t placement, uint16_t *groups);

/* topo_place on scores computed already: scores[i * ngroups + g] is shard
 * i's score on group g (groups in name order), for i < shards.  load
 * (ngroups entries, the caller's) is scratch.  For tests and benchmarks
 * that place many shard counts on one set of scores; -EINVAL as above. */
int topo_place_scored(const uint64_t *scores, uint32_t shards, unsigned ngroups,
                      uint32_t placement, unsigned *load, uint16_t *groups);

/* The index (into t->groups) of the group listing addr as a member (a
 * copy, or an address of its other set), with the member's index in *copy
 * (may be NULL; < ncopies for a copy), or -1 when no group lists it. */
int topo_group_of(const struct topo *t, const char *addr, unsigned *copy);

/* Member m (0..nmembers) of g: copies first, then the other set's extras. */
const char *topo_member(const struct topo_group *g, unsigned m);

/* Is a "host:port" address one a group may list: rules_addr_check (port
 * 1..65535) and at most TOPO_ADDR_MAX characters?  Returns 0 or -EINVAL. */
int topo_addr_check(const char *addr);

#endif
