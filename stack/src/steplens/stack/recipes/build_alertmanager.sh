#!/usr/bin/env bash
# Build Alertmanager from the Go module proxy. Only its API is used: the web UI (an npm build
# that the published module lacks) is replaced by a placeholder page.
# Output: $STEPLENS_CACHE/alertmanager/$VERSION/alertmanager
set -euo pipefail
VERSION="${1:-0.35.0}"
CACHE="${STEPLENS_CACHE:-$HOME/.cache/steplens}"
OUT="$CACHE/alertmanager/$VERSION"
[ -x "$OUT/alertmanager" ] && { echo "alertmanager $VERSION already built: $OUT/alertmanager"; exit 0; }
command -v go >/dev/null || { echo "missing 'go': install Go >= 1.26 (https://go.dev/dl)" >&2; exit 3; }
# its go.mod asks for Go 1.26 and has no replace directives: the module builds as published
export GOFLAGS="-mod=mod" GOTOOLCHAIN=local
mkdir -p "$CACHE/build" "$OUT"
# One build at a time, also when this script is run by hand next to `steplens stack up`.
exec 9>"$OUT/.recipe.lock"
if ! flock -n 9; then
  echo "[alertmanager] another build of $VERSION is running; waiting for it"
  flock 9
fi
[ -x "$OUT/alertmanager" ] && { echo "alertmanager $VERSION already built: $OUT/alertmanager"; exit 0; }
echo "[alertmanager] downloading github.com/prometheus/alertmanager@v$VERSION"
tmpmod=$(mktemp -d); trap 'rm -rf "$tmpmod"' EXIT
dir=$(cd "$tmpmod" && go mod download -json "github.com/prometheus/alertmanager@v$VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
src="$CACHE/build/alertmanager-$VERSION"
rm -rf "$src"; cp -r "$dir" "$src"; chmod -R u+w "$src"
cd "$src"
# ui/web.go embeds ui/app/dist/{elm,mantine}, which only `make` with npm produces
for ui in elm mantine; do
  mkdir -p "ui/app/dist/$ui"
  [ -e "ui/app/dist/$ui/index.html" ] || printf '%s\n' '<!doctype html><title>Alertmanager</title><p>No web UI in this build: use the API under /api/v2 or amtool.' >"ui/app/dist/$ui/index.html"
done
echo "[alertmanager] building alertmanager (first time: a few minutes on 2 cores)"
go build -trimpath -ldflags "-X github.com/prometheus/common/version.Version=$VERSION" \
  -o "$OUT/alertmanager.tmp" ./cmd/alertmanager
mv "$OUT/alertmanager.tmp" "$OUT/alertmanager"
rm -rf "$src"
echo "[alertmanager] built $OUT/alertmanager"
