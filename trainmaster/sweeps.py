"""`client.sweep(...)` and the `SweepHandle` it returns."""

from __future__ import annotations

from typing import Any, Protocol

from trainmaster.models import JobSpec, Sweep, SweepSpec, SweepStatus, SweepTrial
from trainmaster.polling import poll_until


class SweepApi(Protocol):
    """The calls a SweepHandle makes; `trainmaster.Client` has them (typed here so that this module
    need not import the client, which imports this one)."""

    def get_sweep(self, sweep_id: str) -> SweepHandle: ...

    def cancel_sweep(self, sweep_id: str) -> Sweep: ...


def sweep_request(
    spec: JobSpec | dict[str, Any],
    *,
    name: str | None,
    parameters: dict[str, Any],
    metric: str,
    mode: str,
    max_trials: int | None,
    max_concurrent: int | None,
    early_stopping: dict[str, Any] | None,
    seed: int | None,
) -> SweepSpec:
    job_spec = spec if isinstance(spec, JobSpec) else JobSpec.model_validate(spec)
    given: dict[str, Any] = {
        "name": name or job_spec.name,
        "spec": job_spec,
        "parameters": parameters,
        "metric": metric,
        "mode": mode,
        "max_trials": max_trials,
        "max_concurrent": max_concurrent,
        "early_stopping": early_stopping,
        "seed": seed,
    }
    return SweepSpec.model_validate({k: v for k, v in given.items() if v is not None})


class SweepHandle:
    """A sweep: its last known state (trials ranked best first) plus the calls that act on it."""

    def __init__(self, client: SweepApi, sweep: Sweep):
        self._client = client
        self.info = sweep

    def __repr__(self) -> str:
        return f"SweepHandle(id={self.id!r}, name={self.info.name!r}, status={self.status.value!r})"

    @property
    def id(self) -> str:
        return self.info.id

    @property
    def status(self) -> SweepStatus:
        return self.info.status

    @property
    def trials(self) -> list[SweepTrial]:
        return self.info.trials

    @property
    def best(self) -> SweepTrial | None:
        return self.info.best

    def refresh(self) -> Sweep:
        self.info = self._client.get_sweep(self.id).info
        return self.info

    def wait(self, *, timeout: float | None = None, poll_interval: float = 2.0) -> Sweep:
        """Block until the sweep ends (every trial ended, or it was cancelled); return it."""
        return poll_until(
            self.refresh,
            lambda sweep: sweep.status is not SweepStatus.running,
            what=f"sweep {self.id}",
            timeout=timeout,
            poll_interval=poll_interval,
        )

    def cancel(self) -> Sweep:
        self.info = self._client.cancel_sweep(self.id)
        return self.info
