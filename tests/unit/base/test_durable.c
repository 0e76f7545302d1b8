/* Unit tests of durable: a committed file replaces the old one whole, a
 * failed or aborted write leaves the old file and no temp file, modes are
 * kept, and a failing fsync publishes nothing. */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "durable.h"
#include "unit_tmpdir.h"

static char dir[512];

static void setup(void)
{
    unit_tmpdir_make(dir, sizeof dir, "durable");
}

static void teardown(void)
{
    unit_tmpdir_remove(dir);
}

/* Files in dir (the count) and whether one holds ".tmp". */
static int entries(bool *has_tmp)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    int n = 0;

    *has_tmp = false;
    ck_assert_ptr_nonnull(d);
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.' && (!de->d_name[1] || !strcmp(de->d_name, "..")))
            continue;
        n++;
        if (strstr(de->d_name, ".tmp"))
            *has_tmp = true;
    }
    closedir(d);
    return n;
}

static void read_back(const char *path, char *buf, size_t len)
{
    FILE *fp = fopen(path, "r");
    ck_assert_ptr_nonnull(fp);
    size_t n = fread(buf, 1, len - 1, fp);
    buf[n] = 0;
    fclose(fp);
}

START_TEST(commit_replaces_whole_file)
{
    char path[600], got[64], err[DURABLE_ERRLEN];
    bool tmp;

    snprintf(path, sizeof path, "%s/f", dir);
    ck_assert_int_eq(durable_write_file(path, "old", 3, 0600, err), 0);
    struct durable_file df;
    ck_assert_int_eq(durable_open(&df, path, NULL, 0, err), 0);
    ck_assert_int_eq(durable_write_all(df.fd, "new content", 11), 0);
    /* Until the commit the old file is what a reader sees. */
    read_back(path, got, sizeof got);
    ck_assert_str_eq(got, "old");
    ck_assert_int_eq(entries(&tmp), 2);
    ck_assert(tmp);
    ck_assert_int_eq(durable_commit(&df, err), 0);
    ck_assert_int_eq(df.fd, -1);
    read_back(path, got, sizeof got);
    ck_assert_str_eq(got, "new content");
    ck_assert_int_eq(entries(&tmp), 1);
    ck_assert(!tmp);
    /* mode 0 keeps the mode of the file replaced. */
    struct stat st;
    ck_assert_int_eq(stat(path, &st), 0);
    ck_assert_int_eq(st.st_mode & 0777, 0600);
}
END_TEST

START_TEST(abort_leaves_old_file_and_no_temp)
{
    char path[600], got[64], err[DURABLE_ERRLEN];
    bool tmp;
    struct durable_file df;

    snprintf(path, sizeof path, "%s/f", dir);
    ck_assert_int_eq(durable_write_file(path, "old", 3, 0, err), 0);
    ck_assert_int_eq(durable_open(&df, path, NULL, 0, err), 0);
    ck_assert_int_eq(durable_write_all(df.fd, "half", 4), 0);
    durable_abort(&df);
    durable_abort(&df); /* twice is harmless */
    read_back(path, got, sizeof got);
    ck_assert_str_eq(got, "old");
    ck_assert_int_eq(entries(&tmp), 1);
    ck_assert(!tmp);
}
END_TEST

static int failing_sync(int fd)
{
    (void)fd;
    errno = EIO;
    return -1;
}

START_TEST(failed_fsync_publishes_nothing)
{
    char path[600], got[64], err[DURABLE_ERRLEN] = "";
    bool tmp;
    struct durable_file df;

    snprintf(path, sizeof path, "%s/f", dir);
    ck_assert_int_eq(durable_write_file(path, "old", 3, 0, err), 0);
    ck_assert_int_eq(durable_open(&df, path, NULL, 0, err), 0);
    df.sync = failing_sync;
    ck_assert_int_eq(durable_write_all(df.fd, "new", 3), 0);
    ck_assert_int_eq(durable_commit(&df, err), -EIO);
    ck_assert_ptr_nonnull(strstr(err, "fsync"));
    read_back(path, got, sizeof got);
    ck_assert_str_eq(got, "old");
    ck_assert_int_eq(entries(&tmp), 1);
    ck_assert(!tmp);
}
END_TEST

START_TEST(fixed_temp_name_and_publish_keeps_fd)
{
    char path[600], tmpname[600], got[64], err[DURABLE_ERRLEN];
    struct durable_file df;

    snprintf(path, sizeof path, "%s/seg", dir);
    snprintf(tmpname, sizeof tmpname, "%s/.seg-new", dir);
    ck_assert_int_eq(durable_write_file(tmpname, "stale", 5, 0, err), 0);
    ck_assert_int_eq(durable_open(&df, path, ".seg-new", 0644, err), 0);
    ck_assert_str_eq(df.tmp, tmpname);
    ck_assert_int_eq(durable_write_all(df.fd, "head", 4), 0);
    ck_assert_int_eq(durable_publish(&df, err), 0);
    ck_assert_int_ge(df.fd, 0);
    ck_assert_int_eq(access(tmpname, F_OK), -1);
    ck_assert_int_eq(durable_write_all(df.fd, "+tail", 5), 0);
    close(df.fd);
    read_back(path, got, sizeof got);
    ck_assert_str_eq(got, "head+tail"); /* the stale bytes were truncated */
}
END_TEST

START_TEST(open_refuses_missing_directory)
{
    char path[600], err[DURABLE_ERRLEN] = "";
    struct durable_file df;

    snprintf(path, sizeof path, "%s/no/such/f", dir);
    ck_assert_int_eq(durable_open(&df, path, NULL, 0, err), -ENOENT);
    ck_assert_ptr_nonnull(strstr(err, "cannot create temp file"));
    durable_abort(&df);
    ck_assert_int_eq(durable_open(&df, "", NULL, 0, err), -EINVAL);
}
END_TEST

START_TEST(rename_moves_across_directories)
{
    char a[600], b[700], sub[600], got[64], err[DURABLE_ERRLEN];

    snprintf(sub, sizeof sub, "%s/sub", dir);
    ck_assert_int_eq(mkdir(sub, 0755), 0);
    snprintf(a, sizeof a, "%s/a", dir);
    snprintf(b, sizeof b, "%s/b", sub);
    ck_assert_int_eq(durable_write_file(a, "x", 1, 0, err), 0);
    ck_assert_int_eq(durable_rename(a, b), 0);
    read_back(b, got, sizeof got);
    ck_assert_str_eq(got, "x");
    ck_assert_int_eq(durable_rename(a, b), -ENOENT);
}
END_TEST

Suite *durable_suite(void)
{
    Suite *s = suite_create("durable");
    TCase *tc = tcase_create("durable");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, commit_replaces_whole_file);
    tcase_add_test(tc, abort_leaves_old_file_and_no_temp);
    tcase_add_test(tc, failed_fsync_publishes_nothing);
    tcase_add_test(tc, fixed_temp_name_and_publish_keeps_fd);
    tcase_add_test(tc, open_refuses_missing_directory);
    tcase_add_test(tc, rename_moves_across_directories);
    suite_add_tcase(s, tc);
    return s;
}
