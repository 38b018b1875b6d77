"""One admission round: queued jobs in priority and fair-share order (those that would borrow quota
last), each admitted, kept waiting with a reason (its project's quota, or the cluster's resources), or
failed as infeasible once `infeasible_timeout_s` has passed."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Iterator
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncSession

from api.db.models import Job
from api.dispatcher import launch, preemption
from api.dispatcher import repository as repo
from api.dispatcher.backend import Launch, RayUnavailable
from api.dispatcher.context import RoundContext
from api.dispatcher.placement import Cluster, Decision, admit
from api.dispatcher.quotas import Book
from api.dispatcher.repository import QueuedJob
from api.jobs.status import record_event, transition
from trainmaster.models import JobStatus, Scaling

log = logging.getLogger("trainmaster.dispatcher")


async def admit_round(context: RoundContext) -> int:
    settings = context.settings
    try:
        cluster = await asyncio.to_thread(context.ray.cluster)
    except RayUnavailable as exc:
        await _set_reasons_unreachable(context, str(exc))
        return 0
    driver = {"CPU": settings.driver_cpus} if settings.driver_cpus > 0 else {}
    launches: list[Launch] = []
    async with context.sessions() as session, session.begin():
        ours = context.cluster_id
        await repo.lock_admission(session, ours)
        total = cluster.total()
        # Before the queue is read in fair-share order: a sample due now orders this round.
        if time.monotonic() - context.fair_share_sampled >= settings.fair_share_sample_s:
            half_life, interval = settings.fair_share_half_life_s, settings.fair_share_sample_s
            await repo.sample_fair_share(session, total, half_life, interval, ours)
            context.fair_share_sampled = time.monotonic()
        now, held_cpus, held_gpus = await repo.held_resources(session, ours)
        book = await repo.quota_book(session, ours)
        budget = {"CPU": total.get("CPU", 0.0) - held_cpus, "GPU": total.get("GPU", 0.0) - held_gpus}
        warning = storage_warning(settings.storage_path, cluster)  # the same for every job of the round
        admitted: list[QueuedJob] = []  # their attempts are written together, see start_attempts
        selectors: dict[uuid.UUID, dict[str, str]] = {}  # the node-label domain of those with a topology
        reasons: dict[uuid.UUID, str] = {}  # the waiting jobs' new reasons, written together
        # Jobs that fail here, the round going on: their admission raised, or their code package is one
        # this dispatcher found cannot be unpacked (content-addressed: the same digest, the same bytes).
        failures: dict[uuid.UUID, tuple[str, str]] = {}  # job id -> (error, event message)
        for job in _borrowers_last(await repo.lock_queued(session, settings.admit_batch, ours), book):
            if (code := job.spec.get("code")) is not None and (why := context.bad_code.get(code)) is not None:
                failures[job.id] = (why, f"not launched: {why}")
                continue
            try:
                # Placement reads only the scaling: the whole spec is validated for the launch alone.
                admission = admit(Scaling.model_validate(job.spec.get("scaling", {})), cluster, driver)
            except Exception as exc:  # a stored spec placement cannot read, or a bug: this job's alone
                log.exception(json.dumps({"event": "admission_failed", "job_id": str(job.id)}))
                error = f"could not be placed: {type(exc).__name__}: {str(exc)[:500]}"
                failures[job.id] = (error, "admission_failed")
                continue
            need = {"CPU": job.gang_cpus, "GPU": job.gang_gpus}
            held_by_quota = False
            if admission.decision is not Decision.infeasible and (refusal := book.refusal(job.project_id, need)):
                # The project's quota holds it: no placement is taken, and nothing is preempted for it.
                admission.decision, admission.reason = Decision.wait, refusal[0]
                held_by_quota = True
            if admission.decision is Decision.admit and not _within(budget, job):
                admission.decision = Decision.wait
                admission.reason = (
                    f"waiting for resources: trainmaster jobs that are starting hold {held_cpus:g} CPU "
                    f"and {held_gpus:g} GPU of the cluster's {total.get('CPU', 0):g} CPU / "
                    f"{total.get('GPU', 0):g} GPU"
                )
            if admission.decision is Decision.admit:
                cluster.reserve(admission.placement)
                budget["CPU"] -= job.gang_cpus
                budget["GPU"] -= job.gang_gpus
                book.take(job.project_id, need)
                admitted.append(job)
                if admission.selector:
                    selectors[job.id] = admission.selector
            elif admission.decision is Decision.wait:
                reason = admission.reason
                reclaim = not held_by_quota and book.reclaims(job.project_id, need)
                if (settings.preemption or reclaim) and not held_by_quota:
                    if settings.preemption:
                        # Priority preemption counts what active jobs hold in the database: the gangs
                        # admitted so far in this round must be written first. (Reclaim reads the book.)
                        launches += await launch.start_attempts(
                            context, session, admitted, now, warning, selectors=selectors
                        )
                        admitted.clear()
                    waiting = await session.get_one(Job, job.id)  # locked already, by lock_queued
                    reclaiming = book if reclaim else None
                    if room := await preemption.make_room(settings, session, waiting, cluster, now, reclaiming):
                        reason = room
                if reason != job.pending_reason or job.infeasible_since is not None:
                    reasons[job.id] = reason
            else:
                await _infeasible(context, session, job, admission.reason, now)
        launches += await launch.start_attempts(
            context, session, admitted, now, warning, reasons, failures, selectors=selectors
        )
    # The attempt rows are committed: only now may Ray hear of them.
    await launch.submit_all(context, launches)
    return len(launches)


def _borrowers_last(queued: list[QueuedJob], book: Book) -> Iterator[QueuedJob]:
    """The round's jobs in admission order, except that a job that would hold more than its project's
    quota (it would borrow from the cohort) comes after every job that would not, as Kueue orders
    them: what a project is owed comes before what it may borrow, so a job preempted to give quota back
    cannot take it again ahead of the job that reclaimed it. Lazy: whether a job borrows is asked when
    its turn comes, after the gangs admitted before it are in the book."""
    later: list[QueuedJob] = []
    for job in queued:
        if book.borrows(job.project_id, {"CPU": job.gang_cpus, "GPU": job.gang_gpus}):
            later.append(job)
        else:
            yield job
    yield from later


def storage_warning(storage_path: str, cluster: Cluster) -> str | None:
    """Checkpoints must be reachable from every node. A URI (s3://, gs://, …) is; a local path is only
    if it is a shared mount on every host, which the dispatcher cannot see. So the job runs (the path
    may well be NFS) and the job's events say what to check: a refusal would stop every cluster that
    mounts its storage at the same path everywhere, which is the usual way to run."""
    if "://" in storage_path:
        return None
    hosts = {node.ip for node in cluster.nodes if node.ip}
    if len(hosts) < 2:
        return None
    return (
        f"checkpoints go to the local path {storage_path} while the cluster spans {len(hosts)} hosts "
        f"({', '.join(sorted(hosts)[:4])}{', …' if len(hosts) > 4 else ''}): a retry or a restarted worker on "
        "another host finds them only if that path is a shared mount (NFS, Weka, VAST, DDN) on every host. "
        "Otherwise set TRAINMASTER_STORAGE_PATH to a shared mount or an s3:// or gs:// URI."
    )


def _within(budget: dict[str, float], job: QueuedJob) -> bool:
    return job.gang_cpus <= budget["CPU"] + 1e-9 and job.gang_gpus <= budget["GPU"] + 1e-9


async def _infeasible(
    context: RoundContext, session: AsyncSession, queued: QueuedJob, reason: str, now: datetime
) -> None:
    """Mark the job infeasible (an event, the first time), then fail it once `infeasible_timeout_s`
    has passed. Rare, so through the ORM and the status machine, one job at a time."""
    job = await session.get_one(Job, queued.id)  # locked already, by lock_queued
    if job.infeasible_since is None:
        job.infeasible_since = now
        await record_event(session, job, "infeasible", reason)
    waited = (now - job.infeasible_since).total_seconds()
    left = context.settings.infeasible_timeout_s - waited
    if left <= 0:
        await transition(
            session, job, JobStatus.failed, error=f"{reason} (gave up after {waited:.0f} s)", message="infeasible"
        )
    else:
        job.pending_reason = f"{reason} Fails in {left:.0f} s unless the cluster grows."


async def _set_reasons_unreachable(context: RoundContext, error: str) -> None:
    reason = f"the Ray cluster {context.cluster_name!r} is unreachable ({error}); waiting for it to come back"
    async with context.sessions() as session, session.begin():
        queued = await repo.lock_queued(session, context.settings.admit_batch, context.cluster_id)
        changed = {job.id: reason for job in queued if job.pending_reason != reason}
        await repo.write_round(session, reasons=changed, clear_infeasible=False)
