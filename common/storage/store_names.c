/* store_names: see store_names.h. */
#include "store_names.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void store__fname(char out[STORE_FNAME_MAX], const struct store_fname *n)
{
    switch (n->kind) {
    case STORE_FILE_BASE:
        snprintf(out, STORE_FNAME_MAX, "base-%016" PRIx64 "-%016" PRIx64 ".bgc",
                 n->id, n->seq);
        break;
    case STORE_FILE_DELTA:
        snprintf(out, STORE_FNAME_MAX, "delta-%016" PRIx64 "-%016" PRIx64
                 "-%016" PRIx64 ".bgc", n->id, n->from, n->seq);
        break;
    case STORE_FILE_MANIFEST:
        snprintf(out, STORE_FNAME_MAX, "manifest-%016" PRIx64 "-%016" PRIx64
                 "-%016" PRIx64 ".bgm", n->id, n->seq, n->lsn);
        break;
    case STORE_FILE_CKPT:
        snprintf(out, STORE_FNAME_MAX, "ckpt-%016" PRIx64 "-%016" PRIx64
                 "-%016" PRIx64 ".bf", n->id, n->seq, n->lsn);
        break;
    default:
        out[0] = 0;
    }
}

void store__fname_path(char *out, size_t len, const char *dir,
                       const struct store_fname *n)
{
    char name[STORE_FNAME_MAX];

    store__fname(name, n);
    snprintf(out, len, "%s/%s", dir, name);
}

/* 16 lowercase hex digits at p, then the character end. */
static bool hex16(const char *p, char end, uint64_t *v)
{
    char buf[17], *e;

    for (int i = 0; i < 16; i++)
        if (!p[i] || !strchr("0123456789abcdef", p[i]))
            return false;
    if (p[16] != end)
        return false;
    memcpy(buf, p, 16);
    buf[16] = 0;
    *v = strtoull(buf, &e, 16);
    return e == buf + 16;
}

bool store__fname_parse(const char *name, struct store_fname *out)
{
    static const struct {
        const char *prefix, *ext;
        enum store_file_kind kind;
        int fields;             /* hex fields after the prefix */
    } forms[] = {
        {"base-", ".bgc", STORE_FILE_BASE, 2},
        {"delta-", ".bgc", STORE_FILE_DELTA, 3},
        {"manifest-", ".bgm", STORE_FILE_MANIFEST, 3},
        {"ckpt-", ".bf", STORE_FILE_CKPT, 3},
    };
    struct store_fname n = {0};

    for (size_t f = 0; f < sizeof forms / sizeof *forms; f++) {
        size_t pl = strlen(forms[f].prefix), el = strlen(forms[f].ext);
        if (strncmp(name, forms[f].prefix, pl) != 0)
            continue;
        const char *p = name + pl;
        uint64_t v[3];
        for (int i = 0; i < forms[f].fields; i++, p += 17)
            if (!hex16(p, i + 1 < forms[f].fields ? '-' : '.', &v[i]))
                return false;
        p--;   /* at the extension's dot */
        if (strncmp(p, forms[f].ext, el) != 0)
            return false;
        if (p[el] == 0)
            n.tmp = false;
        else if (strncmp(p + el, ".tmp.", 5) == 0)
            n.tmp = true;
        else
            return false;
        n.kind = forms[f].kind;
        n.id = v[0];
        if (n.id == 0)
            return false;
        if (n.kind == STORE_FILE_BASE) {
            n.seq = v[1];
        } else if (n.kind == STORE_FILE_DELTA) {
            n.from = v[1];
            n.seq = v[2];
        } else {
            n.seq = v[1];
            n.lsn = v[2];
        }
        if (out)
            *out = n;
        return true;
    }
    return false;
}
