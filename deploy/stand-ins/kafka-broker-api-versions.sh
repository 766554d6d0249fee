#!/bin/bash
# Stand-in for Apache Kafka's tool of this name, as the compose healthcheck calls it
# (`--bootstrap-server host:port`): succeeds when the broker accepts a connection there.
set -eu
server=localhost:9092
while [ $# -gt 0 ]; do
  case $1 in --bootstrap-server) server=$2; shift 2 ;; *) shift ;; esac
done
exec 3<>"/dev/tcp/${server%:*}/${server##*:}"
