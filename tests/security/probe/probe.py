"""A hostile job's code: what it tries against the platform and the other tenants on its cluster, each
attempt and its outcome written as one JSON line to $PROBE_OUT (tests/security/test_hostile_tenant.py
asserts every one was refused). Run as a trainmaster job in script mode; it never fails the job.

It also leaves a file in its own project's checkpoint folder, for a probe of another cluster to aim at,
and tries what the OS would let it read of the other cluster and the platform (`os_attempts`)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path

import httpx
from ray.job_submission import JobSubmissionClient

API = os.environ["TRAINMASTER_API_URL"].rstrip("/")
VICTIM = os.environ["PROBE_VICTIM_JOB"]  # a job of another project
OUT = os.environ["PROBE_OUT"]
FINISHED = {"SUCCEEDED", "FAILED", "STOPPED"}


def record(attempt: str, outcome: object, **details: object) -> None:
    with open(OUT, "a") as sink:
        sink.write(json.dumps({"attempt": attempt, "outcome": outcome, **details}) + "\n")


def status(method: str, path: str, token: str | None, **kwargs: object) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.request(method, f"{API}{path}", headers=headers, timeout=30, **kwargs).status_code  # type: ignore[arg-type]


def refused(attempt: str, read: Callable[[], object]) -> None:
    """Records `read()`'s outcome: what it got, or how the OS refused it."""
    try:
        record(attempt, f"read: {read()}")
    except OSError as exc:
        record(attempt, f"refused: {type(exc).__name__}")


def os_attempts() -> None:
    own = Path(os.environ["TRAINMASTER_STORAGE_PATH"])  # this job's project folder
    own.mkdir(parents=True, exist_ok=True)
    (own / "probe-secret").write_text("a checkpoint of this project")
    record("own checkpoint folder", str(own))
    me = os.getuid()
    readable = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.stat(f"/proc/{pid}").st_uid != me:
                Path(f"/proc/{pid}/environ").read_bytes()
                readable.append(pid)
        except OSError:
            pass  # refused, or gone
    record("other users' processes whose environment this job read", readable)
    if api := os.environ.get("PROBE_API_PID"):
        refused("the API process's environment", lambda: len(Path(f"/proc/{api}/environ").read_bytes()))
    if token := os.environ.get("PROBE_OTHER_TOKEN"):
        refused("the other cluster's Ray token file", lambda: len(Path(token).read_bytes()))
    if session := os.environ.get("PROBE_OTHER_SESSION"):
        refused("the other cluster's session folder listed", lambda: len(os.listdir(session)))
    if warm := os.environ.get("PROBE_OTHER_WARM"):
        refused("the other cluster's warm server folder listed", lambda: len(os.listdir(warm)))
    refused("the checkpoint root listed", lambda: len(os.listdir(own.parent)))
    if path := os.environ.get("PROBE_VICTIM_STORAGE"):
        refused("another project's checkpoint folder listed", lambda: len(os.listdir(path)))
        refused("another project's checkpoint read", lambda: len(Path(path, "probe-secret").read_bytes()))
        refused("another project's checkpoint folder written", lambda: Path(path, "planted").write_text("x"))


def main() -> None:
    own = os.environ.get("TRAINMASTER_JOB_TOKEN")
    mine = os.environ["TRAINMASTER_JOB_ID"]
    record("job token handed to this worker inside Ray", bool(own))
    named = ("TRAINMASTER_DATABASE_URL", "TRAINMASTER_TOKEN")
    secrets = sorted(k for k, v in os.environ.items() if "postgresql://" in v or k in named)
    record("platform secrets in this process's environment", secrets)

    # The job token, valid, opens nothing of another project and nothing but its own job's reports.
    event = {"kind": "runtime", "message": "probe", "data": {"backend": "gloo"}}
    victim_events = f"/v1/jobs/{VICTIM}/events"
    record("job token: write an event to its own job", status("POST", f"/v1/jobs/{mine}/events", own, json=event))
    record("job token: another project's job, write an event", status("POST", victim_events, own, json=event))
    record("job token: read another project's job", status("GET", f"/v1/jobs/{VICTIM}", own))
    record("job token: list jobs", status("GET", "/v1/jobs", own))
    submit = {"name": "x", "entrypoint": "builtin:mlp", "priority": 100}
    record("job token: submit a job at priority 100", status("POST", "/v1/jobs", own, json=submit))
    record("job token: list clusters", status("GET", "/v1/clusters", own))
    record("no token: list tokens", status("GET", "/v1/tokens", None))

    # Every job on the cluster can read every launch through Ray's Jobs API.
    ray_jobs = JobSubmissionClient(os.environ["PROBE_RAY_DASHBOARD"]).list_jobs()
    tokens_seen: list[str] = []
    replays: dict[str, int] = {}
    claims: list[str] = []
    for job in ray_jobs:
        env = (job.runtime_env or {}).get("env_vars", {})
        tokens_seen += [f"{job.submission_id}:{k}" for k in env if k.startswith("TRAINMASTER") and k.endswith("_TOKEN")]
        # The claim is in the launch's metadata (never its runtime env: Ray puts that on command lines).
        claim, job_id = (job.metadata or {}).get("trainmaster_claim"), env.get("TRAINMASTER_JOB_ID")
        claims += [claim] if claim else []
        # Only claims of jobs that ended, and this one's: a live neighbour's fresh claim is not ours to burn.
        # Its own always; at most 5 others (a shared cluster lists many).
        if claim and job_id and (job_id == mine or (job.status in FINISHED and len(replays) < 5)):
            body = {"job_id": job_id, "claim": claim}
            replays[job_id] = httpx.post(f"{API}/v1/tokens/claim", json=body, timeout=30).status_code
    record("Ray jobs listed through the Jobs API", len(ray_jobs))
    record("Ray submission ids listed", sorted(job.submission_id or "" for job in ray_jobs))
    if other := os.environ.get("PROBE_OTHER_DASHBOARD"):
        # Another cluster's head, with whatever Ray token this process finds (its own cluster's).
        try:
            record("another cluster's Ray jobs listed", len(JobSubmissionClient(other).list_jobs()))
        except Exception as exc:
            record("another cluster's Ray jobs listed", f"refused: {str(exc)[:200]}")
    record("job tokens read from any Ray job's runtime env", tokens_seen)
    record("claims read from Ray jobs, replayed", replays)
    # Its own claim was claimed by its driver: the replay is refused and changes nothing (a replay that
    # revoked the token would let any job that read a launch stop another's), so its token still works.
    record("own token after its claim was replayed", status("POST", f"/v1/jobs/{mine}/events", own, json=event))
    record("credentials on any process's command line", on_command_lines([own or "", *claims]))
    os_attempts()


def on_command_lines(credentials: list[str]) -> list[str]:
    """The processes (pid: their program) whose command line, which any local user reads, holds one of
    `credentials` or a platform token (`tm_` and 43 characters)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            line = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue  # gone
        if any(c and c in line for c in credentials) or re.search(r"tm_[A-Za-z0-9_-]{43}", line):
            found.append(f"{pid}: {line.split(chr(0))[0][:80]}")
    return found


if __name__ == "__main__":
    try:
        main()
    except Exception as exc:  # the test reads what is missing
        record("probe crashed", repr(exc))
