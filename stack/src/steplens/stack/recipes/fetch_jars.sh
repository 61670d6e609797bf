#!/usr/bin/env bash
# Resolve a Maven artifact and its runtime dependencies into one folder of jars.
# usage: fetch_jars.sh OUTDIR GROUP:ARTIFACT:VERSION [GROUP:ARTIFACT:VERSION ...]
set -euo pipefail
out="$1"; shift
[ -f "$out/.complete" ] && { echo "jars already in $out"; exit 0; }
command -v mvn >/dev/null || { echo "missing 'mvn': install Maven (apt-get install maven) and Java 17" >&2; exit 3; }
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
deps=""
for coord in "$@"; do
  IFS=: read -r g a v <<<"$coord"
  deps="$deps<dependency><groupId>$g</groupId><artifactId>$a</artifactId><version>$v</version></dependency>"
done
cat > "$work/pom.xml" <<POM
<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>
<groupId>steplens.stack</groupId><artifactId>jars</artifactId><version>1</version>
<packaging>pom</packaging><dependencies>$deps</dependencies></project>
POM
mkdir -p "$out"
mvn -q -B -f "$work/pom.xml" dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$out"
touch "$out/.complete"
echo "jars in $out: $(ls "$out" | wc -l)"
