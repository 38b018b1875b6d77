"""A real one-node Slurm cluster for the tests: munged, slurmctld and slurmd from Debian's packages.

Everything lives under one scratch folder (key, sockets, state, logs) and uses free ports, so it
touches nothing system-wide and several test sessions could run side by side. The configuration is
tests/ops/slurm/slurm.conf; `SlurmCluster.env` points Slurm's commands at it (SLURM_CONF).
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tests.e2e.conftest import stop
from tests.factories.waiting import wait_until
from trainmaster.ports import free_port

CONF_TEMPLATE = Path(__file__).with_name("slurm") / "slurm.conf"
DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "scancel", "squeue", "sinfo", "scontrol")


def missing_binaries() -> list[str]:
    return [name for name in DAEMONS if shutil.which(name) is None and not Path("/usr/sbin", name).exists()]


def _bin(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


@dataclass
class SlurmCluster:
    dir: Path
    env: dict[str, str]
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def run(self, *args: str, env: dict[str, str] | None = None, check: bool = True) -> str:
        done = subprocess.run(
            [_bin(args[0]), *args[1:]], env={**self.env, **(env or {})}, capture_output=True, text=True, timeout=60
        )
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed ({done.returncode}): {done.stderr or done.stdout}")
        return done.stdout

    def job_state(self, job_id: str) -> str:
        """The allocation's state from squeue ("" once slurmctld forgot it: finished)."""
        return self.run("squeue", "--noheader", "--jobs", job_id, "--format=%T", check=False).strip()

    def allocation_log(self, name: str) -> str:
        path = self.dir / "log" / f"allocation-{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def logs(self) -> str:
        parts = []
        for path in sorted((self.dir / "log").glob("*")):
            parts.append(f"--- {path.name}\n{path.read_text(errors='replace')[-3000:]}")
        return "\n".join(parts)


@contextmanager
def running_slurm(scratch: Path) -> Iterator[SlurmCluster]:
    """munged, then slurmctld and slurmd in the foreground (-D) as children of this process."""
    for sub in ("munge", "state", "spool", "log"):
        (scratch / sub).mkdir(parents=True, exist_ok=True)
    (scratch / "munge").chmod(0o700)
    key = scratch / "munge" / "munge.key"
    subprocess.run([_bin("mungekey"), "--create", f"--keyfile={key}"], check=True, capture_output=True)
    key.chmod(0o600)
    node = socket.gethostname().split(".")[0]
    conf = scratch / "slurm.conf"
    conf.write_text(
        CONF_TEMPLATE.read_text().format(
            node=node,
            address="127.0.0.1",
            ctld_port=free_port(16817),
            slurmd_port=free_port(16818),
            dir=scratch,
            user=getpass.getuser(),
            cpus=os.cpu_count() or 1,
            memory_mb=4000,
        )
    )
    env = {**os.environ, "SLURM_CONF": str(conf)}
    cluster = SlurmCluster(dir=scratch, env=env)
    log = (scratch / "log" / "daemons.out").open("ab")
    munge_socket = scratch / "munge" / "munge.socket"
    try:
        cluster.processes.append(
            subprocess.Popen(
                [
                    _bin("munged"),
                    "--foreground",
                    "--force",  # the scratch folder sits under /tmp, which munged finds too open
                    f"--key-file={key}",
                    f"--socket={munge_socket}",
                    f"--pid-file={scratch}/munge/munged.pid",
                    f"--log-file={scratch}/log/munged.log",
                    f"--seed-file={scratch}/munge/munged.seed",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
        wait_until(munge_socket.exists, 20, interval=0.2, what="munged's socket")
        for daemon in ("slurmctld", "slurmd"):
            args = [_bin(daemon), "-D", "-f", str(conf)] + (["-N", node] if daemon == "slurmd" else [])
            cluster.processes.append(subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT))

        def node_idle() -> bool:
            for process in cluster.processes:
                if process.poll() is not None:
                    raise RuntimeError(f"a Slurm daemon exited:\n{cluster.logs()}")
            state = cluster.run("sinfo", "--noheader", "--format=%T", check=False).strip()
            return state == "idle"

        wait_until(node_idle, 60, interval=0.2, what="the Slurm node to be idle")
        yield cluster
    finally:
        for process in reversed(cluster.processes):
            stop(process, 20)
        log.close()
