/* store_charge: what a filter costs a store's memory budget (store.h,
 * "Budgets").  A file of its own so that a router, which checks a
 * creation against its nodes' budgets before asking them, links this rule
 * alone and nothing else of storage. */
#include <errno.h>

#include "store.h"
#include "store_internal.h"

/* A layer body of this many bytes and the page versions that track it
 * (bf.h, "Page versions": 8 bytes per page).  Checkpoints and exports read
 * the live bits a page at a time and change tracking is the versions, so
 * nothing else grows with the filter. */
static uint64_t layer_charge(uint64_t body)
{
    return body + (body + BF_PAGE_BYTES - 1) / BF_PAGE_BYTES * 8;
}

int store_charge(const struct bf_params *p, uint64_t *bytes)
{
    struct bf_params d = *p;
    uint64_t b;

    bf_params_default(&d);
    if (bf_params_bytes(&d, &b) < 0)
        return -EINVAL;
    *bytes = layer_charge(b);
    return 0;
}

uint64_t store__charge_bytes(uint64_t body)
{
    return layer_charge(body);
}

uint64_t store__charge_of(const struct bf *f)
{
    uint32_t n = bf_layer_count(f);
    uint64_t c = 0;

    for (uint32_t i = 0; i < n; i++) {
        struct bf_layer_info li;
        if (bf_layer_info(f, i, &li) == 0)
            c += layer_charge(li.body_bytes);
    }
    return c;
}
