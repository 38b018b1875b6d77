"""The real RayBackend: the Ray Jobs API and the dashboard's cluster status, with token auth."""

from __future__ import annotations

import logging
import os
import re
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from api.dispatcher.backend import GangState, Launch, LaunchRefused, RayJobInfo, RayJobState, RayUnavailable
from api.dispatcher.log_cut import cut_read, text_chunks
from api.dispatcher.log_tail import LogTails
from api.dispatcher.placement import ClusterCapacity, Node
from api.settings import get_settings
from trainmaster import json_logs

log = logging.getLogger("trainmaster.dispatcher.ray")

_NOT_FOUND = re.compile(r"status code 404|does not exist", re.I)
_CLIENT_ERROR = re.compile(r"status code 4\d\d")
# The state API's answer for a job with no log file (it ended before its driver started): an empty log,
# as the Jobs API's whole-log read gives for it.
_NO_LOG_FILE = re.compile(r"no driver node id|could not resolve file|not found|does not exist|no such file", re.I)
FINAL_LOG_TRIES = 3  # reads of a finished job's whole log before its absence is an error
DRIVER_NODES_KEPT = 10_000  # submissions whose driver node a backend remembers
LOG_STREAM_TIMEOUT_S = 600  # Ray's deadline for streaming one job's log file to the end


def read_token() -> str | None:
    """Ray's cluster token: RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, then ~/.ray/auth_token (Ray's order)."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return os.environ["RAY_AUTH_TOKEN"].strip()
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH", "~/.ray/auth_token")).expanduser()
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def _camel(name: str) -> str:
    """The dashboard's `to_camel_case`, which its cluster report applies to resource names."""
    first, *rest = name.split("_")
    return first + "".join(part.title() for part in rest)


class RayJobsBackend:
    def __init__(
        self,
        address: str,
        token: str | None = None,
        timeout_s: float = 10.0,
        *,
        line_max_bytes: int | None = None,
        read_max_chars: int | None = None,
    ):
        limits = get_settings()
        self.line_max_bytes = line_max_bytes if line_max_bytes is not None else limits.log_line_max_bytes
        read_max = read_max_chars if read_max_chars is not None else limits.log_read_max_chars
        self.read_max_chars = max(read_max, 4 * self.line_max_bytes)  # a full read always holds a whole line
        self.address = address.rstrip("/")
        # A token given (even empty: a cluster whose token could not be read) is the only one sent; with
        # none, Ray's own order finds this process's. Never another cluster's: with no Authorization
        # header Ray's client adds the token of the environment.
        self.token = token if token is not None else read_token()
        self.headers = {"Authorization": f"Bearer {self.token}"} if self.token is not None else {}
        self.timeout_s = timeout_s
        for name in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS"):
            # Ray's client prefers these over the address it is given; ours must win.
            if os.environ.pop(name, None):
                log.warning("ray_address_variable_ignored", extra={"variable": name, "ray": self.address})
        self._client: Any = None
        self._http: httpx.Client | None = None
        self._tails: LogTails | None = None
        self._driver_nodes: dict[str, str] = {}

    @property
    def tails(self) -> LogTails:
        """Started on first use: only the dispatcher follows logs (the cluster route never does)."""
        if self._tails is None:
            self._tails = LogTails(
                self.address, self.headers, line_max_bytes=self.line_max_bytes, hold_max_chars=self.read_max_chars
            )
        return self._tails

    def _jobs(self) -> Any:
        if self._client is None:
            from ray.job_submission import JobSubmissionClient

            json_logs.adopt("ray")  # Ray gave its logger a text handler at this first import
            try:
                self._client = JobSubmissionClient(self.address, headers=self.headers)
            except Exception as exc:
                raise RayUnavailable(f"Ray Jobs API at {self.address}: {_short(exc)}") from exc
        return self._client

    def _call(self, fn: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return getattr(self._jobs(), fn)(*args, **kwargs)
        except RuntimeError:
            raise
        except Exception as exc:
            self._client = None  # reconnect next time (the head may have restarted)
            raise RayUnavailable(f"Ray Jobs API at {self.address}: {_short(exc)}") from exc

    def cluster(self) -> ClusterCapacity:
        """Alive nodes with total and free resources, custom resource names as the user wrote them.

        Free resources come from the autoscaler's report (`/api/cluster_status`), which camel-cases
        resource names (`tm_node_1` arrives as `tmNode1`); the state API (`/api/v0/nodes`) has the
        true names, and each is mapped back through the dashboard's own camel-casing rule.
        """
        try:
            report = self._get("/api/cluster_status")["data"]["clusterStatus"]["loadMetricsReport"]
            states = self._get("/api/v0/nodes", params={"detail": "1", "limit": "10000"})
            alive = {n["node_id"]: n for n in states["data"]["result"]["result"] if n.get("state") == "ALIVE"}
        except (httpx.HTTPError, KeyError, TypeError, ValueError) as exc:
            raise RayUnavailable(f"cluster status from {self.address}: {_short(exc)}") from exc
        nodes = []
        for node_id, usage in (report.get("usageByNode") or {}).items():
            state = alive.get(node_id)
            if state is None:
                continue
            names = {_camel(name): name for name in state.get("resources_total") or {}}
            names.setdefault("objectStoreMemory", "object_store_memory")
            # Only the node's own resources: placement groups add per-group ones (CPU_group_0_<id>, …).
            known = {name: pair for name, pair in usage.items() if name in names}
            total = {names[name]: float(pair[1]) for name, pair in known.items()}
            free = {names[name]: float(pair[1]) - float(pair[0]) for name, pair in known.items()}
            labels = {str(k): str(v) for k, v in (state.get("labels") or {}).items()}  # `ray start --labels`
            nodes.append(Node(node_id=node_id, total=total, free=free, ip=state.get("node_ip") or "", labels=labels))
        return ClusterCapacity(nodes=nodes)

    def close(self) -> None:
        """Close what this backend opened: its HTTP client and its log tails (their sockets and
        thread). Safe to call twice; a later call opens them again."""
        if self._http is not None:
            self._http.close()
            self._http = None
        if self._tails is not None:
            self._tails.close()
            self._tails = None

    def _get(self, path: str, params: dict[str, str] | None = None) -> Any:
        # One client per backend, kept: `httpx.get` built a new client, and with it a TLS context that
        # loads the CA bundle (about 20 ms of CPU), twice per dispatcher round even over plain HTTP;
        # that was three quarters of an idle dispatcher's CPU (py-spy, CI's shared stack).
        if self._http is None:
            self._http = httpx.Client(headers=self.headers, timeout=self.timeout_s)
        response = self._http.get(f"{self.address}{path}", params=params)
        response.raise_for_status()
        return response.json()

    def submit(self, launch: Launch) -> bool:
        """Ray's answer sorted by what to do next: already known (False), try again later
        (RayUnavailable: unreachable, busy, a server error), or never (LaunchRefused: Ray calls the
        request itself invalid, or refuses its runtime environment or working directory)."""
        try:
            self._call(
                "submit_job",
                entrypoint=launch.entrypoint,
                submission_id=launch.submission_id,
                runtime_env=launch.runtime_env,
                metadata=launch.metadata,
                entrypoint_num_cpus=launch.entrypoint_num_cpus or None,
            )
        except RuntimeError as exc:
            if "already exists" in str(exc):
                return False
            if _CLIENT_ERROR.search(str(exc)):
                raise LaunchRefused(f"Ray refused {launch.submission_id}: {_short(exc)}") from exc
            raise RayUnavailable(f"submit {launch.submission_id}: {_short(exc)}") from exc
        except RayUnavailable as exc:
            if isinstance(exc.__cause__, (ValueError, TypeError)):  # checked by Ray's client, before sending
                raise LaunchRefused(f"Ray refused {launch.submission_id}: {_short(exc.__cause__)}") from exc
            raise
        return True

    def info(self, submission_id: str) -> RayJobInfo | None:
        try:
            details = self._call("get_job_info", submission_id)
        except RuntimeError as exc:
            if _NOT_FOUND.search(str(exc)):
                return None
            raise RayUnavailable(f"status of {submission_id}: {_short(exc)}") from exc
        status = getattr(details.status, "value", details.status)
        ended = getattr(details, "end_time", None)  # milliseconds since the epoch, once terminal
        return RayJobInfo(
            state=RayJobState(status),
            message=details.message or "",
            end_time=datetime.fromtimestamp(ended / 1000, UTC) if ended else None,
            driver_job_id=getattr(details, "job_id", None),
            exit_code=getattr(details, "driver_exit_code", None),
        )

    def gang_state(self, driver_job_id: str) -> GangState:
        params = {
            "filter_keys": "creator_job_id",
            "filter_predicates": "=",
            "filter_values": driver_job_id,
            "limit": "100",
            "detail": "1",  # each group's scheduling stats: Ray's reason for a pending one
        }
        try:
            groups = self._get("/api/v0/placement_groups", params=params)["data"]["result"]["result"]
        except (httpx.HTTPError, KeyError, TypeError, ValueError) as exc:
            raise RayUnavailable(f"placement groups from {self.address}: {_short(exc)}") from exc
        return gang_of(groups)

    def stop(self, submission_id: str) -> None:
        try:
            self._call("stop_job", submission_id)
        except RuntimeError as exc:
            if not _NOT_FOUND.search(str(exc)):
                raise RayUnavailable(f"stop {submission_id}: {_short(exc)}") from exc

    def logs(self, submission_id: str, offset: int = 0, final: bool = False) -> str:
        """The job's cut log (api/dispatcher/log_cut.py) after `offset`, at most `read_max_chars` of it:
        a read that returns that many may have stopped at the budget, and the caller reads on from
        where it ends. While the job runs, from its websocket tail (only the new part crosses the
        wire; a failed read returns nothing and the next round reads again). Once it ended, the whole
        log one last time, so nothing that arrived late is missed: tried FINAL_LOG_TRIES times, then
        RayUnavailable, for the caller to retry or record (never an empty string that looks like
        a job that printed nothing). Both stream the log file through the cutter, never holding it."""
        if not final:
            new = self.tails.since(submission_id, offset)
            if new is not None:
                return new[: self.read_max_chars]
            try:
                return self.read_log(submission_id, offset)
            except RayUnavailable:
                return ""
        self.tails.forget(submission_id)
        error: BaseException | None = None
        for attempt in range(FINAL_LOG_TRIES):
            try:
                return self.read_log(submission_id, offset)
            except RayUnavailable as exc:
                error = exc
                if attempt + 1 < FINAL_LOG_TRIES:
                    time.sleep(0.2 * 2**attempt)
        raise RayUnavailable(f"the final logs of {submission_id}: {_short(error or Exception())}")

    def read_log(self, submission_id: str, offset: int) -> str:
        """The cut log after `offset` (at most `read_max_chars`), streamed from the job's log file by
        Ray's state API in blocks (Ray reads 64 KiB at a time), not the Jobs API's one JSON string."""
        node_id = self._driver_node(submission_id)
        if node_id is None:  # no driver ever ran: nothing was printed
            return ""
        if self._http is None:
            self._http = httpx.Client(headers=self.headers, timeout=self.timeout_s)
        params = {
            "submission_id": submission_id,
            "node_id": node_id,  # Ray's state API finds a job's log file only on the node named
            "lines": "-1",
            "timeout": str(LOG_STREAM_TIMEOUT_S),
        }
        try:
            with self._http.stream("GET", f"{self.address}/api/v0/logs/file", params=params) as response:
                if response.status_code != 200:
                    detail = next(response.iter_bytes(), b"")[:300].decode("utf-8", "replace")
                    if _NO_LOG_FILE.search(detail):
                        return ""
                    raise RayUnavailable(f"log of {submission_id}: HTTP {response.status_code} {detail}")
                text, _ = cut_read(
                    text_chunks(response.iter_bytes()),
                    offset=offset,
                    max_chars=self.read_max_chars,
                    line_max_bytes=self.line_max_bytes,
                )
                return text
        except httpx.HTTPError as exc:
            raise RayUnavailable(f"log of {submission_id}: {_short(exc)}") from exc

    def _driver_node(self, submission_id: str) -> str | None:
        """The node whose log folder holds the job's driver log (None: no driver started), remembered
        once known: a job's driver never moves."""
        if (known := self._driver_nodes.get(submission_id)) is not None:
            return known
        try:
            node_id = self._get(f"/api/jobs/{submission_id}").get("driver_node_id") or None
        except (httpx.HTTPError, ValueError, AttributeError) as exc:
            if isinstance(exc, httpx.HTTPStatusError) and exc.response.status_code == 404:
                return None
            raise RayUnavailable(f"the driver node of {submission_id}: {_short(exc)}") from exc
        if node_id is not None:
            if len(self._driver_nodes) >= DRIVER_NODES_KEPT:
                self._driver_nodes.clear()
            self._driver_nodes[submission_id] = node_id
        return node_id


def gang_of(groups: list[dict[str, Any]]) -> GangState:
    """A driver's gang as its newest placement group stands. Ray Train makes a new group for each
    worker group it starts and removes the one before, so an older group still CREATED is one that
    was not removed (seen after a node died while a worker group started: the old group moved to the
    replacement node and held what the new one waits for). It does not make the gang placed."""
    live = [group for group in groups if group.get("state") not in ("REMOVED", None)]
    if not live:
        return GangState()
    newest = max(live, key=lambda group: (_created_ns(group), group.get("state") == "CREATED"))
    if newest.get("state") == "CREATED":
        return GangState(placed=True, workers=len(newest.get("bundles") or []) or None)
    stats = newest.get("stats") or {}
    why = stats.get("scheduling_state") or str(newest.get("state")).lower()
    tries = stats.get("scheduling_attempt")
    pending = f"Ray: {why}" + (f", {tries} scheduling attempt(s)" if tries else "")
    stale = sum(1 for group in live if group is not newest and group.get("state") == "CREATED")
    if stale:
        pending += f"; {stale} earlier placement group(s) of this job still hold their bundles"
    return GangState(pending=pending)


def _created_ns(group: dict[str, Any]) -> int:
    try:  # protobuf's JSON writes int64 as a string
        return int((group.get("stats") or {}).get("creation_request_received_ns") or 0)
    except (TypeError, ValueError):
        return 0


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[-1] if text else ''}"[:300]
