#!/bin/bash
# First start with DOCKER_INFLUXDB_INIT_MODE=setup: a temporary influxd on 127.0.0.1:9999 takes
# POST /api/v2/setup (user, org, bucket, retention, admin token; plain HTTP on the container's
# loopback), runs any
# /docker-entrypoint-initdb.d/*.sh with INFLUX_HOST and INFLUX_TOKEN set, and stops; then influxd
# replaces this script. Later starts find the bolt file and skip the setup.
set -euo pipefail
seconds() {  # 1h, 30d, 2w, 90m, 45s; empty or 0: infinite
  local v="${1:-0}"
  case "$v" in
    *w) echo $((${v%w} * 604800)) ;; *d) echo $((${v%d} * 86400)) ;; *h) echo $((${v%h} * 3600)) ;;
    *m) echo $((${v%m} * 60)) ;; *s) echo "${v%s}" ;; *) echo "$v" ;;
  esac
}
json() { local s="${1//\\/\\\\}"; printf '"%s"' "${s//\"/\\\"}"; }
if [ "${DOCKER_INFLUXDB_INIT_MODE:-}" = setup ] && [ ! -e "$INFLUXD_BOLT_PATH" ]; then
  # plain HTTP on the container's own loopback while it is set up, even when INFLUXD_TLS_* ask
  # the server proper for TLS
  env -u INFLUXD_TLS_CERT -u INFLUXD_TLS_KEY influxd --http-bind-address 127.0.0.1:9999 --reporting-disabled &
  pid=$!
  until curl -fsS -o /dev/null http://127.0.0.1:9999/health; do
    kill -0 "$pid" 2>/dev/null || { echo "influxd exited during setup" >&2; exit 1; }
    sleep 0.5
  done
  body="{\"username\":$(json "$DOCKER_INFLUXDB_INIT_USERNAME"),\"password\":$(json "$DOCKER_INFLUXDB_INIT_PASSWORD"),"
  body+="\"org\":$(json "$DOCKER_INFLUXDB_INIT_ORG"),\"bucket\":$(json "$DOCKER_INFLUXDB_INIT_BUCKET"),"
  body+="\"token\":$(json "$DOCKER_INFLUXDB_INIT_ADMIN_TOKEN"),"
  body+="\"retentionPeriodSeconds\":$(seconds "${DOCKER_INFLUXDB_INIT_RETENTION:-}")}"
  curl -fsS -o /dev/null -X POST -H 'Content-Type: application/json' --data-binary @- \
    http://127.0.0.1:9999/api/v2/setup <<<"$body"
  export INFLUX_HOST=http://127.0.0.1:9999 INFLUX_TOKEN="$DOCKER_INFLUXDB_INIT_ADMIN_TOKEN"
  for script in /docker-entrypoint-initdb.d/*.sh; do
    [ -e "$script" ] && bash "$script"
  done
  kill "$pid"
  wait "$pid" || true
  echo "influxdb: first-time setup done (org $DOCKER_INFLUXDB_INIT_ORG)"
fi
exec influxd --reporting-disabled "$@"
