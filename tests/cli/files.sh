#!/bin/sh
# Saving is atomic: a failed save leaves the old file and no temp file.
set -eu
BG=$1
. "$CLI_TEST_LIB"

seq 1 1000 > keys.txt
expect_ok "$BG" build f.bf -n 100000 -p 0.001 keys.txt
F=$(sum f.bf)

# A file-size limit makes the write fail halfway.
seq 1001 2000 > more.txt
run sh -c "ulimit -f 8; exec \"$BG\" add f.bf < more.txt"
[ "$rc" -ne 0 ] || fail "add under a 4 KiB file limit succeeded"
same_file f.bf "$F"
[ -z "$(ls | grep '\.tmp\.' || true)" ] || fail "temp file left: $(ls)"

# An output in a missing directory.
expect_err 2 "no/such/dir/g.bf: cannot save" \
    "$BG" create no/such/dir/g.bf -n 100 -p 0.01

# A read-only directory (root may write anyway, so only as non-root).
if [ "$(id -u)" -ne 0 ]; then
    mkdir ro && cp f.bf ro/f.bf && chmod 555 ro
    expect_err 2 "ro/f.bf: cannot save" "$BG" add ro/f.bf k
    chmod 755 ro
    same_file ro/f.bf "$F"
fi

# The file keeps its mode across saves.
chmod 600 f.bf
expect_ok "$BG" add f.bf extra
[ "$(stat -c %a f.bf)" = 600 ] || fail "mode changed to $(stat -c %a f.bf)"

# Saving keeps the form: a filter file stays a plain filter file.
[ "$(head -c 8 f.bf)" = BLOOMGRD ] || fail "f.bf is no longer a filter file"

echo "files: ok"
