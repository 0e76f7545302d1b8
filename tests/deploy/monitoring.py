#!/usr/bin/python3
"""Checks of the Grafana dashboard (deploy/grafana/bloomgrid.json).

usage: monitoring.py SRC PROMTOOL TMP

Every query of every panel is filtered by the dashboard's $job variable
(each series selector holds job=~"$job"), and is valid PromQL: the queries,
with $__rate_interval and $job given values, are written as recording
rules and checked with `promtool check rules`.  That the families they
name are served is checked against real processes by
tests/integ/test_metrics.py.  Exit 0 pass, 1 fail.
"""
import json
import os
import re
import subprocess
import sys

SRC, PROMTOOL, TMP = sys.argv[1:4]
DASH = os.path.join(SRC, "deploy", "grafana", "bloomgrid.json")
# A series selector: a metric name of the processes (or Prometheus's up)
# not followed by "(" (a function) and not inside a label list.
METRIC = re.compile(r"\b(bloomgrid_[a-z0-9_]+|process_[a-z0-9_]+|up)\b(?!\s*\()")

failures = []


def fail(msg):
    failures.append(msg)
    print("FAIL: " + msg)


def selectors(expr):
    """(metric, label matchers or None) of every series selector of expr."""
    out = []
    # Label lists and ranges hold no selector: skip them as we go.
    i = 0
    while i < len(expr):
        m = METRIC.match(expr, i) if (i == 0 or not re.match(r"[A-Za-z0-9_:]", expr[i - 1])) else None
        if m and not re.search(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*$",
                               expr[:i]):
            j = m.end()
            labels = None
            if j < len(expr) and expr[j] == "{":
                k = expr.index("}", j)
                labels = expr[j + 1:k]
                j = k + 1
            out.append((m.group(1), labels))
            i = j
            continue
        if expr[i] == "{":
            i = expr.index("}", i) + 1
            continue
        if expr[i] == '"':
            i = expr.index('"', i + 1) + 1
            continue
        i += 1
    return out


def main():
    with open(DASH) as f:
        dash = json.load(f)
    var = [v for v in dash["templating"]["list"] if v["name"] == "job"]
    if len(var) != 1 or not var[0].get("includeAll") or not var[0].get("multi"):
        fail("the dashboard has no multi-value $job variable with All")
    queries = [(p["title"], t["refId"], t["expr"]) for p in dash["panels"]
               for t in p.get("targets", [])]
    rules = []
    before = len(failures)
    for title, ref, expr in queries:
        sel = selectors(expr)
        if not sel:
            fail("%s %s: no series selector found in %r" % (title, ref, expr))
        for name, labels in sel:
            if labels is None or not re.search(r'(^|,)\s*job\s*=~\s*"\$job"\s*(,|$)', labels):
                fail("%s %s: %s is not filtered by $job: %r" % (title, ref, name, expr))
        rules.append({"record": "dashboard:q%d" % len(rules),
                      "expr": expr.replace("$__rate_interval", "5m").replace("$job", ".+")})
    if len(failures) == before:
        print("ok: %d queries, every series selector filtered by $job" % len(queries))

    os.makedirs(TMP, exist_ok=True)
    path = os.path.join(TMP, "dashboard-queries.yml")
    with open(path, "w") as f:
        json.dump({"groups": [{"name": "dashboard", "rules": rules}]}, f, indent=1)
    r = subprocess.run([PROMTOOL, "check", "rules", path], capture_output=True, text=True)
    if r.returncode != 0:
        fail("the dashboard's queries are not valid PromQL: %s%s" % (r.stdout, r.stderr))
    else:
        print("ok: promtool parses the %d queries" % len(rules))


main()
if failures:
    print("%d check(s) failed" % len(failures))
    sys.exit(1)
print("all checks passed")
