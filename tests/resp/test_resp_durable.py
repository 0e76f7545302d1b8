#!/usr/bin/env python3
"""Durable adds through the node's Redis door (durability fsync): a
BF.ADD's reply goes out only once its log record's fdatasync returned, and
when that fdatasync fails no add of its group answers as stored.  With the
door's loop committing its passes (resp_commit = loop, the default) and
with the log's commit thread (thread).  The node runs with slow_fsync.c
preloaded, which holds or fails the fdatasync of the log's files on
demand.

  1. While the log's fdatasync is held, adds on two connections get no
     reply; once it is let go, both get theirs (:1).
  2. While every fdatasync of the log fails, adds on two connections
     (BF.ADD and BF.MADD, as in one pass) answer errors, never :1 or :0;
     the node goes on answering (PING).

usage: test_resp_durable.py NODE_BIN SLOW_FSYNC_SO"""
import os
import sys
import time

import resplib

NODE, PRELOAD = sys.argv[1], sys.argv[2]


check, cmd, Conn = resplib.check, resplib.cmd, resplib.Conn


def wait_file(path, what):
    for _ in range(1000):
        if os.path.exists(path):
            return
        time.sleep(0.01)
    resplib.fail("timed out waiting for " + what)


def run(mode):
    work = resplib.workdir("resp-durable-")
    gate, failf = os.path.join(work, "gate"), os.path.join(work, "fail")
    env = {"LD_PRELOAD": PRELOAD, "SLOW_FSYNC_GATE": gate,
           "SLOW_FSYNC_FAIL": failf, "SLOW_FSYNC_MATCH": "/wal-"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        node = resplib.start_node(NODE, work, ["--durability", "fsync", "--resp-commit", mode],
                                  tag="node-" + mode)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    try:
        a, b = Conn(node.port), Conn(node.port)
        a.send(cmd("BF.RESERVE", "d", "0.01", "100000", "NONSCALING"))
        check(a.reply() == "+OK", "%s: BF.RESERVE" % mode)
        a.send(cmd("BF.ADD", "d", "warm"))
        check(a.reply() == ":1", "%s: first add" % mode)

        # 1. Held fdatasync: no reply until it returns.
        open(gate, "w").close()
        a.send(cmd("BF.ADD", "d", "h1"))
        wait_file(gate + ".held", "the held fdatasync")
        b.send(cmd("BF.MADD", "d", "h2", "h3"))
        check(a.quiet_for(0.3), "%s: a BF.ADD answered while its fdatasync was held" % mode)
        check(b.quiet_for(0.1), "%s: a BF.MADD answered while the log's fdatasync was held" % mode)
        os.unlink(gate)
        check(a.reply() == ":1", "%s: held add" % mode)
        check(b.reply() == [":1", ":1"], "%s: held madd" % mode)

        # 2. Failing fdatasync: every add of the group answers an error.
        open(failf, "w").close()
        a.send(cmd("BF.ADD", "d", "f1"))
        b.send(cmd("BF.MADD", "d", "f2", "f3"))
        ra, rb = a.reply(), b.reply()
        check(os.path.exists(failf + ".hit"), "%s: no fdatasync failed" % mode)
        check(isinstance(ra, str) and ra.startswith("-"),
              "%s: an add whose fdatasync failed answered %r" % (mode, ra))
        if isinstance(rb, list):
            check(all(r.startswith("-") for r in rb), "%s: BF.MADD answered %r" % (mode, rb))
        else:
            check(rb.startswith("-"), "%s: BF.MADD answered %r" % (mode, rb))
        print("  %s: adds whose fdatasync failed answered %r and %r" % (mode, ra, rb))
        os.unlink(failf)
        a.send(cmd("PING"))
        check(a.reply() == "+PONG", "%s: PING after a failed fdatasync" % mode)
    finally:
        for f in (gate, failf):
            if os.path.exists(f):
                os.unlink(f)
        node.stop()


for m in ("loop", "thread"):
    run(m)
print("ok")
