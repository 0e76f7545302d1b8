/* Merge throughput: OR of one filter into another (bf_merge_from, atomic ORs
 * as the node and merger use them) and a plain word-by-word OR loop, on one
 * core, beside memcpy of the same size measured in the same run (the
 * memory-bandwidth reference).  Bytes counted: the destination's size (each
 * pass reads source and destination and writes the destination, as memcpy
 * reads one buffer and writes another).
 *
 * usage: bench_merge [MiB (default 256)] [passes (default 5)]
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bf.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static struct bf *make(uint64_t bytes, const uint8_t *secret)
{
    /* Blocked kind: about 9.6 bits per key at 1 %. */
    struct bf_params p = {.kind = BF_KIND_BLOCKED,
                          .capacity = bytes * 8 / 10, .error_rate = 0.01,
                          .secret = secret};
    char err[BF_ERRLEN];
    bf_params_default(&p);
    struct bf *f = bf_create(&p, err);
    if (!f) {
        fprintf(stderr, "bench_merge: %s\n", err);
        exit(1);
    }
    return f;
}

int main(int argc, char **argv)
{
    uint64_t mib = argc > 1 ? strtoull(argv[1], NULL, 10) : 256;
    int passes = argc > 2 ? atoi(argv[2]) : 5;
    uint8_t secret[BF_SECRET_LEN] = {42};
    struct bf *dst = make(mib << 20, secret), *src = make(mib << 20, secret);
    struct bf_layer_info li;
    char err[BF_ERRLEN];

    bf_layer_info(dst, 0, &li);
    uint64_t bytes = li.body_bytes, words = bytes / 8;
    uint64_t *s = bf_layer_body(src, 0), *d = bf_layer_body(dst, 0);
    uint64_t x = 88172645463325252ull;
    for (uint64_t i = 0; i < words; i++) {   /* half-full source */
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        s[i] = x & (x >> 1);
    }
    memset(d, 0, bytes);
    uint8_t *a = malloc(bytes), *b = malloc(bytes);
    memset(a, 1, bytes);
    memset(b, 2, bytes);

    double best_memcpy = 1e9, best_merge = 1e9, best_loop = 1e9;
    for (int p = 0; p < passes; p++) {
        double t = now_s();
        memcpy(b, a, bytes);
        t = now_s() - t;
        if (t < best_memcpy)
            best_memcpy = t;
        t = now_s();
        if (bf_merge_from(dst, src, err) < 0) {
            fprintf(stderr, "bench_merge: %s\n", err);
            return 1;
        }
        t = now_s() - t;
        if (t < best_merge)
            best_merge = t;
        t = now_s();
        for (uint64_t i = 0; i < words; i++)
            d[i] |= s[i];
        t = now_s() - t;
        if (t < best_loop)
            best_loop = t;
        __asm__ volatile("" ::"r"(d), "r"(b) : "memory");
    }
    double gb = bytes / 1e9;
    printf("filter body %.1f MiB, best of %d passes, one core\n",
           bytes / 1048576.0, passes);
    printf("  memcpy                    %6.2f GB/s\n", gb / best_memcpy);
    printf("  OR, bf_merge_from (atomic)%6.2f GB/s  (%.0f%% of memcpy)\n",
           gb / best_merge, 100 * best_memcpy / best_merge);
    printf("  OR, plain word loop       %6.2f GB/s  (%.0f%% of memcpy)\n",
           gb / best_loop, 100 * best_memcpy / best_loop);
    free(a);
    free(b);
    bf_destroy(src);
    bf_destroy(dst);
    return 0;
}
