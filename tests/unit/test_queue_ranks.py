"""The rank cache's rules without a database: what a notice drops, what a read that raced with notices
may store, and that nothing is used while not listening or before the listener has caught up."""

from __future__ import annotations

import asyncio

from api.queues.ranks import Older, QueueRanks

P = "11111111-1111-1111-1111-111111111111"


def job(n: int) -> str:
    return f"00000000-0000-0000-0000-{n:012d}"


def cache(synced: bool = True) -> QueueRanks:
    ranks = QueueRanks(100)

    async def caught_up(_since: float) -> bool:
        return synced

    ranks.synced_since = caught_up
    ranks.listener_up()
    return ranks


def rank(n: int) -> Older:
    """n jobs ahead of it in its group, of 2 CPUs each (2,000 millis) and no GPU."""
    return (n, 2000 * n, 0)


def older(ranks: QueueRanks, n: int) -> int | None:
    """The cached count of job n's group's jobs ahead of it (checked against its gangs)."""
    found = asyncio.run(ranks.older(job(n), 0.0))
    if found is None:
        return None
    assert found[1:] == rank(found[0])[1:]
    return found[0]


def fill(ranks: QueueRanks) -> None:
    ranks.put(P, 0, [(1000 * n, job(n), rank(n)) for n in range(5)], ranks.stamp())


def test_a_move_drops_the_jobs_at_and_after_it_in_its_group_only() -> None:
    ranks = cache()
    fill(ranks)
    ranks.put(P, 1, [(0, job(9), rank(0))], ranks.stamp())
    ranks.moved(f"{P} 0 2000 {job(2)}")  # job 2 left the queue
    assert [older(ranks, n) for n in range(5)] == [0, 1, None, None, None]
    assert older(ranks, 9) == 0  # another priority: another group
    ranks.moved(f"{P} 0 999999 {job(7)}")  # a newer job arrived: nothing older changes
    assert [older(ranks, n) for n in range(2)] == [0, 1]


def test_a_read_that_raced_with_a_notice_is_stored_with_the_notice_applied() -> None:
    ranks = cache()
    stamp = ranks.stamp()
    ranks.moved(f"{P} 0 1500 {job(8)}")  # arrives while the read is in flight
    ranks.put(P, 0, [(1000 * n, job(n), rank(n)) for n in range(5)], stamp)
    assert [older(ranks, n) for n in range(5)] == [0, 1, None, None, None]


def test_a_read_spanning_more_notices_than_are_kept_stores_nothing_of_its_group() -> None:
    ranks = QueueRanks(100, recent=2)
    ranks.listener_up()
    stamp = ranks.stamp()
    for n in range(3):
        ranks.moved(f"{P} 0 {10**9 + n} {job(50 + n)}")
    ranks.put(P, 0, [(0, job(0), rank(0))], stamp)
    assert job(0) not in ranks.group_of


def test_nothing_is_kept_or_used_across_a_lost_listener_or_before_it_caught_up() -> None:
    ranks = cache()
    fill(ranks)
    stamp = ranks.stamp()
    ranks.listener_down()
    assert older(ranks, 1) is None
    ranks.listener_up()
    ranks.put(P, 0, [(0, job(0), rank(0))], stamp)  # read under the old connection
    assert older(ranks, 0) is None
    lagging = cache(synced=False)
    fill(lagging)
    assert older(lagging, 1) is None


def test_truncate_and_a_bad_notice_empty_it_and_it_stays_within_its_size() -> None:
    ranks = cache()
    fill(ranks)
    ranks.moved("*")
    assert not ranks.group_of
    fill(ranks)
    ranks.moved("garbage")
    assert not ranks.group_of
    small = QueueRanks(3)
    small.listener_up()
    fill(small)  # five counts do not fit in three
    assert len(small.group_of) <= 3
    assert QueueRanks(0).cold(P, 0) is False  # off
