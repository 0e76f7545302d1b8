#!/usr/bin/env python3
"""The Redis door's security and budgets on a real node: tokens (AUTH,
roles, a token removed at SIGHUP), TLS (redis-cli --tls, a plaintext client
refused, the certificate renewed at SIGHUP for new connections), the
listening rule (a non-loopback resp_listen without TLS and tokens is
refused), and the metrics of the door on /metrics.

usage: test_resp_door.py NODE_BIN GEN_CERTS_SH PART
PART: tokens | tls | rule | metrics"""
import hashlib
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request

import resplib

NODE, GEN = sys.argv[1], sys.argv[2]
PART = sys.argv[3]
work = resplib.workdir("resp-door-")


def check(cond, msg):
    if not cond:
        resplib.fail(msg)


def tokens_file(path, entries):
    with open(path, "w") as f:
        for role, name, tok in entries:
            f.write("%s %s %s\n" % (role, name, hashlib.sha256(tok.encode()).hexdigest()))


def part_tokens():
    tf = os.path.join(work, "tokens")
    tokens_file(tf, [("read", "reader", "r-secret"), ("write", "writer", "w-secret"),
                     ("admin", "boss", "a-secret")])
    n = resplib.start_node(NODE, work, ["--tokens-file", tf])
    try:
        out = resplib.cli(n.port, ["PING", "AUTH nope", "AUTH r-secret", "PING",
                                   "BF.RESERVE t 0.01 100", "AUTH default a-secret",
                                   "BF.RESERVE t 0.01 100", "AUTH w-secret",
                                   "BF.ADD t k", "BF.ADD newf k", "BF.EXISTS t k",
                                   "DEL t"])
        want = ("(error) NOAUTH Authentication required.\n"
                "(error) WRONGPASS invalid username-password pair or user is disabled.\n"
                "OK\nPONG\n"
                "(error) NOPERM this user has no permissions to run the 'bf.reserve' "
                "command (token reader has role read; it needs admin)\n"
                "OK\nOK\nOK\n(integer) 1\n"
                '(error) ERR not found: filter "newf" does not exist; creating a filter '
                "on its first add needs an admin token: create it with BF.RESERVE as "
                "an admin\n(integer) 1\n"
                "(error) NOPERM this user has no permissions to run the 'del' command "
                "(token writer has role write; it needs admin)\n")
        check(out == want, "tokens: have\n%s\nwant\n%s" % (out, want))
        # HELLO with AUTH in one go, RESP3.
        out = resplib.cli(n.port, ["HELLO 3 AUTH default a-secret", "BF.ADD auto k"])
        check('"proto" => (integer) 3' in out and out.endswith("(true)\n"), out)
        # A token removed from the file: an open connection is refused at its
        # next command once SIGHUP re-read the file.
        s = socket.create_connection((n.host, n.port))
        s.sendall(b"AUTH w-secret\r\nBF.ADD t k2\r\n")
        got = b""
        while len(got) < len(b"+OK\r\n:1\r\n"):
            got += s.recv(100)
        check(got == b"+OK\r\n:1\r\n", "AUTH, BF.ADD: %r" % got)
        tokens_file(tf, [("admin", "boss", "a-secret")])
        n.p.send_signal(signal.SIGHUP)
        deadline = time.time() + 10
        got = b""
        while time.time() < deadline:
            s.sendall(b"BF.EXISTS t k\r\n")
            got = s.recv(200)
            if got.startswith(b"-NOAUTH"):
                break
            time.sleep(0.1)
        check(got.startswith(b"-NOAUTH"), "a removed token still works: %r" % got)
        s.close()
    finally:
        n.stop()


def peer_cert(port, ca):
    ctx = ssl.create_default_context(cafile=ca)
    with socket.create_connection(("127.0.0.1", port)) as raw:
        with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
            s.sendall(b"PING\r\n")
            return s.recv(100), s.getpeercert(binary_form=True)


def part_tls():
    certs = os.path.join(work, "certs")
    subprocess.run(["sh", GEN, certs], check=True)
    live = os.path.join(work, "live")
    os.makedirs(live)
    for f in ("node.pem", "node.key", "ca.pem"):
        shutil.copy(os.path.join(certs, f), live)
    c = lambda f: os.path.join(live, f)
    n = resplib.start_node(NODE, work, ["--tls-cert", c("node.pem"), "--tls-key",
                                        c("node.key"), "--tls-ca", c("ca.pem"),
                                        "--internal-listen", "127.0.0.1:0"])
    try:
        out = resplib.cli(n.port, ["PING", "BF.ADD f k", "BF.EXISTS f k"],
                          extra=["--tls", "--cacert", os.path.join(certs, "ca.pem")])
        check(out == "PONG\n(integer) 1\n(integer) 1\n", "redis-cli --tls: %s" % out)
        # A plaintext client gets no answer from a TLS port.
        s = socket.create_connection((n.host, n.port))
        s.settimeout(5)
        s.sendall(b"PING\r\n")
        try:
            got = s.recv(100)
        except (socket.timeout, ConnectionResetError):
            got = b""
        check(b"PONG" not in got, "a plaintext client was answered: %r" % got)
        s.close()
        reply, first = peer_cert(n.port, os.path.join(certs, "ca.pem"))
        check(reply == b"+PONG\r\n", "python ssl: %r" % reply)
        # Renew: node-b (signed by other-ca) replaces the files; SIGHUP.
        shutil.copy(os.path.join(certs, "node-b.pem"), c("node.pem"))
        shutil.copy(os.path.join(certs, "node-b.key"), c("node.key"))
        shutil.copy(os.path.join(certs, "other-ca.pem"), c("ca.pem"))
        n.p.send_signal(signal.SIGHUP)
        deadline = time.time() + 10
        second = None
        while time.time() < deadline:
            try:
                reply, second = peer_cert(n.port, os.path.join(certs, "other-ca.pem"))
                break
            except ssl.SSLError:
                time.sleep(0.1)
        check(second is not None and second != first,
              "the renewed certificate is not served: %s" % n.log()[-2000:])
    finally:
        n.stop()


def part_rule():
    for extra, want in ((["--resp-listen", "0.0.0.0:0"], "is not a loopback address"),
                        (["--resp-listen", "127.0.0.1:1:2"], "resp_listen")):
        args = [NODE, "--listen", "127.0.0.1:0", "--data-dir",
                os.path.join(work, "d"), "--durability", "none"] + extra
        r = subprocess.run(args, capture_output=True, text=True, timeout=30)
        check(r.returncode == 2 and want in r.stderr,
              "%s: exit %d, %s" % (extra, r.returncode, r.stderr))
    # With --insecure it starts (warned about).
    n = resplib.Server([NODE, "--listen", "127.0.0.1:0", "--data-dir",
                        os.path.join(work, "d2"), "--durability", "none",
                        "--resp-listen", "0.0.0.0:0", "--insecure"], "insecure", work)
    try:
        check("--insecure: serving resp_listen 0.0.0.0:0" in n.log(), n.log())
        out = resplib.cli(n.port, ["PING"])
        check(out == "PONG\n", out)
    finally:
        n.stop()


def scrape(maddr):
    return urllib.request.urlopen("http://%s/metrics" % maddr, timeout=10).read().decode()


def metric(text, name, labels=""):
    m = re.search(r"^%s%s (\S+)$" % (re.escape(name), re.escape(labels)), text, re.M)
    return float(m.group(1)) if m else None


def part_metrics():
    n = resplib.start_node(NODE, work, ["--metrics-listen", "127.0.0.1:0"])
    try:
        maddr = re.search(r" metrics on (\S+)", open(n.out.name).read()).group(1)
        before = scrape(maddr)
        check(metric(before, "bloomgrid_resp_commands_total", '{command="bf.add"}') == 0,
              "bf.add's counter does not start at 0")
        resplib.cli(n.port, ["BF.ADD m a", "BF.ADD m b", "BF.EXISTS m a",
                             "BF.EXISTS nosuch a", "NOPE"])
        s = socket.create_connection((n.host, n.port))
        s.sendall(b"PING\r\n")
        s.recv(10)
        text = scrape(maddr)
        s.close()
        checks = [
            ("bloomgrid_resp_commands_total", '{command="bf.add"}', 2),
            ("bloomgrid_resp_commands_total", '{command="bf.exists"}', 2),
            ("bloomgrid_resp_errors_total", '{command="bf.exists"}', 1),
            ("bloomgrid_resp_errors_total", '{command="unknown"}', 1),
            ("bloomgrid_resp_duration_seconds_count", '{command="bf.add"}', 2),
            ("bloomgrid_resp_connections", "", 1),
        ]
        for name, labels, want in checks:
            have = metric(text, name, labels)
            check(have == want, "%s%s = %s, want %s" % (name, labels, have, want))
        check(metric(text, "bloomgrid_resp_connections_total") >= 2, "connections_total")
    finally:
        n.stop()


{"tokens": part_tokens, "tls": part_tls, "rule": part_rule,
 "metrics": part_metrics}[PART]()
print("1 passed, 0 failed")
