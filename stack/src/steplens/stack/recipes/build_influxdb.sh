#!/usr/bin/env bash
# Build influxd (InfluxDB 2.x OSS) from the Go module proxy; libflux is built by cargo
# through influxdata's pkg-config wrapper. Output: $STEPLENS_CACHE/influxdb/$VERSION/influxd
set -euo pipefail
VERSION="${1:-2.9.1}"
PKGCONFIG_VERSION="v0.3.0"
CACHE="${STEPLENS_CACHE:-$HOME/.cache/steplens}"
OUT="$CACHE/influxdb/$VERSION"
[ -x "$OUT/influxd" ] && { echo "influxd $VERSION already built: $OUT/influxd"; exit 0; }
for tool in go cargo rustc pkg-config; do
  command -v "$tool" >/dev/null || { echo "missing '$tool': install it (Go >= 1.22, Rust via rustup, Debian's pkg-config)" >&2; exit 3; }
done
export GOFLAGS="-mod=mod" GOTOOLCHAIN=local
mkdir -p "$CACHE/bin" "$CACHE/build" "$OUT"
# One build at a time, also when this script is run by hand next to `steplens stack up`.
exec 9>"$OUT/.recipe.lock"
if ! flock -n 9; then
  echo "[influxdb] another build of $VERSION is running; waiting for it"
  flock 9
fi
[ -x "$OUT/influxd" ] && { echo "influxd $VERSION already built: $OUT/influxd"; exit 0; }
echo "[influxdb] installing the pkg-config wrapper $PKGCONFIG_VERSION"
GOBIN="$CACHE/bin" go install "github.com/influxdata/pkg-config@$PKGCONFIG_VERSION"
echo "[influxdb] downloading github.com/influxdata/influxdb/v2@v$VERSION"
tmpmod=$(mktemp -d); trap 'rm -rf "$tmpmod"' EXIT
dir=$(cd "$tmpmod" && go mod download -json "github.com/influxdata/influxdb/v2@v$VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
src="$CACHE/build/influxdb-$VERSION"
rm -rf "$src"; cp -r "$dir" "$src"; chmod -R u+w "$src"
# flux pins an older toolchain in rust-toolchain.toml; use the installed one and tolerate new lints.
export RUSTUP_TOOLCHAIN="${RUSTUP_TOOLCHAIN:-$(rustup show active-toolchain 2>/dev/null | cut -d' ' -f1 || echo stable)}"
export RUSTFLAGS="${RUSTFLAGS:-} --cap-lints=warn"
export PKG_CONFIG="$CACHE/bin/pkg-config"
echo "[influxdb] building influxd: libflux with cargo, then go"
cd "$src"
go build -tags sqlite_foreign_keys,sqlite_json -o "$OUT/influxd.tmp" ./cmd/influxd
mv "$OUT/influxd.tmp" "$OUT/influxd"
echo "[influxdb] built $OUT/influxd"
