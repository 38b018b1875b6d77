"""builtin:toy-curve — a deterministic noisy learning curve for sweeps, without any real training.

`toy_loss(lr, hidden, dropout, step)` is a pure function: the same parameters and step always give the
same value, so a sweep run through trainmaster, a Ray Tune run and a computed grid all see one objective.
The loss falls from 2.0 towards a floor set by the parameters (best near lr 3e-3, hidden 128, dropout
0.2); a larger learning rate approaches its floor faster, so early leaders are not always the final
winners, as in real training.

Config: lr (1e-2), hidden (64), dropout (0.1), steps (36), step_s (0.1: time per step), noise (0.005).
Every step calls `trainmaster.log({"loss": ...}, step=step)`, steps counted from 1.
"""

from __future__ import annotations

import math
import random
import time
from typing import Any

import trainmaster

INITIAL_LOSS = 2.0
DEFAULTS = {"lr": 1e-2, "hidden": 64.0, "dropout": 0.1}


def toy_loss(lr: float, hidden: float, dropout: float, step: int, noise: float = 0.005) -> float:
    distance = math.log10(lr) - math.log10(3e-3)
    floor = 0.05 + 0.08 * distance**2 + 0.03 * math.log2(256 / hidden) + 0.4 * (dropout - 0.2) ** 2
    rate = 0.2 * (lr / 3e-3) ** 0.1 * (1 - 0.2 * dropout)
    clean = floor + (INITIAL_LOSS - floor) * math.exp(-rate * step)
    # Seeded by the values as floats, so hidden=128 (JSON integer) and hidden=128.0 give one curve.
    jitter = random.Random(f"{float(lr)!r}:{float(hidden)!r}:{float(dropout)!r}:{step}").gauss(0.0, 1.0)
    return clean + noise * jitter


def train_loop_per_worker(config: dict[str, Any]) -> None:
    lr, hidden, dropout = (float(config.get(key, default)) for key, default in DEFAULTS.items())
    steps, step_s = int(config.get("steps", 36)), float(config.get("step_s", 0.1))
    noise = float(config.get("noise", 0.005))
    for step in range(1, steps + 1):
        time.sleep(step_s)
        trainmaster.log({"loss": toy_loss(lr, hidden, dropout, step, noise)}, step=step)
