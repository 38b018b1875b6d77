"""MPI: `mpirun` (Open MPI) across the gang's placement group, for mpi4py and Horovod-MPI programs.

Ray Train holds one bundle per worker; rank 0 writes a hostfile from the bundles' nodes (one line per
node, `slots` = the workers placed there) and runs `mpirun -np <num_workers>` over it, while the other
workers hold their bundles until it ends. On one node mpirun starts every process itself; to reach the
other nodes it needs no ssh: its rsh agent asks the first worker on each of them to start Open MPI's
daemon there (mpi_agent.py), with a secret only this job's workers know.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from workers import entrypoints
from workers.frameworks import gang, mpi_agent

PACKAGE = "mpi4py"
INSTALL = "apt-get install openmpi-bin and pip install 'trainmaster[mpi]'"

# What every MPI process needs from this worker's environment, on any node (mpirun -x).
FORWARDED_PREFIXES = ("TRAINMASTER_", "PYTHON", "PATH", "LD_LIBRARY_PATH", "VIRTUAL_ENV", "JAX_", "RAY_ADDRESS")


def trainer(spec: Any, *, train_fn: Any, config: dict[str, Any], scaling: Any, run: Any) -> Any:
    return gang.trainer(train_fn=train_fn, config=config, scaling=scaling, run=run)


def prepare(script: bool) -> None:
    if shutil.which("mpirun") is None:
        from workers.frameworks import FrameworkMissing

        raise FrameworkMissing(f"framework 'mpi' needs `mpirun` (Open MPI) on every node: {INSTALL}")


def runtime() -> dict[str, Any]:
    return {"backend": "mpirun (Open MPI)", "world_size": len(gang.endpoints())}


def hostfile_lines(nodes: list[str]) -> list[str]:
    """One line per node in first-rank order; `slots` = how many of the gang's workers it holds."""
    return [f"{node} slots={count}" for node, count in Counter(nodes).items()]


def remote_servers(nodes: list[str]) -> dict[str, int]:
    """For each node other than rank 0's: the first rank placed there, which starts mpirun's daemon."""
    servers: dict[str, int] = {}
    for rank, node in enumerate(nodes):
        if node != nodes[0]:
            servers.setdefault(node, rank)
    return servers


def mpirun_command(
    hostfile: Path, num_processes: int, forwarded: list[str], program: list[str], agent: list[str] | None = None
) -> list[str]:
    command = ["mpirun", "--hostfile", str(hostfile), "-np", str(num_processes), "--bind-to", "none"]
    if os.geteuid() == 0:
        command.append("--allow-run-as-root")  # containers run as root; Open MPI refuses it otherwise
    if agent:  # every daemon started from here, through the gang's workers (no tree spawn: no agent there)
        command += ["--mca", "plm_rsh_agent", " ".join(agent), "--mca", "plm_rsh_no_tree_spawn", "1"]
    for name in forwarded:
        command += ["-x", name]
    return [*command, *program]


def launch(program: list[str], env: dict[str, str], what: str) -> None:
    """Rank 0 runs `program` under mpirun over the gang; every other worker waits for it to end, and the
    first worker on each other node starts mpirun's daemon there when asked."""
    import ray.train.collective

    rank, *_ = gang.world()
    endpoints = gang.endpoints()
    nodes = [address for address, _ in endpoints]
    servers = remote_servers(nodes)  # the same on every rank, so all make the same collective calls
    server, secret = None, ""
    if servers:
        secret = ray.train.collective.broadcast_from_rank_zero(secrets.token_hex(16) if rank == 0 else None)
        if rank in servers.values():
            server = mpi_agent.LaunchServer(*endpoints[rank], secret)
            server.start()
        ray.train.collective.barrier()  # every node listens before mpirun starts
    try:
        if rank == 0:
            with tempfile.TemporaryDirectory(prefix="trainmaster-mpi-") as folder:
                hostfile = Path(folder) / "hostfile"
                hostfile.write_text("\n".join(hostfile_lines(nodes)) + "\n")
                agent = None
                if servers:
                    spec = Path(folder) / "agent.json"
                    listening = {node: endpoints[first] for node, first in servers.items()}
                    spec.write_text(json.dumps({"secret": secret, "servers": listening}))
                    spec.chmod(0o600)
                    agent = [sys.executable, mpi_agent.__file__, str(spec)]
                names = {**os.environ, **env}
                forwarded = sorted(name for name in names if name.startswith(FORWARDED_PREFIXES) or name in env)
                command = mpirun_command(hostfile, len(nodes), forwarded, program, agent)
                entrypoints.run_program(command, env, rank=0, what=f"mpirun {what}")
        ray.train.collective.barrier()  # the other workers hold their bundles until mpirun is done
    finally:
        if server is not None:
            server.stop()


def run_script(path: Path, args: list[str]) -> None:
    launch(entrypoints.python_command(path, args), {}, path.name)
