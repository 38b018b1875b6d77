"""The operator's docker-compose stack, run for real (`pytest -m compose tests/compose`, after the main
suite in .ci/run): an engine of the test's own, images built from a Debian base that debootstrap makes
(no image registry is reachable), `docker-compose.yml` with `docker-compose.test.yml` on top, a 2-worker
job on two `ray-worker` containers through the published API port, its metrics and the dashboard, the
`api` and `dispatcher` containers restarted while it runs, and the stack taken down.

The engine keeps everything (data-root, exec-root, pidfile, socket) under a temporary folder of the run
and is the only daemon stopped at the end. Published ports bind to TRAINMASTER_COMPOSE_HOST_IP (a
loopback address of its own, 127.0.0.43 by default: dockerd --ip), so port 8000 of anyone else on the
machine is left alone. Each phase's seconds go to test-results/compose-phases.json, the stack's logs
to test-results/compose-stack.log.
"""

from __future__ import annotations

import http.server
import json
import os
import secrets
import shutil
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

import trainmaster as tm
from tests.factories.http import bearer
from tests.factories.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
OVERRIDE = Path(__file__).with_name("docker-compose.test.yml")
RESULTS = REPO / "test-results"
TOOLS = ("dockerd", "docker", "docker-compose", "debootstrap", "tar")
SUITE = "bookworm"  # CPython 3.11, the Python the locks and the torch wheel are for
MIRROR = os.environ.get("TRAINMASTER_COMPOSE_DEBIAN_MIRROR", "http://deb.debian.org/debian")
HOST_IP = os.environ.get("TRAINMASTER_COMPOSE_HOST_IP", "127.0.0.43")
BASE_IMAGE = f"trainmaster-compose-base:{SUITE}"
DEBIAN_PACKAGES = ("python3", "python3-pip", "ca-certificates")  # and debootstrap's minbase
EPOCHS = 10
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
T = TypeVar("T")

MISSING = [tool for tool in TOOLS if shutil.which(tool) is None]
pytestmark = [
    pytest.mark.compose,
    pytest.mark.skipif(
        bool(MISSING),
        reason=f"needs {', '.join(MISSING)} (Debian: apt-get install docker.io docker-compose debootstrap)",
    ),
    pytest.mark.skipif(os.geteuid() != 0, reason="starts its own dockerd and runs debootstrap: needs root"),
]


@dataclass
class Phases:
    """Seconds per phase of the run, written to test-results/compose-phases.json as they end."""

    seconds: dict[str, float] = field(default_factory=dict)

    def timed(self, name: str, action: Callable[[], T]) -> T:
        start = time.monotonic()
        result = action()
        self.seconds[name] = round(time.monotonic() - start, 1)
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "compose-phases.json").write_text(json.dumps(self.seconds, indent=2) + "\n")
        print(json.dumps({"event": "compose_phase", "phase": name, "seconds": self.seconds[name]}), flush=True)
        return result


def run(argv: list[str], *, env: dict[str, str] | None = None, timeout: float, log: Path | None = None) -> str:
    """Run a command to its end; its output goes to `log` when given. Fails with the output's tail."""
    if log is None:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
        output = done.stdout + done.stderr
    else:
        with log.open("w") as out:
            done = subprocess.run(argv, env=env, stdout=out, stderr=subprocess.STDOUT, text=True, timeout=timeout)
        output = log.read_text()
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} exited {done.returncode}:\n{output[-4000:]}")
    return done.stdout if log is None else output


def waiting(probe: Callable[[], T], timeout: float, *, interval: float = 2.0, what: str) -> T:
    """`wait_until`, an error of the stack's clients while it polls counting as "not yet"."""
    passing = (httpx.HTTPError, tm.TrainmasterError, subprocess.SubprocessError)
    return wait_until(probe, timeout, interval=interval, what=what, ignore=passing)


@dataclass
class Engine:
    """A dockerd of the test's own; `env` points the docker and docker-compose clients at it."""

    root: Path
    env: dict[str, str]

    def docker(self, *args: str, timeout: float = 60) -> str:
        return run(["docker", *args], env=self.env, timeout=timeout)


@pytest.fixture(scope="module")
def phases() -> Phases:
    return Phases()


@pytest.fixture(scope="module")
def engine(phases: Phases) -> Iterator[Engine]:
    # A short path: containerd's socket lies under exec-root, and a unix socket's path has 108 bytes.
    # In memory where it can be (about 3 GB at the peak): dpkg's and the image layers' writes cost no
    # disk time, and the end is an unmount instead of removing a hundred thousand files.
    root = Path(tempfile.mkdtemp(prefix="tm-compose-"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=10g,mode=0700", "tmpfs", str(root)], check=False, timeout=30)
    env = {**os.environ, "DOCKER_HOST": f"unix://{root}/docker.sock"}
    with (root / "dockerd.log").open("w") as log:
        daemon = subprocess.Popen(
            [
                "dockerd",
                f"--data-root={root}/data",
                f"--exec-root={root}/exec",
                f"--pidfile={root}/dockerd.pid",
                f"--host=unix://{root}/docker.sock",
                # No docker0 and no iptables rules on the host: the stack's own networks are bridges
                # between its containers; builds use the host's network; published ports go through
                # docker-proxy on HOST_IP.
                "--bridge=none",
                "--iptables=false",
                f"--ip={HOST_IP}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def answers() -> bool:
        if daemon.poll() is not None:
            raise AssertionError(f"dockerd exited {daemon.returncode}:\n{(root / 'dockerd.log').read_text()[-4000:]}")
        return subprocess.run(["docker", "version"], env=env, capture_output=True, timeout=30).returncode == 0

    try:
        phases.timed("engine", lambda: waiting(answers, 60, interval=0.2, what="dockerd answers"))
        yield Engine(root, env)
    finally:
        phases.timed("engine_stop", lambda: stop(daemon, root))


def stop(daemon: subprocess.Popen[bytes], root: Path) -> None:
    """Stop the test's dockerd (and only it), then unmount and remove its folder."""
    try:
        daemon.terminate()
        daemon.wait(60)
    except subprocess.TimeoutExpired:
        daemon.kill()
        daemon.wait(10)
    # dockerd leaves its default network namespace mounted (exec-root/netns/default) when it stops.
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    for mount in sorted((m for m in mounts if m == str(root) or m.startswith(f"{root}/")), key=len, reverse=True):
        subprocess.run(["umount", "--lazy", mount], check=False, timeout=30)
    shutil.rmtree(root, ignore_errors=True)


def host_ca_bundle() -> Path | None:
    candidates = (os.environ.get("PIP_CERT"), os.environ.get("SSL_CERT_FILE"), ssl.get_default_verify_paths().cafile)
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


def build_base_image(engine: Engine, phases: Phases) -> None:
    """BASE_IMAGE: Debian with CPython and pip, made like python:3.11-slim is used (`python` and `pip`
    on PATH, pip free to install system-wide), trusting what the host trusts."""
    rootfs = engine.root / "rootfs"
    phases.timed(
        "debootstrap",
        lambda: run(
            ["debootstrap", "--variant=minbase", f"--include={','.join(DEBIAN_PACKAGES)}", SUITE, str(rootfs), MIRROR],
            timeout=600,
            log=engine.root / "debootstrap.log",
        ),
    )
    for marker in rootfs.glob("usr/lib/python3*/EXTERNALLY-MANAGED"):
        marker.unlink()
    (rootfs / "usr/bin/python").symlink_to("python3")
    if (bundle := host_ca_bundle()) is not None:
        shutil.copyfile(bundle, rootfs / "etc/ssl/certs/ca-certificates.crt")
    shutil.rmtree(rootfs / "var/cache/apt/archives", ignore_errors=True)

    def import_rootfs() -> None:
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        imported = subprocess.run(
            ["docker", "import", "--change", f"ENV PATH={PATH}", "--change", 'CMD ["/bin/bash"]', "-", BASE_IMAGE],
            stdin=tar.stdout,
            env=engine.env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert tar.wait(60) == 0 and imported.returncode == 0, imported.stderr

    phases.timed("import", import_rootfs)
    shutil.rmtree(rootfs)


class LocalSources(http.server.SimpleHTTPRequestHandler):
    """Serves the host's local pip folders (file:// indexes, find-links folders) read-only, under their
    own absolute paths, so pip inside a build on the host's network finds what the host's pip finds."""

    roots: tuple[Path, ...] = ()

    def translate_path(self, path: str) -> str:
        local = Path(os.path.normpath(urllib.parse.unquote(urllib.parse.urlsplit(path).path)))
        if any(local == root or root in local.parents for root in self.roots):
            return str(local) + ("/" if path.endswith("/") else "")
        return "/nonexistent"

    def log_message(self, *args: Any) -> None:
        """Quiet: a build asks for hundreds of files."""


def host_pip_settings() -> dict[str, list[str]]:
    """index-url, extra-index-url and find-links as the host's pip has them (PIP_* over the files)."""
    pip = [sys.executable, "-m", "pip", "config", "list"]
    listed = subprocess.run(pip, capture_output=True, text=True, timeout=60).stdout
    settings: dict[str, list[str]] = {}
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        name = key.rsplit(".", 1)[-1]
        if name in ("index-url", "extra-index-url", "find-links") and (name not in settings or key.startswith(":env:")):
            settings[name] = value.strip("'\"").split()
    return settings


@pytest.fixture(scope="module")
def pip_environment() -> Iterator[dict[str, str]]:
    """PIP_INDEX_URL, PIP_EXTRA_INDEX_URL, PIP_FIND_LINKS and TRAINMASTER_COMPOSE_TORCH_INDEX for the
    builds: the host's settings, each local folder served over HTTP on 127.0.0.1."""
    settings = host_pip_settings()
    handler: type[LocalSources] = type("Sources", (LocalSources,), {})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    roots: list[Path] = []

    def reachable(location: str, index: bool) -> str:
        path = urllib.parse.urlsplit(location).path if location.startswith("file:") else location
        if "://" in path or not Path(path).is_dir():
            return location
        # An index's pages may link to files beside it (../../files/x.whl): serve its parent too.
        roots.append(Path(path).parent if index else Path(path))
        return base + urllib.parse.quote(str(Path(path))) + "/"

    index = [reachable(x, True) for x in settings.get("index-url", [])]
    extra = [reachable(x, True) for x in settings.get("extra-index-url", [])]
    links = [reachable(x, False) for x in settings.get("find-links", [])]
    handler.roots = tuple(roots)
    threading.Thread(target=server.serve_forever, name="pip-sources", daemon=True).start()
    environment = {
        "PIP_INDEX_URL": " ".join(index),
        "PIP_EXTRA_INDEX_URL": " ".join(extra),
        "PIP_FIND_LINKS": " ".join(links),
    }
    if links:  # the torch wheel the host installs lies in a find-links folder: any reachable index will do
        environment["TRAINMASTER_COMPOSE_TORCH_INDEX"] = (extra or index or ["https://pypi.org/simple"])[0]
    try:
        yield environment
    finally:
        server.shutdown()
        server.server_close()


@dataclass
class Stack:
    """docker-compose.yml plus the test's override, as project `name`, on the test's engine."""

    engine: Engine
    name: str
    env: dict[str, str]
    url: str

    def argv(self, *args: str) -> list[str]:
        files = ["-f", str(REPO / "docker-compose.yml"), "-f", str(OVERRIDE)]
        return ["docker-compose", "--project-directory", str(REPO), *files, "-p", self.name, *args]

    def compose(self, *args: str, timeout: float = 120) -> str:
        return run(self.argv(*args), env=self.env, timeout=timeout)

    def started_at(self, service: str) -> str:
        container = self.compose("ps", "-q", service).split()[0]
        return self.engine.docker("inspect", "--format", "{{.State.StartedAt}}", container).strip()


@pytest.fixture(scope="module")
def stack(engine: Engine, pip_environment: dict[str, str], phases: Phases) -> Iterator[Stack]:
    env = {
        **engine.env,
        **pip_environment,
        "TRAINMASTER_COMPOSE_BASE_IMAGE": BASE_IMAGE,
        "POSTGRES_PASSWORD": secrets.token_hex(16),
        "TRAINMASTER_SERVICE_PASSWORD": secrets.token_hex(16),
        "RAY_AUTH_TOKEN": secrets.token_hex(32),
        "COMPOSE_HTTP_TIMEOUT": "300",
    }
    stack = Stack(engine, f"tmcompose{secrets.token_hex(3)}", env, f"http://{HOST_IP}:8000")
    build_base_image(engine, phases)

    def build() -> None:
        # One build of trainmaster:local (every trainmaster service uses that image) beside PostgreSQL's.
        services = ("ray-head", "postgres")
        logs = {service: (engine.root / f"build-{service}.log").open("w") for service in services}
        builds = [
            subprocess.Popen(stack.argv("build", service), env=env, stdout=logs[service], stderr=subprocess.STDOUT)
            for service in services
        ]
        for service, process in zip(services, builds, strict=True):
            logs[service].close()
            assert process.wait(900) == 0, (engine.root / f"build-{service}.log").read_text()[-4000:]

    phases.timed("build", build)
    try:
        phases.timed("up", lambda: stack.compose("up", "-d", "--no-build", "--scale", "ray-worker=2", timeout=300))
        yield stack
    finally:
        phases.timed("logs", lambda: save_logs(stack))
        phases.timed("down", lambda: stack.compose("down", "--volumes", "--timeout", "5", timeout=300))


def save_logs(stack: Stack) -> None:
    """Every container's output, to test-results/compose-stack.log (read it when the test fails)."""
    RESULTS.mkdir(exist_ok=True)
    with (RESULTS / "compose-stack.log").open("w") as out:
        subprocess.run(
            stack.argv("logs", "--no-color", "--timestamps"),
            env=stack.env,
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=120,
        )


def test_the_operator_stack_runs_a_two_worker_job_through_control_plane_restarts(stack: Stack, phases: Phases) -> None:
    create = ("exec", "-T", "api", "trainmaster", "token", "create", "--project", "compose")
    token = phases.timed("token", lambda: stack.compose(*create)).split()[-1]
    client = tm.Client(stack.url, token, timeout=30)

    def ready() -> list[Any]:
        cluster = client.cluster()
        workers = [node for node in cluster.nodes if node.total.get("CPU", 0) >= 1]
        return workers if cluster.reachable and len(workers) == 2 else []

    workers = phases.timed(
        "ray_workers_joined", lambda: waiting(ready, 300, what="two ray-worker nodes in GET /v1/cluster")
    )
    assert len({node.ip for node in workers}) == 2, workers

    job = client.submit(
        name="compose-restarts",
        entrypoint="builtin:mlp",
        # one worker on each ray-worker container (the head has no CPUs for jobs)
        scaling=tm.Scaling(num_workers=2, resources_per_worker={"CPU": 1}, placement_strategy="STRICT_SPREAD"),
        config={"epochs": EPOCHS, "epoch_sleep_s": 4, "samples": 512},  # about a minute: restarts fit in it
    )
    first = phases.timed(
        "job_first_metric", lambda: waiting(job.metrics, 300, interval=1, what="the job's first metric")
    )
    assert job.refresh().status is tm.JobStatus.running, job.info
    busy = client.cluster()
    assert all(node.free.get("CPU", 0) <= node.total["CPU"] - 1 for node in busy.nodes if node.total.get("CPU")), busy

    before = {service: stack.started_at(service) for service in ("api", "dispatcher")}
    phases.timed("restart_api_dispatcher", lambda: stack.compose("restart", "api", "dispatcher", timeout=180))
    assert all(stack.started_at(service) != started for service, started in before.items())
    # `restart` returns once the containers run; the API answers a moment later (its port may already take
    # connections and drop them while uvicorn starts).
    back = phases.timed(
        "api_answers", lambda: waiting(job.refresh, 120, interval=0.5, what="the API to answer after its restart")
    )
    assert back.status is tm.JobStatus.running, "the job ended before the restart finished: lengthen it"

    def ended() -> tm.Job | None:
        state = job.refresh()
        return state if state.status.terminal else None

    finished = phases.timed("job_after_restart", lambda: waiting(ended, 400, what="the job to end"))
    assert finished.status is tm.JobStatus.succeeded, (finished.status, finished.error)
    assert len(finished.attempts) == 1, "the restarts must not have cost the job an attempt"

    points = job.metrics()
    assert {p.seq for p in first} <= {p.seq for p in points}
    epochs = {p.value for p in points if p.name == "epoch" and p.value is not None}
    assert epochs == set(range(EPOCHS)), epochs
    assert {p.rank for p in points if p.name == "loss"} == {0, 1}, "both workers report their loss"

    with httpx.Client(base_url=stack.url, timeout=30, follow_redirects=True) as http:
        page = http.get("/ui/")
        assert page.status_code == 200 and "<title>trainmaster</title>" in page.text
        shown = http.get(f"/v1/jobs/{job.id}", headers=bearer(token))
        assert shown.json()["status"] == "succeeded"
