#!/bin/sh
# --version of every program: the CMake project version and, in a git
# checkout, the commit the binaries were built from.
# Usage: version.sh PROJECT_VERSION SOURCE_DIR BINARY...
set -u
want=$1 src=$2
shift 2
head=
if command -v git >/dev/null 2>&1 && [ -e "$src/.git" ]; then
    head=$(git -C "$src" rev-parse --short=12 HEAD 2>/dev/null) || head=
fi
fail=0
for bin in "$@"; do
    name=$(basename "$bin")
    out=$("$bin" --version) || { echo "FAIL: $name --version exited $?"; fail=1; continue; }
    case "$out" in
        "$name $want"|"$name $want "*) ;;
        *) echo "FAIL: $name --version printed '$out', want '$name $want ...'"; fail=1; continue ;;
    esac
    if [ -n "$head" ]; then
        case "$out" in
            *"$head"*) ;;
            *) echo "FAIL: $name --version '$out' does not name commit $head"; fail=1; continue ;;
        esac
    fi
    echo "ok: $out"
done
exit $fail
