#!/usr/bin/env python3
"""How a node is called has one seam (docs/ARCHITECTURE.md): the method
paths of the internal service ("/bloomgrid.v1.Internal/...") are written in
common/cluster/node_client.c and in no other source file of the libraries
and processes (common/, node/, router/, merger/, cli/); everything else calls
nodes through node_client.h.  Tests may name paths themselves.
Usage: internal_paths.py SOURCE_DIR"""
import os
import re
import sys

NEEDLE = "/bloomgrid.v1.Internal/"
# A path put together in pieces ("/bloomgrid.v1." "Internal/GetShard").
PIECE = re.compile(r'Internal/[A-Z][A-Za-z]*"')
DIRS = ["common", "node", "router", "merger", "cli"]
SEAM = os.path.join("common", "cluster", "node_client.c")
SUFFIXES = (".c", ".h")


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    root = sys.argv[1]
    scanned, bad, seam_has = 0, 0, False
    for top in DIRS:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
            dirnames.sort()
            for name in sorted(filenames):
                if not name.endswith(SUFFIXES):
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, root)
                scanned += 1
                with open(path, encoding="utf-8", errors="replace") as f:
                    for lineno, line in enumerate(f, 1):
                        if NEEDLE not in line and not PIECE.search(line):
                            continue
                        if rel == SEAM:
                            seam_has = True
                            continue
                        print(f"{rel}:{lineno}: names an internal method path "
                              f"(call the node through node_client.h): {line.strip()}")
                        bad += 1
    if scanned < 50:
        print(f"only {scanned} source files under {root}: not the source tree?")
        return 1
    if not seam_has:
        print(f"{SEAM} names no internal method path: where did they go?")
        return 1
    if bad:
        print(f"{bad} lines outside {SEAM} name internal method paths")
        return 1
    print(f"{scanned} source files: internal method paths only in {SEAM}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
