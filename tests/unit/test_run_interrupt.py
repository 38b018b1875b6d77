"""Ctrl-C while `trainmaster run` follows a job: asked on a terminal, cancelled without one.

(tests/e2e/test_cli_run.py sends a real SIGINT to the CLI without a terminal; these cover the rest.)
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone
from types import SimpleNamespace
from typing import Any

import pytest
import typer

from trainmaster.cli import run as run_cli
from trainmaster.cli.output import console
from trainmaster.models import Job, JobStatus

JOB_ID = "3f2a9c1e-0000-4000-8000-000000000000"


def job(status: JobStatus) -> Job:
    return Job(id=JOB_ID, project="p", name="train.py", status=status, spec={}, created_at=datetime.now(timezone.utc))


class FakeWatch:
    """Follows by raising KeyboardInterrupt `interrupts` times, then answering the job as it ended."""

    def __init__(self, interrupts: int, final: JobStatus):
        self.job = job(JobStatus.running)
        self.short_id = JOB_ID[:8]
        self.interrupts = interrupts
        self.final = final

    def follow_logs(self, client: Any, *, live: bool) -> Job:
        if self.interrupts:
            self.interrupts -= 1
            raise KeyboardInterrupt
        return job(self.final)


class FakeClient:
    def __init__(self) -> None:
        self.cancelled: list[str] = []

    def cancel(self, job_id: str) -> Job:
        self.cancelled.append(job_id)
        return job(JobStatus.cancelling)


def terminal(monkeypatch: pytest.MonkeyPatch, is_tty: bool, answers: list[Callable[[], str]] | None = None) -> None:
    monkeypatch.setattr(run_cli.sys, "stdin", SimpleNamespace(isatty=lambda: is_tty))
    pending = list(answers or [])
    monkeypatch.setattr(console, "input", lambda prompt="": pending.pop(0)())


def answer(text: str) -> Callable[[], str]:
    return lambda: text


def interrupt() -> str:
    raise KeyboardInterrupt


def test_without_a_terminal_the_first_ctrl_c_cancels_and_the_outcome_is_the_jobs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    terminal(monkeypatch, is_tty=False)
    client = FakeClient()
    final = run_cli._follow(client, FakeWatch(1, JobStatus.cancelled))  # type: ignore[arg-type]
    assert client.cancelled == [JOB_ID] and run_cli.EXIT_CODES[final.status] == 2


def test_without_a_terminal_a_second_ctrl_c_stops_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    terminal(monkeypatch, is_tty=False)
    client = FakeClient()
    with pytest.raises(typer.Exit) as exit_:
        run_cli._follow(client, FakeWatch(2, JobStatus.cancelled))  # type: ignore[arg-type]
    assert exit_.value.exit_code == run_cli.LEFT_RUNNING and client.cancelled == [JOB_ID]


@pytest.mark.parametrize(("reply", "cancelled"), [("y", [JOB_ID]), ("yes", [JOB_ID]), ("", []), ("n", [])])
def test_on_a_terminal_ctrl_c_asks_and_follows_on_unless_told_to_cancel(
    monkeypatch: pytest.MonkeyPatch, reply: str, cancelled: list[str]
) -> None:
    terminal(monkeypatch, is_tty=True, answers=[answer(reply)])
    client = FakeClient()
    final = run_cli._follow(client, FakeWatch(1, JobStatus.succeeded))  # type: ignore[arg-type]
    assert client.cancelled == cancelled and final.status is JobStatus.succeeded


def test_on_a_terminal_a_second_ctrl_c_leaves_the_job_running(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    terminal(monkeypatch, is_tty=True, answers=[interrupt])
    client = FakeClient()
    with pytest.raises(typer.Exit) as exit_:
        run_cli._follow(client, FakeWatch(1, JobStatus.succeeded))  # type: ignore[arg-type]
    assert exit_.value.exit_code == run_cli.LEFT_RUNNING and client.cancelled == []
    out = capsys.readouterr().out
    assert "keeps running" in out and f"trainmaster logs -f {JOB_ID[:8]}" in out


def test_exit_codes_cover_every_terminal_status() -> None:
    assert {status for status in JobStatus if status.terminal} == set(run_cli.EXIT_CODES)
    assert [run_cli.EXIT_CODES[s] for s in (JobStatus.succeeded, JobStatus.failed, JobStatus.timed_out)] == [0, 1, 2]
