"""The locks in requirements/ (made by scripts/lock, installed by scripts/install) pin every dependency
pyproject.toml declares, for the extras each one is for, with hashes. Reads files only, no network."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]
LOCKS = ROOT / "requirements"

# What each lock is for: scripts/demo installs demo, scripts/test installs test.
LOCK_EXTRAS = {"demo": ["server", "workers"], "test": ["server", "workers", "dev", "frameworks"]}
# Extras no lock installs: horovod builds its PyTorch op from source, which torch 2.13 refuses
# (pyproject.toml), so it is not in "frameworks" either.
UNLOCKED_EXTRAS = {"horovod"}
# The platform scripts/lock resolves for (markers are evaluated there).
TARGET = {
    "python_version": "3.11",
    "python_full_version": "3.11.0",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
}

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")
HASH = re.compile(r"--hash=sha256:[0-9a-f]{64}")


def read_lock(name: str) -> dict[str, tuple[Version, int]]:
    """Each pinned package's version and how many hashes it has: a requirement starts at column 0,
    its `--hash` options follow on continuation lines."""
    pins: dict[str, tuple[Version, int]] = {}
    current = None
    for line in (LOCKS / f"{name}.txt").read_text().splitlines():
        if match := PIN.match(line):
            current = canonicalize_name(match[1])
            assert current not in pins, f"{name}.txt pins {current} twice"
            pins[current] = (Version(match[2]), 0)
        elif current and (hashes := HASH.findall(line)):
            version, count = pins[current]
            pins[current] = (version, count + len(hashes))
        elif line.strip() and not line.lstrip().startswith("#"):
            pytest.fail(f"{name}.txt: a line that is neither a pin, a hash nor a comment: {line!r}")
    return pins


def declared(extras: list[str]) -> list[Requirement]:
    """The project's requirements with these extras, its own extras (trainmaster[otel]) expanded,
    for the target platform."""
    own = canonicalize_name(PROJECT["name"])
    found: list[Requirement] = []
    seen: set[str] = set()

    def add(spec: str, extra: str) -> None:
        requirement = Requirement(spec)
        if requirement.marker and not requirement.marker.evaluate({**TARGET, "extra": extra}):
            return
        if canonicalize_name(requirement.name) == own:
            for inner in sorted(requirement.extras):
                expand(inner)
        else:
            found.append(requirement)

    def expand(extra: str) -> None:
        if extra in seen:
            return
        seen.add(extra)
        for spec in PROJECT["optional-dependencies"][extra]:
            add(spec, extra)

    for spec in PROJECT["dependencies"]:
        add(spec, "")
    for extra in extras:
        expand(extra)
    return found


def locked_inputs() -> list[Requirement]:
    """What scripts/lock adds to every lock: requirements/lock.in and the build backend."""
    lines = (LOCKS / "lock.in").read_text().splitlines()
    specs = [line.split("#")[0].strip() for line in lines]
    build = PYPROJECT["build-system"]["requires"]
    return [Requirement(spec) for spec in specs + build if spec]


@pytest.mark.parametrize("lock", sorted(LOCK_EXTRAS))
def test_every_declared_dependency_is_pinned_within_its_range(lock: str) -> None:
    pins = read_lock(lock)
    problems = []
    for requirement in declared(LOCK_EXTRAS[lock]) + locked_inputs():
        name = canonicalize_name(requirement.name)
        if name not in pins:
            problems.append(f"{requirement} is not in {lock}.txt")
        elif not requirement.specifier.contains(pins[name][0], prereleases=True):
            problems.append(f"{lock}.txt pins {name}=={pins[name][0]}, outside {requirement}")
    assert not problems, "run scripts/lock:\n" + "\n".join(problems)


@pytest.mark.parametrize("lock", [*sorted(LOCK_EXTRAS), "uv"])
def test_every_pin_has_a_hash(lock: str) -> None:
    pins = read_lock(lock)
    assert pins
    assert [name for name, (_, hashes) in pins.items() if hashes == 0] == []


def test_every_extra_is_in_a_lock_or_named_unlocked() -> None:
    locked = {str(r) for extras in LOCK_EXTRAS.values() for r in declared(extras)}
    missing = [
        extra
        for extra in sorted(set(PROJECT["optional-dependencies"]) - UNLOCKED_EXTRAS)
        if not {str(r) for r in declared([extra])} <= locked
    ]
    assert not missing, f"extras in no lock (add them to LOCK_EXTRAS and scripts/lock): {missing}"


def test_demo_has_the_versions_test_has() -> None:
    demo, test = read_lock("demo"), read_lock("test")
    assert set(demo) <= set(test)
    assert {name: version for name, (version, _) in demo.items() if test[name][0] != version} == {}
