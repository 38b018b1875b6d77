"""Submit my_training.train_loop_per_worker on 2 workers: `python examples/function_mode/submit.py`."""

from pathlib import Path

import trainmaster as tm

client = tm.Client()
job = client.submit(
    name="function-mode-example",
    entrypoint="my_training:train_loop_per_worker",
    config={"epochs": 2, "lr": 0.01},
    working_dir=Path(__file__).parent,
    scaling=tm.Scaling(num_workers=2),
)
for point in job.stream_metrics():  # live, until the job ends
    if point.name == "mse" and point.rank == 0 and point.step and point.step % 8 == 0:
        print(f"step {point.step}: mse {point.value:.4f}")
print(job.wait(timeout=600).status.value)
