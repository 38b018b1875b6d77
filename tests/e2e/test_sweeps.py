"""A sweep through the real CLI, API, dispatcher and Ray: trial 0 trains to the end, trial 1 is worse at
the first rung and is stopped there through the normal cancel path; the dispatcher restarts between the
two and no trial is lost or launched twice."""

from __future__ import annotations

import json
import subprocess

import httpx
import pytest

from tests.e2e.conftest import TRAINMASTER, Stack
from tests.factories.http import bearer
from tests.factories.waiting import wait_until
from workers.templates.toy_curve import toy_loss

pytestmark = pytest.mark.ray

STEPS, STEP_S, GRACE = 30, 0.4, 3


def cli(stack: Stack, *args: str) -> str:
    result = subprocess.run([TRAINMASTER, *args], env=stack.api.env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_asha_sweep_stops_the_worse_trial_at_its_rung_across_a_dispatcher_restart(stack: Stack) -> None:
    started = cli(
        stack,
        *("sweep", "start", "builtin:toy-curve", "--name", "e2e-sweep", "--metric", "loss"),
        *("--param", "lr=0.003,0.0001", "--param", "hidden=128"),
        *("--config", json.dumps({"steps": STEPS, "step_s": STEP_S}), "--max-concurrent", "1"),
        *("--early-stopping", "asha", "--grace-steps", str(GRACE), "--reduction-factor", "2"),
    )
    sweep_id = started.split()[1]
    headers = bearer(stack.api.token)

    def sweep() -> dict[str, object]:
        response = httpx.get(f"{stack.api.url}/v1/sweeps/{sweep_id}", headers=headers, timeout=10)
        response.raise_for_status()
        return dict(response.json())

    def trial(n: int) -> dict[str, object]:
        return next(t for t in sweep()["trials"] if t["n"] == n)  # type: ignore[attr-defined]

    wait_until(lambda: trial(0)["status"] == "running", 300, interval=0.5, what="trial 0 to run")
    stack.dispatchers.stop_all()  # mid-sweep: the controller and the dispatcher go away together
    stack.dispatchers.start("d1")

    done = wait_until(lambda: (s := sweep())["status"] != "running" and s, 300, interval=1, what="the sweep to end")
    assert done["status"] == "completed", done
    by_n = {t["n"]: t for t in done["trials"]}  # type: ignore[attr-defined]
    assert sorted(by_n) == [0, 1]
    assert by_n[0]["status"] == "succeeded" and by_n[0]["step"] == STEPS
    assert by_n[0]["metric"] == pytest.approx(toy_loss(0.003, 128, 0.1, STEPS))
    assert done["best"]["n"] == 0 and done["best"]["params"] == {"lr": 0.003, "hidden": 128}  # type: ignore[index]
    assert by_n[1]["status"] == "stopped", by_n[1]
    assert by_n[1]["stopped_reason"].startswith(f"asha: at step {GRACE} loss ")
    assert by_n[1]["step"] < STEPS  # stopped before it trained to the end

    jobs = httpx.get(
        f"{stack.api.url}/v1/jobs", params={"label": f"sweep:{sweep_id}"}, headers=headers, timeout=10
    ).json()["items"]
    assert sorted(job["spec"]["labels"]["trial"] for job in jobs) == ["0", "1"]  # none launched twice
    stopped_job = next(job for job in jobs if job["id"] == by_n[1]["job_id"])
    assert stopped_job["status"] == "cancelled" and len(stopped_job["attempts"]) == 1

    shown = cli(stack, "sweep", "get", sweep_id)
    assert "stopped" in shown and f"trial 1: asha: at step {GRACE}" in shown
