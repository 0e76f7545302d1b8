#!/usr/bin/env python3
"""The link graph keeps the layering (docs/ARCHITECTURE.md): each library's
archive is read with nm, and the symbols it needs from outside itself must
not come from a layer it may not use.  Usage: layers.py NAME=ARCHIVE ..."""
import subprocess
import sys

# What each library must never need: (prefix, what it belongs to).
GRPC = [("grpc_", "gRPC"), ("gpr_", "gRPC"), ("protobuf_c_", "protobuf-c"),
        ("bloomgrid__v1__", "the generated protocol")]
STORAGE = [("store_", "storage"), ("wal_", "storage")]
ENGINE = [("bf_", "the engine"), ("bundle_", "the engine")]
RPC = [("rpc_", "the RPC layer"), ("node_client_", "the node client")]
CLUSTER = [("topo_", "cluster"), ("quorum_", "cluster"), ("canary_", "cluster")]
FORBIDDEN = {
    "base": GRPC + STORAGE + ENGINE + RPC + CLUSTER,
    "engine": GRPC + STORAGE + RPC + CLUSTER,
    "storage": GRPC + RPC + CLUSTER,
    "cluster": GRPC + STORAGE + ENGINE + RPC,
    "rpc": STORAGE + ENGINE + CLUSTER,
    # The Redis door's library knows RESP, libuv and OpenSSL; the backends
    # bring gRPC, storage and the cluster (node/node_resp.c, router_resp.c).
    "resp": GRPC + STORAGE + ENGINE + RPC + CLUSTER,
}


def symbols(archive):
    out = subprocess.run(["nm", "-g", archive], check=True, capture_output=True,
                         text=True).stdout
    defined, needed = set(), set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "U":
            needed.add(parts[1])
        elif len(parts) == 3 and parts[1] not in ("U", "w", "v"):
            defined.add(parts[2])
    return needed - defined


def main():
    bad = 0
    for arg in sys.argv[1:]:
        name, archive = arg.split("=", 1)
        needed = symbols(archive)
        if not needed:
            print(f"{name}: no symbols read from {archive}")
            bad += 1
            continue
        wrong = [(sym, owner) for sym in sorted(needed)
                 for prefix, owner in FORBIDDEN[name] if sym.startswith(prefix)]
        for sym, owner in wrong:
            print(f"{name} needs {sym} from {owner}")
        if not wrong:
            print(f"{name}: {len(needed)} symbols from outside, none from a layer it may not use")
        bad += len(wrong)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
