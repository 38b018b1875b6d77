"""The SDK: submit a built-in job, stream its metrics, wait for the result."""

import trainmaster as tm

client = tm.Client()  # TRAINMASTER_API_URL / TRAINMASTER_TOKEN, or ~/.trainmaster/config from `trainmaster up`
job = client.submit(
    name="sdk-example",
    entrypoint="builtin:mlp",
    scaling=tm.Scaling(num_workers=2),
    config={"epochs": 2, "samples": 1024},
)
print("submitted", job.id, job.status.value)
losses = [p.value for p in job.stream_metrics() if p.name == "loss" and p.rank == 0]
final = job.wait(timeout=600)
print(f"{final.status.value}: {len(losses)} loss points, last {losses[-1]:.4f}")
