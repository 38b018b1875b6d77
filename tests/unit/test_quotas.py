"""The quota and cohort rules (api/dispatcher/quotas.py) without a database.

The same rules run through real dispatcher rounds on PostgreSQL in tests/integration/test_quotas.py.
"""

from __future__ import annotations

import uuid

from api.dispatcher.quotas import Book, Standing
from api.dispatcher.reasons import Code, render

A, B, C = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()


def gpus(n: float) -> dict[str, float]:
    return {"CPU": 0.0, "GPU": n}


def test_a_project_without_quota_is_not_limited() -> None:
    assert Book({}).refusal(A, gpus(1000)) is None
    book = Book({A: Standing("a", {"CPU": 4}, usage={"CPU": 4, "GPU": 0})})
    assert book.refusal(A, gpus(64)) is None  # no GPU quota: GPUs are not limited


def test_within_quota_admits_and_take_counts_the_gang() -> None:
    book = Book({A: Standing("a", {"GPU": 8}, usage={"GPU": 4})})
    assert book.refusal(A, gpus(4)) is None
    book.take(A, gpus(4))
    refusal = book.refusal(A, gpus(1))
    assert refusal is not None
    assert refusal.code is Code.quota and not refusal.always
    assert refusal.params == {"amount": 1, "resource": "GPU", "project": "a", "used": 8, "quota": 8}
    assert "project a holds 8 of its quota of 8 GPU" in render(refusal)


def test_a_gang_larger_than_quota_and_cohort_can_never_fit() -> None:
    book = Book({A: Standing("a", {"GPU": 4}), B: Standing("b", {"GPU": 2}, cohort=None)})
    refusal = book.refusal(A, gpus(5))
    assert refusal is not None and refusal.always and refusal.code is Code.quota_never
    assert "may hold at most 4 GPU" in render(refusal) and "project set --quota" in render(refusal)


def test_borrowing_from_a_cohort_up_to_what_the_others_leave_unused() -> None:
    book = Book(
        {
            A: Standing("a", {"GPU": 4}, cohort="research", usage={"GPU": 4}),
            B: Standing("b", {"GPU": 4}, cohort="research", usage={"GPU": 1}),
            C: Standing("c", {"GPU": 100}, cohort="other"),  # another cohort lends nothing to a
        }
    )
    assert book.free_to_borrow(A, "GPU") == 3
    assert book.refusal(A, gpus(3)) is None
    refusal = book.refusal(A, gpus(4))
    assert refusal is not None and not refusal.always and refusal.code is Code.cohort_lending
    assert "borrows 0 from cohort research, which has 3 GPU left to lend" in render(refusal)
    book.take(A, gpus(3))
    assert book.free_to_borrow(B, "GPU") == 0  # b's own quota is now lent out: b may not borrow back
    assert book.refusal(B, gpus(3)) is None  # but b's nominal quota is still b's (reclaim frees it)


def test_borrowing_and_lending_limits() -> None:
    book = Book(
        {
            A: Standing("a", {"GPU": 2}, cohort="r", borrowing_limit={"GPU": 1}, usage={"GPU": 2}),
            B: Standing("b", {"GPU": 8}, cohort="r", lending_limit={"GPU": 3}),
        }
    )
    assert book.refusal(A, gpus(1)) is None
    refusal = book.refusal(A, gpus(2))
    assert refusal is not None and refusal.code is Code.borrowing_limit
    assert "may borrow at most 1 beyond it" in render(refusal)
    never = book.refusal(A, gpus(4))
    assert never is not None and never.always  # 2 of its own + at most 1 borrowed
    assert book.free_to_borrow(A, "GPU") == 3  # b lends at most 3 of its 8
    unlimited = Book(
        {
            A: Standing("a", {"GPU": 2}, cohort="r", usage={"GPU": 2}),
            B: Standing("b", {"GPU": 8}, cohort="r", lending_limit={"GPU": 3}),
        }
    )
    assert unlimited.refusal(A, gpus(3)) is None
    assert unlimited.refusal(A, gpus(4)) is not None


def test_fair_share_that_found_too_little_is_not_asked_again_for_as_large_a_gang_of_the_project() -> None:
    book = Book({A: Standing("a", {"GPU": 4}, cohort="r"), B: Standing("b", {"GPU": 4}, cohort="r")})
    book.fair_share_failed(A, {"CPU": 2.0, "GPU": 2.0})
    assert book.fair_share_gave_up(A, {"CPU": 2.0, "GPU": 4.0})
    assert not book.fair_share_gave_up(A, {"CPU": 2.0, "GPU": 1.0})  # a smaller gang may find enough
    assert not book.fair_share_gave_up(B, {"CPU": 2.0, "GPU": 4.0})  # another project's share differs
