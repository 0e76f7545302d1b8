#!/usr/bin/python3
"""Load for the slugs service: signups with a realistic mix, timed.

A signup is what a sign-up form does:
  new    (most): a slug no one has: GET /slugs/SLUG says free, then
                 POST /slugs/SLUG creates it (201)
  taken        : a slug created earlier in the run: GET says taken, the
                 user picks another (no POST)
  retry        : the POST of the slug this client just created, sent again
                 (a double click, a client retrying after a timeout): 409

Prints the outcomes, the database reads the filter saved, the false positives
met, and the p50/p99 of a signup (from the first request to the last answer),
from the service's /stats before and after the run.  Any answer that is wrong
for its kind (a taken slug said free, a new slug refused, an error) is counted
as unexpected, and the exit status is then 1.

Standard library only.  See README.md beside this file.
"""
import argparse
import http.client
import json
import random
import sys
import threading
import time
import urllib.parse

ADJ = ("brave calm eager fancy gentle happy jolly kind lively merry nice proud "
       "quick silly witty zany bold bright clever cosmic").split()
NOUN = ("otter panda falcon lynx heron badger koala raven tiger whale bison "
        "gecko moose llama crane yak newt ibis orca puma").split()


class Client:
    """One keep-alive HTTP connection."""

    def __init__(self, host, port, timeout):
        self.host, self.port, self.timeout = host, port, timeout
        self.conn = None

    def call(self, method, path):
        for attempt in (0, 1):
            if self.conn is None:
                self.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            try:
                self.conn.request(method, path)
                r = self.conn.getresponse()
                body = r.read()
                return r.status, (json.loads(body) if body else {})
            except (ConnectionError, http.client.HTTPException):
                # A keep-alive connection closed by the server between two
                # requests: once more on a new one.
                self.conn.close()
                self.conn = None
                if attempt:
                    raise


class Run:
    def __init__(self, a, host, port):
        self.a, self.host, self.port = a, host, port
        self.lock = threading.Lock()
        self.created = []           # slugs created in this run (taken from then on)
        self.counter = 0
        self.run_id = "%x" % random.SystemRandom().getrandbits(24)
        self.latencies = []
        self.outcomes = dict(new=0, created=0, taken=0, refused_taken=0, retry=0,
                             refused_retry=0, unexpected=0)
        self.unexpected = []
        self.next_signup = 0

    def new_slug(self, rng):
        with self.lock:
            self.counter += 1
            n = self.counter
        return "%s-%s-%s%d" % (rng.choice(ADJ), rng.choice(NOUN), self.run_id, n)

    def wrong(self, kind, slug, status, body):
        with self.lock:
            self.outcomes["unexpected"] += 1
            if len(self.unexpected) < 10:
                self.unexpected.append("%s %s: %d %s" % (kind, slug, status, body))

    def signup(self, c, rng, mine, timed):
        r = rng.random()
        with self.lock:
            pool = len(self.created)
        if r < self.a.retry and mine:
            kind, slug = "retry", mine[-1]
        elif r < self.a.retry + self.a.taken and pool:
            kind = "taken"
            with self.lock:
                slug = self.created[rng.randrange(len(self.created))]
        else:
            kind, slug = "new", self.new_slug(rng)
        path = "/slugs/" + slug
        t0 = time.perf_counter()
        if kind == "retry":
            st, body = c.call("POST", path)
            ok = st == 409
            outcome = "refused_retry"
        else:
            st, body = c.call("GET", path)
            if st != 200:
                ok = False
            elif kind == "taken":
                ok = body.get("free") is False
                outcome = "refused_taken"
            elif body.get("free") is not True:
                ok = False
            else:
                st, body = c.call("POST", path)
                ok = st == 201
                outcome = "created"
        dt = time.perf_counter() - t0
        with self.lock:
            self.outcomes[kind] += 1
            if timed:
                self.latencies.append(dt)
            if ok:
                self.outcomes[outcome] += 1
                if outcome == "created":
                    self.created.append(slug)
        if not ok:
            self.wrong(kind, slug, st, body)
        elif kind == "new":
            mine.append(slug)

    def worker(self, seed, total, timed):
        rng = random.Random(seed)
        c = Client(self.host, self.port, self.a.timeout)
        mine = []
        while True:
            with self.lock:
                if self.next_signup >= total:
                    return
                self.next_signup += 1
            try:
                self.signup(c, rng, mine, timed)
            except (OSError, http.client.HTTPException, ValueError) as e:
                self.wrong("request", "-", 0, "%s: %s" % (type(e).__name__, e))

    def phase(self, total, timed):
        self.next_signup = 0
        threads = [threading.Thread(target=self.worker, args=(self.a.seed * 1000 + i, total, timed))
                   for i in range(self.a.concurrency)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return time.perf_counter() - t0


def stats(host, port, timeout):
    st, body = Client(host, port, timeout).call("GET", "/stats")
    if st != 200:
        sys.exit("load: GET /stats answered %d" % st)
    return body


def pct(sorted_vals, p):
    if not sorted_vals:
        return 0.0
    i = min(len(sorted_vals) - 1, max(0, int(round(p / 100.0 * len(sorted_vals) + 0.5)) - 1))
    return sorted_vals[i]


def one_run(a, url, seed):
    """Warm up, then a timed run against url; returns the result dict."""
    u = urllib.parse.urlsplit(url)
    host, port = u.hostname, u.port or 80
    a.seed = seed
    run = Run(a, host, port)
    try:
        stats(host, port, a.timeout)
    except OSError as e:
        sys.exit("load: %s: %s" % (url, e))
    if a.warmup:
        saved = (a.taken, a.retry)
        a.taken = a.retry = 0.0
        run.phase(a.warmup, timed=False)
        a.taken, a.retry = saved
        for k in run.outcomes:  # the warmup's errors still count
            if k != "unexpected":
                run.outcomes[k] = 0
    before = stats(host, port, a.timeout)
    elapsed = run.phase(a.signups, timed=True)
    after = stats(host, port, a.timeout)
    d = {k: after[k] - before[k] for k in after
         if isinstance(after[k], (int, float)) and k in before}
    lat = sorted(run.latencies)
    return {
        "url": url, "signups": a.signups, "seconds": round(elapsed, 3),
        "signups_per_second": round(a.signups / elapsed, 1) if elapsed else 0,
        "concurrency": a.concurrency, "outcomes": run.outcomes,
        "questions": d["checks"] + d["creates"], "db_reads": d["db_reads"],
        "db_reads_avoided": d["db_reads_avoided"],
        "false_positives": d["false_positives"], "maybe_answers": d["filter_maybe"],
        "filter_unanswered": d["filter_unknown"],
        "p50_ms": round(pct(lat, 50) * 1000, 3), "p99_ms": round(pct(lat, 99) * 1000, 3),
        "db_ms_per_signup": round(d["db_seconds"] * 1000 / a.signups, 3),
        "filter_ms_per_signup": round(d["filter_seconds"] * 1000 / a.signups, 3),
        "unexpected_examples": run.unexpected,
    }


def report(r):
    o = r["outcomes"]
    print("signups: %d in %.2f s (%.0f/s), %d at once"
          % (r["signups"], r["seconds"], r["signups_per_second"], r["concurrency"]))
    print("  new %d (created %d), taken %d (refused %d), retried %d (refused %d), "
          "unexpected %d" % (o["new"], o["created"], o["taken"], o["refused_taken"],
                             o["retry"], o["refused_retry"], o["unexpected"]))
    q = r["questions"]
    print("database reads avoided: %d of %d questions (%.1f%%)"
          % (r["db_reads_avoided"], q, 100.0 * r["db_reads_avoided"] / q if q else 0.0))
    print("false positives met: %d (of %d \"maybe\" answers)"
          % (r["false_positives"], r["maybe_answers"]))
    if r["filter_unanswered"]:
        print("filter not asked or no answer (database read instead): %d"
              % r["filter_unanswered"])
    print("signup latency: p50 %.2f ms, p99 %.2f ms" % (r["p50_ms"], r["p99_ms"]))
    print("service time per signup: database %.3f ms, filter %.3f ms"
          % (r["db_ms_per_signup"], r["filter_ms_per_signup"]))
    for u in r["unexpected_examples"]:
        print("unexpected: " + u)


def compare(runs, urls, labels):
    """Median (min-max) of every URL's rounds, one row each."""
    def med(vals):
        v = sorted(vals)
        return v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2

    print("%d rounds, alternating; median (min-max)" % len(runs[urls[0]]))
    print("| service | signups/s | p50 ms | p99 ms | reads avoided | false positives |")
    print("|---|---:|---:|---:|---:|---:|")
    for u in urls:
        rs = runs[u]
        cells = []
        for k, fmt in (("signups_per_second", "%.0f"), ("p50_ms", "%.2f"), ("p99_ms", "%.1f")):
            vals = [r[k] for r in rs]
            cells.append((fmt + " (" + fmt + "-" + fmt + ")") % (med(vals), min(vals), max(vals)))
        avoided = sum(r["db_reads_avoided"] for r in rs)
        questions = sum(r["questions"] for r in rs)
        cells.append("%.1f%%" % (100.0 * avoided / questions if questions else 0.0))
        cells.append("%d of %d" % (sum(r["false_positives"] for r in rs),
                                   sum(r["maybe_answers"] for r in rs)))
        print("| %s | %s |" % (labels[u], " | ".join(cells)))


def main():
    p = argparse.ArgumentParser(prog="load.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--url", action="append",
                   help="the service (default http://127.0.0.1:8080), or "
                        "LABEL=URL; given more than once, the services are run in "
                        "turn, round by round, and compared in one table")
    p.add_argument("--rounds", type=int, default=1,
                   help="rounds per service, alternating (default 1)")
    p.add_argument("--signups", type=int, default=2000, help="timed signups (default 2000)")
    p.add_argument("--warmup", type=int, default=200,
                   help="untimed new signups first, so some slugs are taken (default 200)")
    p.add_argument("--concurrency", type=int, default=8,
                   help="signups at once, one connection each (default 8)")
    p.add_argument("--taken", type=float, default=0.10,
                   help="share of signups for a taken slug (default 0.10)")
    p.add_argument("--retry", type=float, default=0.05,
                   help="share of signups that repeat a create (default 0.05)")
    p.add_argument("--seed", type=int, default=1, help="random seed of the mix (default 1)")
    p.add_argument("--timeout", type=float, default=30.0, help="per request, seconds (default 30)")
    p.add_argument("--json", action="store_true", help="print one JSON object per run instead")
    a = p.parse_args()
    urls, labels = [], {}
    for spec in a.url or ["http://127.0.0.1:8080"]:
        label, sep, url = spec.partition("=")
        if not sep or "://" in label:
            label, url = spec, spec
        urls.append(url)
        labels[url] = label
    if not (0 <= a.taken and 0 <= a.retry and a.taken + a.retry <= 1):
        p.error("--taken and --retry are shares between 0 and 1, together at most 1")
    if a.signups < 1 or a.concurrency < 1 or a.warmup < 0 or a.rounds < 1:
        p.error("--signups, --concurrency and --rounds at least 1, --warmup at least 0")
    for url in urls:
        u = urllib.parse.urlsplit(url)
        if u.scheme != "http" or not u.hostname:
            p.error("--url must be http://HOST:PORT, got %r" % url)

    seed0 = a.seed
    runs = {u: [] for u in urls}
    bad = 0
    for rnd in range(a.rounds):
        for url in urls:
            r = one_run(a, url, seed0 + rnd)
            runs[url].append(r)
            bad += r["outcomes"]["unexpected"]
            if a.json:
                print(json.dumps(r), flush=True)
            elif len(urls) == 1 and a.rounds == 1:
                report(r)
            else:
                print("round %d, %s: %.0f signups/s, p50 %.2f ms, p99 %.1f ms, "
                      "reads avoided %d of %d, unexpected %d"
                      % (rnd + 1, labels[url], r["signups_per_second"], r["p50_ms"], r["p99_ms"],
                         r["db_reads_avoided"], r["questions"], r["outcomes"]["unexpected"]),
                      flush=True)
                for e in r["unexpected_examples"]:
                    print("unexpected: " + e)
    if not a.json and (len(urls) > 1 or a.rounds > 1):
        compare(runs, urls, labels)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
