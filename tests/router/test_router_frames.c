/* Router test "frames": key batches over the nodes' frame ports where they
 * offer one, over gRPC to a node with --frames off and from a router with
 * --frames off, with the same answers (Remove too).  A node restarted on a
 * new frame port: the router moves to it, keeps its connections to the
 * other nodes, and no acknowledged key is lost.  A node on a fixed
 * --frame-port serves it, reports it, and the router follows it there.
 *
 * Which transport a router uses is read from its TCP connections
 * (/proc/PID/fd and /proc/net/tcp); which ports of a node serve frames,
 * from a frame call to each port it listens on and Internal/NodeInfo.
 *
 * usage: test_router_frames NODE_BIN ROUTER_BIN
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/grpc.h>

#include "cluster.h"

#define FB 2000     /* keys per batch */
#define MAX_IDS 16

/* Send method for keys prefix-[from, from + n) in batches of FB through ch;
 * answers in out[n]. */
static void key_batches(struct rpc_channel *ch, const char *method, const char *filter,
                        const char *prefix, size_t from, size_t n, bool *out)
{
    char **k = keys_make(prefix, from, n);
    keys_call(ch, method, filter, k, n, FB, out);
    keys_free(k, n);
}

static void check_all(const bool *out, size_t n, const char *what)
{
    for (size_t i = 0; i < n; i++)
        CHECK(out[i], "%s: key %zu missing", what, i);
}

/* Of the ports node i listens on, fport alone answers over the frame
 * transport (fport 0: none does). */
static void check_frame_ports(struct cluster *c, int i, int fport)
{
    int ports[16], n = proc_tcp_listening(c->node[i].pid, ports, 16), answering = 0;
    bool grpc = false, frames = fport == 0;
    for (int k = 0; k < n && k < 16; k++) {
        grpc |= ports[k] == c->node[i].port;
        if (t_frames_answer(ports[k])) {
            answering++;
            frames |= ports[k] == fport;
        }
    }
    CHECK(grpc, "node %d does not listen on its gRPC port %d", i, c->node[i].port);
    CHECK(answering == (fport ? 1 : 0) && frames,
          "node %d: %d of its %d ports answer frames; it reports frame port %d", i,
          answering, n, fport);
}

/* Every connection ids[0, n) is still open in pid. */
static bool conns_kept(pid_t pid, const unsigned long *ids, int n)
{
    for (int i = 0; i < n && i < MAX_IDS; i++)
        if (!proc_tcp_has_conn(pid, ids[i]))
            return false;
    return true;
}

/* Nodes 0 and 1 offer frames, node 2 runs with --frames off; router 0 uses
 * frames, router 1 runs with --frames off.  fsync: a killed node keeps
 * every acknowledged key. */
static void frames_cluster_start(struct cluster *c, int *fport)
{
    static const char *const off[] = {"--frames", "off", NULL};
    cluster_init(c, "router-frames", "fsync");
    for (int i = 0; i < 3; i++) {
        cluster_node_start(c, i, 0, i == 2 ? off : NULL);
        fport[i] = t_frame_port(c->node[i].ch);
        if (i < 2)
            CHECK(fport[i] > 0, "node %d: NodeInfo reports frame port %d", i, fport[i]);
        else
            CHECK(fport[i] == 0, "node with --frames off reports frame port %d",
                  fport[i]);
        check_frame_ports(c, i, fport[i]);
    }
    cluster_write_topo(c, 3, false, NULL);
    cluster_router_start(c, 0, NULL);
    cluster_router_start(c, 1, off);
}

/* Remove over frames too: on a counting filter, removed keys go, the others
 * stay, whichever router asks. */
static void frames_remove(struct cluster *c)
{
    struct rpc_status st;
    bool out[2 * FB];
    CHECK(t_create_sharded(c->router[0].ch, "cnt", 10000, 0.01,
                           BLOOMGRID__V1__FILTER_KIND__FILTER_KIND_COUNTING, 16, NULL,
                           &st) == 0, "create counting: %s", st.message);
    key_batches(c->router[0].ch, "Add", "cnt", "c", 0, 2 * FB, out);
    key_batches(c->router[0].ch, "Remove", "cnt", "c", 0, FB, out);
    for (int r = 0; r < 2; r++) {
        key_batches(c->router[r].ch, "MayContain", "cnt", "c", 0, 2 * FB, out);
        size_t left = 0;
        for (size_t i = 0; i < FB; i++)
            left += out[i];
        CHECK(left < FB / 20, "router %d: %zu of %d removed keys present", r, left, FB);
        check_all(out + FB, FB, "kept key of the counting filter");
    }
}

/* Kill node i (SIGKILL) and start it again on its gRPC port and data;
 * returns its new frame port, which differs from old (should the kernel
 * hand out the old port again, the node is restarted once more: the point
 * is a port the router does not know yet). */
static int frames_restart(struct cluster *c, int i, int old)
{
    int port = old;
    for (int tries = 0; port == old && tries < 3; tries++) {
        cluster_node_restart(c, i, SIGKILL, NULL);
        port = t_frame_port(c->node[i].ch);
    }
    CHECK(port > 0 && port != old, "restarted node: frame port %d (was %d)", port, old);
    return port;
}

/* Node 1 restarts on another frame port.  The router's first call finds the
 * old port closed, goes over gRPC, and learns the new port ~200 ms later.
 * At most the first two batches may fail (UNAVAILABLE, while the node's
 * gRPC connection comes back); once one succeeds every later one must.
 * Returns how many keys "after-N" were added; the first connections router 0
 * opened to the new port go to ids[0, *nids). */
static size_t frames_node_moves(struct cluster *c, const int *fport, int newport,
                                unsigned long *ids, int *nids)
{
    struct rpc_channel *a = c->router[0].ch;
    pid_t r0 = c->router[0].pid;
    struct rpc_status st;
    bool in[FB];
    size_t ok = 0, fails = 0;
    double t0 = harness_now_s();
    *nids = 0;
    while ((ok < 10 || *nids == 0) && harness_now_s() - t0 < 5) {
        char **k = keys_make("after", ok * FB, FB);
        int code = t_keys(a, "Add", "fr", k, FB, in, &st);
        keys_free(k, FB);
        if (*nids == 0)
            *nids = proc_tcp_conns(r0, newport, ids, MAX_IDS);
        if (code == 0) {
            ok++;
            harness_sleep_ms(20);
            continue;
        }
        CHECK(code == GRPC_STATUS_UNAVAILABLE && ok == 0 && ++fails <= 2,
              "batch %zu after the restart (%zu failed before): %s: %s", ok, fails,
              rpc_status_name(code), st.message);
        harness_sleep_ms(200);
    }
    printf("after the restart: %zu batches in %.2fs, %zu failed first; frame port "
           "%d -> %d\n", ok, harness_now_s() - t0, fails, fport[1], newport);
    CHECK(ok >= 10, "%zu batches succeeded in 5 s after the restart", ok);
    CHECK(*nids > 0 && proc_tcp_conns(r0, newport, NULL, 0) > 0 &&
          proc_tcp_conns(r0, fport[1], NULL, 0) == 0,
          "router 0's connections to node 1: %d to the new port, %d to the old",
          proc_tcp_conns(r0, newport, NULL, 0), proc_tcp_conns(r0, fport[1], NULL, 0));
    /* The node serves the new port only. */
    check_frame_ports(c, 1, newport);
    return ok * FB;
}

/* A fixed frame_port is the one node 0 serves and reports, and router 0
 * follows it there. */
static void frames_fixed_port(struct cluster *c, size_t n, bool *in)
{
    pid_t r0 = c->router[0].pid;
    int fixed = harness_free_port();
    char fixed_s[16];
    snprintf(fixed_s, sizeof fixed_s, "%d", fixed);
    const char *const fixed_args[] = {"--frame-port", fixed_s, NULL};
    cluster_node_restart(c, 0, SIGTERM, fixed_args);
    CHECK(t_frame_port(c->node[0].ch) == fixed, "node 0 reports frame port %d, not %d",
          t_frame_port(c->node[0].ch), fixed);
    check_frame_ports(c, 0, fixed);
    double t0 = harness_now_s();
    bool learned = false;
    while (!learned && harness_now_s() - t0 < 5) {
        key_batches(c->router[0].ch, "MayContain", "fr", "present", 0, n, in);
        learned = proc_tcp_conns(r0, fixed, NULL, 0) > 0;
        if (!learned)
            harness_sleep_ms(100);
    }
    check_all(in, n, "router 0 with node 0 on a fixed frame port");
    CHECK(learned, "router 0 holds no connection to node 0's fixed frame port %d", fixed);
}

static void test_frames(void)
{
    struct cluster c;
    struct rpc_status st;
    const size_t N = 20000;
    const double P = 0.01;
    int fport[3];
    bool *in = malloc(N * sizeof *in), *abs_a = malloc(N * sizeof *abs_a);
    bool *abs_b = malloc(N * sizeof *abs_b);

    frames_cluster_start(&c, fport);
    struct rpc_channel *a = c.router[0].ch, *b = c.router[1].ch;
    pid_t r0 = c.router[0].pid;
    CHECK(t_create_sharded(a, "fr", N, P, 0, 32, NULL, &st) == 0, "create: %s", st.message);
    for (int i = 0; i < 3; i++)
        CHECK(t_shard_count(c.node[i].ch, "fr") > 0, "node %d holds no shard", i);

    /* Mixed cluster: every batch spans frame and gRPC nodes. */
    double t0 = harness_now_s();
    key_batches(a, "Add", "fr", "present", 0, N, in);
    key_batches(a, "MayContain", "fr", "present", 0, N, in);
    check_all(in, N, "router 0");
    key_batches(a, "MayContain", "fr", "absent", 0, N, abs_a);
    size_t fp = 0;
    for (size_t i = 0; i < N; i++)
        fp += abs_a[i];
    printf("mixed cluster: %zu keys in, out and absent in %.2fs; FPR %.4f\n", N,
           harness_now_s() - t0, (double)fp / N);
    CHECK((double)fp / N < 2 * P, "FPR %.4f at p %.2f", (double)fp / N, P);

    /* Router 0's pooled connections: open to both frame ports (node 2 serves
     * none: its keys went over gRPC). */
    unsigned long ids0[MAX_IDS];
    int n0 = proc_tcp_conns(r0, fport[0], ids0, MAX_IDS);
    CHECK(n0 > 0, "router 0 holds no connection to node 0's frame port");
    CHECK(proc_tcp_conns(r0, fport[1], NULL, 0) > 0,
          "router 0 holds no connection to node 1's frame port");

    /* A router with --frames off: the same answers, all over gRPC. */
    key_batches(b, "MayContain", "fr", "present", 0, N, in);
    check_all(in, N, "router 1");
    key_batches(b, "MayContain", "fr", "absent", 0, N, abs_b);
    CHECK(memcmp(abs_a, abs_b, N * sizeof *abs_a) == 0,
          "the routers answer absent keys differently");
    frames_remove(&c);
    for (int i = 0; i < 2; i++)
        CHECK(proc_tcp_conns(c.router[1].pid, fport[i], NULL, 0) == 0,
              "router with --frames off connected to node %d's frame port", i);

    /* Node 1 moves to a new frame port; router 0's connections to node 0's
     * frame port stay open meanwhile (its port was not dropped). */
    int newport = frames_restart(&c, 1, fport[1]);
    unsigned long ids1[MAX_IDS];
    int n1;
    size_t after = frames_node_moves(&c, fport, newport, ids1, &n1);
    CHECK(conns_kept(r0, ids0, n0), "router 0 dropped node 0's frame port when node 1 "
          "restarted");

    /* Nothing acknowledged was lost, through either transport. */
    key_batches(a, "MayContain", "fr", "present", 0, N, in);
    check_all(in, N, "router 0 after the restart");
    key_batches(b, "MayContain", "fr", "present", 0, N, in);
    check_all(in, N, "router 1 after the restart");
    bool *more = malloc(after * sizeof *more);
    key_batches(b, "MayContain", "fr", "after", 0, after, more);
    check_all(more, after, "batch added after the restart");
    /* The new port never failed once used: router 0 still holds the first
     * connections it opened to it (a failure closes them). */
    CHECK(conns_kept(r0, ids1, n1), "router 0 gave up node 1's new frame port %d",
          newport);

    frames_fixed_port(&c, N, in);
    free(more);
    free(in);
    free(abs_a);
    free(abs_b);
    cluster_stop(&c);
}

int main(int argc, char **argv)
{
    return cluster_test_main(argc, argv, test_frames);
}
