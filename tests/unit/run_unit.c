/* The unit-test runner: runs the suites named on the command line, or all. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "unit_suites.h"

int main(int argc, char **argv)
{
    SRunner *sr = NULL;
    int matched = 0;

    for (const struct unit_suite_entry *e = unit_suites; e->name; e++) {
        bool want = argc < 2;
        for (int i = 1; i < argc; i++)
            if (strcmp(argv[i], e->name) == 0)
                want = true;
        if (!want)
            continue;
        if (!sr)
            sr = srunner_create(e->make());
        else
            srunner_add_suite(sr, e->make());
        matched++;
    }
    if (!matched) {
        fprintf(stderr, "unit_runner: no suite matches; known suites:");
        for (const struct unit_suite_entry *e = unit_suites; e->name; e++)
            fprintf(stderr, " %s", e->name);
        fprintf(stderr, "\n");
        return 2;
    }
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
