#!/bin/sh
# Tansu speaks the Kafka protocol on :9092 and advertises the service name, as the compose
# file's KAFKA_ADVERTISED_LISTENERS (PLAINTEXT://kafka:9092) does. In-memory storage: events
# in flight are lost on restart (the statistics service's counters are what persists).
set -eu
adv=${KAFKA_ADVERTISED_LISTENERS:-PLAINTEXT://kafka:9092}
adv=tcp://${adv#*://}
exec /usr/local/bin/tansu broker --cluster-id "${CLUSTER_ID:-tansu_cluster}" \
  --listener-url tcp://0.0.0.0:9092 --advertised-listener-url "$adv" --storage-engine memory://tansu/
