"""builtin:collectives — nccl-tests-style collective benchmarks run as a trainmaster job.

`trainmaster.collectives` holds the plan (sizes, bandwidth math, result rows), which the CLI reads
too. Here: `torch_backend` (the job's process group: nccl or gloo), `grpc_backend` (the CPU-mediated
baseline), `measure` (one timed, checked row), `topology` (where each worker runs), `timeout` (naming
a hung collective) and `job` (the training function). Only `topology` and `timeout` import without
torch, so the driver can name a hung collective without it.
"""
