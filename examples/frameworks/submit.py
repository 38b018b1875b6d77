"""Run one of the scripts beside this file on 2 workers, unchanged:

    python examples/frameworks/submit.py tensorflow        # or jax, paddle, mpi, horovod,
                                                           # lightning, accelerate, deepspeed

The folder is uploaded as the job's working directory and its train.py runs in script mode. The
one field that changes between frameworks is `framework=`; the PyTorch wrappers (Lightning,
Accelerate, DeepSpeed) are PyTorch, so they keep the default `framework="torch"`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import trainmaster as tm

FRAMEWORK_OF = {"lightning": "torch", "accelerate": "torch", "deepspeed": "torch"}
ENV_OF = {"accelerate": {"ACCELERATE_USE_CPU": "true"}}  # what `accelerate launch --cpu` sets: a CPU gang

parser = argparse.ArgumentParser()
parser.add_argument("example", choices=sorted(p.name for p in Path(__file__).parent.iterdir() if p.is_dir()))
parser.add_argument("--workers", type=int, default=2)
parser.add_argument("--out", help="a folder every rank writes what it saw into (the tests read it)")
args = parser.parse_args()

client = tm.Client()
job = client.submit(
    name=f"{args.example}-example",
    entrypoint="script:train.py",
    args=["--out", args.out] if args.out else [],
    working_dir=Path(__file__).parent / args.example,
    framework=FRAMEWORK_OF.get(args.example, args.example),
    env=ENV_OF.get(args.example, {}),
    scaling=tm.Scaling(num_workers=args.workers),
)
print("submitted", job.id, flush=True)
job.wait(timeout=900)
print("succeeded; last loss:", job.info.latest_metrics and job.info.latest_metrics.get("loss"))
