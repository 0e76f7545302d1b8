/* unit_hashes: the keys of the store's unit suites as hashes, key i always
 * the same pair (a splitmix64 mix of i), so a suite can add keys 0..n-1 and
 * later ask for exactly those.  Header-only.
 */
#ifndef BLOOMGRID_UNIT_HASHES_H
#define BLOOMGRID_UNIT_HASHES_H

#include <stdint.h>

#include "bf.h"

static inline uint64_t unit_mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* The hashes of key i. */
static inline struct bf_hash unit_hash_of(uint64_t i)
{
    return (struct bf_hash){unit_mix(i), unit_mix(i ^ 0x5555555555555555ull)};
}

#endif
