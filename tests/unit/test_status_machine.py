from __future__ import annotations

from api.jobs.status import ALLOWED, can_transition
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
