/* proc_malloc: the allocator settings of the serving processes.  Each test
 * runs in its own process (check forks), so settings do not leak. */
#include <check.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>

#include "proc_malloc.h"

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

Suite *proc_malloc_suite(void)
{
    Suite *s = suite_create("proc_malloc");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, environment_is_kept);
    tcase_add_test(tc, freed_memory_stays_for_the_next_calls);
    suite_add_tcase(s, tc);
    return s;
}
