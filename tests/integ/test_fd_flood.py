#!/usr/bin/python3
"""More connections than a server may hold descriptors (common/rpc/proc_accept.h).

A node and a router in front of it start with RLIMIT_NOFILE at 160.  For
each of them in turn, 400 plain TCP connections are opened to its port and
held, so that it runs out of descriptors and must refuse some; then they
are closed.  After that the server must take connections and answer as
before (the node answers a listing; a key added before the flood reads
"maybe" through the router), count the
refusals in bloomgrid_connections_refused_total, and still be running.
Without the guard the gRPC listener closes itself at the first accept that
fails for want of a descriptor, and every later call hits its deadline.

usage: test_fd_flood.py BLOOMGRID NODE ROUTER
"""
import os
import resource
import socket
import subprocess
import sys
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

import pyharness

BG, NODE, ROUTER = (os.path.abspath(a) for a in sys.argv[1:4])
H = pyharness.Run("fdflood.")
WORK, PROCS, fail = H.work, H.procs, H.fail
LIMIT = 160
FLOOD = 400


def low_nofile():
    resource.setrlimit(resource.RLIMIT_NOFILE, (LIMIT, LIMIT))


def start(tag, *args):
    """Start a server with few descriptors; return (process, address, metrics address)."""
    return H.start_server(tag, args, preexec_fn=low_nofile)


def bg(addr, *args):
    r = subprocess.run([BG, "--server", addr, "--deadline", "5000"] + list(args),
                       cwd=WORK, capture_output=True, text=True, timeout=60)
    return r.returncode, r.stdout, r.stderr


def refused(maddr):
    with urllib.request.urlopen("http://%s/metrics" % maddr, timeout=10) as r:
        text = r.read().decode()
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "bloomgrid_connections_refused_total":
                return s.value
    return None


def flood(addr):
    host, port = addr.rsplit(":", 1)
    held = []
    for _ in range(FLOOD):
        try:
            held.append(socket.create_connection((host, int(port)), timeout=2))
        except OSError:
            break
    # The server accepts (or refuses) them from its queue meanwhile.
    time.sleep(1.5)
    for s in held:
        s.close()
    return len(held)


def check(tag, proc, addr, maddr, call, want):
    before = refused(maddr)
    if before is None:
        fail("%s serves no bloomgrid_connections_refused_total" % tag)
    opened = flood(addr)
    print("%s: %d connections opened against a limit of %d" % (tag, opened, LIMIT))
    if opened <= LIMIT:
        fail("%s: only %d connections could be opened; the flood proves nothing" %
             (tag, opened))
    # Every answer after the flood, within a few tries (the closed
    # connections are released as the server notices them).
    ok = False
    for _ in range(20):
        rc, out, err = bg(addr, *call)
        if rc == 0 and want in out:
            ok = True
            break
        time.sleep(0.5)
    if not ok:
        fail("%s answers no more after the flood: exit %d %s" % (tag, rc, err.strip()))
    after = refused(maddr)
    if not after or after <= before:
        fail("%s: bloomgrid_connections_refused_total %r -> %r" % (tag, before, after))
    if proc.poll() is not None:
        fail("%s exited %d" % (tag, proc.returncode))
    print("%s: answers after the flood; %d connections refused" % (tag, after - before))


def main():
    node, node_addr, node_m = start("node", NODE, "--data-dir", os.path.join(WORK, "d"))
    topo = os.path.join(WORK, "topology.ini")
    with open(topo, "w") as f:
        f.write("version = 1\n[group g0]\ncopies = %s\n" % node_addr)
    router, router_addr, router_m = start("router", ROUTER, "--topology", topo)
    for _ in range(100):
        rc, _, err = bg(router_addr, "create", "f", "--capacity", "10000", "--error-rate", "0.01")
        if rc == 0:
            break
        time.sleep(0.1)
    if rc != 0:
        fail("create: %s" % err)
    rc, _, err = bg(router_addr, "add", "f", "before-the-flood")
    if rc != 0:
        fail("add: %s" % err)
    # The node answers a listing (its shards are not listed as filters).
    check("node", node, node_addr, node_m, ["list"], "")
    check("router", router, router_addr, router_m, ["check", "f", "before-the-flood"],
          "maybe\tbefore-the-flood")
    for p in PROCS:
        p.terminate()
        p.wait(timeout=30)
    print("ok")


if __name__ == "__main__":
    main()
