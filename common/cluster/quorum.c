/* quorum: the quorum rule (quorum.h).  Each function is the rule written
 * once; the callers keep their own plumbing (who was asked, who answered). */
#include "quorum.h"

static unsigned cap(unsigned v, unsigned n)
{
    return v < n ? v : n;
}

unsigned quorum_write_need(const struct topo_group *g)
{
    return g->write_quorum;
}

unsigned quorum_write_need_other(const struct topo_group *g)
{
    return g->joint != TOPO_JOINT_NONE ? g->other_write_quorum : 0;
}

bool quorum_write_met(const struct topo_group *g, unsigned acked, unsigned acked_other)
{
    return acked >= quorum_write_need(g) && acked_other >= quorum_write_need_other(g);
}

bool quorum_write_reachable(const struct topo_group *g, unsigned failed,
                            unsigned failed_other)
{
    unsigned left = g->ncopies - cap(failed, g->ncopies);
    unsigned left_other = g->nother - cap(failed_other, g->nother);
    return quorum_write_met(g, left, left_other);
}

unsigned quorum_read_need(const struct topo_group *g)
{
    return g->read_quorum;
}

bool quorum_read_met(const struct topo_group *g, unsigned answered)
{
    return answered >= quorum_read_need(g);
}

unsigned quorum_read_ask(const struct topo_group *g, unsigned answered,
                         unsigned pending, unsigned untried)
{
    unsigned need = quorum_read_need(g);
    unsigned have = cap(answered, g->ncopies) + cap(pending, g->ncopies);
    if (have >= need)
        return 0;
    return cap(need - have, untried);
}

bool quorum_read_reachable(const struct topo_group *g, unsigned failed)
{
    return quorum_read_met(g, g->ncopies - cap(failed, g->ncopies));
}

bool quorum_readable(const struct topo_group *g, unsigned serving)
{
    return quorum_read_met(g, serving);
}

unsigned quorum_shard_sync_need(const struct topo_group *g)
{
    /* A write acknowledged by W copies is on at least W - 1 copies other
     * than this one, so at most N - W of the others lack it.  With W = 1
     * it may be on this copy alone: no number of others suffices. */
    return g->ncopies - g->write_quorum + 1;
}

bool quorum_shard_sync_met(const struct topo_group *g, unsigned pulled)
{
    return pulled >= quorum_shard_sync_need(g);
}

unsigned quorum_sync_need(const struct topo_group *g, unsigned others)
{
    /* A write acknowledged by W copies is on at least W - 1 copies other
     * than this one, so at most N - W of the others lack it. */
    return cap(g->ncopies - g->write_quorum + 1, others);
}

bool quorum_sync_met(const struct topo_group *g, unsigned pulled, unsigned others)
{
    return pulled >= quorum_sync_need(g, others);
}

bool quorum_covered(const struct topo_group *g, unsigned in_sync)
{
    return quorum_read_met(g, in_sync);
}
