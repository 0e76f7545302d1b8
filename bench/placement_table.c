/* placement_table: the tables of docs/TOPOLOGY.md, "Balance and moves",
 * computed from the placement code (common/cluster/topo.c): how many
 * shards the fullest group holds under placement versions 1 and 2, and
 * how many shards move when a group is added or removed, for 64 / 256 /
 * 4096 shards over 3 / 8 / 32 groups, over 100 filters (f0 .. f99) on
 * groups g0 .. g<G-1>.
 *
 * usage: placement_table            print the tables (markdown)
 *        placement_table --check DOC  exit 1 unless DOC holds them, byte
 *                                   for byte, between the lines
 *                                   <!-- placement-table begin --> and
 *                                   <!-- placement-table end -->
 * The suite runs the check (placement_table_doc), so the page cannot
 * drift from the code.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "topo.h"

#define FILTERS 100
#define BEGIN "<!-- placement-table begin -->\n"
#define END "<!-- placement-table end -->\n"

static struct topo *groups(unsigned n, unsigned skip)
{
    char text[64 * 48], err[TOPO_ERRLEN];
    size_t off = (size_t)snprintf(text, sizeof text, "version = 1\n");
    for (unsigned i = 0; i < n; i++)
        if (i != skip)
            off += (size_t)snprintf(text + off, sizeof text - off,
                                    "[group g%u]\ncopies = h%u:1\n", i, i);
    struct topo *t = topo_parse(text, "table", err);
    if (!t) {
        fprintf(stderr, "placement_table: %s\n", err);
        exit(2);
    }
    return t;
}

/* Shards of one filter placed under t by version v, as group names. */
static void place(const struct topo *t, const char *f, uint32_t S, uint32_t v,
                  uint16_t *g)
{
    if (topo_place(t, f, S, v, g) < 0) {
        fprintf(stderr, "placement_table: cannot place\n");
        exit(2);
    }
}

static unsigned most(const uint16_t *g, uint32_t S, unsigned G)
{
    unsigned count[TOPO_MAX_GROUPS] = {0}, m = 0;
    for (uint32_t i = 0; i < S; i++)
        if (++count[g[i]] > m)
            m = count[g[i]];
    (void)G;
    return m;
}

/* Shards whose group (by name) differs between a under ta and b under tb. */
static unsigned moved(const struct topo *ta, const uint16_t *a, const struct topo *tb,
                      const uint16_t *b, uint32_t S)
{
    unsigned n = 0;
    for (uint32_t i = 0; i < S; i++)
        n += strcmp(ta->groups[a[i]].name, tb->groups[b[i]].name) != 0;
    return n;
}

static size_t tables(char *out, size_t cap)
{
    static const uint32_t shards[] = {64, 256, 4096};
    static const unsigned ngroups[] = {3, 8, 32};
    static uint16_t a[4096], b[4096];
    size_t off = 0;
#define P(...) off += (size_t)snprintf(out + off, off < cap ? cap - off : 0, __VA_ARGS__)
    P("Most shards on one group (mean and worst over %d filters), and the\n"
      "bound version 2 keeps:\n\n", FILTERS);
    P("| shards S | groups G | S/G | ceil(S/G) + 1 | version 1: mean | version 1: worst "
      "| version 2: mean | version 2: worst |\n");
    P("|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (size_t i = 0; i < 3; i++)
        for (size_t j = 0; j < 3; j++) {
            uint32_t S = shards[i];
            unsigned G = ngroups[j];
            struct topo *t = groups(G, G);
            double sum[3] = {0};
            unsigned worst[3] = {0};
            for (int f = 0; f < FILTERS; f++) {
                char name[16];
                snprintf(name, sizeof name, "f%d", f);
                for (uint32_t v = 1; v <= 2; v++) {
                    place(t, name, S, v, a);
                    unsigned m = most(a, S, G);
                    sum[v] += m;
                    if (m > worst[v])
                        worst[v] = m;
                }
            }
            P("| %u | %u | %.1f | %u | %.1f | %u | %.1f | %u |\n", S, G, (double)S / G,
              (S + G - 1) / G + 1, sum[1] / FILTERS, worst[1], sum[2] / FILTERS, worst[2]);
            topo_unref(t);
        }
    P("\nShards moved when a group is added (G to G + 1: g<G> joins) or removed\n"
      "(G to G - 1: g1 leaves), mean over the %d filters. At least about\n"
      "S/(G + 1) must move to fill a new group, and the removed group's S/G to\n"
      "leave it; version 1 moves exactly those, version 2 some more (a group\n"
      "that fills up sends later shards to their next choice):\n\n", FILTERS);
    P("| shards S | groups G | added: S/(G+1) | added: version 1 | added: version 2 "
      "| removed: S/G | removed: version 1 | removed: version 2 |\n");
    P("|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (size_t i = 0; i < 3; i++)
        for (size_t j = 0; j < 3; j++) {
            uint32_t S = shards[i];
            unsigned G = ngroups[j];
            struct topo *t = groups(G, G), *up = groups(G + 1, G + 1),
                        *down = groups(G, 1);
            double add[3] = {0}, rm[3] = {0};
            for (int f = 0; f < FILTERS; f++) {
                char name[16];
                snprintf(name, sizeof name, "f%d", f);
                for (uint32_t v = 1; v <= 2; v++) {
                    place(t, name, S, v, a);
                    place(up, name, S, v, b);
                    add[v] += moved(t, a, up, b, S);
                    place(down, name, S, v, b);
                    rm[v] += moved(t, a, down, b, S);
                }
            }
            P("| %u | %u | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f |\n", S, G,
              (double)S / (G + 1), add[1] / FILTERS, add[2] / FILTERS, (double)S / G,
              rm[1] / FILTERS, rm[2] / FILTERS);
            topo_unref(t);
            topo_unref(up);
            topo_unref(down);
        }
#undef P
    return off;
}

int main(int argc, char **argv)
{
    static char want[1 << 16];
    size_t n = tables(want, sizeof want);
    if (n >= sizeof want)
        return 2;
    if (argc == 1) {
        fputs(want, stdout);
        return 0;
    }
    if (argc != 3 || strcmp(argv[1], "--check") != 0) {
        fprintf(stderr, "usage: %s [--check DOC]\n", argv[0]);
        return 2;
    }
    FILE *f = fopen(argv[2], "r");
    static char doc[1 << 20];
    size_t len = f ? fread(doc, 1, sizeof doc - 1, f) : 0;
    if (!f) {
        perror(argv[2]);
        return 2;
    }
    fclose(f);
    doc[len] = 0;
    char *b = strstr(doc, BEGIN), *e = b ? strstr(b, END) : NULL;
    if (!b || !e) {
        fprintf(stderr, "%s: no %s ... %s", argv[2], BEGIN, END);
        return 1;
    }
    b += strlen(BEGIN);
    if ((size_t)(e - b) != n || memcmp(b, want, n) != 0) {
        fprintf(stderr, "%s: the placement tables differ from what the code gives; "
                "paste the output of placement_table between the markers:\n%s",
                argv[2], want);
        return 1;
    }
    printf("%s: placement tables as the code gives them\n", argv[2]);
    return 0;
}
