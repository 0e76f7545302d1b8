#!/usr/bin/python3
"""slugs: "is this slug free?" and "create it", answered by a Bloom filter
before the database.

A small HTTP service in front of a table of slugs (user names, short links,
page addresses).  Every question goes to a Bloom filter first, over the Redis
protocol with the standard redis client (bloomgrid's RESP door, or any server
with RedisBloom's BF.* commands):

  filter says "definitely not"  -> the slug is free: create it with no read
  filter says "maybe"           -> read the database (a false positive is a
                                   read that finds nothing)
  the slug is in the database   -> taken: refuse

"Is it free?" asks BF.MEXISTS; "create it" sends BF.ADD, whose answer is the
question (1: it was definitely not there), so a create costs one round trip
to the filter, not two.

The order that keeps the answers right:

  1. On start the filter is filled from the database (backfill).  Until that
     has finished, "definitely not" is not trusted: every question reads the
     database.
  2. A new slug is added to the filter (BF.ADD acknowledged) before its row
     is inserted, so no committed slug is ever missing from the filter.
  3. The table has a UNIQUE constraint: two requests for the same new slug can
     both hear "definitely not"; the database lets one of them in.

When the filter cannot answer (server down, timeout, any error reply: for
bloomgrid a filter that does not exist is an error, not 0), the service reads
the database: it never answers "free" without either the filter's "definitely
not" or the database.  A BF.ADD that was not acknowledged means the filter may
lack a committed slug: the service stops trusting "definitely not" and fills
the filter again from the database before it trusts it again.  A marker key
added at the end of each backfill is asked with every check (BF.MEXISTS, one
round trip): a filter that was dropped and created anew, or lost by a server
without persistence, lacks it and is filled again.

HTTP API (JSON answers):
  GET  /slugs/SLUG   200 {"slug", "free", "answered_by": "filter"|"database"}
  POST /slugs/SLUG   201 created; 409 taken; 400 not a valid slug;
                     503 database unavailable (nothing created)
  GET  /healthz      200 when the database answers (503 otherwise), with the
                     filter's state ("trusted", "filling", "unavailable", "off")
  GET  /stats        counters: checks, reads avoided, false positives, ...

A slug is 1 to 63 characters of a-z, 0-9 and '-', not starting or ending
with '-'.

Only Python's standard library plus Debian's python3-redis (and
python3-psycopg2 for PostgreSQL).  See README.md beside this file.
"""
import argparse
import http.server
import json
import queue
import re
import sqlite3
import sys
import threading
import time
import urllib.parse

SLUG_RE = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")
# Added to the filter when a backfill finishes; never a valid slug (':').
MARKER = "slugs-service:filled"


def log(msg):
    sys.stderr.write("slugs: %s\n" % msg)
    sys.stderr.flush()


class DatabaseError(Exception):
    """The database did not answer (down, timeout, locked): the request fails
    with 503 and nothing is created."""


# ---------------------------------------------------------------- database

class Database:
    """A fixed pool of connections to SQLite or PostgreSQL, and the four
    statements the service runs.  Thread-safe: a connection serves one thread
    at a time.  A connection that failed is closed and replaced."""

    def __init__(self, spec, pool_size, timeout):
        self.spec = spec
        self.timeout = timeout
        self.pool = queue.LifoQueue()
        self.slots = threading.BoundedSemaphore(pool_size)
        if spec.startswith(("postgresql://", "postgres://")):
            import psycopg2  # Debian's python3-psycopg2
            import psycopg2.errors
            self.kind = "postgresql"
            self.mod = psycopg2
            self.unique_error = psycopg2.errors.UniqueViolation
            self.param = "%s"
            self.write_lock = None
        elif spec.startswith("sqlite:"):
            self.kind = "sqlite"
            self.path = spec[len("sqlite:"):]
            if not self.path:
                raise ValueError("--db sqlite:PATH needs a path")
            self.mod = sqlite3
            self.unique_error = sqlite3.IntegrityError
            self.param = "?"
            self.write_lock = threading.Lock()
        else:
            raise ValueError("--db must be sqlite:PATH or postgresql://...: %r" % spec)
        self._run(self._create_table)

    def _connect(self):
        if self.kind == "sqlite":
            c = sqlite3.connect(self.path, timeout=self.timeout,
                                isolation_level=None, check_same_thread=False)
            c.execute("PRAGMA journal_mode=WAL")
            return c
        c = self.mod.connect(self.spec, connect_timeout=max(1, int(self.timeout)),
                             options="-c statement_timeout=%d" % int(self.timeout * 1000))
        c.autocommit = True
        return c

    def _create_table(self, c):
        ts = "TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP" if self.kind == "sqlite" \
            else "TIMESTAMPTZ NOT NULL DEFAULT now()"
        self._execute(c, "CREATE TABLE IF NOT EXISTS slugs ("
                         "slug TEXT NOT NULL UNIQUE, created_at %s)" % ts)

    def _execute(self, c, sql, args=()):
        cur = c.cursor()
        cur.execute(sql.replace("?", self.param), args)
        return cur

    def _run(self, fn):
        """fn(connection) on a pooled connection.  Raises DatabaseError when
        no connection is free within the timeout or the database fails;
        lets the unique-constraint error through."""
        if not self.slots.acquire(timeout=self.timeout):
            raise DatabaseError("no database connection free within %gs" % self.timeout)
        c = None
        try:
            try:
                c = self.pool.get_nowait()
            except queue.Empty:
                c = self._connect()
            result = fn(c)
            self.pool.put(c)
            c = None
            return result
        except self.unique_error:
            if c is not None:
                self.pool.put(c)
                c = None
            raise
        except (self.mod.Error, OSError) as e:
            raise DatabaseError("%s: %s" % (self.kind, str(e).strip())) from e
        finally:
            if c is not None:  # failed: drop it, the next call connects anew
                try:
                    c.close()
                except Exception:
                    pass
            self.slots.release()

    def exists(self, slug):
        return self._run(lambda c: self._execute(
            c, "SELECT 1 FROM slugs WHERE slug = ?", (slug,)).fetchone() is not None)

    def insert(self, slug):
        """True when inserted, False when the slug is taken (UNIQUE)."""
        # SQLite has one writer at a time; writers that meet in the file wait
        # in its busy handler, which sleeps up to 100 ms.  Queue them here.
        if self.write_lock is not None and not self.write_lock.acquire(timeout=self.timeout):
            raise DatabaseError("sqlite: no turn to write within %gs" % self.timeout)
        try:
            self._run(lambda c: self._execute(c, "INSERT INTO slugs (slug) VALUES (?)", (slug,)))
            return True
        except self.unique_error:
            return False
        finally:
            if self.write_lock is not None:
                self.write_lock.release()

    def page_after(self, last, limit):
        """Up to limit slugs greater than last, in order (keyset pages over
        the UNIQUE index: no long-running transaction, no OFFSET scan)."""
        return self._run(lambda c: [r[0] for r in self._execute(
            c, "SELECT slug FROM slugs WHERE slug > ? ORDER BY slug LIMIT ?",
            (last, limit)).fetchall()])

    def ping(self):
        self._run(lambda c: self._execute(c, "SELECT 1").fetchone())


# ------------------------------------------------------------------ filter

class Filter:
    """The Bloom filter over RESP, and whether its "definitely not" may be
    trusted.  check() and add() are called from request threads; the
    backfill runs in a thread of its own.

    trusted is True only between a finished backfill and the next failure
    that may leave a committed slug out of the filter (an unacknowledged
    BF.ADD, a filter without the marker).  gen counts those failures: a
    backfill that saw one happen while it ran starts over."""

    def __init__(self, url, name, capacity, error_rate, timeout, token=None,
                 ca=None, stats=None, batch=1000):
        import redis  # Debian's python3-redis
        self.redis_mod = redis
        kwargs = dict(max_connections=64, timeout=timeout, socket_timeout=timeout,
                      socket_connect_timeout=timeout)
        if token is not None:
            kwargs["password"] = token
        if ca is not None:
            kwargs["ssl_ca_certs"] = ca
        pool = redis.BlockingConnectionPool.from_url(url, **kwargs)
        self.client = redis.Redis(connection_pool=pool)
        self.bf = self.client.bf()
        self.url = url
        self.name = name
        self.capacity = capacity
        self.error_rate = error_rate
        self.stats = stats
        self.batch = batch
        self.lock = threading.Lock()
        self.trusted = False
        self.gen = 0
        self.state = "filling"
        self.down_until = 0.0
        self.wake = threading.Event()

    def _down(self):
        return time.monotonic() < self.down_until

    def _failed(self, what, e):
        """Any error is "no answer".  A server that cannot be reached is not
        asked again for a second, so an outage costs no connect timeout per
        request.  An error reply (a filter that does not exist, of another
        type, a quorum not reached) puts the filter itself in doubt: it is
        filled again (and created, if it is missing) before it is trusted."""
        if isinstance(e, (self.redis_mod.ConnectionError, self.redis_mod.TimeoutError)):
            self.down_until = time.monotonic() + 1.0
        elif isinstance(e, self.redis_mod.ResponseError):
            self.invalidate("%s answered an error: %s" % (what, e))
        self.stats.bump("filter_errors")
        self.stats.note_error("%s: %s: %s" % (what, type(e).__name__, e))

    def invalidate(self, why):
        """The filter may lack a committed slug: stop trusting it and fill it
        again."""
        with self.lock:
            self.gen += 1
            if self.trusted:
                log("filter no longer trusted (%s); filling it again" % why)
            self.trusted = False
            self.state = "filling"
        self.wake.set()

    def check(self, slug):
        """"no" (definitely not in the filter, and the filter is trusted),
        "maybe", or "unknown" (not trusted, or no answer)."""
        if not self.trusted or self._down():
            return "unknown"
        try:
            marker, here = self.bf.mexists(self.name, MARKER, slug)
        except Exception as e:  # any error means "ask the database"
            self._failed("BF.MEXISTS", e)
            return "unknown"
        if isinstance(marker, Exception) or isinstance(here, Exception):
            self._failed("BF.MEXISTS", marker if isinstance(marker, Exception) else here)
            return "unknown"
        if marker != 1:
            self.invalidate("the filter lacks the backfill marker: dropped or lost")
            return "unknown"
        return "maybe" if here == 1 else "no"

    def add(self, slug):
        """Add slug before its insert; one round trip that also asks.
        Returns (acknowledged, answer): answer is "no" when BF.ADD answered 1
        (the slug was definitely not in the filter) and the filter is
        trusted, "maybe" when it answered 0, "unknown" otherwise.  Not
        acknowledged: the filter is no longer trusted (the caller inserts
        anyway: UNIQUE keeps the table right, the backfill puts the slug in).
        """
        if not self._down():
            try:
                p = self.client.pipeline(transaction=False)
                p.execute_command("BF.MEXISTS", self.name, MARKER)
                p.execute_command("BF.ADD", self.name, slug)
                marker, added = p.execute(raise_on_error=False)
            except Exception as e:
                self._failed("BF.ADD", e)
            else:
                if isinstance(added, Exception):
                    self._failed("BF.ADD", added)
                else:
                    if isinstance(marker, Exception):
                        self._failed("BF.MEXISTS", marker)
                        return True, "unknown"
                    if marker != [1]:
                        self.invalidate("the filter lacks the backfill marker: dropped or lost")
                        return True, "unknown"
                    if not self.trusted:
                        return True, "unknown"
                    return True, ("no" if added == 1 else "maybe")
        self.invalidate("a BF.ADD was not acknowledged")
        return False, "unknown"

    def _reserve(self):
        try:
            self.bf.create(self.name, self.error_rate, self.capacity, noScale=True)
            log("created filter %s (capacity %d, error rate %g)"
                % (self.name, self.capacity, self.error_rate))
        except self.redis_mod.ResponseError as e:
            if "exist" not in str(e).lower():
                raise

    def _backfill(self, db):
        with self.lock:
            gen = self.gen
        t0 = time.monotonic()
        self._reserve()
        last, rows = "", 0
        while True:
            page = db.page_after(last, self.batch)
            if not page:
                break
            for r in self.bf.madd(self.name, *page):
                if isinstance(r, Exception):
                    raise r
            rows += len(page)
            last = page[-1]
        r = self.bf.add(self.name, MARKER)
        if isinstance(r, Exception):
            raise r
        with self.lock:
            if self.gen != gen:
                return False  # a failure during the fill: go again
            self.trusted = True
            self.state = "trusted"
        self.stats.bump("backfills")
        self.stats.set("backfill_rows", rows)
        log("filter %s filled from the database: %d slugs in %.2fs; trusted"
            % (self.name, rows, time.monotonic() - t0))
        if rows > self.capacity:
            log("warning: %d slugs in a filter sized for %d: false positives rise "
                "(use a larger --capacity and a new --filter name)" % (rows, self.capacity))
        return True

    def run_backfills(self, db, stop):
        """The backfill thread: fill whenever the filter is not trusted,
        retrying with backoff while the server or the database fail."""
        delay = 0.2
        while not stop.is_set():
            if self.trusted:
                self.wake.wait(timeout=1.0)
                self.wake.clear()
                continue
            try:
                if self._backfill(db):
                    delay = 0.2
            except Exception as e:
                with self.lock:
                    if not self.trusted:
                        self.state = "unavailable"
                self.stats.note_error("backfill: %s: %s" % (type(e).__name__, e))
                log("backfill failed (%s: %s); again in %.1fs" % (type(e).__name__, e, delay))
                stop.wait(delay)
                delay = min(delay * 2, 10.0)


# ------------------------------------------------------------------- stats

class Stats:
    NAMES = ("checks", "creates", "created", "taken", "filter_no", "filter_maybe",
             "filter_unknown", "false_positives", "db_reads", "db_errors",
             "filter_errors", "bad_requests", "backfills", "backfill_rows",
             "db_seconds", "filter_seconds")

    def __init__(self):
        self.lock = threading.Lock()
        self.c = dict.fromkeys(self.NAMES, 0)
        self.last_error = None

    def bump(self, name, n=1):
        with self.lock:
            self.c[name] += n

    def set(self, name, v):
        with self.lock:
            self.c[name] = v

    def note_error(self, msg):
        self.last_error = msg

    def snapshot(self):
        with self.lock:
            s = dict(self.c)
        s["db_reads_avoided"] = s["filter_no"]
        s["db_seconds"] = round(s["db_seconds"], 6)
        s["filter_seconds"] = round(s["filter_seconds"], 6)
        s["last_error"] = self.last_error
        return s


# ----------------------------------------------------------------- service

class Service:
    def __init__(self, db, flt, stats):
        self.db, self.filter, self.stats = db, flt, stats

    def _timed(self, counter, fn, *args):
        t = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.stats.bump(counter, time.perf_counter() - t)

    def _ask_filter(self, slug):
        if self.filter is None:
            return "unknown"
        a = self._timed("filter_seconds", self.filter.check, slug)
        self._count(a)
        return a

    def _count(self, answer):
        self.stats.bump({"no": "filter_no", "maybe": "filter_maybe",
                         "unknown": "filter_unknown"}[answer])

    def _read(self, slug, answer):
        self.stats.bump("db_reads")
        taken = self._timed("db_seconds", self.db.exists, slug)
        if answer == "maybe" and not taken:
            self.stats.bump("false_positives")
        return taken

    def check(self, slug):
        """(free, answered_by).  Raises DatabaseError."""
        self.stats.bump("checks")
        answer = self._ask_filter(slug)
        if answer == "no":
            return True, "filter"
        return not self._read(slug, answer), "database"

    def create(self, slug):
        """True when created, False when taken.  Raises DatabaseError."""
        self.stats.bump("creates")
        # Into the filter first, in the same round trip as the question
        # (BF.ADD answers 1 when the slug was definitely not there): a slug
        # whose row is committed is never missing from a trusted filter.
        # Not acknowledged: the filter is no longer trusted (add() says so)
        # and the insert goes ahead, the UNIQUE constraint deciding.
        answer = "unknown"
        if self.filter is not None:
            _, answer = self._timed("filter_seconds", self.filter.add, slug)
            self._count(answer)
        if answer != "no" and self._read(slug, answer):
            self.stats.bump("taken")
            return False
        created = self._timed("db_seconds", self.db.insert, slug)
        self.stats.bump("created" if created else "taken")
        return created

    def health(self):
        try:
            self.db.ping()
            db = "ok"
        except DatabaseError as e:
            db = str(e)
        return db == "ok", {"database": db,
                            "filter": self.filter.state if self.filter else "off"}


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "slugs/1"
    timeout = 30  # an idle keep-alive connection is closed after this
    # One write per answer, sent at once (headers and body apart would meet
    # Nagle's algorithm and the client's delayed ACK: 40 ms a request).
    wbufsize = 65536
    disable_nagle_algorithm = True

    def log_message(self, fmt, *args):
        if self.server.verbose:
            super().log_message(fmt, *args)

    def _reply(self, code, body):
        data = (json.dumps(body) + "\n").encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _slug(self):
        path = urllib.parse.urlsplit(self.path).path
        if not path.startswith("/slugs/"):
            return None
        slug = urllib.parse.unquote(path[len("/slugs/"):])
        if not SLUG_RE.match(slug):
            self.server.service.stats.bump("bad_requests")
            self._reply(400, {"error": "a slug is 1-63 characters of a-z, 0-9 and '-', "
                                       "not starting or ending with '-'", "slug": slug[:80]})
            return False
        return slug

    def _discard_body(self):
        try:
            n = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            n = -1
        if not 0 <= n <= 65536:
            self.close_connection = True
            return False
        if n:
            self.rfile.read(n)
        return True

    def do_GET(self):
        svc = self.server.service
        path = urllib.parse.urlsplit(self.path).path
        if path == "/healthz":
            ok, body = svc.health()
            return self._reply(200 if ok else 503, body)
        if path == "/stats":
            return self._reply(200, svc.stats.snapshot())
        slug = self._slug()
        if slug is None:
            return self._reply(404, {"error": "no such path: GET /slugs/SLUG, "
                                              "POST /slugs/SLUG, /healthz, /stats"})
        if slug is False:
            return
        try:
            free, by = svc.check(slug)
        except DatabaseError as e:
            return self._reply(503, {"error": "database unavailable: %s" % e, "slug": slug})
        self._reply(200, {"slug": slug, "free": free, "answered_by": by})

    do_HEAD = do_GET

    def do_POST(self):
        if not self._discard_body():
            return self._reply(413, {"error": "a request body of at most 64 KiB (none is needed)"})
        slug = self._slug()
        if slug is None:
            return self._reply(404, {"error": "POST /slugs/SLUG creates a slug"})
        if slug is False:
            return
        svc = self.server.service
        try:
            created = svc.create(slug)
        except DatabaseError as e:
            svc.stats.bump("db_errors")
            return self._reply(503, {"error": "database unavailable, nothing created: %s" % e,
                                     "slug": slug})
        if created:
            return self._reply(201, {"slug": slug, "created": True})
        self._reply(409, {"slug": slug, "created": False, "error": "taken"})

    do_PUT = do_POST

    def _not_allowed(self):
        self._reply(405, {"error": "method not allowed: GET or POST"})

    do_DELETE = do_PATCH = _not_allowed


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def __init__(self, addr, service, max_connections, verbose):
        self.service = service
        self.verbose = verbose
        self.slots = threading.BoundedSemaphore(max_connections)
        super().__init__(addr, Handler)

    def process_request(self, request, client_address):
        # One thread per connection, at most max_connections of them: past
        # that a connection gets 503 and is closed, never a thread.
        if not self.slots.acquire(blocking=False):
            try:
                request.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n"
                                b"Connection: close\r\n\r\n")
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except Exception:
            self.slots.release()
            raise

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="slugs.py",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="An HTTP service that answers \"is this slug free?\" and "
                    "\"create it\", asking a Bloom filter (bloomgrid over RESP, or "
                    "RedisBloom) before the database.",
        epilog="Endpoints: GET /slugs/SLUG, POST /slugs/SLUG, GET /healthz, GET /stats.\n"
               "Example: slugs.py --bloom redis://127.0.0.1:PORT --db sqlite:slugs.db\n"
               "See examples/slugs/README.md.")
    p.add_argument("--listen", default="127.0.0.1:8080", metavar="HOST:PORT",
                   help="HTTP address (default 127.0.0.1:8080; port 0 picks a free one)")
    p.add_argument("--bloom", required=True, metavar="URL",
                   help="the filter server: redis://HOST:PORT (rediss:// for TLS; "
                        "redis://:TOKEN@HOST:PORT for a token), or 'none' to ask "
                        "only the database")
    p.add_argument("--bloom-token-file", metavar="FILE",
                   help="file holding the token sent with AUTH (keeps it out of argv)")
    p.add_argument("--bloom-ca", metavar="FILE", help="CA certificate for rediss://")
    p.add_argument("--bloom-timeout", type=float, default=0.5, metavar="SECONDS",
                   help="per-command timeout of the filter; past it the database "
                        "answers (default 0.5)")
    p.add_argument("--filter", default="slugs", metavar="NAME",
                   help="filter name (default slugs)")
    p.add_argument("--capacity", type=int, default=1000000, metavar="N",
                   help="capacity of the filter when the service creates it "
                        "(BF.RESERVE NAME ERROR_RATE N NONSCALING; default 1000000)")
    p.add_argument("--error-rate", type=float, default=0.01, metavar="P",
                   help="false-positive rate at capacity (default 0.01)")
    p.add_argument("--backfill-batch", type=int, default=1000, metavar="N",
                   help="slugs per BF.MADD while filling the filter (default 1000)")
    p.add_argument("--db", default="sqlite:slugs.db", metavar="SPEC",
                   help="sqlite:PATH (default sqlite:slugs.db) or a PostgreSQL "
                        "URI postgresql://USER:PASSWORD@HOST:PORT/DB")
    p.add_argument("--db-pool", type=int, default=8, metavar="N",
                   help="database connections (default 8)")
    p.add_argument("--db-timeout", type=float, default=5.0, metavar="SECONDS",
                   help="wait for a database connection or statement (default 5)")
    p.add_argument("--max-connections", type=int, default=64, metavar="N",
                   help="HTTP connections served at once; more get 503 (default 64)")
    p.add_argument("--verbose", action="store_true", help="log every request")
    a = p.parse_args(argv)
    host, _, port = a.listen.rpartition(":")
    if not host or not port.isdigit() or int(port) > 65535:
        p.error("--listen must be HOST:PORT, got %r" % a.listen)
    a.listen = (host.strip("[]"), int(port))
    if not 0 < a.error_rate < 1:
        p.error("--error-rate must be between 0 and 1")
    if a.capacity < 1:
        p.error("--capacity must be at least 1")
    for name in ("db_pool", "max_connections", "backfill_batch"):
        if getattr(a, name) < 1:
            p.error("--%s must be at least 1" % name.replace("_", "-"))
    if a.bloom != "none" and not a.bloom.startswith(("redis://", "rediss://", "unix://")):
        p.error("--bloom must be redis://HOST:PORT, rediss://HOST:PORT or none, got %r" % a.bloom)
    if a.bloom_ca and not a.bloom.startswith("rediss://"):
        p.error("--bloom-ca is for TLS: give --bloom rediss://HOST:PORT")
    return a


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    stats = Stats()
    try:
        db = Database(a.db, a.db_pool, a.db_timeout)
    except ImportError as e:
        sys.exit("slugs: %s (install Debian's python3-psycopg2)" % e)
    except (ValueError, DatabaseError) as e:
        sys.exit("slugs: database: %s" % e)
    flt = None
    if a.bloom != "none":
        token = None
        if a.bloom_token_file:
            try:
                token = open(a.bloom_token_file).read().strip()
            except OSError as e:
                sys.exit("slugs: --bloom-token-file: %s" % e)
        try:
            flt = Filter(a.bloom, a.filter, a.capacity, a.error_rate, a.bloom_timeout,
                         token, a.bloom_ca, stats, a.backfill_batch)
        except ImportError as e:
            sys.exit("slugs: %s (install Debian's python3-redis)" % e)
        except ValueError as e:
            sys.exit("slugs: --bloom: %s" % e)
    service = Service(db, flt, stats)
    try:
        server = Server(a.listen, service, a.max_connections, a.verbose)
    except OSError as e:
        sys.exit("slugs: --listen %s:%d: %s" % (a.listen[0], a.listen[1], e))
    stop = threading.Event()
    if flt is not None:
        threading.Thread(target=flt.run_backfills, args=(db, stop), daemon=True).start()
    host, port = server.server_address[:2]
    print("slugs: listening on http://%s:%d (database %s, filter %s)"
          % (host, port, db.kind, "%s at %s" % (a.filter, a.bloom.split("@")[-1])
             if flt else "off"), flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
