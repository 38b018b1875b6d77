"""The dashboard in a real browser: Playwright drives Debian's chromium against real API processes,
a real dispatcher and the session's Ray head.

Most jobs here are "parked": they ask for a resource no node has, so the dispatcher keeps them
queued with a reason (the infeasible timeout is an hour here) and the test posts their metrics with
the project token. One real 2-worker job fails its first attempt on purpose and is retried; it is
submitted when the module starts so its Ray time overlaps the other checks, which run first.

Every wait is on DOM state with a deadline; never `networkidle` (the fetch()-read streams keep the
network busy) and never a fixed sleep. Screenshots go to test-results/dashboard/.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from api.metrics.repository import BLOCK_SHIFT, RAW_DOWNSAMPLE_LIMIT
from tests.e2e.conftest import REPO, TRAINMASTER, ApiProcess, Stack, running_stack, start_api, stop
from tests.factories.http import bearer
from tests.factories.waiting import wait_until
from trainmaster.ports import free_port

pytestmark = pytest.mark.ray

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]
SHOTS = Path(os.environ.get("TRAINMASTER_SCREENSHOTS", REPO / "test-results" / "dashboard"))
DOM_TIMEOUT_MS = 30_000  # the machine is shared with Ray jobs: generous, since waits end as soon as the DOM is ready
XSS_NAME = "<img src=x onerror=alert(1)>"
PARKED = {"CPU": 1, "dashboard_parked": 1}  # no node has this resource: the job stays queued

RETRIED_JOB = textwrap.dedent(
    """
    import os, time
    from pathlib import Path

    import ray.train
    import trainmaster

    def wait_for(path):
        deadline = time.time() + 300
        while not Path(path).exists() and time.time() < deadline:
            time.sleep(0.05)

    def train(config):
        rank = ray.train.get_context().get_world_rank()
        attempt = int(os.environ["TRAINMASTER_ATTEMPT"])
        print(f"attempt {attempt} rank {rank} hello", flush=True)
        if attempt == 1:
            time.sleep(3)  # Ray forwards worker output every few hundred ms: let this line reach the driver
            raise RuntimeError("planned failure in attempt 1")
        wait_for(config["go"])
        if rank == 0:
            trainmaster.log({"probe": 42.0}, step=7)
        print(f"rank {rank} probe line", flush=True)
        wait_for(config["go2"])
        print(f"rank {rank} live line", flush=True)
    """
)


# -- fixtures -------------------------------------------------------------------------------------


@dataclass
class Dashboard:
    stack: Stack
    work: Path
    extra_apis: list[ApiProcess] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.stack.api.url

    @property
    def token(self) -> str:
        return self.stack.api.token

    @property
    def database_url(self) -> str:
        return self.stack.api.env["TRAINMASTER_DATABASE_URL"]

    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=bearer(self.token), timeout=60)

    def parked_job(self, name: str, **spec: Any) -> str:
        body = {
            "name": name,
            "entrypoint": "builtin:mlp",
            "scaling": {"num_workers": 1, "resources_per_worker": PARKED},
        }
        with self.http() as http:
            response = http.post("/v1/jobs", json={**body, **spec})
            assert response.status_code == 201, response.text
            return str(response.json()["id"])

    def post_points(self, job_id: str, points: list[dict[str, Any]], batch: int = 20_000) -> None:
        """Posted as a well-behaved client does: a batch past the job's write rate (429) is sent again
        after the Retry-After the API names, within a deadline."""
        with self.http() as http:
            for start in range(0, len(points), batch):
                deadline = time.monotonic() + 120
                while True:
                    response = http.post(f"/v1/jobs/{job_id}/metrics", json={"points": points[start : start + batch]})
                    if response.status_code != 429 or time.monotonic() > deadline:
                        break
                    time.sleep(float(response.headers.get("Retry-After", "1")))
                assert response.status_code == 201, response.text

    def extra_api(self, name: str, ray_address: str, port: int | None = None) -> ApiProcess:
        env = {"TRAINMASTER_RAY_ADDRESS": ray_address}
        env.update({k: v for k, v in self.stack.api.env.items() if k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH")})
        # start_api mints a token with asyncio.run, which cannot run beside Playwright's event loop.
        with ThreadPoolExecutor(1) as pool:
            api = pool.submit(start_api, self.database_url, self.work / f"{name}.log", env, port).result()
        self.extra_apis.append(api)
        return api


@pytest.fixture(scope="module")
def dash(pg_server_url: str, ray_head: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dashboard]:
    """Its own API and dispatcher over the session's Ray head: parked jobs must stay queued for the
    whole module, longer than the shared stack's 8 s infeasible timeout allows."""
    work = tmp_path_factory.mktemp("dashboard")
    with running_stack(pg_server_url, ray_head, work, {"TRAINMASTER_INFEASIBLE_TIMEOUT_S": "3600"}) as stack:
        board = Dashboard(stack=stack, work=work)
        yield board
        for api in board.extra_apis:
            stop(api.process)


@dataclass
class RetriedJob:
    id: str
    go: Path
    go2: Path


@pytest.fixture(scope="module", autouse=True)
def retried_job(dash: Dashboard, tmp_path_factory: pytest.TempPathFactory) -> RetriedJob:
    """The one real Ray job, submitted first so it runs while the other checks do."""
    work = tmp_path_factory.mktemp("retried")
    (work / "code").mkdir()
    (work / "code" / "retried.py").write_text(RETRIED_JOB)
    with dash.stack.client() as client:
        job = client.submit(
            name="retried",
            entrypoint="retried:train",
            working_dir=work / "code",
            scaling={"num_workers": 2},
            config={"go": str(work / "go"), "go2": str(work / "go2")},
            max_retries=1,
            priority=100,
        )
    return RetriedJob(id=job.id, go=work / "go", go2=work / "go2")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install chromium (scripts/test installs it)")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@dataclass
class Tab:
    page: Any
    requests: list[Any]
    dialogs: list[str]
    errors: list[str]


@pytest.fixture
def tab(browser: Any) -> Iterator[Tab]:
    """A fresh browser context (its own sessionStorage) recording requests, dialogs and page errors."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
    context.set_default_timeout(DOM_TIMEOUT_MS)
    page = context.new_page()
    opened = Tab(page=page, requests=[], dialogs=[], errors=[])
    page.on("request", lambda request: opened.requests.append(request))
    page.on("pageerror", lambda error: opened.errors.append(str(error)))

    def on_dialog(dialog: Any) -> None:
        opened.dialogs.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", on_dialog)
    yield opened
    context.close()
    assert not opened.errors, opened.errors


def sign_in(tab: Tab, base: str, token: str) -> None:
    tab.page.goto(f"{base}/")
    tab.page.fill("#token-input", token)
    tab.page.click("#sign-in-form button")
    tab.page.wait_for_selector("#jobs-table")


def shot(tab: Tab, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    tab.page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def charts(tab: Tab) -> list[dict[str, Any]]:
    return tab.page.evaluate("window.trainmaster.charts()")  # type: ignore[no-any-return]


def chart(tab: Tab, title: str) -> dict[str, Any]:
    return next(c for c in charts(tab) if c["title"] == title)


def wait_for_chart(
    tab: Tab, title: str, condition: str = "c.data[0].length > 0", timeout_ms: int = DOM_TIMEOUT_MS
) -> None:
    """Wait until the chart `title` satisfies `condition`, a JS expression over `c` (see charts.js)."""
    tab.page.wait_for_function(
        "() => window.trainmaster && window.trainmaster.charts()"
        f".some(c => c.title === {json.dumps(title)} && ({condition}))",
        timeout=timeout_ms,
    )


def loss_points(steps: range, spike_at: int | None = None) -> list[dict[str, Any]]:
    """Rank 0's loss (rank left out: 0 is the default, and 20,000 such points fit one request)."""
    return [{"step": s, "values": {"loss": 1000.0 if s == spike_at else 1.0 + (s % 7) * 0.01}} for s in steps]


# -- 1. sign-in ---------------------------------------------------------------------------------


def test_01_bad_token_shows_an_error_and_no_url_ever_holds_the_token(dash: Dashboard, tab: Tab) -> None:
    page = tab.page
    page.goto(f"{dash.url}/")
    assert page.url.endswith("/ui/")
    page.fill("#token-input", "tm_not-a-real-token")
    page.click("#sign-in-form button")
    page.wait_for_selector("#sign-in-error:has-text('refused')")
    shot(tab, "01-sign-in-refused")
    job_id = dash.parked_job("signed-in")
    page.fill("#token-input", dash.token)
    page.click("#sign-in-form button")
    page.wait_for_selector(f"tr[data-job-id='{job_id}']")
    page.click(f"tr[data-job-id='{job_id}'] td.name a")
    page.wait_for_selector("#job-name")
    assert page.evaluate("sessionStorage.getItem('trainmaster.token')") == dash.token
    assert page.evaluate("localStorage.length") == 0
    # A token the API stops accepting leads back to sign-in.
    page.evaluate("sessionStorage.setItem('trainmaster.token', 'tm_revoked')")
    page.goto(f"{dash.url}/ui/#/cluster")
    page.wait_for_selector("#sign-in:not([hidden]) #sign-in-error:has-text('401')")
    urls = [request.url for request in tab.requests]
    assert any("/v1/jobs" in url for url in urls)
    assert not [url for url in urls if dash.token in url or "tm_not-a-real-token" in url or "tm_revoked" in url]
    authorized = [r for r in tab.requests if "/v1/" in r.url and r.headers.get("authorization")]
    assert authorized and all(r.headers["authorization"].startswith("Bearer ") for r in authorized)


# -- 2, 3. jobs page, queue ---------------------------------------------------------------------


def test_02_status_filter_narrows_rows_and_survives_a_reload(dash: Dashboard, tab: Tab) -> None:
    kept, cancelled = dash.parked_job("filter-kept"), dash.parked_job("filter-cancelled")
    with dash.http() as http:
        assert http.post(f"/v1/jobs/{cancelled}/cancel").status_code == 202
    page = tab.page
    sign_in(tab, dash.url, dash.token)
    page.wait_for_selector(f"tr[data-job-id='{kept}']")
    page.select_option("#status-filter", "cancelled")
    page.wait_for_selector(f"tr[data-job-id='{kept}']", state="detached")
    page.wait_for_selector(f"tr[data-job-id='{cancelled}']")
    assert "status=cancelled" in page.url
    page.reload()
    page.wait_for_selector(f"tr[data-job-id='{cancelled}']")
    assert page.input_value("#status-filter") == "cancelled"
    statuses = page.eval_on_selector_all("#jobs-table tbody tr", "rows => rows.map(r => r.dataset.status)")
    assert statuses and set(statuses) == {"cancelled"}
    shot(tab, "02-jobs-filtered")


def test_03_a_job_needing_more_gpus_shows_its_queue_position_and_reason(dash: Dashboard, tab: Tab) -> None:
    with dash.http() as http:
        body = {"name": "wants-gpus", "entrypoint": "builtin:mlp", "scaling": {"num_workers": 2, "use_gpu": True}}
        job_id = http.post("/v1/jobs", json=body).json()["id"]

        def reason() -> str | None:
            job = http.get(f"/v1/jobs/{job_id}").json()
            return job["pending_reason"] if "GPU" in (job["pending_reason"] or "") else None

        api_reason = wait_until(reason, 60, what="the dispatcher's pending reason")
        position = http.get(f"/v1/jobs/{job_id}").json()["queue_position"]
    page = tab.page
    sign_in(tab, dash.url, dash.token)
    row = f"tr[data-job-id='{job_id}']"
    page.wait_for_selector(f"{row} .queue-position:has-text('#{position}')")
    assert "GPU" in page.inner_text(f"{row} .pending-reason")
    shot(tab, "03-jobs")
    page.click(f"{row} td.name a")
    page.wait_for_selector("#pending #requested")
    assert page.inner_text("#pending #requested") == "2 CPU, 2 GPU"
    page.wait_for_selector("#pending #free:has-text('CPU')")  # filled in when Ray answers
    assert f"#{position} in the queue" in page.inner_text("#pending")
    assert api_reason.split(";")[0] in page.inner_text("#pending .pending-reason")
    page.goto(f"{dash.url}/ui/#/cluster")
    page.wait_for_selector(f"#queue-table tr[data-job-id='{job_id}']")
    positions = page.eval_on_selector_all(
        "#queue-table tbody tr td:first-child", "cells => cells.map(c => +c.textContent)"
    )
    assert positions == sorted(positions) and position in positions
    assert page.eval_on_selector_all("#nodes-table tbody tr", "rows => rows.length") >= 1
    # Its project's row (GET /v1/queues): what waits, as the API counts it.
    project = http_project(dash)
    page.wait_for_selector(f"#projects-table tr[data-project='{project}']")
    waiting = page.inner_text(f"#projects-table tr[data-project='{project}'] td:last-child")
    with dash.http() as http:
        queues = {q["project"]: q for q in http.get("/v1/queues", params={"limit": 0}).json()["items"]}
    assert int(waiting) >= 1 and queues[project]["waiting"] >= 1
    assert page.query_selector("#usage-table") is not None
    shot(tab, "03-cluster")


def http_project(dash: Dashboard) -> str:
    with dash.http() as http:
        return str(http.get("/v1/projects").json()["items"][0]["name"])


# -- 6. a dropped stream ----------------------------------------------------------------------------


def test_06_after_a_dropped_stream_the_chart_resumes_without_gap_or_duplicate(dash: Dashboard, tab: Tab) -> None:
    job_id = dash.parked_job("dropped-stream")
    dash.post_points(job_id, loss_points(range(0, 50)))
    port = free_port()
    api = dash.extra_api("drop", dash.stack.api.env["TRAINMASTER_RAY_ADDRESS"], port=port)
    page = tab.page
    sign_in(tab, api.url, dash.token)
    page.goto(f"{api.url}/ui/#/jobs/{job_id}")
    wait_for_chart(tab, "loss", "c.data[0].length === 50")
    page.wait_for_selector("#live-badge[data-state='live']")
    api.process.send_signal(signal.SIGKILL)
    api.process.wait()
    page.wait_for_selector("#live-badge[data-state='reconnecting']")
    dash.post_points(job_id, loss_points(range(50, 100)))  # through the other API, while this one is down
    restarted = dash.extra_api("drop-restarted", dash.stack.api.env["TRAINMASTER_RAY_ADDRESS"], port=port)
    page.wait_for_selector("#live-badge[data-state='live']", timeout=30_000)
    wait_for_chart(tab, "loss", "c.data[0].length >= 100")
    assert chart(tab, "loss")["data"][0] == list(range(100))  # every step once, in order
    resumed = [r for r in tab.requests if "/metrics/stream" in r.url and r.headers.get("last-event-id")]
    assert resumed, "the reconnect did not send Last-Event-ID"
    stop(restarted.process)


# -- 7, 8, 9. charts ------------------------------------------------------------------------------

BIG = 200_000
SPIKE = 123_457


@pytest.fixture(scope="module")
def big_job(dash: Dashboard) -> str:
    job_id = dash.parked_job("two-hundred-thousand")
    dash.post_points(job_id, loss_points(range(BIG), spike_at=SPIKE))
    return job_id


def test_07_a_200k_point_series_draws_fast_downsampled_with_its_spike(dash: Dashboard, tab: Tab, big_job: str) -> None:
    responses: list[tuple[str, int]] = []
    page = tab.page
    sign_in(tab, dash.url, dash.token)

    def record(response: Any) -> None:
        if "/metrics?" in response.url and "max_points" in response.url:
            responses.append((response.url, len(response.json()["items"])))

    page.goto("about:blank")  # a new document, so the page's clock starts with the job page
    page.on("response", record)
    page.goto(f"{dash.url}/ui/#/jobs/{big_job}")
    wait_for_chart(tab, "loss")
    loss = chart(tab, "loss")
    asked = page.evaluate("window.trainmaster.metricsRequestedAt")
    # The browser's part (building the chart from what arrived) must take under 1.5 s; the whole way
    # from asking to a drawn chart adds the server's downsampling query, which a loaded machine slows.
    print(
        f"200k points: chart built in {loss['drawMs']:.0f} ms, drawn {loss['firstDrawAt'] - asked:.0f} ms after "
        f"asking, {loss['firstDrawAt']:.0f} ms after the page began"
    )
    assert loss["drawMs"] < 1500, f"building the chart took {loss['drawMs']:.0f} ms"
    assert max(loss["data"][1]) == 1000.0 and SPIKE in loss["data"][0]  # the one-step spike survived
    assert responses
    for url, count in responses:
        max_points = int(url.split("max_points=")[1].split("&")[0])
        assert count <= max_points, url
    # The live stream resumes after the last point the overview kept. Past RAW_DOWNSAMPLE_LIMIT points
    # the overview is made of metric blocks (each its min and max; a block is 2**BLOCK_SHIFT sequence
    # numbers), so at most the rest of the last block comes on top of the 2,000: how much depends on
    # where the job's points fall among the database's sequence numbers (a rehearsal saw 3,586).
    assert BIG > RAW_DOWNSAMPLE_LIMIT
    assert len(loss["data"][0]) <= 2000 + (1 << BLOCK_SHIFT)
    shot(tab, "07-job-metrics-200k")


def test_08_zooming_refetches_the_range_at_finer_resolution(dash: Dashboard, tab: Tab, big_job: str) -> None:
    page = tab.page
    sign_in(tab, dash.url, dash.token)
    page.goto(f"{dash.url}/ui/#/jobs/{big_job}")
    wait_for_chart(tab, "loss")
    overview = chart(tab, "loss")["data"][0]
    over = page.locator(".chart[data-metric='loss'] .u-over")
    box = over.bounding_box()
    y = box["y"] + box["height"] / 2
    with page.expect_response(lambda r: "until_step=" in r.url and "/metrics?" in r.url) as zoomed:
        page.mouse.move(box["x"] + box["width"] * 0.40, y)
        page.mouse.down()
        page.mouse.move(box["x"] + box["width"] * 0.41, y, steps=5)
        page.mouse.up()
    url = zoomed.value.url
    since, until = (int(url.split(f"{key}=")[1].split("&")[0]) for key in ("since_step", "until_step"))
    assert 0 < until - since < BIG // 50
    coarse = [s for s in overview if since <= s <= until]
    denser = 5 * max(1, len(coarse))
    wait_for_chart(tab, "loss", f"c.data[0].filter(s => s >= {since} && s <= {until}).length >= {denser}")
    fine = [s for s in chart(tab, "loss")["data"][0] if since <= s <= until]
    assert len(fine) == len(set(fine)) and len(fine) <= until - since + 1
    shot(tab, "08-zoomed")


def test_09_smoothing_log_y_and_x_axis_controls_take_effect(dash: Dashboard, tab: Tab) -> None:
    job_id = dash.parked_job("controls")
    dash.post_points(
        job_id, [{"step": s, "values": {"loss": 10.0 / (s + 1) * (1.5 if s % 2 else 0.5)}} for s in range(200)]
    )
    page = tab.page
    sign_in(tab, dash.url, dash.token)
    page.goto(f"{dash.url}/ui/#/jobs/{job_id}")
    wait_for_chart(tab, "loss")
    assert chart(tab, "loss")["series"] == ["loss"]
    page.eval_on_selector("#smoothing", "s => { s.value = '0.9'; s.dispatchEvent(new Event('input')); }")
    wait_for_chart(tab, "loss", "c.series.length === 2")
    smoothed = chart(tab, "loss")
    assert smoothed["series"] == ["loss (raw)", "loss"]
    raw, smooth = smoothed["data"][1][100:], smoothed["data"][2][100:]

    def wiggle(values: list[float]) -> float:
        return sum(abs(a - b) for a, b in zip(values[1:], values[:-1], strict=True))

    assert wiggle(smooth) < wiggle(raw) / 3
    page.check("#log-y")
    wait_for_chart(tab, "loss", "c.scaleDistr === 3")
    page.select_option("#x-axis", "time")
    wait_for_chart(tab, "loss", "c.xMode === 'time' && c.data[0][0] > 1.6e9")
    assert chart(tab, "loss")["scaleDistr"] == 3  # the other controls stay
    page.select_option("#x-axis", "step")
    wait_for_chart(tab, "loss", "c.xMode === 'step' && c.data[0][0] === 0")
    shot(tab, "09-controls")


# -- 10. compare ----------------------------------------------------------------------------------


def test_10_comparing_three_jobs_gives_three_named_series(dash: Dashboard, tab: Tab) -> None:
    ids = [dash.parked_job(f"compare-{n}") for n in ("a", "b", "c")]
    for n, job_id in enumerate(ids):
        dash.post_points(job_id, [{"step": s, "values": {"loss": (n + 1) / (s + 1)}} for s in range(50)])
    page = tab.page
    sign_in(tab, dash.url, dash.token)
    for job_id in ids:
        page.check(f"tr[data-job-id='{job_id}'] input[type=checkbox]")
    page.click("#compare-selected")
    wait_for_chart(tab, "loss", "c.series.length === 3")
    series = chart(tab, "loss")["series"]
    assert series == [f"compare-{n} ({job_id[:8]})" for n, job_id in zip("abc", ids, strict=True)]
    assert page.locator(".chart .u-legend").inner_text().count("compare-") == 3
    shot(tab, "10-compare")


def test_a_sweeps_trials_open_together_on_the_compare_page(dash: Dashboard, tab: Tab) -> None:
    body = {
        "name": "compare-sweep",
        "spec": {"name": "trial", "entrypoint": "builtin:mlp", "scaling": {"resources_per_worker": PARKED}},
        "parameters": {"lr": {"values": [0.1, 0.01, 0.001]}},
        "max_concurrent": 3,
        "metric": "loss",
        "mode": "min",
        "early_stopping": {"policy": "none"},
    }
    with dash.http() as http:
        response = http.post("/v1/sweeps", json=body)
        assert response.status_code == 201, response.text
        sweep = http.get(f"/v1/sweeps/{response.json()['id']}").json()
    trials = sorted(sweep["trials"], key=lambda t: t["n"])
    assert len(trials) == 3
    for n, trial in enumerate(trials):
        dash.post_points(trial["job_id"], [{"step": s, "values": {"loss": (n + 1) / (s + 1)}} for s in range(20)])
    page = tab.page
    sign_in(tab, dash.url, dash.token)
    page.goto(f"{dash.url}/ui/#/compare?sweep={sweep['id']}")
    wait_for_chart(tab, "loss", "c.series.length === 3")
    labels = chart(tab, "loss")["series"]
    assert [label[-9:-1] for label in labels] == [t["job_id"][:8] for t in trials]  # one series per trial


# -- 12. Ray unreachable --------------------------------------------------------------------------


def test_12_with_ray_down_the_banner_shows_and_history_loads(dash: Dashboard, tab: Tab) -> None:
    job_id = dash.parked_job("history")
    dash.post_points(job_id, loss_points(range(30)))
    api = dash.extra_api("ray-down", f"http://127.0.0.1:{free_port()}")
    page = tab.page
    sign_in(tab, api.url, dash.token)
    page.wait_for_selector("#ray-banner:not([hidden]):has-text('Ray cannot be reached')")
    page.wait_for_selector(f"tr[data-job-id='{job_id}']")
    page.goto(f"{api.url}/ui/#/jobs/{job_id}")
    wait_for_chart(tab, "loss", "c.data[0].length === 30")
    page.wait_for_selector("#timeline li[data-status='queued']")
    assert page.is_visible("#ray-banner")
    shot(tab, "12-ray-down")


# -- 13. hostile names ----------------------------------------------------------------------------


def test_13_a_job_named_like_html_renders_as_text_and_runs_nothing(dash: Dashboard, tab: Tab) -> None:
    job_id = dash.parked_job(XSS_NAME, labels={"note": "<b>bold</b>"})
    dash.post_points(job_id, loss_points(range(10)))
    page = tab.page
    sign_in(tab, dash.url, dash.token)
    row = f"tr[data-job-id='{job_id}']"
    page.wait_for_selector(row)
    assert page.inner_text(f"{row} td.name") == XSS_NAME
    page.click(f"{row} td.name a")
    page.wait_for_selector("#job-name")
    assert page.inner_text("#job-name") == XSS_NAME
    page.click("[data-tab=spec]")
    assert "<b>bold</b>" in page.inner_text("#spec")
    page.goto(f"{dash.url}/ui/#/compare?ids={job_id}")
    wait_for_chart(tab, "loss")
    assert page.evaluate("document.querySelectorAll('img, b').length") == 0
    assert XSS_NAME in page.locator(".chart .u-legend").inner_text()
    assert tab.dialogs == []
    shot(tab, "13-hostile-name")


# -- collectives ---------------------------------------------------------------------------------


def test_a_collectives_job_shows_its_table_and_busbw_by_size(dash: Dashboard, tab: Tab) -> None:
    from trainmaster.collectives import metric_prefix

    job_id = dash.parked_job("collectives", entrypoint="builtin:collectives")
    rows = []
    for step, size in enumerate(2**k for k in range(3, 13)):
        prefix = metric_prefix("torch", "all_reduce", "out")
        fields = {"size_bytes": size, "count": size / 4, "time_us": 10.0 + size / 100, "algbw": size / 1e4}
        values = {f"{prefix}/{name}": float(v) for name, v in {**fields, "busbw": size / 1e4, "wrong": 0}.items()}
        rows.append({"step": step, "values": values, "rank": 0})
    dash.post_points(job_id, rows)
    page = tab.page
    sign_in(tab, dash.url, dash.token)
    page.goto(f"{dash.url}/ui/#/jobs/{job_id}?tab=collectives")
    page.wait_for_selector("#collectives-table tbody tr:nth-child(10)")
    first_row = "#collectives-table tbody tr:first-child td"
    first = page.eval_on_selector_all(first_row, "cells => cells.map(c => c.textContent)")
    assert first[:4] == ["torch", "all_reduce", "out", "8 B"]
    page.wait_for_selector("#busbw-chart canvas")
    assert "torch all_reduce" in page.inner_text("#busbw-chart .u-legend")
    shot(tab, "collectives")


# -- the terminal ---------------------------------------------------------------------------------


def test_ls_fits_80_columns_and_commands_take_id_prefixes(dash: Dashboard, tmp_path: Path) -> None:
    job_id = dash.parked_job("prefix-target")
    env = {**dash.stack.api.env, "COLUMNS": "80", "TRAINMASTER_HOME": str(tmp_path)}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([TRAINMASTER, *args], env=env, capture_output=True, text=True, timeout=60, cwd=REPO)

    listed = cli("ls", "--limit", "50")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert any(line.startswith(f"{job_id[:8]} ") for line in lines) and job_id not in listed.stdout
    shown = cli("get", job_id[:8], "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["id"] == job_id
    empty = cli("get", "")
    assert empty.returncode != 0 and "id_prefix" in empty.stderr
    cancelled = cli("cancel", job_id[:10])
    assert cancelled.returncode == 0 and "cancelled" in cancelled.stdout
    opened = cli("ui", "--no-open")
    assert opened.returncode == 0 and f"{dash.url}/ui/" in opened.stdout


# -- 4, 5, 11. the real, retried job ----------------------------------------------------------------


def wait_for_second_attempt_running(dash: Dashboard, job: RetriedJob) -> dict[str, Any]:
    with dash.http() as http:

        def running_again() -> dict[str, Any] | None:
            info = http.get(f"/v1/jobs/{job.id}").json()
            assert info["status"] not in ("failed", "succeeded", "cancelled", "timed_out"), info
            return info if len(info["attempts"]) == 2 and info["status"] == "running" else None

        return wait_until(running_again, 300, interval=0.5, what="the retried job's second attempt")  # type: ignore[no-any-return]


def test_04_the_timeline_is_in_order_and_a_retried_job_shows_two_attempts(
    dash: Dashboard, tab: Tab, retried_job: RetriedJob
) -> None:
    wait_for_second_attempt_running(dash, retried_job)
    page = tab.page
    sign_in(tab, dash.url, dash.token)
    page.goto(f"{dash.url}/ui/#/jobs/{retried_job.id}")
    page.wait_for_selector("#attempts-table tr[data-attempt='2']")
    assert page.eval_on_selector_all("#attempts-table tbody tr", "rows => rows.length") == 2
    assert "planned failure in attempt 1" in page.inner_text("#attempts-table tr[data-attempt='1']")
    with dash.http() as http:
        events = http.get(f"/v1/jobs/{retried_job.id}/events").json()["items"]
    shown = page.eval_on_selector_all(
        "#timeline li",
        "items => items.map(i => [+i.dataset.eventId, i.querySelector('time').getAttribute('datetime')])",
    )
    assert [event_id for event_id, _ in shown] == [e["id"] for e in events[: len(shown)]]
    assert [when for _, when in shown] == sorted(when for _, when in shown)
    statuses = page.eval_on_selector_all(
        "#timeline li[data-status]:not([data-status=''])", "i => i.map(x => x.dataset.status)"
    )
    assert statuses[:3] == ["queued", "starting", "running"] and statuses.count("running") == 2


def test_05_a_point_from_trainmaster_log_reaches_the_open_chart_live(
    dash: Dashboard, tab: Tab, retried_job: RetriedJob
) -> None:
    """The page, opened before the point exists and never reloaded, draws it from the stream. How fast
    is measured in bench/sse_latency.py, not here (a timed assertion fails on a loaded machine: 2.6 s
    once in CI against 2 s): the latency is printed."""
    wait_for_second_attempt_running(dash, retried_job)
    page = tab.page
    sign_in(tab, dash.url, dash.token)
    page.goto(f"{dash.url}/ui/#/jobs/{retried_job.id}")
    page.wait_for_selector("#live-badge[data-state='live']")
    opened_ms = page.evaluate("() => performance.timeOrigin")
    retried_job.go.touch()  # the job logs the point only now, with the page open
    wait_for_chart(tab, "probe", "c.data[0].includes(7)", timeout_ms=60_000)
    assert page.evaluate("() => performance.timeOrigin") == opened_ms  # the same page: not reloaded
    drawn_ms = chart(tab, "probe")["drawnAt"]["7"]
    with dash.http() as http:
        point = http.get(f"/v1/jobs/{retried_job.id}/metrics", params={"name": "probe"}).json()["items"][0]
    logged_ms = _epoch_ms(point["ts"])
    assert opened_ms < logged_ms <= drawn_ms + 50, (opened_ms, logged_ms, drawn_ms)  # logged after the page opened
    print(f"the point took {drawn_ms - logged_ms:.0f} ms from trainmaster.log to the chart")
    shot(tab, "05-live-point")


def test_11_logs_stream_live_filter_by_rank_and_download_whole(
    dash: Dashboard, tab: Tab, retried_job: RetriedJob
) -> None:
    wait_for_second_attempt_running(dash, retried_job)
    retried_job.go.touch()
    page = tab.page
    sign_in(tab, dash.url, dash.token)
    page.goto(f"{dash.url}/ui/#/jobs/{retried_job.id}?tab=logs")
    page.wait_for_selector("#log-viewport .log-line:has-text('rank 1 probe line')", timeout=60_000)
    retried_job.go2.touch()  # the workers print their last line only now, while the page watches
    for rank in (0, 1):
        page.wait_for_selector(f"#log-viewport .log-line:has-text('rank {rank} live line')", timeout=60_000)
    page.select_option("#rank-filter", "1")
    page.wait_for_function(  # rows shown, and every one rank 1 (an empty view must not pass)
        "() => { const rows = [...document.querySelectorAll('#log-viewport .log-line')];"
        " return rows.length > 0 && rows.every(l => l.dataset.rank === '1'); }"
    )
    shown = page.eval_on_selector_all("#log-viewport .log-line", "ls => ls.map(l => l.textContent)")
    assert shown and any("rank 1 live line" in line for line in shown) and not any("rank 0" in line for line in shown)
    shot(tab, "11-logs-rank-1")
    with page.expect_download() as download:
        page.click("#download-logs")
    text = Path(download.value.path()).read_text()
    with dash.http() as http:
        stored = [item["line"] for item in http.get(f"/v1/jobs/{retried_job.id}/logs").json()["items"]]
    downloaded = text.splitlines()
    assert downloaded == stored[: len(downloaded)] and len(downloaded) >= len(stored) - 5
    assert "attempt 1 rank 0 hello" in text and "rank 0 live line" in text  # whole: every rank, every attempt


def test_stored_logs_hold_each_worker_print_once_and_no_platform_http_lines(
    dash: Dashboard, retried_job: RetriedJob
) -> None:
    retried_job.go.touch()
    retried_job.go2.touch()
    with dash.stack.client() as client:
        done = client.wait(retried_job.id, timeout=240)
        lines = [line.line for line in client.logs(retried_job.id)]
    assert [a.status for a in done.attempts] == ["failed", "succeeded"]
    for expected in ("attempt 1 rank 0 hello", "attempt 1 rank 1 hello", "attempt 2 rank 1 hello", "rank 0 live line"):
        assert sum(line.endswith(expected) for line in lines) == 1, (expected, "\n".join(lines))
    assert not [line for line in lines if "HTTP Request:" in line]


def _epoch_ms(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() * 1000
