/* Router test "cluster": 3 nodes, 2 routers.  1M keys added through one
 * router are all present through the other; the FPR at capacity is within
 * 1.1 p; answers keep the request order; GetFilter and ListFilters
 * aggregate the shards; a shard gone from its node fails the batch naming
 * the shard, the node and the keys not acknowledged; the node's Batches
 * stream answers each entry on its own; bad calls get their codes; a drop
 * through one router is seen by the other.
 *
 * usage: test_router_cluster NODE_BIN ROUTER_BIN
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/grpc.h>

#include "cluster.h"

#define N 1000000     /* keys added, and absent keys asked */
#define B 10000       /* keys per call */
#define P 0.01

/* 1M keys through router a, all present through b; the FPR of 1M absent
 * keys within 1.1 p. */
static void million_keys(struct rpc_channel *a, struct rpc_channel *b)
{
    struct rpc_status st;
    bool *out = malloc(B * sizeof *out);
    double t0 = harness_now_s();
    for (size_t from = 0; from < N; from += B) {
        char **k = keys_make("present", from, B);
        CHECK(t_keys(a, "Add", "big", k, B, out, &st) == 0, "Add: %s", st.message);
        keys_free(k, B);
    }
    double t1 = harness_now_s();
    for (size_t from = 0; from < N; from += B) {
        char **k = keys_make("present", from, B);
        CHECK(t_keys(b, "MayContain", "big", k, B, out, &st) == 0, "MayContain: %s",
              st.message);
        for (size_t i = 0; i < B; i++)
            CHECK(out[i], "key %s missing through the other router", k[i]);
        keys_free(k, B);
    }
    double t2 = harness_now_s();
    size_t fp = 0;
    for (size_t from = 0; from < N; from += B) {
        char **k = keys_make("absent", from, B);
        CHECK(t_keys(b, "MayContain", "big", k, B, out, &st) == 0, "MayContain: %s",
              st.message);
        for (size_t i = 0; i < B; i++)
            fp += out[i];
        keys_free(k, B);
    }
    double fpr = (double)fp / N;
    printf("1M adds %.2fs, 1M present %.2fs, 1M absent %.2fs; FPR %.5f (p %.3f)\n",
           t1 - t0, t2 - t1, harness_now_s() - t2, fpr, P);
    CHECK(fpr <= 1.1 * P, "FPR %.5f above 1.1 p", fpr);
    free(out);
}

/* Request order: present and absent keys (named as keys_make names them)
 * interleaved over every shard; the same keys asked one at a time must give
 * the same answers. */
static void request_order(struct rpc_channel *a, struct rpc_channel *b)
{
    struct rpc_status st;
    const size_t M = 3000;
    char **mix = malloc(M * sizeof *mix);
    for (size_t i = 0; i < M; i++) {
        mix[i] = malloc(32);
        snprintf(mix[i], 32, i % 3 == 0 ? "present-%zu" : "absent-%zu",
                 (i * 7919) % N);
    }
    bool *ans = malloc(M * sizeof *ans);
    CHECK(t_keys(a, "MayContain", "big", mix, M, ans, &st) == 0, "mix: %s", st.message);
    size_t neg = 0;
    for (size_t i = 0; i < M; i++) {
        if (i % 3 == 0)
            CHECK(ans[i], "present key %zu answered absent", i);
        neg += !ans[i];
        if (i % 10 == 0) {
            bool one;
            CHECK(t_keys(b, "MayContain", "big", &mix[i], 1, &one, &st) == 0, "one: %s",
                  st.message);
            CHECK(one == ans[i], "key %zu: batch says %d, alone %d", i, ans[i], one);
        }
    }
    CHECK(neg > M / 2, "too few absent answers: %zu", neg);
    keys_free(mix, M);
    free(ans);
}

/* GetFilter and ListFilters aggregate the 64 shards of "big". */
static void aggregated_info(struct rpc_channel *a, struct rpc_channel *b)
{
    struct rpc_status st;
    Bloomgrid__V1__FilterInfo *fi = NULL;
    CHECK(t_get(b, "big", &fi, &st) == 0, "GetFilter: %s", st.message);
    CHECK(fi->shards == 64 && fi->n_shard_info == 64, "shards");
    CHECK(fi->state == BLOOMGRID__V1__FILTER_STATE__FILTER_STATE_READY, "state %d: %s",
          fi->state, fi->reason);
    CHECK(fi->estimated_count > 0.95 * N && fi->estimated_count < 1.05 * N,
          "n-hat %.0f", fi->estimated_count);
    CHECK(fi->capacity >= N && fi->capacity < N + 64, "capacity %llu",
          (unsigned long long)fi->capacity);
    CHECK(fi->estimated_error_rate > 0.5 * P && fi->estimated_error_rate < 1.5 * P,
          "estimated FPR %g", fi->estimated_error_rate);
    uint64_t bits = 0;
    for (size_t i = 0; i < fi->n_shard_info; i++) {
        CHECK(fi->shard_info[i]->index == i, "shard order");
        CHECK(fi->shard_info[i]->node[0], "shard %zu names no node", i);
        bits += fi->shard_info[i]->bits;
    }
    CHECK(bits == fi->bits, "bits %llu vs sum %llu", (unsigned long long)fi->bits,
          (unsigned long long)bits);
    bloomgrid__v1__filter_info__free_unpacked(fi, NULL);

    Bloomgrid__V1__ListFiltersRequest lr = BLOOMGRID__V1__LIST_FILTERS_REQUEST__INIT;
    Bloomgrid__V1__ListFiltersResponse *ls = NULL;
    CHECK(rpc_call(a, "/bloomgrid.v1.BloomGrid/ListFilters", &lr.base,
                   &bloomgrid__v1__list_filters_response__descriptor,
                   (ProtobufCMessage **)&ls, TIMEOUT_MS, &st) == 0, "List: %s",
          st.message);
    CHECK(ls->n_filters == 1 && strcmp(ls->filters[0]->name, "big") == 0 &&
          ls->filters[0]->shards == 64 && ls->filters[0]->n_shard_info == 64,
          "ListFilters");
    bloomgrid__v1__list_filters_response__free_unpacked(ls, NULL);
}

/* A shard gone from its node while the node's other shards answer (one call
 * carries them all): the batch fails naming that shard and its node, and
 * says which keys were acknowledged.  Returns the node that held it. */
static int shard_gone(struct cluster *c)
{
    struct rpc_channel *a = c->router[0].ch, *b = c->router[1].ch;
    struct rpc_status st;
    bool out[200];
    CHECK(t_create_sharded(a, "part", 10000, P, 0, 8, NULL, &st) == 0, "create part: %s",
          st.message);
    int holder = -1;
    for (int i = 0; i < 3; i++) {
        Bloomgrid__V1__ShardRef ref = BLOOMGRID__V1__SHARD_REF__INIT;
        ProtobufCMessage *dr = NULL;
        ref.filter = "part";
        ref.shard_index = 3;
        if (rpc_call(c->node[i].ch, "/bloomgrid.v1.Internal/DropShard", &ref.base,
                     &bloomgrid__v1__drop_shard_response__descriptor, &dr,
                     TIMEOUT_MS, &st) == 0) {
            holder = i;
            protobuf_c_message_free_unpacked(dr, NULL);
        }
    }
    CHECK(holder >= 0, "no node held shard 3 of part");
    char **pk = keys_make("part", 0, 200);
    char want[128], copy[128];
    snprintf(want, sizeof want, "shard 3 (group g%d): 0 of 1 copies", holder);
    snprintf(copy, sizeof copy, "failed copies: %s NOT_FOUND", c->node[holder].addr);
    CHECK(t_keys(a, "Add", "part", pk, 200, out, &st) == GRPC_STATUS_UNAVAILABLE,
          "Add with shard 3 gone: %d %s", st.code, st.message);
    CHECK(strstr(st.message, want) && strstr(st.message, copy) &&
          strstr(st.message, "of 200 keys; not acknowledged"),
          "Add with shard 3 gone: %s", st.message);
    CHECK(t_keys(b, "MayContain", "part", pk, 200, out, &st) == GRPC_STATUS_UNAVAILABLE &&
          strstr(st.message, want) && strstr(st.message, copy),
          "MayContain with shard 3 gone: %d %s", st.code,
          st.message);
    keys_free(pk, 200);
    return holder;
}

/* One BatchRequest on an open Batches stream; returns its answer (caller
 * frees) or NULL when the stream failed. */
static Bloomgrid__V1__BatchResponse *batch_once(struct rpc_cstream *cs,
                                                Bloomgrid__V1__BatchRequest *rq)
{
    grpc_slice sl;
    if (rpc_cstream_write_msg(cs, &rq->base) < 0 || rpc_cstream_read(cs, &sl) != 1)
        return NULL;
    Bloomgrid__V1__BatchResponse *r = bloomgrid__v1__batch_response__unpack(
        NULL, GRPC_SLICE_LENGTH(sl), GRPC_SLICE_START_PTR(sl));
    grpc_slice_unref(sl);
    CHECK(r, "BatchResponse does not parse");
    return r;
}

/* e: an entry of filter "part" with n hashes at h and the runs given. */
static void runs_entry(Bloomgrid__V1__BatchEntry *e, uint32_t shard, Bloomgrid__V1__BatchOp op,
                       uint8_t *h, size_t n, size_t nshards, uint32_t *shards,
                       size_t ncounts, uint32_t *counts)
{
    bloomgrid__v1__batch_entry__init(e);
    e->filter = "part";
    e->shard_index = shard;
    e->op = op;
    e->hashes.data = h;
    e->hashes.len = 16 * n;
    e->n_run_shards = nshards;
    e->run_shards = shards;
    e->n_run_counts = ncounts;
    e->run_counts = counts;
}

/* The node's Batches stream directly: each entry answers on its own, in
 * entry order, under the request's id; messages sent before the answers
 * come are answered in order; a malformed message ends the stream with
 * INVALID_ARGUMENT after the answers of those before it. */
static void batch_stream(struct node_proc *holder)
{
    struct rpc_status st;
    Bloomgrid__V1__ListShardsRequest lsr = BLOOMGRID__V1__LIST_SHARDS_REQUEST__INIT;
    Bloomgrid__V1__ListShardsResponse *lsp = NULL;
    CHECK(rpc_call(holder->ch, "/bloomgrid.v1.Internal/ListShards", &lsr.base,
                   &bloomgrid__v1__list_shards_response__descriptor,
                   (ProtobufCMessage **)&lsp, TIMEOUT_MS, &st) == 0, "ListShards: %s",
          st.message);
    int other = -1;
    for (size_t i = 0; i < lsp->n_shards; i++)
        if (strcmp(lsp->shards[i]->filter, "part") == 0)
            other = (int)lsp->shards[i]->shard_index;
    bloomgrid__v1__list_shards_response__free_unpacked(lsp, NULL);
    CHECK(other >= 0 && other != 3, "node %s holds no other shard of part", holder->addr);

    /* Hashes that belong to shard `other` of 8 (bf_hash_shard: the high 32
     * bits of h2 scaled to the shard count). */
    uint8_t hbytes[32] = {0};
    uint64_t h2 = ((uint64_t)(((uint64_t)(uint32_t)other << 32) / 8) + 1) << 32;
    for (int k = 0; k < 2; k++)
        for (int b = 0; b < 8; b++) {
            hbytes[16 * k + b] = (uint8_t)(k + 1);
            hbytes[16 * k + 8 + b] = (uint8_t)(h2 >> (8 * b));
        }
    Bloomgrid__V1__BatchEntry e0 = BLOOMGRID__V1__BATCH_ENTRY__INIT;
    Bloomgrid__V1__BatchEntry e1 = BLOOMGRID__V1__BATCH_ENTRY__INIT;
    Bloomgrid__V1__BatchEntry e2 = BLOOMGRID__V1__BATCH_ENTRY__INIT;
    Bloomgrid__V1__BatchEntry *ents[] = {&e0, &e1, &e2};
    Bloomgrid__V1__BatchRequest rq = BLOOMGRID__V1__BATCH_REQUEST__INIT;
    e0.filter = e1.filter = e2.filter = "part";
    e0.op = e1.op = e2.op = BLOOMGRID__V1__BATCH_OP__BATCH_OP_MAY_CONTAIN;
    e0.shard_index = (uint32_t)other;
    e0.hashes.data = hbytes;
    e0.hashes.len = 32;
    e1.shard_index = 3;
    e1.hashes.data = hbytes;
    e1.hashes.len = 16;
    e2.shard_index = (uint32_t)other;
    e2.hashes.data = hbytes;
    e2.hashes.len = 15;         /* not a multiple of 16 */
    rq.id = 41;
    rq.n_entries = 3;
    rq.entries = ents;

    struct rpc_cstream *cs = rpc_cstream_open(holder->ch, "/bloomgrid.v1.Internal/Batches",
                                              TIMEOUT_MS);
    CHECK(cs, "open Batches");
    Bloomgrid__V1__BatchResponse *r = batch_once(cs, &rq);
    CHECK(r && r->id == 41 && r->n_results == 3, "batch: %zu results",
          r ? r->n_results : 0);
    CHECK(r->results[0]->shard_index == (uint32_t)other && r->results[0]->code == 0 &&
          r->results[0]->n_results == 2, "entry 0: shard %u code %d (%s), %zu results",
          r->results[0]->shard_index, r->results[0]->code, r->results[0]->message,
          r->results[0]->n_results);
    CHECK(r->results[1]->shard_index == 3 && r->results[1]->code == GRPC_STATUS_NOT_FOUND &&
          strstr(r->results[1]->message, "shard 3") && r->results[1]->n_results == 0,
          "entry 1: code %d: %s", r->results[1]->code, r->results[1]->message);
    CHECK(r->results[2]->code == GRPC_STATUS_INVALID_ARGUMENT &&
          strstr(r->results[2]->message, "multiple of 16"), "entry 2: code %d: %s",
          r->results[2]->code, r->results[2]->message);
    bloomgrid__v1__batch_response__free_unpacked(r, NULL);

    /* The same stream again: another secret is refused per entry, with its
     * typed reason; a hash of another shard too. */
    e0.secret_id = 12345;
    e0.op = BLOOMGRID__V1__BATCH_OP__BATCH_OP_ADD;
    e1.shard_index = (uint32_t)(other + 1) % 8;
    e1.hashes.len = 16;
    rq.id = 42;
    rq.n_entries = 2;
    r = batch_once(cs, &rq);
    CHECK(r && r->id == 42 && r->n_results == 2, "second batch");
    CHECK(r->results[0]->code == GRPC_STATUS_FAILED_PRECONDITION &&
          r->results[0]->reason == BLOOMGRID__V1__ERROR_REASON__ERROR_REASON_SECRET_MISMATCH &&
          strstr(r->results[0]->message, "another secret"), "secret: %d %s",
          r->results[0]->code, r->results[0]->message);
    CHECK(r->results[1]->code == GRPC_STATUS_NOT_FOUND ||
          (r->results[1]->code == GRPC_STATUS_FAILED_PRECONDITION &&
           r->results[1]->reason == BLOOMGRID__V1__ERROR_REASON__ERROR_REASON_WRONG_SHARD),
          "wrong shard: %d %s", r->results[1]->code, r->results[1]->message);
    bloomgrid__v1__batch_response__free_unpacked(r, NULL);

    /* A message of many entries (more than the node looks ahead): adds of
     * new hashes, entries of a shard not held between them, then reads of
     * the same hashes later in the same message; every entry answers on
     * its own, the reads see the adds before them. */
    enum { NADD = 10, NMISS = 3 };
    uint8_t many[NADD][16];
    Bloomgrid__V1__BatchEntry me[2 * NADD + NMISS], *mp[2 * NADD + NMISS];
    for (int i = 0; i < NADD; i++)
        for (int b = 0; b < 16; b++)
            many[i][b] = b < 8 ? (uint8_t)(0x40 + i) : (uint8_t)(h2 >> (8 * (b - 8)));
    for (int i = 0; i < 2 * NADD + NMISS; i++) {
        bloomgrid__v1__batch_entry__init(&me[i]);
        mp[i] = &me[i];
        me[i].filter = "part";
        if (i >= NADD && i < NADD + NMISS) {
            me[i].shard_index = 3;
            me[i].op = BLOOMGRID__V1__BATCH_OP__BATCH_OP_MAY_CONTAIN;
            me[i].hashes.data = many[0];
            me[i].hashes.len = 16;
            continue;
        }
        int j = i < NADD ? i : i - NADD - NMISS;
        me[i].shard_index = (uint32_t)other;
        me[i].op = i < NADD ? BLOOMGRID__V1__BATCH_OP__BATCH_OP_ADD
                            : BLOOMGRID__V1__BATCH_OP__BATCH_OP_MAY_CONTAIN;
        me[i].hashes.data = many[j];
        me[i].hashes.len = 16;
    }
    rq.id = 50;
    rq.n_entries = 2 * NADD + NMISS;
    rq.entries = mp;
    r = batch_once(cs, &rq);
    CHECK(r && r->id == 50 && r->n_results == 2 * NADD + NMISS, "many entries: %zu results",
          r ? r->n_results : 0);
    for (int i = 0; i < 2 * NADD + NMISS; i++) {
        const Bloomgrid__V1__ShardResult *x = r->results[i];
        if (i >= NADD && i < NADD + NMISS) {
            CHECK(x->shard_index == 3 && x->code == GRPC_STATUS_NOT_FOUND,
                  "entry %d: code %d: %s", i, x->code, x->message);
            continue;
        }
        CHECK(x->shard_index == (uint32_t)other && x->code == 0 && x->n_results == 1,
              "entry %d: code %d (%s), %zu results", i, x->code, x->message, x->n_results);
        if (i >= NADD)
            CHECK(x->results[0], "entry %d: a read after its add in one message missed it",
                  i);
    }
    bloomgrid__v1__batch_response__free_unpacked(r, NULL);

    /* Entries of runs: each run applied and answered as an entry of its
     * shard would be, in one ShardResult; a refused run in run_errors (a
     * shard not held, a hash of another shard), false in the results and
     * nothing of it changed; runs that do not fit the hashes refuse the
     * entry. */
    uint8_t rh[4][16];
    uint64_t h2s3 = ((uint64_t)(((uint64_t)3 << 32) / 8) + 1) << 32;
    for (int i = 0; i < 4; i++)
        for (int k = 0; k < 16; k++)
            rh[i][k] = k < 8 ? (uint8_t)(0x70 + i)
                             : (uint8_t)((i == 2 ? h2s3 : h2) >> (8 * (k - 8)));
    uint32_t rs_add[] = {(uint32_t)other, 3, (uint32_t)other};
    uint32_t rc_add[] = {2, 1, 1};
    uint32_t rs_read[] = {(uint32_t)other, (uint32_t)other, (uint32_t)other};
    uint32_t rc_read[] = {1, 1, 1};
    uint32_t rs_bad[] = {(uint32_t)other, (uint32_t)other};
    uint32_t rc_bad[] = {1, 1};
    uint8_t readh[3][16];       /* A, C (shard 3's hash), D */
    memcpy(readh[0], rh[0], 16);
    memcpy(readh[1], rh[2], 16);
    memcpy(readh[2], rh[3], 16);
    Bloomgrid__V1__BatchEntry re[4], *rp[4];
    /* 0: add A B (other), C (shard 3, not held), D (other). */
    runs_entry(&re[0], (uint32_t)other, BLOOMGRID__V1__BATCH_OP__BATCH_OP_ADD, rh[0], 4,
               3, rs_add, 3, rc_add);
    /* 1: read A, then C's hash in a run of other (wrong shard), then D. */
    runs_entry(&re[1], (uint32_t)other, BLOOMGRID__V1__BATCH_OP__BATCH_OP_MAY_CONTAIN,
               readh[0], 3, 3, rs_read, 3, rc_read);
    /* 2: runs of 2 hashes for 3 hashes. */
    runs_entry(&re[2], (uint32_t)other, BLOOMGRID__V1__BATCH_OP__BATCH_OP_MAY_CONTAIN,
               rh[0], 3, 2, rs_bad, 2, rc_bad);
    /* 3: two run shards, one count. */
    runs_entry(&re[3], (uint32_t)other, BLOOMGRID__V1__BATCH_OP__BATCH_OP_MAY_CONTAIN,
               rh[0], 2, 2, rs_bad, 1, rc_bad);
    for (int i = 0; i < 4; i++)
        rp[i] = &re[i];
    rq.id = 60;
    rq.n_entries = 4;
    rq.entries = rp;
    r = batch_once(cs, &rq);
    CHECK(r && r->id == 60 && r->n_results == 4, "runs: %zu results", r ? r->n_results : 0);
    const Bloomgrid__V1__ShardResult *x = r->results[0];
    CHECK(x->code == 0 && x->n_results == 4 && x->n_run_errors == 1 &&
          x->run_errors[0]->run == 1 && x->run_errors[0]->code == GRPC_STATUS_NOT_FOUND &&
          strstr(x->run_errors[0]->message, "shard 3") && x->results[0] && x->results[1] &&
          !x->results[2] && x->results[3],
          "add of runs: code %d (%s), %zu results, %zu run errors", x->code, x->message,
          x->n_results, x->n_run_errors);
    x = r->results[1];
    CHECK(x->code == 0 && x->n_results == 3 && x->n_run_errors == 1 &&
          x->run_errors[0]->run == 1 &&
          x->run_errors[0]->code == GRPC_STATUS_FAILED_PRECONDITION &&
          x->run_errors[0]->reason == BLOOMGRID__V1__ERROR_REASON__ERROR_REASON_WRONG_SHARD &&
          x->results[0] && !x->results[1] && x->results[2],
          "read of runs: code %d (%s), %zu results, %zu run errors", x->code, x->message,
          x->n_results, x->n_run_errors);
    CHECK(r->results[2]->code == GRPC_STATUS_INVALID_ARGUMENT &&
          strstr(r->results[2]->message, "runs of 2 hashes"), "runs too short: %d %s",
          r->results[2]->code, r->results[2]->message);
    CHECK(r->results[3]->code == GRPC_STATUS_INVALID_ARGUMENT &&
          strstr(r->results[3]->message, "run counts"), "runs unpaired: %d %s",
          r->results[3]->code, r->results[3]->message);
    bloomgrid__v1__batch_response__free_unpacked(r, NULL);
    rq.entries = ents;

    /* Messages sent before the last is answered (a router keeps two writes
     * in flight): answered in request order, a read after a write sees
     * it, and a malformed message ends the stream after the answers of
     * the messages before it. */
    e0.secret_id = 0;
    e0.op = BLOOMGRID__V1__BATCH_OP__BATCH_OP_ADD;
    rq.n_entries = 1;
    rq.id = 43;
    CHECK(rpc_cstream_write_msg(cs, &rq.base) == 0, "write batch 43");
    e0.op = BLOOMGRID__V1__BATCH_OP__BATCH_OP_MAY_CONTAIN;
    rq.id = 44;
    CHECK(rpc_cstream_write_msg(cs, &rq.base) == 0, "write batch 44");
    e0.op = BLOOMGRID__V1__BATCH_OP__BATCH_OP_ADD;
    rq.id = 45;
    CHECK(rpc_cstream_write_msg(cs, &rq.base) == 0, "write batch 45");
    CHECK(rpc_cstream_write(cs, "\xff\xff\xff", 3) == 0, "write garbage");
    grpc_slice sl;
    for (uint64_t id = 43; id <= 45; id++) {
        CHECK(rpc_cstream_read(cs, &sl) == 1, "no answer to batch %llu",
              (unsigned long long)id);
        r = bloomgrid__v1__batch_response__unpack(NULL, GRPC_SLICE_LENGTH(sl),
                                                  GRPC_SLICE_START_PTR(sl));
        grpc_slice_unref(sl);
        CHECK(r && r->id == id && r->n_results == 1 && r->results[0]->code == 0 &&
              r->results[0]->n_results == 2, "answer %llu: id %llu, code %d",
              (unsigned long long)id, r ? (unsigned long long)r->id : 0ull,
              r && r->n_results ? r->results[0]->code : -1);
        if (id == 44)
            CHECK(r->results[0]->results[0] && r->results[0]->results[1],
                  "the read after the write does not see it");
        bloomgrid__v1__batch_response__free_unpacked(r, NULL);
    }
    /* Then the message that does not parse ends the stream. */
    CHECK(rpc_cstream_read(cs, &sl) != 1, "an answer to garbage");
    CHECK(rpc_cstream_finish(cs, &st) < 0 && st.code == GRPC_STATUS_INVALID_ARGUMENT,
          "garbage: %s %s", rpc_status_name(st.code), st.message);
}

static void test_cluster(void)
{
    struct cluster c;
    struct rpc_status st;
    bool out[1];
    Bloomgrid__V1__FilterInfo *fi = NULL;

    cluster_start(&c, "router-cluster", 3, 2, "none");
    struct rpc_channel *a = c.router[0].ch, *b = c.router[1].ch;
    CHECK(t_create_sharded(a, "big", N, P, 0, 64, &fi, &st) == 0, "create: %s", st.message);
    CHECK(fi->shards == 64, "shards %u", fi->shards);
    CHECK(fi->n_shard_info == 64, "shard infos %zu", fi->n_shard_info);
    bloomgrid__v1__filter_info__free_unpacked(fi, NULL);
    for (int i = 0; i < 3; i++) {
        int n = t_shard_count(c.node[i].ch, "big");
        CHECK(n > 5 && n < 40, "node %d holds %d shards", i, n);
    }
    CHECK(t_create_sharded(b, "big", N, P, 0, 0, NULL, &st) == GRPC_STATUS_ALREADY_EXISTS,
          "second create: %d %s", st.code, st.message);
    /* Without a count, a small filter gets one shard per group (its bits
     * are far below default_shard_mb). */
    CHECK(t_create_sharded(a, "small", 1000, P, 0, 0, &fi, &st) == 0, "create small: %s",
          st.message);
    CHECK(fi->shards == 3, "small: %u shards, want one per group", fi->shards);
    bloomgrid__v1__filter_info__free_unpacked(fi, NULL);
    /* A filter of one shard is named as the filter, those of two by
     * ".shard-i": the same name with another count is refused all the
     * same, and nothing is made. */
    CHECK(t_create_sharded(a, "one", 1000, P, 0, 2, NULL, &st) == 0, "create one: %s",
          st.message);
    CHECK(t_create_sharded(b, "one", 1000, P, 0, 1, NULL, &st) == GRPC_STATUS_ALREADY_EXISTS,
          "one again, of one shard: %d %s", st.code, st.message);
    int held = 0;
    for (int i = 0; i < 3; i++)
        held += t_shard_count(c.node[i].ch, "one");
    CHECK(held == 2, "the nodes hold %d shards of one, want its 2", held);
    CHECK(t_drop(a, "small", &st) == 0 && t_drop(a, "one", &st) == 0, "drop: %s",
          st.message);

    million_keys(a, b);
    request_order(a, b);
    aggregated_info(a, b);
    int holder = shard_gone(&c);
    batch_stream(&c.node[holder]);

    /* Errors. */
    char *k1[] = {"x"};
    CHECK(t_keys(a, "MayContain", "nosuch", k1, 1, out, &st) == GRPC_STATUS_NOT_FOUND,
          "unknown filter: %d", st.code);
    char *empty[] = {""};
    CHECK(t_keys(a, "Add", "big", empty, 1, out, &st) == GRPC_STATUS_INVALID_ARGUMENT,
          "empty key: %d", st.code);
    CHECK(t_keys(a, "Remove", "big", k1, 1, out, &st) ==
          GRPC_STATUS_FAILED_PRECONDITION, "Remove on blocked: %d %s", st.code,
          st.message);

    /* Drop through one router; the other notices. */
    CHECK(t_drop(a, "big", &st) == 0, "drop: %s", st.message);
    for (int i = 0; i < 3; i++)
        CHECK(t_shard_count(c.node[i].ch, "big") == 0, "node %d kept shards", i);
    CHECK(t_keys(b, "MayContain", "big", k1, 1, out, &st) == GRPC_STATUS_NOT_FOUND,
          "after drop: %d %s", st.code, st.message);
    CHECK(t_drop(a, "big", &st) == GRPC_STATUS_NOT_FOUND, "drop twice");
    cluster_stop(&c);
}

int main(int argc, char **argv)
{
    return cluster_test_main(argc, argv, test_cluster);
}
