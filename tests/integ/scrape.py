#!/usr/bin/python3
"""GET http://ADDR/metrics and print the value of one sample per request,
parsed with prometheus_client (Debian's python3-prometheus-client): for the
C tests, which read metrics through it.

usage: scrape.py ADDR NAME SELECTOR ...
  SELECTOR  LABEL=VALUE[,LABEL=VALUE...]: the sample of NAME with all these
            labels (e.g. bloomgrid_antientropy_pages_total peer=127.0.0.1:5,
            bloomgrid_filter_bytes filter=users,shard=3); "" takes the
            first sample of NAME, whatever its labels
Prints one value per selector, one per line, "nan" for a sample that is not
served; exit 1 when the endpoint does not answer, 2 on a malformed selector.
"""
import sys
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

addr, name = sys.argv[1], sys.argv[2]
wants = []
for arg in sys.argv[3:]:
    try:
        wants.append(dict(kv.split("=", 1) for kv in arg.split(",")) if arg else {})
    except ValueError:
        print("scrape.py: selector %r: expected LABEL=VALUE[,LABEL=VALUE...]" % arg,
              file=sys.stderr)
        sys.exit(2)
try:
    with urllib.request.urlopen("http://%s/metrics" % addr, timeout=10) as r:
        text = r.read().decode()
except OSError as e:
    print("scrape.py: %s: %s" % (addr, e), file=sys.stderr)
    sys.exit(1)
samples = [s for f in text_string_to_metric_families(text) for s in f.samples
           if s.name == name]
for want in wants:
    found = [s.value for s in samples
             if all(s.labels.get(k) == v for k, v in want.items())]
    print(found[0] if found else "nan")
