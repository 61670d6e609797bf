#!/bin/bash
# S3PROXY_<NAME> becomes s3proxy.<name> ('_' -> '-'), JCLOUDS_<NAME> becomes jclouds.<name>
# ('_' -> '.'); S3PROXY_JAVA_OPTS goes to the JVM. The properties file holds the secret key.
set -euo pipefail
props=$(mktemp)
for var in $(compgen -e); do
  value="${!var}"
  case "$var" in
    S3PROXY_JAVA_OPTS) continue ;;
    S3PROXY_*) key="${var#S3PROXY_}"; key="${key,,}"; printf 's3proxy.%s=%s\n' "${key//_/-}" "$value" ;;
    JCLOUDS_*) key="${var#JCLOUDS_}"; key="${key,,}"; printf 'jclouds.%s=%s\n' "${key//_/.}" "$value" ;;
  esac
done >"$props"
exec java ${S3PROXY_JAVA_OPTS:-} -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Djava.awt.headless=true -Dlogback.configurationFile=/opt/s3proxy/logback.xml \
  -cp '/opt/s3proxy/libs/*' org.gaul.s3proxy.Main --properties "$props"
