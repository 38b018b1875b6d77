"""`trainmaster api` as a real process, driven by the CLI, the SDK and curl as the README shows."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import trainmaster as tm
from tests.e2e.conftest import REPO, TRAINMASTER, ApiProcess, start_api, stop
from tests.factories.http import bearer


def cli(api: ApiProcess, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [TRAINMASTER, *args], env={**api.env, "COLUMNS": "200"}, capture_output=True, text=True, timeout=60
    )
    if check and result.returncode != 0:
        raise AssertionError(f"trainmaster {' '.join(args)} failed: {result.stdout}{result.stderr}")
    return result


def test_cli_submit_ls_get_cancel(api_process: ApiProcess) -> None:
    submitted = cli(
        api_process,
        "submit",
        "builtin:mlp",
        "--name",
        "cli-job [/]",  # brackets are shown as written, never read as markup
        "--workers",
        "2",
        "--label",
        "via=cli",
        "--config",
        '{"epochs": 1}',
        "--json",
    )
    job = json.loads(submitted.stdout)
    assert job["status"] == "queued" and job["spec"]["scaling"]["num_workers"] == 2

    listed = json.loads(cli(api_process, "ls", "--label", "via=cli", "--json").stdout)
    assert [j["id"] for j in listed] == [job["id"]]
    table = cli(api_process, "ls").stdout
    assert job["id"][:8] in table and "cli-job [/]" in table  # ls shows 8-character ids

    shown = cli(api_process, "get", job["id"]).stdout
    assert "builtin:mlp" in shown and "queued" in shown and "cli-job [/]" in shown

    assert "cancelled" in cli(api_process, "cancel", job["id"]).stdout
    again = cli(api_process, "cancel", job["id"], check=False)
    assert again.returncode == 1 and "nothing to cancel" in again.stderr


def test_cli_errors_are_one_clear_line(api_process: ApiProcess) -> None:
    missing = cli(api_process, "get", "00000000-0000-0000-0000-000000000000", check=False)
    assert missing.returncode == 1 and "JobNotFound" in missing.stderr and "Traceback" not in missing.stderr
    bad = cli(api_process, "submit", "builtin:mlp", "--workers", "0", check=False)
    assert bad.returncode == 1 and "num_workers" in bad.stderr
    denied = subprocess.run(
        [TRAINMASTER, "ls"],
        env={**api_process.env, "TRAINMASTER_TOKEN": "tm_bad"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert denied.returncode == 1 and "401" in denied.stderr


def test_sdk_against_the_process(api_process: ApiProcess) -> None:
    with tm.Client(api_process.url, api_process.token) as client:
        job = client.submit(name="sdk-e2e", entrypoint="builtin:mlp")
        assert client.get(job.id).status is tm.JobStatus.queued


def readme_blocks(language: str) -> list[str]:
    text = (REPO / "README.md").read_text()
    section = text.split("## Use the API", 1)[1].split("\n## ", 1)[0]
    return re.findall(rf"```{language}\n(.*?)```", section, flags=re.S)


def json_documents(text: str) -> list[Any]:
    """The JSON documents printed one after another (curl prints each answer without a newline)."""
    decoder, documents, at = json.JSONDecoder(), [], 0
    while at < len(text.rstrip()):
        document, end = decoder.raw_decode(text, at)
        documents.append(document)
        at = end + len(text[end:]) - len(text[end:].lstrip())
    return documents


def test_readme_curl_examples_run(api_process: ApiProcess) -> None:
    (block,) = readme_blocks("bash")
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block],
        env=api_process.env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert result.returncode == 0, f"README example failed:\n{block}\n{result.stdout}\n{result.stderr}"
    submitted, listed = json_documents(result.stdout)
    assert submitted["name"] == "mlp-demo" and submitted["status"] == "queued", submitted
    assert submitted["spec"]["scaling"]["num_workers"] == 2
    queued = {item["id"]: item["status"] for item in listed["items"]}
    assert queued.get(submitted["id"]) == "queued", listed


def test_readme_sdk_example_runs(api_process: ApiProcess) -> None:
    (block,) = readme_blocks("python")
    result = subprocess.run(
        [sys.executable, "-c", block], env=api_process.env, capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert result.returncode == 0, f"README SDK example failed:\n{result.stdout}\n{result.stderr}"
    job_id, status = result.stdout.splitlines()[0].split()
    assert status == "queued"
    with tm.Client(api_process.url, api_process.token) as client:
        assert client.get(job_id).name == "mlp-sdk"
    listed = [line.split() for line in result.stdout.splitlines()[1:]]
    assert listed and all(name and position.isdigit() for name, position in listed), result.stdout


def test_several_workers_serve_and_a_revoked_token_is_refused_by_every_one(
    api_process: ApiProcess, database_url: str
) -> None:
    """`trainmaster api` runs one worker process per core by default; each caches the tokens it checked,
    and a revocation reaches every one of them at once."""
    import hashlib
    import uuid

    import httpx
    import psutil
    import psycopg

    from api.settings import libpq_url
    from tests.factories.auth import project_token

    workers = psutil.Process(api_process.process.pid).children(recursive=True)
    assert len(workers) >= min(2, psutil.cpu_count() or 1)
    token = project_token(database_url, f"revoke-{uuid.uuid4().hex[:6]}")
    headers = bearer(token)
    with httpx.Client(base_url=api_process.url, headers=headers, timeout=10) as first:
        # Fresh connections land on whichever worker accepts them: enough of them reach every worker.
        for _ in range(30):
            with httpx.Client(base_url=api_process.url, headers=headers, timeout=10) as client:
                assert client.get("/v1/jobs").status_code == 200
        assert first.get("/v1/jobs").status_code == 200
        with psycopg.connect(libpq_url(database_url), autocommit=True) as conn:
            conn.execute(
                "UPDATE api_tokens SET revoked_at = now() WHERE token_hash = %s",
                (hashlib.sha256(token.encode()).hexdigest(),),
            )
        assert first.get("/v1/jobs").status_code == 401
        for _ in range(30):
            with httpx.Client(base_url=api_process.url, headers=headers, timeout=10) as client:
                assert client.get("/v1/jobs").status_code == 401


def test_workers_end_with_a_killed_supervisor_and_the_port_serves_again(database_url: str, tmp_path: Path) -> None:
    """SIGKILL of `trainmaster api` (the OOM killer, `kill -9`) must not leave its workers serving as orphans:
    an open stream ends, so clients reconnect, and a new `trainmaster api` binds the same port."""
    import psutil

    from api.stack.processes import wait_for
    from trainmaster.ports import free_port

    port = free_port()
    api = start_api(database_url, tmp_path / "first.log", port=port)
    workers = psutil.Process(api.process.pid).children(recursive=True)
    assert workers, "trainmaster api started no worker processes"
    api.process.kill()
    api.process.wait()

    def gone(worker: psutil.Process) -> bool:
        try:
            return not worker.is_running() or worker.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    wait_for(lambda: all(gone(w) for w in workers), 30, "the killed API's workers to end")
    again = start_api(database_url, tmp_path / "second.log", port=port)
    try:
        with tm.Client(again.url, again.token) as client:
            assert client.list(limit=1) is not None
    finally:
        stop(again.process)
