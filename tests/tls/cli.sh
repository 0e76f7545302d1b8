#!/bin/sh
# The bloomgrid tool against a node with TLS: --tls-ca, --tls-cert and
# --tls-key (or BLOOMGRID_TLS_*), and what it says when they are missing,
# wrong or half given.
# usage: cli.sh BLOOMGRID NODE GEN_CERTS
BG=$1
NODE=$2
GEN=$3
. "$CLI_TEST_LIB"
. "$(dirname "$CLI_TEST_LIB")/online_lib.sh"

sh "$GEN" certs
C=$PWD/certs
start_server node "$NODE" --data-dir data --internal-listen 127.0.0.1:0 \
    --tls-cert "$C/node.pem" --tls-key "$C/node.key" --tls-ca "$C/ca.pem"
ADDR=${ADDR%% *}

expect_err 2 "cannot reach server .*--tls-ca" "$BG" --server "$ADDR" list
run "$BG" --server "$ADDR" --tls-ca "$C/ca.pem" create f -n 1000 -p 0.01
[ "$rc" -eq 0 ] || fail "create over TLS: $(cat err.txt)"
run env BLOOMGRID_TLS_CA="$C/ca.pem" "$BG" --server "$ADDR" add f alice bob
[ "$rc" -eq 0 ] || fail "add with BLOOMGRID_TLS_CA: $(cat err.txt)"
run "$BG" check f alice --server "$ADDR" --tls-ca "$C/ca.pem" --tls-cert "$C/client.pem" \
    --tls-key "$C/client.key"
[ "$rc" -eq 0 ] || fail "check with a client certificate: $(cat err.txt)"

expect_err 2 "cannot reach server .*certificate" "$BG" --server "$ADDR" \
    --tls-ca "$C/other-ca.pem" list
expect_err 2 "^bloomgrid: --tls-cert and --tls-key go together" "$BG" --server "$ADDR" \
    --tls-ca "$C/ca.pem" --tls-cert "$C/client.pem" list
expect_err 2 "^bloomgrid: --tls-ca .*missing.pem: cannot open" "$BG" --server "$ADDR" \
    --tls-ca "$C/missing.pem" list
expect_err 2 "^bloomgrid: --tls-key .*does not match" "$BG" --server "$ADDR" \
    --tls-ca "$C/ca.pem" --tls-cert "$C/client.pem" --tls-key "$C/node.key" list
"$BG" help list | grep -q -- "--tls-ca FILE" || fail "help list lacks --tls-ca"
"$BG" --help | grep -q -- "--tls-cert FILE" || fail "--help lacks --tls-cert"
all_alive
echo ok
