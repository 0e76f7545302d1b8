#!/usr/bin/python3
"""netdelay: a TCP relay that adds a fixed delay each way, to put a database
"in another building" on one machine.

  netdelay.py --to 127.0.0.1:5432 --delay-ms 0.5 [--listen 127.0.0.1:0]

Every byte from either side reaches the other DELAY ms later (a round trip
gains twice that), in order; it prints "netdelay: listening on HOST:PORT".
For demonstrations and measurements only: the relay runs in Python, so under
load its own scheduling adds to the delay.
"""
import argparse
import collections
import socket
import sys
import threading
import time


def pump(src, dst, delay):
    """Copy src to dst, each chunk held until delay seconds after it came."""
    q = collections.deque()
    cv = threading.Condition()

    def reader():
        try:
            while True:
                data = src.recv(65536)
                with cv:
                    q.append((time.monotonic() + delay, data))
                    cv.notify()
                if not data:
                    return
        except OSError:
            with cv:
                q.append((0, b""))
                cv.notify()

    def writer():
        try:
            while True:
                with cv:
                    while not q:
                        cv.wait()
                    due, data = q.popleft()
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                if not data:
                    dst.shutdown(socket.SHUT_WR)
                    return
                dst.sendall(data)
        except OSError:
            pass

    threading.Thread(target=reader, daemon=True).start()
    w = threading.Thread(target=writer, daemon=True)
    w.start()
    return w


def serve(conn, to, delay):
    try:
        up = socket.create_connection(to, timeout=10)
    except OSError as e:
        sys.stderr.write("netdelay: %s:%d: %s\n" % (to[0], to[1], e))
        conn.close()
        return
    up.settimeout(None)
    for s in (conn, up):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    a = pump(conn, up, delay)
    b = pump(up, conn, delay)
    a.join()
    b.join()
    conn.close()
    up.close()


def hostport(s):
    host, _, port = s.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError("HOST:PORT, got %r" % s)
    return host, int(port)


def main():
    p = argparse.ArgumentParser(prog="netdelay.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--to", type=hostport, required=True, help="HOST:PORT to relay to")
    p.add_argument("--listen", type=hostport, default=("127.0.0.1", 0),
                   help="HOST:PORT to listen on (default 127.0.0.1:0, a free port)")
    p.add_argument("--delay-ms", type=float, required=True, help="delay each way, ms")
    a = p.parse_args()
    if a.delay_ms < 0:
        p.error("--delay-ms must be at least 0")
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(a.listen)
    ls.listen(128)
    print("netdelay: listening on %s:%d" % ls.getsockname()[:2], flush=True)
    try:
        while True:
            conn, _ = ls.accept()
            threading.Thread(target=serve, args=(conn, a.to, a.delay_ms / 1000.0),
                             daemon=True).start()
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
