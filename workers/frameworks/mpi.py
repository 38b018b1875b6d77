"""MPI: `mpirun` (Open MPI) across the gang's placement group, for mpi4py and Horovod-MPI programs.

Ray Train holds one bundle per worker; rank 0 writes a hostfile from the bundles' nodes (one line per
node, `slots` = the workers placed there) and runs `mpirun -np <num_workers>` over it, while the other
workers hold their bundles until it ends. On one node mpirun starts every process itself; across
nodes it reaches the other nodes the way Open MPI always does (ssh, or `OMPI_MCA_plm_rsh_agent`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from workers import entrypoints
from workers.frameworks import gang

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


def mpirun_command(hostfile: Path, num_processes: int, forwarded: list[str], program: list[str]) -> list[str]:
    command = ["mpirun", "--hostfile", str(hostfile), "-np", str(num_processes), "--bind-to", "none"]
    if os.geteuid() == 0:
        command.append("--allow-run-as-root")  # containers run as root; Open MPI refuses it otherwise
    for name in forwarded:
        command += ["-x", name]
    return [*command, *program]


def launch(program: list[str], env: dict[str, str], what: str) -> None:
    """Rank 0 runs `program` under mpirun over the gang; every other worker waits for it to end."""
    import ray.train.collective

    rank, *_ = gang.world()
    if rank == 0:
        nodes = [address for address, _ in gang.endpoints()]
        with tempfile.TemporaryDirectory(prefix="trainmaster-mpi-") as folder:
            hostfile = Path(folder) / "hostfile"
            hostfile.write_text("\n".join(hostfile_lines(nodes)) + "\n")
            names = {**os.environ, **env}
            forwarded = sorted(name for name in names if name.startswith(FORWARDED_PREFIXES) or name in env)
            command = mpirun_command(hostfile, len(nodes), forwarded, program)
            entrypoints.run_program(command, env, rank=0, what=f"mpirun {what}")
    ray.train.collective.barrier()  # the other workers hold their bundles until mpirun is done


def run_script(path: Path, args: list[str]) -> None:
    launch(entrypoints.python_command(path, args), {}, path.name)
