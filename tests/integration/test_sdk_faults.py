"""The SDK's waits and streams through a real HTTP proxy that refuses, answers 503 and 429, and breaks
streams off, in front of the real app on a real PostgreSQL."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import psycopg
import pytest
from fastapi.testclient import TestClient

import trainmaster as tm
from api.settings import libpq_url as libpq
from tests.factories.database import finish
from tests.factories.http import falling_losses, post_losses
from tests.integration.faulty_proxy import Cut, Fault, FaultyProxy


@pytest.fixture
def proxy(http: TestClient) -> Iterator[FaultyProxy]:
    faulty = FaultyProxy(http._transport)
    yield faulty
    faulty.stop()


def test_wait_rides_out_refused_connections_503_and_429_honouring_retry_after(
    sdk: tm.Client, proxy: FaultyProxy, token: str, database_url: str
) -> None:
    job = sdk.submit(name="through-outage", entrypoint="builtin:mlp")
    finish(database_url, job.id, "succeeded")
    proxy.plan.extend([Fault(503, retry_after="1"), Fault(429, "TooManyStreams", retry_after="1")])
    opens = threading.Timer(0.8, proxy.start)  # refused until then
    began = time.monotonic()
    opens.start()
    with tm.Client(proxy.url, token, timeout=5) as client:
        assert client.wait(job.id, timeout=30, poll_interval=0.05).status is tm.JobStatus.succeeded
    opens.join()
    assert proxy.statuses() == [503, 429, 200]
    (first, *_), (second, *_), (third, *_) = proxy.answered
    assert first - began >= 0.7  # the refusals were waited through
    assert second - first >= 0.9 and third - second >= 0.9  # each Retry-After: 1 was honoured


def test_wait_raises_at_once_on_what_no_retry_can_fix(sdk: tm.Client, proxy: FaultyProxy, token: str) -> None:
    job = sdk.submit(name="refused", entrypoint="builtin:mlp")
    proxy.plan.extend([Fault(401, "Unauthorized"), Fault(404, "JobNotFound"), Fault(422, "ValidationError")])
    proxy.start()
    with tm.Client(proxy.url, token, timeout=5) as client:
        for expected in (tm.Unauthorized, tm.JobNotFound, tm.ValidationFailed):
            began = time.monotonic()
            with pytest.raises(expected):
                client.wait(job.id, timeout=30, poll_interval=0.05)
            assert time.monotonic() - began < 0.5
    assert proxy.statuses() == [401, 404, 422]


def test_wait_and_stream_give_up_at_the_callers_limit_when_the_api_never_answers(
    sdk: tm.Client, proxy: FaultyProxy, token: str
) -> None:
    job = sdk.submit(name="nobody-home", entrypoint="builtin:mlp")
    nobody = proxy  # never started: its port refuses every connection
    with tm.Client(nobody.url, token, timeout=2) as client:
        with pytest.raises(tm.WaitTimeout, match="no answer from the API"):
            client.wait(job.id, timeout=0.5, poll_interval=0.05)
        with pytest.raises(tm.ConnectionFailed):
            list(client.stream_metrics(job.id, retry_for=0.5))


def stored_seqs(database_url: str, job_id: str) -> list[int]:
    with psycopg.connect(libpq(database_url)) as conn:
        rows = conn.execute("SELECT seq FROM metric_points WHERE job_id = %s ORDER BY seq", (job_id,)).fetchall()
    return [int(seq) for (seq,) in rows]


def test_metric_stream_resumes_through_a_cut_a_503_and_a_429_with_no_row_twice_or_lost(
    sdk: tm.Client, http: TestClient, proxy: FaultyProxy, token: str, database_url: str
) -> None:
    job = sdk.submit(name="streamed", entrypoint="builtin:mlp")
    for start in (0, 1000, 2000):
        post_losses(http, token, job.id, falling_losses(start, 1000), first_step=start)
    finish(database_url, job.id, "succeeded")
    # The stream sends 2,000 rows an event: the cut comes inside the second event, after the first.
    proxy.plan.extend([Cut(events=1), Fault(503, retry_after="1"), Fault(429, "TooManyStreams", retry_after="0")])
    proxy.start()
    with tm.Client(proxy.url, token, timeout=5) as client:
        seqs = [value.seq for value in client.stream_metrics(job.id)]
    assert seqs == stored_seqs(database_url, job.id)  # each row once, in order, none lost
    assert len(seqs) == 3000
    assert proxy.statuses() == [200, 503, 429, 200]
    assert proxy.last_event_ids == [None] + [str(seqs[1999])] * 3  # after the last whole event delivered
    assert proxy.answered[2][0] - proxy.answered[1][0] >= 0.9  # Retry-After: 1 after the 503


def test_log_stream_raises_at_once_on_401(sdk: tm.Client, proxy: FaultyProxy, token: str) -> None:
    job = sdk.submit(name="no-entry", entrypoint="builtin:mlp")
    proxy.plan.append(Fault(401, "Unauthorized"))
    proxy.start()
    with tm.Client(proxy.url, token, timeout=5) as client, pytest.raises(tm.Unauthorized):
        list(client.logs(job.id, follow=True))
