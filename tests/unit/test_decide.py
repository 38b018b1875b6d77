"""Admission's rules (api/dispatcher/decide.py) as a pure function: snapshots in, decisions out, no
database. The same function runs through real dispatcher rounds in tests/integration/test_dispatcher.py,
test_quotas.py, test_preemption.py and the others that admit jobs."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from api.dispatcher.decide import Verdict, decayed, decide
from api.dispatcher.placement import ClusterCapacity, Node
from api.dispatcher.quotas import Book, Standing
from api.dispatcher.reasons import Code
from api.queues.order import admission_key, dominant_share
from tests.factories.queue import NOW, QueuedGang, queued_gang

A, B, C = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()


Job = QueuedGang
gang = queued_gang


def cluster(*gpus: int, racks: list[str] | None = None) -> ClusterCapacity:
    nodes = []
    for i, n in enumerate(gpus):
        labels = {"rack": racks[i]} if racks else {}
        nodes.append(
            Node(f"node{i:04d}", {"CPU": 16.0, "GPU": float(n)}, {"CPU": 16.0, "GPU": float(n)}, labels=labels)
        )
    return ClusterCapacity(nodes)


def full(gpus: int) -> ClusterCapacity:
    """A node of `gpus` GPUs, every one of them taken: a gang that fits it waits for resources."""
    busy = cluster(gpus)
    busy.nodes[0].free["GPU"] = 0.0
    return busy


def verdicts(decisions: Any) -> list[tuple[uuid.UUID, Verdict]]:
    return [(o.job.id, o.verdict) for o in decisions.outcomes]


def test_admits_in_admission_order_until_the_cluster_is_full() -> None:
    low, high, older = gang(A, 4, priority=0), gang(A, 4, priority=5), gang(B, 4, created_at=NOW - timedelta(1))
    decisions = decide([low, high, older], cluster(8), Book(), {}, now=NOW)
    assert verdicts(decisions) == [(high.id, Verdict.admit), (older.id, Verdict.admit), (low.id, Verdict.wait)]
    [waiting] = decisions.of(Verdict.wait)
    assert (
        waiting.reason.startswith("waiting for resources: needs 4 CPU, 4 GPU") and "not enough free" in waiting.reason
    )
    assert sum(len(bundles) for o in decisions.of(Verdict.admit) for bundles in o.placement.values()) == 8


def test_fair_share_orders_projects_of_equal_priority() -> None:
    heavy, light = gang(A, 8, share=0.7), gang(B, 8, share=0.1, created_at=NOW + timedelta(hours=1))
    assert sorted([heavy, light], key=admission_key) == [light, heavy]
    decisions = decide([heavy, light], cluster(8), Book(), {}, now=NOW)
    assert verdicts(decisions) == [(light.id, Verdict.admit), (heavy.id, Verdict.wait)]


def test_the_budget_counts_what_active_jobs_hold() -> None:
    job = gang(A, 4)
    [outcome] = decide([job], cluster(8), Book(), {"CPU": 0.0, "GPU": 6.0}, now=NOW).outcomes
    assert outcome.verdict is Verdict.wait
    assert outcome.why is not None and outcome.why.code is Code.starting and outcome.why.params["gpus"] == 6.0
    assert outcome.reason == (
        "waiting for resources: trainmaster jobs that are starting hold 0 CPU and 6 GPU of the cluster's 16 CPU / 8 GPU"
    )


def test_a_quota_refuses_before_resources_and_never_preempts() -> None:
    book = Book({A: Standing("a", {"GPU": 4}, usage={"GPU": 2})})
    job = gang(A, 4)
    [outcome] = decide([job], full(8), book, {}, now=NOW, preemption=True).outcomes  # no GPU free either
    assert outcome.verdict is Verdict.wait and not outcome.preempt and not outcome.reclaim
    assert outcome.why is not None and outcome.why.code is Code.quota
    assert outcome.reason == "waiting for its project's quota: needs 4 GPU; project a holds 2 of its quota of 4 GPU."


def test_a_job_that_waits_for_resources_may_preempt_or_reclaim() -> None:
    book = Book(
        {
            A: Standing("a", {"CPU": 16, "GPU": 8}, cohort="c", usage={"CPU": 0, "GPU": 0}),
            B: Standing("b", {"CPU": 16, "GPU": 8}, cohort="c", usage={"CPU": 12, "GPU": 12}),  # borrows 4 GPU of a's
        }
    )
    [outcome] = decide([gang(A, 4)], full(8), book, {}, now=NOW, preemption=False).outcomes
    assert outcome.verdict is Verdict.wait and outcome.reclaim and not outcome.preempt
    book.reclaim_failed(A, {"CPU": 4.0, "GPU": 4.0})
    [again] = decide([gang(A, 4)], full(8), book, {}, now=NOW, preemption=True).outcomes
    assert again.preempt and not again.reclaim  # a gang as large already found too little this round


def test_a_gang_that_would_borrow_may_ask_for_fair_share_when_others_borrow_what_it_would() -> None:
    book = Book(
        {
            A: Standing("a", {"GPU": 4}, cohort="c", usage={"GPU": 4}),
            B: Standing("b", {"GPU": 4}, cohort="c", usage={"GPU": 8}),  # borrows all that c lends
            C: Standing("c", {"GPU": 4}, cohort="c", usage={"GPU": 0}),
        }
    )
    [held] = decide([gang(A, 2)], full(16), book, {}, now=NOW, fair_share=True).outcomes
    assert held.verdict is Verdict.wait and held.fair and not held.reclaim
    assert "which has 0 GPU left to lend" in held.reason
    [off] = decide([gang(A, 2)], full(16), book, {}, now=NOW).outcomes
    assert not off.fair  # the setting is off
    limited = Book(
        {**book.projects, A: Standing("a", {"GPU": 4}, cohort="c", borrowing_limit={"GPU": 1}, usage={"GPU": 4})}
    )
    [own] = decide([gang(A, 2)], full(16), limited, {}, now=NOW, fair_share=True).outcomes
    assert not own.fair  # its own borrowing limit holds it: nobody else can give that back
    # Lent room but no resources (the cluster is full): it may ask too.
    book.projects[B].usage["GPU"] = 4
    [room] = decide([gang(A, 2)], full(16), book, {}, now=NOW, fair_share=True).outcomes
    assert room.fair and room.reason.startswith("waiting for resources")


def test_borrowers_come_after_every_job_within_its_quota() -> None:
    book = Book(
        {
            A: Standing("a", {"GPU": 4}, cohort="c", usage={"GPU": 4}),
            B: Standing("b", {"GPU": 4}, cohort="c", usage={"GPU": 0}),
        }
    )
    borrower = gang(A, 4, priority=9)  # first in admission order, but it would borrow b's quota
    owed = gang(B, 4)
    decisions = decide([borrower, owed], cluster(4), book, {}, now=NOW)
    assert verdicts(decisions) == [(owed.id, Verdict.admit), (borrower.id, Verdict.wait)]
    assert "borrows 0 from cohort c, which has 0 GPU left to lend" in decisions.outcomes[1].reason
    assert book.projects[B].used("GPU") == 4  # the book counts the admitted gang for later jobs


def test_a_gang_passed_by_later_jobs_of_its_project_is_marked_then_holds_admission_until_it_fits() -> None:
    def room(free: int) -> ClusterCapacity:
        nodes = cluster(4)
        nodes.nodes[0].free["GPU"] = float(free)
        return nodes

    big = gang(A, 4, created_at=NOW - timedelta(hours=3))
    small, other = gang(A, 1, created_at=NOW - timedelta(hours=2)), gang(B, 1)
    decisions = decide([big, small, other], room(2), Book(), {}, now=NOW, starvation_s=3600)
    assert verdicts(decisions) == [(big.id, Verdict.wait), (small.id, Verdict.admit), (other.id, Verdict.admit)]
    assert [o.bypassed for o in decisions.outcomes] == [True, False, False]  # small passed big
    alone = decide([big, other], room(2), Book(), {}, now=NOW, starvation_s=3600)
    assert not alone.outcomes[0].bypassed  # another project's job passes no one of a's

    # Passed for two hours, past starvation_s: it holds admission; nothing after it is admitted, nor
    # preempts anything (it would fit), and each says behind which job it waits.
    starving = gang(A, 4, created_at=big.created_at, bypassed_since=NOW - timedelta(hours=2), id=big.id)
    decisions = decide([starving, small, other], room(2), Book(), {}, now=NOW, preemption=True, starvation_s=3600)
    assert [o.verdict for o in decisions.outcomes] == [Verdict.wait] * 3
    assert decisions.held  # the round reads no further batch (read_on)
    first, *held = decisions.outcomes
    assert first.why is not None and first.why.code is Code.resources and first.why.holds_s == 7200
    assert "Later jobs of its project have passed it for 120 min: nothing after it is admitted" in first.reason
    assert first.preempt and not first.own  # the cluster's room holds it, not its project
    for outcome in held:
        assert outcome.why is not None and outcome.why.code is Code.behind_starving
        assert outcome.reason.startswith(f"waiting behind job {big.id}, which later jobs of its project have passed")
        assert not outcome.preempt and not outcome.bypassed
    # Not yet starvation_s, or the setting off: it is passed as before.
    for limit in (3 * 3600, 0):
        again = decide([starving, small, other], room(2), Book(), {}, now=NOW, starvation_s=limit)
        assert verdicts(again)[1:] == [(small.id, Verdict.admit), (other.id, Verdict.admit)]
        assert not again.held
    # Once the room is there, it is admitted first, and then what fits after it.
    roomy = cluster(8)
    roomy.nodes[0].free["GPU"] = 5.0
    assert verdicts(decide([starving, small], roomy, Book(), {}, now=NOW, starvation_s=3600)) == [
        (big.id, Verdict.admit),
        (small.id, Verdict.admit),
    ]
    # Held by its quota instead, it holds back only its own project's later jobs (they would take it).
    book = Book({A: Standing("a", {"GPU": 4}, usage={"GPU": 2})})
    decisions = decide([starving, small, other], room(2), book, {}, now=NOW, starvation_s=3600)
    outcomes = {o.job.id: o for o in decisions.outcomes}  # a would borrow: big comes last (borrowers_last)
    assert {job_id: o.verdict for job_id, o in outcomes.items()} == {
        big.id: Verdict.wait,
        small.id: Verdict.wait,
        other.id: Verdict.admit,
    }
    assert outcomes[big.id].reason.startswith("waiting for its project's quota")
    assert outcomes[small.id].reason.startswith(f"waiting behind job {big.id}")
    assert outcomes[big.id].own and outcomes[small.id].own  # held by their project: the round may read on


def test_a_gang_held_behind_another_projects_starving_gang_is_still_marked_when_its_own_later_jobs_pass() -> None:
    # a's 4-GPU gang borrows, so it comes after every job that does not (borrowers_last): a's later
    # 1-GPU job is admitted, c's starving gang then holds the round, and a's gang waits behind it. It
    # was passed by a later job of its own project all the same: marked, or it never starves and later
    # jobs of a may pass it for as long as some other project's gang holds the rounds.
    book = Book({A: Standing("a", {"GPU": 2}, "c"), B: Standing("b", {"GPU": 8}, "c")})
    nodes = cluster(8)
    nodes.nodes[0].free["GPU"] = 2.0
    first = gang(A, 4, created_at=NOW - timedelta(hours=3))
    later = gang(A, 1, created_at=NOW - timedelta(hours=2))
    starving = gang(C, 4, share=0.5, bypassed_since=NOW - timedelta(hours=2))
    decisions = decide([first, later, starving], nodes, book, {}, now=NOW, starvation_s=3600)
    outcomes = {o.job.id: o for o in decisions.outcomes}
    assert outcomes[later.id].verdict is Verdict.admit
    assert outcomes[starving.id].verdict is Verdict.wait
    assert outcomes[first.id].reason.startswith(f"waiting behind job {starving.id}")
    assert outcomes[first.id].bypassed


def test_a_starving_gang_that_waits_for_its_cohorts_lending_keeps_it_from_other_members_later_borrowers() -> None:
    # a holds its quota and waits to borrow 4 GPUs; c lends 4 (b borrows 2 of them), so 2 are left: b's
    # later 2-GPU borrower would take them, as every smaller borrower takes each piece as it frees, and
    # a's gang would wait all day. Once later jobs of a have passed it for starvation_s, what c lends is
    # kept for it: b's borrower waits behind it, while jobs within their own quota still run.
    def book() -> Book:
        return Book(
            {
                A: Standing("a", {"GPU": 4}, "c", usage={"GPU": 4}),
                B: Standing("b", {"GPU": 4}, "c", usage={"GPU": 6}),
                C: Standing("c", {"GPU": 8}, "c", usage={"GPU": 2}),
            }
        )

    big = gang(A, 4, share=0.1, created_at=NOW - timedelta(hours=3), bypassed_since=NOW - timedelta(hours=2))
    borrower, owed = gang(B, 2, share=0.2), gang(C, 2, share=0.3)
    decisions = decide([big, borrower, owed], cluster(16), book(), {}, now=NOW, starvation_s=3600)
    outcomes = {o.job.id: o for o in decisions.outcomes}
    assert {job_id: o.verdict for job_id, o in outcomes.items()} == {
        big.id: Verdict.wait,
        borrower.id: Verdict.wait,
        owed.id: Verdict.admit,
    }
    assert "which has 2 GPU left to lend" in outcomes[big.id].reason
    assert outcomes[borrower.id].reason.startswith(
        f"waiting behind job {big.id} of project a, which waits for what their cohort lends"
    )
    assert outcomes[borrower.id].own and not decisions.held  # the cohort holds it: the round may read on
    # Not starving yet (passed for less than starvation_s): b's borrower takes what is left, as before.
    passed = gang(A, 4, share=0.1, created_at=big.created_at, bypassed_since=NOW - timedelta(minutes=30), id=big.id)
    again = decide([passed, borrower, owed], cluster(16), book(), {}, now=NOW, starvation_s=3600)
    assert {o.job.id for o in again.of(Verdict.admit)} == {borrower.id, owed.id}
    # Across the round's batches: the book keeps the hold for the next batch's borrowers of the cohort.
    held = book()
    first = decide([big, owed], cluster(16), held, {}, now=NOW, starvation_s=3600)
    assert [o.job.id for o in first.of(Verdict.admit)] == [owed.id]
    [later] = decide([borrower], cluster(16), held, {}, now=NOW, starvation_s=3600).outcomes
    assert later.verdict is Verdict.wait and later.reason.startswith(f"waiting behind job {big.id}")


def test_infeasible_waits_its_timeout_then_fails() -> None:
    job = gang(A, 16)
    [first] = decide([job], cluster(8), Book(), {}, now=NOW, infeasible_timeout_s=600).outcomes
    assert first.verdict is Verdict.infeasible and first.error is None
    assert first.reason.startswith("can never fit this cluster as it is: needs 16 CPU, 16 GPU")
    assert first.message.endswith("Fails in 600 s unless the cluster grows.")
    late = gang(A, 16, infeasible_since=NOW - timedelta(seconds=700))
    [last] = decide([late], cluster(8), Book(), {}, now=NOW, infeasible_timeout_s=600).outcomes
    assert last.error is not None and last.error.endswith("(gave up after 700 s)")


def test_a_bad_code_package_or_an_unreadable_spec_fails_that_job_alone() -> None:
    bad = gang(A, 1, code="sha256:abc")
    broken = Job(A, {"scaling": {"num_workers": "many"}}, 1.0, 1.0)
    fine = gang(A, 1)
    decisions = decide([bad, broken, fine], cluster(8), Book(), {}, now=NOW, bad_code={"sha256:abc": "damaged"})
    assert dict(verdicts(decisions)) == {bad.id: Verdict.fail, broken.id: Verdict.fail, fine.id: Verdict.admit}
    outcomes = {o.job.id: o for o in decisions.outcomes}
    assert outcomes[bad.id].message == "not launched: damaged"
    error = outcomes[broken.id].error
    assert error is not None and error.startswith("could not be placed: ValidationError")


def test_topology_places_a_gang_inside_one_rack_or_says_which_it_considered() -> None:
    nodes = cluster(4, 4, 4, 4, racks=["r1", "r1", "r2", "r2"])
    first, second, third = (
        gang(A, 8, topology={"required": "rack"}, created_at=NOW + timedelta(seconds=i)) for i in range(3)
    )
    placed, other, wait = decide([first, second, third], nodes, Book(), {}, now=NOW).outcomes
    for outcome in (placed, other):
        assert outcome.verdict is Verdict.admit and outcome.selector is not None
        rack = outcome.selector["rack"]
        assert {n.labels["rack"] for n in nodes.nodes if n.node_id in outcome.placement} == {rack}
    assert placed.selector != other.selector
    assert wait.verdict is Verdict.wait
    assert wait.reason.startswith("waiting for room inside one rack: needs 8 CPU, 8 GPU")
    assert "rack=r1 {CPU: 24, GPU: 0}" in wait.reason
    [never] = decide([gang(A, 12, topology={"required": "rack"})], nodes, Book(), {}, now=NOW).outcomes
    assert never.verdict is Verdict.infeasible and never.reason.startswith("can never fit inside one rack")


def test_the_fair_share_formulas() -> None:
    capacity = {"CPU": 100.0, "GPU": 10.0}
    assert dominant_share({"CPU": 0.1, "GPU": 0.0}, {"CPU": 10.0, "GPU": 5.0}, capacity) == 0.5
    assert dominant_share({}, {"CPU": 5.0}, {"CPU": 0.0, "GPU": 0.0}) == 0.0
    # A full history (weight 1) keeps half of itself over a half-life; nothing held takes the rest.
    assert decayed(1.0, 1.0, 0.0, 3600.0, 3600.0) == (0.5, 1.0)
    # A new project (weight 0) that held everything for its two half-lives has held everything on average,
    # not three quarters: the time before its first job is not time it held nothing.
    assert decayed(0.0, 0.0, 1.0, 7200.0, 3600.0) == (1.0, 0.75)
    # Half a history of 1.0, then a half-life of nothing: 0.25 of 0.75 covered.
    history, weight = decayed(1.0, 0.5, 0.0, 3600.0, 3600.0)
    assert abs(history - 1 / 3) < 1e-12 and weight == 0.75
    assert decayed(0.3, 0.0, 0.9, 0.0, 3600.0) == (0.3, 0.0)  # no time behind it: unchanged
