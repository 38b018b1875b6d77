"""Decisions about sweeps: create (with its first trials), read, list, cancel. Services flush; the
request commits."""

from __future__ import annotations

import secrets
import uuid
from collections import Counter
from datetime import datetime, timezone

from pydantic import ValidationError as PydanticValidationError
from sqlalchemy.ext.asyncio import AsyncSession

from api.auth.principal import Principal
from api.code_packages import repository as code_repository
from api.db.direct import OnSession
from api.db.models import Sweep as SweepRow
from api.errors import IllegalTransition, NotFound, ValidationError
from api.jobs import service as jobs
from api.sweeps import controller, repository, sampling
from api.sweeps.repository import TrialWithJob
from trainmaster.models import JobStatus, Sweep, SweepSpec, SweepStatus, SweepTrial

SEED_BITS = 31


class SweepNotFound(NotFound):
    pass


def _limits(request: SweepSpec) -> tuple[int, int]:
    """(max_trials, max_concurrent): a grid defaults to all its points; a sampled sweep must say."""
    if request.is_grid:
        size = sampling.grid_size(request.parameters)
        max_trials = request.max_trials or size
        if max_trials > size:
            raise ValidationError.field(
                ["body", "max_trials"], f"the grid of values has {size} points; max_trials {max_trials} is more"
            )
    elif request.max_trials is None:
        raise ValidationError.field(
            ["body", "max_trials"], "required when a parameter is sampled (uniform, log_uniform)"
        )
    else:
        max_trials = request.max_trials
    return max_trials, min(request.max_concurrent or max_trials, max_trials)


async def create(session: AsyncSession, principal: Principal, request: SweepSpec) -> SweepRow:
    max_trials, max_concurrent = _limits(request)
    jobs.check_priority(principal, request.spec.priority, ("body", "spec", "priority"))  # every trial's
    names = list(request.parameters)
    seed = request.seed if request.seed is not None else secrets.randbits(SEED_BITS)
    sweep_id = uuid.uuid4()
    try:  # every trial's spec must be valid; the first one stands for all (same keys, same shapes)
        controller.trial_spec(request, str(sweep_id), 0, sampling.trial_params(request.parameters, names, seed, 0))
    except PydanticValidationError as exc:
        first = exc.errors()[0]
        raise ValidationError.field(["body", "spec", *first.get("loc", ())], first.get("msg", "invalid")) from None
    if request.spec.code is not None and not await code_repository.exists(
        OnSession(session), principal.project_id, request.spec.code
    ):
        raise ValidationError.field(
            ["body", "spec", "code"], f"no uploaded code {request.spec.code}; upload it with POST /v1/code"
        )
    sweep = SweepRow(
        id=sweep_id,
        project_id=principal.project_id,
        name=request.name,
        status=SweepStatus.running,
        request=request.model_dump(mode="json"),
        parameter_names=names,
        max_trials=max_trials,
        max_concurrent=max_concurrent,
        seed=seed,
    )
    session.add(sweep)
    await session.flush()
    await controller.advance(session, sweep, principal)  # the first trials queue with the sweep itself
    return sweep


def parse_sweep_id(raw: str) -> uuid.UUID:
    return SweepNotFound.unless_uuid(raw, "sweep")


async def get_owned(session: AsyncSession, principal: Principal, raw_id: str, *, for_update: bool = False) -> SweepRow:
    """The sweep if the caller's project owns it; 404 otherwise, never revealing that it exists."""
    sweep = await repository.get_sweep(session, parse_sweep_id(raw_id), principal.project_id, for_update=for_update)
    if sweep is None:
        raise SweepNotFound(f"no sweep {raw_id!r} in project {principal.project_name!r}")
    return sweep


async def cancel(session: AsyncSession, principal: Principal, raw_id: str) -> SweepRow:
    """Cancel every trial that has not ended (through the jobs' cancel) and end the sweep."""
    sweep = await get_owned(session, principal, raw_id, for_update=True)  # waits for a controller's round
    if sweep.status is not SweepStatus.running:
        raise IllegalTransition(f"sweep {sweep.id} already {sweep.status.value}; there is nothing to cancel")
    for item in await repository.trials(session, sweep.id):
        if not item.job_status.terminal and item.job_status is not JobStatus.cancelling:
            await jobs.cancel(session, principal, str(item.trial.job_id))
    sweep.status, sweep.finished_at = SweepStatus.cancelled, datetime.now(timezone.utc)
    await session.flush()
    return sweep


async def describe(session: AsyncSession, principal: Principal, sweep: SweepRow) -> Sweep:
    return to_wire(sweep, principal.project_name, await repository.trials(session, sweep.id), with_trials=True)


async def list_sweeps(
    session: AsyncSession, principal: Principal, *, statuses: list[SweepStatus], limit: int
) -> list[Sweep]:
    rows = await repository.list_sweeps(session, principal.project_id, statuses=statuses, limit=limit)
    trials = await repository.trials_of_sweeps(session, [row.id for row in rows])
    return [to_wire(row, principal.project_name, trials[row.id], with_trials=False) for row in rows]


def trial_to_wire(item: TrialWithJob) -> SweepTrial:
    trial = item.trial
    stopped = trial.stopped_reason is not None and item.job_status in (JobStatus.cancelling, JobStatus.cancelled)
    return SweepTrial(
        n=trial.n,
        job_id=str(trial.job_id),
        params=trial.params,
        status="stopped" if stopped else item.job_status.value,
        metric=controller.finite(trial.last_value),
        step=trial.last_step,
        stopped_reason=trial.stopped_reason,
    )


def ranked(trials: list[SweepTrial], mode: str) -> list[SweepTrial]:
    """Best first by the last reported metric; trials without one last, in trial order."""
    sign = 1.0 if mode == "min" else -1.0
    return sorted(trials, key=lambda t: (t.metric is None, sign * (t.metric or 0.0), t.n))


def to_wire(sweep: SweepRow, project_name: str, trials: list[TrialWithJob], *, with_trials: bool) -> Sweep:
    request = sweep.request
    wire_trials = ranked([trial_to_wire(item) for item in trials], request["mode"])
    best = wire_trials[0] if wire_trials and wire_trials[0].metric is not None else None
    return Sweep(
        id=str(sweep.id),
        project=project_name,
        name=sweep.name,
        status=sweep.status,
        metric=request["metric"],
        mode=request["mode"],
        max_trials=sweep.max_trials,
        max_concurrent=sweep.max_concurrent,
        early_stopping=request["early_stopping"],
        parameters=request["parameters"],
        error=sweep.error,
        created_at=sweep.created_at,
        finished_at=sweep.finished_at,
        trial_counts=dict(Counter(trial.status for trial in wire_trials)),
        trials=wire_trials if with_trials else [],
        best=best,
    )
