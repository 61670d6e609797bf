#!/usr/bin/env bash
# Debian packages the stack and the tests need: Java 17 and Maven (Kafka, s3proxy), pkg-config
# (libflux), docker-compose (validating docker-compose.yml), debootstrap (the base image of
# `make compose-check`), chromium (the report's browser test). Go and Rust must be on PATH.
set -euo pipefail
need=()
command -v java >/dev/null || need+=(openjdk-17-jre-headless)
command -v mvn >/dev/null || need+=(maven)
command -v pkg-config >/dev/null || need+=(pkg-config)
command -v docker-compose >/dev/null || need+=(docker-compose)
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v chromium >/dev/null || need+=(chromium)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "[setup] installing Debian packages: ${need[*]}"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  else
    echo "[setup] please install: ${need[*]} (sudo apt-get install ...)" >&2
  fi
fi
for tool in go cargo; do
  command -v "$tool" >/dev/null || echo "[setup] warning: '$tool' not found; InfluxDB 2 cannot be built without Go and Rust (cargo)" >&2
done
exit 0
