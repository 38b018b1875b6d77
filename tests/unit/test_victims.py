"""Which running jobs of a cohort give way (api/dispatcher/victims.py), as pure rules: quota reclaim and
fair-share preemption. Through real dispatcher rounds on PostgreSQL: tests/integration/test_quotas.py;
over a simulated organisation's day: bench/simulate.py."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from api.dispatcher import victims
from api.dispatcher.quotas import Book, Standing

A, B, C, D = (uuid.UUID(int=n) for n in range(1, 5))
CAPACITY = {"CPU": 64.0, "GPU": 16.0}


@dataclass(frozen=True)
class Job:
    project_id: uuid.UUID
    gang_gpus: float
    priority: int = 0
    gang_cpus: float = 0.0
    id: uuid.UUID = field(default_factory=uuid.uuid4)


def standing(name: str, gpus: float, quota: float = 4, history: float = 0.0, cohort: str = "c") -> Standing:
    return Standing(name, {"GPU": quota}, cohort, usage={"GPU": gpus}, history={"GPU": history})


def test_fair_share_takes_from_the_highest_share_first_and_only_what_covers_the_gang() -> None:
    book = Book(
        {
            A: standing("a", 4),  # at its quota: a gang of 2 more would borrow
            B: standing("b", 6, history=0.30),  # borrows 2, and used the most before
            C: standing("c", 6, history=0.28),  # borrows 2
        }
    )
    b_jobs, c_jobs = [Job(B, 2), Job(B, 2)], [Job(C, 2)]
    chosen = victims.fair_share(Job(A, 2), book, CAPACITY, {"GPU": 0.0}, [c_jobs[0], *b_jobs])
    assert chosen == [b_jobs[0]]  # b's share is the highest: its cheapest job that borrows goes, one is enough
    # Two gangs' worth: once b gave one, c's share is the higher; each stays above a's with the gang.
    chosen = victims.fair_share(Job(A, 4), book, CAPACITY, {"GPU": 0.0}, [c_jobs[0], *b_jobs])
    assert chosen == [b_jobs[0], c_jobs[0]]


def test_fair_share_never_leaves_a_victim_below_the_waiting_project_so_no_two_take_turns() -> None:
    # b holds 6 (2 borrowed) and a 4: a with a gang of 2 would hold 6, b without one 4. Equal history:
    # b would end below a, which would then preempt back.
    book = Book({A: standing("a", 4), B: standing("b", 6)})
    assert victims.fair_share(Job(A, 2), book, CAPACITY, {"GPU": 0.0}, [Job(B, 2)]) == []
    # With less behind it, a's final share is at most b's without the job: b gives way.
    book.projects[B].history = {"GPU": 0.2}
    victim = Job(B, 2)
    assert victims.fair_share(Job(A, 2), book, CAPACITY, {"GPU": 0.0}, [victim]) == [victim]


def test_fair_share_takes_only_borrowed_quota_of_its_cohort_at_no_higher_priority() -> None:
    book = Book(
        {
            A: standing("a", 4),
            B: standing("b", 4, history=0.5),  # high share, but within its own quota
            C: standing("c", 8, history=0.5, cohort="other"),  # borrows, in another cohort
            D: standing("d", 8, history=0.5),  # borrows
        }
    )
    mine = Job(A, 2, priority=1)
    candidates = [Job(B, 2), Job(C, 2), Job(D, 2, priority=5), Job(A, 2)]
    assert victims.fair_share(mine, book, CAPACITY, {"GPU": 0.0}, candidates) == []
    lower = Job(D, 2, priority=1)
    assert victims.fair_share(mine, book, CAPACITY, {"GPU": 0.0}, [*candidates, lower]) == [lower]
    # Not enough to cover the gang, even with the free room: nothing is asked.
    assert victims.fair_share(Job(A, 4), book, CAPACITY, {"GPU": 1.0}, [lower]) == []
    # A project in no cohort shares with no one.
    book.projects[A].cohort = None
    assert victims.fair_share(mine, book, CAPACITY, {"GPU": 0.0}, [lower]) == []


def test_reclaim_takes_the_cheapest_borrowers_until_they_no_longer_borrow() -> None:
    book = Book({A: standing("a", 0), B: standing("b", 6), C: standing("c", 5)})
    cheap, dear, c_job = Job(B, 2), Job(B, 2), Job(C, 1)
    # b borrows 2: its cheapest job is enough for a gang of 2; its second would leave it within quota.
    assert victims.reclaim(Job(A, 2), book, {"GPU": 0.0}, [cheap, dear, c_job]) == [cheap]
    assert victims.reclaim(Job(A, 3), book, {"GPU": 0.0}, [cheap, dear, c_job]) == [cheap, c_job]
    assert victims.reclaim(Job(A, 4), book, {"GPU": 0.0}, [cheap, dear, c_job]) == []  # only 3 are borrowed
    assert victims.reclaim(Job(A, 4), book, {"GPU": 1.0}, [cheap, dear, c_job]) == [cheap, c_job]
