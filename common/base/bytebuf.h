/* bytebuf: a growable byte buffer that never grows past a maximum the
 * caller sets.
 *
 * For collecting a message stream whose total size is bounded before any of
 * it is spent (an Import that is larger than any compatible file is refused
 * with the bytes it would have needed, not after allocating them).
 * Appending nothing, also from a NULL pointer (protobuf-c leaves an empty
 * bytes field as {NULL, 0}), is always valid and changes nothing.
 *
 * A zeroed struct is an empty buffer with maximum 0; bytebuf_init sets the
 * maximum of an empty buffer.  p is NULL until the first byte arrives.  One
 * thread at a time; the memory is the buffer's until bytebuf_deinit.
 */
#ifndef BLOOMGRID_BYTEBUF_H
#define BLOOMGRID_BYTEBUF_H

#include <stddef.h>
#include <stdint.h>

struct bytebuf {
    uint8_t *p;       /* len bytes of content (NULL while len and cap are 0) */
    size_t len, cap;
    size_t max;       /* len never exceeds it */
};

/* An empty buffer that may hold up to max bytes. */
void bytebuf_init(struct bytebuf *b, size_t max);

/* Append len bytes (data may be NULL when len is 0).  Returns 0, -E2BIG
 * when len + len of the content would pass max, or -ENOMEM; on error the
 * content is unchanged. */
int bytebuf_append(struct bytebuf *b, const void *data, size_t len);

/* bytebuf_append as a writer callback (bf_file_writer): ctx is the
 * struct bytebuf. */
int bytebuf_write(void *ctx, const void *data, size_t len);

/* Free the memory; the buffer is empty (same max) and usable again. */
void bytebuf_deinit(struct bytebuf *b);

#endif
