"""bench/simulate.py, small: the simulated day runs the production rules end to end, and what it
measures holds together (the figures at scale are in bench/README.md)."""

from __future__ import annotations

import argparse
import importlib.util
import random
import sys
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

from api.dispatcher.placement import Node
from api.dispatcher.quotas import Standing
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
    args = argparse.Namespace(jobs=600, nodes=20, projects=20, cohorts=2, seed=28, split_runs=1)
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
    listed = fairness["outside_5pct_projects"]
    assert len(listed) == sum(fairness["outside_5pct"].values())
    assert all(abs(row["deviation"]) > 0.05 and row["kind"] in fairness["outside_5pct"] for row in listed)
    # Each job admitted is counted once however often it was preempted and resumed.
    assert len(simulation.waits) == len(simulation.admitted) == result["admitted"] > 0
    # Every gang still running holds its nodes: what the nodes lack is exactly what the running hold.
    taken = sum(node.total["GPU"] - node.free["GPU"] for node in simulation.nodes)
    assert abs(taken - sum(live.job.gang_gpus for live in simulation.live.values())) < 1e-6
    assert abs(simulation.held["GPU"] - taken) < 1e-6


def test_split_runs_keeps_the_demand_and_the_gangs_in_shorter_runs() -> None:
    simulate = load()
    whole_args = argparse.Namespace(jobs=300, nodes=20, projects=20, cohorts=2, seed=7, split_runs=1)
    split_args = argparse.Namespace(**{**vars(whole_args), "split_runs": 3})
    _, _, whole = simulate.build(whole_args, random.Random(7))
    _, _, split = simulate.build(split_args, random.Random(7))
    assert len(split) == 3 * len(whole)
    assert len({job.id for job in split}) == len(split)

    def demand(jobs: list[Any]) -> dict[Any, float]:
        out: dict[Any, float] = {}
        for job in jobs:
            out[job.project_id] = out.get(job.project_id, 0.0) + job.gang_gpus * job.duration_s
        return out

    assert demand(split).keys() == demand(whole).keys()
    assert all(abs(demand(split)[p] - demand(whole)[p]) < 1e-6 * demand(whole)[p] for p in demand(whole))
    assert max(job.duration_s for job in split) <= max(job.duration_s for job in whole) / 3 + 1e-6


def test_a_batch_gives_each_job_its_projects_share_with_the_gangs_of_its_project_before_it() -> None:
    """DRF's progressive filling, as lock_queued orders production's batch."""
    simulate = load()
    nodes = [Node(f"{i:08x}", {"CPU": 64, "GPU": 8}, {"CPU": 64, "GPU": 8}, labels={}) for i in range(2)]
    alpha, beta = uuid.UUID(int=1), uuid.UUID(int=2)
    projects = {pid: Standing(name, {}, None, None, None) for pid, name in ((alpha, "alpha"), (beta, "beta"))}
    start = simulate.START
    jobs = [
        simulate.SimJob(
            uuid.UUID(int=10 * n + p), pid, {}, 0, 4.0, 1.0, start + timedelta(seconds=n), 0.0, None, None, 60
        )
        for n in range(3)
        for p, pid in ((1, alpha), (2, beta))
    ]
    sim = simulate.Simulation(nodes, projects, jobs, Settings())
    sim.history[beta]["GPU"] = 0.1  # alpha holds nothing and has no history: it goes first
    batch = sim.batch(set())
    # Each 1-GPU gang adds 1/16 to its project's share: alpha 0, 0.0625, 0.125 against beta 0.1, 0.1625, ...
    # (with the project's share alone, all of alpha's jobs came first).
    assert [f"{projects[job.project_id].name}{job.created_at.second}" for job in batch] == [
        "alpha0", "alpha1", "beta0", "alpha2", "beta1", "beta2"
    ]  # fmt: skip
    assert [round(job.share, 4) for job in batch] == [0.0, 0.0625, 0.1, 0.125, 0.1625, 0.225]


def test_a_preempted_job_queued_again_keeps_its_place_in_its_projects_order() -> None:
    simulate = load()
    start, pid = simulate.START, uuid.UUID(int=1)
    nodes = [Node("00000000", {"CPU": 64, "GPU": 8}, {"CPU": 64, "GPU": 8}, labels={})]
    jobs = [
        simulate.SimJob(uuid.UUID(int=n + 1), pid, {}, 0, 4.0, 1.0, start + timedelta(seconds=n), 0.0, None, None, 60)
        for n in range(3)
    ]
    sim = simulate.Simulation(nodes, {pid: Standing("alpha", {}, None, None, None)}, jobs, Settings())
    first = jobs[0]
    sim.admitted.add(first.id)  # admitted (with the share of its batch), preempted, and queued again
    sim.returned[pid][first.id] = first._replace(share=0.4, duration_s=30)
    assert [job.id for job in sim.pending(pid)] == [job.id for job in jobs]
