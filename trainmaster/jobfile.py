"""Job files: a JobSpec's fields as YAML or JSON, plus `working_dir` (relative to the file).

`trainmaster submit -f job.yaml` and `trainmaster run -f job.yaml` read them; options given on the
command line override the file's values (`overridden`); `trainmaster get ID -o yaml` writes one that
submits the same job again (`dump`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from trainmaster.models import JobSpec


class JobFileError(ValueError):
    """A job file or option that cannot make a JobSpec; the message says which field and why."""


@dataclass(frozen=True)
class JobFile:
    body: dict[str, Any]  # the JobSpec's fields as written
    working_dir: Path | None  # resolved against the file's folder


def load(path: Path) -> JobFile:
    """Read `path` (JSON when it ends in .json, YAML otherwise: YAML also reads JSON)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise JobFileError(f"cannot read job file {path}: {exc.strerror or exc}") from None
    is_json = path.suffix.lower() == ".json"
    try:
        data = json.loads(text) if is_json else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise JobFileError(f"{path} is not valid {'JSON' if is_json else 'YAML'}: {exc}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise JobFileError(f"{path} must hold a mapping of JobSpec fields (name, entrypoint, scaling, …)")
    body = dict(data)
    working_dir = body.pop("working_dir", None)
    if working_dir is None:
        return JobFile(body=body, working_dir=None)
    if not isinstance(working_dir, str) or not working_dir:
        raise JobFileError(f"{path}: working_dir must be a folder path (relative to the file)")
    if "code" in body:
        raise JobFileError(f"{path}: give working_dir or code, not both (working_dir is uploaded as the code)")
    return JobFile(body=body, working_dir=(path.parent / working_dir).resolve())


def parse_pairs(items: list[str], option: str) -> dict[str, str]:
    pairs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise JobFileError(f"{option} expects KEY=VALUE, got {item!r}")
        pairs[key] = value
    return pairs


def overridden(
    body: dict[str, Any],
    *,
    entrypoint: str | None = None,
    name: str | None = None,
    workers: int | None = None,
    gpu: bool = False,
    gpus_per_worker: float | None = None,
    cpus_per_worker: float | None = None,
    framework: str | None = None,
    config: str | None = None,
    args: list[str] | None = None,
    labels: list[str] = [],  # noqa: B006 - read only
    env: list[str] = [],  # noqa: B006 - read only
    priority: int | None = None,
    max_retries: int | None = None,
    timeout: float | None = None,
) -> dict[str, Any]:
    """A copy of `body` with the command line's options over it: given options win, the file keeps the
    rest (labels and env are merged key by key). The name defaults to the entrypoint's last part."""
    result = json.loads(json.dumps(body))  # a deep copy that the caller's dict never sees changed
    if entrypoint:
        result["entrypoint"] = entrypoint
    if "entrypoint" not in result:
        raise JobFileError("no entrypoint: give one (script:train.py, pkg.module:fn, builtin:NAME) or put it in a file")
    if name:
        result["name"] = name
    result.setdefault("name", str(result["entrypoint"]).split(":")[-1][:128])
    scaling = result.setdefault("scaling", {})
    if not isinstance(scaling, dict):
        raise JobFileError("scaling must be a mapping (num_workers, use_gpu, resources_per_worker, …)")
    if workers is not None:
        scaling["num_workers"] = workers
    if gpu:
        scaling["use_gpu"] = True
    for resource, amount in (("GPU", gpus_per_worker), ("CPU", cpus_per_worker)):
        if amount is not None:
            scaling["resources_per_worker"] = {**(scaling.get("resources_per_worker") or {}), resource: amount}
    if gpus_per_worker is not None:
        scaling["use_gpu"] = gpus_per_worker > 0
    if config:
        try:
            result["config"] = json.loads(config)
        except ValueError as exc:
            raise JobFileError(f"--config is not JSON: {exc}") from None
    if args:
        result["args"] = list(args)
    if labels:
        result["labels"] = {**(result.get("labels") or {}), **parse_pairs(labels, "--label")}
    if env:
        result["env"] = {**(result.get("env") or {}), **parse_pairs(env, "--env")}
    for key, value in (("framework", framework), ("priority", priority), ("max_retries", max_retries)):
        if value is not None:
            result[key] = value
    if timeout is not None:
        result["timeout_s"] = timeout
    return result


def validated(body: dict[str, Any], source: str = "job spec") -> JobSpec:
    """The JobSpec `body` makes, or a JobFileError naming every bad field (`scaling.num_workers: …`)."""
    try:
        return JobSpec.model_validate(body)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(top)'}: {e['msg']}" for e in exc.errors())
        raise JobFileError(f"invalid {source}: {problems}") from None


def dump(spec: JobSpec | dict[str, Any], output: str = "yaml") -> str:
    """A job file for `spec`: fields at their defaults left out, so it reads like one a person wrote and
    `submit -f` of it makes the same JobSpec again (the code package by its id)."""
    fields = JobSpec.model_validate(spec).model_dump(mode="json", exclude_defaults=True)
    if output == "json":
        return json.dumps(fields, indent=2) + "\n"
    return yaml.safe_dump(fields, sort_keys=False, allow_unicode=True)
