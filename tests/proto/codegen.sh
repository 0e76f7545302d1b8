#!/bin/sh
# Code generation from proto/ as users of other languages run it:
#  - Go (protoc-gen-go): every bloomgrid .proto has a go_package;
#  - Python (protoc's own generator, Debian's python3-protobuf and
#    python3-grpcio): every module generated from proto/ imports, in the
#    same process as the grpc package, and nothing generated is named grpc
#    (a generated grpc/ directory would hide the health module behind the
#    grpc package, or the grpc package behind it).
# Usage: codegen.sh PROTO_DIR GRPC_PROTO_DIR TMP
set -eu
proto=$(realpath "$1") sys=$2 tmp=$3
mkdir -p "$tmp"
work=$(mktemp -d "$tmp/codegen.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

cd "$proto"
files=$(find . -name '*.proto' | sed 's|^\./||' | sort)
[ -n "$files" ] || fail "no .proto files in $proto"

mkdir -p "$work/go"
# shellcheck disable=SC2086
protoc -I . -I "$sys" --go_out="$work/go" --go_opt=paths=source_relative $files \
    2>"$work/go.err" || fail "protoc --go_out: $(cat "$work/go.err")"
for f in $files; do
    g="$work/go/${f%.proto}.pb.go"
    [ -s "$g" ] || fail "no Go code for $f"
    grep -q '^package bloomgridv1$' "$g" || fail "$g: package is $(grep '^package' "$g")"
done

mkdir -p "$work/py"
# shellcheck disable=SC2086
protoc -I . -I "$sys" --python_out="$work/py" $files 2>"$work/py.err" ||
    fail "protoc --python_out: $(cat "$work/py.err")"
[ -e "$work/py/grpc" ] && fail "proto/ generates a Python package named grpc, which clashes with grpcio"
/usr/bin/python3 - "$work/py" $files <<'PY' || fail "the generated Python modules do not import beside grpc"
import importlib, sys
sys.path.insert(0, sys.argv[1])
import grpc
assert hasattr(grpc, "insecure_channel"), "grpc is not grpcio: %s" % grpc
for f in sys.argv[2:]:
    mod = f[:-len(".proto")].replace("/", ".") + "_pb2"
    m = importlib.import_module(mod)
    print("ok:", mod, "->", ", ".join(sorted(m.DESCRIPTOR.message_types_by_name)[:3]), "...")
PY
echo "codegen OK"
