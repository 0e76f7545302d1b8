/* proc_malloc: the allocator settings of the serving processes.  Each test
 * runs in its own process (check forks), so settings do not leak. */
#include <check.h>
#include <stdio.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "proc_malloc.h"

/* Resident bytes of this process (/proc/self/statm). */
static size_t rss_bytes(void)
{
    unsigned long size = 0, res = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(fscanf(f, "%lu %lu", &size, &res), 2);
    fclose(f);
    return (size_t)res * (size_t)sysconf(_SC_PAGESIZE);
}

#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif

static void clear_env(void)
{
    unsetenv("GLIBC_TUNABLES");
    unsetenv("MALLOC_ARENA_MAX");
    unsetenv("MALLOC_TRIM_THRESHOLD_");
}

/* What the environment sets stays. */
START_TEST(environment_is_kept)
{
    clear_env();
    setenv("MALLOC_ARENA_MAX", "2", 1);
    ck_assert_int_eq(proc_malloc_tune(), 0);
    clear_env();
    setenv("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=1000000", 1);
    ck_assert_int_eq(proc_malloc_tune(), 0);
    clear_env();
    setenv("GLIBC_TUNABLES", "glibc.rtld.nns=4", 1);
    ck_assert_int_eq(proc_malloc_tune(), 1);
}
END_TEST

/* 12.8 MiB of 200 KiB blocks, freed: they came from the heap (under the
 * 4 MiB mmap threshold) and stay at its top (under 16 MiB) for the next
 * calls, rather than going back to the kernel one madvise at a time. */
START_TEST(freed_memory_stays_for_the_next_calls)
{
#ifdef UNDER_ASAN
    return;   /* the sanitizer's allocator is not glibc's */
#endif
    clear_env();
    ck_assert_int_eq(proc_malloc_tune(), 1);
    enum { N = 64, SZ = 200 << 10 };
    char *b[N];
    for (int i = 0; i < N; i++) {
        b[i] = malloc(SZ);
        ck_assert_ptr_nonnull(b[i]);
        memset(b[i], i, SZ);
    }
    for (int i = N - 1; i >= 0; i--)
        free(b[i]);
    struct mallinfo2 mi = mallinfo2();
    ck_assert_msg(mi.keepcost >= (size_t)8 << 20,
                  "only %zu bytes kept at the top of the heap", mi.keepcost);
    ck_assert_uint_eq(mi.hblkhd, 0);   /* none of them was mapped alone */
}
END_TEST

/* The node's bound: the environment's settings stay; otherwise a burst's
 * memory at the top of the heap goes back on the free (above 4 MiB). */
START_TEST(bound_gives_back_a_burst)
{
    clear_env();
    setenv("MALLOC_ARENA_MAX", "2", 1);
    ck_assert_int_eq(proc_malloc_bound(), 0);
    clear_env();
#ifdef UNDER_ASAN
    return;
#endif
    ck_assert_int_eq(proc_malloc_tune(), 1);
    ck_assert_int_eq(proc_malloc_bound(), 1);
    enum { N = 64, SZ = 200 << 10 };
    char *b[N];
    for (int i = 0; i < N; i++) {
        b[i] = malloc(SZ);
        ck_assert_ptr_nonnull(b[i]);
        memset(b[i], i, SZ);
    }
    for (int i = N - 1; i >= 0; i--)
        free(b[i]);
    struct mallinfo2 mi = mallinfo2();
    ck_assert_msg(mi.keepcost < (size_t)PROC_MALLOC_NODE_TRIM_BYTES,
                  "%zu bytes kept at the top of the heap", mi.keepcost);
}
END_TEST

/* Free memory inside the heap (not at its top: a small block kept after
 * each large one) is counted free, and proc_malloc_release gives its
 * pages back. */
START_TEST(release_gives_back_free_pages)
{
#ifdef UNDER_ASAN
    return;
#endif
    clear_env();
    ck_assert_int_eq(proc_malloc_tune(), 1);
    enum { N = 64, SZ = 200 << 10 };
    char *b[N], *keep[N];
    for (int i = 0; i < N; i++) {
        b[i] = malloc(SZ);
        keep[i] = malloc(64);
        ck_assert_ptr_nonnull(b[i]);
        ck_assert_ptr_nonnull(keep[i]);
        memset(b[i], i + 1, SZ);
    }
    for (int i = 0; i < N; i++)
        free(b[i]);
    struct proc_malloc_stats st;
    proc_malloc_stats(&st);
    ck_assert_msg(st.free >= (size_t)N * SZ * 9 / 10, "%zu bytes free", st.free);
    ck_assert_uint_ge(st.held, st.free);
    size_t before = rss_bytes();
    ck_assert_int_eq(proc_malloc_release(), 1);
    size_t after = rss_bytes();
    ck_assert_msg(before - after >= (size_t)N * SZ / 2, "RSS %zu -> %zu bytes",
                  before, after);
    for (int i = 0; i < N; i++)
        free(keep[i]);
}
END_TEST

Suite *proc_malloc_suite(void)
{
    Suite *s = suite_create("proc_malloc");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, environment_is_kept);
    tcase_add_test(tc, freed_memory_stays_for_the_next_calls);
    tcase_add_test(tc, bound_gives_back_a_burst);
    tcase_add_test(tc, release_gives_back_free_pages);
    suite_add_tcase(s, tc);
    return s;
}
