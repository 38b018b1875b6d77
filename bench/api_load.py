"""Submit throughput and latency as clients see them, against Ray Jobs' `submit_job` on the same machine.

The API: `trainmaster api` (its default workers, or `--api-workers`) on a scratch database, no
dispatcher (every job stays queued). `--concurrency` blocking clients over `--client-procs` processes
(bench/clients.py), one keep-alive connection each: first `POST /v1/jobs` of a 2-worker spec, then
`GET /v1/jobs/{id}` of jobs the first phase made, chosen at random; each phase `--warmup` unmeasured
seconds, then `--duration`.

The peer, after the API is stopped: a Ray head started as the project starts one (`api.stack.ray_head`,
token auth) and as many clients calling `JobSubmissionClient.submit_job(entrypoint="true")` for
`--warmup` + `--ray-duration` seconds. `submit_job` is Ray's acceptance of a job (its supervisor actor
starts in the background); `POST /v1/jobs` is trainmaster's (durable in PostgreSQL, admitted later).

    .venv/bin/python bench/api_load.py [--concurrency 8] [--duration 20] [--ray-duration 20]
"""

from __future__ import annotations

import json

from clients import Phase, drive, summary
from harness import api_process, load_1m, parse_args, ray_head, run, scratch_database

JOB = {"name": "bench", "entrypoint": "builtin:mlp", "scaling": {"num_workers": 2}}


def main() -> None:
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
    rows, ids = [], []

    def phase(path: str, phase: Phase) -> None:
        print(f"{path}: {args.concurrency} clients for {args.warmup:g} + {phase.duration:g} s", flush=True)
        outcome = drive(phase, args.concurrency, args.client_procs)
        rows.append(summary(path, outcome, load_1m=load_1m()))
        ids.extend(outcome.ids)

    with run("api_load", args) as record, scratch_database(record, args.database_url) as db:
        with api_process(db.url, args.api_workers) as api:
            headers, body = {"Authorization": f"Bearer {db.token}"}, json.dumps(JOB).encode()
            posts = [("POST", "/v1/jobs", body)]
            phase("POST /v1/jobs", Phase(api.url, headers, posts, 201, args.warmup, args.duration, keep_ids=True))
            gets = [("GET", f"/v1/jobs/{job_id}", None) for job_id in ids[:5000]]
            phase("GET /v1/jobs/{id}", Phase(api.url, headers, gets, 200, args.warmup, args.duration))
        print("peer: starting a Ray head (token auth)", flush=True)
        with ray_head(num_cpus=2) as head:
            token = head.token_path.read_text().strip()
            submits = Phase(
                head.dashboard, {}, [("RAY", "true", None)], 200, args.warmup, args.ray_duration, ray_token=token
            )
            phase("peer: Ray JobSubmissionClient.submit_job", submits)
        post, get, peer = record.tables["requests"] = rows
        record.ratio("POST /v1/jobs, req/s", post["req_per_s"], peer["path"] + ", req/s", peer["req_per_s"])
        record.ratio("POST /v1/jobs p99 ms (goal <= 50)", post["p99_ms"], "goal", 50.0)
        record.ratio("GET /v1/jobs/{id}, req/s (goal >= 1,000)", get["req_per_s"], "goal", 1000.0)
        record.valid = not any(row["errors"] for row in rows) and peer["requests"] > 0


if __name__ == "__main__":
    main()
