#!/bin/sh
# The start of platform/docker/postgres.Dockerfile, as postgres:16's entrypoint does it: on an empty
# $PGDATA, initdb with POSTGRES_USER as the superuser (password auth over TCP), create POSTGRES_DB, run
# /docker-entrypoint-initdb.d/*.sh against a server that listens on no port and on a private socket
# (so the health check's pg_isready answers only once the real server is up), then serve on 5432.
set -eu
: "${POSTGRES_USER:=postgres}" "${POSTGRES_DB:=$POSTGRES_USER}"
: "${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD}"
export POSTGRES_USER POSTGRES_DB

if [ ! -s "$PGDATA/PG_VERSION" ]; then
  pwfile=$(mktemp)
  printf '%s\n' "$POSTGRES_PASSWORD" > "$pwfile"
  initdb --username="$POSTGRES_USER" --pwfile="$pwfile" --auth-local=trust --auth-host=scram-sha-256 \
    --encoding=UTF8 --no-instructions -D "$PGDATA" >/dev/null
  rm -f "$pwfile"
  printf 'host all all all scram-sha-256\n' >> "$PGDATA/pg_hba.conf"
  init_socket=$(mktemp -d)
  pg_ctl -D "$PGDATA" -w -o "-c listen_addresses='' -c unix_socket_directories=$init_socket" start >/dev/null
  export PGHOST="$init_socket"
  if [ "$POSTGRES_DB" != postgres ]; then
    psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname postgres \
      -c "CREATE DATABASE \"$POSTGRES_DB\"" >/dev/null
  fi
  for script in /docker-entrypoint-initdb.d/*.sh; do
    [ -e "$script" ] || continue
    echo "postgres-entrypoint: running $script"
    sh "$script"
  done
  pg_ctl -D "$PGDATA" -w -m fast stop >/dev/null
  unset PGHOST
  rmdir "$init_socket"
fi
exec postgres -D "$PGDATA" -c listen_addresses='*' -c unix_socket_directories=/var/run/postgresql
