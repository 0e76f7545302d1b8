#!/usr/bin/python3
"""GET http://ADDR/metrics and print the value of one sample per request,
parsed with prometheus_client (Debian's python3-prometheus-client): for the
C tests, which read metrics through it.

usage: scrape.py ADDR NAME LABEL=VALUE ...   (one sample each: its name
and one label, e.g. bloomgrid_antientropy_pages_total peer=127.0.0.1:5)
Prints one value per line, "nan" for a sample that is not served; exit 1
when the endpoint does not answer.
"""
import sys
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

addr, name = sys.argv[1], sys.argv[2]
try:
    with urllib.request.urlopen("http://%s/metrics" % addr, timeout=10) as r:
        text = r.read().decode()
except OSError as e:
    print("scrape.py: %s: %s" % (addr, e), file=sys.stderr)
    sys.exit(1)
samples = [s for f in text_string_to_metric_families(text) for s in f.samples
           if s.name == name]
for want in sys.argv[3:]:
    k, v = want.split("=", 1)
    found = [s.value for s in samples if s.labels.get(k) == v]
    print(found[0] if found else "nan")
