#!/bin/sh
# Build the RESP parser's libFuzzer target with clang and run it.
#   tests/fuzz/run.sh [SECONDS] [OUTDIR]   (default 600 s, a temporary dir)
# ctest runs it for 20 s (fuzz_resp_parse); a crash leaves its input in OUTDIR
# (crash-*), replayed with OUTDIR/fuzz_resp_parse FILE.
set -eu
secs=${1:-600}
here=$(cd "$(dirname "$0")" && pwd)
src=$here/../../common
out=${2:-$(mktemp -d "${TMPDIR:-/tmp}/fuzz-resp-XXXXXX")}
mkdir -p "$out/corpus"
command -v clang >/dev/null || { echo "fuzz: clang is not installed (deploy/install-deps.sh test)"; exit 77; }
clang -g -O1 -fsanitize=fuzzer,address,undefined -I"$src/resp" -I"$src/base" \
  "$here/fuzz_resp_parse.c" "$src/resp/resp_proto.c" -o "$out/fuzz_resp_parse"
# Seeds: what clients send.
printf '\001*3\r\n$6\r\nBF.ADD\r\n$1\r\nf\r\n$3\r\nkey\r\n' > "$out/corpus/array"
printf '\003PING\r\nBF.EXISTS f "a b"\r\n' > "$out/corpus/inline"
printf '\002*2\r\n$4\r\nECHO\r\n$0\r\n\r\n*0\r\n*-1\r\n' > "$out/corpus/empty"
cd "$out"
exec ./fuzz_resp_parse -max_total_time="$secs" -max_len=2048 -print_final_stats=1 corpus
