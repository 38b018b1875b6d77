"""Calls on sweeps."""

from __future__ import annotations

from typing import Any

from trainmaster.calls.base import (
    Call,
)
from trainmaster.models import (
    JobSpec,
    Sweep,
    SweepList,
    SweepStatus,
)
from trainmaster.sweeps import sweep_request

# -- sweeps ---------------------------------------------------------------------------------------


def new_sweep(
    spec: JobSpec | dict[str, Any],
    *,
    parameters: dict[str, Any],
    metric: str,
    mode: str = "min",
    name: str | None = None,
    max_trials: int | None = None,
    max_concurrent: int | None = None,
    early_stopping: dict[str, Any] | None = None,
    seed: int | None = None,
) -> Call[Sweep]:
    """Start a hyperparameter sweep: trials are jobs running `spec` with `config` updated by their
    parameters (`{"values": [...]}`, `{"uniform": [lo, hi]}`, `{"log_uniform": [lo, hi]}`; values
    alone make a grid). `early_stopping={"policy": "asha"|"median", "grace_steps", "reduction_factor"}`
    stops losing trials from their logged `metric`."""
    request = sweep_request(locals())
    return Call("POST", "/v1/sweeps", Sweep.model_validate, json=request.model_dump(mode="json", exclude_none=True))


def get_sweep(sweep_id: str) -> Call[Sweep]:
    return Call("GET", f"/v1/sweeps/{sweep_id}", Sweep.model_validate)


def cancel_sweep(sweep_id: str) -> Call[Sweep]:
    return Call("POST", f"/v1/sweeps/{sweep_id}/cancel", Sweep.model_validate)


def list_sweeps(*, status: SweepStatus | str | None = None, limit: int | None = None) -> Call[list[Sweep]]:
    """Sweeps newest first, with trial counts and the best trial (the full trial list: get_sweep)."""
    params: dict[str, Any] = {}
    if status is not None:
        params["status"] = [status.value if isinstance(status, SweepStatus) else status]
    if limit is not None:
        params["limit"] = limit
    return Call("GET", "/v1/sweeps", lambda data: SweepList.model_validate(data).items, params=params)
