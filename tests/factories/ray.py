"""An in-memory stand-in for Ray's Jobs API, for dispatcher tests that need exact control."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime

from api.dispatcher.backend import GangState, Launch, RayJobInfo, RayJobState, RayUnavailable
from api.dispatcher.placement import ClusterCapacity, Node


@dataclass
class FakeRay:
    address: str = "http://fake-ray:8265"  # RayJobsBackend's, for what logs name
    cpus: float = 4.0
    gpus: float = 0.0
    used_cpus: float = 0.0
    jobs: dict[str, RayJobState] = field(default_factory=dict)
    launches: dict[str, Launch] = field(default_factory=dict)
    submit_calls: Counter[str] = field(default_factory=Counter)
    stopped: list[str] = field(default_factory=list)
    outputs: dict[str, str] = field(default_factory=dict)
    down: bool = False
    refuse_submit: bool = False
    log_reads: list[tuple[str, int]] = field(default_factory=list)
    submit_errors: dict[str, Exception] = field(default_factory=dict)  # submission id -> what submit raises
    end_times: dict[str, datetime] = field(default_factory=dict)  # when Ray saw a submission end
    placed: set[str] = field(default_factory=set)  # submission ids whose placement group is CREATED
    pending: dict[str, str] = field(default_factory=dict)  # submission id -> Ray's reason its group waits
    bundles: dict[str, int] = field(default_factory=dict)  # submission id -> its CREATED group's bundles (workers)
    final_logs_down: bool = False  # reading a finished job's whole log fails
    exit_codes: dict[str, int] = field(default_factory=dict)  # submission id -> its entrypoint's exit code

    def _check(self) -> None:
        if self.down:
            raise RayUnavailable("connection refused")

    def cluster(self) -> ClusterCapacity:
        self._check()
        total = {"CPU": self.cpus, "GPU": self.gpus}
        return ClusterCapacity([Node("head", total, {"CPU": self.cpus - self.used_cpus, "GPU": self.gpus})])

    def submit(self, launch: Launch) -> bool:
        self._check()
        if self.refuse_submit:
            raise RayUnavailable("No available agent to submit job, please try again later.")
        self.submit_calls[launch.submission_id] += 1
        if launch.submission_id in self.submit_errors:
            raise self.submit_errors[launch.submission_id]
        if launch.submission_id in self.jobs:
            return False
        self.jobs[launch.submission_id] = RayJobState.PENDING
        self.launches[launch.submission_id] = launch
        return True

    def info(self, submission_id: str) -> RayJobInfo | None:
        self._check()
        state = self.jobs.get(submission_id)
        if state is None:
            return None
        return RayJobInfo(
            state,
            f"job is {state.value}",
            end_time=self.end_times.get(submission_id),
            driver_job_id=submission_id,
            exit_code=self.exit_codes.get(submission_id),
        )

    def gang_state(self, driver_job_id: str) -> GangState:
        self._check()
        placed = driver_job_id in self.placed or driver_job_id in self.bundles
        return GangState(
            placed=placed, pending=self.pending.get(driver_job_id), workers=self.bundles.get(driver_job_id)
        )

    def stop(self, submission_id: str) -> None:
        self._check()
        self.stopped.append(submission_id)
        if submission_id in self.jobs and not self.jobs[submission_id].terminal:
            self.jobs[submission_id] = RayJobState.STOPPED

    def logs(self, submission_id: str, offset: int = 0, final: bool = False) -> str:
        self.log_reads.append((submission_id, offset))
        if final and self.final_logs_down:
            raise RayUnavailable(f"the final logs of {submission_id}: connection refused")
        return self.outputs.get(submission_id, "")[offset:]

    def close(self) -> None:
        """Nothing to close (RayJobsBackend.close's counterpart)."""

    def restart(self) -> None:
        """A new head: every submission forgotten."""
        self.jobs.clear()
