"""Admission at an organisation's scale, simulated: the production decision function
(api/dispatcher/decide.py `decide`, with placement.py, quotas.py and victims.py under it, unchanged)
admits from a simulated queue onto a simulated cluster over a simulated day.

The day (defaults): 2,000 projects in 50 cohorts, each a nominal quota of an equal part of the cluster,
a borrowing limit of 4x it, every tenth a lending limit of 3/4 of it; 10,000 nodes (8 GPUs, 64 CPUs) in
racks of 100 (label `rack`); 100,000 jobs queued over the hour before the day, demand skewed 1/k within
each cohort, gangs of 1 to 32 workers of (1 GPU, 4 CPUs), one in ten of 4+ workers `topology: required
rack` and one in ten `preferred rack`, lognormal run times (mean about 3 h, at most 8 h): about 1.2x what
the cluster can run in the day. Every job has priority 0; nothing is written to a database or launched.

Production code: `decide` on a fresh `ClusterCapacity` and `Book` each round, fair share by
`api.queues.order.dominant_share` and `decide.decayed` sampled every `fair_share_sample_s`, further
batches while `decide.read_on` says so, the batch by `api.queues.order.progressive_batch` (the order the
claim takes: DRF's progressive filling), and the room for waiting gangs by `api.dispatcher.room.choose`
over the running gangs, each of which checkpoints every `checkpoint_s`. Victims stop after the grace
period with their work saved and queue again for the rest of their run, paying `restart_s`.

Timed: `decide` alone per round (wall and thread CPU). The dispatcher
freezes its start-up heap and never holds the simulated world (PostgreSQL and Ray do), so the simulation
puts its world out of the collector's reach between rounds, untimed. Fairness: each project's
GPU-seconds within the day against its DRF entitlement (its cohort's delivered GPU-seconds water-filled
over the projects' demand, each capped at quota plus borrowing limit). `--split-runs K` makes each run K
jobs of a K-th the length: the same demand, less cut by the day's end.

    .venv/bin/python bench/simulate.py [--jobs 100000] [--nodes 10000] [--projects 2000] [--split-runs K]
        [--set fair_share_preemption=true starvation_s=0 ...]
"""

from __future__ import annotations

import argparse
import gc
import heapq
import itertools
import random
import sys
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent))  # harness, also when a test imports this file

from harness import parse_args, percentile, run

from api.dispatcher import room
from api.dispatcher.decide import ROUND_BATCHES, Verdict, decayed, decide, read_on, seen
from api.dispatcher.placement import ClusterCapacity, Node
from api.dispatcher.quotas import Book, Standing
from api.dispatcher.room import Active
from api.ops.heap import freeze_startup_heap
from api.queues.order import dominant_share, progressive_batch
from api.settings import Settings

DAY_S, TICK_S, GPUS, CPUS, RACK = 86_400, 30, 8, 64, 100
START = datetime(2026, 1, 1, tzinfo=UTC)


class SimJob(NamedTuple):
    """A queued job as `decide` reads it (the fields of repository.QueuedJob it uses)."""

    id: uuid.UUID
    project_id: uuid.UUID
    spec: dict[str, Any]
    priority: int
    gang_cpus: float
    gang_gpus: float
    created_at: datetime
    share: float
    infeasible_since: datetime | None
    bypassed_since: datetime | None
    duration_s: float


def build(args: argparse.Namespace, rng: random.Random) -> tuple[list[Node], dict[uuid.UUID, Standing], list[SimJob]]:
    nodes = [
        Node(f"{i:08x}", {"CPU": CPUS, "GPU": GPUS}, {"CPU": CPUS, "GPU": GPUS}, labels={"rack": f"r{i // RACK}"})
        for i in range(args.nodes)
    ]
    per = args.projects // args.cohorts
    gpu_quota, cpu_quota = args.nodes * GPUS / args.projects, args.nodes * CPUS / args.projects
    projects, weights = {}, []
    for p in range(args.projects):
        lend = {"GPU": 0.75 * gpu_quota, "CPU": 0.75 * cpu_quota} if p % 10 == 9 else None
        borrow = {"GPU": 4 * gpu_quota, "CPU": 4 * cpu_quota}
        pid = uuid.UUID(int=p + 1)
        projects[pid] = Standing(f"p{p}", {"CPU": cpu_quota, "GPU": gpu_quota}, f"c{p // per}", borrow, lend)
        weights.append(1 / (p % per + 1))
    ids = list(projects)
    jobs: list[SimJob] = []
    for project_id in rng.choices(ids, weights, k=args.jobs):
        workers = rng.choice((1, 1, 2, 2, 4, 4, 8, 8, 16, 32))
        scaling: dict[str, Any] = {"num_workers": workers, "resources_per_worker": {"CPU": 4, "GPU": 1}}
        if workers >= 4 and (draw := rng.random()) < 0.2:
            scaling["topology"] = {"required" if draw < 0.1 else "preferred": "rack"}
        created = START - timedelta(seconds=rng.uniform(0, 3600))
        duration = min(8 * 3600, rng.lognormvariate(8.9, 0.9))
        job_id = uuid.UUID(int=rng.getrandbits(128))
        run = duration / args.split_runs
        job = SimJob(job_id, project_id, {"scaling": scaling}, 0, 4.0 * workers, workers, created, 0.0, None, None, run)
        # --split-runs K: the run is K jobs of the same gang, each a K-th of it (the same demand in shorter runs;
        # the same draws, so the same day otherwise).
        jobs.extend(job._replace(id=uuid.UUID(int=(job_id.int + part) % (1 << 128))) for part in range(args.split_runs))
    return nodes, projects, jobs


def water_fill(total: float, demands: list[float]) -> list[float]:
    """Max-min fair split of `total` over `demands` (each gets at most its demand)."""
    left, order, shares = total, sorted(range(len(demands)), key=lambda i: demands[i]), [0.0] * len(demands)
    for done, i in enumerate(order):
        shares[i] = min(demands[i], left / (len(order) - done))
        left -= shares[i]
    return shares


@dataclass
class Live:
    """A running gang: what it holds where, since when, and whether it was asked to go."""

    job: SimJob
    placement: dict[str, list[dict[str, float]]]
    start_s: float
    end_s: float
    restart_s: float  # spent starting again from its checkpoint, when it resumes a preempted run
    counted: float  # the GPU-seconds of work it was counted for within the day when admitted
    asked_for: uuid.UUID | None = None  # the waiting job it was preempted for


@dataclass
class Simulation:
    """What the simulated day holds between rounds: the nodes and standings `decide` changes, the
    queues, the running jobs (by end time), and what is measured."""

    nodes: list[Node]
    projects: dict[uuid.UUID, Standing]
    jobs: list[SimJob]
    settings: Settings = field(default_factory=Settings)
    queues: dict[uuid.UUID, list[SimJob]] = field(default_factory=dict)  # each in (priority, age) order
    heads: dict[uuid.UUID, int] = field(default_factory=dict)  # each queue's first job not yet admitted
    returned: dict[uuid.UUID, dict[uuid.UUID, SimJob]] = field(default_factory=dict)  # preempted, queued again
    admitted: set[uuid.UUID] = field(default_factory=set)
    history: dict[uuid.UUID, dict[str, float]] = field(default_factory=dict)  # decayed fair-share history
    covered: dict[uuid.UUID, float] = field(default_factory=dict)  # how much of a full history it covers
    running: list[tuple[float, int, Live]] = field(default_factory=list)  # by end time
    live: dict[uuid.UUID, Live] = field(default_factory=dict)
    held: dict[str, float] = field(default_factory=lambda: {"CPU": 0.0, "GPU": 0.0})
    gpu_seconds: dict[uuid.UUID, float] = field(default_factory=dict)  # within the day
    rounds_ms: list[float] = field(default_factory=list)
    cpu_ms: list[float] = field(default_factory=list)
    admits: list[int] = field(default_factory=list)
    waits: list[float] = field(default_factory=list)
    # Starvation: a job is bypassed when a later job of its project (in its admission order) is admitted
    # while it waits. Measured: from the first such admission to its own (or the day's end), and from
    # the first to the last (how long later jobs kept passing it: what `starvation_s` bounds).
    bypassed: dict[uuid.UUID, list[float]] = field(default_factory=dict)  # job id -> [first, last]
    passed_for_s: list[float] = field(default_factory=list)
    since: dict[uuid.UUID, datetime] = field(default_factory=dict)  # what the rounds record (jobs.bypassed_since)
    preempted: dict[str, int] = field(default_factory=lambda: {"reclaim": 0, "fair_share": 0})  # by Room.kind
    restart_s: float = 120.0  # what a preempted gang spends starting again, from its checkpoint
    checkpoint_s: float = 1800.0  # how often a running gang checkpoints (victims.py prefers the least work since)
    restart_gpu_s: float = 0.0
    room_ms: list[float] = field(default_factory=list)  # room.choose, per round that asked
    freeze_world: bool = False  # the world out of the collector's reach between rounds (main does)
    seq: itertools.count = field(default_factory=itertools.count)

    def __post_init__(self) -> None:
        self.capacity = {r: float(sum(n.total[r] for n in self.nodes)) for r in ("CPU", "GPU")}
        self.queues = {pid: [] for pid in self.projects}
        for job in sorted(self.jobs, key=in_project_order):
            self.queues[job.project_id].append(job)
        self.heads = dict.fromkeys(self.projects, 0)
        self.position = {job.id: at for queue in self.queues.values() for at, job in enumerate(queue)}
        self.returned = {pid: {} for pid in self.projects}
        for pid, standing in self.projects.items():
            standing.history = self.history[pid] = {"CPU": 0.0, "GPU": 0.0}
        self.gpu_seconds = dict.fromkeys(self.projects, 0.0)
        self.cohorts: dict[str | None, list[uuid.UUID]] = {}
        for pid, standing in self.projects.items():
            self.cohorts.setdefault(standing.cohort, []).append(pid)

    def run(self) -> None:
        sampled, ended, again = 0.0, True, False
        for now_s in range(0, DAY_S, TICK_S):
            while self.running and self.running[0][0] <= now_s:
                ended = self.end(heapq.heappop(self.running)[2], now_s) or ended
            if now_s - sampled >= self.settings.fair_share_sample_s:
                self.sample(now_s - sampled)
                sampled = now_s
            # A round when a job ended or the last one admitted; again at once while one admits a whole batch.
            while ended or again:
                ended, again = False, self.round(now_s) >= self.settings.admit_batch

    def end(self, live: Live, now_s: int) -> bool:
        """A gang ends or, preempted, stops (its work saved: it checkpointed when asked) and is queued
        again for the rest of its run: its bundles go back to their nodes, it leaves its project's usage."""
        if self.live.get(live.job.id) is not live or live.end_s > now_s:
            return False  # an entry left behind when its gang was preempted
        del self.live[live.job.id]
        job = live.job
        for node_id, bundles in live.placement.items():
            free = self.nodes[int(node_id, 16)].free
            for bundle in bundles:
                for name, amount in bundle.items():
                    free[name] += amount
        for name, amount in (("CPU", job.gang_cpus), ("GPU", job.gang_gpus)):
            self.projects[job.project_id].usage[name] -= amount
            self.held[name] -= amount
        if live.asked_for is not None and (done := max(0.0, now_s - live.start_s - live.restart_s)) < job.duration_s:
            self.gpu_seconds[job.project_id] -= live.counted - job.gang_gpus * done
            self.returned[job.project_id][job.id] = job._replace(duration_s=job.duration_s - done)
        return True

    def sample(self, elapsed_s: float) -> None:
        half_life = self.settings.fair_share_half_life_s
        for pid, standing in self.projects.items():
            history, weight = self.history[pid], self.covered.get(pid, 0.0)
            if weight == 0 and not any(standing.used(r) for r in ("CPU", "GPU")):
                continue  # as project_usage has no row for it until its first job starts
            for r in ("CPU", "GPU"):  # the same weight for both: it depends on time alone
                held = standing.used(r) / self.capacity[r]
                history[r], self.covered[pid] = decayed(history[r], weight, held, elapsed_s, half_life)

    def round(self, now_s: int) -> int:
        """One admission round: `decide` (timed) on a fresh ClusterCapacity and Book over the simulation's
        nodes and standings, then the admitted gangs run and room.choose makes room for the waiting ones
        that may, as the dispatcher's round does.
        Returns how many were admitted."""
        now = START + timedelta(seconds=now_s)
        cluster, book = ClusterCapacity(self.nodes), Book(self.projects)
        looked: set[uuid.UUID] = set()
        started: list[Any] = []
        waiting: list[Any] = []
        spent = spent_cpu = 0.0
        for _ in range(ROUND_BATCHES):  # as admission.admit_round reads the queue
            batch = self.batch(looked)
            began, cpu = time.perf_counter(), time.thread_time()
            decisions = decide(
                batch,
                cluster,
                book,
                self.held,
                now=now,
                starvation_s=self.settings.starvation_s,
                fair_share=self.settings.fair_share_preemption,
            )
            spent, spent_cpu = spent + time.perf_counter() - began, spent_cpu + time.thread_time() - cpu
            admitted = decisions.of(Verdict.admit)
            self.start(admitted, now, now_s)
            started += admitted
            waiting += decisions.of(Verdict.wait)
            looked |= seen(decisions)
            if not read_on(decisions, len(started), self.settings.admit_batch):
                break
        self.rounds_ms.append(spent * 1000)
        self.cpu_ms.append(spent_cpu * 1000)  # the round's thread CPU time: other processes' load adds none
        self.admits.append(len(started))
        for outcome in waiting:
            if outcome.bypassed:
                self.since.setdefault(outcome.job.id, now)
        self.make_room(waiting, book, cluster, now_s)
        if self.freeze_world:
            gc.freeze()  # the world as this round left it: not the dispatcher's heap (the module's docstring)
        return len(started)

    def start(self, started: list[Any], now: datetime, now_s: int) -> None:
        """The admitted gangs run: each holds its placement until it ends (or is preempted)."""
        self.admitted.update(outcome.job.id for outcome in started)  # a job admitted in this round is not passed
        for outcome in started:
            job = outcome.job
            restart = 0.0
            self.since.pop(job.id, None)
            if self.returned[job.project_id].pop(job.id, None) is None:
                self.waits.append((now - job.created_at).total_seconds())
                self.bypass(job, now_s)
            else:
                restart = self.restart_s
                self.restart_gpu_s += job.gang_gpus * restart
            self.held["CPU"] += job.gang_cpus
            self.held["GPU"] += job.gang_gpus
            counted = job.gang_gpus * max(0.0, min(job.duration_s, DAY_S - now_s - restart))
            live = Live(job, outcome.placement, now_s, now_s + restart + job.duration_s, restart, counted)
            self.live[job.id] = live
            heapq.heappush(self.running, (live.end_s, next(self.seq), live))
            self.gpu_seconds[job.project_id] += counted

    def bypass(self, job: SimJob, now_s: int) -> None:
        """`job` is admitted: it stops being bypassed, and every earlier job of its project still
        waiting is bypassed from now (if it was not already)."""
        if (span := self.bypassed.pop(job.id, None)) is not None:
            self.passed_for_s.append(span[1] - span[0])
        queue = self.queues[job.project_id]
        for earlier in itertools.islice(queue, self.heads[job.project_id], self.position[job.id]):
            if earlier.id not in self.admitted:
                self.bypassed.setdefault(earlier.id, [now_s, now_s])[1] = now_s

    def make_room(self, waiting: list[Any], book: Book, cluster: ClusterCapacity, now_s: int) -> None:
        """Production's room.choose over the running gangs (each checkpointing every `checkpoint_s`), in
        admission order; the chosen stop after the grace period."""
        if not any(o.preempt or o.reclaim or o.fair for o in waiting):
            return
        began, every, now = time.perf_counter(), self.checkpoint_s, START + timedelta(seconds=now_s)
        active = []
        for live in self.live.values():
            saved = int((now_s - live.start_s) // every)  # checkpoints written since it started
            active.append(
                Active(
                    id=live.job.id,
                    project_id=live.job.project_id,
                    project=self.projects[live.job.project_id].name,
                    priority=live.job.priority,
                    gang_cpus=live.job.gang_cpus,
                    gang_gpus=live.job.gang_gpus,
                    running=True,
                    spec=live.job.spec,
                    started_at=START + timedelta(seconds=live.start_s),
                    last_checkpoint_at=START + timedelta(seconds=live.start_s + saved * every) if saved else None,
                    preempted_by=live.asked_for,
                    preempt_requested_at=now if live.asked_for is not None else None,
                )
            )
        settings = self.settings
        rooms = room.choose_for(settings, waiting, active, cluster, book, now)
        stop_s = now_s + settings.preemption_grace_s
        for job_id, made in rooms.items():
            for victim in made.preempt:
                live = self.live[victim.id]
                live.asked_for, live.end_s = job_id, stop_s
                heapq.heappush(self.running, (stop_s, next(self.seq), live))
            if made.preempt:
                self.preempted[made.kind] = self.preempted.get(made.kind, 0) + len(made.preempt)
        self.room_ms.append((time.perf_counter() - began) * 1000)

    def batch(self, looked: set[uuid.UUID]) -> list[SimJob]:
        """The first `admit_batch` queued jobs, as the claim takes them (order.progressive_batch): each
        project's jobs come in (priority, age) order, its queue merged with its preempted jobs queued
        again."""

        def with_share(job: SimJob, ahead: Mapping[str, float]) -> SimJob:
            held = {r: self.projects[job.project_id].used(r) + ahead[r] for r in ahead}
            share = dominant_share(self.history[job.project_id], held, self.capacity)
            return job._replace(share=share, bypassed_since=self.since.get(job.id))

        heads = []
        for pid, queue in self.queues.items():
            if pid not in looked:
                self.heads[pid] = self.next_queued(queue, self.heads[pid])
                heads.append(self.pending(pid))
        return progressive_batch(heads, with_share, self.settings.admit_batch)

    def pending(self, pid: uuid.UUID) -> Iterator[SimJob]:
        """The project's queued jobs in (priority, age) order: its preempted jobs queued again merged
        with its queue from its head."""
        queue, admitted = self.queues[pid], self.admitted
        listed = (job for job in itertools.islice(queue, self.heads[pid], None) if job.id not in admitted)
        again = self.returned[pid]
        if not again:
            return listed
        return heapq.merge(sorted(again.values(), key=in_project_order), listed, key=in_project_order)

    def next_queued(self, queue: list[SimJob], at: int) -> int:
        while at < len(queue) and queue[at].id in self.admitted:
            at += 1
        return at


def in_project_order(job: SimJob) -> tuple[int, datetime, uuid.UUID]:
    """A project's queue order, as ix_jobs_queued_by_project holds it: priority, then age. A preempted job
    queued again keeps its age, so it goes before the project's later jobs."""
    return (-job.priority, job.created_at, job.id)


def spread(values: list[float]) -> dict[str, float]:
    return {"p50": percentile(values, 50), "p99": percentile(values, 99), "max": max(values, default=0.0)}


def report(args: argparse.Namespace, sim: Simulation) -> dict[str, Any]:
    projects, jobs, admitted, gpu_seconds = sim.projects, sim.jobs, sim.admitted, sim.gpu_seconds
    demand = dict.fromkeys(projects, 0.0)
    for job in jobs:
        demand[job.project_id] += job.gang_gpus * min(job.duration_s, DAY_S)
    past_midnight = dict.fromkeys(projects, 0.0)  # GPU-seconds of runs still going at the day's end
    for live in sim.live.values():
        if live.asked_for is None and live.end_s > DAY_S:  # not one that ended after the day's last tick
            past_midnight[live.job.project_id] += live.job.gang_gpus * min(live.job.duration_s, live.end_s - DAY_S)
    waiting = {j.project_id for j in jobs if j.id not in admitted}
    outside = {"above": 0, "below_with_jobs_waiting": 0, "below_every_job_admitted": 0}
    deviations, listed, short = [], [], set()
    for cohort in sorted({s.cohort for s in projects.values()}, key=str):
        members = [pid for pid, s in projects.items() if s.cohort == cohort]
        caps = [min(demand[p], (projects[p].quota["GPU"] + (projects[p].borrowing_limit or {})["GPU"]) * DAY_S)
                for p in members]  # fmt: skip
        for pid, fair in zip(members, water_fill(sum(gpu_seconds[p] for p in members), caps), strict=True):
            signed = (gpu_seconds[pid] - fair) / fair if fair > 0 else 0.0
            deviations.append(abs(signed))
            # Below with every job admitted: its last runs went on past the day's end, which its demand
            # (each job's whole run) counts and the day does not.
            kind = "below_with_jobs_waiting" if pid in waiting else "below_every_job_admitted"
            if gpu_seconds[pid] >= 0.95 * fair:
                kind = "above" if abs(signed) > 0.05 else ""
            else:
                short.add(pid)
            if kind:
                outside[kind] += 1
                hours = {"entitled_gpu_h": fair, "got_gpu_h": gpu_seconds[pid], "running_past_day_end_gpu_h":
                         past_midnight[pid]}  # fmt: skip
                listed.append({"project": projects[pid].name, "kind": kind, "deviation": round(signed, 4)}
                              | {k: round(v / 3600) for k, v in hours.items()})  # fmt: skip
    left = [(START + timedelta(seconds=DAY_S) - j.created_at).total_seconds() for j in jobs if j.id not in admitted]
    bypassed = sim.bypassed.values()
    return {
        "sizes": {"projects": args.projects, "cohorts": args.cohorts, "nodes": args.nodes, "jobs": args.jobs},
        "rounds": len(sim.rounds_ms),
        "admitted": len(admitted),
        "admissions_per_s": sum(sim.admits) / (sum(sim.rounds_ms) / 1000),
        "admissions_per_cpu_s": sum(sim.admits) / (sum(sim.cpu_ms) / 1000),
        "round_ms": spread(sim.rounds_ms),
        "round_cpu_ms": spread(sim.cpu_ms),
        "fairness": {
            "projects_within_5pct": sum(d <= 0.05 for d in deviations),
            "projects": len(deviations),
            "p99_deviation": percentile(deviations, 99),
            "worst_deviation": max(deviations, default=0.0),
            "outside_5pct": outside,
            "outside_5pct_projects": sorted(listed, key=lambda row: row["deviation"]),
        },
        "wait_s_of_admitted": spread(sim.waits),
        "settings": {name: getattr(sim.settings, name) for name in SETTINGS},
        "preempted": sim.preempted,
        "restart_gpu_share": sim.restart_gpu_s / max(1.0, sum(gpu_seconds.values())),
        "room_choose_ms": spread(sim.room_ms),
        "never_admitted": len(left),
        "never_admitted_of_projects_short": sum(j.project_id in short for j in jobs if j.id not in admitted),
        "oldest_still_waiting_s": max(left, default=0.0),
        "passed_by_later_jobs_for_s": spread(sim.passed_for_s + [last - first for first, last in bypassed]),
        "bypassed_still_waiting": {"jobs": len(bypassed),
                                   "longest_s": DAY_S - min((first for first, _ in bypassed), default=DAY_S)},
    }  # fmt: skip


SETTINGS = ("admit_batch", "fair_share_preemption", "fair_share_half_life_s", "starvation_s",
            "fair_share_preemption_margin")  # fmt: skip


def main() -> None:
    args = parse_args(
        __doc__,
        ("--jobs", 100_000, "jobs queued at the start"),
        ("--nodes", 10_000, "nodes of 8 GPUs and 64 CPUs"),
        ("--projects", 2_000, "projects"),
        ("--cohorts", 50, "cohorts the projects are split into"),
        ("--seed", 28, "random seed of the day"),
        ("--split-runs", 1, "each job's run as K jobs of the same gang, each a K-th of it"),
        ("--set", None, "dispatcher settings as name=value (their defaults otherwise)", {"nargs": "*", "type": str}),
    )
    nodes, projects, jobs = build(args, random.Random(args.seed))
    settings = Settings.model_validate(dict(item.split("=", 1) for item in args.set or []))
    with run("simulate", args) as record:
        simulation = Simulation(nodes, projects, jobs, settings, freeze_world=True)
        freeze_startup_heap()  # as the dispatcher does once it is up
        simulation.run()
        result = report(args, simulation)
        record.tables["projects outside 5% of their entitlement"] = result["fairness"].pop("outside_5pct_projects")
        record.tables["the day"] = [{"figure": key, "value": value} for key, value in result.items()]
        record.ratio("gang admissions per second of decide", result["admissions_per_s"], "goal", 100.0)
        record.ratio("round p99 ms, decide's thread CPU", result["round_cpu_ms"]["p99"], "goal", 100.0)
        within = result["fairness"]["projects_within_5pct"]
        record.ratio("projects within 5% of their DRF entitlement", within, "all", result["fairness"]["projects"])


if __name__ == "__main__":
    main()
