#!/usr/bin/env bash
# A small CA and one certificate per hsapd node, for mutual TLS between
# daemons (hsapd --tls_cert, --tls_key, --tls_ca; docs/reliability.md,
# "Trust between daemons"). openssl CLI only.
#
#   deploy/tls/make_certs.sh OUT_DIR NAME=SANS [NAME=SANS ...]
#
#   OUT_DIR   where to write; ca.pem / ca.key are made once and reused
#   NAME      a file name for the node: OUT_DIR/NAME.pem and NAME.key
#   SANS      the node's subject alternative names, openssl syntax: the host
#             of the address the node advertises (--advertise_address) must
#             be among them, e.g. DNS:node-1.hsap.svc,IP:10.0.0.11
#
# Example (two daemons on one machine):
#   deploy/tls/make_certs.sh /etc/hsap/tls a=IP:127.0.0.1 b=IP:127.0.0.1
#   hsapd --port=7070 --tls_cert=/etc/hsap/tls/a.pem --tls_key=/etc/hsap/tls/a.key \
#         --tls_ca=/etc/hsap/tls/ca.pem ...
#
# Environment: HSAP_CA_NAME (the CA's common name, "hsap-cluster-ca"),
# HSAP_CERT_DAYS (validity, 365), HSAP_CA_DAYS (3650). Keys are EC P-256,
# written mode 0600. The CA key signs every node of the cluster: keep it
# off the nodes (only ca.pem goes there). In Kubernetes, cert-manager can
# play this CA's part (deploy/README.md).
set -euo pipefail

if [[ $# -lt 2 ]]; then
  sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
out=$1
shift
mkdir -p "$out"
umask 077
ca_name=${HSAP_CA_NAME:-hsap-cluster-ca}
cert_days=${HSAP_CERT_DAYS:-365}
ca_days=${HSAP_CA_DAYS:-3650}

if [[ ! -f "$out/ca.pem" || ! -f "$out/ca.key" ]]; then
  openssl ecparam -name prime256v1 -genkey -noout -out "$out/ca.key"
  openssl req -x509 -new -key "$out/ca.key" -sha256 -days "$ca_days" -subj "/CN=$ca_name" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" -out "$out/ca.pem"
  chmod 0644 "$out/ca.pem"
  echo "make_certs: CA $ca_name -> $out/ca.pem (key $out/ca.key)"
fi

for spec in "$@"; do
  name=${spec%%=*}
  sans=${spec#*=}
  if [[ -z "$name" || "$name" == "$spec" || -z "$sans" ]]; then
    echo "make_certs: '$spec' is not NAME=SANS (e.g. node-1=DNS:node-1,IP:10.0.0.11)" >&2
    exit 2
  fi
  ext=$(mktemp)
  trap 'rm -f "$ext"' EXIT
  cat >"$ext" <<CONF
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth,clientAuth
subjectAltName=$sans
CONF
  openssl ecparam -name prime256v1 -genkey -noout -out "$out/$name.key"
  openssl req -new -key "$out/$name.key" -subj "/CN=$name" -out "$out/$name.csr"
  openssl x509 -req -in "$out/$name.csr" -CA "$out/ca.pem" -CAkey "$out/ca.key" \
    -CAcreateserial -days "$cert_days" -sha256 -extfile "$ext" -out "$out/$name.pem" 2>/dev/null
  rm -f "$out/$name.csr" "$ext"
  chmod 0600 "$out/$name.key"
  chmod 0644 "$out/$name.pem"
  echo "make_certs: $name ($sans) -> $out/$name.pem, $out/$name.key"
done
