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

import argparse
import json
import sys
from typing import Any

from clients import Phase, Request, drive, summary
from harness import api_process, load_1m, parser, ray_head, run, scratch_database

JOB = {"name": "bench", "entrypoint": "builtin:mlp", "scaling": {"num_workers": 2}}


def phase(path: str, phase: Phase, args: argparse.Namespace) -> tuple[dict[str, Any], list[str]]:
    print(f"{path}: {args.concurrency} clients for {args.warmup:g} + {phase.duration:g} s", flush=True)
    outcome = drive(phase, args.concurrency, args.client_procs)
    return summary(path, outcome, load_1m=load_1m()), outcome.ids


def main() -> int:
    p = parser(__doc__, database=True)
    p.add_argument("--concurrency", type=int, default=8, help="concurrent clients")
    p.add_argument("--client-procs", type=int, default=2, help="processes the clients are spread over")
    p.add_argument("--duration", type=float, default=20.0, help="measured seconds of each API phase")
    p.add_argument("--ray-duration", type=float, default=20.0, help="measured seconds of the Ray Jobs peer")
    p.add_argument("--warmup", type=float, default=3.0, help="unmeasured seconds before each phase")
    p.add_argument("--api-workers", type=int, help="`trainmaster api --workers` (default: the API's own default)")
    p.add_argument("--ray-cpus", type=int, default=2, help="CPUs the Ray head offers")
    args = p.parse_args()
    with run("api_load", args) as record, scratch_database(record, args.database_url) as db:
        with api_process(db.url, args.api_workers) as api:
            headers = {"Authorization": f"Bearer {db.token}"}
            body = json.dumps(JOB).encode()
            posts = Phase(
                api.url, headers, [("POST", "/v1/jobs", body)], 201, args.warmup, args.duration, keep_ids=True
            )
            post, ids = phase("POST /v1/jobs", posts, args)
            reads: list[Request] = [("GET", f"/v1/jobs/{job_id}", None) for job_id in ids[:5000]]
            gets = Phase(api.url, headers, reads, 200, args.warmup, args.duration)
            get, _ = phase("GET /v1/jobs/{id}", gets, args)
        print("peer: starting a Ray head (token auth)", flush=True)
        with ray_head(args.ray_cpus) as head:
            token = head.token_path.read_text().strip()
            submit: list[Request] = [("RAY", "true", None)]
            submits = Phase(head.dashboard, {}, submit, 200, args.warmup, args.ray_duration, ray_token=token)
            peer, _ = phase("peer: Ray JobSubmissionClient.submit_job", submits, args)
        record.tables["requests"] = [post, get, peer]
        record.ratio("POST /v1/jobs, req/s", post["req_per_s"], peer["path"] + ", req/s", peer["req_per_s"])
        record.ratio("POST /v1/jobs p99 ms (goal <= 50)", post["p99_ms"], "goal", 50.0)
        record.ratio("GET /v1/jobs/{id}, req/s (goal >= 1,000)", get["req_per_s"], "goal", 1000.0)
        record.valid = not any(row["errors"] for row in record.tables["requests"]) and peer["requests"] > 0
    return 0 if record.valid else 1


if __name__ == "__main__":
    sys.exit(main())
