"""bench/simulate.py, small: the simulated day runs the production rules end to end, and what it
measures holds together (the figures at scale are in bench/README.md)."""

from __future__ import annotations

import argparse
import importlib.util
import random
import sys
from pathlib import Path
from typing import Any

from api.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def load() -> Any:
    spec = importlib.util.spec_from_file_location("simulate", ROOT / "bench" / "simulate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["simulate"] = module
    spec.loader.exec_module(module)
    return module


def test_a_small_day_keeps_every_project_within_quota_and_borrowing_and_preempts_for_fair_share() -> None:
    simulate = load()
    args = argparse.Namespace(jobs=600, nodes=20, projects=20, cohorts=2, seed=28)
    nodes, projects, jobs = simulate.build(args, random.Random(args.seed))
    over: list[str] = []

    class Checked(simulate.Simulation):  # type: ignore[name-defined]
        def round(self, now_s: int) -> int:
            admitted = super().round(now_s)
            for standing in self.projects.values():
                most = standing.quota["GPU"] + standing.borrowing_limit["GPU"]
                if standing.used("GPU") > most + 1e-6:
                    over.append(f"{standing.name} holds {standing.used('GPU')} > {most} at {now_s} s")
            return admitted

    simulation = Checked(nodes, projects, jobs, Settings(fair_share_preemption=True))
    simulation.run()
    result = simulate.report(args, simulation)
    assert over == []
    assert result["preempted"]["fair_share"] > 0
    fairness = result["fairness"]
    assert sum(fairness["outside_5pct"].values()) == fairness["projects"] - fairness["projects_within_5pct"]
    # Each job admitted is counted once however often it was preempted and resumed.
    assert len(simulation.waits) == len(simulation.admitted) == result["admitted"] > 0
    # Every gang still running holds its nodes: what the nodes lack is exactly what the running hold.
    taken = sum(node.total["GPU"] - node.free["GPU"] for node in simulation.nodes)
    assert abs(taken - sum(live.job.gang_gpus for live in simulation.live.values())) < 1e-6
    assert abs(simulation.held["GPU"] - taken) < 1e-6
