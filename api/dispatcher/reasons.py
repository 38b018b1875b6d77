"""Why a job waits, as data: a code and its parameters, decided by `decide` and the quota book and turned
into the sentence a person reads (`pending_reason`) by `render`, in one place. Policy reads codes; only
`render` writes prose, so no rule ever depends on the wording of a message."""

from __future__ import annotations

import enum
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
    """The sentence `pending_reason` shows for `reason`: its code's template filled with its parameters
    (and `held` and `minutes`, made from them)."""
    p = dict(reason.params)
    if "quota" in p:
        p["held"] = HELD.format(**p)
    if "passed_s" in p:
        p["minutes"] = p["passed_s"] / 60
    text = TEXT[reason.code].format(**p)
    if reason.holds_s is not None:  # one sentence's end, not two
        text = text.removesuffix(".") + HOLDS.format(minutes=reason.holds_s / 60)
    return text


HELD = "needs {amount:g} {resource}; project {project} holds {used:g} of its quota of {quota:g} {resource}"
HOLDS = (
    ". Later jobs of its project have passed it for {minutes:.0f} min: nothing after it is admitted until it fits"
    " (bounded waits)"
)
WAITING_TO_STOP = "waiting for them to checkpoint and stop"

TEXT = {
    Code.resources: "{detail}",
    Code.starting: "waiting for resources: trainmaster jobs that are starting hold {cpus:g} CPU and {gpus:g} GPU"
    " of the cluster's {total_cpus:g} CPU / {total_gpus:g} GPU",
    Code.quota: "waiting for its project's quota: {held}.",
    Code.borrowing_limit: "waiting for its project's quota: {held} and may borrow at most {limit:g} beyond it"
    " (it borrows {borrowed:g}).",
    Code.cohort_lending: "waiting for its project's quota: {held}, borrows {borrowed:g} from cohort {cohort}, which"
    " has {left:g} {resource} left to lend.",
    Code.quota_never: "can never fit its project's quota as it is: needs {amount:g} {resource}; project {project}"
    " may hold at most {ceiling:g} {resource} ({parts}). Raise it with `trainmaster project set --quota`, or ask"
    " for fewer.",
    Code.behind_starving: "waiting behind job {job}, which later jobs of its project have passed for {minutes:.0f}"
    " min: nothing after it is admitted until it fits (bounded waits)",
    Code.behind_lending: "waiting behind job {job} of project {project}, which waits for what their cohort lends and"
    " which later jobs of its project have passed for {minutes:.0f} min: no later job of the cohort borrows until"
    " it fits (bounded waits)",
    Code.ray_unreachable: "the Ray cluster {cluster!r} is unreachable ({error}); waiting for it to come back",
    Code.shrinking: "shrinking {count} elastic job(s) to make room ({jobs}): waiting for them to resize",
    Code.preempting: "preempting {count} lower-priority job(s) ({jobs}): " + WAITING_TO_STOP,
    Code.preempting_asked: "preempting {count} job(s) to make room ({jobs}): " + WAITING_TO_STOP,
    Code.reclaiming: "reclaiming its quota from cohort {cohort}: preempting {count} job(s) on borrowed quota"
    " ({jobs}): " + WAITING_TO_STOP,
    Code.preempting_fair: "preempting {count} job(s) on borrowed quota for fair share in cohort {cohort} ({jobs}):"
    " their projects' shares are above {project}'s; " + WAITING_TO_STOP,
}
