/* proc_malloc: see proc_malloc.h. */
#include "proc_malloc.h"

#include <malloc.h>
#include <stdlib.h>
#include <string.h>

extern char **environ;

/* Did the environment ask for its own malloc settings? */
static int env_has_own(void)
{
    const char *t = getenv("GLIBC_TUNABLES");
    if (t && strstr(t, "glibc.malloc."))
        return 1;
    for (char **e = environ; e && *e; e++)
        if (strncmp(*e, "MALLOC_", 7) == 0 && strchr(*e, '='))
            return 1;
    return 0;
}

int proc_malloc_bound(void)
{
    if (env_has_own())
        return 0;
    mallopt(M_ARENA_MAX, PROC_MALLOC_NODE_ARENAS);
    mallopt(M_TRIM_THRESHOLD, (int)PROC_MALLOC_NODE_TRIM_BYTES);
    return 1;
}

int proc_malloc_tune(void)
{
    if (env_has_own())
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
