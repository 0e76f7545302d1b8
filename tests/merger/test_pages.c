/* Integration test of the node's change tracking and page calls
 * (PullPages, PushPages) on real bloomgrid-node processes.
 *
 * usage: test_pages NODE_BIN
 *   A pull since 0 streams the non-empty pages with checksums; a pull since
 *   the returned version streams nothing; keys added after it stream only
 *   the pages they changed; a caller that sends the hashes of the pages it
 *   holds gets only the others.  The pages pushed into a second node holding the
 *   same shard make every key present there, durably (after a restart);
 *   pages pushed back are not pulled again.  A corrupt page, a page outside
 *   the body and another fingerprint are refused before any bit changes.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/grpc.h>
#include <xxhash.h>

#include "bf.h"
#include "harness.h"
#include "node_client.h"

#define NKEYS 20000

struct collect {
    uint8_t *body;
    size_t size;
    size_t pages;
    struct node_client_page pg[4096];
};

static int collect_page(void *ctx, uint64_t off, const uint8_t *data, size_t len)
{
    struct collect *c = ctx;
    if (off + len > c->size || c->pages == 4096)
        return -1;
    memcpy(c->body + off, data, len);
    c->pg[c->pages++] = (struct node_client_page){off, c->body + off, len};
    return 0;
}

static void push_raw(struct rpc_channel *ch, const char *fp, uint64_t off,
                     const void *data, size_t len, uint64_t checksum,
                     struct rpc_status *st, int *rc)
{
    Bloomgrid__V1__ShardRef ref = BLOOMGRID__V1__SHARD_REF__INIT;
    Bloomgrid__V1__PushPagesRequest m = BLOOMGRID__V1__PUSH_PAGES_REQUEST__INIT;
    struct rpc_cstream *s = rpc_cstream_open(ch, "/bloomgrid.v1.Internal/PushPages", TIMEOUT_MS);
    ref.filter = "f";
    m.shard = &ref;
    m.fingerprint = (char *)fp;
    m.offset = off;
    m.data.data = (uint8_t *)data;
    m.data.len = len;
    m.checksum = checksum;
    rpc_cstream_write_msg(s, &m.base);
    rpc_cstream_close_send(s);
    *rc = rpc_cstream_finish(s, st);
}

int main(int argc, char **argv)
{
    struct node_proc a, b;
    char da[512], db[512];
    struct rpc_status st;
    struct node_client_shard sh;
    struct node_client_pull_end end, end2;

    CHECK(argc >= 2, "usage: test_pages NODE_BIN");
    harness_node_bin = argv[1];
    grpc_init();
    harness_tmpdir(da, sizeof da, "pages-a");
    harness_tmpdir(db, sizeof db, "pages-b");
    const char *fast[] = {"--durability", "none", NULL};
    node_start(&a, da, fast);
    CHECK(node_wait_health(&a, true, 20000), "node not serving");
    node_start(&b, db, fast);
    CHECK(node_wait_health(&b, true, 20000), "node not serving");
    CHECK(t_create(a.ch, "f", 2000000, 0.01, 1, &st) == 0, "create: %s", st.message);
    CHECK(node_client_get_shard(a.ch, "f", 0, &sh, TIMEOUT_MS, &st) == 0, "get: %s",
          st.message);
    CHECK(node_client_create_shard(b.ch, "f", &sh, TIMEOUT_MS, &st) == 0,
          "create on b: %s", st.message);
    char err[BF_ERRLEN];
    struct bf *like = node_client_shard_filter(&sh, err);
    CHECK(like, "%s", err);
    struct bf_layer_info li;
    bf_layer_info(like, 0, &li);
    char fp[17];
    bf_fingerprint_id(like, fp);

    struct collect *c = calloc(1, sizeof *c);
    c->size = li.body_bytes;
    c->body = calloc(1, c->size);

    /* An empty shard: nothing to pull. */
    CHECK(node_client_pull(a.ch, "f", 0, 0, 0, collect_page, c, &end, TIMEOUT_MS, &st) == 0,
          "pull: %s", st.message);
    CHECK(end.pages == 0, "%llu pages of an empty shard",
          (unsigned long long)end.pages);
    CHECK(strcmp(end.fp, fp) == 0, "fingerprint %s vs %s", end.fp, fp);

    char **k1 = keys_make("one", 0, NKEYS);
    keys_call(a.ch, "Add", "f", k1, NKEYS, 5000, NULL);
    CHECK(node_client_pull(a.ch, "f", 0, end.version, end.epoch, collect_page, c, &end,
                  TIMEOUT_MS, &st) == 0, "pull: %s", st.message);
    size_t total_pages = (c->size + 65535) / 65536;
    printf("pull after %d keys: %llu of %zu pages, %llu bytes, version %llu, "
           "store version %llu\n", NKEYS, (unsigned long long)end.pages,
           total_pages, (unsigned long long)end.bytes,
           (unsigned long long)end.version, (unsigned long long)end.store_version);
    CHECK(end.pages > 0 && end.store_version > 0, "pages after adds");

    /* Quiet: nothing since the version just returned. */
    CHECK(node_client_pull(a.ch, "f", 0, end.version, end.epoch, NULL, NULL, &end2,
                  TIMEOUT_MS, &st) == 0, "pull: %s", st.message);
    CHECK(end2.pages == 0 && end2.version == end.version,
          "quiet pull sent %llu pages", (unsigned long long)end2.pages);
    /* Another epoch (a restarted node): everything again. */
    CHECK(node_client_pull(a.ch, "f", 0, end.version, end.epoch + 1, NULL, NULL, &end2,
                  TIMEOUT_MS, &st) == 0, "pull: %s", st.message);
    CHECK(end2.pages == end.pages, "unknown epoch: %llu pages, not %llu",
          (unsigned long long)end2.pages, (unsigned long long)end.pages);

    /* A caller that holds the shard's pages (their hashes) gets none of
     * them; one page it holds differently, that page only; more hashes
     * than the shard has pages is refused. */
    uint64_t *have = calloc(total_pages + 1, sizeof *have);
    for (size_t i = 0; i < total_pages; i++) {
        size_t off = i * 65536, len = c->size - off < 65536 ? c->size - off : 65536;
        have[i] = XXH64(c->body + off, len, 0);
    }
    CHECK(node_client_pull_holding(a.ch, 0, have, total_pages, "f", 0, 0, 0, NULL, NULL,
                                   &end2, TIMEOUT_MS, &st) == 0, "pull holding: %s",
          st.message);
    CHECK(end2.pages == 0, "a caller holding every page got %llu",
          (unsigned long long)end2.pages);
    have[total_pages / 2] ^= 1;
    CHECK(node_client_pull_holding(a.ch, 0, have, total_pages, "f", 0, 0, 0, NULL, NULL,
                                   &end2, TIMEOUT_MS, &st) == 0, "pull holding: %s",
          st.message);
    CHECK(end2.pages == 1, "one page held differently: %llu pages streamed",
          (unsigned long long)end2.pages);
    CHECK(node_client_pull_holding(a.ch, 0, have, total_pages + 1, "f", 0, 0, 0, NULL,
                                   NULL, &end2, TIMEOUT_MS, &st) < 0 &&
          st.code == GRPC_STATUS_INVALID_ARGUMENT && strstr(st.message, "page hashes"),
          "too many hashes: %d %s", st.code, st.message);
    free(have);

    /* A few keys change a few pages. */
    char **k2 = keys_make("two", 0, 10);
    keys_call(a.ch, "Add", "f", k2, 10, 5000, NULL);
    uint64_t v1 = end.version;
    CHECK(node_client_pull(a.ch, "f", 0, v1, end.epoch, NULL, NULL, &end2, TIMEOUT_MS,
                  &st) == 0, "pull: %s", st.message);
    CHECK(end2.pages >= 1 && end2.pages <= 10, "10 keys changed %llu pages",
          (unsigned long long)end2.pages);
    CHECK(end2.version > v1, "version did not grow");

    /* Refusals on b, before any bit changes. */
    int rc;
    uint8_t page[64] = {1, 2, 3};
    push_raw(b.ch, fp, 0, page, sizeof page, XXH64(page, sizeof page, 0) ^ 1,
             &st, &rc);
    CHECK(rc < 0 && st.code == GRPC_STATUS_DATA_LOSS && strstr(st.message, "checksum"),
          "corrupt page: %d %s", st.code, st.message);
    push_raw(b.ch, "0123456789abcdef", 0, page, sizeof page,
             XXH64(page, sizeof page, 0), &st, &rc);
    CHECK(rc < 0 && st.code == GRPC_STATUS_FAILED_PRECONDITION &&
          strstr(st.message, "fingerprint"), "other fingerprint: %d %s", st.code,
          st.message);
    push_raw(b.ch, fp, c->size, page, sizeof page, XXH64(page, sizeof page, 0),
             &st, &rc);
    CHECK(rc < 0 && st.code == GRPC_STATUS_INVALID_ARGUMENT, "outside: %d %s",
          st.code, st.message);
    CHECK(keys_present(b.ch, "f", k1, NKEYS, NULL) < NKEYS / 100, "refused pages changed b");

    /* Push what was pulled: b answers like a. */
    uint64_t merged = 0;
    CHECK(node_client_push(b.ch, "f", 0, fp, end.store_version, c->pg, c->pages, &merged,
                  TIMEOUT_MS, &st) == 0, "push: %s", st.message);
    CHECK(merged == c->pages, "merged %llu of %zu", (unsigned long long)merged,
          c->pages);
    CHECK(keys_present(b.ch, "f", k1, NKEYS, NULL) == NKEYS, "pushed keys missing on b");
    /* b was pulled from before nothing; pushed pages are not pulled back. */
    CHECK(node_client_pull(b.ch, "f", 0, 0, 0, NULL, NULL, &end2, TIMEOUT_MS, &st) == 0,
          "pull b: %s", st.message);
    uint64_t bv = end2.version, be = end2.epoch;
    CHECK(node_client_push(b.ch, "f", 0, fp, 0, c->pg, c->pages, NULL, TIMEOUT_MS, &st) == 0,
          "push again: %s", st.message);
    CHECK(node_client_pull(b.ch, "f", 0, bv, be, NULL, NULL, &end2, TIMEOUT_MS, &st) == 0,
          "pull b: %s", st.message);
    CHECK(end2.pages == 0, "pushed pages pulled back: %llu",
          (unsigned long long)end2.pages);

    /* Durable: b restarted still has them. */
    CHECK(node_stop(&b, 15) == 0, "stop b");
    node_start(&b, db, fast);
    CHECK(node_wait_health(&b, true, 10000), "b healthy");
    CHECK(keys_present(b.ch, "f", k1, NKEYS, NULL) == NKEYS, "pushed keys lost by restart");

    /* Counting shards are not tracked. */
    CHECK(t_create(a.ch, "cnt", 1000, 0.01, 3, &st) == 0, "create cnt");
    CHECK(node_client_pull(a.ch, "cnt", 0, 0, 0, NULL, NULL, &end2, TIMEOUT_MS, &st) < 0 &&
          st.code == GRPC_STATUS_FAILED_PRECONDITION, "counting pull: %s",
          st.message);

    node_stop(&a, 15);
    node_stop(&b, 15);
    keys_free(k1, NKEYS);
    keys_free(k2, 10);
    free(c->body);
    free(c);
    bf_destroy(like);
    grpc_shutdown();
    printf("ok\n");
    return 0;
}
