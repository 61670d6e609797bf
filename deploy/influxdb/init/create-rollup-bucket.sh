#!/bin/bash
# Runs once, after the image's first-time setup: the long-lived bucket for 1-minute rollups.
set -e
influx bucket create --name steplens_rollup --retention 30d --org "$DOCKER_INFLUXDB_INIT_ORG"
