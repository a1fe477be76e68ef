#!/usr/bin/env bash
# Makes what a Gyre cluster needs for mutual TLS and its shared token (docs/security.md):
#
#   tools/make-certs.sh OUT_DIR [SERVER_NAME]
#
# OUT_DIR/ca.pem, ca.key      a new certificate authority (keep ca.key off the cluster)
# OUT_DIR/node.pem, node.key  a certificate it signed, for every Gyre process, whose subject
#                             alternative name is SERVER_NAME (default gyre: cluster.tls_server_name)
# OUT_DIR/token               a random 64-character token (cluster.auth_token_file)
#
# Then set cluster.tls_cert: OUT_DIR/node.pem, cluster.tls_key: OUT_DIR/node.key,
# cluster.tls_ca: OUT_DIR/ca.pem, cluster.auth_token_file: OUT_DIR/token. Certificates are valid
# for GYRE_CERT_DAYS days (default 30). Needs the openssl command. Existing files are not replaced.
set -euo pipefail

if [[ $# -lt 1 || $# -gt 2 || "$1" == "-h" || "$1" == "--help" ]]; then
  sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
OUT="$1"
NAME="${2:-gyre}"
DAYS="${GYRE_CERT_DAYS:-30}"
command -v openssl >/dev/null || { echo "make-certs: the openssl command is needed" >&2; exit 1; }
mkdir -p "$OUT"
for f in ca.pem ca.key node.pem node.key token; do
  if [[ -e "$OUT/$f" ]]; then
    echo "make-certs: $OUT/$f exists; not replacing it (remove the directory's files first)" >&2
    exit 1
  fi
done
umask 077
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
curve=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
openssl req -x509 "${curve[@]}" -keyout "$OUT/ca.key" -out "$OUT/ca.pem" -days "$DAYS" \
  -subj "/CN=gyre cluster CA" 2>/dev/null
openssl req "${curve[@]}" -keyout "$OUT/node.key" -out "$tmp/node.csr" -subj "/CN=${NAME}" 2>/dev/null
printf 'subjectAltName=DNS:%s\nextendedKeyUsage=serverAuth,clientAuth\nbasicConstraints=CA:FALSE\n' \
  "$NAME" > "$tmp/ext.cnf"
openssl x509 -req -in "$tmp/node.csr" -CA "$OUT/ca.pem" -CAkey "$OUT/ca.key" -CAcreateserial \
  -CAserial "$tmp/ca.srl" -out "$OUT/node.pem" -days "$DAYS" -extfile "$tmp/ext.cnf" 2>/dev/null
openssl rand -hex 32 > "$OUT/token"
chmod 644 "$OUT/ca.pem" "$OUT/node.pem"
echo "make-certs: wrote $OUT/{ca.pem,ca.key,node.pem,node.key,token} (server name '${NAME}', ${DAYS} days)"
