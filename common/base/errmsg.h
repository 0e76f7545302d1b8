/* errmsg: the error buffers of the library modules.
 *
 * Every module that explains a failure fills a caller's buffer of
 * ERRMSG_LEN bytes (BF_ERRLEN, STORE_ERRLEN, WAL_ERRLEN, RULES_ERRLEN and
 * DURABLE_ERRLEN are this size) with one sentence a person can act on.
 * Any thread.
 */
#ifndef BLOOMGRID_ERRMSG_H
#define BLOOMGRID_ERRMSG_H

#define ERRMSG_LEN 256

/* Format into err (ERRMSG_LEN bytes, cut if longer); err may be NULL. */
void errmsg_set(char *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#endif
