"""mpirun across nodes without ssh: its rsh agent asks the gang's worker on the other node to start
Open MPI's daemon there (workers/frameworks/mpi_agent.py). No Ray needed: 127.0.0.2 is no interface's
address, so Open MPI takes it for another node and goes through the agent, while the launch server
listening there is reachable over loopback."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainmaster.ports import free_port
from workers.frameworks import mpi, mpi_agent

if shutil.which("mpirun") is None:
    pytest.skip("needs Open MPI's mpirun (scripts/test installs openmpi-bin)", allow_module_level=True)

OTHER_NODE = "127.0.0.2"
# Each rank writes its own file: mpirun forwards the ranks' stdout as it comes, so two ranks'
# printed lines can arrive interleaved mid-line ("01 2 3" then " 2 3").
ALL_REDUCE = (
    "import sys; from pathlib import Path; from mpi4py import MPI; c = MPI.COMM_WORLD; "
    "Path(sys.argv[1], f'rank-{c.Get_rank()}').write_text("
    "f'{c.Get_rank()} {c.Get_size()} {c.allreduce(c.Get_rank() + 1)}')"
)


@pytest.fixture
def server() -> Iterator[mpi_agent.LaunchServer]:
    listening = mpi_agent.LaunchServer(OTHER_NODE, free_port(), "the-secret")
    listening.start()
    yield listening
    listening.stop()


def agent_spec(folder: Path, server: mpi_agent.LaunchServer, secret: str) -> list[str]:
    spec = folder / "agent.json"
    spec.write_text(json.dumps({"secret": secret, "servers": {OTHER_NODE: server.listener.getsockname()}}))
    return [sys.executable, mpi_agent.__file__, str(spec)]


def test_mpirun_starts_the_other_nodes_rank_through_the_launch_server(
    server: mpi_agent.LaunchServer, tmp_path: Path
) -> None:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("\n".join(mpi.hostfile_lines(["127.0.0.1", OTHER_NODE])) + "\n")
    agent = agent_spec(tmp_path, server, "the-secret")
    results = tmp_path / "results"
    results.mkdir()
    command = mpi.mpirun_command(hostfile, 2, [], [sys.executable, "-c", ALL_REDUCE, str(results)], agent)
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    ranks = {path.name: path.read_text() for path in results.iterdir()}
    assert ranks == {"rank-0": "0 2 3", "rank-1": "1 2 3"}, result.stdout + result.stderr


def test_the_launch_server_runs_nothing_for_a_wrong_secret(server: mpi_agent.LaunchServer, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    agent = agent_spec(tmp_path, server, "a-guess")
    result = subprocess.run([*agent, OTHER_NODE, "touch", str(marker)], capture_output=True, timeout=30)
    assert result.returncode == 126 and not marker.exists()
