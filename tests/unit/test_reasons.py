"""Every wait code renders to its sentence from its parameters alone (api/dispatcher/reasons.py)."""

from __future__ import annotations

import uuid

import pytest

from api.dispatcher.reasons import TEXT, Code, Reason, render

QUOTA = {"amount": 4.0, "resource": "GPU", "project": "vision", "used": 2.0, "quota": 4.0}
PARAMS = {
    Code.resources: {"detail": "waiting for resources: needs 4 GPU"},
    Code.starting: {"cpus": 2.0, "gpus": 1.0, "total_cpus": 16.0, "total_gpus": 8.0},
    Code.quota: QUOTA,
    Code.borrowing_limit: {**QUOTA, "limit": 1.0, "borrowed": 0.5},
    Code.cohort_lending: {**QUOTA, "borrowed": 0.0, "cohort": "research", "left": 3.0},
    Code.quota_never: {**QUOTA, "ceiling": 5.0, "parts": "its quota, in no cohort"},
    Code.behind_starving: {"job": uuid.UUID(int=7), "passed_s": 7200.0},
    Code.behind_lending: {"job": uuid.UUID(int=7), "project": "nlp", "passed_s": 3600.0},
    Code.ray_unreachable: {"cluster": "east", "error": "connection refused"},
    Code.shrinking: {"count": 1, "jobs": "0badcafe"},
    Code.preempting: {"count": 2, "jobs": "0badcafe, 1badcafe"},
    Code.preempting_asked: {"count": 1, "jobs": "0badcafe"},
    Code.reclaiming: {"count": 1, "jobs": "0badcafe", "cohort": "research"},
    Code.preempting_fair: {"count": 1, "jobs": "0badcafe", "cohort": "research", "project": "vision"},
}


def test_every_code_has_a_sentence_and_parameters_here() -> None:
    assert set(TEXT) == set(Code) == set(PARAMS)


@pytest.mark.parametrize("code", list(Code))
def test_each_code_renders_its_parameters(code: Code) -> None:
    text = render(Reason(code, PARAMS[code]))
    assert "{" not in text and text
    for value in PARAMS[code].values():
        if isinstance(value, str) and value != "its quota, in no cohort":
            assert value in text


def test_a_starving_wait_says_for_how_long_it_holds_its_project() -> None:
    held = Reason(Code.quota, QUOTA).holding(5400.0)
    assert render(held) == (
        "waiting for its project's quota: needs 4 GPU; project vision holds 2 of its quota of 4 GPU. Later jobs of "
        "its project have passed it for 90 min: nothing after it is admitted until it fits (bounded waits)"
    )
    assert render(Reason(Code.behind_starving, PARAMS[Code.behind_starving])).startswith(
        f"waiting behind job {uuid.UUID(int=7)}, which later jobs of its project have passed for 120 min"
    )
