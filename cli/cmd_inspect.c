/* cmd_inspect: `bloomgrid inspect FILE [--json]`: geometry, estimates and
 * fingerprint of a filter file.  Loading verifies the checksum, so a file
 * that is shown at all has checksum "ok"; a corrupt one is refused (exit 2).
 * The secret is never printed, only the fingerprint id derived from it.
 * A shard bundle (a router's export) is shown as a list of its shards, a
 * plain filter file (a bundle of one, common/engine/bundle.h) in full.
 *
 * Two counts of adds: "keys added" (every add, repeats and false positives
 * included: what a batch job's mapper read) and the adds that set a bit
 * ("new-bit adds"; "inserts" in JSON, the name the servers' GetFilter,
 * info and the metrics use).  A file of format version 1 did not record
 * the first: "not recorded", null in JSON. */
#include <getopt.h>
#include <math.h>
#include <string.h>

#include "bf_file.h"
#include "cli.h"

static const struct option inspect_longopts[] = {
    {"json", no_argument, NULL, 'j'},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

/* The keys added, or what stands for an uncounted filter's: into buf. */
static const char *keys_text(const struct bf *f, char *buf, size_t len, const char *unknown)
{
    uint64_t k = bf_keys_added(f);

    if (k == BF_KEYS_UNCOUNTED)
        return unknown;
    snprintf(buf, len, "%llu", (unsigned long long)k);
    return buf;
}

static void print_text(const char *path, const struct bf *f,
                       const struct bf_stats *s, const char *fpid)
{
    struct bf_layer_info l0 = {0};
    char kbuf[24];

    bf_layer_info(f, 0, &l0);
    printf("file:            %s\n", path);
    printf("kind:            %s\n", bf_kind_name(bf_kind(f)));
    printf("capacity:        %llu\n", (unsigned long long)bf_capacity(f));
    printf("error rate:      %g\n", bf_error_rate(f));
    printf("layers:          %u\n", s->layers);
    printf("bits (m):        %llu\n", (unsigned long long)s->bits);
    printf("hashes (k):      %u\n", l0.k);
    printf("bytes:           %llu (file %llu)\n", (unsigned long long)s->bytes,
           (unsigned long long)bf_file_size(f));
    printf("bits/key:        %.3f\n", s->bits_per_key);
    printf("fill:            %.6f\n", s->fill_ratio);
    printf("estimated keys:  %.0f\n", s->estimated_count);
    printf("estimated FPR:   %.6g\n", s->estimated_fpr);
    printf("over capacity:   %s\n", s->over_capacity ? "yes" : "no");
    printf("keys added:      %s\n",
           keys_text(f, kbuf, sizeof kbuf, "not recorded (a file of format version 1)"));
    printf("new-bit adds:    %llu (keys added that set a bit: not repeats, not "
           "false positives)\n", (unsigned long long)bf_insert_count(f));
    if (bf_shard_count(f) > 1)
        printf("shard:           %u of %u (placement version %u)\n",
               bf_shard_index(f), bf_shard_count(f),
               bf_placement(f) ? bf_placement(f) : 1);
    else
        printf("shard:           %u of %u\n", bf_shard_index(f), bf_shard_count(f));
    printf("fingerprint:     %s\n", fpid);
    printf("checksum:        ok\n");
    if (bf_kind(f) == BF_KIND_SCALABLE)
        printf("growth:          %g\ntightening:      %g\n", bf_growth(f),
               bf_tightening(f));
    for (uint32_t i = 0; i < s->layers; i++) {
        struct bf_layer_info li;
        if (bf_layer_info(f, i, &li) < 0)
            continue;
        printf("layer %u:         capacity %llu, error rate %g, m %llu, k %u, "
               "count %llu, %llu bytes\n", i, (unsigned long long)li.capacity,
               li.error_rate, (unsigned long long)li.m, li.k,
               (unsigned long long)li.count,
               (unsigned long long)li.body_bytes);
    }
}

/* JSON has no NaN or infinity. */
static void json_num(const char *name, double v, const char *sep)
{
    if (isfinite(v))
        printf("  \"%s\": %.17g%s\n", name, v, sep);
    else
        printf("  \"%s\": null%s\n", name, sep);
}

static void json_layers(const struct bf *f, uint32_t n)
{
    printf("  \"layer_list\": [");
    for (uint32_t i = 0; i < n; i++) {
        struct bf_layer_info li = {0};
        bf_layer_info(f, i, &li);
        printf("%s\n    {\"capacity\": %llu, \"error_rate\": %.17g, "
               "\"m\": %llu, \"k\": %u, \"count\": %llu, \"bytes\": %llu}",
               i ? "," : "", (unsigned long long)li.capacity, li.error_rate,
               (unsigned long long)li.m, li.k, (unsigned long long)li.count,
               (unsigned long long)li.body_bytes);
    }
    printf("\n  ]\n");
}

static void print_json(const char *path, const struct bf *f,
                       const struct bf_stats *s, const char *fpid)
{
    struct bf_layer_info l0 = {0};
    char kbuf[24];

    bf_layer_info(f, 0, &l0);
    printf("{\n  \"file\": ");
    cli_json_str(path);
    printf(",\n  \"kind\": \"%s\",\n", bf_kind_name(bf_kind(f)));
    printf("  \"capacity\": %llu,\n", (unsigned long long)bf_capacity(f));
    json_num("error_rate", bf_error_rate(f), ",");
    printf("  \"layers\": %u,\n  \"m\": %llu,\n  \"k\": %u,\n", s->layers,
           (unsigned long long)s->bits, l0.k);
    printf("  \"bytes\": %llu,\n  \"file_bytes\": %llu,\n",
           (unsigned long long)s->bytes, (unsigned long long)bf_file_size(f));
    json_num("bits_per_key", s->bits_per_key, ",");
    json_num("fill", s->fill_ratio, ",");
    json_num("estimated_count", s->estimated_count, ",");
    json_num("estimated_fpr", s->estimated_fpr, ",");
    printf("  \"over_capacity\": %s,\n", s->over_capacity ? "true" : "false");
    printf("  \"keys_added\": %s,\n", keys_text(f, kbuf, sizeof kbuf, "null"));
    printf("  \"inserts\": %llu,\n", (unsigned long long)bf_insert_count(f));
    printf("  \"shard_index\": %u,\n  \"shard_count\": %u,\n",
           bf_shard_index(f), bf_shard_count(f));
    /* 0 (not recorded) is rendezvous, version 1 (docs/TOPOLOGY.md). */
    printf("  \"placement\": %u,\n", bf_placement(f) ? bf_placement(f) : 1);
    json_num("growth", bf_growth(f), ",");
    json_num("tightening", bf_tightening(f), ",");
    printf("  \"fingerprint\": \"%s\",\n  \"checksum\": \"ok\",\n", fpid);
    json_layers(f, s->layers);
    printf("}\n");
}

/* Everything about one filter. */
static void print_filter(const char *path, const struct bf *f, bool json)
{
    struct bf_stats s;
    char fpid[17];

    bf_stats(f, &s);
    bf_fingerprint_id(f, fpid);
    if (json)
        print_json(path, f, &s, fpid);
    else
        print_text(path, f, &s, fpid);
}

/* One line (or JSON object) per shard of a bundle. */
static void print_shards(const char *path, const struct bundle *b, bool json)
{
    char fpid[17], kbuf[24];
    struct bf_stats s;

    if (json) {
        printf("{\n  \"file\": ");
        cli_json_str(path);
        printf(",\n  \"format\": \"shard bundle\",\n  \"shards\": %u,\n"
               "  \"shard_list\": [", b->count);
    } else {
        printf("file:            %s\n", path);
        printf("format:          shard bundle (version %d), checksum ok\n",
               BUNDLE_VERSION);
        printf("shards:          %u\n", b->count);
        printf("kind:            %s\n", bf_kind_name(bf_kind(b->shard[0])));
    }
    for (uint32_t i = 0; i < b->count; i++) {
        const struct bf *f = b->shard[i];
        bf_stats(f, &s);
        bf_fingerprint_id(f, fpid);
        if (json)
            printf("%s\n    {\"index\": %u, \"capacity\": %llu, \"m\": %llu, "
                   "\"bytes\": %llu, \"fill\": %.17g, \"estimated_count\": "
                   "%.17g, \"keys_added\": %s, \"inserts\": %llu, "
                   "\"fingerprint\": \"%s\"}",
                   i ? "," : "", i, (unsigned long long)bf_capacity(f),
                   (unsigned long long)s.bits, (unsigned long long)s.bytes,
                   s.fill_ratio, s.estimated_count,
                   keys_text(f, kbuf, sizeof kbuf, "null"),
                   (unsigned long long)bf_insert_count(f), fpid);
        else
            printf("shard %-4u       capacity %llu, m %llu, %llu bytes, fill "
                   "%.6f, estimated keys %.0f, keys added %s, new-bit adds %llu, "
                   "fingerprint %s\n",
                   i, (unsigned long long)bf_capacity(f),
                   (unsigned long long)s.bits, (unsigned long long)s.bytes,
                   s.fill_ratio, s.estimated_count,
                   keys_text(f, kbuf, sizeof kbuf, "not recorded"),
                   (unsigned long long)bf_insert_count(f), fpid);
    }
    if (json)
        printf("\n  ]\n}\n");
}

int cmd_inspect(int argc, char **argv)
{
    bool json = false;
    struct bundle *b;
    int c;

    cli_getopt_reset();
    while ((c = getopt_long(argc, argv, ":jh", inspect_longopts, NULL)) != -1) {
        if (c == 'h')
            return help_print("inspect");
        if (c != 'j')
            return cli_bad_option("inspect", c, argv);
        json = true;
    }
    if (argc - optind != 1)
        return cli_fail("inspect: need exactly one FILE (see 'bloomgrid help "
                        "inspect')");
    if (!(b = cli_load(argv[optind])))
        return CLI_ERR;
    if (b->plain)
        print_filter(argv[optind], b->shard[0], json);
    else
        print_shards(argv[optind], b, json);
    bundle_destroy(b);
    return fflush(stdout) == 0 ? CLI_OK : cli_fail("cannot write the output");
}
