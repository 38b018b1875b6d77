"""One admission round, after Kueue's scheduling cycle: a snapshot (Ray's nodes; under the admission
lock what active jobs hold, the quota book and the first `admit_batch` queued jobs in admission order),
the decisions of `decide.decide` (every rule of admission is there; while a batch's jobs wait for their
own projects and too few were admitted, the next batch, of the projects not yet seen: decide.read_on),
then the writes: the admitted gangs' attempts, the waiting jobs' reasons (after asking preemption for
room where the decision allows it), the infeasible and failed jobs; then the launches."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncSession

from api.db.models import Job
from api.dispatcher import launch, preemption, room, round_writes
from api.dispatcher import repository as repo
from api.dispatcher.backend import Launch, RayUnavailable
from api.dispatcher.context import RoundContext
from api.dispatcher.decide import ROUND_BATCHES, Decisions, Outcome, Verdict, decide, read_on, seen
from api.dispatcher.placement import ClusterCapacity
from api.dispatcher.quotas import Book
from api.dispatcher.reasons import Code, Reason, render
from api.jobs.status import record_event, transition
from api.queues import repository as queues
from api.queues.order import gang
from api.queues.repository import QueuedJob
from trainmaster.models import JobStatus

log = logging.getLogger("trainmaster.dispatcher")


async def admit_round(context: RoundContext) -> int:
    """Snapshot, `decide`, write the decisions, launch. Returns how many were launched."""
    settings = context.settings
    try:
        cluster = await asyncio.to_thread(context.ray.cluster)
    except RayUnavailable as exc:
        await _set_reasons_unreachable(context, str(exc))
        return 0
    driver = {"CPU": settings.driver_cpus} if settings.driver_cpus > 0 else {}
    async with context.sessions() as session, session.begin():
        ours = context.cluster_id
        await repo.lock_admission(session, ours)
        # Before the queue is read in fair-share order: a sample due now orders this round.
        if time.monotonic() - context.fair_share_sampled >= settings.fair_share_sample_s:
            half_life, interval = settings.fair_share_half_life_s, settings.fair_share_sample_s
            await repo.sample_fair_share(session, cluster.total(), half_life, interval, ours)
            context.fair_share_sampled = time.monotonic()
        now, held_cpus, held_gpus = await repo.held_resources(session, ours)
        book = await repo.quota_book(session, ours)
        held = {"CPU": held_cpus, "GPU": held_gpus}
        decisions: Decisions[QueuedJob] = Decisions()
        looked: set[uuid.UUID] = set()  # the projects of the batches read so far
        for _ in range(ROUND_BATCHES):
            more = decide(
                await queues.lock_queued(session, settings.admit_batch, ours, looked),
                cluster,
                book,
                held,
                now=now,
                driver=driver,
                preemption=settings.preemption,
                fair_share=settings.fair_share_preemption,
                infeasible_timeout_s=settings.infeasible_timeout_s,
                starvation_s=settings.starvation_s,
                bad_code=context.bad_code,
            )
            decisions.extend(more)
            for outcome in more.of(Verdict.admit):  # the next batch's budget counts them
                held["CPU"] += outcome.job.gang_cpus
                held["GPU"] += outcome.job.gang_gpus
            looked |= seen(more)
            if not read_on(more, len(decisions.of(Verdict.admit)), settings.admit_batch):
                break
        launches = await _write(context, session, decisions, cluster, book, now)
    # The attempt rows are committed: only now may Ray hear of them.
    await launch.submit_all(context, launches)
    return len(launches)


async def _write(
    context: RoundContext,
    session: AsyncSession,
    decisions: Decisions[QueuedJob],
    cluster: ClusterCapacity,
    book: Book,
    now: datetime,
) -> list[Launch]:
    """Write a round's decisions: the admitted gangs' attempts, the failures and the waiting jobs'
    reasons in one statement (launch.start_attempts), the infeasible jobs one at a time. Where a waiting
    job may preempt, reclaim or preempt for fair share, the cluster's active jobs are read and room.choose
    decides each one's room over them, in admission order (`Decisions.rooms`); preemption.apply writes it
    and the job shows it as its reason."""
    settings = context.settings
    warning = storage_warning(settings.storage_path, cluster)  # the same for every job of the round
    admitted = [o.job for o in decisions.of(Verdict.admit)]
    selectors = {o.job.id: o.selector for o in decisions.of(Verdict.admit) if o.selector}
    failures: dict[uuid.UUID, tuple[str, str]] = {}  # job id -> (error, event message)
    for failed in decisions.of(Verdict.fail):
        if failed.exception is not None:
            log.error("admission_failed", extra={"job_id": str(failed.job.id)}, exc_info=failed.exception)
        failures[failed.job.id] = (failed.error or "", failed.message)
    for infeasible in decisions.of(Verdict.infeasible):
        await _infeasible(session, infeasible, now)
    waiting = decisions.of(Verdict.wait)
    if any(o.preempt or o.reclaim or o.fair for o in waiting):
        active = await preemption.snapshot(session, context.cluster_id)
        admitted_gangs = [(o.job.project_id, gang(o.job)) for o in decisions.of(Verdict.admit)]
        decisions.rooms = room.choose_for(settings, waiting, active, cluster, book, now, admitted_gangs)
        for job_id, targets in decisions.rooms.items():
            await preemption.apply(settings, session, job_id, targets, now)
    # The waiting jobs' reasons, written together where they changed (round_writes.ROUND_WRITES).
    shown = {job_id: render(targets.reason) for job_id, targets in decisions.rooms.items()}
    reasons = {o.job.id: shown.get(o.job.id, o.reason) for o in waiting}
    launches: list[Launch] = []
    bypassed = [o.job.id for o in waiting if o.bypassed and o.job.bypassed_since is None]
    launches += await launch.start_attempts(
        context, session, admitted, now, warning, reasons, failures, selectors=selectors, bypassed=bypassed
    )
    return launches


def storage_warning(storage_path: str, cluster: ClusterCapacity) -> str | None:
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


async def _infeasible(session: AsyncSession, outcome: Outcome[QueuedJob], now: datetime) -> None:
    """Mark the job infeasible (an event, the first time), then fail it once `decide` says its
    `infeasible_timeout_s` has passed. Rare, so through the ORM and the status machine, one at a time."""
    job = await session.get_one(Job, outcome.job.id)  # locked already, by lock_queued
    if job.infeasible_since is None:
        job.infeasible_since = now
        await record_event(session, job, "infeasible", outcome.reason)
    if outcome.error is not None:
        await transition(session, job, JobStatus.failed, error=outcome.error, message="infeasible")
    else:
        job.pending_reason = outcome.message


async def _set_reasons_unreachable(context: RoundContext, error: str) -> None:
    reason = render(Reason(Code.ray_unreachable, {"cluster": context.cluster_name, "error": error}))
    async with context.sessions() as session, session.begin():
        queued = await queues.lock_queued(session, context.settings.admit_batch, context.cluster_id)
        await round_writes.write_round(session, reasons={job.id: reason for job in queued}, clear_infeasible=False)
