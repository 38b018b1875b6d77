"""What `trainmaster run` ships of a folder: git's ignore rules, never secrets, a warning when large."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest

from trainmaster import packing
from trainmaster.packing import pack, select


def tree(root: Path, files: dict[str, str | bytes]) -> Path:
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode() if isinstance(content, str) else content)
    return root


def shipped(folder: Path, **options: bool) -> set[str]:
    package = pack(folder, **options)
    names = set(zipfile.ZipFile(io.BytesIO(package.content)).namelist())
    assert names == set(package.files)
    return names


def test_gitignore_rules_apply_as_git_applies_them(tmp_path: Path) -> None:
    tree(
        tmp_path,
        {
            "train.py": "",
            ".gitignore": "*.log\n!keep.log\ndata/\n/outputs\nbuild\n",
            "run.log": "",
            "keep.log": "",
            "data/big.bin": "x",
            "sub/data/also.bin": "x",  # data/ matches at any depth
            "outputs/model.pt": "x",
            "sub/outputs/small.txt": "",  # /outputs is anchored at the root
            "build/x.o": "",
            "sub/notes.log": "",
            "pkg/__init__.py": "",
            "pkg/__pycache__/m.cpython-311.pyc": "",
            "pkg/stale.pyc": "",
            ".venv/lib/site.py": "",
            "node_modules/a/index.js": "",
        },
    )
    assert shipped(tmp_path) == {".gitignore", "train.py", "keep.log", "sub/outputs/small.txt", "pkg/__init__.py"}


def test_nested_ignore_files_and_trainmasterignore_take_precedence(tmp_path: Path) -> None:
    tree(
        tmp_path,
        {
            "train.py": "",
            ".gitignore": "*.csv\n",
            ".trainmasterignore": "!small.csv\nnotebooks/\n",
            "small.csv": "",
            "large.csv": "",
            "notebooks/explore.ipynb": "",
            "lib/.gitignore": "generated.py\n!lib.csv\n",
            "lib/generated.py": "",
            "lib/lib.csv": "",
            "lib/other.csv": "",
            "generated.py": "",  # lib/.gitignore applies below lib/ only
        },
    )
    assert shipped(tmp_path) == {
        ".gitignore",
        ".trainmasterignore",
        "train.py",
        "small.csv",
        "generated.py",
        "lib/.gitignore",
        "lib/lib.csv",
    }


def test_an_ignored_folder_is_not_entered(tmp_path: Path) -> None:
    tree(tmp_path, {".gitignore": "cache/\n!cache/keep.txt\n", "cache/keep.txt": "", "cache/x": ""})
    assert shipped(tmp_path) == {".gitignore"}  # as in git: a file inside an excluded folder cannot come back


@pytest.mark.parametrize(
    "name",
    [".env", ".env.local", "config/.env.production", ".envrc", "server.pem", "tls/api.key", "id_rsa", "id_rsa.pub",
     "keys/id_ed25519", "id_ecdsa"],
)  # fmt: skip
def test_secrets_are_never_shipped_even_when_an_ignore_file_asks_for_them(tmp_path: Path, name: str) -> None:
    tree(tmp_path, {"train.py": "", name: "SECRET", ".trainmasterignore": f"!{name}\n"})
    package = pack(tmp_path)
    assert name not in package.files and set(package.files) == {"train.py", ".trainmasterignore"}
    assert b"SECRET" not in package.content
    assert package.selection.secrets == [name]
    assert any(name in warning and "--include-secrets" in warning for warning in package.warnings())


def test_include_secrets_ships_them_but_ignore_files_still_hold(tmp_path: Path) -> None:
    tree(tmp_path, {"train.py": "", ".env": "A=1", "id_rsa": "k", ".gitignore": "id_rsa\n"})
    assert shipped(tmp_path, include_secrets=True) == {".gitignore", "train.py", ".env"}


def test_git_folder_ships_only_when_asked(tmp_path: Path) -> None:
    tree(tmp_path, {"train.py": "", ".git/HEAD": "ref: refs/heads/main\n", ".git/config": ""})
    assert shipped(tmp_path) == {"train.py"}
    assert shipped(tmp_path, include_git=True) == {"train.py", ".git/HEAD", ".git/config"}


def test_symlinks_are_left_out(tmp_path: Path) -> None:
    tree(tmp_path, {"train.py": "", "outside/secret.txt": "s"})
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "link.txt").symlink_to(tmp_path / "outside" / "secret.txt")
    (tmp_path / "work" / "linked-dir").symlink_to(tmp_path / "outside")
    assert "work/link.txt" not in shipped(tmp_path) and not any("linked-dir" in n for n in shipped(tmp_path))


def test_same_files_same_digest_and_a_change_changes_it(tmp_path: Path) -> None:
    tree(tmp_path, {"train.py": "print(1)\n", "pkg/m.py": "", "ignored.log": "a", ".gitignore": "*.log\n"})
    first = pack(tmp_path)
    (tmp_path / "ignored.log").write_text("changed")  # ignored: no new upload
    assert pack(tmp_path).digest == first.digest and first.digest.startswith("sha256:")
    (tmp_path / "train.py").write_text("print(2)\n")
    assert pack(tmp_path).digest != first.digest


def test_a_large_package_warns_with_its_largest_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(packing, "WARN_BYTES", 1000)
    tree(tmp_path, {"train.py": "", "data/weights.bin": b"\0" * 5000, "small.txt": "x"})
    assert pack(tmp_path).warnings() == [
        "shipping 4.9 KB in 3 files (largest: data/weights.bin (4.9 KB), small.txt (1 B), train.py (0 B)); "
        "list data, checkpoints and outputs the job does not need in .trainmasterignore"
    ]
    (tmp_path / "data" / "weights.bin").unlink()
    assert pack(tmp_path).warnings() == []


def test_many_files_warn_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(packing, "WARN_FILES", 3)
    tree(tmp_path, {f"f{i}.py": "" for i in range(4)})
    assert "in 4 files" in pack(tmp_path).warnings()[0]


def test_select_refuses_what_is_not_a_folder(tmp_path: Path) -> None:
    with pytest.raises(NotADirectoryError):
        select(tmp_path / "missing")
