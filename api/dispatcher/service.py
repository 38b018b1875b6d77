"""The dispatcher: admit queued gangs (admission.py), launch attempts (launch.py), follow them to
the end (reconcile.py). Each step takes the `RoundContext` (context.py), never this class.

Safety rules, each relied on by the tests:
- An attempt row with its Ray submission id is committed before Ray hears of it. Ray refuses a
  second submission with the same id, so a retried or repeated submit never launches twice.
- Every write after a claim goes through the fencing check (`leased`, `leased_many`: leases.py;
  repository.MARK_SUBMITTED makes the same check in SQL): a dispatcher that lost its lease (it
  stalled and another took over) changes nothing.
- A status changes only as api/jobs/status.py allows, the admission round's bulk write included.
- An attempt Ray no longer knows (the cluster restarted) is lost, never resubmitted: a retry is a
  new attempt with a new id, and it resumes from the run's latest checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass

from api.dispatcher import admission, reconcile
from api.dispatcher.context import RoundContext


@dataclass
class Dispatcher(RoundContext):
    """A dispatcher process's rounds; the steps see it only as the `RoundContext` they share."""

    async def admit_round(self) -> int:
        """Admit what fits now; give everything else a reason. Returns how many were launched."""
        return await admission.admit_round(self)

    async def reconcile_round(self) -> None:
        """Follow every active job whose lease is ours (or free): Ray's truth wins, in one place."""
        await reconcile.reconcile_round(self)
