/* proc_malloc: see proc_malloc.h. */
#include "proc_malloc.h"

#include <malloc.h>
#include <stdlib.h>
#include <string.h>

extern char **environ;

int proc_malloc_tune(void)
{
    const char *t = getenv("GLIBC_TUNABLES");
    if (t && strstr(t, "glibc.malloc."))
        return 0;
    for (char **e = environ; e && *e; e++)
        if (strncmp(*e, "MALLOC_", 7) == 0 && strchr(*e, '='))
            return 0;
    mallopt(M_TRIM_THRESHOLD, (int)PROC_MALLOC_TRIM_BYTES);
    mallopt(M_MMAP_THRESHOLD, (int)PROC_MALLOC_MMAP_BYTES);
    return 1;
}

void proc_malloc_stats(struct proc_malloc_stats *out)
{
    struct mallinfo2 mi = mallinfo2();
    out->held = mi.arena + mi.hblkhd;
    out->free = mi.fordblks;
}

int proc_malloc_release(void)
{
    return malloc_trim(0);
}
