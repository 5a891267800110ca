#!/usr/bin/env bash
# Regenerates the TLS test fixtures in this folder with the openssl command-line tool:
#   ca.pem                  the test cluster's CA (its key is not kept)
#   node.pem / node.key     a cluster member (router or worker): SAN 127.0.0.1, ::1, localhost
#   other-ca.pem            an unrelated CA
#   rogue.pem / rogue.key   a member certificate signed by other-ca (must be refused)
# Valid for 100 years. Test keys only: never use them for anything else.
set -euo pipefail
cd "$(dirname "$0")"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

ca() {  # name subject
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 36500 \
    -subj "/CN=$2" -keyout "$tmp/$1.key" -out "$1.pem" \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign
}
member() {  # name ca subject
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$3" \
    -keyout "$1.key" -out "$tmp/$1.csr"
  printf '%s\n' "subjectAltName=IP:127.0.0.1,IP:::1,DNS:localhost" \
    "extendedKeyUsage=serverAuth,clientAuth" "basicConstraints=critical,CA:FALSE" > "$tmp/$1.ext"
  openssl x509 -req -in "$tmp/$1.csr" -CA "$2.pem" -CAkey "$tmp/$2.key" -CAcreateserial \
    -CAserial "$tmp/$2.srl" -days 36500 -extfile "$tmp/$1.ext" -out "$1.pem"
}

ca ca "chunkserve test cluster CA"
member node ca "chunkserve test node"
ca other-ca "unrelated CA"
member rogue other-ca "chunkserve rogue node"
chmod 644 ./*.pem ./*.key
echo "wrote: $(ls ./*.pem ./*.key | tr '\n' ' ')"
