#!/bin/sh
# gen-certs.sh DIR: the certificates of the TLS tests, made with the openssl
# command into DIR (docs/SECURITY.md shows the same steps for a cluster).
#
#   ca.pem                the cluster CA; other-ca.pem an unrelated one
#   node.pem router.pem merger.pem
#                         cluster processes (serverAuth and clientAuth, for
#                         localhost and 127.0.0.1), signed by ca
#   node-b.pem            another node certificate, signed by other-ca (a
#                         reload to it is seen by which CA a client needs)
#   client.pem            a client certificate signed by ca
#   stranger.pem          a client certificate signed by other-ca
#   expired.pem           a server certificate signed by ca that expired in
#                         2020 (openssl ca with -startdate/-enddate: x509
#                         -days cannot go back in time)
# Each X.pem has its key in X.key.  EC P-256 keys: quick to make.
set -eu
dir=$1
mkdir -p "$dir"
cd "$dir"

key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1.key" 2>/dev/null; }

ca() {
    key "$1"
    openssl req -x509 -new -key "$1.key" -subj "/CN=$2" -days 3650 \
        -addext "basicConstraints=critical,CA:TRUE" \
        -addext "keyUsage=critical,keyCertSign,cRLSign" -out "$1.pem" 2>/dev/null
}

# leaf NAME CA USAGE
leaf() {
    key "$1"
    openssl req -new -key "$1.key" -subj "/CN=$1" -out "$1.csr" 2>/dev/null
    printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=%s\nbasicConstraints=CA:FALSE\n' \
        "$3" >"$1.ext"
    openssl x509 -req -in "$1.csr" -CA "$2.pem" -CAkey "$2.key" -CAcreateserial \
        -days 30 -extfile "$1.ext" -out "$1.pem" 2>/dev/null
    rm -f "$1.csr" "$1.ext"
}

ca ca "bloomgrid test CA"
ca other-ca "unrelated CA"
for p in node router merger; do
    leaf "$p" ca serverAuth,clientAuth
done
leaf node-b other-ca serverAuth,clientAuth
leaf client ca clientAuth
leaf stranger other-ca clientAuth

# The expired certificate goes through openssl ca, which takes dates.
mkdir -p ca-db
: >ca-db/index.txt
echo 1000 >ca-db/serial
cat >ca-db/ca.cnf <<CNF
[ca]
default_ca = test
[test]
dir = $PWD/ca-db
database = \$dir/index.txt
serial = \$dir/serial
new_certs_dir = \$dir
certificate = $PWD/ca.pem
private_key = $PWD/ca.key
default_md = sha256
policy = anything
copy_extensions = none
x509_extensions = leaf
[anything]
commonName = supplied
[leaf]
subjectAltName = DNS:localhost,IP:127.0.0.1
extendedKeyUsage = serverAuth,clientAuth
basicConstraints = CA:FALSE
CNF
key expired
openssl req -new -key expired.key -subj "/CN=expired" -out expired.csr 2>/dev/null
openssl ca -batch -config ca-db/ca.cnf -startdate 20200101000000Z \
    -enddate 20200102000000Z -in expired.csr -out expired.pem -notext 2>/dev/null
rm -f expired.csr
