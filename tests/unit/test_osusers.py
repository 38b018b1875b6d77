"""api/stack/osusers.py and the Ray node environment built on it: a local cluster's OS user, its private
session folder and token copy, and the checkpoint root every cluster user may write in but not list.
The real separation (a job of one cluster refused the other's files and processes) is
tests/security/test_hostile_tenant.py's; `up` with a user per cluster, tests/e2e/test_local_stack.py's."""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import sys
import tempfile
from pathlib import Path

import pytest

from api.stack import osusers, ray_head

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="only root creates users and gives files away")


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_checkpoint_root_lets_users_in_but_not_list_it(tmp_path: Path) -> None:
    (tmp_path / "kept").mkdir(mode=0o755)
    root = osusers.shared_root(tmp_path / "kept" / "made" / "storage")
    assert mode(root) == 0o1733
    assert mode(tmp_path / "kept" / "made") == 0o711  # made here: passable, not listable
    assert mode(tmp_path / "kept") == 0o755  # there already: left as it was


def test_a_python_behind_a_folder_others_cannot_enter_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    user = osusers.OsUser("tm-unit", 60001, 60001)
    base = Path(tempfile.mkdtemp(dir="/tmp"))  # pytest's own tmp folders are 0700
    try:
        (base / "home" / "bin").mkdir(parents=True)
        (base / "home" / "bin" / "python").touch()
        for folder in (base, base / "home", base / "home" / "bin"):
            folder.chmod(0o755)
        monkeypatch.setattr(sys, "executable", str(base / "home" / "bin" / "python"))
        assert str(base) not in str(osusers.cannot_run_python(user.name))
        (base / "home").chmod(0o700)  # as /root is on this machine
        assert f"cannot enter {base / 'home'} (mode 700)" in str(osusers.cannot_run_python(user.name))
    finally:
        shutil.rmtree(base)


def test_no_user_unless_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert osusers.cluster_user("east") is None


@as_root
def test_a_cluster_user_is_an_unprivileged_system_user_made_once() -> None:
    user = osusers.cluster_user("Team B/x")
    assert user is not None and user.name == "tm-team-b-x"
    entry = pwd.getpwnam(user.name)
    assert entry.pw_uid == user.uid != 0 and entry.pw_shell == "/usr/sbin/nologin"
    assert osusers.cluster_user("Team B/x") == user  # found, not made again


@as_root
def test_a_node_run_as_a_user_has_its_own_private_folder_and_token(tmp_path: Path) -> None:
    user = osusers.cluster_user("unit")
    assert user is not None
    token = tmp_path / "auth_token"
    token.write_text("secret")
    token.chmod(0o600)
    folder = tmp_path / "node"
    env = ray_head.node_env(token, folder, user)
    own = Path(env["RAY_AUTH_TOKEN_PATH"])
    assert own.parent == folder and own.read_text() == "secret"
    assert (own.stat().st_uid, mode(own)) == (user.uid, 0o600)
    assert (folder.stat().st_uid, mode(folder)) == (user.uid, 0o700)
    assert env["HOME"] == str(folder) and env["USER"] == user.name
    assert ray_head.session_root(folder).parent == folder  # Ray's own (0777) temp dir sits inside it


def test_a_node_run_as_the_caller_reads_the_token_where_it_is(tmp_path: Path) -> None:
    token = tmp_path / "auth_token"
    token.write_text("secret")
    env = ray_head.node_env(token, tmp_path / "node", None)
    assert env["RAY_AUTH_TOKEN_PATH"] == str(token) and mode(tmp_path / "node") == 0o700
