"""Early-stopping rules on the metric values trials reached at milestone steps.

A trial's value at milestone m is its first reported value at a step >= m (as Ray Tune records a
result at a rung). Decisions are asynchronous: a trial is judged when it reaches a milestone, against
the trials that reached it before, so nobody waits for a whole rung to fill.

- `asha` (asynchronous successive halving): milestones grace·rf^k; a trial continues only while its
  value is within the best 1/rf of the values recorded at that milestone (itself included).
- `median`: milestones k·grace; a trial stops when its value is worse than the median of at least two
  other trials' values at the same milestone.

A value that is not a finite number (the metric diverged) stops the trial at the milestone.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from trainmaster.models import EarlyStopping

MEDIAN_MIN_PEERS = 2


@dataclass(frozen=True)
class Rule:
    policy: str
    grace_steps: int
    reduction_factor: int
    mode: str  # "min" or "max"
    metric: str

    @classmethod
    def of(cls, early_stopping: EarlyStopping, mode: str, metric: str) -> Rule:
        return cls(early_stopping.policy, early_stopping.grace_steps, early_stopping.reduction_factor, mode, metric)

    def milestones_up_to(self, step: int) -> list[int]:
        """The milestones a trial at `step` has passed, ascending."""
        if self.policy == "none" or step < self.grace_steps:
            return []
        if self.policy == "median":
            return list(range(self.grace_steps, step + 1, self.grace_steps))
        found, milestone = [], self.grace_steps
        while milestone <= step:
            found.append(milestone)
            milestone *= self.reduction_factor
        return found

    def better(self, a: float, b: float) -> bool:
        return a < b if self.mode == "min" else a > b

    def record(self, milestones: dict[str, float | None], points: Iterable[tuple[int, float]]) -> list[int]:
        """Record the first value at or past each milestone not yet recorded; the new ones, ascending.

        `milestones` maps the step (a string, as JSON keeps it) to the value; None for NaN or infinity.
        """
        new: list[int] = []
        for step, value in points:
            for milestone in self.milestones_up_to(step):
                if str(milestone) not in milestones:
                    milestones[str(milestone)] = value if math.isfinite(value) else None
                    new.append(milestone)
        return sorted(new)

    def judge(self, milestone: int, value: float | None, peers: Sequence[float | None]) -> str | None:
        """Why a trial that reached `milestone` with `value` stops, or None to let it continue.

        `peers`: the values other trials recorded at the same milestone.
        """
        if self.policy == "none":
            return None
        if value is None:
            return f"{self.policy}: at step {milestone} {self.metric} is not a finite number"
        finite = [v for v in peers if v is not None]
        if self.policy == "asha":
            cutoff = self.asha_cutoff([value, *finite])
            if self.better(cutoff, value):
                return (
                    f"asha: at step {milestone} {self.metric} {value:.4g} is outside the best "
                    f"1/{self.reduction_factor} of the {len(finite) + 1} trials there (cutoff {cutoff:.4g})"
                )
            return None
        if len(finite) < MEDIAN_MIN_PEERS:
            return None
        median = statistics.median(finite)
        if self.better(median, value):
            return (
                f"median: at step {milestone} {self.metric} {value:.4g} is worse than the median "
                f"{median:.4g} of the {len(finite)} other trials there"
            )
        return None

    def asha_cutoff(self, values: Sequence[float]) -> float:
        """The value a trial must match to be in the best 1/rf (linear interpolation, as numpy's percentile)."""
        keep = 1 / self.reduction_factor
        fraction = keep if self.mode == "min" else 1 - keep
        ordered = sorted(values)
        position = fraction * (len(ordered) - 1)
        low = math.floor(position)
        high = min(low + 1, len(ordered) - 1)
        return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
