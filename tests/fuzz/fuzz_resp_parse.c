/* libFuzzer target of the RESP request parser (common/resp/resp_proto.c).
 *
 * Each input is parsed as a stream of commands twice: whole, and fed in
 * pieces whose sizes the input's first byte chooses (as a socket delivers
 * them).  Both must agree command by command, every argument must lie
 * inside the bytes given and within the limits, and nothing may crash or
 * leak (AddressSanitizer).  Built and run for a short while by ctest
 * (fuzz_resp_parse); a longer run: tests/fuzz/run.sh SECONDS.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "resp_proto.h"

static const struct resp_limits lim = {.max_args = 16, .max_bulk = 64,
                                       .max_command = 512};

struct cmd {
    int rc;
    size_t used, argc;
    size_t off[16], len[16];
};

/* Parse data as a stream; record up to max commands.  Returns the count. */
static size_t run(const uint8_t *data, size_t n, size_t step, struct cmd *out, size_t max)
{
    struct resp_parser p;
    size_t start = 0, k = 0;
    resp_parser_init(&p, &lim);
    while (start < n && k < max) {
        size_t avail = step ? 0 : n - start;
        int rc;
        for (;;) {
            if (step) {
                avail += step;
                if (avail > n - start)
                    avail = n - start;
            }
            rc = resp_parse(&p, (const char *)data + start, avail);
            if (rc != RESP_PARSE_MORE || avail == n - start)
                break;
        }
        if (rc == RESP_PARSE_MORE)
            break;
        struct cmd *c = &out[k++];
        memset(c, 0, sizeof *c);
        c->rc = rc;
        if (rc == RESP_PARSE_ERROR)
            break;
        if (p.argc > lim.max_args || p.used == 0 || p.used > avail)
            abort();
        c->used = p.used;
        c->argc = p.argc;
        for (size_t i = 0; i < p.argc; i++) {
            if (p.off[i] + p.len[i] > p.used)
                abort();
            if (p.len[i] > lim.max_bulk)
                abort();
            c->off[i] = p.off[i];
            c->len[i] = p.len[i];
        }
        start += p.used;
        resp_parser_reset(&p);
    }
    resp_parser_deinit(&p);
    return k;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct cmd a[64], b[64];
    if (size < 1)
        return 0;
    size_t step = (size_t)(data[0] % 7) + 1;
    data++;
    size--;
    size_t na = run(data, size, 0, a, 64), nb = run(data, size, step, b, 64);
    if (na != nb)
        abort();
    for (size_t i = 0; i < na; i++)
        if (a[i].rc != b[i].rc || a[i].used != b[i].used || a[i].argc != b[i].argc ||
            memcmp(a[i].off, b[i].off, sizeof a[i].off) != 0 ||
            memcmp(a[i].len, b[i].len, sizeof a[i].len) != 0)
            abort();
    return 0;
}
