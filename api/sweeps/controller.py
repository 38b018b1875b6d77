"""The sweep controller: reads each running sweep's stored metric stream, stops losing trials,
launches trials up to the sweep's limits, and ends the sweep when every trial has ended.

It never talks to Ray. Trials are ordinary jobs, so the dispatcher admits them through the same queue
and stops an early-stopped trial through the normal cancel path.

Durable without memory of its own: everything it knows (each trial's read cursor into metric_points,
its values at milestones, why it was stopped) is in the sweep's rows, and a round changes one sweep in
one transaction that holds that sweep's row lock (claimed with SKIP LOCKED). A controller that dies
mid-round leaves nothing half done; two controllers never work on one sweep at once; trial n exists
at most once (primary key (sweep_id, n), and its job's idempotency key `sweep:<id>:<n>`).
"""

from __future__ import annotations

import copy
import logging
import math
from datetime import datetime, timezone
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from api.auth.principal import Principal
from api.db.direct import OnSession
from api.db.models import Sweep as SweepRow
from api.db.models import SweepTrial as TrialRow
from api.errors import DomainError
from api.jobs import repository as jobs_repository
from api.jobs import service as jobs
from api.jobs.status import record_event
from api.sweeps import repository, sampling
from api.sweeps.early_stopping import Rule
from api.sweeps.repository import TrialWithJob
from trainmaster.models import JobSpec, JobStatus, SweepSpec, SweepStatus

log = logging.getLogger("trainmaster.sweeps")

SWEEPS_PER_ROUND = 100
TRIAL_NAME_SUFFIX = 8  # room for "-<n>" after the sweep's name


def trial_spec(request: SweepSpec, sweep_id: str, n: int, params: dict[str, Any]) -> JobSpec:
    """The sweep's job spec with `config` updated by the trial's parameters and labelled sweep/trial."""
    body = copy.deepcopy(request.spec.model_dump(mode="json"))
    body["name"] = f"{request.name[: 128 - TRIAL_NAME_SUFFIX]}-{n}"
    body["config"] = {**body.get("config", {}), **params}
    body["labels"] = {**body.get("labels", {}), "sweep": sweep_id, "trial": str(n)}
    return JobSpec.model_validate(body)


async def principal_of(session: AsyncSession, sweep: SweepRow) -> Principal:
    """The sweep's project as its trials are submitted: with the project's max_priority as it is now,
    so a trial made after an admin lowered it is refused like any job (and the sweep fails, saying why)."""
    name, max_priority = await jobs_repository.project_name_and_max_priority(session, sweep.project_id)
    return Principal(project_id=sweep.project_id, project_name=name, max_priority=max_priority)


async def advance(session: AsyncSession, sweep: SweepRow, principal: Principal) -> None:
    """One step of a sweep whose row this transaction holds: read, stop, launch, finish. Flushes only."""
    request = SweepSpec.model_validate(sweep.request)
    rule = Rule.of(request.early_stopping, request.mode, request.metric)
    trials = await repository.trials(session, sweep.id)
    newly = await _read_metrics(session, rule, trials)
    for item in trials:
        if item.trial.n in newly and _may_stop(item):
            await _judge(session, principal, rule, item, newly[item.trial.n], trials)
    try:
        await _launch(session, principal, sweep, request, trials)
    except DomainError as exc:  # e.g. the uploaded code it runs is gone: fail the sweep, saying why
        sweep.status, sweep.error = SweepStatus.failed, f"cannot launch trial {len(trials)}: {exc.detail}"
        sweep.finished_at = datetime.now(timezone.utc)
        log.warning("sweep_failed", extra={"sweep_id": str(sweep.id), "error": sweep.error[:300]})
        return
    if len(trials) >= sweep.max_trials and all(item.job_status.terminal for item in trials):
        ended_badly = all(item.job_status in (JobStatus.failed, JobStatus.timed_out) for item in trials)
        sweep.status = SweepStatus.failed if ended_badly else SweepStatus.completed
        if ended_badly:
            sweep.error = "every trial failed or timed out"
        sweep.finished_at = datetime.now(timezone.utc)
    await session.flush()


def _may_stop(item: TrialWithJob) -> bool:
    return item.trial.stopped_reason is None and item.job_status in (
        JobStatus.queued,
        JobStatus.starting,
        JobStatus.running,
    )


async def _read_metrics(session: AsyncSession, rule: Rule, trials: list[TrialWithJob]) -> dict[int, list[int]]:
    """Fold each trial's new points into its row; the milestones each trial newly reached."""
    cursors = {item.trial.job_id: item.trial.metric_seq for item in trials}
    points = await repository.new_metric_points(session, cursors, rule.metric)
    newly: dict[int, list[int]] = {}
    for item in trials:
        rows = points.get(item.trial.job_id)
        if not rows:
            continue
        trial = item.trial
        trial.metric_seq = rows[-1].seq
        stepped = [(int(row.step), float(row.value)) for row in rows if row.step is not None]
        if not stepped:
            continue
        trial.last_step, trial.last_value = stepped[-1]
        milestones = dict(trial.milestones)
        if new := rule.record(milestones, stepped):
            newly[trial.n] = new
        trial.milestones = milestones  # a new object, so the JSONB column is written
    return newly


async def _judge(
    session: AsyncSession,
    principal: Principal,
    rule: Rule,
    item: TrialWithJob,
    milestones: list[int],
    trials: list[TrialWithJob],
) -> None:
    trial = item.trial
    for milestone in milestones:
        key = str(milestone)
        peers = [other.trial.milestones[key] for other in trials if other is not item and key in other.trial.milestones]
        reason = rule.judge(milestone, trial.milestones[key], peers)
        if reason is None:
            continue
        # A stopped trial keeps no value at milestones past the one it stopped at.
        trial.milestones = {k: v for k, v in trial.milestones.items() if int(k) <= milestone}
        trial.stopped_reason = reason
        job = await jobs.cancel(session, principal, str(trial.job_id))
        await record_event(
            session, job, "early_stopped", reason, {"sweep": str(trial.sweep_id), "trial": trial.n, "step": milestone}
        )
        item.job_status = job.status
        log.info("trial_stopped", extra={"job_id": str(trial.job_id), "reason": reason})
        return


async def _launch(
    session: AsyncSession, principal: Principal, sweep: SweepRow, request: SweepSpec, trials: list[TrialWithJob]
) -> None:
    active = sum(1 for item in trials if not item.job_status.terminal)
    while len(trials) < sweep.max_trials and active < sweep.max_concurrent:
        n = len(trials)
        params = sampling.trial_params(request.parameters, sweep.parameter_names, sweep.seed, n)
        spec = trial_spec(request, str(sweep.id), n, params)
        job, _ = await jobs.submit(OnSession(session), principal, spec, f"sweep:{sweep.id}:{n}")
        trial = TrialRow(sweep_id=sweep.id, n=n, job_id=job.id, params=params, milestones={})
        session.add(trial)
        await session.flush()
        trials.append(TrialWithJob(trial, job.status))
        active += 1


async def sweep_round(sessions: async_sessionmaker[AsyncSession], limit: int = SWEEPS_PER_ROUND) -> int:
    """Advance up to `limit` running sweeps, the least recently served first, that no other controller
    holds right now; returns how many it advanced.

    One transaction per sweep, so one sweep's failure neither rolls back nor blocks the others. The
    picked sweeps are marked served before they are advanced, so a sweep that fails its round goes to
    the back like the rest instead of taking a place in every round.
    """
    async with sessions() as session, session.begin():
        sweep_ids = await repository.sweeps_to_serve(session, limit)
    advanced = 0
    for sweep_id in sweep_ids:
        try:
            async with sessions() as session, session.begin():
                sweep = await repository.claim_running(session, sweep_id)
                if sweep is None:
                    continue
                await advance(session, sweep, await principal_of(session, sweep))
                advanced += 1
        except Exception as exc:  # one sweep's bad round must not stop the others, nor the dispatcher
            log.exception("sweep_round_failed", extra={"sweep_id": str(sweep_id), "error": str(exc)[:300]})
    return advanced


def finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None
