/* errmsg: error buffers (see errmsg.h). */
#include <stdarg.h>
#include <stdio.h>

#include "errmsg.h"

void errmsg_set(char *err, const char *fmt, ...)
{
    va_list ap;

    if (!err)
        return;
    va_start(ap, fmt);
    vsnprintf(err, ERRMSG_LEN, fmt, ap);
    va_end(ap);
}
