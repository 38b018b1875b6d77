"""Run train.py on 2 workers through trainmaster, unchanged: `python examples/script_mode/submit.py`."""

from pathlib import Path

import trainmaster as tm

client = tm.Client()
job = client.submit(
    name="script-mode-example",
    entrypoint="script:train.py",
    args=["--epochs", "2"],
    working_dir=Path(__file__).parent,  # uploaded with the job; the workers run in it
    scaling=tm.Scaling(num_workers=2),
)
print("submitted", job.id)
job.wait(timeout=600)
print("succeeded; last loss:", job.info.latest_metrics and job.info.latest_metrics.get("loss"))
