"""Which failures the SDK waits out, and for how long (trainmaster/retry.py)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from email.utils import format_datetime

import httpx
import pytest

from trainmaster import errors
from trainmaster.retry import MAX_BACKOFF_S, MAX_RETRY_AFTER_S, delay_before_retry, is_transient


def answered(status: int, headers: dict[str, str] | None = None) -> errors.ApiError:
    response = httpx.Response(status, json={"error": "E", "detail": "d"}, headers=headers)
    return errors.error_from_response(response)


@pytest.mark.parametrize("status", [429, 502, 503, 504])
def test_busy_and_unavailable_answers_are_passing(status: int) -> None:
    assert is_transient(answered(status))


@pytest.mark.parametrize("status", [400, 401, 404, 409, 413, 422, 500])
def test_answers_no_retry_changes_are_not(status: int) -> None:
    assert not is_transient(answered(status))


def test_an_unreachable_api_is_passing() -> None:
    assert is_transient(errors.ConnectionFailed("refused"))
    assert not is_transient(errors.WaitTimeout("late"))


def test_retry_after_in_seconds_or_as_a_date_is_honoured_up_to_a_limit() -> None:
    assert delay_before_retry(answered(503, {"Retry-After": "3"}), 1) == 3.0
    in_a_minute = format_datetime(datetime.now(timezone.utc) + timedelta(seconds=60), usegmt=True)
    assert 55 <= delay_before_retry(answered(429, {"Retry-After": in_a_minute}), 1) <= 60
    assert delay_before_retry(answered(503, {"Retry-After": "86400"}), 1) == MAX_RETRY_AFTER_S
    assert delay_before_retry(answered(503, {"Retry-After": "-5"}), 1) == 0.0


def test_without_retry_after_the_backoff_grows_to_a_ceiling() -> None:
    unreadable = answered(503, {"Retry-After": "soon"})
    first, later = delay_before_retry(unreadable, 1), delay_before_retry(errors.ConnectionFailed("x"), 20)
    assert 0.1 <= first <= 0.2 and MAX_BACKOFF_S / 2 <= later <= MAX_BACKOFF_S
