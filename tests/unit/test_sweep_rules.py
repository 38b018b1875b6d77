"""Sweep sampling and early-stopping rules: pure functions, checked against their definitions."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from api.sweeps.early_stopping import Rule
from api.sweeps.sampling import grid_point, grid_size, trial_params
from trainmaster.models import SweepParameter
from workers.templates.toy_curve import toy_loss


def params(**specs: dict[str, object]) -> dict[str, SweepParameter]:
    return {name: SweepParameter.model_validate(spec) for name, spec in specs.items()}


def test_grid_points_follow_itertools_product_order() -> None:
    grid = params(a={"values": [1, 2, 3]}, b={"values": ["x", "y"]}, c={"values": [True, False]})
    names = list(grid)
    expected = [
        dict(zip(names, combo, strict=True)) for combo in itertools.product([1, 2, 3], ["x", "y"], [True, False])
    ]
    assert grid_size(grid) == 12
    assert [grid_point(grid, names, n) for n in range(12)] == expected


def test_random_points_depend_only_on_seed_and_trial_number() -> None:
    space = params(lr={"log_uniform": [1e-5, 1.0]}, p={"uniform": [0, 1]}, h={"values": [1, 2]})
    names = list(space)
    first = [trial_params(space, names, 11, n) for n in range(50)]
    assert first == [trial_params(space, names, 11, n) for n in range(50)]
    assert first != [trial_params(space, names, 12, n) for n in range(50)]
    lrs = np.log10([point["lr"] for point in first])
    assert lrs.min() >= -5 and lrs.max() <= 0 and (lrs < -2.5).any() and (lrs > -2.5).any()


@pytest.mark.parametrize("mode", ["min", "max"])
@pytest.mark.parametrize("rf", [2, 3, 4])
def test_asha_cutoff_is_ray_tunes_percentile(mode: str, rf: int) -> None:
    """Ray Tune's ASHA keeps a trial when its reward is at least np.nanpercentile(rewards, (1 - 1/rf) * 100),
    rewards being the metric (max) or its negation (min)."""
    rule = Rule("asha", 1, rf, mode, "loss")
    values = [0.3, 0.9, 0.1, 0.5, 0.7, 0.2, 0.8]
    for count in range(1, len(values) + 1):
        seen = values[:count]
        rewards = np.array(seen) * (1 if mode == "max" else -1)
        ray_cutoff = float(np.nanpercentile(rewards, (1 - 1 / rf) * 100)) * (1 if mode == "max" else -1)
        assert rule.asha_cutoff(seen) == pytest.approx(ray_cutoff)


def test_milestones_and_recording_first_value_at_or_past_each() -> None:
    asha = Rule("asha", 2, 3, "min", "loss")
    assert asha.milestones_up_to(1) == [] and asha.milestones_up_to(20) == [2, 6, 18]
    assert Rule("median", 5, 3, "min", "loss").milestones_up_to(17) == [5, 10, 15]
    assert Rule("none", 1, 3, "min", "loss").milestones_up_to(100) == []
    recorded: dict[str, float | None] = {}
    assert asha.record(recorded, [(1, 0.9), (3, 0.7), (7, float("nan"))]) == [2, 6]
    assert recorded == {"2": 0.7, "6": None}
    assert asha.record(recorded, [(8, 0.1)]) == []


def test_asha_keeps_the_first_trial_at_a_rung_and_judges_later_ones() -> None:
    rule = Rule("asha", 2, 3, "min", "loss")
    assert rule.judge(2, 0.8, []) is None
    assert rule.judge(2, 0.8, [0.5]) is not None
    assert rule.judge(2, 0.5, [0.8]) is None


def test_toy_objective_is_deterministic_and_rewards_the_middle_learning_rate() -> None:
    assert toy_loss(1e-3, 64, 0.1, 10) == toy_loss(1e-3, 64, 0.1, 10)
    assert toy_loss(3e-3, 128, 0.2, 36) < toy_loss(1e-1, 128, 0.2, 36)
    assert toy_loss(3e-3, 128, 0.2, 36) < toy_loss(1e-4, 128, 0.2, 36)
    assert toy_loss(3e-3, 128, 0.2, 36) < toy_loss(3e-3, 128, 0.2, 4)


def test_cli_param_shorthand() -> None:
    from trainmaster.cli.sweep import parse_param

    assert parse_param("lr=log_uniform:1e-4:0.1") == ("lr", {"log_uniform": [1e-4, 0.1]})
    assert parse_param("p=uniform:0:0.5") == ("p", {"uniform": [0.0, 0.5]})
    assert parse_param("hidden=32,64") == ("hidden", {"values": [32, 64]})
    assert parse_param("act=relu,gelu") == ("act", {"values": ["relu", "gelu"]})
    with pytest.raises(ValueError, match="NAME=SPEC"):
        parse_param("lr")


def test_toy_objective_is_the_same_for_integer_and_float_parameters() -> None:
    assert toy_loss(1e-3, 128, 0, 7) == toy_loss(1e-3, 128.0, 0.0, 7)
