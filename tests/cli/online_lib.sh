# Helpers for the online CLI tests: start servers on free loopback ports.
# Source after lib.sh (which sets WORK and cd's into it).

PIDS=""
trap 'for p in $PIDS; do kill $p 2>/dev/null || true; wait $p 2>/dev/null || true; done; rm -rf "$WORK"' EXIT

# start_server TAG BIN ARGS...: start BIN with --listen 127.0.0.1:0 ARGS,
# stdout in TAG.out, stderr in TAG.log; wait for its "listening on" line (a
# JSON object with --log-format json) and set ADDR to what follows "listening
# on": the address it serves, then any other listener it names.
start_server() {
    tag=$1
    shift
    "$@" --listen 127.0.0.1:0 >"$tag.out" 2>"$tag.log" &
    pid=$!
    PIDS="$PIDS $pid"
    n=0
    while ! grep -q 'listening on ' "$tag.out"; do
        kill -0 $pid 2>/dev/null || fail "$tag exited: $(cat "$tag.log")"
        n=$((n + 1))
        [ $n -lt 200 ] || fail "$tag did not start: $(cat "$tag.log")"
        sleep 0.05
    done
    ADDR=$(sed -n 's/.*listening on \([^"]*\).*/\1/p' "$tag.out")
    # A node listens before its data directory is open, and answers
    # UNAVAILABLE ("recovering") until then: its log says when (the one
    # thing here read from a log, and only to wait).
    if grep -q 'bloomgrid-node listening' "$tag.out"; then
        n=0
        while ! grep -q 'data directory .* open' "$tag.log"; do
            kill -0 $pid 2>/dev/null || fail "$tag exited: $(cat "$tag.log")"
            n=$((n + 1))
            [ $n -lt 400 ] || fail "$tag did not open its data: $(cat "$tag.log")"
            sleep 0.05
        done
    fi
}

# all_alive: every started server still runs.
all_alive() {
    for p in $PIDS; do
        kill -0 $p 2>/dev/null || fail "a server died (pid $p): $(cat ./*.log)"
    done
}
