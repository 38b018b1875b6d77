"""Submit throughput and latency as clients see them, against Ray Jobs' `submit_job` on the same machine.

The API: `trainmaster api` (`--api-workers`, default its own) on a scratch database, no dispatcher
(every job stays queued). `--concurrency` blocking clients over `--client-procs` processes
(bench/clients.py): first `POST /v1/jobs` of a 2-worker spec, then `GET /v1/jobs/{id}` of jobs the first
phase made, at random; each phase `--warmup` unmeasured seconds, then `--duration`. The peer, after the
API is stopped: as many clients calling `JobSubmissionClient.submit_job(entrypoint="true")` on a Ray head
started as the tests start one (token auth). `submit_job` is Ray's acceptance of a job; `POST /v1/jobs`
is trainmaster's (durable in PostgreSQL, admitted later).

    .venv/bin/python bench/api_load.py [--concurrency 8] [--duration 20] [--ray-duration 20]
"""

from __future__ import annotations

import json
from typing import Any

from clients import Phase, drive
from harness import api_process, load_1m, ms, parse_args, run, scratch_database

JOB = json.dumps({"name": "bench", "entrypoint": "builtin:mlp", "scaling": {"num_workers": 2}}).encode()


def main() -> None:
    from tests.factories.processes import running_ray_head  # not in the client processes, which import this file

    args = parse_args(
        __doc__,
        ("--concurrency", 8, "concurrent clients"),
        ("--client-procs", 2, "processes the clients are spread over"),
        ("--duration", 20.0, "measured seconds of each API phase"),
        ("--ray-duration", 20.0, "measured seconds of the Ray Jobs peer"),
        ("--warmup", 3.0, "unmeasured seconds before each phase"),
        ("--api-workers", None, "`trainmaster api --workers` (default: the API's own default)", {"type": int}),
        database=True,
    )
    rows: list[dict[str, Any]] = []
    ids: list[str] = []

    def phase(path: str, phase: Phase) -> None:
        print(f"{path}: {args.concurrency} clients for {args.warmup:g} + {phase.duration:g} s", flush=True)
        out = drive(phase, args.concurrency, args.client_procs)
        ids.extend(out.ids)
        n, rate = len(out.latencies), len(out.latencies) / out.seconds if out.seconds else 0.0
        row = {"path": path, "load_1m": load_1m(), "requests": n, "errors": sum(out.errors.values())}
        cpu = {"client_cpu_ms_per_req": 1000 * out.client_cpu_s / max(1, out.sent)}
        rows.append(row | {"req_per_s": rate, **ms(out.latencies, 50, 99), **cpu})

    with run("api_load", args) as record, scratch_database(record, args.database_url) as url:
        with api_process(url, args.api_workers) as api:
            auth = {"Authorization": f"Bearer {api.token}"}
            phase("POST /v1/jobs", Phase(api.url, auth, [("POST", "/v1/jobs", JOB)], 201, args.warmup,
                                         args.duration, keep_ids=True))  # fmt: skip
            gets = [("GET", f"/v1/jobs/{job}", None) for job in ids[:5000]]
            phase("GET /v1/jobs/{id}", Phase(api.url, auth, gets, 200, args.warmup, args.duration))
        with running_ray_head(num_cpus=2) as head:
            token, submits = head.token_path.read_text().strip(), [("RAY", "true", None)]
            ray = Phase(head.dashboard, {}, submits, 200, args.warmup, args.ray_duration, ray_token=token)
            phase("peer: Ray JobSubmissionClient.submit_job", ray)
        post, get, peer = record.tables["requests"] = rows
        record.ratio("POST /v1/jobs, req/s", post["req_per_s"], peer["path"] + ", req/s", peer["req_per_s"])
        record.ratio("POST /v1/jobs p99 ms (goal <= 50)", post["p99_ms"], "goal", 50.0)
        record.ratio("GET /v1/jobs/{id}, req/s (goal >= 1,000)", get["req_per_s"], "goal", 1000.0)
        record.valid = not any(row["errors"] for row in rows) and peer["requests"] > 0


if __name__ == "__main__":
    main()
