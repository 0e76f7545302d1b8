/* store_charge: what a filter costs a store's memory budget (store.h,
 * "Budgets").  A file of its own so that a router, which checks a
 * creation against its nodes' budgets before asking them, links this rule
 * alone and nothing else of storage. */
#include <errno.h>

#include "store.h"
#include "store_internal.h"

/* How many times a filter's bits count: the bits, the copy a checkpoint
 * takes and, for the kinds whose pages are tracked, the copy behind change
 * tracking (store_pages.c).  Exports reserve their copies apart. */
static unsigned charge_times(enum bf_kind kind)
{
    return kind == BF_KIND_BLOCKED || kind == BF_KIND_CLASSIC ? 3 : 2;
}

int store_charge(const struct bf_params *p, uint64_t *bytes)
{
    struct bf_params d = *p;
    uint64_t b;

    bf_params_default(&d);
    if (bf_params_bytes(&d, &b) < 0)
        return -EINVAL;
    *bytes = b * charge_times(d.kind);
    return 0;
}

unsigned store__charge_times(enum bf_kind kind)
{
    return charge_times(kind);
}

uint64_t store__charge_of(const struct bf *f)
{
    return bf_bytes(f) * charge_times(bf_kind(f));
}

