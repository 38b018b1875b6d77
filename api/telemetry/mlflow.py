"""A mirror of each job's params and metrics to an MLflow tracking server, so MLflow users keep their UI.

It speaks MLflow's REST API (2.0) over httpx, so the control plane needs no `mlflow` package. One MLflow
run per job (its attempts share it), in an experiment named after the job's project; the run carries
the tag `trainmaster.job_id`, by which a restarted mirror finds it again instead of making another.
Auth: `MLFLOW_TRACKING_TOKEN` (bearer) or `MLFLOW_TRACKING_USERNAME` / `MLFLOW_TRACKING_PASSWORD`.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator, Mapping
from datetime import datetime
from typing import Any

import httpx

from api.telemetry.repository import ExportedPoint, JobTimeline

JOB_TAG = "trainmaster.job_id"
MAX_PARAM_VALUE = 6000  # MLflow's limit since 2.x
FINAL_STATUS = {"succeeded": "FINISHED", "failed": "FAILED", "timed_out": "FAILED", "cancelled": "KILLED"}


class MlflowMirror:
    def __init__(self, tracking_uri: str, environ: Mapping[str, str], timeout_s: float = 10.0):
        headers: dict[str, str] = {}
        auth: tuple[str, str] | None = None
        if environ.get("MLFLOW_TRACKING_TOKEN"):
            headers["Authorization"] = f"Bearer {environ['MLFLOW_TRACKING_TOKEN']}"
        elif environ.get("MLFLOW_TRACKING_USERNAME"):
            auth = (environ["MLFLOW_TRACKING_USERNAME"], environ.get("MLFLOW_TRACKING_PASSWORD", ""))
        self.http = httpx.AsyncClient(
            base_url=tracking_uri.rstrip("/") + "/api/2.0/mlflow/", headers=headers, auth=auth, timeout=timeout_s
        )
        self.experiments: dict[str, str] = {}
        self.runs: dict[uuid.UUID, str] = {}

    async def close(self) -> None:
        await self.http.aclose()

    async def _call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        response = await self.http.request(method, path, **kwargs)
        if response.status_code >= 400:
            raise MlflowError(f"MLflow {method} {path}: {response.status_code} {response.text[:300]}")
        body: dict[str, Any] = response.json() if response.content else {}
        return body

    async def _experiment(self, name: str) -> str:
        if name in self.experiments:
            return self.experiments[name]
        response = await self.http.get("experiments/get-by-name", params={"experiment_name": name})
        if response.status_code == 200:
            experiment_id = str(response.json()["experiment"]["experiment_id"])
        else:
            try:
                experiment_id = str(
                    (await self._call("POST", "experiments/create", json={"name": name}))["experiment_id"]
                )
            except MlflowError:  # another mirror created it meanwhile
                found = await self._call("GET", "experiments/get-by-name", params={"experiment_name": name})
                experiment_id = str(found["experiment"]["experiment_id"])
        self.experiments[name] = experiment_id
        return experiment_id

    async def run_for(self, job: JobTimeline) -> str:
        """The job's run: known, found by its tag, or created with the job's params."""
        if job.id in self.runs:
            return self.runs[job.id]
        experiment_id = await self._experiment(job.project)
        found = await self._call(
            "POST",
            "runs/search",
            json={"experiment_ids": [experiment_id], "filter": f"tags.`{JOB_TAG}` = '{job.id}'", "max_results": 1},
        )
        if found.get("runs"):
            run_id = str(found["runs"][0]["info"]["run_id"])
        else:
            tags = {JOB_TAG: str(job.id), "mlflow.runName": job.name, "mlflow.source.name": "trainmaster"}
            tags.update({f"trainmaster.label.{k}": v for k, v in job.labels.items()})
            created = await self._call(
                "POST",
                "runs/create",
                json={
                    "experiment_id": experiment_id,
                    "run_name": job.name,
                    "start_time": _ms(job.created_at),
                    "tags": [{"key": k, "value": v} for k, v in tags.items()],
                },
            )
            run_id = str(created["run"]["info"]["run_id"])
            params = [{"key": k, "value": v} for k, v in flatten_params(job.spec)]
            for start in range(0, len(params), 100):  # log-batch takes at most 100 params
                await self._call(
                    "POST", "runs/log-batch", json={"run_id": run_id, "params": params[start : start + 100]}
                )
        self.runs[job.id] = run_id
        return run_id

    async def log_points(self, job: JobTimeline, points: list[ExportedPoint]) -> None:
        run_id = await self.run_for(job)
        metrics = [
            {
                "key": metric_key(point.name, point.rank),
                "value": point.value,
                "timestamp": _ms(point.ts),
                "step": point.step or 0,
            }
            for point in points
        ]
        for start in range(0, len(metrics), 1000):  # log-batch takes at most 1000 metrics
            await self._call(
                "POST", "runs/log-batch", json={"run_id": run_id, "metrics": metrics[start : start + 1000]}
            )

    async def finish(self, job: JobTimeline) -> None:
        run_id = await self.run_for(job)
        body: dict[str, Any] = {"run_id": run_id, "status": FINAL_STATUS.get(job.status, "FINISHED")}
        if job.finished_at is not None:
            body["end_time"] = _ms(job.finished_at)
        await self._call("POST", "runs/update", json=body)


class MlflowError(RuntimeError):
    pass


def _ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def metric_key(name: str, rank: int) -> str:
    """MLflow keys allow letters, digits, `_ - . / ` and space; other ranks than 0 get `/rank<n>`."""
    key = re.sub(r"[^A-Za-z0-9_\-./ ]", "_", name)[:240]
    return key if rank == 0 else f"{key}/rank{rank}"


def flatten_params(spec: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, str]]:
    """The spec's config (as `config.<key>`) and its scaling and framework choices, one param each."""
    for key, value in spec.items():
        if not prefix and key not in ("config", "scaling", "framework", "backend", "entrypoint", "max_retries"):
            continue
        name = prefix + re.sub(r"[^A-Za-z0-9_\-./ ]", "_", str(key))
        if isinstance(value, Mapping) and value:
            yield from flatten_params(value, prefix=f"{name}.")
        else:
            yield name[:250], str(value)[:MAX_PARAM_VALUE]
