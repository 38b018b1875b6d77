"""Project quotas and cohorts, as an admission round reads them (Kueue's model, on project rows).

Each project may have a nominal quota per resource (CPU, GPU; a resource without one is not limited).
A job is admitted only while its project's usage (what its active jobs hold) plus the gang stays
within the quota plus what the project may borrow. Projects that name the same cohort lend each other
what they leave unused: a member lends at most its `lending_limit` of its unused quota and borrows at
most its `borrowing_limit` beyond its own (no limit when left out). What the cohort has to lend is
the members' lendable unused quota less what other members already borrow.

`Book` holds every quota-bound project of the round and follows the gangs it admits, so later jobs
of the same round see them. The rules are pure: tests/unit/test_quotas.py checks them without a
database; tests/integration/test_quotas.py through real dispatcher rounds.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field

from api.db.models import Project
from api.dispatcher.reasons import Code, Reason

EPSILON = 1e-9
RESOURCES = ("CPU", "GPU")


@dataclass
class Standing:
    """One project's quota, cohort, limits and usage (resource -> amount)."""

    name: str
    quota: dict[str, float]
    cohort: str | None = None
    borrowing_limit: dict[str, float] | None = None
    lending_limit: dict[str, float] | None = None
    usage: dict[str, float] = field(default_factory=dict)
    # Its decayed fair-share history, a fraction of the cluster per resource (project_usage's columns):
    # fair-share preemption compares members' shares (api/dispatcher/victims.py).
    history: dict[str, float] = field(default_factory=dict)

    @classmethod
    def of(cls, row: Project, cpus: float, gpus: float, history: dict[str, float] | None = None) -> Standing:
        return cls(
            row.name,
            {name: float(amount) for name, amount in (row.quota or {}).items()},
            row.cohort,
            row.borrowing_limit,
            row.lending_limit,
            {"CPU": cpus, "GPU": gpus},
            history or {},
        )

    def used(self, resource: str) -> float:
        return self.usage.get(resource, 0.0)

    def borrowed(self, resource: str) -> float:
        """What it holds beyond its quota (0 for a resource it has no quota of)."""
        if resource not in self.quota:
            return 0.0
        return max(0.0, self.used(resource) - self.quota[resource])

    def lendable(self, resource: str) -> float:
        """What of its unused quota it lends its cohort now."""
        if resource not in self.quota:
            return 0.0
        unused = max(0.0, self.quota[resource] - self.used(resource))
        return min(unused, (self.lending_limit or {}).get(resource, unused))

    def beyond(self, resource: str, amount: float) -> bool:
        """Whether `amount` more of `resource` (one it has a quota of) takes it past its quota."""
        return amount > 0 and self.used(resource) + amount > self.quota[resource] + EPSILON

    def most_lent(self, resource: str) -> float:
        """What it would lend with nothing running (its quota, up to its lending limit)."""
        nominal = self.quota.get(resource, 0.0)
        return min(nominal, (self.lending_limit or {}).get(resource, nominal))


@dataclass
class Book:
    """The quota-bound projects of one admission round (by project id)."""

    projects: dict[uuid.UUID, Standing] = field(default_factory=dict)
    # Per cohort, the gangs for which reclaim found too little to preempt this round. Free resources only
    # shrink during a round and no job starts running in one, so a gang at least as large finds no more.
    unreclaimable: dict[str, list[dict[str, float]]] = field(default_factory=dict)
    # The same for fair-share preemption, per project (what may be taken depends on its share).
    unfair: dict[uuid.UUID, list[dict[str, float]]] = field(default_factory=dict)
    # Per cohort, the starving gang (job id, project id, how long later jobs of its project have passed it)
    # that waits for the cohort's lending: no later borrower of the cohort takes it this round (`keep_lending`).
    kept: dict[str, tuple[uuid.UUID, uuid.UUID, float]] = field(default_factory=dict)

    # Each cohort's members, found on first use (a round's projects are fixed once read): thousands of
    # projects in dozens of cohorts are not scanned whole for every job.
    cohorts: dict[str, list[tuple[uuid.UUID, Standing]]] = field(default_factory=dict, repr=False, compare=False)
    # Per cohort, its members' sums, made on first use and dropped when a member takes a gang (`take`, the
    # only change to usage in a round): a check of what the cohort lends reads them less the asking
    # project's own part instead of walking every other member (a batch spans many projects of a cohort).
    sums: dict[str, CohortSums] = field(default_factory=dict, repr=False, compare=False)

    def _cohort(self, cohort: str | None) -> list[tuple[uuid.UUID, Standing]]:
        if cohort is None:
            return []
        if not self.cohorts:
            for pid, standing in self.projects.items():
                if standing.cohort is not None:
                    self.cohorts.setdefault(standing.cohort, []).append((pid, standing))
        return self.cohorts.get(cohort, [])

    def members(self, cohort: str | None, but: uuid.UUID) -> list[Standing]:
        return [s for pid, s in self._cohort(cohort) if pid != but]

    def _sums(self, cohort: str) -> CohortSums:
        if (sums := self.sums.get(cohort)) is None:
            sums = self.sums[cohort] = CohortSums.of([s for _, s in self._cohort(cohort)])
        return sums

    def borrowers(self, project_id: uuid.UUID) -> list[uuid.UUID]:
        """The other members of the project's cohort that hold more than their quota now."""
        cohort = self._cohort(self.projects[project_id].cohort)
        return [pid for pid, s in cohort if pid != project_id and any(s.borrowed(r) > EPSILON for r in RESOURCES)]

    def free_to_borrow(self, project_id: uuid.UUID, resource: str) -> float:
        """What the project's cohort has free to lend it: the others' lendable unused quota less what
        the others already borrow (the cohort's sums less the project's own part)."""
        standing = self.projects[project_id]
        if standing.cohort is None:
            return 0.0
        sums = self._sums(standing.cohort)
        lent = sums.lendable[resource] - standing.lendable(resource)
        return max(0.0, lent - (sums.borrowed[resource] - standing.borrowed(resource)))

    def refusal(self, project_id: uuid.UUID, need: dict[str, float]) -> Reason | None:
        """Why the project's quota holds a gang of `need` now (`Reason.always`: whatever ends, as the
        quotas are), or None when it may be admitted."""
        standing = self.projects.get(project_id)
        if standing is None:
            return None
        for resource in RESOURCES:
            amount = need.get(resource, 0.0)
            if amount <= 0 or resource not in standing.quota:
                continue
            if not standing.beyond(resource, amount):
                continue
            nominal, used = standing.quota[resource], standing.used(resource)
            limit = (standing.borrowing_limit or {}).get(resource)
            most = 0.0  # what the other members would lend with nothing running
            if standing.cohort is not None:
                most = self._sums(standing.cohort).most_lent[resource] - standing.most_lent(resource)
            ceiling = nominal + min(most, limit if limit is not None else most)
            held = {"amount": amount, "resource": resource, "project": standing.name, "used": used, "quota": nominal}
            if amount > ceiling + EPSILON:
                parts = _ceiling_parts(standing, most)
                return Reason(Code.quota_never, {**held, "ceiling": ceiling, "parts": parts})
            if standing.cohort is None:
                return Reason(Code.quota, held)
            borrow = used + amount - nominal
            already = standing.borrowed(resource)
            if limit is not None and borrow > limit + EPSILON:
                return Reason(Code.borrowing_limit, {**held, "limit": limit, "borrowed": already})
            free = self.free_to_borrow(project_id, resource)
            if borrow > free + EPSILON:
                left = max(0.0, free - already)
                lending = {"borrowed": already, "cohort": standing.cohort, "left": left}
                return Reason(Code.cohort_lending, {**held, **lending})
        return None

    def borrows(self, project_id: uuid.UUID, need: dict[str, float]) -> bool:
        """Whether a gang of `need` would take its project beyond its quota."""
        standing = self.projects.get(project_id)
        return standing is not None and any(
            standing.beyond(r, amount) for r, amount in need.items() if r in standing.quota
        )

    def lending_short(self, project_id: uuid.UUID, need: dict[str, float]) -> dict[str, float]:
        """What its cohort lacks to lend a gang of `need` (resource -> amount), when that is what holds
        the gang: it would borrow within its borrowing limit, and other members borrow what it would.
        Empty when the cohort can lend it, or when the project's own limits hold it."""
        standing = self.projects.get(project_id)
        if standing is None or standing.cohort is None:
            return {}
        short: dict[str, float] = {}
        for resource in RESOURCES:
            amount = need.get(resource, 0.0)
            if amount <= 0 or resource not in standing.quota or not standing.beyond(resource, amount):
                continue
            borrow = standing.used(resource) + amount - standing.quota[resource]
            limit = (standing.borrowing_limit or {}).get(resource)
            if limit is not None and borrow > limit + EPSILON:
                return {}
            if (lack := borrow - self.free_to_borrow(project_id, resource)) > EPSILON:
                short[resource] = lack
        return short

    def keep_lending(self, project_id: uuid.UUID, job_id: uuid.UUID, passed_s: float) -> None:
        """A starving gang (bounded waits) waits for what its cohort lends: what frees is kept for it, so no
        later gang of another member that would borrow is admitted this round (`kept_for`). Otherwise
        smaller borrowers take each piece as it frees, and a large gang may wait all day."""
        cohort = self.projects[project_id].cohort
        if cohort is not None:
            self.kept.setdefault(cohort, (job_id, project_id, passed_s))

    def kept_for(self, project_id: uuid.UUID, need: dict[str, float]) -> tuple[uuid.UUID, str, float] | None:
        """The starving gang of another member (job id, its project's name, how long it was passed) that
        the cohort's lending is kept for, when a gang of `need` of this project would borrow; else None."""
        standing = self.projects.get(project_id)
        if standing is None or standing.cohort is None or (kept := self.kept.get(standing.cohort)) is None:
            return None
        job_id, holder, passed_s = kept
        if holder == project_id or not self.borrows(project_id, need):
            return None
        return job_id, self.projects[holder].name, passed_s

    def in_cohort(self, project_id: uuid.UUID) -> bool:
        standing = self.projects.get(project_id)
        return standing is not None and standing.cohort is not None

    def reclaims(self, project_id: uuid.UUID, need: dict[str, float]) -> bool:
        """Whether a gang of `need` that waits for resources may take back its project's quota from
        cohort members that borrow: the gang is within the project's own quota in every resource it
        needs, and some other member borrows."""
        standing = self.projects.get(project_id)
        if standing is None or standing.cohort is None or self.gave_up(project_id, need):
            return False
        if any(amount > 0 and (r not in standing.quota or standing.beyond(r, amount)) for r, amount in need.items()):
            return False
        own = any(standing.borrowed(resource) > EPSILON for resource in RESOURCES)
        return self._sums(standing.cohort).borrowing > int(own)

    def gave_up(self, project_id: uuid.UUID, need: dict[str, float]) -> bool:
        """Whether reclaim already found too little this round for a gang of `need` in the project's
        cohort (`reclaim_failed`): a gang at least as large finds no more."""
        standing = self.projects.get(project_id)
        if standing is None or standing.cohort is None:
            return False
        return _at_least_one_of(need, self.unreclaimable.get(standing.cohort, ()))

    def fair_share_gave_up(self, project_id: uuid.UUID, need: dict[str, float]) -> bool:
        """Whether fair-share preemption already found too little this round for a gang of the project
        (`fair_share_failed`): a gang at least as large finds no more."""
        return _at_least_one_of(need, self.unfair.get(project_id, ()))

    def fair_share_failed(self, project_id: uuid.UUID, need: dict[str, float]) -> None:
        self.unfair.setdefault(project_id, []).append(dict(need))

    def reclaim_failed(self, project_id: uuid.UUID, need: dict[str, float]) -> None:
        """Reclaim could not free `need` for this project's cohort: a gang as large is not tried again."""
        cohort = self.projects[project_id].cohort
        if cohort is not None:
            self.unreclaimable.setdefault(cohort, []).append(dict(need))

    def take(self, project_id: uuid.UUID, need: dict[str, float]) -> None:
        """An admitted gang: its project holds it from now on (for the rest of the round)."""
        standing = self.projects.get(project_id)
        if standing is not None:
            for resource, amount in need.items():
                standing.usage[resource] = standing.used(resource) + amount
            if standing.cohort is not None:
                self.sums.pop(standing.cohort, None)


@dataclass(frozen=True)
class CohortSums:
    """What a cohort's members lend now, borrow now and would lend with nothing running, per resource,
    and how many of them borrow any resource now."""

    lendable: dict[str, float]
    borrowed: dict[str, float]
    most_lent: dict[str, float]
    borrowing: int

    @classmethod
    def of(cls, members: list[Standing]) -> CohortSums:
        return cls(
            {r: sum(m.lendable(r) for m in members) for r in RESOURCES},
            {r: sum(m.borrowed(r) for m in members) for r in RESOURCES},
            {r: sum(m.most_lent(r) for m in members) for r in RESOURCES},
            sum(any(m.borrowed(r) > EPSILON for r in RESOURCES) for m in members),
        )


def _at_least_one_of(need: dict[str, float], failed: Iterable[dict[str, float]]) -> bool:
    """Whether `need` is at least as large as one of `failed` in every resource."""
    return any(all(need.get(r, 0.0) + EPSILON >= amount for r, amount in gang.items()) for gang in failed)


def _ceiling_parts(standing: Standing, most: float) -> str:
    if standing.cohort is None:
        return "its quota, in no cohort"
    return f"its quota, plus what cohort {standing.cohort} can lend at most: {most:g}"
