/* bytebuf: a bounded growable byte buffer (see bytebuf.h).  Capacity
 * doubles from 64 KiB, clamped to the maximum, so a stream of n bytes costs
 * O(log n) reallocations and never holds more than max. */
#include "bytebuf.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define BYTEBUF_FIRST (64u << 10)

void bytebuf_init(struct bytebuf *b, size_t max)
{
    b->p = NULL;
    b->len = b->cap = 0;
    b->max = max;
}

/* Room for need bytes in all; the caller checked need <= max. */
static int grow(struct bytebuf *b, size_t need)
{
    size_t cap = b->cap ? b->cap : BYTEBUF_FIRST;
    uint8_t *p;

    while (cap < need)
        cap = cap > SIZE_MAX / 2 ? SIZE_MAX : cap * 2;
    if (cap > b->max)
        cap = b->max;
    p = realloc(b->p, cap);
    if (!p)
        return -ENOMEM;
    b->p = p;
    b->cap = cap;
    return 0;
}

int bytebuf_append(struct bytebuf *b, const void *data, size_t len)
{
    int rc;

    if (len == 0)
        return 0;   /* memcpy must not see a NULL source, even for 0 bytes */
    if (len > b->max || b->len > b->max - len)
        return -E2BIG;
    if (b->len + len > b->cap && (rc = grow(b, b->len + len)) < 0)
        return rc;
    memcpy(b->p + b->len, data, len);
    b->len += len;
    return 0;
}

int bytebuf_write(void *ctx, const void *data, size_t len)
{
    return bytebuf_append(ctx, data, len);
}

void bytebuf_deinit(struct bytebuf *b)
{
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}
