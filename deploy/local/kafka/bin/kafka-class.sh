#!/bin/bash
# Run one of Kafka's main classes on the image's jars: kafka-class.sh CLASS [ARGS...]
exec java ${KAFKA_HEAP_OPTS:--Xmx256m} -XX:TieredStopAtLevel=1 \
  -Dlog4j2.configurationFile=file:/opt/kafka/bin/log4j2.properties ${KAFKA_OPTS:-} \
  -cp '/opt/kafka/libs/*' "$@"
