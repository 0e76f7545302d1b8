#!/usr/bin/env python3
"""The node joins the BF.ADDs of one loop pass to a filter into one write
(node/node_resp.c): pipelined commands must answer exactly as if each ran
alone, in order.  One connection sends everything in one write, so that
the commands fall into the same pass: adds of a key twice (1 then 0, also
inside one BF.MADD), adds to two filters interleaved, a read after adds
(sees them), BF.CARD, DEL after adds, more adds than one joined write
holds; and two connections adding the same key (one 1, one 0).  With
durability none and fsync (the door's loop committing its passes, and the
log's commit thread).

usage: test_resp_joined.py NODE_BIN"""
import sys

import resplib

NODE = sys.argv[1]


check, cmd, Conn = resplib.check, resplib.cmd, resplib.Conn


def run(durability, extra=()):
    work = resplib.workdir("resp-joined-")
    node = resplib.start_node(NODE, work, ["--durability", durability] + list(extra),
                              tag="node-" + durability)
    try:
        c = Conn(node.port)
        c.send(cmd("BF.RESERVE", "j", "0.01", "100000", "NONSCALING") +
               cmd("BF.RESERVE", "k", "0.01", "100000", "NONSCALING"))
        check([c.reply(), c.reply()] == ["+OK", "+OK"], "BF.RESERVE")

        batch = [
            (cmd("BF.ADD", "j", "a"), ":1"),
            (cmd("BF.ADD", "j", "a"), ":0"),
            (cmd("BF.MADD", "j", "b", "a", "b"), [":1", ":0", ":0"]),
            (cmd("BF.ADD", "k", "a"), ":1"),
            (cmd("BF.ADD", "j", "c"), ":1"),
            (cmd("BF.EXISTS", "j", "c"), ":1"),
            (cmd("BF.ADD", "k", "a"), ":0"),
            (cmd("BF.MEXISTS", "j", "a", "b", "c", "d"), [":1", ":1", ":1", ":0"]),
            (cmd("BF.CARD", "j"), ":3"),
            (cmd("BF.ADD", "k", "b"), ":1"),
            (cmd("DEL", "k"), ":1"),
            (cmd("BF.EXISTS", "j", "b"), ":1"),
        ]
        c.send(b"".join(b for b, _ in batch))
        for i, (_, want) in enumerate(batch):
            got = c.reply()
            check(got == want, "%s: command %d answered %r, expected %r" % (durability, i, got, want))
        c.send(cmd("BF.EXISTS", "k", "a"))
        got = c.reply()
        check(got.startswith("-ERR not found"), "%s: BF.EXISTS after DEL: %r" % (durability, got))

        # More adds than one joined write holds (4096 keys), in one write.
        n = 5000
        c.send(b"".join(cmd("BF.ADD", "j", "m%d" % i) for i in range(n)))
        got = [c.reply() for _ in range(n)]
        check(all(g in (":0", ":1") for g in got), "%s: many adds: %r" % (durability, got[:5]))
        check(got.count(":1") >= n - 5, "%s: many adds: only %d new" % (durability, got.count(":1")))
        c.send(cmd("BF.MEXISTS", "j", *["m%d" % i for i in range(n)]) + cmd("BF.ADD", "j", "m0"))
        got = c.reply()
        check(got == [":1"] * n, "%s: a key added earlier reads 0" % durability)
        check(c.reply() == ":0", "%s: re-add after many" % durability)

        # Two connections adding the same key: one is new, one is not.
        a, b = Conn(node.port), Conn(node.port)
        for k in range(50):
            a.send(cmd("BF.ADD", "j", "both%d" % k))
            b.send(cmd("BF.ADD", "j", "both%d" % k))
            got = sorted([a.reply(), b.reply()])
            check(got == [":0", ":1"], "%s: two connections adding both%d: %r" % (durability, k, got))
    finally:
        node.stop()


for d in ("none", "fsync"):
    run(d)
run("fsync", ["--resp-commit", "thread"])
print("ok")
