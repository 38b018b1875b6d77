"""`client.sweep(...)` and the `SweepHandle` it returns (`AsyncSweepHandle` from `AsyncClient`)."""

from __future__ import annotations

from typing import Any, Protocol

from trainmaster.models import JobSpec, Sweep, SweepSpec, SweepStatus, SweepTrial
from trainmaster.polling import poll_until, poll_until_async


class SweepApi(Protocol):
    """The calls a SweepHandle makes; `trainmaster.Client` has them (typed here so that this module
    need not import the client, which imports this one)."""

    def get_sweep(self, sweep_id: str) -> SweepHandle: ...

    def cancel_sweep(self, sweep_id: str) -> Sweep: ...


class AsyncSweepApi(Protocol):
    """The calls an AsyncSweepHandle awaits; `trainmaster.AsyncClient` has them."""

    async def get_sweep(self, sweep_id: str) -> AsyncSweepHandle: ...

    async def cancel_sweep(self, sweep_id: str) -> Sweep: ...


def sweep_request(arguments: dict[str, Any]) -> SweepSpec:
    """The SweepSpec that a `sweep(spec, ...)` call asks for, from its arguments (its `locals()`): the
    SweepSpec fields given (not None), `spec` as a JobSpec, and its name unless one was given."""
    given = {name: value for name, value in arguments.items() if name in SweepSpec.model_fields and value is not None}
    spec = given["spec"]
    job_spec = spec if isinstance(spec, JobSpec) else JobSpec.model_validate(spec)
    return SweepSpec.model_validate({**given, "spec": job_spec, "name": given.get("name") or job_spec.name})


class SweepView:
    """A sweep's last known state (trials ranked best first), as both handles show it."""

    def __init__(self, sweep: Sweep):
        self.info = sweep

    def __repr__(self) -> str:
        return f"{type(self).__name__}(id={self.id!r}, name={self.info.name!r}, status={self.status.value!r})"

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

    @staticmethod
    def ended(sweep: Sweep) -> bool:
        """Every trial ended, or the sweep was cancelled."""
        return sweep.status is not SweepStatus.running


class SweepHandle(SweepView):
    """A sweep: its last known state plus the calls that act on it."""

    def __init__(self, client: SweepApi, sweep: Sweep):
        super().__init__(sweep)
        self._client = client

    def refresh(self) -> Sweep:
        self.info = self._client.get_sweep(self.id).info
        return self.info

    def wait(self, *, timeout: float | None = None, poll_interval: float = 2.0) -> Sweep:
        """Block until the sweep ends (every trial ended, or it was cancelled); return it."""
        return poll_until(
            self.refresh, self.ended, what=f"sweep {self.id}", timeout=timeout, poll_interval=poll_interval
        )

    def cancel(self) -> Sweep:
        self.info = self._client.cancel_sweep(self.id)
        return self.info


class AsyncSweepHandle(SweepView):
    """`SweepHandle` for `AsyncClient`: the same state; `refresh`, `wait` and `cancel` are awaited."""

    def __init__(self, client: AsyncSweepApi, sweep: Sweep):
        super().__init__(sweep)
        self._client = client

    async def refresh(self) -> Sweep:
        self.info = (await self._client.get_sweep(self.id)).info
        return self.info

    async def wait(self, *, timeout: float | None = None, poll_interval: float = 2.0) -> Sweep:
        """Until the sweep ends (every trial ended, or it was cancelled); return it."""
        return await poll_until_async(
            self.refresh, self.ended, what=f"sweep {self.id}", timeout=timeout, poll_interval=poll_interval
        )

    async def cancel(self) -> Sweep:
        self.info = await self._client.cancel_sweep(self.id)
        return self.info
