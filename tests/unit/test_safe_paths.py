"""trainmaster/safe_paths.py on real files: a path a job reported reaches only what is below the job's
own folder, through real folders; a link anywhere on the way (the project's folder, the job's, a
folder inside, the checkpoint itself), a `..` or a path elsewhere leaves an outside file in place, and
so does a link swapped in while the walk is under way."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from trainmaster import safe_paths
from trainmaster.safe_paths import Request

PROJECT, JOB = "p-1", "j-1"
LAYOUTS = ((PROJECT, JOB), (JOB,))


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, Path]:
    """`<storage>/<project>/<job>/ckpt/` (a file and a folder inside) and an operator's folder outside
    storage shaped like a run, so a redirected walk would find every name it asks for."""
    storage, outside = tmp_path / "storage", tmp_path / "operator"
    for base in (storage / PROJECT / JOB, outside / JOB, outside):
        (base / "ckpt" / "shard").mkdir(parents=True, exist_ok=True)
        (base / "ckpt" / "model.pt").write_bytes(b"w" * 1000)
        (base / "ckpt" / "shard" / "optim.pt").write_bytes(b"o" * 24)
    (outside / "precious").write_text("the operator's")
    return storage, outside


def operator_files(outside: Path) -> set[str]:
    return {str(p.relative_to(outside)) for p in outside.rglob("*")}


def remove(storage: Path, path: Path | str) -> safe_paths.Result:
    (result,) = safe_paths.perform(str(storage), [Request("remove", str(path), LAYOUTS)])
    return result


def test_a_plain_checkpoint_folder_or_file_is_removed_and_nothing_else(tree: tuple[Path, Path]) -> None:
    storage, outside = tree
    before = operator_files(outside)
    run = storage / PROJECT / JOB
    (run / "ckpt" / "shard" / "to-outside").symlink_to(outside)  # a link inside goes as an entry
    (run / "loose.pt").write_bytes(b"x")
    assert remove(storage, run / "ckpt").outcome == "removed"
    assert remove(storage, run / "loose.pt").outcome == "removed"
    assert remove(storage, run / "ckpt").outcome == "gone"
    assert list(run.iterdir()) == []
    assert operator_files(outside) == before

    old = storage / JOB / "ckpt"  # the layout before storage was per project
    old.mkdir(parents=True)
    assert remove(storage, old).outcome == "removed" and not old.exists()


def link(path: Path, to: Path) -> None:
    """Replaces the folder `path` with a link to `to` (as a job that owns it can)."""
    os.rename(path, path.with_name(path.name + ".moved"))
    path.symlink_to(to)


@pytest.mark.parametrize(
    ("plant", "reported", "outcome", "named"),
    [
        # the project's folder is a link to the operator's: <storage>/p-1 -> operator, so p-1/j-1/ckpt is there
        (lambda s, o: link(s / PROJECT, o), "p-1/j-1/ckpt", "linked", "p-1"),
        (lambda s, o: link(s / PROJECT / JOB, o), "p-1/j-1/ckpt", "linked", "p-1/j-1"),
        (lambda s, o: link(s / PROJECT / JOB / "ckpt", o), "p-1/j-1/ckpt/precious", "linked", "p-1/j-1/ckpt"),
        (lambda s, o: link(s / PROJECT / JOB / "ckpt", o / "ckpt"), "p-1/j-1/ckpt", "linked", "p-1/j-1/ckpt"),
        (lambda s, o: (s / PROJECT / JOB / "ckpt" / "up").symlink_to(o), "p-1/j-1/ckpt/up", "linked", "ckpt/up"),
        (lambda s, o: None, "p-1/j-1/../../../operator/ckpt", "outside", ""),
        (lambda s, o: None, "p-1/j-1/ckpt/../../../../operator/precious", "outside", ""),
        (lambda s, o: None, "p-1/j-1", "outside", ""),  # the run folder itself
        (lambda s, o: None, "p-1", "outside", ""),
    ],
)
def test_a_link_at_any_level_or_a_path_elsewhere_removes_nothing(
    tree: tuple[Path, Path], plant: Callable[[Path, Path], None], reported: str, outcome: str, named: str
) -> None:
    storage, outside = tree
    before = operator_files(outside)
    plant(storage, outside)
    result = remove(storage, f"{storage}/{reported}")
    assert (result.outcome, named in result.detail) == (outcome, True), result
    assert operator_files(outside) == before
    assert (outside / "precious").read_text() == "the operator's"


def test_absolute_paths_outside_storage_and_the_old_layout_through_a_link_remove_nothing(
    tree: tuple[Path, Path],
) -> None:
    storage, outside = tree
    before = operator_files(outside)
    assert remove(storage, outside / "ckpt").outcome == "outside"
    assert remove(storage, outside / "precious").outcome == "outside"
    assert remove(storage, "relative/p-1/j-1/ckpt").outcome == "outside"
    (storage / JOB).symlink_to(outside)  # the older layout, <storage>/<job id>, planted the same way
    assert remove(storage, storage / JOB / "ckpt").outcome == "linked"
    assert operator_files(outside) == before


def test_a_folder_swapped_for_a_link_during_the_walk_cannot_redirect_it(
    tree: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job swaps each folder for a link to the operator's right before the walk opens it: the open
    refuses the link instead of following it."""
    storage, outside = tree
    before = operator_files(outside)
    real_open = safe_paths.open_folder
    swapped: list[str] = []

    def swap_then_open(name: str, parent: int, where: str) -> int:
        if where == "p-1/j-1" and not swapped:  # the job's folder, between the project's open and its own
            os.rename(name, name + ".moved", src_dir_fd=parent, dst_dir_fd=parent)
            os.symlink(str(outside), name, dir_fd=parent)
            swapped.append(where)
        return real_open(name, parent, where)

    monkeypatch.setattr(safe_paths, "open_folder", swap_then_open)
    result = remove(storage, storage / PROJECT / JOB / "ckpt")
    assert (result.outcome, result.detail, swapped) == ("linked", "p-1/j-1", ["p-1/j-1"])
    assert operator_files(outside) == before


def test_a_folder_inside_swapped_for_a_link_mid_removal_goes_as_a_link(
    tree: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checkpoint's `shard` folder is listed as a folder, then swapped for a link to the operator's
    before the removal descends into it: the link is removed, what it points at stays."""
    storage, outside = tree
    before = operator_files(outside)
    real_remove_tree = safe_paths._remove_tree

    def swap_then_remove(parent: int, name: str, depth: int) -> None:
        if name == "shard":
            os.rename(name, "shard.moved", src_dir_fd=parent, dst_dir_fd=parent)
            os.symlink(str(outside / "ckpt"), name, dir_fd=parent)
        real_remove_tree(parent, name, depth)

    monkeypatch.setattr(safe_paths, "_remove_tree", swap_then_remove)
    result = remove(storage, storage / PROJECT / JOB / "ckpt")
    assert result.outcome == "error"  # shard.moved appeared after the listing: the folder is not empty
    assert not (storage / PROJECT / JOB / "ckpt" / "shard").exists()
    assert operator_files(outside) == before


def test_measuring_counts_regular_files_once_and_never_follows_a_link(tree: tuple[Path, Path]) -> None:
    storage, outside = tree
    ckpt = storage / PROJECT / JOB / "ckpt"
    (ckpt / "to-outside").symlink_to(outside)
    os.link(ckpt / "model.pt", ckpt / "model.again")  # one inode, counted once
    (outside / "huge").write_bytes(b"h" * 100_000)
    requests = [Request("measure", str(ckpt), LAYOUTS, 1000), Request("measure", str(ckpt), LAYOUTS, 2)]
    full, cut = safe_paths.perform(str(storage), requests)
    assert (full.outcome, full.bytes, full.complete) == ("measured", 1024, True)
    assert (cut.outcome, cut.complete) == ("measured", False)
    link(storage / PROJECT / JOB, outside)
    (linked,) = safe_paths.perform(str(storage), [Request("measure", str(ckpt), LAYOUTS, 1000)])
    assert (linked.outcome, linked.bytes) == ("linked", 0)
