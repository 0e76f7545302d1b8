/* keys_input: keys one per line from files or stdin, or from arguments,
 * delivered in batches.
 *
 * Input is read in 4 MiB blocks and split in place: no allocation or copy
 * per key, so reading is never the bottleneck of a build.  A line ends at
 * "\n"; a trailing "\r" is stripped too.  An empty line is an error (a key
 * cannot be empty), reported with its file and line number.
 */
#ifndef BLOOMGRID_KEYS_INPUT_H
#define BLOOMGRID_KEYS_INPUT_H

#include <stddef.h>

#define KEYS_BATCH 1024          /* keys per callback at most */

/* Called with n (1..KEYS_BATCH) keys; keys[i] has lens[i] bytes and is only
 * valid during the call.  Return 0 to go on, anything else to stop: the
 * reader then returns that value. */
typedef int (*keys_batch_fn)(void *ctx, const void *const *keys,
                             const size_t *lens, size_t n);

/* Read keys from path ("-" for stdin).  Returns 0, the callback's stop
 * value, or CLI_ERR after printing why (unreadable file, empty key,
 * line too long). */
int keys_read_path(const char *path, keys_batch_fn fn, void *ctx);

/* Read keys from each path in turn, or from stdin when n is 0. */
int keys_read_paths(char *const *paths, int n, keys_batch_fn fn, void *ctx);

/* Keys given as arguments; an empty one is an error (CLI_ERR), reported
 * before any batch is delivered. */
int keys_from_args(char *const *args, int n, keys_batch_fn fn, void *ctx);

#endif
