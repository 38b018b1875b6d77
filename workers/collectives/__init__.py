"""builtin:collectives — nccl-tests-style collective benchmarks run as a trainmaster job.

`plan` (sizes, bandwidth math, result rows), `torch_backend` (the job's process group: nccl or
gloo), `grpc_backend` (the CPU-mediated baseline), `measure` (one timed, checked row),
`topology` (where each worker runs), `timeout` (naming a hung collective) and `job` (the
training function). Nothing here imports torch at module level except the backends and `measure`.
"""
