#!/usr/bin/python3
"""The programs on a read-only root, as the Kubernetes manifests run them
(readOnlyRootFilesystem: true, data on volumes).

usage: readonly_root.py BUILD TMP

Each program runs in a mount namespace of its own (unshare, as root) where
every mounted file system but /proc, /sys and /dev is remounted read-only
and only its data directory is writable (a tmpfs, as a volume): a node
takes adds and writes checkpoints and its log, a router routes, a merger
runs rounds and keeps its state, and each stops cleanly (exit 0, final
checkpoint included).  A write elsewhere fails there: checked first, so
the namespace is what it claims.  Without the privilege to make such a
namespace the test is skipped (exit 77).  Exit 0 pass, 1 fail.
"""
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

BUILD, TMP = (os.path.abspath(a) for a in sys.argv[1:3])
CLI = os.path.join(BUILD, "cli", "bloomgrid")
failures = []
procs = []

# Remount every file system read-only but the kernel's, then mount a tmpfs
# on each writable directory, then run the program.
RO = r'''set -e
awk '{print $2}' /proc/self/mounts | sort -u | while read -r m; do
  case "$m" in /proc|/proc/*|/sys|/sys/*|/dev|/dev/*) continue ;; esac
  mount -o remount,bind,ro "$m" 2>/dev/null || true
done
for d in $RW; do mount -t tmpfs -o size=512m,mode=0755 tmpfs "$d"; done
exec "$@"
'''


def fail(msg):
    failures.append(msg)
    print("FAIL: " + msg)


def ro_cmd(rw, args):
    return ["unshare", "--mount", "--propagation", "private", "env", "RW=" + " ".join(rw),
            "sh", "-c", RO, "sh"] + args


def start(tag, rw, args):
    """Start args in a read-only namespace; return (process, address,
    metrics address) from its output."""
    out = open(os.path.join(TMP, tag + ".out"), "w")
    err = open(os.path.join(TMP, tag + ".log"), "w")
    p = subprocess.Popen(ro_cmd(rw, args + ["--listen", "127.0.0.1:0", "--metrics-listen",
                                            "127.0.0.1:0"]), stdout=out, stderr=err)
    procs.append(p)
    for _ in range(400):
        addr = maddr = None
        with open(out.name) as f:
            for line in f:
                if " listening on " in line:
                    addr = line.split(" listening on ")[1].split()[0]
                if " metrics on " in line:
                    maddr = line.split(" metrics on ")[1].split()[0]
        if addr and maddr:
            return p, addr, maddr
        if p.poll() is not None:
            break
        time.sleep(0.05)
    fail("%s did not start on a read-only root: %s" % (tag, open(err.name).read()[-2000:]))
    return None, None, None


def metric(maddr, name):
    with urllib.request.urlopen("http://%s/metrics" % maddr, timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return None


def bg(*args, expect=0):
    r = subprocess.run([CLI] + list(args), capture_output=True, text=True, timeout=60)
    if r.returncode != expect:
        fail("bloomgrid %s: exit %d (expected %d): %s" % (" ".join(args), r.returncode,
                                                           expect, r.stderr))
    return r


def stop(tag, p):
    p.send_signal(signal.SIGTERM)
    try:
        rc = p.wait(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        rc = p.wait()
    if rc != 0:
        fail("%s exited %d on SIGTERM: %s" % (tag, rc,
             open(os.path.join(TMP, tag + ".log")).read()[-2000:]))


def main():
    shutil.rmtree(TMP, ignore_errors=True)
    for d in ("node-data", "merger-state", "probe-rw"):
        os.makedirs(os.path.join(TMP, d))
    # The namespace: a write outside the tmpfs fails, one inside works.
    probe = subprocess.run(ro_cmd([os.path.join(TMP, "probe-rw")],
                                  ["sh", "-c", 'touch "$1/rw" && ! touch "$2/ro" 2>/dev/null',
                                   "sh", os.path.join(TMP, "probe-rw"), TMP]),
                           capture_output=True, text=True, timeout=60)
    if probe.returncode != 0:
        if "Operation not permitted" in probe.stderr or "unshare" in probe.stderr:
            print("SKIP: no mount namespace here (unshare needs root): %s" % probe.stderr.strip())
            sys.exit(77)
        fail("the read-only namespace is not read-only (or its tmpfs not writable): %s"
             % probe.stderr)
        return
    if os.path.exists(os.path.join(TMP, "ro")):
        fail("a write outside the tmpfs reached the disk")
        return
    print("ok: in the namespace only the tmpfs is writable")

    ndata = os.path.join(TMP, "node-data")
    node, naddr, nm = start("node", [ndata], [
        os.path.join(BUILD, "node", "bloomgrid-node"), "--data-dir", ndata + "/node",
        "--snapshot-interval", "1", "--checkpoint-log-percent", "1"])
    if not node:
        return
    for _ in range(400):
        if subprocess.run([CLI, "--server", naddr, "list"], capture_output=True).returncode == 0:
            break
        time.sleep(0.05)
    topo = os.path.join(TMP, "topo.ini")
    with open(topo, "w") as f:
        f.write("version = 1\n[group g0]\ncopies = %s\n" % naddr)
    router, raddr, _ = start("router", [], [
        os.path.join(BUILD, "router", "bloomgrid-router"), "--topology", topo])
    if not router:
        return
    bg("--server", raddr, "create", "users", "-n", "10000", "-p", "0.01", "--shards", "2")
    bg("--server", raddr, "add", "users", "alice", "bob")
    # Enough records for a checkpoint to be due: a page's worth per shard.
    bg("--server", raddr, "add", "users", *["user-%d" % i for i in range(1000)])
    r = bg("--server", raddr, "check", "users", "alice", "carol", expect=1)
    if r.stdout != "maybe\talice\nno\tcarol\n":
        fail("check through the router: %r" % r.stdout)
    # Checkpoints (due here once a shard's records pass a page: 1 % of
    # its bits is less) land in the data directory.
    ck = None
    for _ in range(100):
        ck = metric(nm, "bloomgrid_checkpoint_bytes_total")
        if ck:
            break
        time.sleep(0.1)
    if not ck or metric(nm, "bloomgrid_checkpoint_failures_total") != 0:
        fail("node: checkpoint bytes %r, failures %r" %
             (ck, metric(nm, "bloomgrid_checkpoint_failures_total")))
    else:
        print("ok: node on a read-only root: adds, reads, %d checkpoint bytes, no failure" % ck)

    sources = os.path.join(TMP, "sources.ini")
    with open(sources, "w") as f:
        f.write("[filter users]\ndatacenter = dc1 %s\n" % topo)
    mstate = os.path.join(TMP, "merger-state")
    merger, _, mm = start("merger", [mstate], [
        os.path.join(BUILD, "merger", "bloomgrid-merger"), "--sources", sources,
        "--state-dir", mstate + "/merger", "--interval-s", "3600"])
    if merger:
        rounds = None
        for _ in range(200):
            rounds = metric(mm, "bloomgrid_merger_rounds_total")
            if rounds:
                break
            time.sleep(0.05)
        errors = metric(mm, "bloomgrid_merger_errors_total")
        if rounds != 1 or errors != 0:
            fail("merger on a read-only root: %r rounds, %r errors: %s" % (
                rounds, errors, open(os.path.join(TMP, "merger.log")).read()[-2000:]))
        else:
            print("ok: merger on a read-only root: a round without error, its state kept")
        stop("merger", merger)
    stop("router", router)
    stop("node", node)
    # What they wrote stayed on their tmpfs, gone with the namespace.
    for d in (ndata, mstate):
        if os.listdir(d):
            fail("%s holds %s: written past the namespace's tmpfs" % (d, os.listdir(d)))
    if not failures:
        print("ok: node, router and merger stop cleanly (exit 0) on a read-only root")


os.makedirs(TMP, exist_ok=True)
try:
    main()
finally:
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
if failures:
    print("%d check(s) failed" % len(failures))
    sys.exit(1)
print("all checks passed")
