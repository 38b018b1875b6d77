"""platform/slurm/trainmaster.sbatch starts its Ray head again when Ray's start timed out waiting for the
node to register ("timed out during startup", a loaded head node), after stopping what that start left
running; any other failure, or the last try, ends the allocation. Run with `srun`, `scontrol` and `ray`
replaced by small scripts on PATH (tests/ops/test_slurm.py runs it under a real Slurm)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.factories.waiting import wait_until

SBATCH = Path(__file__).resolve().parents[2] / "platform" / "slurm" / "trainmaster.sbatch"

SRUN = """#!/usr/bin/env bash
while [[ "$1" == --* ]]; do shift; done
exec "$@"
"""
SCONTROL = """#!/usr/bin/env bash
echo node1
"""
# `ray start --head` fails its first $FAIL_TIMES starts, as Ray does when the node did not register in
# 30 s, leaving a process behind whose command line names the temp dir (as the GCS's does); later
# starts succeed and block. `ray health-check` answers once a start succeeded.
RAY = """#!/usr/bin/env bash
state=$FAKE_RAY_STATE
case "$1" in
start)
    echo start >>"$state/starts"
    temp_dir=""
    for arg in "$@"; do [[ "$arg" == --temp-dir=* ]] && temp_dir=${arg#--temp-dir=}; done
    echo "$temp_dir" >>"$state/temp_dirs"
    if (($(wc -l <"$state/starts") <= ${FAIL_TIMES:-0})); then
        (
            # with no descriptor of this script's open (as Python's subprocess, which starts Ray's, closes them)
            for fd in /proc/$BASHPID/fd/*; do
                fd=${fd##*/}
                ((fd > 2)) && eval "exec $fd>&-"
            done
            exec -a "gcs_server --session-dir=$temp_dir/session_1" sleep 300 </dev/null >/dev/null 2>&1
        ) &
        echo "$!" >>"$state/left"
        echo "${FAIL_WITH:-Exception: The current node timed out during startup. This could happen because ...}"
        exit 1
    fi
    touch "$state/ready"
    exec sleep 300
    ;;
health-check) [[ -e "$state/ready" ]] ;;
*) exit 0 ;;
esac
"""


@pytest.fixture
def fakes(tmp_path: Path) -> Iterator[Path]:
    bin_dir, state = tmp_path / "bin", tmp_path / "state"
    bin_dir.mkdir()
    state.mkdir()
    for name, text in (("srun", SRUN), ("scontrol", SCONTROL), ("ray", RAY)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    yield tmp_path
    for line in (state / "left").read_text().split() if (state / "left").exists() else []:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(line), signal.SIGKILL)


def start(root: Path, **env: str) -> subprocess.Popen[str]:
    environment = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "RAY", "TRAINMASTER"))},
        "PATH": f"{root / 'bin'}:{os.environ['PATH']}",
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NODELIST": "node1",
        "SLURMD_NODENAME": "node1",
        "RAY_HEAD_IP": "127.0.0.1",
        "RAY_TMPDIR": str(root / "ray-4242"),
        "TRAINMASTER_SLURM_DIR": str(root / "run"),
        "TMPDIR": str(root),
        "FAKE_RAY_STATE": str(root / "state"),
        **env,
    }
    return subprocess.Popen(
        ["bash", str(SBATCH)], env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return state != "Z"


def test_a_head_that_timed_out_during_startup_is_stopped_and_started_again(fakes: Path) -> None:
    script = start(fakes, FAIL_TIMES="2")
    try:
        wait_until(lambda: (fakes / "state" / "ready").exists(), 60, interval=0.2, what="the third start")
        wait_until(
            lambda: (fakes / "run" / "ray.env").exists(),
            60,
            interval=0.2,
            what="the script to write the cluster's address",
        )
        assert script.poll() is None
        left = [int(pid) for pid in (fakes / "state" / "left").read_text().split()]
        assert len(left) == 2
        wait_until(
            lambda: not any(alive(pid) for pid in left),
            10,
            interval=0.2,
            what="what the timed-out starts left to be stopped",
        )
    finally:
        script.send_signal(signal.SIGTERM)
        output, _ = script.communicate(timeout=60)
    assert (fakes / "state" / "starts").read_text().count("start") == 3
    assert output.count("timed out during startup (try") == 2
    assert "Ray head is up" in output
    assert not (fakes / "run" / "ray-head.out").exists()  # removed with the token on the way out


@pytest.mark.parametrize(
    ("fail_times", "fail_with", "starts"),
    [
        ("9", "", 3),  # every try timed out: RAY_HEAD_TRIES (3) starts, then the allocation ends
        ("1", "ValueError: port 6379 is already in use", 1),  # not a start-up timeout: no second try
    ],
)
def test_the_head_is_not_started_again_past_its_tries_or_for_another_failure(
    fakes: Path, fail_times: str, fail_with: str, starts: int
) -> None:
    env = {"FAIL_TIMES": fail_times, **({"FAIL_WITH": fail_with} if fail_with else {})}
    script = start(fakes, **env)
    output, _ = script.communicate(timeout=120)
    assert script.returncode == 1
    assert "the Ray head exited while starting" in output
    assert (fakes / "state" / "starts").read_text().count("start") == starts
    assert "Ray head is up" not in output
    assert (fail_with or "The current node timed out during startup") in output  # the head's own words, in the log


def test_without_ray_tmpdir_the_head_runs_in_a_fresh_private_folder(fakes: Path) -> None:
    """A Ray temp dir named from the job id could be made first by another user of the node, with links
    inside: the script makes its own with mktemp -d, and a folder already at the old name is left alone."""
    job = str(os.getpid())
    planted = Path(f"/tmp/ray-{job}")  # the name the script once computed
    planted.mkdir(exist_ok=True)
    (planted / "theirs").touch()
    script = start(fakes, SLURM_JOB_ID=job, RAY_TMPDIR="")
    used = None
    try:
        wait_until(
            lambda: (fakes / "run" / "ray.env").exists(),
            60,
            interval=0.2,
            what="the script to write the cluster's address",
        )
        used = Path((fakes / "state" / "temp_dirs").read_text().split()[0])
        folder = used.parent
        assert used.name == "ray" and re.fullmatch(r"/tmp/tm-ray-\w{8}", str(folder)), used
        info = os.lstat(folder)
        assert stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) == 0o700
        assert sorted(p.name for p in planted.iterdir()) == ["theirs"]
    finally:
        script.send_signal(signal.SIGTERM)
        script.communicate(timeout=60)
        shutil.rmtree(planted, ignore_errors=True)
        # Only a folder the script made with mktemp: whatever else it used (/tmp/ray-<job>, whose parent is
        # /tmp itself) is never removed by a test.
        if used is not None and re.fullmatch(r"/tmp/tm-ray-\w{8}", str(used.parent)):
            shutil.rmtree(used.parent, ignore_errors=True)
