/* node_multi_rpc: AddMultiHashes, MayContainMultiHashes, RemoveMultiHashes
 * of the internal service: the hashes of several shards of one filter in one
 * call, so that a router sends one call per node per batch instead of one
 * per shard.
 *
 * Each entry is checked and applied exactly as the one-shard call would
 * (node_rpc__shard_hashes) and gets its own ShardResult: results and version,
 * or the status the one-shard call would have failed with.  Queries run one
 * entry after the other on the calling thread.  Writes wait for their WAL
 * (one per shard), so the entries of a write run on up to MULTI_THREADS
 * threads at once: their fdatasyncs overlap as they would for as many
 * one-shard calls arriving together.  The response is encoded by hand
 * (ShardResult: 1 shard_index, 2 packed bools, 3 version, 4 code,
 * 5 message).
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bloomgrid/v1/internal.pb-c.h"
#include "node.h"
#include "node_rpc.h"
#include "rpc_server.h"
#include "store.h"
#include "wire.h"

#define MULTI_THREADS 8     /* threads (the caller's included) per write */

struct multi_job {
    struct store *s;
    enum key_op op;
    const Bloomgrid__V1__MultiHashesRequest *m;
    struct bf_hash *h;
    bool *out;
    size_t *off;            /* per entry: its first slot in h and out */
    uint64_t *version;      /* per entry */
    struct rpc_reply *rep;  /* per entry: OK, or the entry's error */
    atomic_size_t next;     /* next entry to take */
};

static void job_run_entry(struct multi_job *j, size_t k)
{
    const Bloomgrid__V1__ShardHashes *e = j->m->shards[k];
    j->rep[k].st.code = GRPC_STATUS_OK;
    node_rpc__shard_hashes(j->s, j->op, j->m->filter, e->shard_index,
                           e->hashes.data, e->hashes.len / 16, j->m->check_shard,
                           j->m->secret_id, j->h + j->off[k], j->out + j->off[k],
                           &j->version[k], &j->rep[k]);
}

static void *job_worker(void *p)
{
    struct multi_job *j = p;
    for (;;) {
        size_t k = atomic_fetch_add(&j->next, 1);
        if (k >= j->m->n_shards)
            return NULL;
        job_run_entry(j, k);
    }
}

/* Length of entry k's ShardResult (without its own tag and length). */
static size_t result_len(const struct multi_job *j, size_t k, size_t cnt)
{
    const struct rpc_reply *r = &j->rep[k];
    size_t len = 1 + varint_len(j->m->shards[k]->shard_index);
    if (r->st.code != GRPC_STATUS_OK) {
        size_t ml = strlen(r->st.message);
        len += 1 + varint_len((uint64_t)r->st.code) + 1 + varint_len(ml) + ml;
        if (r->st.reason)
            len += 1 + varint_len((uint64_t)r->st.reason);
        return len;
    }
    if (cnt)
        len += 1 + varint_len(cnt) + cnt;
    if (j->version[k])
        len += 1 + varint_len(j->version[k]);
    return len;
}

static void encode_response(struct multi_job *j, struct rpc_reply *r)
{
    const Bloomgrid__V1__MultiHashesRequest *m = j->m;
    size_t total = 0;
    for (size_t k = 0; k < m->n_shards; k++) {
        size_t sub = result_len(j, k, m->shards[k]->hashes.len / 16);
        total += 1 + varint_len(sub) + sub;
    }
    uint8_t *p = rpc_reply_alloc(r, total);
    for (size_t k = 0; k < m->n_shards; k++) {
        size_t cnt = m->shards[k]->hashes.len / 16;
        const struct rpc_reply *e = &j->rep[k];
        *p++ = 0x0a;
        p = put_varint(p, result_len(j, k, cnt));
        *p++ = 0x08;
        p = put_varint(p, m->shards[k]->shard_index);
        if (e->st.code != GRPC_STATUS_OK) {
            size_t ml = strlen(e->st.message);
            *p++ = 0x20;
            p = put_varint(p, (uint64_t)e->st.code);
            *p++ = 0x2a;
            p = put_varint(p, ml);
            memcpy(p, e->st.message, ml);
            p += ml;
            if (e->st.reason) {
                *p++ = 0x30;
                p = put_varint(p, (uint64_t)e->st.reason);
            }
            continue;
        }
        if (cnt) {
            const bool *o = j->out + j->off[k];
            *p++ = 0x12;
            p = put_varint(p, cnt);
            for (size_t i = 0; i < cnt; i++)
                *p++ = o[i] ? 1 : 0;
        }
        if (j->version[k]) {
            *p++ = 0x18;
            p = put_varint(p, j->version[k]);
        }
    }
}

static void multi_call(struct node *n, enum key_op op, const uint8_t *req,
                       size_t len, struct rpc_reply *r)
{
    struct store *s = node_rpc__need_store(n, r);
    if (!s)
        return;
    UNPACK_OR_FAIL(Bloomgrid__V1__MultiHashesRequest,
                   bloomgrid__v1__multi_hashes_request, m, req, len, r);
    struct scratch *sc = node_rpc__thread_scratch();
    struct multi_job j = {.s = s, .op = op, .m = m};
    size_t ne = m->n_shards, total = 0;
    pthread_t th[MULTI_THREADS];
    int nth = 0;

    atomic_init(&j.next, 0);
    for (size_t k = 0; k < ne; k++) {
        if (m->shards[k]->hashes.len % 16) {
            rpc_reply_error(r, GRPC_STATUS_INVALID_ARGUMENT,
                            "entry %zu (shard %u): hashes is %zu bytes: not a "
                            "multiple of 16", k, m->shards[k]->shard_index,
                            m->shards[k]->hashes.len);
            goto out;
        }
        total += m->shards[k]->hashes.len / 16;
    }
    if (total > n->cfg.max_batch_keys) {
        rpc_reply_error(r, GRPC_STATUS_RESOURCE_EXHAUSTED,
                        "%zu hashes in one batch; the limit is %llu (max_batch_keys)",
                        total, (unsigned long long)n->cfg.max_batch_keys);
        goto out;
    }
    j.off = malloc((ne ? ne : 1) * sizeof *j.off);
    j.version = calloc(ne ? ne : 1, sizeof *j.version);
    j.rep = calloc(ne ? ne : 1, sizeof *j.rep);
    if (!sc || !j.off || !j.version || !j.rep ||
        node_rpc__scratch_reserve(sc, total ? total : 1) < 0) {
        rpc_reply_error(r, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    j.h = sc->hashes;
    j.out = sc->out;
    for (size_t k = 0, off = 0; k < ne; k++) {
        j.off[k] = off;
        off += m->shards[k]->hashes.len / 16;
    }
    /* Writes: overlap the entries' WAL waits.  If a thread cannot be
     * started, the ones running (and this one) do its share. */
    if (op != OP_MAY_CONTAIN)
        while (nth + 1 < MULTI_THREADS && (size_t)nth + 1 < ne &&
               pthread_create(&th[nth], NULL, job_worker, &j) == 0)
            nth++;
    job_worker(&j);
    for (int i = 0; i < nth; i++)
        pthread_join(th[i], NULL);
    encode_response(&j, r);
out:
    free(j.off);
    free(j.version);
    free(j.rep);
    bloomgrid__v1__multi_hashes_request__free_unpacked(m, NULL);
}

void node_rpc__h_add_multi_hashes(void *arg, const uint8_t *req, size_t len,
                                  struct rpc_reply *r)
{
    multi_call(arg, OP_ADD, req, len, r);
}

void node_rpc__h_may_contain_multi_hashes(void *arg, const uint8_t *req,
                                          size_t len, struct rpc_reply *r)
{
    multi_call(arg, OP_MAY_CONTAIN, req, len, r);
}

void node_rpc__h_remove_multi_hashes(void *arg, const uint8_t *req, size_t len,
                                     struct rpc_reply *r)
{
    multi_call(arg, OP_REMOVE, req, len, r);
}
