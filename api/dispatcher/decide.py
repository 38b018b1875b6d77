"""Every rule of admission in one pure function, after Kueue's scheduling cycle: the round takes a
snapshot (the queued jobs, the cluster's nodes with their labels, the quota book, what active jobs
hold), `decide` nominates and admits over it, and the round writes what it returns and launches.

`decide` reads no database, no Ray and no clock (`now` comes in): bench/simulate.py runs exactly it
against a simulated cluster of 10,000 nodes. It changes only the snapshot it is given, as a round
does: `cluster` loses what each admitted gang takes (`Cluster.reserve`) and `book` counts it
(`Book.take`), so each job sees the gangs admitted before it.

The order, per job:
1. a code package this dispatcher found unusable, or a spec placement cannot read: the job fails;
2. placement (placement.admit): whether the gang can ever fit, fits now, or waits for room;
3. its project's quota (quotas.Book.refusal) holds a gang that could fit: nothing is placed, and
   nothing is preempted for it, unless what holds it is that other members borrow what its cohort
   would lend it (fair share, below);
4. the budget: the cluster less what trainmaster's active jobs hold (their placement may not show in
   Ray yet) must cover the gang;
5. a job that waits for resources (not for its quota) may preempt lower-priority jobs (the
   `preemption` setting) or reclaim its project's quota from borrowers in its cohort; one that would
   borrow itself (held by resources or by its cohort's lending) may preempt borrowers above its
   project in fair share (the `fair_share_preemption` setting; api/dispatcher/victims.py). The round
   asks preemption.make_room for it after writing the admitted gangs.
Jobs come in admission order (`admission_key`), except that one that would borrow quota comes after
every one that would not (`borrowers_last`).
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, Protocol, TypeVar

from api.dispatcher.placement import Cluster, Decision, Resources, admit
from api.dispatcher.quotas import Book
from trainmaster.models import Scaling


class Queued(Protocol):
    """What `decide` reads of a queued job (repository.QueuedJob; bench/simulate.py's own jobs)."""

    @property
    def id(self) -> uuid.UUID: ...
    @property
    def project_id(self) -> uuid.UUID: ...
    @property
    def spec(self) -> Mapping[str, Any]: ...
    @property
    def priority(self) -> int: ...
    @property
    def gang_cpus(self) -> float: ...
    @property
    def gang_gpus(self) -> float: ...
    @property
    def created_at(self) -> datetime: ...
    @property
    def share(self) -> float: ...
    @property
    def infeasible_since(self) -> datetime | None: ...


Job = TypeVar("Job", bound=Queued)


def admission_key(job: Queued) -> tuple[int, float, datetime, uuid.UUID]:
    """Admission order: priority (highest first), then the project's fair share (`dominant_share`,
    lowest first), then submission order. repository.lock_queued's ORDER BY is the same key in SQL:
    it picks the round's batch, `decide` orders it with this."""
    return (-job.priority, job.share, job.created_at, job.id)


def dominant_share(history: Mapping[str, float], held: Mapping[str, float], capacity: Mapping[str, float]) -> float:
    """A project's fair share (dominant-resource fairness): over CPU and GPU, the largest of its
    decayed history plus what it holds now as a fraction of the cluster's capacity. The same formula
    as the computed column `project_usage.share` (api/db/models.py), which orders the queue in SQL."""
    return max(
        history.get(r, 0.0) + (held.get(r, 0.0) / capacity[r] if capacity.get(r, 0.0) > 0 else 0.0)
        for r in ("CPU", "GPU")
    )


def decayed(history: float, held_fraction: float, elapsed_s: float, half_life_s: float) -> float:
    """One fair-share sample: the history kept by half-life weighting over `elapsed_s`, the rest taken
    from what the project holds now (the formula of repository.SAMPLE_FAIR_SHARE)."""
    keep = 0.5 ** (elapsed_s / half_life_s)
    return history * keep + (1 - keep) * held_fraction


class Verdict(str, enum.Enum):
    admit = "admit"
    wait = "wait"
    infeasible = "infeasible"
    fail = "fail"


@dataclass
class Outcome(Generic[Job]):
    """What became of one job. admit: `placement` (node id -> bundles) and `selector` (the label
    domain, for a gang with a topology). wait: `reason`, and whether the round should ask for room by
    priority preemption (`preempt`), quota reclaim (`reclaim`) or fair share (`fair`). infeasible: `reason` (its event's
    text), `message` (what the job shows while it waits) or, once `infeasible_timeout_s` has passed,
    `error` (it fails). fail: `error` and the event's `message`; `exception` when placement raised
    (the round logs it)."""

    job: Job
    verdict: Verdict
    reason: str = ""
    placement: dict[str, list[Resources]] = field(default_factory=dict)
    selector: dict[str, str] | None = None
    preempt: bool = False
    reclaim: bool = False
    fair: bool = False
    error: str | None = None
    message: str = ""
    exception: BaseException | None = None


@dataclass
class Decisions(Generic[Job]):
    """`decide`'s answer, each job once, in the order the jobs were considered."""

    outcomes: list[Outcome[Job]] = field(default_factory=list)

    def of(self, verdict: Verdict) -> list[Outcome[Job]]:
        return [o for o in self.outcomes if o.verdict is verdict]


def decide(
    queue: Iterable[Job],
    cluster: Cluster,
    book: Book,
    held: Mapping[str, float],
    *,
    now: datetime,
    driver: Resources | None = None,
    preemption: bool = False,
    fair_share: bool = False,
    infeasible_timeout_s: float = 600.0,
    bad_code: Mapping[str, str] | None = None,
) -> Decisions[Job]:
    """Admit what fits of `queue` (any order: it is sorted by `admission_key`) on `cluster` within
    `book`'s quotas and the budget (the cluster's CPUs and GPUs less `held`, what trainmaster's active
    jobs hold); give every other job its outcome (the module's docstring says the rules)."""
    driver = driver or {}
    bad_code = bad_code or {}
    total = cluster.total()
    budget = {r: total.get(r, 0.0) - held.get(r, 0.0) for r in ("CPU", "GPU")}
    decisions: Decisions[Job] = Decisions()
    for job in borrowers_last(sorted(queue, key=admission_key), book):
        if (code := job.spec.get("code")) is not None and (why := bad_code.get(code)) is not None:
            decisions.outcomes.append(Outcome(job, Verdict.fail, error=why, message=f"not launched: {why}"))
            continue
        try:
            # Placement reads only the scaling: the whole spec is validated for the launch alone.
            admission = admit(Scaling.model_validate(job.spec.get("scaling", {})), cluster, driver)
        except Exception as exc:  # a stored spec placement cannot read, or a bug: this job's alone
            error = f"could not be placed: {type(exc).__name__}: {str(exc)[:500]}"
            decisions.outcomes.append(
                Outcome(job, Verdict.fail, error=error, message="admission_failed", exception=exc)
            )
            continue
        need = {"CPU": job.gang_cpus, "GPU": job.gang_gpus}
        if admission.decision is Decision.infeasible:
            decisions.outcomes.append(_infeasible(job, admission.reason, now, infeasible_timeout_s))
            continue
        if refusal := book.refusal(job.project_id, need):
            # The project's quota holds it: no placement is taken, and nothing is preempted for it,
            # unless other members borrow what its cohort would lend it and fair share may take it back.
            fair = fair_share and not refusal[1] and bool(book.lending_short(job.project_id, need))
            decisions.outcomes.append(Outcome(job, Verdict.wait, refusal[0], fair=fair))
            continue
        if admission.decision is Decision.admit and not _within(budget, need):
            admission.decision = Decision.wait
            admission.reason = (
                f"waiting for resources: trainmaster jobs that are starting hold {held.get('CPU', 0.0):g} CPU "
                f"and {held.get('GPU', 0.0):g} GPU of the cluster's {total.get('CPU', 0):g} CPU / "
                f"{total.get('GPU', 0):g} GPU"
            )
        if admission.decision is Decision.admit:
            cluster.reserve(admission.placement)
            for resource, amount in need.items():
                budget[resource] -= amount
            book.take(job.project_id, need)
            decisions.outcomes.append(
                Outcome(job, Verdict.admit, admission.reason, admission.placement, admission.selector)
            )
        else:
            reclaim = book.reclaims(job.project_id, need)
            fair = fair_share and not reclaim and book.in_cohort(job.project_id)
            decisions.outcomes.append(
                Outcome(job, Verdict.wait, admission.reason, preempt=preemption, reclaim=reclaim, fair=fair)
            )
    return decisions


def borrowers_last(queued: Iterable[Job], book: Book) -> Iterator[Job]:
    """The jobs in the order given, except that a job that would hold more than its project's quota (it
    would borrow from the cohort) comes after every job that would not, as Kueue orders them: what a
    project is owed comes before what it may borrow, so a job preempted to give quota back cannot take
    it again ahead of the job that reclaimed it. Lazy: whether a job borrows is asked when its turn
    comes, after the gangs admitted before it are in the book."""
    later: list[Job] = []
    for job in queued:
        if book.borrows(job.project_id, {"CPU": job.gang_cpus, "GPU": job.gang_gpus}):
            later.append(job)
        else:
            yield job
    yield from later


def _infeasible(job: Job, reason: str, now: datetime, timeout_s: float) -> Outcome[Job]:
    """A gang that can never fit the cluster as it is: it waits `timeout_s` from when it was first
    found so (now, the first time), then fails."""
    waited = (now - (job.infeasible_since or now)).total_seconds()
    left = timeout_s - waited
    if left <= 0:
        return Outcome(job, Verdict.infeasible, reason, error=f"{reason} (gave up after {waited:.0f} s)")
    return Outcome(job, Verdict.infeasible, reason, message=f"{reason} Fails in {left:.0f} s unless the cluster grows.")


def _within(budget: Mapping[str, float], need: Mapping[str, float]) -> bool:
    return all(amount <= budget[resource] + 1e-9 for resource, amount in need.items())
