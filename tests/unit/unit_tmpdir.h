/* unit_tmpdir: a fresh temporary directory per test, under
 * $BLOOMGRID_TEST_TMP (or /tmp), removed with everything in it afterwards.
 * Header-only, for the unit suites that touch the disk. */
#ifndef BLOOMGRID_UNIT_TMPDIR_H
#define BLOOMGRID_UNIT_TMPDIR_H

#include <check.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

static int unit_tmpdir__rm(const char *p, const struct stat *st, int f, struct FTW *w)
{
    (void)st;
    (void)f;
    (void)w;
    return remove(p);
}

/* Create BASE/TAG-XXXXXX into out (size n); fails the test if it cannot. */
static inline void unit_tmpdir_make(char *out, size_t n, const char *tag)
{
    const char *base = getenv("BLOOMGRID_TEST_TMP");

    if (!base || !*base)
        base = "/tmp";
    mkdir(base, 0755);
    snprintf(out, n, "%s/%s-XXXXXX", base, tag);
    ck_assert_ptr_nonnull(mkdtemp(out));
}

static inline void unit_tmpdir_remove(const char *dir)
{
    nftw(dir, unit_tmpdir__rm, 16, FTW_DEPTH | FTW_PHYS);
}

#endif
