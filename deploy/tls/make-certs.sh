#!/usr/bin/env bash
# A self-signed CA and one server certificate for the compose stack's TLS endpoints (Kafka's
# SASL_SSL listener, InfluxDB, S3):
#
#   STEPLENS_TLS_KEYSTORE_PASSWORD=... deploy/tls/make-certs.sh DIR kafka.example.org [NAME|IP ...]
#
# DIR/ca.crt, DIR/ca.key   the CA (keep ca.key off the servers; give ca.crt to every client)
# DIR/server/              what docker-compose.yml mounts (STEPLENS_TLS_DIR=DIR/server):
#   ca.crt                 the CA again, for the services of the file
#   server.crt, server.key the server's certificate and key (PEM; InfluxDB)
#   server.p12             the same pair, locked with STEPLENS_TLS_KEYSTORE_PASSWORD (Kafka, s3proxy)
# The certificate names every NAME/IP given, plus kafka, influxdb, s3, localhost and 127.0.0.1.
# The key files belong to uid STEPLENS_TLS_UID (default 1000, the images' user) when run as root.
# An existing CA in DIR is reused; the server files are written anew. Valid STEPLENS_TLS_DAYS
# (default 825) days.
set -euo pipefail
dir=${1:?usage: make-certs.sh DIR NAME [NAME|IP ...]}
shift
: "${STEPLENS_TLS_KEYSTORE_PASSWORD:?set STEPLENS_TLS_KEYSTORE_PASSWORD (it locks server.p12)}"
days=${STEPLENS_TLS_DAYS:-825}
uid=${STEPLENS_TLS_UID:-1000}
umask 077
mkdir -p "$dir/server"
san=""
for name in "$@" kafka influxdb s3 localhost 127.0.0.1; do
  if [[ $name =~ ^[0-9.]+$ || $name == *:* ]]; then san+="IP:$name,"; else san+="DNS:$name,"; fi
done
if [ ! -e "$dir/ca.key" ]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -noenc -days "$days" \
    -subj "/CN=steplens CA" -addext "keyUsage=critical,keyCertSign,cRLSign" -keyout "$dir/ca.key" -out "$dir/ca.crt" 2>/dev/null
fi
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -noenc -days "$days" \
  -subj "/CN=${1:-localhost}" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" \
  -addext "subjectAltName=${san%,}" -addext "basicConstraints=critical,CA:FALSE" \
  -addext "keyUsage=critical,digitalSignature" -addext "extendedKeyUsage=serverAuth" \
  -keyout "$dir/server/server.key" -out "$dir/server/server.crt" 2>/dev/null
openssl pkcs12 -export -in "$dir/server/server.crt" -inkey "$dir/server/server.key" \
  -name server -passout env:STEPLENS_TLS_KEYSTORE_PASSWORD -out "$dir/server/server.p12"
cp "$dir/ca.crt" "$dir/server/ca.crt"
chmod 644 "$dir/ca.crt" "$dir/server/ca.crt" "$dir/server/server.crt"
chmod 755 "$dir" "$dir/server"
if [ "$(id -u)" = 0 ]; then chown "$uid" "$dir/server/server.key" "$dir/server/server.p12"; fi
echo "CA: $dir/ca.crt; for docker-compose.yml: STEPLENS_TLS_DIR=$dir/server ($(openssl x509 -in "$dir/server/server.crt" -noout -ext subjectAltName | tail -1 | tr -d ' '))"
