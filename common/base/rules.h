/* rules: the names and limits every bloomgrid process applies, defined once.
 *
 * A router, a node, the merger and the CLI give the same answer to the same
 * name or key because they all ask this module: a router never accepts what
 * every node then refuses.  The module owns no state; every function may be
 * called from any thread.
 *
 * Filter names: 1..RULES_FILTER_NAME_MAX bytes of [A-Za-z0-9._-], not
 * starting with '.', not containing RULES_SHARD_SUFFIX.  A filter of S > 1
 * shards keeps shard i under the store name "<filter>.shard-<i>"; the store
 * accepts names up to RULES_STORE_NAME_MAX, which fits the shard names of
 * every valid filter name for every shard count up to RULES_SHARDS_MAX.
 *
 * Strings from the wire (names, addresses, fingerprints) must be valid UTF-8
 * without NUL bytes: a C string cut at a NUL would name another object.
 *
 * Addresses ("host:port") are checked by one rule wherever they are given:
 * settings, topology lines and the tool's --server.
 *
 * Errors: checks return 0 or -EINVAL with a sentence in err (RULES_ERRLEN
 * bytes, may be NULL) that starts with what was checked ("filter name ...",
 * "key 3 ...") so that it reads well as a status message on its own.
 */
#ifndef BLOOMGRID_RULES_H
#define BLOOMGRID_RULES_H

#include "errmsg.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define RULES_ERRLEN ERRMSG_LEN

/* Names. */
#define RULES_FILTER_NAME_MAX 128
#define RULES_SHARDS_MAX 4096
#define RULES_SHARD_SUFFIX ".shard-"
/* The longest shard name: a longest filter name + ".shard-4095". */
#define RULES_STORE_NAME_MAX (RULES_FILTER_NAME_MAX + 11)

/* A number macro as a string (settings tables take defaults as text). */
#define RULES_STR_(x) #x
#define RULES_STR(x) RULES_STR_(x)

/* Keys and batches: bounds of the max_key_size / max_batch_keys settings
 * and their defaults (the same in node and router). */
#define RULES_KEY_SIZE_DEFAULT 4096
#define RULES_KEY_SIZE_MAX (1u << 20)
#define RULES_BATCH_KEYS_DEFAULT 100000
#define RULES_BATCH_KEYS_MAX 10000000

/* Page streaming: the unit of change tracking, merge and replication. */
#define RULES_PAGE_BYTES (64u << 10)

/* Export chunks: default and largest chunk_size. */
#define RULES_CHUNK_DEFAULT (1u << 20)
#define RULES_CHUNK_MAX (4u << 20)

/* The answer to a Remove on a filter whose kind has no counters (%s: the
 * filter's public name), from a node or a router alike. */
#define RULES_MSG_NOT_COUNTING "filter \"%s\" is not a COUNTING filter: Remove needs one"

/* Addresses: the largest port. */
#define RULES_PORT_MAX 65535

/* A "host:port" address that what names (a setting, "copy", "--server"):
 * the host is not empty and holds no space or control byte; the port
 * (after the last ':') is 1 to 5 decimal digits with a value of
 * 1..RULES_PORT_MAX, or 0..RULES_PORT_MAX when listen is true (port 0
 * asks for a free port).  Returns 0 or -EINVAL with a sentence naming what
 * and the address. */
int rules_addr_check(const char *what, const char *addr, bool listen, char *err);

/* Is s (len bytes) valid UTF-8 (no overlong forms, no surrogates, nothing
 * above U+10FFFF)? */
bool rules_utf8_valid(const void *s, size_t len);

/* A string field from the wire, what names it ("filter name", "node
 * address"): no NUL byte, valid UTF-8. */
int rules_string_check(const char *what, const void *s, size_t len, char *err);

/* A public filter name of len bytes (not necessarily NUL-terminated). */
int rules_filter_name_check(const void *name, size_t len, char *err);

/* A store name: a filter name, or a shard name of one (what a node keeps
 * in its data directory). */
int rules_store_name_check(const void *name, size_t len, char *err);

/* The store name of shard index of count shards of filter: the filter name
 * itself when count is 1, else "<filter>.shard-<index>".  out must hold
 * RULES_STORE_NAME_MAX + 1 bytes.  Returns 0, or -EINVAL (err set) when
 * filter is not a valid filter name, count is 0 or above RULES_SHARDS_MAX,
 * or index >= count. */
int rules_shard_name(char *out, size_t outlen, const char *filter,
                     unsigned index, unsigned count, char *err);

/* Does name (a store name) name a shard of a sharded filter? */
bool rules_is_shard_name(const char *name);

/* Split a store name into the filter name (filter, flen bytes) and the
 * shard index: "<filter>.shard-<i>" gives (filter, i), any other name
 * (filter, 0).  Returns true for a shard name. */
bool rules_shard_split(const char *name, char *filter, size_t flen,
                       unsigned *index);

/* Shard count of a create request: 1..RULES_SHARDS_MAX. */
int rules_shard_count_check(uint64_t shards, char *err);

/* Key i of a batch, len bytes, against the max_key_size setting max. */
int rules_key_check(size_t i, size_t len, uint64_t max, char *err);

/* Filter kind of a create request, as the wire enum FilterKind numbers it:
 * 0 (unspecified: blocked) to 4 (scalable), the values of enum bf_kind. */
int rules_kind_check(int kind, char *err);

/* Capacity and error rate of a new filter: capacity > 0, 0 < p < 1. */
int rules_params_check(uint64_t capacity, double error_rate, char *err);

/* Bytes of a filter's secret (the engine's BF_SECRET_LEN, checked equal
 * where both are seen). */
#define RULES_SECRET_LEN 32

/* The secret of a create request: len 0 (random) or RULES_SECRET_LEN (32). */
int rules_secret_check(size_t len, char *err);

/* Capacity of each of shards shards of a filter of capacity keys: the
 * ceiling of capacity / shards, without overflow for any capacity. */
uint64_t rules_shard_capacity(uint64_t capacity, uint32_t shards);

#endif
