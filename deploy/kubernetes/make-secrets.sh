#!/bin/sh
# Makes the cluster's TLS material and tokens, and the Secrets that hold
# them (docs/SECURITY.md explains both).
#
# usage: make-secrets.sh OUTDIR [NAMESPACE] [NODES]
#   OUTDIR     new directory: keys, certificates, tokens and secrets.yaml
#   NAMESPACE  the install's namespace (default bloomgrid)
#   NODES      node copies of the StatefulSet (default 3)
# BLOOMGRID names the command-line tool (default: bloomgrid on PATH; or
# "podman run --rm -v $PWD:$PWD -w $PWD bloomgrid:latest bloomgrid").
#
# Then: kubectl apply -f OUTDIR/secrets.yaml.  Keep OUTDIR/ca.key and the
# *.token files off the cluster: secrets.yaml holds neither.
set -eu
[ $# -ge 1 ] || { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
out=$1
ns=${2:-bloomgrid}
nodes=${3:-3}
bg=${BLOOMGRID:-bloomgrid}
case "$nodes" in ''|*[!0-9]*) echo "make-secrets: NODES must be a number" >&2; exit 2 ;; esac
[ ! -e "$out" ] || { echo "make-secrets: $out exists: give a new directory" >&2; exit 2; }
mkdir -m 0700 "$out"
cd "$out"

key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1.key" 2>/dev/null; }

# The cluster CA.
key ca
openssl req -x509 -new -key ca.key -subj "/CN=bloomgrid $ns CA" -days 3650 \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" -out ca.pem

# cert NAME SAN: a certificate of the CA for serving and calling peers.
cert() {
    key "$1"
    openssl req -new -key "$1.key" -subj "/CN=bloomgrid $1" -out "$1.csr"
    printf 'subjectAltName = %s\nextendedKeyUsage = serverAuth, clientAuth\nbasicConstraints = CA:FALSE\n' \
        "$2" > "$1.ext"
    openssl x509 -req -in "$1.csr" -CA ca.pem -CAkey ca.key -CAcreateserial \
        -days 365 -extfile "$1.ext" -out "$1.pem" 2>/dev/null
    rm -f "$1.csr" "$1.ext"
}
# svc NAME: the names a Service is dialled by, and localhost for
# kubectl port-forward.
svc() { echo "DNS:$1, DNS:$1.$ns, DNS:$1.$ns.svc, DNS:$1.$ns.svc.cluster.local, DNS:localhost, IP:127.0.0.1"; }

# One node certificate names every copy: the addresses of the topology
# (POD.bloomgrid-node.NAMESPACE.svc) and their full form.
san=""
i=0
while [ "$i" -lt "$nodes" ]; do
    n=bloomgrid-node-$i.bloomgrid-node.$ns.svc
    san="${san}DNS:$n, DNS:$n.cluster.local, "
    i=$((i + 1))
done
cert node "${san}DNS:localhost, IP:127.0.0.1"
cert router "$(svc bloomgrid-router)"
cert merger "$(svc bloomgrid-merger)"
rm -f ca.srl

# Tokens: an admin one for the operator (create, drop, export), a write one
# for the batch Job's import.  The tokens file holds their hashes only.
: > tokens
$bg token new --role admin --name ops --out ops.token >> tokens
$bg token new --role write --name batch --out batch.token >> tokens

b64() { base64 -w0 < "$1"; }
{
    printf 'apiVersion: v1\nkind: Secret\nmetadata:\n  name: bloomgrid-tls\n  namespace: %s\ntype: Opaque\ndata:\n' "$ns"
    for f in ca.pem node.pem node.key router.pem router.key merger.pem merger.key; do
        printf '  %s: %s\n' "$f" "$(b64 "$f")"
    done
    printf -- '---\napiVersion: v1\nkind: Secret\nmetadata:\n  name: bloomgrid-tokens\n  namespace: %s\ntype: Opaque\ndata:\n' "$ns"
    printf '  tokens: %s\n' "$(b64 tokens)"
    printf -- '---\napiVersion: v1\nkind: Secret\nmetadata:\n  name: bloomgrid-batch-token\n  namespace: %s\ntype: Opaque\ndata:\n' "$ns"
    printf '  token: %s\n' "$(b64 batch.token)"
} > secrets.yaml
chmod 0600 ./*.key ./*.token secrets.yaml
echo "make-secrets: wrote $out (apply $out/secrets.yaml; keep ca.key and ops.token safe)"
