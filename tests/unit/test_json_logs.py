"""trainmaster/json_logs.py: each record is one JSON line with its fields at the top level, and every
log call of the platform names an event (the e2e test of a job's life reads the real processes' lines)."""

from __future__ import annotations

import ast
import io
import json
import logging
import logging.config
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from trainmaster import json_logs

REPO = Path(__file__).resolve().parents[2]
EVENT_NAME = r"^[a-z][a-z0-9_]*$"


@pytest.fixture
def lines() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(json_logs.JsonFormatter())
    logger = logging.getLogger(f"trainmaster.test.{uuid.uuid4().hex}")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    yield logger, out
    logger.removeHandler(handler)


def parsed(out: io.StringIO) -> list[dict[str, Any]]:
    text = out.getvalue()
    assert text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


def test_the_fields_of_a_call_are_fields_of_its_line(lines: tuple[logging.Logger, io.StringIO]) -> None:
    logger, out = lines
    job_id = uuid.uuid4()
    logger.warning("job_launched", extra={"job_id": job_id, "attempt": 2, "path": Path("/x"), "gone": ["a", "b"]})
    [line] = parsed(out)
    assert line["event"] == "job_launched" and line["level"] == "WARNING" and line["logger"] == logger.name
    assert (line["job_id"], line["attempt"], line["path"], line["gone"]) == (str(job_id), 2, "/x", ["a", "b"])
    assert line["time"].endswith("+00:00") and "T" in line["time"]
    assert "exception" not in line and "msg" not in line and "args" not in line


def test_a_message_with_quotes_and_newlines_is_one_valid_line(lines: tuple[logging.Logger, io.StringIO]) -> None:
    logger, out = lines
    text = 'he said "stop"\nand {"event": "forged"} \\ \u2028 left'
    logger.info(text, extra={"error": 'a "quoted"\r\nerror'})
    assert out.getvalue().count("\n") == 1
    [line] = parsed(out)
    assert line["event"] == text and line["error"] == 'a "quoted"\r\nerror'


def test_an_exception_is_a_field_of_the_same_line(lines: tuple[logging.Logger, io.StringIO]) -> None:
    logger, out = lines
    try:
        raise ValueError("bad\nvalue")
    except ValueError:
        logger.exception("round_failed", extra={"cluster": "default"})
    [line] = parsed(out)
    assert line["event"] == "round_failed" and line["level"] == "ERROR" and line["cluster"] == "default"
    assert line["exception"].startswith("Traceback (most recent call last):")
    assert line["exception"].endswith("ValueError: bad\nvalue")


def test_uvicorns_access_line_is_an_http_request_event_with_its_parts() -> None:
    access = ("1.2.3.4:5", "GET", "/x?y=1", "1.1", 200)
    record = logging.LogRecord("uvicorn.access", logging.INFO, "", 0, '%s - "%s %s HTTP/%s" %d', access, None)
    json_logs.UvicornAccessFields().filter(record)
    line = json.loads(json_logs.JsonFormatter().format(record))
    assert line["event"] == "http_request"
    assert (line["client"], line["method"], line["path"], line["status"]) == ("1.2.3.4:5", "GET", "/x?y=1", 200)


# A process set up as the dispatcher is: a library logger with a handler of its own (as Ray's `ray`),
# one made after `configure` (as Ray imported later), a warning, an uncaught exception.
PROCESS = """
import logging, sys, warnings
from trainmaster import json_logs
early = logging.getLogger("library")
early.addHandler(logging.StreamHandler(sys.stderr))
early.propagate = False
json_logs.configure()
late = logging.getLogger("library.late")
late.addHandler(logging.StreamHandler(sys.stderr))
late.propagate = False
json_logs.adopt("library.late")
early.warning("plain text from a library")
late.warning("imported after configure")
logging.getLogger("trainmaster.dispatcher").info("dispatcher_started", extra={"owner": "d1"})
logging.getLogger("httpx").info("HTTP Request: GET / (quiet below WARNING)")
warnings.warn("old api")
raise RuntimeError("the end")
"""


def test_a_configured_process_writes_only_json_lines_to_stderr() -> None:
    done = subprocess.run([sys.executable, "-c", PROCESS], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and done.stdout == ""
    lines = [json.loads(line) for line in done.stderr.splitlines()]
    assert all(isinstance(line, dict) and line["event"] and line["level"] for line in lines), done.stderr
    events = [line["event"] for line in lines]
    assert events[:3] == ["plain text from a library", "imported after configure", "dispatcher_started"]
    assert "old api" in events[3] and lines[3]["logger"] == "py.warnings"
    assert events[4] == "uncaught_exception" and lines[4]["exception"].endswith("RuntimeError: the end")
    assert len(lines) == 5


def test_uvicorns_log_config_routes_its_loggers_and_the_roots_through_the_formatter() -> None:
    script = (
        "import logging, logging.config\n"
        "from trainmaster import json_logs\n"
        "logging.config.dictConfig(json_logs.uvicorn_config())\n"
        "logging.getLogger('uvicorn.error').info('Started server process [%d]', 7, extra={'color_message': '7'})\n"
        "logging.getLogger('uvicorn.access').info('%s - \"%s %s HTTP/%s\" %d', 'c', 'POST', '/v1/jobs', '1.1', 201)\n"
        "logging.getLogger('trainmaster.api').info('job_submitted', extra={'job_id': 'j'})\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stderr.splitlines()]
    assert [line["event"] for line in lines] == ["Started server process [7]", "http_request", "job_submitted"]
    assert lines[1]["status"] == 201 and lines[2]["job_id"] == "j" and "color_message" not in lines[0]


LEVELS = {"debug", "info", "warning", "error", "exception", "critical"}


def log_calls(path: Path) -> Iterator[tuple[int, ast.Call]]:
    """Each `<logger>.<level>(...)` call of a module, through a logger named log or logger."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in LEVELS
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id in {"log", "logger", "_log"}
            and node.args
        ):
            yield node.lineno, node


def event_names(argument: ast.expr) -> list[str] | None:
    """The event names a call's first argument can be: literals, or a choice between two; else None."""
    if isinstance(argument, ast.Constant) and isinstance(argument.value, str):
        return [argument.value]
    if isinstance(argument, ast.IfExp):
        body, orelse = event_names(argument.body), event_names(argument.orelse)
        return body + orelse if body is not None and orelse is not None else None
    return None


def test_every_log_call_of_the_platform_names_an_event_and_passes_fields_apart() -> None:
    """No text, no format arguments, no json.dumps in a message: an event name, and `extra` for the rest."""
    wrong = []
    for package in ("api", "trainmaster", "workers"):
        for path in sorted((REPO / package).rglob("*.py")):
            for lineno, call in log_calls(path):
                names = event_names(call.args[0])
                named = names is not None and all(re.match(EVENT_NAME, name) for name in names)
                if not named or len(call.args) > 1:  # more arguments: a message formatted with them
                    wrong.append(f"{path.relative_to(REPO)}:{lineno}: {ast.unparse(call)[:100]}")
    assert not wrong, "\n".join(wrong)
