"""Why a job waits, as data: a code and its parameters, decided by `decide` and the quota book and turned
into the sentence a person reads (`pending_reason`) by `render`, in one place. Policy reads codes; only
`render` writes prose, so no rule ever depends on the wording of a message."""

from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass, field, replace
from typing import Any


class Code(str, enum.Enum):
    resources = "resources"  # the cluster has no room now (`detail`: placement's account of the nodes)
    starting = "starting"  # trainmaster's starting gangs hold the room (`cpus`, `gpus`, `total_cpus`, `total_gpus`)
    quota = "quota"  # its project's quota, in no cohort (`amount`, `resource`, `project`, `used`, `quota`)
    borrowing_limit = "borrowing_limit"  # beyond what its project may borrow (those, `limit`, `borrowed`)
    cohort_lending = "cohort_lending"  # its cohort has too little left to lend (those, `cohort`, `left`)
    quota_never = "quota_never"  # more than its project may ever hold (those of quota, `ceiling`, `parts`)
    behind_starving = "behind_starving"  # behind its project's starving job (`job`, `passed_s`)
    behind_lending = "behind_lending"  # lending kept for another's starving job (`job`, `project`, `passed_s`)
    ray_unreachable = "ray_unreachable"  # the cluster's Ray is down (`cluster`, `error`)
    # Room being made for it (api/dispatcher/room.py), each with `count` and `jobs` (their short ids):
    shrinking = "shrinking"  # elastic gangs asked to shrink
    preempting = "preempting"  # lower-priority jobs asked to go
    preempting_asked = "preempting_asked"  # jobs asked to go in an earlier round, still stopping
    reclaiming = "reclaiming"  # borrowers asked to give its project's quota back (`cohort`)
    preempting_fair = "preempting_fair"  # borrowers above it in fair share asked to go (`cohort`, `project`)


@dataclass(frozen=True)
class Reason:
    """A wait: its code, its parameters, and, when later jobs of its project have passed it for
    `starvation_s` (bounded waits), for how long: nothing after it is admitted until it fits."""

    code: Code
    params: dict[str, Any] = field(default_factory=dict)
    holds_s: float | None = None

    @property
    def always(self) -> bool:
        """Whether it holds whatever runs or ends (the quotas as they are): not a wait for room."""
        return self.code is Code.quota_never

    def holding(self, passed_s: float) -> Reason:
        return replace(self, holds_s=passed_s)

    def __str__(self) -> str:
        return render(self)


def render(reason: Reason) -> str:
    """The sentence `pending_reason` shows for `reason`."""
    p = reason.params
    text = _TEXT[reason.code](p)
    if reason.holds_s is not None:
        text += (
            f". Later jobs of its project have passed it for {reason.holds_s / 60:.0f} min: nothing after it is "
            "admitted until it fits (bounded waits)"
        )
    return text


def _held(p: dict[str, Any]) -> str:
    used = f"holds {p['used']:g} of its quota of {p['quota']:g} {p['resource']}"
    return f"needs {p['amount']:g} {p['resource']}; project {p['project']} {used}"


def _job(job: uuid.UUID | str) -> str:
    return str(job)


_TEXT = {
    Code.resources: lambda p: p["detail"],
    Code.starting: lambda p: (
        f"waiting for resources: trainmaster jobs that are starting hold {p['cpus']:g} CPU and {p['gpus']:g} GPU "
        f"of the cluster's {p['total_cpus']:g} CPU / {p['total_gpus']:g} GPU"
    ),
    Code.quota: lambda p: f"waiting for its project's quota: {_held(p)}.",
    Code.borrowing_limit: lambda p: (
        f"waiting for its project's quota: {_held(p)} and may borrow at most {p['limit']:g} beyond it "
        f"(it borrows {p['borrowed']:g})."
    ),
    Code.cohort_lending: lambda p: (
        f"waiting for its project's quota: {_held(p)}, borrows {p['borrowed']:g} from cohort {p['cohort']}, "
        f"which has {p['left']:g} {p['resource']} left to lend."
    ),
    Code.quota_never: lambda p: (
        f"can never fit its project's quota as it is: needs {p['amount']:g} {p['resource']}; project "
        f"{p['project']} may hold at most {p['ceiling']:g} {p['resource']} ({p['parts']})."
        " Raise it with `trainmaster project set --quota`, or ask for fewer."
    ),
    Code.behind_starving: lambda p: (
        f"waiting behind job {_job(p['job'])}, which later jobs of its project have passed for "
        f"{p['passed_s'] / 60:.0f} min: nothing after it is admitted until it fits (bounded waits)"
    ),
    Code.behind_lending: lambda p: (
        f"waiting behind job {_job(p['job'])} of project {p['project']}, which waits for what their cohort lends "
        f"and which later jobs of its project have passed for {p['passed_s'] / 60:.0f} min: no later job of the "
        "cohort borrows until it fits (bounded waits)"
    ),
    Code.ray_unreachable: lambda p: (
        f"the Ray cluster {p['cluster']!r} is unreachable ({p['error']}); waiting for it to come back"
    ),
    Code.shrinking: lambda p: (
        f"shrinking {p['count']} elastic job(s) to make room ({p['jobs']}): waiting for them to resize"
    ),
    Code.preempting: lambda p: (
        f"preempting {p['count']} lower-priority job(s) ({p['jobs']}): waiting for them to checkpoint and stop"
    ),
    Code.preempting_asked: lambda p: (
        f"preempting {p['count']} job(s) to make room ({p['jobs']}): waiting for them to checkpoint and stop"
    ),
    Code.reclaiming: lambda p: (
        f"reclaiming its quota from cohort {p['cohort']}: preempting {p['count']} job(s) on borrowed quota "
        f"({p['jobs']}): waiting for them to checkpoint and stop"
    ),
    Code.preempting_fair: lambda p: (
        f"preempting {p['count']} job(s) on borrowed quota for fair share in cohort {p['cohort']} ({p['jobs']}): "
        f"their projects' shares are above {p['project']}'s; waiting for them to checkpoint and stop"
    ),
}
