#!/usr/bin/python3
"""Readiness for systemd (Type=notify, sd_notify(3)) of node, router and merger.

The test plays the service manager: it binds the datagram socket named by
NOTIFY_SOCKET, starts each program with it and reads what they say.

* node: READY=1 comes only once its data directory is open: the moment it
  arrives, a filter of ~60 MB saved by an earlier run is already listed and
  READY (the node listens before it loads, so a READY sent at listen time
  would be caught by `info` failing).  A data directory that cannot be
  opened: the node exits 1 and never says READY=1.
* SIGHUP: RELOADING=1, then READY=1 again; SIGTERM: STOPPING=1 before the
  process ends (exit 0).
* router and merger: READY=1 once they listen; the router answers `list`
  at that moment.
* Without NOTIFY_SOCKET nothing changes (every other test runs so).

usage: test_notify.py BLOOMGRID NODE ROUTER MERGER
"""
import os
import signal
import socket
import subprocess
import sys
import time

import pyharness

BG, NODE, ROUTER, MERGER = (os.path.abspath(a) for a in sys.argv[1:5])
H = pyharness.Run("notify.")
WORK, PROCS, fail = H.work, H.procs, H.fail


class Manager:
    """The service manager's end of NOTIFY_SOCKET."""

    def __init__(self, tag):
        self.path = os.path.join(WORK, tag + ".notify")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.seen = []

    def wait(self, state, proc, timeout=60):
        """Wait for a datagram holding the line `state`; return the datagram."""
        end = time.time() + timeout
        while time.time() < end:
            self.sock.settimeout(0.1)
            try:
                msg = self.sock.recv(4096).decode()
            except socket.timeout:
                if proc.poll() is not None:
                    fail("exited %d before saying %s (said %r)" %
                         (proc.returncode, state, self.seen))
                continue
            self.seen.append(msg)
            if state in msg.split("\n"):
                return msg
        fail("no %s within %d s (said %r)" % (state, timeout, self.seen))

    def drain(self):
        self.sock.settimeout(0)
        try:
            while True:
                self.seen.append(self.sock.recv(4096).decode())
        except (BlockingIOError, socket.timeout):
            pass
        return self.seen


def start(tag, mgr, *args):
    env = dict(os.environ)
    if mgr:
        env["NOTIFY_SOCKET"] = mgr.path
    else:
        env.pop("NOTIFY_SOCKET", None)
    out = open(os.path.join(WORK, tag + ".out"), "w")
    err = open(os.path.join(WORK, tag + ".log"), "w")
    p = subprocess.Popen(list(args), stdout=out, stderr=err, cwd=WORK, env=env)
    PROCS.append(p)
    p.out, p.err = out.name, err.name
    return p


def address(p):
    for _ in range(400):
        with open(p.out) as f:
            for line in f:
                if " listening on " in line:
                    return line.split(" listening on ")[1].split()[0]
        if p.poll() is not None:
            fail("exited %d: %s" % (p.returncode, open(p.err).read()))
        time.sleep(0.05)
    fail("did not start: %s" % open(p.err).read())


def bg(server, *args, expect=0):
    r = subprocess.run([BG, "--server", server] + list(args), cwd=WORK,
                       capture_output=True, text=True)
    if r.returncode != expect:
        fail("bloomgrid %s: exit %d, expected %d: %s %s" %
             (" ".join(args), r.returncode, expect, r.stdout, r.stderr))
    return r.stdout


def wait_open(addr):
    """Until the node's data directory is open (it listens before)."""
    for _ in range(600):
        if subprocess.run([BG, "--server", addr, "list"], cwd=WORK,
                          capture_output=True).returncode == 0:
            return
        time.sleep(0.05)
    fail("node %s never opened its data directory" % addr)


def stop(p, mgr):
    p.send_signal(signal.SIGTERM)
    if mgr:
        mgr.wait("STOPPING=1", p)
    if p.wait(timeout=120) != 0:
        fail("exit %d after SIGTERM: %s" % (p.returncode, open(p.err).read()))


def main():
    data = os.path.join(WORK, "d")
    args = [NODE, "--data-dir", data, "--listen", "127.0.0.1:0"]

    # A first run, without a service manager, saves a large filter.
    p = start("node0", None, *args)
    addr = address(p)
    wait_open(addr)
    bg(addr, "create", "big", "-n", "50M", "-p", "0.01")
    bg(addr, "add", "big", "k1", "k2")
    stop(p, None)

    # Started by the "manager": READY=1 means the filter is loaded.
    m = Manager("node")
    p = start("node", m, *args)
    msg = m.wait("READY=1", p)
    addr = address(p)
    info = bg(addr, "info", "big", "--json")
    if '"READY"' not in info and '"ready"' not in info.lower():
        fail("READY=1 before the filter is ready: %s" % info)
    bg(addr, "check", "big", "k1", "k2")
    if not any(line.startswith("STATUS=") for line in msg.split("\n")):
        fail("READY=1 without a STATUS line: %r" % msg)

    # SIGHUP: reloading, then ready again.
    p.send_signal(signal.SIGHUP)
    m.wait("RELOADING=1", p)
    m.wait("READY=1", p)
    stop(p, m)

    # A data directory that cannot be opened: exit 1, never READY=1.
    bad = os.path.join(WORK, "not-a-dir")
    open(bad, "w").close()
    m2 = Manager("node-bad")
    p = start("node-bad", m2, NODE, "--data-dir", bad, "--listen", "127.0.0.1:0")
    rc = p.wait(timeout=60)
    said = m2.drain()
    if rc == 0:
        fail("a node on an unusable data directory exited 0")
    if any("READY=1" in s.split("\n") for s in said):
        fail("a node that could not open its data said READY=1: %r" % said)

    # The router and the merger are ready once they listen.
    m1 = Manager("node1")
    p = start("node1", m1, *args)
    m1.wait("READY=1", p)
    naddr = address(p)
    topo = os.path.join(WORK, "topo.ini")
    with open(topo, "w") as f:
        f.write("version = 1\n[group g0]\ncopies = %s\n" % naddr)
    mr = Manager("router")
    r = start("router", mr, ROUTER, "--topology", topo, "--listen", "127.0.0.1:0")
    mr.wait("READY=1", r)
    raddr = address(r)
    if "big" not in bg(raddr, "list"):
        fail("router ready but does not list the filter")
    r.send_signal(signal.SIGHUP)
    mr.wait("RELOADING=1", r)
    mr.wait("READY=1", r)
    stop(r, mr)

    sources = os.path.join(WORK, "sources.ini")
    with open(sources, "w") as f:
        f.write("[filter big]\ndatacenter = dc1 %s\n" % topo)
    mm = Manager("merger")
    g = start("merger", mm, MERGER, "--listen", "127.0.0.1:0", "--sources", sources,
              "--state-dir", os.path.join(WORK, "mstate"), "--interval-s", "3600")
    mm.wait("READY=1", g)
    g.send_signal(signal.SIGHUP)
    mm.wait("RELOADING=1", g)
    mm.wait("READY=1", g)
    stop(g, mm)
    stop(p, m1)
    print("ok: node, router and merger notify READY, RELOADING and STOPPING")


main()
