#!/usr/bin/python3
"""The canary (docs/ROUTER.md, "Canary"): `bloomgrid canary` and a router's
canary_filter, against two nodes and routers on free loopback ports.

  cli      rounds through two routers exit 0, the routers take turns adding,
           the state file counts the keys, a restarted canary asks for every
           earlier key, and a router that is down is an error (exit 2), not a
           false negative; a loop goes on past errors until SIGTERM;
  detect   a filter dropped and created again under the same name forgets the
           canary keys: the command exits 1 naming each key and the router
           that said "no";
  router   a router's canary counts checks and no false negative, then counts
           false negatives on /metrics (parsed with prometheus_client) once
           the filter is dropped and created again, and again after a
           restart with its state file (the keys of its earlier run); the
           alert rules and dashboard name the series it serves;
  options  bad options, state files and router settings: exit 2 with a
           message naming what is wrong, and nothing written.

usage: test_canary.py BLOOMGRID NODE ROUTER MODE
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

import yaml
from prometheus_client.parser import text_string_to_metric_families

BG, NODE, ROUTER = (os.path.abspath(a) for a in sys.argv[1:4])
MODE = sys.argv[4]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TMP = os.environ.get("BLOOMGRID_TEST_TMP") or None
if TMP:
    os.makedirs(TMP, exist_ok=True)
WORK = tempfile.mkdtemp(prefix="canary-%s." % MODE, dir=TMP)
PROCS = {}
PREFIX = "bloomgrid-canary/"


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def start(tag, *args, metrics=False):
    """Start a server; return its address (and its metrics address)."""
    out = os.path.join(WORK, tag + ".out")
    err = os.path.join(WORK, tag + ".log")
    extra = ["--metrics-listen", "127.0.0.1:0"] if metrics else []
    p = subprocess.Popen(list(args) + ["--listen", "127.0.0.1:0"] + extra,
                         stdout=open(out, "w"), stderr=open(err, "a"), cwd=WORK)
    PROCS[tag] = p
    for _ in range(600):
        text = open(out).read()
        m = re.search(r" listening on (\S+)", text)
        mm = re.search(r" metrics on (\S+)", text)
        if m and (mm or not metrics):
            return (m.group(1), mm.group(1)) if metrics else m.group(1)
        if p.poll() is not None:
            fail("%s exited %d: %s" % (tag, p.returncode, open(err).read()))
        time.sleep(0.05)
    fail("%s did not start: %s" % (tag, open(err).read()))


def stop(tag):
    p = PROCS.pop(tag)
    p.terminate()
    p.wait()


def run(*args, expect=None, env=None):
    r = subprocess.run([BG] + list(args), cwd=WORK, capture_output=True, text=True,
                       env=env)
    if expect is not None and r.returncode != expect:
        fail("bloomgrid %s: exit %d, expected %d\nstdout: %s\nstderr: %s" %
             (" ".join(args), r.returncode, expect, r.stdout, r.stderr))
    return r


def cluster(routers=2):
    """Two nodes (a group each) and routers on them; returns the routers."""
    nodes = [start("node%d" % i, NODE, "--data-dir", os.path.join(WORK, "d%d" % i))
             for i in range(2)]
    with open(os.path.join(WORK, "topo.ini"), "w") as f:
        f.write("version = 1\n")
        for i, n in enumerate(nodes):
            f.write("[group g%d]\ncopies = %s\n" % (i, n))
    return [start("router%d" % i, ROUTER, "--topology", os.path.join(WORK, "topo.ini"))
            for i in range(routers)]


def create(router, name):
    run("--server", router, "create", name, "-n", "100000", "-p", "0.01",
        "--shards", "4", expect=0)


def recreate(router, name):
    """Drop the filter and make a new one of the same name: every key gone."""
    run("--server", router, "drop", name, expect=0)
    create(router, name)


def state_next(path):
    lines = dict(l.split(" ", 1) for l in open(path).read().splitlines()
                 if l and not l.startswith("#"))
    return int(lines["next"])


def rounds_json(r):
    try:
        return [json.loads(l) for l in r.stdout.splitlines()]
    except ValueError:
        fail("not JSON lines: %r" % r.stdout)


def mode_cli():
    r1, r2 = cluster()
    create(r1, "can")
    state = os.path.join(WORK, "can.state")
    servers = "%s,%s" % (r1, r2)

    r = run("canary", "can", "--server", servers, "--once", "--state", state, expect=0)
    if not re.search(r"^round 1: added bloomgrid-canary/cli/0 through %s; 1 of 1 keys "
                     r"asked of 2 routers: 0 false negatives, 0 errors$" % re.escape(r1),
                     r.stdout, re.M):
        fail("--once: %r" % r.stdout)
    if state_next(state) != 1:
        fail("state after one round: %r" % open(state).read())

    r = run("canary", "can", "--server", servers, "--rounds", "3", "--interval", "10ms",
            "--state", state, "--json", expect=0)
    rounds = rounds_json(r)
    if len(rounds) != 3:
        fail("--rounds 3 printed %d rounds: %r" % (len(rounds), r.stdout))
    for i, o in enumerate(rounds):
        keys = 2 + i                       # key 0 from before, then one a round
        if (o["added"] != PREFIX + "cli/%d" % (keys - 1) or o["keys"] != keys or
                o["picked"] != keys or o["checked"] != 2 * keys or
                o["false_negatives"] or o["errors"] or o["events"]):
            fail("round %d: %r" % (i + 1, o))
    if [o["added_through"] for o in rounds] != [r1, r2, r1]:
        fail("the routers do not take turns adding: %r" % rounds)
    if state_next(state) != 4:
        fail("state after four rounds: %r" % open(state).read())

    # The keys are really there, as any client sees them.
    r = run("--server", r2, "check", "can", *[PREFIX + "cli/%d" % i for i in range(4)],
            expect=0)

    # A restarted canary asks for the keys of the runs before it: all five.
    r = run("canary", "can", "--server", servers, "--once", "--state", state,
            "--json", expect=0)
    o = rounds_json(r)[0]
    if o["picked"] != 5 or o["checked"] != 10:
        fail("restarted canary: %r" % o)

    # --check bounds a round: the newest half and a sample.
    r = run("canary", "can", "--server", r1, "--once", "--state", state, "--check", "2",
            "--json", expect=0)
    o = rounds_json(r)[0]
    if o["keys"] != 6 or o["picked"] != 2 or o["checked"] != 2:
        fail("--check 2: %r" % o)

    # A router that is down: errors, not false negatives; the key is not
    # recorded when its add failed.
    stop("router1")
    r = run("canary", "can", "--server", "%s,%s" % (r2, r1), "--once", "--state", state,
            "--json", expect=2)
    o = rounds_json(r)[0]
    if (o["added"] is not None or o["false_negatives"] or o["errors"] != 2 or
            {e["router"] for e in o["events"]} != {r2} or
            any(e["code"] != "UNAVAILABLE" for e in o["events"])):
        fail("a router down: %r" % o)
    if state_next(state) != 6:
        fail("a failed add moved the state: %r" % open(state).read())
    if "failed call" not in r.stderr:
        fail("a router down: %r" % r.stderr)
    r = run("canary", "can", "--server", "%s,%s" % (r1, r2), "--once", "--state", state,
            expect=2)
    if "MayContain through %s failed: UNAVAILABLE" % r2 not in r.stderr or \
            "FALSE NEGATIVE" in r.stdout:
        fail("a router down (text): %r %r" % (r.stdout, r.stderr))
    if state_next(state) != 7:
        fail("state after an add through the router still up: %r" % open(state).read())

    # In a loop the canary goes on past failed calls; SIGTERM ends it after
    # its round, with the whole run's exit status.
    loop = subprocess.Popen([BG, "canary", "can", "--server", "%s,%s" % (r1, r2),
                             "--interval", "20ms", "--state", state], cwd=WORK,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for _ in range(1200):
        if state_next(state) >= 10 or loop.poll() is not None:
            break
        time.sleep(0.05)
    loop.terminate()
    out, err = loop.communicate()
    if loop.returncode != 2 or state_next(state) < 10:
        fail("loop: exit %d, state %d: %r %r" % (loop.returncode, state_next(state), out, err))
    n = len(re.findall(r"^round \d+: ", out, re.M))
    if n < 5 or not re.search(r"^total: %d rounds, \d+ keys acknowledged, " % n, out, re.M):
        fail("loop output: %r" % out)


def mode_detect():
    r1, r2 = cluster()
    create(r1, "can")
    state = os.path.join(WORK, "can.state")
    servers = "%s,%s" % (r1, r2)
    run("canary", "can", "--server", servers, "--rounds", "3", "--interval", "1ms",
        "--state", state, "--name", "t1", expect=0)

    recreate(r1, "can")
    r = run("canary", "can", "--server", servers, "--once", "--state", state,
            "--name", "t1", expect=1)
    for k in range(3):
        for router in (r1, r2):
            line = "FALSE NEGATIVE\t%st1/%d\tthrough %s:" % (PREFIX, k, router)
            if line not in r.stdout:
                fail("false negative of key %d through %s not named: %r" %
                     (k, router, r.stdout))
    if "%st1/3\t" % PREFIX in r.stdout:
        fail("the key added this round reads no: %r" % r.stdout)
    if "6 false negatives" not in r.stdout or "false negative" not in r.stderr:
        fail("summary: %r %r" % (r.stdout, r.stderr))

    # The same in JSON, through one router, in a loop of rounds: exit 1 at
    # the end, every round reporting.
    r = run("canary", "can", "--server", r2, "--rounds", "2", "--interval", "1ms",
            "--state", state, "--name", "t1", "--json", expect=1)
    rounds = rounds_json(r)
    fns = sorted(e["false_negative"] for e in rounds[0]["events"])
    if fns != [PREFIX + "t1/%d" % k for k in range(3)] or rounds[1]["total_false_negatives"] != 6:
        fail("JSON false negatives: %r" % rounds)


def scrape(maddr):
    with urllib.request.urlopen("http://%s/metrics" % maddr, timeout=10) as r:
        return list(text_string_to_metric_families(r.read().decode()))


def canary_values(maddr, filt):
    out = {}
    for f in scrape(maddr):
        for s in f.samples:
            if s.name.startswith("bloomgrid_canary_") and s.labels.get("filter") == filt:
                out[s.name[len("bloomgrid_canary_"):-len("_total")]] = s.value
    return out


def wait_for(maddr, filt, cond, what):
    """Scrape until cond(values) holds (at most a minute: a hung router)."""
    for _ in range(1200):
        v = canary_values(maddr, filt)
        if v and cond(v):
            return v
        time.sleep(0.05)
    fail("router canary: %s never happened: %r" % (what, canary_values(maddr, filt)))


def start_canary_router(state):
    return start("canary-router", ROUTER, "--topology", os.path.join(WORK, "topo.ini"),
                 "--canary-filter", "can", "--canary-interval-ms", "100",
                 "--canary-state-file", state, metrics=True)


def mode_router():
    (admin,) = cluster(routers=1)
    state = os.path.join(WORK, "router-canary.state")
    addr, maddr = start_canary_router(state)
    # Before the filter exists: the series, at 0 but for the errors of the
    # rounds that found no filter.
    v = canary_values(maddr, "can")
    if sorted(v) != ["adds", "checks", "errors", "false_negatives"] or \
            v["adds"] or v["checks"] or v["false_negatives"]:
        fail("canary series at start: %r" % v)
    create(admin, "can")
    v = wait_for(maddr, "can", lambda v: v["adds"] >= 3 and v["checks"] >= 6,
                 "three rounds")
    if v["false_negatives"]:
        fail("false negatives before anything went wrong: %r" % v)
    # The router's keys are in the filter, as any client sees them.
    run("--server", admin, "check", "can", PREFIX + "router/0", PREFIX + "router/1",
        expect=0)

    recreate(admin, "can")
    wait_for(maddr, "can", lambda v: v["false_negatives"] > 0, "a false negative")

    # Restarted with its state file, the router asks for the keys of its
    # earlier run: with the filter made again while it was down, they read "no".
    stop("canary-router")
    before = state_next(state)
    if before < 3:
        fail("router state file: %r" % open(state).read())
    recreate(admin, "can")
    addr, maddr = start_canary_router(state)
    v = wait_for(maddr, "can", lambda v: v["false_negatives"] > 0,
                 "a false negative of the keys of the earlier run")
    if state_next(state) <= before:
        fail("restarted router: state %r, %d before" % (open(state).read(), before))

    # The alert and the dashboard name the series the router serves.
    served = {s.name for f in scrape(maddr) for s in f.samples
              if s.name.startswith("bloomgrid_canary_")}
    rules = yaml.safe_load(open(os.path.join(ROOT, "deploy/prometheus/alerts.yml")))
    rule = [r for g in rules["groups"] for r in g["rules"]
            if r.get("alert") == "BloomgridCanaryFalseNegative"]
    if len(rule) != 1:
        fail("alerts.yml: no BloomgridCanaryFalseNegative rule")
    rule = rule[0]
    if "for" in rule or rule["labels"].get("severity") != "critical":
        fail("BloomgridCanaryFalseNegative must page at once: %r" % rule)
    named = set(re.findall(r"\bbloomgrid_canary_[a-z_]+", rule["expr"]))
    if named != {"bloomgrid_canary_false_negatives_total"}:
        fail("BloomgridCanaryFalseNegative: %r" % rule["expr"])
    for rel in ("deploy/prometheus/alerts.yml", "deploy/grafana/bloomgrid.json"):
        text = open(os.path.join(ROOT, rel)).read()
        names = set(re.findall(r"\bbloomgrid_canary_[a-z_]+", text))
        if "bloomgrid_canary_false_negatives_total" not in names or not names <= served:
            fail("%s names %r; the router serves %r" % (rel, names, served))
    doc = open(os.path.join(ROOT, "docs/METRICS.md")).read()
    for name in served:
        if "`%s`" % name not in doc:
            fail("%s is served but not in docs/METRICS.md" % name)


def expect_refused(args, why, env=None):
    r = run(*args, env=env)
    if r.returncode != 2 or why not in r.stderr or not r.stderr.startswith("bloomgrid: "):
        fail("bloomgrid %s: exit %d, expected 2 and %r: %r" %
             (" ".join(args), r.returncode, why, r.stderr))


def mode_options():
    server = "127.0.0.1:1"      # never called: every case stops before
    state = os.path.join(WORK, "x.state")
    env = dict(os.environ)
    env.pop("BLOOMGRID_SERVER", None)
    cases = [
        (["canary", "can", "--once"], "no router: give --server"),
        (["canary", "--server", server], "canary: missing FILTER"),
        (["canary", "a", "b", "--server", server], "canary: too many arguments"),
        (["canary", "a/b", "--server", server], "filter name \"a/b\""),
        (["canary", "can", "--server", server, "--interval", "0"], "--interval must be"),
        (["canary", "can", "--server", server, "--interval", "5x"], "--interval must be"),
        (["canary", "can", "--server", server, "--interval", "25h"], "--interval must be"),
        (["canary", "can", "--server", server, "--check", "0"], "--check must be a whole number from 1 to 100000"),
        (["canary", "can", "--server", server, "--check", "100001"], "--check must be"),
        (["canary", "can", "--server", server, "--rounds", "0"], "--rounds must be"),
        (["canary", "can", "--server", server, "--rounds", "-3"], "--rounds must be"),
        (["canary", "can", "--server", server, "--once", "--rounds", "2"], "--once or --rounds N, not both"),
        (["canary", "can", "--server", server, "--name", "a/b"], "--name \"a/b\""),
        (["canary", "can", "--server", server, "--name", ""], "--name \"\""),
        (["canary", "can", "--server", server, "--colour"], "unknown option '--colour'"),
        (["canary", "can", "--server", server, "--interval"], "needs a value"),
        (["canary", "can", "--server", "nohost"], "--server must be HOST:PORT"),
        (["canary", "can", "--server", "%s,bad" % server], "--server must be HOST:PORT"),
        (["canary", "can", "--server", ","], "names no router"),
    ]
    for args, why in cases:
        expect_refused(args[:1] + ["--state", state] + args[1:], why, env=env)
    if os.path.exists(state):
        fail("a refused run wrote the state file")

    # State files: another filter's, another canary's, a damaged one.
    with open(state, "w") as f:
        f.write("filter other\ncanary cli\nnext 5\n")
    expect_refused(["canary", "can", "--server", server, "--state", state],
                   "is for filter \"other\", not \"can\"")
    expect_refused(["canary", "other", "--server", server, "--state", state, "--name", "n2"],
                   "is for canary \"cli\", not \"n2\"")
    with open(state, "w") as f:
        f.write("filter can\ncanary cli\nnext five\n")
    expect_refused(["canary", "can", "--server", server, "--state", state],
                   "line 3: next \"five\" is not a whole number")
    if open(state).read() != "filter can\ncanary cli\nnext five\n":
        fail("a refused state file was changed")
    r = run("help", "canary", expect=0)
    if "bloomgrid-canary/NAME/SEQ" not in r.stdout:
        fail("help canary: %r" % r.stdout)
    if "canary " not in run("--help", expect=0).stdout:
        fail("--help does not list canary")

    # The router's settings.
    topo = os.path.join(WORK, "topo.ini")
    with open(topo, "w") as f:
        f.write("version = 1\n[group g0]\ncopies = 127.0.0.1:1\n")
    with open(os.path.join(WORK, "r.state"), "w") as f:
        f.write("filter can\ncanary router\nnext 5\n")
    bad = [
        (["--canary-filter", "a/b"], "canary_filter: filter name \"a/b\""),
        (["--canary-filter", "can", "--canary-interval-ms", "99"],
         "canary_interval_ms must be an integer in 100..86400000"),
        (["--canary-filter", "can", "--canary-check-keys", "0"],
         "canary_check_keys must be an integer in 1..100000"),
        (["--canary-filter", "can", "--canary-name", "x y"], "canary_name \"x y\""),
        (["--canary-state-file", "r.state"], "canary_state_file is set but canary_filter is not"),
        (["--canary-filter", "other", "--canary-state-file", "r.state"],
         "is for filter \"can\", not \"other\""),
    ]
    for args, why in bad:
        r = subprocess.run([ROUTER, "--listen", "127.0.0.1:0", "--topology", topo] + args,
                           cwd=WORK, capture_output=True, text=True, timeout=60)
        if r.returncode != 2 or why not in r.stderr or "listening on" in r.stdout:
            fail("router %s: exit %d, expected 2 and %r: %r" %
                 (" ".join(args), r.returncode, why, r.stderr))


try:
    {"cli": mode_cli, "detect": mode_detect, "router": mode_router,
     "options": mode_options}[MODE]()
    print("ok")
finally:
    for tag in list(PROCS):
        stop(tag)
    if not os.environ.get("KEEP"):
        shutil.rmtree(WORK, ignore_errors=True)
