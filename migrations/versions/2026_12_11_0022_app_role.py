"""The least-privilege role the API and the dispatcher connect as: trainmaster_app

Revision ID: 0022_app_role
Revises: 0021_topology
Create Date: 2026-12-11 09:00:00

- `trainmaster_app`, a role without login (NOSUPERUSER NOCREATEDB NOCREATEROLE): the rights the
  services need and nothing more: read and write rows of every table of the schema (SELECT, INSERT,
  UPDATE, DELETE; COPY FROM STDIN is an INSERT), use its sequences, and read `alembic_version` only.
  It cannot create or alter anything, read files or run programs (`COPY … TO PROGRAM` needs a
  superuser or pg_execute_server_program), make roles, or see other databases' data.
- Tables of later migrations get the same rights (ALTER DEFAULT PRIVILEGES of the migrating role).
- An operator makes the login the services use a member of it (README, "A least-privilege database
  role"): `CREATE ROLE trainmaster_service LOGIN PASSWORD '…' IN ROLE trainmaster_app`. Migrations
  keep running as the owner (`trainmaster db upgrade`, `TRAINMASTER_MIGRATION_DATABASE_URL`).
- A migrating role that may not create roles (some managed databases) skips the creation with a
  notice, and the grants go to a `trainmaster_app` made by the operator, or are skipped if there is none.

Catalogue change only.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0022_app_role"
down_revision: str | None = "0021_topology"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ROLE = "trainmaster_app"

UPGRADE = f"""
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{ROLE}') THEN
        BEGIN
            CREATE ROLE {ROLE} NOLOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION;
        EXCEPTION
            WHEN duplicate_object OR unique_violation THEN NULL;  -- another database's migration made it
            WHEN insufficient_privilege THEN
                RAISE NOTICE 'cannot create role {ROLE} (%): create it, then run the migration again', SQLERRM;
                RETURN;
        END;
    END IF;
    EXECUTE format('GRANT CONNECT ON DATABASE %I TO {ROLE}', current_database());
    GRANT USAGE ON SCHEMA public TO {ROLE};
    GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {ROLE};
    REVOKE INSERT, UPDATE, DELETE ON alembic_version FROM {ROLE};
    GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA public TO {ROLE};
    ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO {ROLE};
    ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT USAGE, SELECT, UPDATE ON SEQUENCES TO {ROLE};
END $$;
"""

DOWNGRADE = f"""
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = '{ROLE}') THEN
        ALTER DEFAULT PRIVILEGES IN SCHEMA public REVOKE ALL ON TABLES FROM {ROLE};
        ALTER DEFAULT PRIVILEGES IN SCHEMA public REVOKE ALL ON SEQUENCES FROM {ROLE};
        REVOKE ALL ON ALL TABLES IN SCHEMA public FROM {ROLE};
        REVOKE ALL ON ALL SEQUENCES IN SCHEMA public FROM {ROLE};
        REVOKE USAGE ON SCHEMA public FROM {ROLE};
        EXECUTE format('REVOKE CONNECT ON DATABASE %I FROM {ROLE}', current_database());
    END IF;
END $$;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    # The role itself stays: it is cluster-wide, and other databases of the server may use it.
    op.execute(DOWNGRADE)
