/* rules: names and limits shared by every process (see rules.h). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errmsg.h"
#include "rules.h"

/* A printable copy of the first bytes of s for a message: bytes outside
 * printable ASCII become \xNN; long names end in "...". */
static void quote(char *out, size_t outlen, const void *s, size_t len)
{
    const unsigned char *p = s;
    size_t o = 0, shown = len > 48 ? 48 : len;

    for (size_t i = 0; i < shown && o + 5 < outlen; i++) {
        if (p[i] >= 0x20 && p[i] < 0x7f && p[i] != '"' && p[i] != '\\')
            out[o++] = (char)p[i];
        else
            o += (size_t)snprintf(out + o, outlen - o, "\\x%02x", p[i]);
    }
    if (shown < len && o + 4 < outlen) {
        memcpy(out + o, "...", 3);
        o += 3;
    }
    out[o < outlen ? o : outlen - 1] = 0;
}

bool rules_utf8_valid(const void *s, size_t len)
{
    const unsigned char *p = s, *end = p + len;

    while (p < end) {
        unsigned c = *p;
        size_t n;
        uint32_t cp, min;
        if (c < 0x80) {
            p++;
            continue;
        }
        if ((c & 0xe0) == 0xc0) {
            n = 1, cp = c & 0x1f, min = 0x80;
        } else if ((c & 0xf0) == 0xe0) {
            n = 2, cp = c & 0x0f, min = 0x800;
        } else if ((c & 0xf8) == 0xf0) {
            n = 3, cp = c & 0x07, min = 0x10000;
        } else {
            return false;
        }
        if ((size_t)(end - p) <= n)
            return false;
        for (size_t i = 1; i <= n; i++) {
            if ((p[i] & 0xc0) != 0x80)
                return false;
            cp = (cp << 6) | (p[i] & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            return false;
        p += n + 1;
    }
    return true;
}

int rules_string_check(const char *what, const void *s, size_t len, char *err)
{
    const char *nul = len ? memchr(s, 0, len) : NULL;
    char q[256];

    if (nul) {
        quote(q, sizeof q, s, len);
        errmsg_set(err, "%s \"%s\" contains a NUL byte at position %zu", what, q,
                   (size_t)(nul - (const char *)s));
        return -EINVAL;
    }
    if (!rules_utf8_valid(s, len)) {
        quote(q, sizeof q, s, len);
        errmsg_set(err, "%s \"%s\" is not valid UTF-8", what, q);
        return -EINVAL;
    }
    return 0;
}

/* The alphabet and length part of both name rules. */
static int name_check(const char *what, const void *name, size_t len,
                      size_t max, char *err)
{
    const unsigned char *p = name;
    char q[256];

    if (len == 0 || len > max) {
        quote(q, sizeof q, name, len);
        errmsg_set(err, "%s \"%s\" is %zu bytes long; it must be 1 to %zu", what,
                   q, len, max);
        return -EINVAL;
    }
    for (size_t i = 0; i < len; i++) {
        unsigned char c = p[i];
        if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
              (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-')) {
            quote(q, sizeof q, name, len);
            errmsg_set(err, "%s \"%s\" may contain only letters, digits, '.', '_' "
                       "and '-' (bad byte 0x%02x at position %zu)", what, q, c, i);
            return -EINVAL;
        }
    }
    if (p[0] == '.') {
        quote(q, sizeof q, name, len);
        errmsg_set(err, "%s \"%s\" must not start with a dot", what, q);
        return -EINVAL;
    }
    return 0;
}

static bool has_suffix_text(const void *name, size_t len)
{
    const size_t sl = sizeof RULES_SHARD_SUFFIX - 1;
    const char *p = name;

    for (size_t i = 0; i + sl <= len; i++)
        if (memcmp(p + i, RULES_SHARD_SUFFIX, sl) == 0)
            return true;
    return false;
}

int rules_filter_name_check(const void *name, size_t len, char *err)
{
    int rc = name_check("filter name", name, len, RULES_FILTER_NAME_MAX, err);

    if (rc < 0)
        return rc;
    if (has_suffix_text(name, len)) {
        char q[256];
        quote(q, sizeof q, name, len);
        errmsg_set(err, "filter name \"%s\": \"" RULES_SHARD_SUFFIX "\" is "
                   "reserved for shards", q);
        return -EINVAL;
    }
    return 0;
}

int rules_store_name_check(const void *name, size_t len, char *err)
{
    return name_check("filter name", name, len, RULES_STORE_NAME_MAX, err);
}

int rules_shard_count_check(uint64_t shards, char *err)
{
    if (shards < 1 || shards > RULES_SHARDS_MAX) {
        errmsg_set(err, "shards = %llu: a filter has 1 to %d shards",
                   (unsigned long long)shards, RULES_SHARDS_MAX);
        return -EINVAL;
    }
    return 0;
}

int rules_shard_name(char *out, size_t outlen, const char *filter,
                     unsigned index, unsigned count, char *err)
{
    int rc, n;

    if (outlen)
        out[0] = 0;
    if ((rc = rules_filter_name_check(filter, strlen(filter), err)) < 0 ||
        (rc = rules_shard_count_check(count, err)) < 0)
        return rc;
    if (index >= count) {
        errmsg_set(err, "shard_index %u is not below shard_count %u", index, count);
        return -EINVAL;
    }
    /* Formatted by hand: a node names a shard for every entry of every
     * batch it is sent. */
    char digits[12];
    size_t flen = strlen(filter), slen = count == 1 ? 0 : sizeof RULES_SHARD_SUFFIX - 1;
    size_t dlen = 0;
    if (count > 1)
        do {
            digits[sizeof digits - 1 - dlen++] = (char)('0' + index % 10);
            index /= 10;
        } while (index);
    n = (int)(flen + slen + dlen);
    if ((size_t)n >= outlen) {
        errmsg_set(err, "shard name buffer too small");
        return -EINVAL;
    }
    memcpy(out, filter, flen);
    memcpy(out + flen, RULES_SHARD_SUFFIX, slen);
    memcpy(out + flen + slen, digits + sizeof digits - dlen, dlen);
    out[n] = 0;
    return 0;
}

bool rules_is_shard_name(const char *name)
{
    return has_suffix_text(name, strlen(name));
}

bool rules_shard_split(const char *name, char *filter, size_t flen,
                       unsigned *index)
{
    const char *suf = strstr(name, RULES_SHARD_SUFFIX);
    *index = 0;
    if (!suf) {
        snprintf(filter, flen, "%s", name);
        return false;
    }
    snprintf(filter, flen, "%.*s", (int)(suf - name), name);
    *index = (unsigned)strtoul(suf + sizeof RULES_SHARD_SUFFIX - 1, NULL, 10);
    return true;
}

int rules_addr_check(const char *what, const char *addr, bool listen, char *err)
{
    const char *colon = strrchr(addr, ':');
    const unsigned min = listen ? 0 : 1;
    char q[256];
    unsigned long port = 0;

    quote(q, sizeof q, addr, strlen(addr));
    if (!colon) {
        errmsg_set(err, "%s \"%s\" is not host:port", what, q);
        return -EINVAL;
    }
    if (colon == addr) {
        errmsg_set(err, "%s \"%s\" has no host (host:port)", what, q);
        return -EINVAL;
    }
    for (const char *s = addr; s < colon; s++)
        if ((unsigned char)*s <= 0x20 || *s == 0x7f) {
            errmsg_set(err, "%s \"%s\": the host contains a space or control "
                       "character", what, q);
            return -EINVAL;
        }
    /* Digits only (no sign, no space), at most 5 of them: strtol would take
     * " +80" and wrap nothing, but 99999 must not become another port. */
    size_t digits = strlen(colon + 1);
    for (const char *s = colon + 1; *s; s++)
        if (*s < '0' || *s > '9')
            digits = 0;
    if (digits >= 1 && digits <= 5)
        port = strtoul(colon + 1, NULL, 10);
    if (digits < 1 || digits > 5 || port < min || port > RULES_PORT_MAX) {
        errmsg_set(err, "%s \"%s\": the port must be a number from %u to %d",
                   what, q, min, RULES_PORT_MAX);
        return -EINVAL;
    }
    return 0;
}

int rules_key_check(size_t i, size_t len, uint64_t max, char *err)
{
    if (len == 0) {
        errmsg_set(err, "key %zu is empty; keys must be 1..%llu bytes", i,
                   (unsigned long long)max);
        return -EINVAL;
    }
    if (len > max) {
        errmsg_set(err, "key %zu is %zu bytes; the limit is %llu (max_key_size)",
                   i, len, (unsigned long long)max);
        return -EINVAL;
    }
    return 0;
}

int rules_kind_check(int kind, char *err)
{
    if (kind < 0 || kind > 4) {
        errmsg_set(err, "unknown filter kind %d (BLOCKED=1, CLASSIC=2, COUNTING=3, "
                   "SCALABLE=4)", kind);
        return -EINVAL;
    }
    return 0;
}

int rules_secret_check(size_t len, char *err)
{
    if (len != 0 && len != RULES_SECRET_LEN) {
        errmsg_set(err, "secret must be %d bytes (or empty), not %zu",
                   RULES_SECRET_LEN, len);
        return -EINVAL;
    }
    return 0;
}

int rules_params_check(uint64_t capacity, double error_rate, char *err)
{
    if (capacity == 0) {
        errmsg_set(err, "capacity must be > 0 (the number of keys the filter is "
                   "sized for)");
        return -EINVAL;
    }
    if (!(error_rate > 0.0 && error_rate < 1.0)) {
        errmsg_set(err, "error_rate must be strictly between 0 and 1 (e.g. 0.01), "
                   "not %g", error_rate);
        return -EINVAL;
    }
    return 0;
}

uint64_t rules_shard_capacity(uint64_t capacity, uint32_t shards)
{
    if (shards <= 1)
        return capacity;
    return capacity / shards + (capacity % shards != 0);
}
