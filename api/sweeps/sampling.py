"""Which parameters trial n gets: a point of the grid, or a seeded random sample.

Both are pure functions of the sweep and n, so a controller that restarts (or another one that takes
over) gives trial n exactly the parameters it would have had.
"""

from __future__ import annotations

import math
import random
from typing import Any

from trainmaster.models import SweepParameter


def grid_size(parameters: dict[str, SweepParameter]) -> int:
    return math.prod(len(p.values or ()) for p in parameters.values())


def grid_point(parameters: dict[str, SweepParameter], names: list[str], n: int) -> dict[str, Any]:
    """Point n of the grid in mixed radix, the last parameter varying fastest (as itertools.product)."""
    point: dict[str, Any] = {}
    for name in reversed(names):
        values = parameters[name].values or []
        n, index = divmod(n, len(values))
        point[name] = values[index]
    return {name: point[name] for name in names}


def random_point(parameters: dict[str, SweepParameter], names: list[str], seed: int, n: int) -> dict[str, Any]:
    rng = random.Random(f"{seed}:{n}")
    point: dict[str, Any] = {}
    for name in names:
        parameter = parameters[name]
        if parameter.values is not None:
            point[name] = rng.choice(parameter.values)
        elif parameter.uniform is not None:
            point[name] = rng.uniform(*parameter.uniform)
        else:
            assert parameter.log_uniform is not None
            low, high = parameter.log_uniform
            point[name] = math.exp(rng.uniform(math.log(low), math.log(high)))
    return point


def trial_params(parameters: dict[str, SweepParameter], names: list[str], seed: int, n: int) -> dict[str, Any]:
    """`values` alone everywhere means a grid; any range means every parameter is sampled."""
    if all(parameters[name].values is not None for name in names):
        return grid_point(parameters, names, n)
    return random_point(parameters, names, seed, n)
