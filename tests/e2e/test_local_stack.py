"""`trainmaster up`, a demo job with metrics, `trainmaster down`: the README's main path, for real.

Uses the embedded PostgreSQL (as a newcomer would), its own TRAINMASTER_HOME and its own Ray head.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import psycopg
import pytest

from api.stack import osusers, postgres
from api.stack.processes import matching
from tests.e2e.conftest import TRAINMASTER, wait_until
from tests.e2e.ray_stack import one_start_at_a_time
from tests.factories.processes import json_log_lines

pytestmark = pytest.mark.ray


def owners(folder: str) -> set[str]:
    """The users of the processes whose command line names a path inside `folder`."""
    return {Path(f"/proc/{pid}").owner() for pid in matching([re.escape(folder) + "/"])}


def test_up_demo_job_and_down_leaves_nothing_running(tmp_path: Path) -> None:
    home = tmp_path / "home"
    # `up` runs each cluster as an OS user of its own when run by root with a Python other users can run
    # (CI lets them enter /root, where pyenv keeps it).
    separate = osusers.usable_cluster_user("default") is not None
    # No XDG_RUNTIME_DIR, as on many servers and in CI: `up` and `down` must not print platformdirs'
    # RuntimeDirWarning (a library warning that reads like an error).
    skipped = ("TRAINMASTER_", "RAY_", "XDG_RUNTIME_DIR")
    env = {k: v for k, v in os.environ.items() if not k.startswith(skipped)}
    env.update({"TRAINMASTER_HOME": str(home), "COLUMNS": "120"})

    def tm(*args: str, timeout: float = 300, **more: str) -> subprocess.CompletedProcess[str]:
        """The CLI in the stack's home; `more` adds to its environment."""
        run_env = {**env, **more}
        return subprocess.run([TRAINMASTER, *args], env=run_env, capture_output=True, text=True, timeout=timeout)

    background: list[subprocess.Popen[str]] = []

    def tm_started(*args: str, **more: str) -> subprocess.Popen[str]:
        """The CLI as `tm` runs it, left running beside the test (`ended` collects it)."""
        pipe = subprocess.PIPE
        process = subprocess.Popen([TRAINMASTER, *args], env={**env, **more}, stdout=pipe, stderr=pipe, text=True)
        background.append(process)
        return process

    def ended(process: subprocess.Popen[str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
        stdout, stderr = process.communicate(timeout=timeout)
        return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)

    if os.geteuid() == 0 and not separate:
        # Two clusters as root would be one trust domain: refused before anything starts, saying what to change.
        refused = tm("up", "--api-port", "0", "--clusters", "2")
        assert refused.returncode != 0 and "Nothing was started" in refused.stdout + refused.stderr, refused.stdout
        assert not (home / "stack.json").exists()
        pytest.skip("cluster users cannot run this Python: let them pass through /root (chmod 711, as .ci/run does)")
    with one_start_at_a_time():  # its Ray head picks free ports like the tests' own
        up = tm("up", "--num-cpus", "2", "--api-port", "0", "--clusters", "2", "--cpus-per-cluster", "1")
    recorded = json.loads((home / "stack.json").read_text()) if up.returncode == 0 else {}
    ray_dir = recorded.get("ray_temp_dir")
    ray_dirs = [ray_dir, *(cluster["temp_dir"] for cluster in recorded.get("clusters", []))] if ray_dir else []
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert "trainmaster is up" in up.stdout
        assert "Warning" not in up.stdout + up.stderr, up.stdout + up.stderr
        if separate:  # run by root: each cluster's Ray processes as a user of its own
            assert "each cluster runs as an OS user of its own" in up.stdout, up.stdout
            assert owners(recorded["ray_temp_dir"]) == {"tm-default"}
            assert owners(recorded["clusters"][0]["temp_dir"]) == {"tm-cluster-2"}
        else:
            assert "share one trust domain" in up.stdout  # two clusters of one OS user: said, not hidden
        # What tenant code must not read: the stack's state (database URLs), its logs, its tokens.
        assert stat.S_IMODE(home.stat().st_mode) == stat.S_IMODE((home / "logs").stat().st_mode) == 0o700
        assert stat.S_IMODE((home / "stack.json").stat().st_mode) == 0o600
        config = json.loads((home / "config").read_text())
        assert config["api_url"].startswith("http://127.0.0.1:") and config["token"].startswith("tm_")
        # The person who ran `up` owns the stack: the config's token is an admin's (of project default),
        # and the cluster default is this stack's Ray head.
        tokens = json.loads(tm("token", "ls", "--json").stdout)
        assert [(t["scope"], t["project"], t["expires_at"]) for t in tokens] == [("admin", "default", None)]
        stack = json.loads((home / "stack.json").read_text())
        clusters = json.loads(tm("cluster", "ls", "--json").stdout)
        second = stack["clusters"][0]
        assert [(c["name"], c["address"]) for c in clusters] == [
            ("cluster-2", second["dashboard"]),
            ("default", stack["ray_dashboard"]),
        ]
        assert second["dashboard"] != stack["ray_dashboard"]
        assert Path(second["token_file"]).read_text() != (home / "ray_auth_token").read_text()  # its own token
        assert json.loads(tm("project", "ls", "--json").stdout)[0]["cluster"] == "default"
        # The API and the dispatcher connect as the least-privilege login, the owner's URL kept for migrations.
        assert stack["service_database_url"].startswith(f"postgresql://{postgres.SERVICE_LOGIN}:")
        with psycopg.connect(stack["database_url"]) as conn:
            assert conn.execute(
                "SELECT rolsuper FROM pg_roles WHERE rolname = %s", (postgres.SERVICE_LOGIN,)
            ).fetchone() == (False,)
            users = {
                row[0]
                for row in conn.execute("SELECT DISTINCT usename FROM pg_stat_activity WHERE datname = 'trainmaster'")
            }
        assert postgres.SERVICE_LOGIN in users, users
        again = tm("up")
        assert again.returncode == 0 and "already running" in again.stdout
        status = tm("status")
        assert status.returncode == 0, status.stdout
        for component in ("postgres", "ray", "ray cluster-2", "api", "dispatcher"):
            assert component in status.stdout

        # A project bound to cluster-2 runs there: the one dispatcher serves both clusters.
        assert tm("project", "create", "team-b", "--cluster", "cluster-2").returncode == 0
        # A server-side verb: it writes to the stack's database.
        made = tm("token", "create", "--project", "team-b", TRAINMASTER_DATABASE_URL=stack["database_url"])
        assert made.returncode == 0, made.stdout + made.stderr
        team_b = made.stdout.strip()
        tiny = '{"epochs": 1, "samples": 256}'
        # The job of team-b and the one of project default run at once, each on its own cluster's CPUs.
        submit = ("submit", "builtin:mlp", "--follow", "--config")
        following_b = tm_started(*submit, tiny, "--workers", "1", TRAINMASTER_TOKEN=team_b)
        following = tm_started(*submit, '{"epochs": 2, "samples": 512}', "--workers", "2")
        on_b = ended(following_b)
        assert on_b.returncode == 0 and "succeeded" in on_b.stdout, on_b.stdout + on_b.stderr
        run_on_b = json.loads(tm("ls", "--json", TRAINMASTER_TOKEN=team_b).stdout)
        assert [(j["status"], j["cluster"]) for j in run_on_b] == [("succeeded", "cluster-2")]
        if separate:
            # Checkpoints: a root others may write in but not list; team-b's folder its cluster user's alone.
            storage = Path(stack["storage_path"])
            assert stat.S_IMODE(storage.stat().st_mode) == 0o1733
            [folder] = [f for f in storage.iterdir() if f.owner() == "tm-cluster-2"]
            assert stat.S_IMODE(folder.stat().st_mode) == 0o700

        submitted = ended(following)
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr
        assert "succeeded" in submitted.stdout and "loss" in submitted.stdout
        job = json.loads(tm("ls", "--json").stdout)[0]
        assert job["status"] == "succeeded" and job["cluster"] == "default"
        metrics = json.loads(tm("metrics", job["id"], "--json").stdout)
        assert any(point["name"] == "loss" for point in metrics)
        # The stack's processes write JSON lines only; those naming the job carry its id.
        logs = {name: json_log_lines(home / "logs" / f"{name}.log") for name in ("supervisor", "api", "dispatcher")}
        started = {line["component"] for _, line in logs["supervisor"] if line["event"] == "component_started"}
        assert started == {"api", "dispatcher"}
        naming = [line for lines in logs.values() for raw, line in lines if job["id"] in raw]
        assert naming and all(line.get("job_id") == job["id"] for line in naming)
        job_events = {line["event"] for _, line in logs["dispatcher"] if line.get("job_id") == job["id"]}
        assert {"job_launched", "job_finished"} <= job_events, job_events
        assert ray_dir, "the stack records the folder of its Ray head"
        for folder in ray_dirs:
            assert matching([re.escape(folder)]), f"a Ray head of the stack runs under the folder it recorded: {folder}"
    finally:
        for process in background:  # still following when an assertion above failed: ended before `down`
            if process.poll() is None:
                process.kill()
                process.communicate()
        down = tm("down")
    assert down.returncode == 0, down.stdout + down.stderr
    assert "Warning" not in down.stdout + down.stderr, down.stdout + down.stderr
    markers = [re.escape(str(home)), *(re.escape(folder) for folder in ray_dirs)]
    wait_until(lambda: not matching(markers), 30, what="every process of the stack to exit")
    assert tm("status").returncode == 1
    for folder in ray_dirs:
        assert not Path(folder).exists(), f"`down` removes the session folders it made: {folder}"
    if recorded.get("database_dir", "").startswith("/var/lib/trainmaster/"):  # run by root: the stack's own folder
        shutil.rmtree(Path(recorded["database_dir"]).parent)
