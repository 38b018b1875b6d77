"""The dashboard's static files: vendored uPlot as recorded, no inline script, no HTML from strings;
the terminal's job table within 80 columns; the workers' log filter."""

from __future__ import annotations

import hashlib
import json
import logging
import re
from datetime import datetime, timezone
from pathlib import Path

from rich.console import Console

from trainmaster.cli.output import job_detail, jobs_table, wide_jobs_table
from trainmaster.models import Job, JobEvent
from workers.job_output import PlatformRequests

UI = Path(__file__).resolve().parents[2] / "api" / "ui"


def test_vendored_files_match_their_recorded_checksums() -> None:
    record = json.loads((UI / "vendor.json").read_text())["uplot"]
    assert record["license"] == "MIT" and record["version"] == "1.6.32"
    assert record["source"].startswith("https://registry.npmjs.org/uplot/-/uplot-")
    for path, digest in record["files"].items():
        assert hashlib.sha256((UI / path).read_bytes()).hexdigest() == digest, path
    vendored = {str(p.relative_to(UI)) for p in (UI / "static" / "vendor").rglob("*") if p.is_file()}
    assert vendored == set(record["files"])


def test_pages_have_no_inline_script_and_build_no_html_from_strings() -> None:
    index = (UI / "static" / "index.html").read_text()
    scripts = re.findall(r"<script\b[^>]*>(.*?)</script>", index, flags=re.S)
    assert scripts and all(not body.strip() for body in scripts)
    assert not re.search(r"\son[a-z]+\s*=", index), "inline event handler"
    for module in (UI / "static").rglob("*.js"):
        if "vendor" in module.parts:
            continue
        source = module.read_text()
        for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
            assert sink not in source, f"{module.name} uses {sink}"


def test_ls_table_fits_80_columns_with_short_ids() -> None:
    now = datetime.now(timezone.utc)
    jobs = [
        Job(
            id="0123abcd-0000-4000-8000-000000000000",
            project="p",
            name="a very long job name that would never fit in a terminal " * 2,
            status="queued",
            spec={"scaling": {"num_workers": 1024}},
            created_at=now,
            pending_reason="needs 4096 GPU as 1024x4 GPU PACK; cluster has 2 GPU free of 2 " * 3,
            queue_position=1234,
        ),
        Job(
            id="ffffabcd-0000-4000-8000-000000000000",
            project="p",
            name="mlp",
            status="timed_out",
            spec={},
            created_at=now,
        ),
    ]
    console = Console(width=80, record=True)
    console.print(jobs_table(jobs, width=80))
    lines = console.export_text().splitlines()
    assert max(len(line) for line in lines) <= 80
    assert lines[1].startswith("0123abcd ") and "0123abcd-" not in lines[1]
    assert "#1234 needs" in lines[1] and "…" in lines[1]
    assert lines[2].startswith("ffffabcd ") and "timed_out" in lines[2]


def test_text_from_jobs_is_shown_as_written_never_read_as_markup() -> None:
    # Ray's errors, job names and event messages hold brackets: "[/]" once made `get` crash with empty output.
    now = datetime.now(timezone.utc)
    job = Job(
        id="0123abcd-0000-4000-8000-000000000000",
        project="p",
        name="[b]loud[/b] [/]",
        status="failed",
        spec={"entrypoint": "builtin:mlp"},
        created_at=now,
        error="training failed: WorkerGroupError: [rank 1] died [/] see [link=x]",
    )
    event = JobEvent(id=1, job_id=job.id, created_at=now, kind="note", message="exit [red]1[/]", count=1)
    for table in (job_detail(job, [event]), jobs_table([job], width=400), wide_jobs_table([job])):
        console = Console(width=400, record=True)
        console.print(table)
        shown = console.export_text()
        assert "[b]loud[/b] [/]" in shown
        assert "[rank 1] died [/] see [link=x]" in shown
    console = Console(width=400, record=True)
    console.print(job_detail(job, [event]))
    assert "exit [red]1[/]" in console.export_text()


def test_platform_request_lines_are_dropped_and_others_kept() -> None:
    keep = PlatformRequests("http://127.0.0.1:8000/")
    line = 'HTTP Request: %s %s "%s %d %s"'

    def record(url: str) -> logging.LogRecord:
        return logging.LogRecord(
            "httpx", logging.INFO, __file__, 1, line, ("POST", url, "HTTP/1.1", 201, "Created"), None
        )

    assert not keep.filter(record("http://127.0.0.1:8000/v1/jobs/x/metrics"))
    assert keep.filter(record("https://huggingface.co/api/models"))
