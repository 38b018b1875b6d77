# PostgreSQL from Debian's package, for where the official postgres:16 image cannot be pulled (no
# image registry: tests/compose/ builds BASE_IMAGE with debootstrap). It takes what docker-compose.yml
# gives postgres:16: POSTGRES_USER, POSTGRES_PASSWORD, POSTGRES_DB, the scripts in
# /docker-entrypoint-initdb.d (run once, on an empty data folder), the data in /var/lib/postgresql/data
# and pg_isready for the health check.
# Build from platform/docker:  docker build -f postgres.Dockerfile --build-arg BASE_IMAGE=<debian> .
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}

# No cluster of Debian's own (createcluster.conf): the entrypoint makes the one in $PGDATA.
RUN mkdir -p /etc/postgresql-common \
 && echo 'create_main_cluster = false' > /etc/postgresql-common/createcluster.conf \
 && apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      -o Dpkg::Options::=--force-unsafe-io postgresql \
 && rm -rf /var/lib/apt/lists/* \
 && install -d -o postgres -g postgres -m 0700 /var/lib/postgresql/data /docker-entrypoint-initdb.d \
 && install -d -o postgres -g postgres -m 2775 /var/run/postgresql \
 && ln -s /usr/lib/postgresql/*/bin /usr/lib/postgresql/bin
COPY postgres-entrypoint.sh /usr/local/bin/postgres-entrypoint.sh
ENV PATH=/usr/lib/postgresql/bin:$PATH PGDATA=/var/lib/postgresql/data
USER postgres
EXPOSE 5432
ENTRYPOINT ["/usr/local/bin/postgres-entrypoint.sh"]
