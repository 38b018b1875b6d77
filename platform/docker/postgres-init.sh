#!/bin/sh
# Run once by the postgres image on an empty data folder (/docker-entrypoint-initdb.d): the login the
# api and the dispatcher use, a member of trainmaster_app (migration 0022 grants that role its rights;
# it is made here first so the login can join it). Migrations run as POSTGRES_USER, the owner.
set -eu
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
     -v service_password="$TRAINMASTER_SERVICE_PASSWORD" <<'SQL'
CREATE ROLE trainmaster_app NOLOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION;
CREATE ROLE trainmaster_service LOGIN PASSWORD :'service_password' IN ROLE trainmaster_app;
SQL
