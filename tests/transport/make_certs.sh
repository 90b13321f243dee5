#!/bin/sh
# Writes the certificates the TLS tests use into OUT_DIR (made if missing), with the openssl
# command line only: P-256 keys, SHA-256 signatures.
#   ca.pem ca.key              the deployment's certificate authority
#   stage.pem stage.key        a stage: subjectAltName localhost, 127.0.0.1 and ::1; server and client use
#   driver.pem driver.key      a driver: the same names and uses (a driver may also be a stage)
#   other-ca.pem               another authority, and other.pem other.key signed by it (a wrong CA)
#   expired.pem expired.key    signed by ca.pem, valid only in January 2020
#   wrongname.pem wrongname.key  signed by ca.pem for elsewhere.invalid only (a name mismatch)
# usage: make_certs.sh OUT_DIR
set -eu
out=$1
mkdir -p "$out"
cd "$out"
names="subjectAltName=DNS:localhost,IP:127.0.0.1,IP:::1"
uses="keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth,clientAuth"

key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; chmod 600 "$1"; }

authority() { # NAME CN
    key "$1.key"
    openssl req -x509 -new -key "$1.key" -out "$1.pem" -days 3650 -subj "/CN=$2" \
        -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
}

leaf() { # NAME CA CN SAN [openssl x509 date options...]
    name=$1 ca=$2 cn=$3 san=$4
    shift 4
    key "$name.key"
    openssl req -new -key "$name.key" -subj "/CN=$cn" -out "$name.csr"
    printf '%s\n%s\nbasicConstraints=CA:FALSE\n' "$san" "$uses" >"$name.ext"
    openssl x509 -req -in "$name.csr" -CA "$ca.pem" -CAkey "$ca.key" -CAcreateserial -out "$name.pem" \
        -extfile "$name.ext" "$@" 2>/dev/null
    rm -f "$name.csr" "$name.ext"
}

authority ca "rlx test CA"
authority other-ca "rlx other CA"
leaf stage ca "rlx stage" "$names" -days 3650
leaf driver ca "rlx driver" "$names" -days 3650
leaf other other-ca "rlx stage of another CA" "$names" -days 3650
leaf wrongname ca "rlx elsewhere" "subjectAltName=DNS:elsewhere.invalid" -days 3650

# An expired certificate: `openssl x509` only counts days forward, `openssl ca` takes dates.
key expired.key
openssl req -new -key expired.key -subj "/CN=rlx expired" -out expired.csr
mkdir -p ca-db
: >ca-db/index.txt
cat >ca-db/ca.cnf <<CNF
[ca]
default_ca = expired
[expired]
database = ca-db/index.txt
new_certs_dir = ca-db
serial = ca-db/serial
default_md = sha256
policy = any
copy_extensions = none
x509_extensions = leaf
[any]
commonName = supplied
[leaf]
basicConstraints = CA:FALSE
$names
keyUsage = critical,digitalSignature
extendedKeyUsage = serverAuth,clientAuth
CNF
echo 01 >ca-db/serial
openssl ca -batch -config ca-db/ca.cnf -cert ca.pem -keyfile ca.key -in expired.csr -out expired.pem -notext \
    -startdate 20200101000000Z -enddate 20200131000000Z 2>/dev/null
rm -rf ca-db expired.csr ca.srl other-ca.srl
