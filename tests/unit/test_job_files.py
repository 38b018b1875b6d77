"""Job files (YAML or JSON JobSpec fields plus working_dir), command-line overrides, `get -o yaml`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from trainmaster import jobfile
from trainmaster.jobfile import JobFileError, dump, load, overridden, validated
from trainmaster.models import JobSpec

JOB_YAML = """\
name: mnist
entrypoint: script:train.py
args: ["--epochs", "3"]
working_dir: ../project
scaling:
  num_workers: 4
  resources_per_worker: {CPU: 2}
env: {NCCL_DEBUG: INFO}
labels: {team: vision}
timeout_s: 3600
"""


def test_yaml_file_reads_its_fields_and_working_dir_relative_to_the_file(tmp_path: Path) -> None:
    (tmp_path / "jobs").mkdir()
    path = tmp_path / "jobs" / "job.yaml"
    path.write_text(JOB_YAML)
    loaded = load(path)
    assert loaded.working_dir == (tmp_path / "project").resolve()
    assert "working_dir" not in loaded.body
    spec = validated(loaded.body)
    assert spec.scaling.num_workers == 4 and spec.scaling.resources_per_worker == {"CPU": 2}
    assert spec.args == ["--epochs", "3"] and spec.timeout_s == 3600


def test_json_file_reads_the_same(tmp_path: Path) -> None:
    path = tmp_path / "job.json"
    path.write_text(json.dumps(yaml.safe_load(JOB_YAML)))
    assert load(path).body == load(_write(tmp_path / "job.yaml", JOB_YAML)).body


def test_command_line_options_override_the_file_and_merge_maps(tmp_path: Path) -> None:
    body = load(_write(tmp_path / "job.yaml", JOB_YAML)).body
    result = overridden(
        body,
        workers=8,
        gpus_per_worker=0.5,
        args=["--epochs", "9"],
        env=["NCCL_SOCKET_IFNAME=eth0"],
        labels=["team=speech", "owner=ana"],
        timeout=60,
        name="mnist-big",
    )
    spec = validated(result)
    assert spec.name == "mnist-big" and spec.args == ["--epochs", "9"] and spec.timeout_s == 60
    assert spec.scaling.num_workers == 8 and spec.scaling.use_gpu
    assert spec.scaling.resources_per_worker == {"CPU": 2, "GPU": 0.5}  # the file's CPU stays
    assert spec.env == {"NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "eth0"}
    assert spec.labels == {"team": "speech", "owner": "ana"}
    assert body["scaling"]["num_workers"] == 4, "the file's dict was changed"


def test_options_alone_make_a_spec_and_name_defaults_to_the_entrypoint() -> None:
    spec = validated(overridden({}, entrypoint="script:sub/train.py", workers=2, cpus_per_worker=1))
    assert spec.name == "sub/train.py" and spec.scaling.num_workers == 2
    assert spec.scaling.resources_per_worker == {"CPU": 1} and not spec.scaling.use_gpu


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("name: x\nentrypoint: [unclosed\n", "not valid YAML"),
        ("- just\n- a list\n", "must hold a mapping"),
        ("name: x\nentrypoint: script:t.py\nworkers: 2\n", "workers: Extra inputs are not permitted"),
        ("name: x\nentrypoint: script:t.py\nscaling: {num_workers: 0}\n", "scaling.num_workers"),
        ("name: x\nentrypoint: script:t.py\nworking_dir: .\ncode: sha256:" + "0" * 64 + "\n", "not both"),
        ("name: x\n", "no entrypoint"),
    ],
)
def test_bad_files_say_which_field_and_why(tmp_path: Path, text: str, words: str) -> None:
    path = _write(tmp_path / "job.yaml", text)
    with pytest.raises(JobFileError, match=words.replace("[", r"\[")):
        loaded = load(path)
        validated(overridden(loaded.body), str(path))


def test_bad_option_values_are_named() -> None:
    with pytest.raises(JobFileError, match="--env expects KEY=VALUE"):
        overridden({"entrypoint": "builtin:mlp"}, env=["NOEQUALS"])
    with pytest.raises(JobFileError, match="--config is not JSON"):
        overridden({"entrypoint": "builtin:mlp"}, config="{nope")


def test_get_o_yaml_round_trips_to_the_same_spec(tmp_path: Path) -> None:
    spec = JobSpec.model_validate(
        {
            "name": "sweep-me",
            "entrypoint": "script:train.py",
            "args": ["--lr", "0.1"],
            "config": {"nested": {"list": [1, 2.5, "x"], "flag": True}},
            "code": "sha256:" + "a" * 64,
            "scaling": {"num_workers": 3, "use_gpu": True, "resources_per_worker": {"GPU": 0.5, "CPU": 4}},
            "framework": "torch",
            "backend": "nccl",
            "env": {"A": "1", "ON": "yes"},  # yes would be a bool in YAML unless quoted
            "pip": ["numpy==2.0"],
            "max_retries": 2,
            "timeout_s": 90.5,
            "priority": -3,
            "labels": {"team": "x"},
            "checkpoint": {"num_to_keep": 2},
        }
    )
    text = dump(spec.model_dump(mode="json"))
    assert "working_dir" not in text and "placement_strategy" not in text  # defaults left out
    path = _write(tmp_path / "again.yaml", text)
    again = validated(overridden(load(path).body))
    assert again == spec
    assert JobSpec.model_validate_json(dump(spec, "json")) == spec


def test_dump_of_a_minimal_spec_is_short() -> None:
    assert dump({"name": "m", "entrypoint": "builtin:mlp"}) == "name: m\nentrypoint: builtin:mlp\n"


def test_missing_file_is_an_error_not_a_traceback(tmp_path: Path) -> None:
    with pytest.raises(JobFileError, match="cannot read job file"):
        jobfile.load(tmp_path / "nope.yaml")


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path
