"""`trainmaster run`'s one view of a job: its log lines as they come, and under them (on a terminal) a
status line with the job's status, time and latest metrics.

Three streams feed it: the job's log stream (printed by the caller's thread, so Ctrl-C lands there),
its metric stream and a status poll (two daemon threads, each on a client of its own). Status changes
and pending reasons are printed as lines too, so a log file of the run reads well without a terminal.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable

from rich.live import Live
from rich.markup import escape
from rich.text import Text

from trainmaster.cli.output import SHORT_ID, STATUS_STYLE, console, styled_status
from trainmaster.client import Client
from trainmaster.errors import TrainmasterError
from trainmaster.models import Job, MetricValue

STATUS_POLL_S = 2.0
METRICS_SHOWN = 4


class JobWatch:
    """What the threads following one job share: the latest Job, the latest value of each metric
    (rank 0), and the last log line printed (a view that stops and starts again goes on after it)."""

    def __init__(self, job: Job, make_client: Callable[[], Client]):
        self.job = job
        self.metrics: dict[str, MetricValue] = {}
        self.last_log_seq = -1
        self._make_client = make_client
        self._stop = threading.Event()
        self._started = time.monotonic()
        self._threads = [
            threading.Thread(target=self._poll_status, name="tm-status", daemon=True),
            threading.Thread(target=self._stream_metrics, name="tm-metrics", daemon=True),
        ]

    @property
    def short_id(self) -> str:
        return self.job.id[:SHORT_ID]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()

    def follow_logs(self, client: Client, *, live: bool) -> Job:
        """Print the job's log lines until it ends (under a status line when `live`); the final Job."""
        view = (
            Live(get_renderable=self.status_line, console=console, transient=True, refresh_per_second=4)
            if live
            else contextlib.nullcontext()
        )
        with view:
            for line in client.logs(self.job.id, follow=True):
                if line.seq <= self.last_log_seq:
                    continue
                self.last_log_seq = line.seq
                console.print(line.line, markup=False, highlight=False, soft_wrap=True)
        self.job = client.get(self.job.id).info
        return self.job

    def status_line(self) -> Text:
        job = self.job
        elapsed = int(time.monotonic() - self._started)
        line = Text.assemble(
            (f"{self.short_id} ", "bold"),
            (job.status.value, STATUS_STYLE[job.status]),
            f" {elapsed // 60}:{elapsed % 60:02d}",
        )
        if job.pending_reason:
            line.append(f"  {job.pending_reason}", "yellow")
        if self.metrics:
            line.append("  " + self.metrics_summary())
        line.append("  (Ctrl-C: cancel or leave running)", "dim")
        line.truncate(max(console.width - 1, 20), overflow="ellipsis")
        return line

    def metrics_summary(self) -> str:
        """`loss 0.1234  acc 0.9  step 40`: the latest value of the first few metrics (rank 0), the
        job's own before the platform's system metrics (`sys/…`)."""
        shown = sorted(self.metrics.items(), key=lambda item: (item[0].startswith("sys/"), item[0]))[:METRICS_SHOWN]
        step = max((p.step for _, p in shown if p.step is not None), default=None)
        summary = "  ".join(f"{name} {_number(p.value)}" for name, p in shown)
        return summary + (f"  step {step}" if step is not None else "")

    def _poll_status(self) -> None:
        seen = (self.job.status, self.job.pending_reason)
        with contextlib.suppress(TrainmasterError), self._make_client() as client:
            while not self._stop.wait(STATUS_POLL_S):
                self.job = job = client.get(self.job.id).info
                if (job.status, job.pending_reason) != seen:
                    seen = (job.status, job.pending_reason)
                    reason = f": {escape(job.pending_reason)}" if job.pending_reason else ""
                    console.print(f"[dim]──[/] {self.short_id} {styled_status(job.status)}{reason}", highlight=False)
                if job.status.terminal:
                    return

    def _stream_metrics(self) -> None:
        with contextlib.suppress(TrainmasterError), self._make_client() as client:
            for point in client.stream_metrics(self.job.id):
                if self._stop.is_set():
                    return
                if point.rank == 0:
                    self.metrics[point.name] = point


def _number(value: float | None) -> str:
    return "nan" if value is None else f"{value:.4g}"
