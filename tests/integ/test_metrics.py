#!/usr/bin/python3
"""GET /metrics of a node, a router and a merger (docs/METRICS.md).

Starts the three with metrics_listen on 127.0.0.1:0, makes calls with the
bloomgrid tool, scrapes each endpoint and parses it with
prometheus_client's parser (Debian's python3-prometheus-client), then checks
that the counters moved by exactly the calls made: Add calls OK at the
router, a refused CreateFilter counted with its code, keys added and
queried at the node, the merger's first round.  Every counter an alert
reads is served at 0 before its first increase (checkpoint failures,
quorum failures of each op, the calls' server-side error codes, the
merger's failed rounds); the per-filter series carry the filter's name in
`filter` and the shard's index in `shard`, or with metrics_shards = filter
one series per filter.  Every family the alert rules and the dashboard
name is served.  Also: a non-loopback metrics_listen without --insecure
stops the start (exit 2).

usage: test_metrics.py BLOOMGRID NODE ROUTER MERGER
"""
import http.client
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

import pyharness

BG, NODE, ROUTER, MERGER = (os.path.abspath(a) for a in sys.argv[1:5])
H = pyharness.Run("metrics.")
WORK, PROCS, fail = H.work, H.procs, H.fail


def start(tag, *args, metrics="127.0.0.1:0"):
    """Start a server; return (its address, its metrics address)."""
    _, addr, maddr = H.start_server(tag, args, metrics)
    return addr, maddr


def bg(*args, expect=0):
    r = subprocess.run([BG, "--server", ROUTER_ADDR] + list(args), cwd=WORK,
                       capture_output=True, text=True)
    if r.returncode != expect:
        fail("bloomgrid %s: exit %d, expected %d: %s" %
             (" ".join(args), r.returncode, expect, r.stderr))
    return r


FAMILIES = []
# The codes of the server's own failures, whose calls series exist at 0.
SERVER_ERRORS = ("UNKNOWN", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "INTERNAL",
                 "UNAVAILABLE", "DATA_LOSS")


def scrape(maddr, context=None):
    """The families served at maddr (kept in FAMILIES too); over HTTPS when
    an ssl context is given."""
    url = "%s://%s/metrics" % ("https" if context else "http", maddr)
    with urllib.request.urlopen(url, timeout=10, context=context) as r:
        if r.status != 200:
            fail("GET /metrics of %s: %d" % (maddr, r.status))
        text = r.read().decode()
    fams = list(text_string_to_metric_families(text))
    FAMILIES.extend(fams)
    return fams


def value(fams, sample, **labels):
    """The value of the one sample named so with these labels (None: none)."""
    found = [s.value for f in fams for s in f.samples
             if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items())]
    if len(found) > 1:
        fail("%s%s: %d samples" % (sample, labels, len(found)))
    return found[0] if found else None


def expect(fams, sample, want, **labels):
    got = value(fams, sample, **labels)
    if got != want:
        fail("%s%s = %r, expected %r" % (sample, labels, got, want))


def main():
    global ROUTER_ADDR
    node_addr, node_m = start("node", NODE, "--data-dir", os.path.join(WORK, "d"),
                              "--metrics-sample-s", "1")
    # The node listens before its data directory is open.
    for _ in range(400):
        if subprocess.run([BG, "--server", node_addr, "list"], cwd=WORK,
                          capture_output=True).returncode == 0:
            break
        time.sleep(0.05)
    with open(os.path.join(WORK, "topo.ini"), "w") as f:
        f.write("version = 1\n[group g0]\ncopies = %s\n" % node_addr)
    ROUTER_ADDR, router_m = start("router", ROUTER, "--topology",
                                  os.path.join(WORK, "topo.ini"))

    # Before any call: the Add series exist already, at 0, and so does
    # every counter an alert reads (a counter that appears at 1 is no
    # increase to Prometheus).
    fams = scrape(router_m)
    expect(fams, "bloomgrid_rpc_calls_total", 0.0,
           service="bloomgrid.v1.BloomGrid", method="Add", code="OK")
    for code in SERVER_ERRORS:
        expect(fams, "bloomgrid_rpc_calls_total", 0.0,
               service="bloomgrid.v1.BloomGrid", method="MayContain", code=code)
    for op in ("Add", "MayContain", "Remove"):
        expect(fams, "bloomgrid_router_quorum_failures_total", 0.0, op=op)
    fams = scrape(node_m)
    for name in ("bloomgrid_checkpoint_failures_total", "bloomgrid_checkpoint_bytes_total",
                 "bloomgrid_checkpoint_duration_seconds_count", "bloomgrid_keys_added_total",
                 "bloomgrid_keys_queried_total", "bloomgrid_wal_written_bytes_total"):
        expect(fams, name, 0.0)
    expect(fams, "bloomgrid_rpc_calls_total", 0.0,
           service="bloomgrid.v1.Internal", method="Batches", code="UNAVAILABLE")

    bg("create", "slugs", "-n", "10000", "-p", "0.01", "--shards", "2")
    bg("create", "slugs", "-n", "10", "-p", "0.1", expect=2)   # ALREADY_EXISTS
    keys = ["k%d" % i for i in range(30)]
    for i in range(3):
        bg("add", "slugs", *keys[10 * i:10 * i + 10])
    bg("check", "slugs", "k1", "k2", "k3", "absent-1", "absent-2", expect=1)

    fams = scrape(router_m)
    expect(fams, "bloomgrid_rpc_calls_total", 3.0,
           service="bloomgrid.v1.BloomGrid", method="Add", code="OK")
    expect(fams, "bloomgrid_rpc_duration_seconds_count", 3.0,
           service="bloomgrid.v1.BloomGrid", method="Add")
    expect(fams, "bloomgrid_rpc_calls_total", 1.0,
           service="bloomgrid.v1.BloomGrid", method="CreateFilter", code="ALREADY_EXISTS")
    expect(fams, "bloomgrid_rpc_calls_total", 1.0,
           service="bloomgrid.v1.BloomGrid", method="CreateFilter", code="OK")
    expect(fams, "bloomgrid_rpc_calls_total", 1.0,
           service="bloomgrid.v1.BloomGrid", method="MayContain", code="OK")
    for op in ("Add", "MayContain", "Remove"):
        expect(fams, "bloomgrid_router_quorum_failures_total", 0.0, op=op)
    if not value(fams, "bloomgrid_router_node_calls_total", node=node_addr,
                 lane="write", code="OK"):
        fail("no key batch counted to the node")
    # A node down or slow: counted from 0 once the router has a link to it.
    for lane in ("read", "write"):
        for code in ("UNAVAILABLE", "DEADLINE_EXCEEDED"):
            expect(fams, "bloomgrid_router_node_calls_total", 0.0, node=node_addr,
                   lane=lane, code=code)
    if not value(fams, "process_resident_memory_bytes"):
        fail("router: no process_resident_memory_bytes")

    fams = scrape(node_m)
    expect(fams, "bloomgrid_keys_added_total", 30.0)
    expect(fams, "bloomgrid_keys_queried_total", 5.0)
    present = value(fams, "bloomgrid_keys_present_total")
    if present is None or not 3.0 <= present <= 5.0:
        fail("bloomgrid_keys_present_total = %r, expected 3 (or 4, 5 with false "
             "positives)" % present)
    inserts = sum(s.value for f in fams for s in f.samples
                  if s.name == "bloomgrid_filter_inserts_total")
    if inserts < 29 or inserts > 30:
        fail("filter inserts sum to %r, expected 30 (29 with a collision)" % inserts)
    shards = [s for f in fams for s in f.samples if s.name == "bloomgrid_filter_bytes"]
    if len(shards) != 2 or any(s.value <= 0 for s in shards):
        fail("bloomgrid_filter_bytes: %r" % shards)
    # The filter's own name and the shard's index, one label each.
    if sorted((s.labels.get("filter"), s.labels.get("shard")) for s in shards) != \
            [("slugs", "0"), ("slugs", "1")]:
        fail("bloomgrid_filter_bytes labels: %r, expected filter slugs, shards 0 and 1"
             % [s.labels for s in shards])
    for s in shards:
        expect(fams, "bloomgrid_shard_syncing", 0.0, filter="slugs", shard=s.labels["shard"])
        expect(fams, "bloomgrid_filter_capacity", 5000.0, filter="slugs",
               shard=s.labels["shard"])
    # The sampled fill (every second here): n-hat sums to the 30 keys, and
    # the fill and its FPR are those of a filter at 30 of 10 000 keys.
    nhat = 0.0
    for _ in range(200):
        fams = scrape(node_m)
        nhat = sum(s.value for f in fams for s in f.samples
                   if s.name == "bloomgrid_filter_estimated_keys")
        if nhat >= 29:
            break
        time.sleep(0.1)
    if not 27 <= nhat <= 33:
        fail("bloomgrid_filter_estimated_keys sum to %r, expected about 30" % nhat)
    for name, lo, hi in (("bloomgrid_filter_fill_ratio", 1e-4, 0.05),
                         ("bloomgrid_filter_estimated_fpr", 0.0, 1e-3)):
        got = [s.value for f in fams for s in f.samples if s.name == name]
        if len(got) != 2 or not all(lo <= v <= hi for v in got):
            fail("%s: %r, expected two shards within [%g, %g]" % (name, got, lo, hi))
    if not value(fams, "bloomgrid_wal_fsync_duration_seconds_count"):
        fail("node: no WAL fsync counted")
    if not value(fams, "process_open_fds"):
        fail("node: no process_open_fds")

    per_filter_checks()

    # The merger's first round (at its start), counted once it has finished.
    with open(os.path.join(WORK, "sources.ini"), "w") as f:
        f.write("[filter slugs]\ndatacenter = dc1 %s\n" % os.path.join(WORK, "topo.ini"))
    _, merger_m = start("merger", MERGER, "--sources",
                        os.path.join(WORK, "sources.ini"), "--state-dir",
                        os.path.join(WORK, "m"), "--interval-s", "3600")
    for _ in range(400):
        fams = scrape(merger_m)
        if value(fams, "bloomgrid_merger_rounds_total"):
            break
        time.sleep(0.05)
    expect(fams, "bloomgrid_merger_rounds_total", 1.0)
    expect(fams, "bloomgrid_merger_errors_total", 0.0)
    if not value(fams, "bloomgrid_merger_pages_pulled_total"):
        fail("the merger's round pulled no page")
    expect(fams, "bloomgrid_merger_round_duration_seconds_count", 1.0)
    # SIGUSR1 runs a round now (the interval is an hour).
    PROCS[-1].send_signal(signal.SIGUSR1)
    for _ in range(400):
        fams = scrape(merger_m)
        if value(fams, "bloomgrid_merger_rounds_total") == 2.0:
            break
        time.sleep(0.05)
    expect(fams, "bloomgrid_merger_rounds_total", 2.0)
    expect(fams, "bloomgrid_merger_rounds_failed_total", 0.0)

    # Every bloomgrid_ family served is documented, and the alert rules and
    # the dashboard name only documented families that these processes
    # serve (but those of setups this test does not make, each checked by
    # the test named).
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    doc = open(os.path.join(root, "docs", "METRICS.md")).read()
    served = {s.name for f in FAMILIES for s in f.samples if s.name.startswith("bloomgrid_")}
    def family(name):
        return re.sub(r"_(bucket|count|sum)$", "", name)
    def documented(name):
        return "`%s`" % family(name) in doc
    served_families = {family(n) for n in served}
    elsewhere = {
        # A router with canary_filter: test_canary.py (integ_canary_router).
        "bloomgrid_canary_false_negatives_total", "bloomgrid_canary_errors_total",
        "bloomgrid_canary_checks_total", "bloomgrid_canary_adds_total",
        # Copies of a group: tests/router/test_router_copies.c (metrics).
        "bloomgrid_antientropy_last_pull_timestamp_seconds",
        "bloomgrid_antientropy_pages_total", "bloomgrid_antientropy_bytes_total",
        "bloomgrid_antientropy_peer_up", "bloomgrid_antientropy_cursors",
    }
    for name in served:
        if not documented(name):
            fail("%s is served but not in docs/METRICS.md" % name)
    for rel in ("deploy/prometheus/alerts.yml", "deploy/grafana/bloomgrid.json"):
        named = set(re.findall(r"\bbloomgrid_[a-z_]+", open(os.path.join(root, rel)).read()))
        for name in named:
            if not documented(name):
                fail("%s names %s, which docs/METRICS.md does not list" % (rel, name))
            elif family(name) not in served_families and family(name) not in elsewhere:
                fail("%s names %s, which no process of this test serves" % (rel, name))
        print("ok: the %d bloomgrid_ families %s names are served" % (len(named), rel))

    # Plain HTTP off loopback needs --insecure.
    r = subprocess.run([NODE, "--listen", "127.0.0.1:0", "--data-dir",
                        os.path.join(WORK, "d2"), "--metrics-listen", "192.0.2.1:0"],
                       capture_output=True, text=True)
    if r.returncode != 2 or "metrics_listen 192.0.2.1:0 is not a loopback" not in r.stderr:
        fail("non-loopback metrics_listen: exit %d: %s" % (r.returncode, r.stderr))
    https_checks(root)
    print("ok")


def per_filter_checks():
    """metrics_shards = filter: one series per filter, its shards folded."""
    addr, node_m = start("node-per-filter", NODE, "--data-dir", os.path.join(WORK, "pf"),
                         "--metrics-shards", "filter", "--metrics-sample-s", "1")
    for _ in range(400):
        if subprocess.run([BG, "--server", addr, "list"], cwd=WORK,
                          capture_output=True).returncode == 0:
            break
        time.sleep(0.05)
    topo = os.path.join(WORK, "topo-pf.ini")
    with open(topo, "w") as f:
        f.write("version = 1\n[group g0]\ncopies = %s\n" % addr)
    raddr, _ = start("router-per-filter", ROUTER, "--topology", topo)
    for args in (["create", "wide", "-n", "8000", "-p", "0.01", "--shards", "4"],
                 ["add", "wide"] + ["w%d" % i for i in range(40)]):
        r = subprocess.run([BG, "--server", raddr] + args, cwd=WORK, capture_output=True,
                           text=True)
        if r.returncode != 0:
            fail("bloomgrid %s: %s" % (" ".join(args), r.stderr))
    for _ in range(200):
        fams = scrape(node_m)
        if value(fams, "bloomgrid_filter_estimated_keys", filter="wide") is not None:
            break
        time.sleep(0.1)
    for name in ("bloomgrid_filter_bytes", "bloomgrid_filter_inserts_total",
                 "bloomgrid_filter_capacity", "bloomgrid_filter_model_fpr",
                 "bloomgrid_shard_syncing", "bloomgrid_filter_estimated_keys"):
        got = [s for f in fams for s in f.samples if s.name == name]
        if len(got) != 1 or got[0].labels != {"filter": "wide"}:
            fail("metrics_shards = filter: %s %r, expected one series {filter=\"wide\"}"
                 % (name, [(s.labels, s.value) for s in got]))
    # Sums of the four shards (capacity 2000 each), a single SYNCING flag.
    expect(fams, "bloomgrid_filter_capacity", 8000.0, filter="wide")
    expect(fams, "bloomgrid_shard_syncing", 0.0, filter="wide")
    ins = value(fams, "bloomgrid_filter_inserts_total", filter="wide")
    if ins is None or not 39 <= ins <= 40:
        fail("metrics_shards = filter: inserts %r, expected 40 (39 with a collision)" % ins)
    print("ok: metrics_shards = filter serves one series per filter, its shards summed")


def https_checks(root):
    """metrics_tls: HTTPS with the process's certificate; plain HTTP off
    loopback only when asked for."""
    certs = os.path.join(WORK, "certs")
    subprocess.run(["sh", os.path.join(root, "tests", "tls", "gen-certs.sh"), certs],
                   check=True, capture_output=True)
    tls = ["--tls-cert", os.path.join(certs, "node.pem"), "--tls-key",
           os.path.join(certs, "node.key"), "--tls-ca", os.path.join(certs, "ca.pem"),
           "--internal-listen", "127.0.0.1:0"]
    ctx = ssl.create_default_context(cafile=os.path.join(certs, "ca.pem"))
    other = ssl.create_default_context(cafile=os.path.join(certs, "other-ca.pem"))

    # on: HTTPS on loopback, verified with the cluster CA; plain HTTP and a
    # client that trusts another CA get nothing.
    _, m = start("https-on", NODE, "--data-dir", os.path.join(WORK, "d3"), *tls,
                 "--metrics-tls", "on")
    if not value(scrape(m, ctx), "process_open_fds"):
        fail("HTTPS metrics: no process_open_fds")
    for what, c in (("plain HTTP", None), ("another CA", other)):
        try:
            scrape(m, c)
            fail("HTTPS metrics answered %s" % what)
        except (urllib.error.URLError, ConnectionError, ssl.SSLError, http.client.HTTPException):
            pass

    # auto: off loopback with a certificate, HTTPS (0.0.0.0 is not loopback).
    _, m = start("https-auto", NODE, "--data-dir", os.path.join(WORK, "d4"), *tls,
                 metrics="0.0.0.0:0")
    port = m.rsplit(":", 1)[1]
    if not value(scrape("127.0.0.1:" + port, ctx), "process_open_fds"):
        fail("metrics_tls = auto off loopback with a certificate: not HTTPS")

    # off: plain HTTP off loopback, the explicit choice, without --insecure.
    _, m = start("http-off", NODE, "--data-dir", os.path.join(WORK, "d5"),
                 "--metrics-tls", "off", metrics="0.0.0.0:0")
    port = m.rsplit(":", 1)[1]
    if not value(scrape("127.0.0.1:" + port), "process_open_fds"):
        fail("metrics_tls = off off loopback: not served in plain HTTP")

    # on without a certificate, and a bad value: refused at start.
    for extra, want in ((["--metrics-tls", "on"], "metrics_tls = on needs tls_cert"),
                        (["--metrics-tls", "maybe"], "metrics_tls")):
        r = subprocess.run([NODE, "--listen", "127.0.0.1:0", "--data-dir",
                            os.path.join(WORK, "d6"), "--metrics-listen", "127.0.0.1:0"]
                           + extra, capture_output=True, text=True, timeout=60)
        if r.returncode != 2 or want not in r.stderr:
            fail("%s: exit %d: %s" % (" ".join(extra), r.returncode, r.stderr))


try:
    main()
finally:
    for p in PROCS:
        p.terminate()
        p.wait()
    if not os.environ.get("KEEP"): shutil.rmtree(WORK, ignore_errors=True)
