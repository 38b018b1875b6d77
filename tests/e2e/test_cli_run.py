"""`trainmaster run` as a person types it, against the session's stack.

The first runs a torchrun-style script (gloo, all-reduce) on 2 workers and cannot finish before the
test has read the script's line from the CLI's stdout (the script waits for a file the test writes
then): output seen live, not printed after the end. The second hangs and is interrupted: SIGINT
without a terminal cancels the job, the CLI exits 2, and the cancel reaches Ray (the gang's CPUs free,
its placement group removed).
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import TRAINMASTER, Stack
from tests.factories.waiting import wait_until

pytestmark = pytest.mark.ray

SCRIPT = """\
import argparse, os, sys, time
from pathlib import Path

import torch
import torch.distributed as dist

import trainmaster

here = Path(__file__).resolve().parent
parser = argparse.ArgumentParser()
parser.add_argument("--release")
parser.add_argument("--hang", action="store_true")
args = parser.parse_args()
if args.hang:
    print("hanging until cancelled", flush=True)
    time.sleep(600)
    sys.exit(1)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
# torchrun's environment, as script mode sets it for every worker
names = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")
master = "set" if os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT") else "missing"
print("torchrun env " + " ".join(f"{n}={os.environ.get(n)}" for n in names) + f" MASTER={master}", flush=True)
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)
trainmaster.log({"sum": total.item()}, step=1)
absent = [name for name in (".env", "ignored.txt", "data/big.bin") if not (here / name).exists()]
if rank == 0:
    print(f"all_reduce sum {total.item():g} over {world} workers; absent: {' '.join(absent)}", flush=True)
    deadline = time.monotonic() + 240
    while not Path(args.release).exists():
        if time.monotonic() > deadline:
            sys.exit("never released: the CLI did not show the line above while the job ran")
        time.sleep(0.2)
dist.barrier()
if rank == 0:
    print("released", flush=True)
dist.destroy_process_group()
"""


def _default_sigint() -> None:
    """A process started with SIGINT ignored keeps it ignored across exec, and Python then installs no
    KeyboardInterrupt handler: that is what a shell does to a background job (`scripts/test &`, a CI
    runner's nohup), and the CLI below would never see the test's SIGINT. The test's child gets the
    default disposition, as a person's terminal would give it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Cli:
    """`trainmaster run` in a subprocess, without a terminal; its stdout lines are read as they come."""

    def __init__(self, stack: Stack, folder: Path, *args: str):
        env = {**os.environ, "TRAINMASTER_API_URL": stack.api.url, "TRAINMASTER_TOKEN": stack.api.token}
        for name in ("TRAINMASTER_JOB_ID", "RANK", "WORLD_SIZE"):
            env.pop(name, None)
        self.process = subprocess.Popen(
            [TRAINMASTER, "run", *args],
            cwd=folder,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            preexec_fn=_default_sigint,
        )
        self.lines: list[str] = []
        self._queue: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait_for_line(self, words: str, timeout: float = 240) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self._queue.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                break
            if line is None:
                raise AssertionError(f"the CLI ended before printing {words!r}:\n" + "\n".join(self.lines))
            self.lines.append(line)
            if words in line:
                return line
        raise AssertionError(f"no line with {words!r} in {timeout} s:\n" + "\n".join(self.lines))

    def finish(self, timeout: float = 240) -> int:
        code = self.process.wait(timeout)
        while (line := self._queue.get(timeout=10)) is not None:
            self.lines.append(line)
        return code

    @property
    def output(self) -> str:
        return "\n".join(self.lines)


def test_run_ships_the_folder_follows_the_job_live_and_exits_with_its_outcome(stack: Stack, tmp_path: Path) -> None:
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "train.py").write_text(SCRIPT)
    (folder / ".gitignore").write_text("ignored.txt\ndata/\n")
    (folder / "ignored.txt").write_text("not for the cluster")
    (folder / "data").mkdir()
    (folder / "data" / "big.bin").write_bytes(b"\0" * 1024)
    (folder / ".env").write_text("API_KEY=do-not-ship\n")
    release = tmp_path / "release"

    started = time.monotonic()
    cli = Cli(stack, folder, "train.py", "--workers", "2", "--cpus-per-worker", "1", "--", "--release", str(release))
    line = cli.wait_for_line("all_reduce sum")
    release.touch()  # only now can the job finish: the line above came while it ran
    assert "all_reduce sum 3 over 2 workers; absent: .env ignored.txt data/big.bin" in line, cli.output
    assert cli.finish() == 0, cli.output
    first_s = time.monotonic() - started
    assert "not shipped (secrets): .env" in cli.output and "uploaded 2 files" in cli.output, cli.output
    short_id = next(line.split()[1] for line in cli.lines if line.startswith("submitted "))
    assert "released" in cli.output and f"{short_id} succeeded" in cli.output, cli.output
    assert "latest metrics: sum 3" in cli.output, cli.output  # the job's own metric, from the metric stream
    for rank in (0, 1):  # each worker's own line, forwarded live: what torchrun would have given it
        expected = f"torchrun env RANK={rank} LOCAL_RANK={rank} WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 MASTER=set"
        assert expected in cli.output, cli.output
    with stack.client() as client:
        job = client.get(client.resolve_id(short_id)).info
    assert job.status.value == "succeeded" and job.spec["args"] == ["--release", str(release)]
    assert job.spec["entrypoint"] == "script:train.py" and job.spec["scaling"]["num_workers"] == 2
    print(f"run: {first_s:.1f} s")


def test_ctrl_c_without_a_terminal_cancels_the_job_exits_2_and_frees_its_resources(
    stack: Stack, tmp_path: Path
) -> None:
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "train.py").write_text(SCRIPT)
    started = time.monotonic()
    cli = Cli(stack, folder, "train.py", "--workers", "1", "--", "--hang")
    try:
        cli.wait_for_line("hanging until cancelled")
        # Ray's resource report (/api/cluster_status) follows the gang a moment later, more under load.
        held = "Ray to show the gang"
        wait_until(lambda: 0 <= stack.ray.free_cpus() <= stack.ray.total_cpus() - 1, 60, interval=0.5, what=held)
        cli.process.send_signal(signal.SIGINT)
        cli.wait_for_line("cancelling", timeout=60)  # the cancel was asked for
        assert cli.finish() == 2, cli.output
        short_id = next(line.split()[1] for line in cli.lines if line.startswith("submitted "))
        with stack.client() as client:
            job = client.get(client.resolve_id(short_id)).info
        assert job.status.value == "cancelled" and job.attempts[-1].status == "stopped", job
        # The cancel went through to Ray: the gang's CPUs free again, its placement group removed.
        every_cpu_free = "Ray to report every CPU free again"
        wait_until(lambda: stack.ray.free_cpus() == stack.ray.total_cpus(), 60, interval=0.5, what=every_cpu_free)
        from ray.util.state import list_placement_groups

        groups = list_placement_groups(address=stack.ray.dashboard, detail=True)
        assert groups and all(group.state == "REMOVED" for group in groups)
    finally:
        if cli.process.poll() is None:
            cli.process.kill()
        submitted = [line.split()[1] for line in cli.lines if line.startswith("submitted ")]
        with stack.client() as client:
            for short_id in submitted:  # never leave a hanging job holding the worker's CPUs
                job = client.get(client.resolve_id(short_id)).info
                if not job.status.terminal:
                    client.cancel(job.id)
    print(f"interrupted run: {time.monotonic() - started:.1f} s")
