"""What PostgreSQL being unreachable looks like, and the 503 that answers it."""

from __future__ import annotations

import logging

import psycopg
import psycopg_pool
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.responses import JSONResponse

from api.errors import DatabaseUnavailable, domain_error_response

log = logging.getLogger("trainmaster.api")

# Errors that mean PostgreSQL is unreachable (the engine's, and the direct connections' of api/db/direct.py).
DATABASE_DOWN: tuple[type[Exception], ...] = (
    OperationalError,
    InterfaceError,
    PoolTimeout,
    ConnectionRefusedError,
    psycopg.OperationalError,
    psycopg.InterfaceError,
    psycopg_pool.PoolTimeout,
)


def lost_in_flight(exc: BaseException) -> bool:
    """Whether a direct connection broke with its statement perhaps already in PostgreSQL's hands, so
    whether it committed is unknown; a pool timeout sent nothing."""
    lost = isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError))
    return lost and not isinstance(exc, psycopg_pool.PoolTimeout)  # PoolTimeout is an OperationalError


def database_unavailable(exc: Exception) -> JSONResponse:
    log.warning("database_unavailable", extra={"error": exc.__class__.__name__})
    return domain_error_response(DatabaseUnavailable())
