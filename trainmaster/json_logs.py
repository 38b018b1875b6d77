"""The one logging set-up of every process the platform runs: one JSON object per line.

A line holds `time` (UTC, ISO 8601), `level`, `logger`, `event` (the message: a short name such as
`job_launched`), then the call's fields at the top level, and `exception` (the formatted traceback)
where there is one. Call sites pass an event name and fields, never text to parse:

    log.info("job_launched", extra={"job_id": str(job.id), "attempt": n})

The standard library's `logging` only. The API (`trainmaster api`, uvicorn's own loggers included,
through `uvicorn_config`), the dispatcher and `trainmaster up`'s supervisor log this way from the root
(`configure`); a job's driver and each node's warm driver server only from the platform's own loggers
(`configure_logger`), since the job's code runs in those processes. A library's text message keeps its
words as the `event`, as structlog renders foreign records; uvicorn's access lines become
`http_request` with their parts as fields.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import datetime, timezone
from typing import Any

# Attributes every LogRecord has: anything else on a record came from the call's `extra`. uvicorn
# repeats its message with terminal colour codes as `color_message`: not a field.
_NOT_FIELDS = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    "color_message",
}

# Libraries chatty at INFO whose lines say nothing about the platform (httpx logs every request).
QUIET = {"httpx": logging.WARNING, "httpcore": logging.WARNING}


class JsonFormatter(logging.Formatter):
    """A record as one JSON object on one line (newlines inside values are escaped by JSON)."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "event": record.getMessage(),
        }
        line.update(
            (key, value)
            for key, value in record.__dict__.items()
            if key not in _NOT_FIELDS and not key.startswith("_")  # Ray's record factory adds _ray_…
        )
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, default=str)


class UvicornAccessFields(logging.Filter):
    """uvicorn's access record (`%s - "%s %s HTTP/%s" %d` and its five arguments) as the event
    `http_request` with those arguments as fields."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and len(record.args) == 5:
            client, method, path, http_version, status = record.args
            record.msg, record.args = "http_request", ()
            record.__dict__.update(client=client, method=method, path=path, http_version=http_version, status=status)
        return True


def _stderr_handler() -> logging.Handler:
    out = logging.StreamHandler(sys.stderr)
    out.setFormatter(JsonFormatter())
    return out


def configure(level: int = logging.INFO) -> None:
    """Make this process's root logger write JSON lines to stderr; call it once, at the process's start.

    Loggers that a library gave handlers of its own (Ray gives `ray` one at import) lose them and
    propagate to the root, so their lines are JSON too; Python's warnings and an uncaught exception are
    logged as well, not printed as text.
    """
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(_stderr_handler())
    root.setLevel(level)
    for name, quiet in QUIET.items():
        logging.getLogger(name).setLevel(quiet)
    for name, existing in list(logging.Logger.manager.loggerDict.items()):
        if isinstance(existing, logging.Logger) and existing.handlers:
            adopt(name)
    logging.captureWarnings(True)
    sys.excepthook = _log_uncaught


def adopt(name: str) -> None:
    """Where this process writes JSON lines (its root logger does), so does the logger `name`, whose
    library gave it handlers of its own: they go, and its records reach the root's. Call it after
    importing such a library later than `configure` (Ray sets up `ray` at its first import)."""
    if not any(isinstance(each.formatter, JsonFormatter) for each in logging.getLogger().handlers):
        return
    library = logging.getLogger(name)
    for old in list(library.handlers):
        library.removeHandler(old)
    library.propagate = True


def configure_logger(name: str, level: int = logging.INFO) -> None:
    """Make the logger `name` (and those below it) write JSON lines to stderr, not the root: for a
    process that runs a job's code (a job's driver, the warm server that forks drivers), whose own
    logging set-up (a `logging.basicConfig` in the job) must work as it would without the platform."""
    logger = logging.getLogger(name)
    for old in list(logger.handlers):
        logger.removeHandler(old)
    logger.addHandler(_stderr_handler())
    logger.setLevel(level)
    logger.propagate = False


def uvicorn_config(level: str = "INFO") -> dict[str, Any]:
    """`uvicorn.run(log_config=...)`: applied by uvicorn in every worker process it starts, so each
    worker's root logger, and uvicorn's own, write JSON lines to stderr."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": f"{__name__}.JsonFormatter"}},
        "filters": {"access": {"()": f"{__name__}.UvicornAccessFields"}},
        "handlers": {
            "stderr": {"class": "logging.StreamHandler", "formatter": "json", "stream": "ext://sys.stderr"},
            "access": {
                "class": "logging.StreamHandler",
                "formatter": "json",
                "filters": ["access"],
                "stream": "ext://sys.stderr",
            },
        },
        "loggers": {
            "uvicorn": {"level": level, "handlers": [], "propagate": True},
            "uvicorn.error": {"level": level, "handlers": [], "propagate": True},
            "uvicorn.access": {"level": level, "handlers": ["access"], "propagate": False},
            **{name: {"level": logging.getLevelName(quiet)} for name, quiet in QUIET.items()},
        },
        "root": {"level": level, "handlers": ["stderr"]},
    }


def _log_uncaught(kind: type[BaseException], value: BaseException, traceback: Any) -> None:
    if issubclass(kind, KeyboardInterrupt):
        sys.__excepthook__(kind, value, traceback)
        return
    logging.getLogger("trainmaster").critical("uncaught_exception", exc_info=(kind, value, traceback))
