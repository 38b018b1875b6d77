"""The local stack's private folders and files, against another local user (a tenant's job runs as one):
a folder planted where the stack's would go is never adopted and nothing is written through a link in
it; the embedded PostgreSQL's data, stack.json and the logs stay closed to other users whatever the
embedded library does to folders; several clusters that could not run as users of their own are refused,
not run as root. Real users, files and processes: run as root (as CI runs the suite)."""

from __future__ import annotations

import errno
import hashlib
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from api.stack import folders, local, osusers, postgres, ray_head
from api.stack.osusers import OsUser

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="only root makes users and gives folders away")


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def as_user(user: OsUser, *command: str) -> subprocess.CompletedProcess[str]:
    """`command` (a system program) run as `user`, with no supplementary groups."""
    return subprocess.run(
        list(command), user=user.uid, group=user.gid, extra_groups=[], capture_output=True, text=True, timeout=30
    )


def refused(user: OsUser, *command: str) -> bool:
    result = as_user(user, *command)
    return result.returncode != 0 and os.strerror(errno.EACCES) in result.stderr


@pytest.fixture
def planter() -> OsUser:
    """Another local user: what a tenant's job runs as."""
    user = osusers.cluster_user("planter")
    assert user is not None
    return user


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A folder under /tmp that other users may enter (pytest's own are root's alone, mode 0700)."""
    base = Path(tempfile.mkdtemp(prefix="tm-sec-", dir="/tmp"))
    base.chmod(0o711)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def plant(user: OsUser, folder: Path, target: Path) -> None:
    """As `user`: `folder` (mode 0700 like a real session folder) holding a link named like the token
    copy, pointing at `target` (a file of `user`'s, holding "planted")."""
    script = f'echo planted > "{target}" && mkdir -m 700 "{folder}" && ln -s "{target}" "{folder}/ray_auth_token"'
    result = as_user(user, "sh", "-c", script)
    assert result.returncode == 0, result.stderr


def test_a_session_folder_planted_at_a_computable_name_is_not_used(
    monkeypatch: pytest.MonkeyPatch, shared_tmp: Path, planter: OsUser, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("TRAINMASTER_HOME", str(home))
    # The names the stack's session folders once had (its head's, a worker node's, another cluster's):
    # computed from the home's path, so anyone could make them first.
    old = f"/tmp/tm-ray-{hashlib.sha256(str(home).encode()).hexdigest()[:8]}"
    (shared_tmp / "t").mkdir()
    (shared_tmp / "t").chmod(0o733)
    planted = {Path(old + suffix): shared_tmp / "t" / f"target{suffix}" for suffix in ("", "-n1", "-c2")}
    for folder, target in planted.items():
        shutil.rmtree(folder, ignore_errors=True)
        plant(planter, folder, target)
    users = {"default": osusers.cluster_user("default"), "cluster-2": osusers.cluster_user("cluster-2")}
    # No Ray is started: each node's command is recorded with the environment it would run in, and the
    # heads report the CPUs asked for. What is under test is the folders and token copies made first.
    started: list[dict[str, str]] = []
    monkeypatch.setattr(ray_head, "_run", lambda command, env, *_: started.append(env))
    monkeypatch.setattr(ray_head.RayHead, "cpus", lambda self: (0.0, 1.0))
    monkeypatch.setattr(local, "_nodes", lambda head: [head] * 2)
    try:
        head, workers, extra = local._start_rays(
            folders.private_home(), users, nodes=2, num_cpus=1, num_gpus=0, cpus_per_node=1, node_resources=None,
            node_ip="127.0.0.1", node_labels=[], clusters=2, cpus_per_cluster=1, say=lambda *_: None,
        )  # fmt: skip
        for folder, target in planted.items():
            assert target.read_text() == "planted\n", f"the token was written through the link in {folder}"
            assert (os.lstat(folder).st_uid, mode(folder)) == (planter.uid, 0o700)  # not taken over
            assert os.readlink(folder / "ray_auth_token") == str(target)
        made = [head.temp_dir, Path(workers[0]), Path(extra[0]["temp_dir"])]
        assert not set(made) & set(planted), "a planted folder was used"
        expected = [users["default"], users["default"], users["cluster-2"]]
        for folder, env, user in zip(made, started, expected, strict=True):
            assert user is not None and (os.lstat(folder).st_uid, mode(folder)) == (user.uid, 0o700)
            token = Path(env["RAY_AUTH_TOKEN_PATH"])
            assert token.parent == folder and stat.S_ISREG(os.lstat(token).st_mode)
            assert (os.lstat(token).st_uid, mode(token)) == (user.uid, 0o600)
        assert Path(started[0]["RAY_AUTH_TOKEN_PATH"]).read_text() == local.ray_token_path().read_text()
    finally:
        for folder in planted:
            shutil.rmtree(folder, ignore_errors=True)
        for env in started:  # only the fresh session folders made for this test, never a parent of theirs
            made_here = Path(env["RAY_AUTH_TOKEN_PATH"]).parent
            if re.fullmatch(r"/tmp/tm-ray-\w{8}", str(made_here)):
                shutil.rmtree(made_here, ignore_errors=True)


def test_a_folder_not_ours_is_refused_and_nothing_is_written_through_a_link(shared_tmp: Path, planter: OsUser) -> None:
    user = osusers.cluster_user("default")
    assert user is not None
    (shared_tmp / "t").mkdir()
    (shared_tmp / "t").chmod(0o733)
    target = shared_tmp / "t" / "target"
    theirs = shared_tmp / "t" / "theirs"
    plant(planter, theirs, target)
    with pytest.raises(RuntimeError, match="not a private folder of this stack"):
        osusers.private_dir(theirs, user)
    assert os.lstat(theirs).st_uid == planter.uid  # not given to the cluster's user
    # A folder of ours that others could write in is refused too: it may hold anything by now.
    (shared_tmp / "open").mkdir()
    (shared_tmp / "open").chmod(0o777)
    with pytest.raises(RuntimeError, match="mode 777"):
        osusers.private_dir(shared_tmp / "open", None)
    with pytest.raises(RuntimeError, match="not a folder"):
        osusers.private_dir(theirs / "ray_auth_token", None)  # a link is never followed

    # The folder is the cluster user's: what that user (a tenant's job) plants in it is never written through.
    mine = osusers.private_dir(shared_tmp / "mine", user)
    assert as_user(user, "ln", "-s", str(target), str(mine / "ray_auth_token")).returncode == 0
    source = shared_tmp / "ray_auth_token"
    source.write_text("the cluster's token")
    with pytest.raises(RuntimeError, match="refusing to write"):
        osusers.own_copy(source, mine, user)
    assert target.read_text() == "planted\n" and os.lstat(target).st_uid == planter.uid
    assert os.readlink(mine / "ray_auth_token") == str(target)


@pytest.fixture
def embedded(monkeypatch: pytest.MonkeyPatch, shared_tmp: Path) -> Iterator[dict[str, Any]]:
    """The database part of `up`: the home made private, the embedded PostgreSQL started where `up`
    starts it, stack.json saved and a log written as `up` writes them."""
    home = shared_tmp / "home"
    monkeypatch.setenv("TRAINMASTER_HOME", str(home))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)  # as on most servers; restored afterwards
    data_dir = folders.database_dir()
    url = ""
    try:
        folders.private_home()
        url = postgres.start_embedded(data_dir)
        state = local.StackState(
            home=str(home), database_url=url, embedded_postgres=True, ray_dashboard="", ray_gcs="", api_url="",
            database_dir=str(data_dir),
        )  # fmt: skip
        local.save_state(state)
        with osusers.append_private(folders.home_folder("logs") / "supervisor.log") as log:
            log.write(b"an error of a tenant's job\n")
        yield {"home": home, "data_dir": data_dir, "url": url}
    finally:
        if url:
            postgres.stop_embedded(data_dir)
        if data_dir.parent.parent == folders.SERVICE_BASE:  # the stack's own /var/lib/trainmaster/<stack>
            shutil.rmtree(data_dir.parent, ignore_errors=True)


def test_another_user_reads_nothing_of_the_embedded_database_or_the_stacks_files(
    embedded: dict[str, Any], shared_tmp: Path, planter: OsUser
) -> None:
    home, data_dir = embedded["home"], embedded["data_dir"]
    assert refused(planter, "cat", str(home / "stack.json"))
    assert refused(planter, "cat", str(home / "logs" / "supervisor.log"))
    assert refused(planter, "ls", str(home))
    assert refused(planter, "ls", str(data_dir))
    assert refused(planter, "cat", str(data_dir / "PG_VERSION"))
    assert refused(planter, "ls", str(data_dir.parent))  # passable (the server's user goes through), not listable
    assert mode(shared_tmp) == 0o711, "a folder above the stack's was opened to other users"
    assert postgres.reachable(embedded["url"])
    assert not any(data_dir.is_relative_to(parent) for parent in (home, Path("/root")))
    assert (mode(home), mode(home / "logs")) == (0o700, 0o700)
    assert mode(home / "stack.json") == mode(home / "logs" / "supervisor.log") == 0o600


def test_the_embedded_server_never_opens_a_folder_its_user_cannot_enter(
    monkeypatch: pytest.MonkeyPatch, shared_tmp: Path
) -> None:
    """embedded-postgres would add read and enter for everyone to each folder above the data (root's
    home, when the data or the virtual environment is there); the start is refused instead, naming it."""
    closed = shared_tmp / "closed"
    closed.mkdir(mode=0o700)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    with pytest.raises(RuntimeError, match=f"cannot enter {closed} \\(mode 700\\).*chmod o\\+x {closed}"):
        postgres.start_embedded(closed / "run-here" / "pgdata")
    assert mode(closed) == 0o700
    assert not (closed / "run-here" / "pgdata" / "PG_VERSION").exists()


@pytest.fixture
def python_others_cannot_run(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """This process's Python, as the check sees it, a copy under a folder of mode 0700 (as pyenv's under a
    0700 /root): no cluster user could run it."""
    closed = Path(tempfile.mkdtemp(prefix="tm-py-", dir="/tmp"))
    shutil.copy2(Path(sys.executable).resolve(), closed / "python3")
    monkeypatch.setattr(sys, "executable", str(closed / "python3"))
    yield closed
    shutil.rmtree(closed)


def test_several_clusters_that_cannot_run_as_users_of_their_own_are_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, python_others_cannot_run: Path
) -> None:
    monkeypatch.setenv("TRAINMASTER_HOME", str(tmp_path / "home"))

    def start(*_: object, **__: object) -> None:
        raise AssertionError("something was started")

    monkeypatch.setattr(local, "_start_rays", start)
    monkeypatch.setattr(postgres, "start_embedded", start)
    said: list[str] = []
    with pytest.raises(RuntimeError) as refusal:
        local.up(clusters=2, say=said.append)
    closed = python_others_cannot_run
    assert f"tm-default cannot enter {closed} (mode 700)" in str(refusal.value)
    assert f"`chmod o+x {closed}`" in str(refusal.value) and "Nothing was started" in str(refusal.value)
    assert said == [] and not (tmp_path / "home").exists()

    # One cluster is no promise of separation: it runs as the caller, and `up` says so, once.
    assert local.cluster_users(["default"], said.append) == {"default": None}
    assert len(said) == 1 and "the cluster runs as" in said[0] and f"chmod o+x {closed}" in said[0]
