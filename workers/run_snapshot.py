"""Ray Train's run snapshot made to agree with the checkpoints that are still on disk.

Ray Train writes `<storage>/<run name>/checkpoint_manager_snapshot.json` (every checkpoint the run
reported) and reads it back when a run of the same name starts: a trainmaster retry or resume (an
attempt's run is named after its job). It refuses to start when a checkpoint it lists is missing
("The run snapshot contains a reference to a checkpoint that does not exist anymore"). On local
storage trainmaster, not Ray, deletes checkpoints (the dispatcher's collector, a refused checkpoint
over its project's storage quota), so before each attempt the driver drops from the snapshot what is
gone, and a latest checkpoint that is gone gives way to the newest one left.

The snapshot's format is Ray's own (`_CheckpointManagerState`, ray 2.60.*, as pinned); only its lists
of checkpoints are filtered, every other field is written back as it was.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

log = logging.getLogger("trainmaster.driver")

SNAPSHOT = "checkpoint_manager_snapshot.json"


def prune(run_dir: Path) -> list[str]:
    """Drops the checkpoints missing from `run_dir` out of its snapshot; the names dropped."""
    snapshot = run_dir / SNAPSHOT
    try:
        state = json.loads(snapshot.read_text())
    except FileNotFoundError:
        return []  # a first attempt, or nothing reported yet
    except (OSError, ValueError) as exc:  # Ray will say what is wrong with it
        log.warning("run_snapshot_unreadable", extra={"path": str(snapshot), "error": str(exc)})
        return []

    def present(result: dict[str, Any] | None) -> bool:
        return result is not None and (run_dir / result["checkpoint_dir_name"]).is_dir()

    results, indices = state.get("checkpoint_results", []), state.get("checkpoint_report_indices", [])
    kept = [(result, index) for result, index in zip(results, indices, strict=True) if present(result)]
    gone = [result["checkpoint_dir_name"] for result in results if not present(result)]
    if not gone:
        return []
    state["checkpoint_results"] = [result for result, _ in kept]
    state["checkpoint_report_indices"] = [index for _, index in kept]
    latest = state.get("latest_checkpoint_result")
    if latest is not None and not present(latest):
        newest = max(kept, key=lambda pair: pair[1], default=None)  # by the report that carried it
        state["latest_checkpoint_result"] = newest[0] if newest else None
    pending = zip(state.get("pending_training_results", []), state.get("pending_validation_specs", []), strict=True)
    pending_kept = [(result, spec) for result, spec in pending if present(result)]
    state["pending_training_results"] = [result for result, _ in pending_kept]
    state["pending_validation_specs"] = [spec for _, spec in pending_kept]
    names = {result["checkpoint_dir_name"] for result in state["checkpoint_results"]}
    for key in (
        "validated_checkpoint_dir_names",
        "timed_out_validation_checkpoint_dir_names",
        "failed_validation_checkpoint_dir_names",
    ):
        state[key] = [name for name in state.get(key, []) if name in names]
    partial = snapshot.with_name(f".{SNAPSHOT}.{os.getpid()}")
    partial.write_text(json.dumps(state))
    partial.replace(snapshot)  # whole or not at all
    log.info("run_snapshot_pruned", extra={"path": str(snapshot), "gone": gone})
    return gone
