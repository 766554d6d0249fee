#!/bin/bash
# What the postgres image does on start, with Debian's PostgreSQL 15: initialise $PGDATA once
# (POSTGRES_USER as superuser with POSTGRES_PASSWORD, database POSTGRES_DB), then run postgres
# listening on every address, password (scram) authentication from other hosts.
set -euo pipefail
: "${POSTGRES_USER:=postgres}" "${POSTGRES_DB:=$POSTGRES_USER}" "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD is required}"
BIN=/usr/lib/postgresql/15/bin
# Started as root (compose), it drops to postgres itself; started as postgres (uid 70, as the chart
# runs the postgres image in Kubernetes), the data volume is already its own through fsGroup.
AS_PG=()
[ "$(id -u)" != 0 ] || AS_PG=(setpriv --reuid=postgres --regid=postgres --init-groups)
as_pg() { "${AS_PG[@]}" "$@"; }
mkdir -p "$PGDATA" /run/postgresql
[ "$(id -u)" != 0 ] || chown -R postgres:postgres "$PGDATA" /run/postgresql
chmod 700 "$PGDATA"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  pwfile=$(mktemp); printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"; chown postgres "$pwfile"
  as_pg "$BIN/initdb" -D "$PGDATA" -U "$POSTGRES_USER" --pwfile="$pwfile" --auth-local=trust \
    --auth-host=scram-sha-256 --encoding=UTF8 >/dev/null
  rm -f "$pwfile"
  echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
  as_pg "$BIN/pg_ctl" -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
  if [ "$POSTGRES_DB" != postgres ]; then
    as_pg "$BIN/psql" -U "$POSTGRES_USER" -d postgres -v ON_ERROR_STOP=1 -q \
      -c "CREATE DATABASE \"$POSTGRES_DB\""
  fi
  as_pg "$BIN/pg_ctl" -D "$PGDATA" -m fast -w stop >/dev/null
fi
exec "${AS_PG[@]}" "$BIN/postgres" -D "$PGDATA" \
  -c listen_addresses='*' -c unix_socket_directories=/run/postgresql "$@"
