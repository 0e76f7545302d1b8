#!/usr/bin/env python3
"""The router's Redis door in front of a group of three copies (W = 2,
R = 2), through two routers, with redis-py and redis-benchmark.

usage: test_resp_router.py NODE_BIN ROUTER_BIN PART

  kill    RedisBloom's replies that a group of copies changes (the scaling
          form refused naming NONSCALING, BF.EXISTS of a missing filter an
          error, an add creating a non-scaling filter); then writers through
          both routers; a copy killed mid-run, then a
          second one, then both back: no BF.EXISTS/BF.MEXISTS ever answers
          0 for a key whose BF.ADD was acknowledged, pipelined BF.ADD k then
          BF.EXISTS k on one connection never reads 0, below the quorums
          every BF.ADD/BF.MEXISTS is a whole -UNAVAILABLE error (never an
          array holding 0), and every acknowledged key reads 1 at the end
          through both routers
  create  two routers x 50 connections sending BF.ADD to filters that do
          not exist yet while one copy fails CreateShard at random
          (BLOOMGRID_TEST_FAIL_CREATE_SHARD): every acknowledged key reads 1
          afterwards through both routers, every failure is a clear error
  bench   with resp_autocreate = off, BF.ADD of a missing filter is an
          error; then redis-benchmark (50 connections one command each, one
          connection 32 pipelined) with BF.ADD and BF.EXISTS on the door of
          a router: no error reply, and the router counted every command
  shards  BF.RESERVE and BF.INSERT with SHARDS n make filters of n shards
          (the CLI's info), the router's default_shards without it when
          default_shard_mb is 0; a bad count is an error that creates
          nothing; over 3 groups with default_shard_mb 1, a non-scaling
          filter made without a count gets a shard per MiB of its bits, at
          least 3 and at most default_shards, a scaling one default_shards
  oldnode  a node that reads no runs (as a node of an earlier release): the
          router's entries of many shards are sent again one per shard, no
          command sees an error, every key reads 1, one warning; a node
          that reads them: no fallback
  budget  the keys a command holds count against the router's max_memory_mb:
          with the node stopped, adds past it are answered OOM naming it,
          and every charge is given back once the calls end
  pipeline  2000 pipelined BF.EXISTS on one connection: every reply in its
          place and equal to the key's answer alone, and joined (far fewer
          read calls to the nodes than commands); 4 connections pipelining
          BF.ADD k, BF.EXISTS k, BF.MEXISTS on two filters: every added key
          reads 1, every reply in its place
  readjoin  one connection pipelining BF.EXISTS (rounds of 32) through a
          router in front of one node: every read message but a stream's
          first goes joined with the receive of its answer (the router's
          bloomgrid_router_node_messages_total), every reply right and in its
          place; reads queued behind a message the node holds (SIGSTOP) go
          apart; the node killed and restarted under the pipelined reader:
          the commands of the message in flight are answered with an error
          (never a 0 for a key added), the reads go on on a new stream
          once it is back, every reply in its place
  inplace  the replies of calls the node answered are written by the
          thread that took the answer (bloomgrid_resp_answers_total
          where="in_place"), not handed to the loop: a lone pipelined
          connection, rounds of BF.ADD and rounds of BF.EXISTS in turn, every
          reply right and in its place (and BF.EXISTS k right behind BF.ADD k,
          which waits for it, answers 1); a client that sends 24 MiB of BF.MEXISTS before
          reading any reply (its socket full, the connection paused over
          pipeline_bytes: the loop writes the rest), every reply in its
          place; 50 connections at once, each reading its own adds; a
          router stopped under a pipelined client exits cleanly
  slow    with resp_slow_timeout_ms = 300 and the node stopped, pipelined
          adds and BF.INFO of an unchecked filter are answered -UNAVAILABLE
          naming the bound (the add: nothing written), the PING after them
          answers, and nothing of the bounded adds was written
"""
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import redis

import resplib
import routerlib

NODE, ROUTER, PART = sys.argv[1], sys.argv[2], sys.argv[3]
CLI = os.environ.get("BLOOMGRID_CLI") or os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(ROUTER))), "cli", "bloomgrid")
work = resplib.workdir("resp-router-%s-" % PART)


def metrics_addr(server):
    """The metrics endpoint a router printed it listens on."""
    return re.search(r" metrics on (\S+)", open(server.out.name).read()).group(1)


def metered_cluster(copies, *flags):
    """One group of `copies` and one router that serves metrics (and takes
    flags): the cluster, the router, its metrics address and a client."""
    cl = routerlib.Cluster(NODE, ROUTER, work, groups=1, copies=copies, routers=1,
                           router_flags=["--metrics-listen", "127.0.0.1:0", *flags])
    try:
        s = cl.routers[0]
        return cl, s, metrics_addr(s), cl.client(0)
    except BaseException:
        cl.stop()
        raise


def run_threads(fn, n):
    """fn(0) .. fn(n - 1), each on its own thread, all at once; until all end."""
    ths = [threading.Thread(target=fn, args=(t,)) for t in range(n)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()


def check(cond, msg):
    if not cond:
        resplib.fail(msg)


class Run:
    """What the threads of a run share."""

    def __init__(self):
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.acked = []            # keys whose BF.ADD was acknowledged
        self.violations = []       # a 0 for an acknowledged key
        self.errors = {}           # error text prefix -> count
        self.reads = 0

    def ack(self, keys):
        with self.lock:
            self.acked.extend(keys)

    def error(self, e):
        word = str(e).split(" ", 1)[0]
        with self.lock:
            self.errors[word] = self.errors.get(word, 0) + 1

    def violation(self, text):
        with self.lock:
            self.violations.append(text)


def writer(run, c, tag):
    i = 0
    while not run.stop.is_set():
        keys = ["%s-%d-%d" % (tag, i, j) for j in range(5)]
        i += 1
        try:
            if i % 2:
                r = c.execute_command("BF.ADD", "f", keys[0])
                if r not in (0, 1):
                    run.violation("BF.ADD answered %r" % r)
                run.ack(keys[:1])
            else:
                r = c.execute_command("BF.MADD", "f", *keys)
                if len(r) != 5 or any(x not in (0, 1) for x in r):
                    run.violation("BF.MADD answered %r" % r)
                run.ack(keys)
        except redis.ResponseError as e:
            run.error(e)
            time.sleep(0.01)


def reader(run, c, tag):
    rnd = random.Random(tag)
    while not run.stop.is_set():
        with run.lock:
            n = len(run.acked)
            keys = [run.acked[rnd.randrange(n)] for _ in range(20)] if n else []
        if not keys:
            time.sleep(0.01)
            continue
        try:
            if rnd.random() < 0.5:
                r = [c.execute_command("BF.EXISTS", "f", keys[0])]
                keys = keys[:1]
            else:
                r = c.execute_command("BF.MEXISTS", "f", *keys)
            with run.lock:
                run.reads += len(keys)
            for k, v in zip(keys, r):
                if v != 1:
                    run.violation("%s read %r for acknowledged %s" % (tag, v, k))
        except redis.ResponseError as e:
            run.error(e)
            time.sleep(0.01)


def pipeliner(run, c, tag):
    """BF.ADD k then BF.EXISTS k, ten pairs a round trip on one connection."""
    i = 0
    while not run.stop.is_set():
        p = c.pipeline(transaction=False)
        keys = ["%s-%d-%d" % (tag, i, j) for j in range(10)]
        i += 1
        for k in keys:
            p.execute_command("BF.ADD", "f", k)
            p.execute_command("BF.EXISTS", "f", k)
        r = p.execute(raise_on_error=False)
        for j, k in enumerate(keys):
            add, ex = r[2 * j], r[2 * j + 1]
            if isinstance(add, Exception):
                run.error(add)
                continue
            run.ack([k])
            if isinstance(ex, Exception):
                run.error(ex)
            elif ex != 1:
                run.violation("%s: pipelined BF.ADD %s answered %r, then BF.EXISTS "
                              "%r" % (tag, k, add, ex))


def expect_unavailable(c, *cmd):
    try:
        r = c.execute_command(*cmd)
    except redis.ResponseError as e:
        check(str(e).startswith("UNAVAILABLE"), "%s: %s" % (cmd[0], e))
        return str(e)
    resplib.fail("%s below the quorum answered %r, not -UNAVAILABLE" % (cmd[0], r))


def until_ok(fn, what, timeout=60):
    deadline = time.time() + timeout
    while True:
        try:
            return fn()
        except redis.ResponseError as e:
            if time.time() > deadline:
                resplib.fail("%s: still %s" % (what, e))
            time.sleep(0.2)


def expect_error(c, text, *cmd):
    try:
        r = c.execute_command(*cmd)
    except redis.ResponseError as e:
        check(text in str(e), "%s: error %r does not say %r" % (cmd[0], str(e), text))
        return
    resplib.fail("%s answered %r, not an error saying %r" % (cmd[0], r, text))


def shapes(c):
    """What a group of N > 1 changes in RedisBloom's replies."""
    expect_error(c, "NONSCALING", "BF.RESERVE", "s", 0.01, 1000)
    expect_error(c, "NONSCALING", "BF.RESERVE", "s", 0.01, 1000, "EXPANSION", 4)
    expect_error(c, "NONSCALING", "BF.INSERT", "s", "EXPANSION", 2, "ITEMS", "a")
    expect_error(c, "does not exist", "BF.EXISTS", "s", "a")
    expect_error(c, "does not exist", "BF.MEXISTS", "s", "a", "b")
    expect_error(c, "does not exist", "BF.INSERT", "s", "NOCREATE", "ITEMS", "a")
    check(c.execute_command("BF.CARD", "s") == 0, "BF.CARD of a missing filter")
    # An add creates a non-scaling filter with resp_autocreate_capacity.
    check(c.execute_command("BF.ADD", "made", "a") == 1, "BF.ADD creating")
    info = c.execute_command("BF.INFO", "made")
    check(info[0] == b"Capacity" and info[1] >= 100000 and info[9] is None,
          "BF.INFO of a filter made by BF.ADD: %r" % info)
    check(c.execute_command("BF.MEXISTS", "made", "a", "zz") == [1, 0], "BF.MEXISTS")
    check(c.execute_command("DEL", "made", "s") == 1, "DEL")
    expect_error(c, "does not exist", "BF.EXISTS", "made", "a")


def part_kill():
    cl = routerlib.Cluster(NODE, ROUTER, work, groups=1, copies=3, routers=2,
                           router_flags=["--default-shards", "8", "--default-shard-mb", "0",
                                         "--resp-autocreate-capacity", "100000"])
    try:
        c0 = cl.client(0)
        shapes(c0)
        c0.execute_command("BF.RESERVE", "f", 0.001, 500000, "NONSCALING")
        run = Run()
        threads = []
        for r in range(2):
            for t in range(2):
                threads.append(threading.Thread(target=writer, args=(
                    run, cl.client(r), "w%d%d" % (r, t))))
            # Readers check keys written through either router.
            threads.append(threading.Thread(target=reader, args=(
                run, cl.client(r), "r%d" % r)))
            threads.append(threading.Thread(target=pipeliner, args=(
                run, cl.client(r), "p%d" % r)))
        for t in threads:
            t.start()
        try:
            time.sleep(2)
            before = len(run.acked)
            cl.kill_node(1)
            print("copy 1 killed after %d acknowledged keys" % before)
            time.sleep(3)
            check(len(run.acked) > before, "no write acknowledged with one copy "
                  "down of three (W = 2)")
            # Two of three down: below W = 2 and R = 2.
            cl.kill_node(2)
            with run.lock:
                some = run.acked[:50]
            msg = expect_unavailable(c0, "BF.MEXISTS", "f", *some)
            print("two copies down: BF.MEXISTS -> %s" % msg)
            expect_unavailable(cl.client(1), "BF.EXISTS", "f", some[0])
            expect_unavailable(c0, "BF.ADD", "f", "below-quorum")
            expect_unavailable(cl.client(1), "BF.MADD", "f", "below-1", "below-2")
            time.sleep(1)
            cl.start_node(1)
            cl.start_node(2)
            print("copies 1 and 2 restarted")
            # Reads and writes resume once the copies vouch for each other.
            until_ok(lambda: c0.execute_command("BF.ADD", "f", "after-restart"),
                     "BF.ADD after the restart")
            time.sleep(2)
        finally:
            run.stop.set()
            for t in threads:
                t.join()
        acked = run.acked
        print("%d keys acknowledged, %d keys read, errors %s" % (
            len(acked), run.reads, run.errors))
        check(not run.violations, "%d reads of 0 for acknowledged keys: %s" % (
            len(run.violations), run.violations[:5]))
        check(run.reads > 0, "no read answered")
        for r in range(2):
            c = cl.client(r)
            got = until_ok(lambda: routerlib.mexists_all(c, "f", acked),
                           "final read through router %d" % r)
            missing = [k for k, v in zip(acked, got) if v != 1]
            check(not missing, "router %d: %d acknowledged keys read 0: %s" % (
                r, len(missing), missing[:5]))
        print("every acknowledged key reads 1 through both routers")
    finally:
        cl.stop()


def part_create():
    # Copy 2 fails 25% of its CreateShard calls; filters of 4 shards, so
    # about two thirds of the creations fail on it and are rolled back,
    # and that none of the 8 filters' first creations does is 0.32^8, about
    # 1 in 10 000 (with 4 filters at 15 %, 0.52^4: 1 run in 14).
    cl = routerlib.Cluster(NODE, ROUTER, work, groups=1, copies=3, routers=2,
                           node_env={2: {"BLOOMGRID_TEST_FAIL_CREATE_SHARD": "25"}},
                           router_flags=["--default-shards", "4", "--default-shard-mb", "0",
                                         "--resp-autocreate-capacity", "100000"])
    try:
        filters = ["auto%d" % i for i in range(8)]
        acked = {f: [] for f in filters}
        errors = []
        lock = threading.Lock()
        go = threading.Barrier(100)

        def conn(r, t):
            c = cl.client(r)
            c.ping()
            go.wait()
            for f in filters:
                for j in range(3):
                    k = "r%d-c%d-%d" % (r, t, j)
                    try:
                        v = c.execute_command("BF.ADD", f, k)
                        with lock:
                            if v in (0, 1):
                                acked[f].append(k)
                            else:
                                errors.append("bad reply %r" % v)
                    except redis.ResponseError as e:
                        with lock:
                            errors.append(str(e))
            c.close()

        threads = [threading.Thread(target=conn, args=(r, t))
                   for r in range(2) for t in range(50)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        total = sum(len(v) for v in acked.values())
        print("%d adds acknowledged, %d failed" % (total, len(errors)))
        for e in sorted(set(errors))[:10]:
            print("  error: %s" % e)
        check(total > 0, "no BF.ADD acknowledged")
        # A creation that cannot complete in time says so and wrote nothing.
        for e in errors:
            check(e.startswith("UNAVAILABLE ") and "filter" in e,
                  "BF.ADD of a filter being created: %s" % e)
        injected = sum(resplib_count(cl.router_log(r), "on purpose") for r in range(2))
        print("creations that met the injected failure: %d" % injected)
        check(injected > 0, "no creation met the injected CreateShard failure")
        for r in range(2):
            c = cl.client(r)
            for f, keys in acked.items():
                if not keys:
                    continue
                got = until_ok(lambda: routerlib.mexists_all(c, f, keys),
                               "read of %s through router %d" % (f, r))
                missing = [k for k, v in zip(keys, got) if v != 1]
                check(not missing, "router %d, filter %s: %d acknowledged keys "
                      "read 0: %s" % (r, f, len(missing), missing[:5]))
                info = c.execute_command("BF.INFO", f)
                check(b"Capacity" in info, "BF.INFO %s: %r" % (f, info))
        print("every acknowledged key reads 1 through both routers")
    finally:
        cl.stop()


def resplib_count(text, needle):
    return text.count(needle)


def scrape(maddr):
    return urllib.request.urlopen("http://%s/metrics" % maddr, timeout=10).read().decode()


def metric(text, kind, cmd):
    m = re.search(r'^bloomgrid_resp_%s_total\{command="%s"\} (\S+)$' % (kind, cmd),
                  text, re.M)
    return float(m.group(1)) if m else 0.0


def part_bench():
    cl, s, maddr, c = metered_cluster(3, "--resp-autocreate", "off",
                                      "--default-shards", "8", "--default-shard-mb", "0")
    try:
        expect_error(c, "does not exist", "BF.ADD", "bench", "a")
        expect_error(c, "does not exist", "BF.MADD", "bench", "a", "b")
        c.execute_command("BF.RESERVE", "bench", 0.01, 1000000, "NONSCALING")
        before = scrape(maddr)
        runs = [("-c", "50", "BF.ADD"), ("-c", "50", "BF.EXISTS"),
                ("-c", "1", "-P", "32", "BF.ADD"), ("-c", "1", "-P", "32", "BF.EXISTS")]
        n = 3000
        for run in runs:
            args = ["redis-benchmark", "-h", s.host, "-p", str(s.port), "-n", str(n),
                    "-r", "1000000", "-q"] + list(run[:-1]) + [
                        run[-1], "bench", "key:__rand_int__"]
            r = subprocess.run(args, capture_output=True, text=True, timeout=120)
            out = r.stdout + r.stderr
            print("%s: %s" % (" ".join(run), out.strip().splitlines()[-1:]))
            check(r.returncode == 0, "redis-benchmark exited %d: %s" % (
                r.returncode, out))
            check("rror" not in out, "redis-benchmark met an error: %s" % out)
            check("requests per second" in out, "redis-benchmark did not finish: %s" % out)
        card = c.execute_command("BF.CARD", "bench")
        check(0 < card <= 2 * n + 82, "BF.CARD after %d random adds: %r" % (2 * n, card))
        after = scrape(maddr)
        for cmd in ("bf.add", "bf.exists"):
            calls = metric(after, "commands", cmd) - metric(before, "commands", cmd)
            errs = metric(after, "errors", cmd) - metric(before, "errors", cmd)
            print("%s: %d commands counted, %d errors" % (cmd, calls, errs))
            # redis-benchmark may send up to a command per client (50) or a
            # pipeline (32) more than -n in each of its runs.
            check(2 * n <= calls <= 2 * n + 50 + 32, "%s: %d commands counted, "
                  "want %d to %d" % (cmd, calls, 2 * n, 2 * n + 82))
            check(errs == 0, "%s: %d errors counted" % (cmd, errs))
        print("redis-benchmark: every command answered, no error")
    finally:
        cl.stop()


def shards_of(s, name):
    """The shard count of filter name, as the CLI reads it through router s."""
    r = subprocess.run([CLI, "--server", s.addr, "info", name], capture_output=True,
                       text=True, timeout=60)
    check(r.returncode == 0, "bloomgrid info %s: %s" % (name, r.stdout + r.stderr))
    return int(re.search(r"^shards: *(\d+)$", r.stdout, re.M).group(1))


def part_shards():
    """SHARDS n of BF.RESERVE and BF.INSERT makes a filter of n shards, the
    router's default_shards (8 here) without it when default_shard_mb is 0;
    a bad count is an error that creates nothing.  Then the count a filter
    made without one gets from its size."""
    cl, s, _, c = metered_cluster(3, "--default-shards", "8", "--default-shard-mb", "0")
    try:
        shards_given(s, c)
    finally:
        cl.stop()
    shards_sized()


def part_oldnode():
    """A node that reads no runs (BLOOMGRID_TEST_NO_RUNS, as a node of an
    earlier release): the router's first entry of many shards is refused
    there before anything is applied, sent again one entry per shard, and
    every later one goes so; no command sees an error, every key reads 1."""
    cl = routerlib.Cluster(NODE, ROUTER, work, groups=1, copies=1, routers=1,
                           node_env={0: {"BLOOMGRID_TEST_NO_RUNS": "1"}})
    try:
        c = cl.client(0)
        c.execute_command("BF.RESERVE", "f", 0.01, 100000, "NONSCALING", "SHARDS", 8)
        keys = ["k%d" % i for i in range(200)]
        for i in range(0, 200, 50):
            r = c.execute_command("BF.MADD", "f", *keys[i:i + 50])
            check(len(r) == 50 and all(v in (0, 1) for v in r), "BF.MADD: %r" % r[:5])
        check(c.execute_command("BF.MEXISTS", "f", *keys) == [1] * 200,
              "a key added through the fallback reads 0")
        warned = resplib_count(cl.router_log(0), "earlier release")
        check(warned == 1, "the router said %d times that the node takes no runs" % warned)
        print("a node without runs: the first entry of runs sent again per shard, "
              "200 keys added and read, one warning")
    finally:
        cl.stop()
    # A node that reads runs: the router never falls back.
    d = os.path.join(work, "runs")
    os.makedirs(d, exist_ok=True)
    cl = routerlib.Cluster(NODE, ROUTER, d, groups=1, copies=1, routers=1)
    try:
        c = cl.client(0)
        c.execute_command("BF.RESERVE", "f", 0.01, 100000, "NONSCALING", "SHARDS", 8)
        check(c.execute_command("BF.MADD", "f", *keys) == [1] * 200, "BF.MADD, runs")
        check(c.execute_command("BF.MEXISTS", "f", *keys) == [1] * 200, "BF.MEXISTS, runs")
        check(resplib_count(cl.router_log(0), "earlier release") == 0,
              "the router fell back from runs on a node that reads them")
    finally:
        cl.stop()


def file_bytes(capacity):
    """The bytes of bits of a filter of capacity keys at 1 %, as the CLI
    makes it offline."""
    path = os.path.join(work, "sized-%d.bf" % capacity)
    r = subprocess.run([CLI, "create", "--capacity", str(capacity), "--error-rate",
                        "0.01", path], capture_output=True, text=True, timeout=60)
    check(r.returncode == 0, "bloomgrid create: %s" % (r.stdout + r.stderr))
    r = subprocess.run([CLI, "inspect", path], capture_output=True, text=True,
                       timeout=60)
    return int(re.search(r"^bytes: *(\d+)", r.stdout, re.M).group(1))


def shards_sized():
    """Three groups, default_shard_mb 1, default_shards 8: a filter made
    without a count gets one shard per MiB of its bits, at least one per
    group (3) and at most 8; a scaling filter gets 8."""
    d = os.path.join(work, "sized")
    os.makedirs(d, exist_ok=True)
    cl = routerlib.Cluster(NODE, ROUTER, d, groups=3, copies=1, routers=1,
                           router_flags=["--default-shards", "8",
                                         "--default-shard-mb", "1"])
    try:
        s, c = cl.routers[0], cl.client(0)
        mib = 1 << 20
        for name, cap in (("small", 10000), ("middle", 4000000), ("large", 20000000)):
            c.execute_command("BF.RESERVE", name, 0.01, cap, "NONSCALING")
            b = file_bytes(cap)
            want = min(8, max(3, -(-b // mib)))
            have = shards_of(s, name)
            check(have == want, "filter %s (%d keys, %d bytes of bits) has %d shards, "
                  "want %d" % (name, cap, b, have, want))
            print("%s: %d keys, %.2f MiB of bits: %d shards" % (name, cap, b / mib, have))
        check(shards_of(s, "middle") not in (3, 8), "middle is at a bound")
        # Its first add creates the filter too, sized the same way.
        check(c.execute_command("BF.INSERT", "made", "CAPACITY", 4000000, "NONSCALING",
                                "ITEMS", "x") == [1], "BF.INSERT creating made")
        check(shards_of(s, "made") == shards_of(s, "middle"),
              "made has %d shards, middle %d" % (shards_of(s, "made"),
                                                  shards_of(s, "middle")))
        c.execute_command("BF.RESERVE", "scaling", 0.01, 10000)
        check(shards_of(s, "scaling") == 8,
              "the scaling filter has %d shards, want 8" % shards_of(s, "scaling"))
        check(c.execute_command("BF.EXISTS", "made", "x") == 1, "made reads x")
        print("default_shard_mb: 3 for a small filter, one per MiB, at most 8; "
              "a scaling filter 8")
    finally:
        cl.stop()


def shards_given(s, c):
    c.execute_command("BF.RESERVE", "three", 0.01, 10000, "NONSCALING", "SHARDS", 3)
    c.execute_command("BF.RESERVE", "eight", 0.01, 10000, "NONSCALING")
    check(c.execute_command("BF.INSERT", "five", "SHARDS", 5, "NONSCALING", "ITEMS",
                            "x", "y") == [1, 1], "BF.INSERT creating five")
    check(c.execute_command("BF.INSERT", "five", "SHARDS", 2, "ITEMS", "z") == [1],
          "BF.INSERT into five, made")
    for name, want in (("three", 3), ("five", 5), ("eight", 8)):
        have = shards_of(s, name)
        check(have == want, "filter %s has %d shards, want %d" % (name, have, want))
    check(c.execute_command("BF.MEXISTS", "five", "x", "y", "z") == [1, 1, 1],
          "five reads its keys")
    expect_error(c, "bad shard count", "BF.RESERVE", "bad", 0.01, 100, "NONSCALING",
                 "SHARDS", 4097)
    expect_error(c, "bad shard count", "BF.INSERT", "bad", "SHARDS", 0, "ITEMS", "a")
    expect_error(c, "does not exist", "BF.EXISTS", "bad", "a")
    print("SHARDS: filters of 3 and 5 shards, 8 without it, bad counts refused")


def part_budget():
    """Keys in flight count against the router's max_memory_mb."""
    cl, s, maddr, c = metered_cluster(1, "--max-memory-mb", "16",
                                      "--max-message-size", "4194304",
                                      "--resp-pipeline-bytes", "67108864")
    try:
        c.execute_command("BF.RESERVE", "big", 0.01, 100000, "NONSCALING")
        # The node stopped: no add ends, so each holds its charge.
        cl.nodes[0].send_signal(signal.SIGSTOP)
        try:
            p = c.pipeline(transaction=False)
            for i in range(8):   # 8 x 3 MB of keys, past the 16 MiB
                p.execute_command("BF.MADD", "big", *[
                    ("%d-%d-" % (i, j)).encode() + b"x" * 1000 for j in range(3000)])
            r = p.execute(raise_on_error=False)
        finally:
            cl.nodes[0].send_signal(signal.SIGCONT)
        oom = [str(e) for e in r if isinstance(e, Exception) and str(e).startswith("OOM")]
        print("8 adds of 3 MB with the node stopped: %d refused: %s" % (
            len(oom), oom[:1]))
        check(oom and all("max_memory_mb" in e for e in oom),
              "no add refused past max_memory_mb: %r" % [str(x)[:80] for x in r])
        # Every charge given back: the budget is free again.
        until_ok(lambda: c.execute_command("BF.MADD", "big", "a", "b"), "BF.MADD after")
        deadline = time.time() + 10
        while True:
            used = metric_value(scrape(maddr), "bloomgrid_router_memory_charged_bytes")
            if used == 0 or time.time() > deadline:
                break
            time.sleep(0.1)
        check(used == 0, "%s bytes still charged once every call ended" % used)
        print("every charge given back")
    finally:
        cl.stop()


def node_calls(text, lane):
    """bloomgrid_router_node_calls_total of a lane, summed over the nodes."""
    return sum(float(v) for v in re.findall(
        r'^bloomgrid_router_node_calls_total\{[^}]*lane="%s"[^}]*\} (\S+)$' % lane,
        text, re.M))


def part_pipeline():
    """Pipelined reads on one connection travel together, in order."""
    cl, s, maddr, c = metered_cluster(3, "--default-shards", "4", "--default-shard-mb", "0")
    try:
        for f in ("pa", "pb"):
            def reserve():
                try:
                    c.execute_command("BF.RESERVE", f, 0.001, 100000, "NONSCALING")
                except redis.ResponseError as e:
                    if "exists" not in str(e):
                        raise
            until_ok(reserve, "BF.RESERVE " + f)
        present = ["k%d" % i for i in range(1000)]
        for i in range(0, len(present), 250):
            c.execute_command("BF.MADD", "pa", *present[i:i + 250])
        c.execute_command("BF.MADD", "pb", *["b" + k for k in present])
        absent = ["z%d" % i for i in range(1000)]
        # What each key reads alone (absent keys may be false positives).
        truth = dict(zip(present + absent, [1] * 1000 + list(
            c.execute_command("BF.MEXISTS", "pa", *absent))))
        order = [present[i // 2] if i % 2 == 0 else absent[i // 2] for i in range(2000)]
        before = node_calls(scrape(maddr), "read")
        p = c.pipeline(transaction=False)
        for k in order:
            p.execute_command("BF.EXISTS", "pa", k)
        r = p.execute()
        after = node_calls(scrape(maddr), "read")
        bad = [(i, k, r[i]) for i, k in enumerate(order) if r[i] != truth[k]]
        check(not bad, "pipelined BF.EXISTS out of order or wrong: %r" % bad[:5])
        print("2000 pipelined BF.EXISTS: in order; %d read calls to the nodes" % (
            after - before))
        # Each read asks R = 2 copies: one call per command would be 4000.
        check(after - before <= 1000,
              "pipelined reads were not joined: %d node calls for 2000 commands" % (
                  after - before))
        # Two filters, adds then reads of the same keys, several connections
        # at once: every read of a key added earlier on its connection is 1,
        # every reply in its place.
        errors = []

        def worker(t):
            cc = cl.client(0)
            try:
                for rnd in range(3):
                    keys = ["w%d-%d-%d" % (t, rnd, i) for i in range(300)]
                    p = cc.pipeline(transaction=False)
                    for i, k in enumerate(keys):
                        f = "pa" if i % 2 else "pb"
                        p.execute_command("BF.ADD", f, k)
                        p.execute_command("BF.EXISTS", f, k)
                        p.execute_command("BF.MEXISTS", f, present[i], k)
                        p.execute_command("BF.EXISTS", "pa", present[i])
                    rr = p.execute()
                    for i, k in enumerate(keys):
                        got = rr[4 * i:4 * i + 4]
                        # pa holds present[i]; pb may answer it either way.
                        if got[1] != 1 or got[2][1] != 1 or got[3] != 1 or (
                                i % 2 and got[2][0] != 1):
                            errors.append((t, rnd, k, got))
            except Exception as e:   # noqa: BLE001 (reported below)
                errors.append((t, repr(e)))
            finally:
                cc.close()

        run_threads(worker, 4)
        check(not errors, "pipelined add-then-exists: %r" % errors[:5])
        print("4 connections x 3 x 300 pipelined add, exists, mexists: in order, "
              "every added key read 1")
    finally:
        cl.stop()


def part_slow():
    """The slow path is bounded: a command whose filter cannot be checked
    (its copies do not answer) is answered -UNAVAILABLE naming
    resp_slow_timeout_ms, and the connection's later commands go on."""
    cl = routerlib.Cluster(NODE, ROUTER, work, groups=1, copies=1, routers=1,
                           router_flags=["--resp-slow-timeout-ms", "300"])
    try:
        c = cl.client(0)
        # (A creation may outlast the short bound on a loaded machine: the
        # add is retried until the filter is there.)
        until_ok(lambda: c.execute_command("BF.ADD", "known", "x"), "BF.ADD known")
        # The node stopped: the first check of "fresh" cannot end before the
        # router's node_timeout_ms (3 s here); the bound answers first.
        cl.nodes[0].send_signal(signal.SIGSTOP)
        try:
            p = c.pipeline(transaction=False)
            p.execute_command("BF.ADD", "fresh", "a")
            p.execute_command("BF.ADD", "fresh", "b")
            p.execute_command("BF.INFO", "fresh")
            p.execute_command("PING")
            r = p.execute(raise_on_error=False)
        finally:
            cl.nodes[0].send_signal(signal.SIGCONT)
        print("with the node stopped: %r" % [str(x)[:100] for x in r])
        for i in range(3):
            check(isinstance(r[i], Exception) and str(r[i]).startswith("UNAVAILABLE")
                  and "resp_slow_timeout_ms" in str(r[i]),
                  "command %d not answered by the bound: %r" % (i, r[i]))
        check("nothing of it was written" in str(r[0]), "add: %r" % r[0])
        check(r[3] is True or r[3] == b"PONG", "PING after: %r" % r[3])
        # Nothing of the bounded adds was written: the filter does not
        # exist (the stopped node never got a creation), or holds no key.
        until_ok(lambda: c.execute_command("BF.ADD", "known", "y"), "BF.ADD after")
        n = until_ok(lambda: c.execute_command("BF.CARD", "fresh"), "BF.CARD fresh")
        print("BF.CARD fresh after: %r" % n)
        check(n == 0, "a bounded add wrote: BF.CARD fresh = %r" % n)
        # The router still works for the same filter.
        until_ok(lambda: c.execute_command("BF.ADD", "fresh", "c"), "BF.ADD fresh")
        check(c.execute_command("BF.EXISTS", "fresh", "c") == 1, "exists after")
    finally:
        cl.stop()


def read_messages(text):
    """bloomgrid_router_node_messages_total of the read lane: (joined, apart)."""
    out = {"joined": 0.0, "apart": 0.0}
    for how, v in re.findall(r'^bloomgrid_router_node_messages_total\{[^}]*lane="read"'
                             r'[^}]*receive="(\w+)"[^}]*\} (\S+)$', text, re.M):
        out[how] += float(v)
    return out["joined"], out["apart"]


def part_readjoin():
    """A lone pipelined reader's messages are joined with their answer's
    receive; reads queued behind a message in flight are not; a node
    restart under a joined reader fails the commands in flight, and the
    reads go on on a new stream."""
    # node_timeout_ms: the stopped node's held message must not time out.
    cl, s, maddr, c = metered_cluster(1, "--default-shards", "4", "--default-shard-mb", "0",
                                      "--node-timeout-ms", "20000")
    try:
        c.execute_command("BF.RESERVE", "rj", 0.001, 100000, "NONSCALING")
        present = ["p%d" % i for i in range(2000)]
        for i in range(0, len(present), 500):
            c.execute_command("BF.MADD", "rj", *present[i:i + 500])
        absent = ["a%d" % i for i in range(2000)]
        truth = dict(zip(present + absent, [1] * 2000 + list(
            c.execute_command("BF.MEXISTS", "rj", *absent))))
        check(sum(truth[k] for k in absent) < 20, "too many false positives")

        def rnd(conn, r, n=32):
            """Round r: n pipelined BF.EXISTS, present and absent keys in
            turn; the keys and the replies (errors in place)."""
            keys = [present[(r * n + i) % 2000] if i % 2 == 0 else
                    absent[(r * n + i) % 2000] for i in range(n)]
            p = conn.pipeline(transaction=False)
            for k in keys:
                p.execute_command("BF.EXISTS", "rj", k)
            return keys, p.execute(raise_on_error=False)

        # A lone pipelined reader: nothing waits behind its message in
        # flight, so each message after the stream's first is joined.
        ROUNDS = 300
        j0, a0 = read_messages(scrape(maddr))
        for r in range(ROUNDS):
            keys, got = rnd(c, r)
            bad = [(k, g) for k, g in zip(keys, got) if g != truth[k]]
            check(not bad, "round %d: wrong or misplaced replies %r" % (r, bad[:4]))
        j1, a1 = read_messages(scrape(maddr))
        print("lone pipelined reader: %d rounds of 32, %d read messages joined, %d apart"
              % (ROUNDS, j1 - j0, a1 - a0))
        check(j1 - j0 + a1 - a0 >= ROUNDS, "fewer read messages than rounds")
        check(j1 - j0 >= 0.9 * ROUNDS and a1 - a0 <= 0.1 * ROUNDS,
              "a lone pipelined reader's messages were not joined: %d joined, %d apart"
              % (j1 - j0, a1 - a0))

        # Reads queued behind a message the node holds: the answer finds
        # them waiting, so the message that takes them goes apart (the
        # receive posted at once, as before).
        node = cl.nodes[0]
        others = [cl.client(0) for _ in range(4)]
        results = {}

        def one(i, conn):
            try:
                results[i] = rnd(conn, 1000 + i, 8)
            except Exception as e:   # noqa: BLE001 (reported below)
                results[i] = e

        def until(cond, what):
            deadline = time.time() + 10
            while not cond():
                check(time.time() < deadline, "waited 10 s for " + what)
                time.sleep(0.02)

        j0, a0 = read_messages(scrape(maddr))
        n0 = metric(scrape(maddr), "commands", "bf.exists")
        node.send_signal(signal.SIGSTOP)
        try:
            ths = [threading.Thread(target=one, args=(0, c))]
            ths[0].start()
            # Its message is sent, and held unanswered.
            until(lambda: sum(read_messages(scrape(maddr))) > j0 + a0,
                  "the first reader's message")
            for i, conn in enumerate(others):
                ths.append(threading.Thread(target=one, args=(i + 1, conn)))
                ths[-1].start()
            # Every command run (queued behind the held message).
            until(lambda: metric(scrape(maddr), "commands", "bf.exists") >= n0 + 40,
                  "the other readers' commands")
            time.sleep(0.2)
        finally:
            node.send_signal(signal.SIGCONT)
        for th in ths:
            th.join()
        for i, res in results.items():
            check(not isinstance(res, Exception), "reader %d: %r" % (i, res))
            keys, got = res
            bad = [(k, g) for k, g in zip(keys, got) if g != truth[k]]
            check(not bad, "queued reader %d: %r" % (i, bad[:4]))
        j1, a1 = read_messages(scrape(maddr))
        print("reads queued behind a held message: %d read messages joined, %d apart"
              % (j1 - j0, a1 - a0))
        check(a1 - a0 >= 1, "reads queued behind a message in flight went joined "
              "(%d joined, 0 apart)" % (j1 - j0))
        for conn in others:
            conn.close()

        # The node killed and restarted under the pipelined reader.
        stop = threading.Event()
        log = {"ok": 0, "errors": 0, "wrong": [], "after": 0, "exc": None}
        restarted = threading.Event()

        def reader():
            cc = cl.client(0)
            r = 0
            try:
                while not stop.is_set():
                    keys, got = rnd(cc, r)
                    r += 1
                    check_len = len(got) == len(keys)
                    if not check_len:
                        log["wrong"].append(("reply count", len(got)))
                    for k, g in zip(keys, got):
                        if isinstance(g, Exception):
                            log["errors"] += 1
                        elif g != truth[k]:
                            log["wrong"].append((r, k, g))
                        else:
                            log["ok"] += 1
                    if restarted.is_set() and all(
                            not isinstance(g, Exception) for g in got):
                        log["after"] += 1
            except Exception as e:   # noqa: BLE001 (reported below)
                log["exc"] = e
            finally:
                cc.close()

        th = threading.Thread(target=reader)
        th.start()
        time.sleep(1.0)
        cl.kill_node(0)
        time.sleep(0.5)
        cl.start_node(0)
        restarted.set()
        deadline = time.time() + 60
        while log["after"] < 50 and time.time() < deadline and th.is_alive():
            time.sleep(0.1)
        stop.set()
        th.join()
        print("node restarted under the pipelined reader: %d replies right, %d errors, "
              "%d rounds all answered after the restart" % (
                  log["ok"], log["errors"], log["after"]))
        check(log["exc"] is None, "the reader's connection failed: %r" % log["exc"])
        check(not log["wrong"], "wrong or misplaced replies across the restart: %r"
              % log["wrong"][:4])
        check(log["errors"] > 0, "no command failed while the node was down")
        check(log["after"] >= 50, "reads did not go on after the restart")
        j2, a2 = read_messages(scrape(maddr))
        keys, got = rnd(c, 7)
        check(all(g == truth[k] for k, g in zip(keys, got)), "after the restart: %r" % got)
        j3, _ = read_messages(scrape(maddr))
        check(j3 > j2, "the new stream's messages are not joined")
    finally:
        cl.stop()


def answers(text):
    """bloomgrid_resp_answers_total: (in_place, loop)."""
    out = {"in_place": 0.0, "loop": 0.0}
    for where, v in re.findall(r'^bloomgrid_resp_answers_total\{where="(\w+)"\} (\S+)$',
                               text, re.M):
        out[where] += float(v)
    return out["in_place"], out["loop"]


def part_inplace():
    """Replies written in place by the thread that took the node's answer,
    in the order of the commands, whatever the socket and budgets do."""
    import socket
    cl, s, maddr, c = metered_cluster(1, "--default-shards", "4", "--default-shard-mb", "0")
    try:
        c.execute_command("BF.RESERVE", "ip", 0.001, 200000, "NONSCALING")

        # A lone pipelined connection: a round of 32 BF.ADD of new keys, then
        # a round of 32 BF.EXISTS of them and of keys never added, in turn
        # (within a round no command waits for another).
        ROUNDS = 300
        i0, l0 = answers(scrape(maddr))
        wrong = []
        for r in range(ROUNDS):
            keys = ["k%d-%d" % (r, i) for i in range(16)]
            p = c.pipeline(transaction=False)
            for k in keys + ["w%d-%d" % (r, i) for i in range(16)]:
                p.execute_command("BF.ADD", "ip", k)
            got = p.execute(raise_on_error=False)
            if any(g not in (0, 1) for g in got):
                wrong.append((r, "add", got))
            p = c.pipeline(transaction=False)
            for i in range(16):
                p.execute_command("BF.EXISTS", "ip", keys[i])
                p.execute_command("BF.EXISTS", "ip", "never-%d-%d" % (r, i))
            got = p.execute(raise_on_error=False)
            if got[0::2] != [1] * 16 or any(g not in (0, 1) for g in got[1::2]):
                wrong.append((r, "exists", got))
        i1, l1 = answers(scrape(maddr))
        print("lone pipelined connection: %d rounds of 32 adds and of 32 reads, %d calls "
              "answered in place, %d by the loop" % (ROUNDS, i1 - i0, l1 - l0))
        check(not wrong, "wrong or misplaced replies: %r" % wrong[:4])
        check(i1 - i0 + l1 - l0 >= 2 * ROUNDS, "fewer calls finished elsewhere than rounds")
        check(i1 - i0 >= 0.8 * (i1 - i0 + l1 - l0),
              "a lone pipelined connection's replies were not written in place: "
              "%d in place, %d by the loop" % (i1 - i0, l1 - l0))

        # Each BF.EXISTS right behind the BF.ADD of its key waits for it (the
        # connection blocked: the loop resumes it): every reply in place.
        wrong = []
        for r in range(50):
            p = c.pipeline(transaction=False)
            ks = ["b%d-%d" % (r, i) for i in range(16)]
            for k in ks:
                p.execute_command("BF.ADD", "ip", k)
                p.execute_command("BF.EXISTS", "ip", k)
            got = p.execute(raise_on_error=False)
            if got[1::2] != [1] * 16 or any(g not in (0, 1) for g in got[0::2]):
                wrong.append((r, got))
        check(not wrong, "add then exists on one connection: %r" % wrong[:2])
        i1, l1 = answers(scrape(maddr))

        # 24 MiB of BF.MEXISTS sent before any reply is read: the replies
        # fill the socket, the connection goes over pipeline_bytes and is
        # paused; what cannot be sent in place is the loop's to write.
        keys = ["k%d-%d" % (r, i) for r in range(ROUNDS) for i in range(16)]
        absent = ["zz%d" % i for i in range(len(keys))]
        truth = dict(zip(absent, c.execute_command("BF.MEXISTS", "ip", *absent)))
        truth.update((k, 1) for k in keys)
        allk = keys + absent
        cmds, expect = [], []
        random.seed(7)
        size = 0
        while size < (24 << 20):
            ks = random.sample(allk, 1000)
            args = [b"BF.MEXISTS", b"ip"] + [k.encode() for k in ks]
            cmd = b"*%d\r\n" % len(args) + b"".join(
                b"$%d\r\n%s\r\n" % (len(a), a) for a in args)
            cmds.append(cmd)
            size += len(cmd)
            expect.append(b"*1000\r\n" + b"".join(
                b":%d\r\n" % truth[k] for k in ks))
        want = b"".join(expect)
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)
        sock.connect((s.host, s.port))
        sock.settimeout(120)
        sent = threading.Event()

        def send_all():
            for cmd in cmds:
                sock.sendall(cmd)
            sent.set()

        th = threading.Thread(target=send_all)
        th.start()
        time.sleep(1.0)   # replies pile up unread meanwhile
        got = bytearray()
        while len(got) < len(want):
            # Slowly at first: the socket fills and drains by turns.
            slow = len(got) < len(want) // 2
            chunk = sock.recv(16384 if slow else 1 << 20)
            if slow:
                time.sleep(0.001)
            check(chunk, "the router closed the connection after %d of %d reply bytes"
                  % (len(got), len(want)))
            got += chunk
        th.join()
        sock.close()
        print("%d BF.MEXISTS (%d bytes) sent before reading: %d reply bytes" % (
            len(cmds), size, len(got)))
        check(bytes(got) == want, "replies of the unread pipeline differ from the "
              "answers (first difference at byte %d)" % next(
                  (i for i, (a, b) in enumerate(zip(got, want)) if a != b),
                  min(len(got), len(want))))

        # 50 connections at once, each adding its own keys then reading them.
        errs = []

        def conn_work(t):
            cc = cl.client(0)
            try:
                for r in range(20):
                    p = cc.pipeline(transaction=False)
                    ks = ["c%d-%d-%d" % (t, r, i) for i in range(8)]
                    for k in ks:
                        p.execute_command("BF.ADD", "ip", k)
                    for k in ks:
                        p.execute_command("BF.EXISTS", "ip", k)
                    got = p.execute(raise_on_error=False)
                    if got[8:] != [1] * 8 or any(g not in (0, 1) for g in got[:8]):
                        errs.append((t, r, got))
            except Exception as e:   # noqa: BLE001 (reported below)
                errs.append((t, e))
            finally:
                cc.close()

        run_threads(conn_work, 50)
        check(not errs, "50 connections: %r" % errs[:3])
        i2, l2 = answers(scrape(maddr))
        print("50 connections: %d calls answered in place, %d by the loop" % (
            i2 - i1, l2 - l1))

        # A router stopped under a pipelined client exits, in time, with 0.
        stop = threading.Event()

        def busy():
            cc = cl.client(0)
            try:
                while not stop.is_set():
                    p = cc.pipeline(transaction=False)
                    for i in range(32):
                        p.execute_command("BF.EXISTS", "ip", "k1-%d" % (i % 16))
                    p.execute(raise_on_error=False)
            except redis.RedisError:
                pass
            finally:
                cc.close()

        th = threading.Thread(target=busy)
        th.start()
        time.sleep(1.0)
        t0 = time.time()
        s.p.terminate()
        try:
            rc = s.p.wait(30)
        except subprocess.TimeoutExpired:
            s.p.kill()
            rc = None
        stop.set()
        th.join()
        check(rc == 0, "the router stopped under a pipelined client: exit %r after %.1f s"
              % (rc, time.time() - t0))
        print("router stopped under a pipelined client: exit 0 in %.2f s" % (time.time() - t0))
    finally:
        cl.stop()


def metric_value(text, name):
    m = re.search(r"^%s (\S+)$" % re.escape(name), text, re.M)
    return float(m.group(1)) if m else None


{"kill": part_kill, "create": part_create, "bench": part_bench,
 "shards": part_shards, "oldnode": part_oldnode, "budget": part_budget, "pipeline": part_pipeline,
 "slow": part_slow, "readjoin": part_readjoin, "inplace": part_inplace}[PART]()
print("ok")
