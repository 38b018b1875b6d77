from __future__ import annotations

from api.jobs.status import ALLOWED, can_transition, sources
from trainmaster.models import JobStatus as S


def test_terminal_statuses_have_no_way_out() -> None:
    for status in S:
        assert (not ALLOWED[status]) == status.terminal


def test_every_status_is_reachable_from_queued() -> None:
    reached, frontier = {S.queued}, [S.queued]
    while frontier:
        for target in ALLOWED[frontier.pop()]:
            if target not in reached:
                reached.add(target)
                frontier.append(target)
    assert reached == set(S)


def test_selected_rules() -> None:
    assert can_transition(S.queued, S.cancelled)
    assert not can_transition(S.queued, S.running)  # must pass through starting
    assert not can_transition(S.cancelling, S.running)
    assert can_transition(S.running, S.queued)  # a retry re-queues
    assert not can_transition(S.succeeded, S.cancelled)


def test_the_bulk_writes_sources_are_the_table_read_backwards() -> None:
    """What a bulk status write (api/dispatcher/round_writes.py, ROUND_WRITES) may move comes from
    ALLOWED, so it refuses exactly what `transition` refuses."""
    for target in S:
        assert set(sources(target)) == {current.value for current in S if can_transition(current, target)}
    assert sources(S.starting) == [S.queued.value]
