"""Every rule of admission in one pure function, after Kueue's scheduling cycle: the round takes a
snapshot (the queued jobs, the cluster's nodes with their labels, the quota book, what active jobs
hold), `decide` nominates and admits over it, and the round writes what it returns and launches.

`decide` reads no database, no Ray and no clock (`now` comes in): bench/simulate.py runs exactly it
against a simulated cluster of 10,000 nodes. It changes only the snapshot it is given, as a round
does: `cluster` loses what each admitted gang takes (`ClusterCapacity.reserve`) and `book` counts it
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
   project in fair share (the `fair_share_preemption` setting; api/dispatcher/victims.py). Which
   running jobs go for it is room.choose's, over the same round's snapshot and the cluster's active
   jobs: its targets land in `Decisions.rooms`, and the round only writes them.
Why a job waits is a code with its parameters (`Outcome.why`, reasons.py), rendered once for people.
Jobs come in admission order (`admission_key`), except that one that would borrow quota comes after
every one that would not (`borrowers_last`).

Bounded waits: a job that waits (for resources, its project's quota, or behind a starving gang) while a
job after it in its project's order is admitted is `bypassed` (the round records since when). Once that
is `starvation_s` old, no later job of its project is admitted until it is (they would take the quota it
waits for), and while it waits for resources no later job at all (they would take the room it waits
for); the jobs held say behind which job they wait. A starving job that waits for its cohort's lending
keeps it from the later borrowers of the cohort's other projects (quotas.Book.keep_lending).

A round may call `decide` on more than one batch of the queue, over the same snapshot: `read_on` says
when (the batch's jobs wait for their own projects) and `seen` which projects the next batch leaves out.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic

from api.dispatcher.placement import ClusterCapacity, Decision, Resources, admit
from api.dispatcher.quotas import Book
from api.dispatcher.reasons import Code, Reason, render
from api.queues.order import Job, Queued, admission_key
from trainmaster.models import Scaling

if TYPE_CHECKING:
    from api.dispatcher.room import Room


def decayed(
    history: float, weight: float, held_fraction: float, elapsed_s: float, half_life_s: float
) -> tuple[float, float]:
    """One fair-share sample (the formula of repository.SAMPLE_FAIR_SHARE). `history` is the half-life
    average of the fraction the project held over the time its samples cover, `weight` how much of a full
    history that is (0 before its first sample): the time before the project's first job does not count
    as time it held nothing. Over `elapsed_s` the old part keeps its half-life weight and what the project
    holds now takes the rest. Returns the new history and weight."""
    keep = 0.5 ** (elapsed_s / half_life_s)
    kept = weight * keep
    covered = kept + (1 - keep)
    if covered <= 0:  # no time behind it yet
        return history, weight
    return (history * kept + (1 - keep) * held_fraction) / covered, covered


class Verdict(str, enum.Enum):
    admit = "admit"
    wait = "wait"
    infeasible = "infeasible"
    fail = "fail"


@dataclass
class Outcome(Generic[Job]):
    """What became of one job. admit: `placement` (node id -> bundles) and `selector` (the label
    domain, for a gang with a topology). wait: `why` (a reasons.Reason: a code and its parameters;
    `reason` renders it), and whether the round should ask for room by
    priority preemption (`preempt`), quota reclaim (`reclaim`) or fair share (`fair`), and whether a
    later job of its project was admitted while it waited (`bypassed`). infeasible: `reason` (placement's
    account, its event's text), `message` (what the job shows while it waits) or, once
    `infeasible_timeout_s` has passed, `error` (it fails). fail: `error` and the event's `message`;
    `exception` when placement raised (the round logs it)."""

    job: Job
    verdict: Verdict
    detail: str = ""  # placement's account (admit, infeasible)
    placement: dict[str, list[Resources]] = field(default_factory=dict)
    selector: dict[str, str] | None = None
    preempt: bool = False
    reclaim: bool = False
    fair: bool = False
    # It waited (for room, quota or a starving gang) while a later job of its project was admitted.
    bypassed: bool = False
    # Its project holds it (its quota, its cohort's lending, or its own starving job), not the cluster:
    # other projects' jobs may fit (read_on).
    own: bool = False
    error: str | None = None
    message: str = ""
    exception: BaseException | None = None
    why: Reason | None = None  # wait: why, as data

    @property
    def reason(self) -> str:
        """The sentence a person reads: a wait's `why` rendered, else placement's account."""
        return render(self.why) if self.why is not None else self.detail


@dataclass
class Decisions(Generic[Job]):
    """`decide`'s answer, each job once, in the order the jobs were considered."""

    outcomes: list[Outcome[Job]] = field(default_factory=list)
    held: bool = False  # a starving gang that waits for resources held the round: nothing after it was placed
    # The room made for waiting jobs (room.choose, over the cluster's active jobs): job id -> its targets.
    rooms: dict[uuid.UUID, Room] = field(default_factory=dict)

    def of(self, verdict: Verdict) -> list[Outcome[Job]]:
        return [o for o in self.outcomes if o.verdict is verdict]

    def extend(self, more: Decisions[Job]) -> None:
        self.outcomes += more.outcomes
        self.held = self.held or more.held


# A round reads at most this many batches (each `admit_batch` jobs): see `read_on`.
ROUND_BATCHES = 3


def read_on(decisions: Decisions[Any], admitted: int, admit_batch: int) -> bool:
    """Whether a round reads another batch of the queue, without the projects it has seen (`seen`).

    The first `admit_batch` jobs in admission order can all wait for what their own projects hold them
    to (quotas, cohorts' lending): read alone, they would stop every other project's jobs for as long
    as they wait. So while a batch was full, one of its jobs waited for its project (`Outcome.own`),
    the round admitted fewer than `admit_batch` and no starving gang holds it, the round reads the
    next jobs in admission order of the projects not yet seen (up to ROUND_BATCHES batches). A project
    seen once is left out, so that none of its later jobs passes one of its jobs that waits unmarked
    (one whose every job was admitted comes back next round). Jobs that wait for the cluster's room
    read no further: later ones would wait for it as well. A batch's `decisions` hold one outcome per
    job it brought."""
    return (
        len(decisions.outcomes) >= admit_batch
        and admitted < admit_batch
        and not decisions.held
        and any(outcome.own for outcome in decisions.outcomes)
    )


def seen(decisions: Decisions[Any]) -> set[uuid.UUID]:
    """The projects of the jobs a batch brought (`read_on`)."""
    return {outcome.job.project_id for outcome in decisions.outcomes}


def decide(
    queue: Iterable[Job],
    cluster: ClusterCapacity,
    book: Book,
    held: Mapping[str, float],
    *,
    now: datetime,
    driver: Resources | None = None,
    preemption: bool = False,
    fair_share: bool = False,
    infeasible_timeout_s: float = 600.0,
    starvation_s: float = 0.0,
    bad_code: Mapping[str, str] | None = None,
) -> Decisions[Job]:
    """Admit what fits of `queue` (any order: it is sorted by `admission_key`) on `cluster` within
    `book`'s quotas and the budget (the cluster's CPUs and GPUs less `held`, what trainmaster's active
    jobs hold); give every other job its outcome (the module's docstring says the rules)."""
    driver = driver or {}
    bad_code = bad_code or {}
    book.sums.clear()  # the cohorts' sums are made again: usage may have changed since the book was last read
    total = cluster.total()
    budget = {r: total.get(r, 0.0) - held.get(r, 0.0) for r in ("CPU", "GPU")}
    decisions: Decisions[Job] = Decisions()
    ordered = sorted(queue, key=admission_key)
    # Each project's starving jobs (passed by later jobs of its project for `starvation_s`), in order: until
    # the first is admitted, no later job of its project is (then the next holds); while it waits for
    # resources, no later job at all.
    starving: dict[uuid.UUID, list[tuple[Job, float]]] = {}
    for job in ordered:
        if passed := _starving(job, now, starvation_s):
            starving.setdefault(job.project_id, []).append((job, passed))
    hold: tuple[Job, float] | None = None  # a starving job that waits for resources
    # The jobs that wait for resources, quota or a starving gang: each is bypassed if a later job of its
    # project is admitted (one that did not borrow can come before a borrower, see borrowers_last).
    passable: list[Outcome[Job]] = []
    for job in borrowers_last(ordered, book):
        if (code := job.spec.get("code")) is not None and (why := bad_code.get(code)) is not None:
            decisions.outcomes.append(Outcome(job, Verdict.fail, error=why, message=f"not launched: {why}"))
            continue
        if hold is not None:
            # Behind a starving gang that waits for resources: nothing after it is placed this round.
            passable.append(Outcome(job, Verdict.wait, why=_behind(*hold)))
            decisions.outcomes.append(passable[-1])
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
        first = starving[job.project_id][0] if job.project_id in starving else None
        if first is not None and first[0].id != job.id:
            if admission_key(first[0]) < admission_key(job):
                # A later job of a project whose starving job waits: it takes neither quota nor resources.
                passable.append(Outcome(job, Verdict.wait, why=_behind(*first), own=True))
                decisions.outcomes.append(passable[-1])
                continue
            first = None  # this job comes before its project's starving one
        if (kept := book.kept_for(job.project_id, need)) is not None:
            # Another member's starving gang waits for the cohort's lending: this one would borrow it.
            job_id, project, passed = kept
            behind = Reason(Code.behind_lending, {"job": job_id, "project": project, "passed_s": passed})
            passable.append(Outcome(job, Verdict.wait, why=behind, own=True))
            decisions.outcomes.append(passable[-1])
            continue
        if refusal := book.refusal(job.project_id, need):
            # The project's quota holds it: no placement is taken, and nothing is preempted for it,
            # unless other members borrow what its cohort would lend it and fair share may take it back.
            # Whether its cohort's lending holds it: asked only where it is used (it sums over the cohort).
            lending = (
                not refusal.always
                and (fair_share or first is not None)
                and bool(book.lending_short(job.project_id, need))
            )
            outcome = Outcome(job, Verdict.wait, why=refusal, fair=fair_share and lending, own=True)
            if first is not None:
                outcome.why = refusal.holding(first[1])
                if lending:  # its cohort's lending is kept for it from now on (Book.keep_lending)
                    book.keep_lending(job.project_id, job.id, first[1])
            decisions.outcomes.append(outcome)
            if not refusal.always:
                passable.append(outcome)
            continue
        wait = Reason(Code.resources, {"detail": admission.reason})
        if admission.decision is Decision.admit and not _within(budget, need):
            admission.decision = Decision.wait
            wait = Reason(
                Code.starting,
                {
                    "cpus": held.get("CPU", 0.0),
                    "gpus": held.get("GPU", 0.0),
                    "total_cpus": total.get("CPU", 0.0),
                    "total_gpus": total.get("GPU", 0.0),
                },
            )
        if admission.decision is Decision.wait and first is not None:
            hold, decisions.held = first, True
            wait = wait.holding(first[1])
        if admission.decision is Decision.admit:
            if first is not None:  # its project's first starving job: the next one holds from now
                starving[job.project_id].pop(0)
                if not starving[job.project_id]:
                    del starving[job.project_id]
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
            outcome = Outcome(job, Verdict.wait, why=wait, preempt=preemption, reclaim=reclaim, fair=fair)
            decisions.outcomes.append(outcome)
            passable.append(outcome)
    _mark_bypassed(decisions, passable)
    return decisions


def _behind(first: Queued, passed: float) -> Reason:
    return Reason(Code.behind_starving, {"job": first.id, "passed_s": passed})


def _starving(job: Queued, now: datetime, starvation_s: float) -> float:
    """How long later jobs of its project have passed `job`, once that is `starvation_s` or more; else 0."""
    if starvation_s <= 0 or job.bypassed_since is None:
        return 0.0
    passed = (now - job.bypassed_since).total_seconds()
    return passed if passed >= starvation_s else 0.0


def _mark_bypassed(decisions: Decisions[Job], passable: list[Outcome[Job]]) -> None:
    """A job that waits for resources, its project's quota or a starving gang is bypassed when a job after
    it in its project's admission order was admitted in the same round (a smaller gang fitted where it
    did not, or came first as it did not borrow)."""
    last: dict[uuid.UUID, tuple[int, float, datetime, uuid.UUID]] = {}
    for outcome in decisions.of(Verdict.admit):
        key = admission_key(outcome.job)
        if outcome.job.project_id not in last or key > last[outcome.job.project_id]:
            last[outcome.job.project_id] = key
    for outcome in passable:
        latest = last.get(outcome.job.project_id)
        outcome.bypassed = latest is not None and admission_key(outcome.job) < latest


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
