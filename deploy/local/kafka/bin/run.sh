#!/bin/bash
# The broker's start, as the apache/kafka image's: every KAFKA_<NAME> variable (bar the JVM's)
# becomes a line of server.properties ('_' -> '.', '__' -> '_', '___' -> '-'); the storage is
# formatted once with CLUSTER_ID, then the broker replaces this script.
set -euo pipefail
umask 077  # server.properties may hold the keystore's password
props=/etc/kafka/server.properties
: >"$props"
for var in $(compgen -e); do
  case "$var" in
    KAFKA_HEAP_OPTS | KAFKA_OPTS | KAFKA_JVM_PERFORMANCE_OPTS | KAFKA_GC_LOG_OPTS | KAFKA_LOG4J_OPTS | KAFKA_JMX_OPTS) continue ;;
    KAFKA_*) ;;
    *) continue ;;
  esac
  key="${var#KAFKA_}"; key="${key,,}"
  key="${key//___/-}"; key="${key//__/@}"; key="${key//_/.}"; key="${key//@/_}"
  printf '%s=%s\n' "$key" "${!var}" >>"$props"
done
logdirs=$(sed -n 's/^log\.dirs=//p' "$props")
if [ ! -e "${logdirs%%,*}/meta.properties" ]; then
  /opt/kafka/bin/kafka-class.sh kafka.tools.StorageTool format --ignore-formatted \
    -t "${CLUSTER_ID:-5L6g3nShT-eMCtK--X86sw}" -c "$props"
fi
exec java ${KAFKA_HEAP_OPTS:--Xmx1g} -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:TieredStopAtLevel=1 \
  -Djava.awt.headless=true -Dlog4j2.configurationFile=file:/opt/kafka/bin/log4j2.properties \
  ${KAFKA_OPTS:-} -cp '/opt/kafka/libs/*' kafka.Kafka "$props"
