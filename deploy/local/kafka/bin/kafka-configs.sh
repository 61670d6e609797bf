#!/bin/bash
# kafka-configs.sh as in Kafka's distribution (SCRAM users, broker settings).
KAFKA_HEAP_OPTS=-Xmx128m KAFKA_OPTS= exec /opt/kafka/bin/kafka-class.sh kafka.admin.ConfigCommand "$@"
