#!/usr/bin/env bash
# Regenerates the TLS test fixtures in this folder with the openssl command-line tool:
#   ca.pem                  the test cluster's CA (its key is not kept)
#   node.pem / node.key     a cluster member (router or worker): SAN 127.0.0.1, ::1, localhost
#   other-ca.pem            an unrelated CA
#   rogue.pem / rogue.key   a member certificate signed by other-ca (must be refused)
#   revoked.pem / .key      a member certificate of ca that crl.pem revokes
#   crl-none.pem            ca's revocation list before that: nothing revoked
#   crl.pem                 ca's revocation list revoking revoked.pem
#   crl-expired.pem         the same, past its next update one second after it was made
#   other-crl.pem           a revocation list of other-ca (a --tls-crl of the wrong CA)
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

crl() {  # out ca [certificate to revoke first] [extra -gencrl options]
  local db="$tmp/$2.db"
  mkdir -p "$db" && touch "$db/index.txt" && { [ -f "$db/crlnumber" ] || echo 1000 > "$db/crlnumber"; }
  printf '%s\n' "[ca]" "default_ca = d" "[d]" "database = $db/index.txt" \
    "crlnumber = $db/crlnumber" "default_md = sha256" "default_crl_days = 36500" > "$db/cnf"
  if [ -n "${3:-}" ]; then
    openssl ca -config "$db/cnf" -keyfile "$tmp/$2.key" -cert "$2.pem" -revoke "$3.pem" \
      -crl_reason keyCompromise
  fi
  openssl ca -config "$db/cnf" -keyfile "$tmp/$2.key" -cert "$2.pem" -gencrl -out "$1.pem" \
    ${4:-}
}

ca ca "chunkserve test cluster CA"
member node ca "chunkserve test node"
member revoked ca "chunkserve revoked node"
crl crl-none ca
crl crl ca revoked
crl crl-expired ca "" "-crlsec 1"
ca other-ca "unrelated CA"
member rogue other-ca "chunkserve rogue node"
crl other-crl other-ca
chmod 644 ./*.pem ./*.key
echo "wrote: $(ls ./*.pem ./*.key | tr '\n' ' ')"
