/* wire: protobuf varint primitives for the hand-written codecs of the hot
 * messages (key batches, hash batches), where protobuf-c's per-element
 * allocations would cost more than the work itself.  Header-only. */
#ifndef BLOOMGRID_WIRE_H
#define BLOOMGRID_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Read a varint at *p (< end) and advance *p.  Returns false when it is
 * truncated or longer than 10 bytes; *p is then unchanged. */
static inline bool get_varint(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
    uint64_t x = 0;
    const uint8_t *q = *p;

    for (int shift = 0; shift < 70 && q < end; shift += 7) {
        uint8_t b = *q++;
        x |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *p = q;
            *v = x;
            return true;
        }
    }
    return false;
}

/* Write v as a varint at p; returns the byte after it (at most 10 bytes). */
static inline uint8_t *put_varint(uint8_t *p, uint64_t v)
{
    while (v >= 0x80) {
        *p++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *p++ = (uint8_t)v;
    return p;
}

/* Bytes put_varint writes for v. */
static inline size_t varint_len(uint64_t v)
{
    size_t n = 1;

    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

#endif
