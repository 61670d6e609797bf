#!/usr/bin/env bash
# Build Prometheus from the Go module proxy, for the compose check's image (deploy/local/). The web
# UI's assets are not embedded (the published module lacks their npm build; no `builtinassets`
# tag): scraping and the HTTP API are what the steplens stack uses.
# Output: $STEPLENS_CACHE/prometheus/$VERSION/prometheus
set -euo pipefail
VERSION="${1:-0.316.0}"
CACHE="${STEPLENS_CACHE:-$HOME/.cache/steplens}"
OUT="$CACHE/prometheus/$VERSION"
[ -x "$OUT/prometheus" ] && { echo "prometheus $VERSION already built: $OUT/prometheus"; exit 0; }
command -v go >/dev/null || { echo "missing 'go': install Go >= 1.25 (https://go.dev/dl)" >&2; exit 3; }
# the module carries a go.work of its tools and UI packages: build the module alone
export GOFLAGS="-mod=mod" GOTOOLCHAIN=local CGO_ENABLED=0 GOWORK=off
mkdir -p "$CACHE/build" "$OUT"
# One build at a time, also when this script is run by hand next to another caller.
exec 9>"$OUT/.recipe.lock"
if ! flock -n 9; then
  echo "[prometheus] another build of $VERSION is running; waiting for it"
  flock 9
fi
[ -x "$OUT/prometheus" ] && { echo "prometheus $VERSION already built: $OUT/prometheus"; exit 0; }
echo "[prometheus] downloading github.com/prometheus/prometheus@v$VERSION"
tmpmod=$(mktemp -d); trap 'rm -rf "$tmpmod"' EXIT
dir=$(cd "$tmpmod" && go mod download -json "github.com/prometheus/prometheus@v$VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
src="$CACHE/build/prometheus-$VERSION"
rm -rf "$src"; cp -r "$dir" "$src"; chmod -R u+w "$src"
cd "$src"
echo "[prometheus] building prometheus (first time: several minutes on 2 cores)"
# Service discovery: file and http always, DNS (how compose replicas are found) by tag; the
# cloud providers' discovery (and their SDKs, most of the build) is left out.
go build -trimpath -tags remove_all_sd,enable_dns_sd -ldflags "-X github.com/prometheus/common/version.Version=$VERSION" \
  -o "$OUT/prometheus.tmp" ./cmd/prometheus
mv "$OUT/prometheus.tmp" "$OUT/prometheus"
rm -rf "$src"
echo "[prometheus] built $OUT/prometheus"
