#!/usr/bin/env bash
# Build every image of the compose stack without an image registry (for docker-compose.local.yml):
#   steplens-local/base:bookworm     Debian from the archive (debootstrap), imported
#   steplens-local/jre:17            + Debian's Java 17
#   steplens-local/kafka, /s3proxy   + the jars `steplens stack up` fetches
#   steplens-local/influxdb          + the influxd `steplens stack up` builds
#   steplens-local/prometheus        + a Prometheus built from the Go module proxy
#   steplens-local/python:3.11       + Debian's Python in a virtual environment (-ca-HASH: with the
#                                    certificates of STEPLENS_BUILD_CA_DIR, HASH of their files)
#   steplens:local                   deploy/Dockerfile on that Python image
# usage: KAFKA_LIBS=DIR S3PROXY_LIBS=DIR INFLUXD=FILE PROMETHEUS=FILE and each one's *_VERSION
#        build-images.sh  (steplens.stack.compose_check sets them)
# Images that exist are kept (STEPLENS_REBUILD=1: build them all again); the steplens image is
# built every time, from Docker's layer cache while the tree is unchanged. Certificates in
# STEPLENS_BUILD_CA_DIR (*.crt) are trusted by pip in the Python image, for an HTTPS proxy in
# front of the package index; unset, nothing is added (see python_image).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
HERE="$ROOT/deploy/local"
SUITE=bookworm
# The Python image's tag names the certificates it trusts (a hash of the *.crt files of
# STEPLENS_BUILD_CA_DIR and their names), so that setting, changing or unsetting the folder
# builds the image it names instead of keeping one without them. `build-images.sh
# --python-image` prints that tag and builds nothing.
python_image() {
  local tag=steplens-local/python:3.11 f
  [ -z "${STEPLENS_BUILD_CA_DIR:-}" ] && { echo "$tag"; return; }
  compgen -G "$STEPLENS_BUILD_CA_DIR/*.crt" >/dev/null ||
    { echo "STEPLENS_BUILD_CA_DIR=$STEPLENS_BUILD_CA_DIR holds no *.crt" >&2; return 3; }
  echo "$tag-ca-$(cd "$STEPLENS_BUILD_CA_DIR" && for f in *.crt; do printf '%s\n' "$f"; cat "$f"; done | sha256sum | cut -c1-12)"
}
if [ "${1:-}" = --python-image ]; then python_image; exit; fi
: "${KAFKA_VERSION:?}" "${S3PROXY_VERSION:?}" "${INFLUXDB_VERSION:?}" "${PROMETHEUS_VERSION:?}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
: "${KAFKA_LIBS:?}" "${S3PROXY_LIBS:?}" "${INFLUXD:?}" "${PROMETHEUS:?}"
export DOCKER_BUILDKIT=0  # the daemon's own builder: no buildx plugin needed

ctx=$(mktemp -d)
trap 'rm -rf "$ctx" "$ctx.log" "${ca:-}"' EXIT
say() { printf '[images] %s\n' "$*"; }
# run a command with its output shown only when it fails
quietly() { "$@" >"$ctx.log" 2>&1 || { cat "$ctx.log" >&2; return 1; }; }
have() { [ -z "${STEPLENS_REBUILD:-}" ] && docker image inspect "$1" >/dev/null 2>&1; }
# build TAG DOCKERFILE_DIR [NAME=PATH ...]: the context is the Dockerfile's folder plus each PATH
# (a file or a folder) under NAME
build() {
  local tag=$1 dir=$2 item
  shift 2
  if have "$tag"; then say "$tag: kept"; return; fi
  say "$tag: building"
  rm -rf "$ctx" && mkdir -p "$ctx" && cp -r "$dir"/. "$ctx"/
  for item in "$@"; do cp -rL "${item#*=}" "$ctx/${item%%=*}"; done
  quietly docker build --build-arg BASE_IMAGE=steplens-local/base:$SUITE -t "$tag" "$ctx"
}

if ! have steplens-local/base:$SUITE; then
  command -v debootstrap >/dev/null || { echo "missing 'debootstrap' (apt-get install debootstrap)" >&2; exit 3; }
  say "steplens-local/base:$SUITE: debootstrap from $MIRROR"
  root=$(mktemp -d)
  debootstrap --variant=minbase --include=ca-certificates,curl,netbase "$SUITE" "$root" "$MIRROR" >/dev/null
  rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/archives/*.deb
  tar -C "$root" -c . | docker import \
    -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' -c 'CMD ["/bin/bash"]' \
    - steplens-local/base:$SUITE >/dev/null
  rm -rf "$root"
fi

build steplens-local/jre:17 "$HERE/jre"
build steplens-local/kafka:$KAFKA_VERSION "$HERE/kafka" "libs=$KAFKA_LIBS"
build steplens-local/s3proxy:$S3PROXY_VERSION "$HERE/s3proxy" "libs=$S3PROXY_LIBS"
build steplens-local/influxdb:$INFLUXDB_VERSION "$HERE/influxdb" "influxd=$INFLUXD"
build steplens-local/prometheus:$PROMETHEUS_VERSION "$HERE/prometheus" "prometheus=$PROMETHEUS"
ca=$(mktemp -d)
python=$(python_image)
if [ -n "${STEPLENS_BUILD_CA_DIR:-}" ]; then cp "$STEPLENS_BUILD_CA_DIR"/*.crt "$ca"/; fi
build "$python" "$HERE/python" "ca=$ca"
rm -rf "$ca"

say "steplens:local: building deploy/Dockerfile on $python"
# the context deploy/Dockerfile.dockerignore describes (the daemon's own builder reads no
# per-Dockerfile ignore file)
tar -C "$ROOT" -c --exclude=__pycache__ --exclude='*.egg-info' --exclude=.pytest_cache \
  deploy/Dockerfile deploy/image_requirements.py constraints.txt schema producer stream_jobs sinks stack |
  quietly docker build -f deploy/Dockerfile --build-arg BASE_IMAGE="$python" \
    -t steplens:local -
say "all images built"
