"""The driver leaves out Ray Train's controller callbacks that only start actors a trainmaster job does
not use (workers/driver.py `without_idle_actors`): the Ray Data manager when the run has no Ray
Datasets, and the detached placement-group cleaner. Read off Ray's own trainer, so a Ray release that
renames them fails here, not silently in every job."""

from __future__ import annotations

from typing import Any

import pytest

from workers.driver import IDLE_ACTOR_CALLBACKS, without_idle_actors


def names(trainer: Any) -> list[str]:
    return [type(callback).__name__ for callback in trainer._create_default_callbacks()]


@pytest.mark.parametrize("datasets", [None, {"train": lambda: None}])
def test_the_idle_actors_callbacks_are_left_out_and_the_rest_kept_in_order(tmp_path: Any, datasets: Any) -> None:
    from ray.train import RunConfig, ScalingConfig
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    def make() -> Any:
        return DataParallelTrainer(
            lambda: None,
            scaling_config=ScalingConfig(num_workers=1),
            run_config=RunConfig(name="job", storage_path=str(tmp_path)),
            datasets=datasets,
        )

    ray_default = names(make())
    assert set(IDLE_ACTOR_CALLBACKS) <= set(ray_default)  # still Ray's names for them
    lean = names(without_idle_actors(make()))
    kept = {"DatasetsCallback"} if datasets else set()
    assert lean == [name for name in ray_default if name not in set(IDLE_ACTOR_CALLBACKS) - kept]
    assert "UserCallbackHandler" in lean and "BackendSetupCallback" in lean


def test_a_trainer_without_the_hook_is_left_as_it_is() -> None:
    other = object()
    assert without_idle_actors(other) is other
