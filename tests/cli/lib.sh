# Helpers shared by the CLI test scripts.  Source with BG set to the binary.
set -eu
# create, add and remove would talk to a server named here.
unset BLOOMGRID_SERVER

WORK=$(mktemp -d "${CLI_TEST_TMP:-/tmp}/cli.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"

fail() {
    echo "FAIL: $*" >&2
    exit 1
}

sum() {
    sha256sum "$1" | cut -d' ' -f1
}

# run CMD...: run with stdout in out.txt, stderr in err.txt, status in $rc.
# Not inside a pipeline: that would set rc in a subshell only.
run() {
    set +e
    "$@" >out.txt 2>err.txt
    rc=$?
    set -e
}

# expect_err CODE REGEX CMD...: the command exits CODE and prints exactly one
# line on stderr, starting with "bloomgrid: " and matching REGEX.
expect_err() {
    want=$1
    pat=$2
    shift 2
    run "$@"
    [ "$rc" -eq "$want" ] || fail "$* exited $rc, wanted $want; stderr: $(cat err.txt)"
    [ "$(wc -l < err.txt)" -eq 1 ] || fail "$*: wanted one stderr line, got: $(cat err.txt)"
    grep -q '^bloomgrid: ' err.txt || fail "$*: stderr lacks the prefix: $(cat err.txt)"
    grep -Eq -- "$pat" err.txt || fail "$*: stderr does not match /$pat/: $(cat err.txt)"
}

# expect_ok CMD...: exits 0.
expect_ok() {
    run "$@"
    [ "$rc" -eq 0 ] || fail "$* exited $rc; stderr: $(cat err.txt)"
}

# same_file FILE SUM: the file still has that checksum.
same_file() {
    [ "$(sum "$1")" = "$2" ] || fail "$1 was modified"
}

# flip_byte FILE OFFSET: invert one byte in place.
flip_byte() {
    python3 - "$1" "$2" <<'PY'
import sys
path, off = sys.argv[1], int(sys.argv[2])
with open(path, "r+b") as f:
    f.seek(off)
    b = f.read(1)
    f.seek(off)
    f.write(bytes([b[0] ^ 0xFF]))
PY
}
