/* resp_proto: the Redis serialization protocol (RESP2 and RESP3) as a
 * server reads requests and writes replies.
 *
 * The request parser reads what clients send: an array of bulk strings
 * ("*N\r\n$L\r\n...\r\n", what every client library sends) or an inline
 * command (one line of words, what a person types into telnet).  It is
 * incremental and copies nothing: it is given the bytes buffered so far
 * from the start of the current command, keeps where it stopped, and
 * records each argument as an offset and length in that buffer, so the
 * caller may move the buffer between calls (the offsets stay valid) as
 * long as it keeps the command's bytes.  Every count is checked against
 * the limits before anything is allocated for it: N against max_args,
 * each L against max_bulk, the command's bytes against max_command; the
 * argument table grows as arguments arrive, never to N at the header.  A
 * malformed or oversized command is an error with Redis's wording
 * ("Protocol error: ..."); the connection is then closed by the caller, as
 * Redis does, because the rest of the stream cannot be trusted.
 *
 * The reply writer appends RESP to a growable buffer (struct resp_buf).
 * Shapes that differ between the protocols take the version: a map is
 * "%N" in RESP3 and a flat array of 2N in RESP2, a null "_" or "$-1".
 * Error and simple-string texts are cleaned of CR and LF.
 *
 * Threads: none of its own; a parser or buffer is used by one thread at a
 * time.  Errors: the parser returns RESP_PARSE_ERROR with a message in
 * p->err; the writer returns -ENOMEM (the buffer is then unchanged) or
 * sets b->oom, so that a caller may write a whole reply and check once.
 */
#ifndef BLOOMGRID_RESP_PROTO_H
#define BLOOMGRID_RESP_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define RESP_ERRLEN 160
#define RESP_INLINE_MAX (64u << 10)   /* longest inline command line */

struct resp_limits {
    size_t max_args;       /* arguments of one command, name included */
    size_t max_bulk;       /* bytes of one argument */
    size_t max_command;    /* bytes of one command on the wire */
};

enum resp_parse_rc {
    RESP_PARSE_ERROR = -1,
    RESP_PARSE_MORE = 0,   /* the command is not complete yet */
    RESP_PARSE_DONE = 1,   /* one command: argc, off[], len[], used */
};

struct resp_parser {
    const struct resp_limits *lim;
    /* Where the parse stands, relative to the command's first byte. */
    size_t pos;
    int state;
    size_t nargs;          /* announced by the header */
    size_t bulk;           /* the bulk being read: its length */
    /* The command, once DONE (and what is parsed of it before). */
    size_t argc;
    size_t *off, *len;     /* argc entries; offsets from the command start */
    size_t cap;
    size_t used;           /* DONE: bytes the command took */
    bool empty;            /* DONE with argc 0: "*0", "*-1" or a blank line */
    char err[RESP_ERRLEN];
};

/* A parser with these limits (kept by pointer). */
void resp_parser_init(struct resp_parser *p, const struct resp_limits *lim);
void resp_parser_deinit(struct resp_parser *p);
/* Forget a command in progress (or done): the next call starts a new one. */
void resp_parser_reset(struct resp_parser *p);

/* Parse buf[0, len): the bytes buffered from the current command's first
 * byte (the same command's bytes on every call until DONE, possibly more
 * of them).  DONE: argc and the arguments' offsets are set and used says
 * how many bytes it took; call resp_parser_reset before the next command.
 * MORE: wait for more bytes.  ERROR: p->err holds Redis's message. */
int resp_parse(struct resp_parser *p, const char *buf, size_t len);

/* ---- replies ---- */

struct resp_buf {
    char *p;
    size_t len, cap;
    bool oom;              /* an append failed: the reply is incomplete */
};

void resp_buf_init(struct resp_buf *b);
void resp_buf_free(struct resp_buf *b);
/* Make room for n more bytes.  0 or -ENOMEM (oom set). */
int resp_buf_reserve(struct resp_buf *b, size_t n);
int resp_buf_append(struct resp_buf *b, const void *p, size_t n);

int resp_add_simple(struct resp_buf *b, const char *s);         /* +s */
/* -PREFIX message, with the prefix ("ERR", "WRONGTYPE") given apart; text
 * is cleaned of CR and LF. */
int resp_add_error(struct resp_buf *b, const char *prefix, const char *text);
int resp_add_errorf(struct resp_buf *b, const char *prefix, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int resp_add_int(struct resp_buf *b, long long v);              /* :v */
/* RESP3: #t / #f; RESP2: :1 / :0 */
int resp_add_bool(struct resp_buf *b, int proto, bool v);
int resp_add_bulk(struct resp_buf *b, const void *p, size_t n);  /* $n */
int resp_add_bulk_str(struct resp_buf *b, const char *s);
int resp_add_verbatim(struct resp_buf *b, int proto, const char *s); /* =n txt: in RESP3 */
int resp_add_null(struct resp_buf *b, int proto);               /* _ or $-1 */
int resp_add_null_array(struct resp_buf *b, int proto);         /* _ or *-1 */
int resp_add_array(struct resp_buf *b, size_t n);               /* *n */
int resp_add_map(struct resp_buf *b, int proto, size_t n);      /* %n or *2n */
int resp_add_set(struct resp_buf *b, int proto, size_t n);      /* ~n or *n */
int resp_add_double(struct resp_buf *b, int proto, double v);   /* ,v or $ */

/* Case-insensitive compare of a length-counted argument with a C string. */
bool resp_arg_is(const char *arg, size_t len, const char *word);

/* Parse a whole argument as a decimal integer / a finite double.  0 or
 * -EINVAL. */
int resp_arg_ll(const char *arg, size_t len, long long *out);
int resp_arg_double(const char *arg, size_t len, double *out);

#endif
