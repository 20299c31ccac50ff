"""The page at `/` and the API docs, in a real headless browser (Debian's chromium driven by
Playwright, never a downloaded browser) against a real server with API keys on.

The browser tests skip, with the reason, where there is no chromium: scripts/setup_browser.sh
installs it (scripts/test runs it). The HTTP checks of the same routes run everywhere.
Set PLANNER_TEST_SCREENSHOTS=DIR to keep the screenshots.
"""

from __future__ import annotations

import io
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from api_server import REPO_ROOT, ServerProcess, running_server, wait_finished

from planner.core.graph import Graph
from planner.core.plan import Plan
from planner.sim.simulator import simulate

pytestmark = pytest.mark.timeout(300)

KEY = "web-page-test-key-0123456789"
EXAMPLE = REPO_ROOT / "planner" / "examples" / "resnet24.json"
LINE_BLUE = (37, 99, 235)  # the memory line's colour (#2563eb in charts.js)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    workdir = tmp_path_factory.mktemp("web")
    database = f"sqlite:///{workdir / 's.db'}"
    with running_server(workdir, database, api_keys=json.dumps([KEY])) as srv:
        yield srv


@pytest.fixture(scope="module")
def jobs(server: ServerProcess) -> dict[str, Any]:
    """A finished plan and a finished sweep of the bundled example graph."""
    graph = json.loads(EXAMPLE.read_text())
    with server.client(token=KEY) as c:
        plan = c.post("/v1/plans", json={"graph": graph, "budget": 0.7, "method": "chen-greedy"})
        assert plan.status_code in (200, 202), plan.text
        sweep = c.post("/v1/sweeps", json={"graph": graph, "budgets": [0.5, 0.7, 0.9],
                                           "method": "chen-greedy"})
        assert sweep.status_code == 202, sweep.text
        done = wait_finished(c, plan.json()["id"])
        assert done["status"] == "done", done
        for entry in sweep.json()["plans"]:
            wait_finished(c, entry["id"])
        sweep_view = c.get(sweep.json()["url"]).json()
    return {"plan": done, "sweep": sweep_view, "graph": Graph.model_validate(graph)}


# -- over HTTP (no browser) ------------------------------------------------------------------
def test_page_and_docs_are_served_from_the_package(server: ServerProcess) -> None:
    page = httpx.get(server.url + "/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "web/static/app.js" in page.text and "https://" not in page.text
    for path in ("/docs", "/redoc"):
        html = httpx.get(server.url + path).text
        assert "/docs-assets/" in html and "cdn" not in html.lower(), html
    for asset in ("swagger-ui-bundle.js", "swagger-ui.css", "redoc.standalone.js"):
        assert httpx.get(f"{server.url}/docs-assets/{asset}").status_code == 200
    for asset in ("core.js", "charts.js", "views.js", "forms.js", "app.js", "app.css"):
        assert httpx.get(f"{server.url}/web/static/{asset}").status_code == 200
    assert httpx.get(server.url + "/web/examples/resnet24.json").json()["nodes"]
    assert httpx.get(server.url + "/web/config.json").json()["auth_required"] is True
    # The page's own routes stay out of the API document.
    assert not any(p == "/" or p.startswith(("/web", "/docs"))
                   for p in httpx.get(server.url + "/openapi.json").json()["paths"])


def test_timeline_json_is_the_simulators_and_needs_the_key(
    server: ServerProcess, jobs: dict[str, Any]
) -> None:
    plan_id = jobs["plan"]["id"]
    url = f"{server.url}/web/plans/{plan_id}/timeline.json"
    assert httpx.get(url).status_code == 401
    assert httpx.get(url, headers={"Authorization": "Bearer wrong"}).status_code == 403
    data = httpx.get(url, headers={"Authorization": f"Bearer {KEY}"}).json()
    plan = Plan.model_validate(jobs["plan"]["plan"])
    sim = simulate(jobs["graph"], plan.actions)
    assert data["peak_bytes"] == sim.peak_bytes == jobs["plan"]["report"]["peak_bytes"]
    assert data["budget_bytes"] == jobs["plan"]["budget_bytes"]
    assert [p[2] for p in data["points"]] == [p.live_bytes for p in sim.timeline]
    assert [p[1] for p in data["points"]] == [str(a) for a in plan.actions]
    missing = httpx.get(f"{server.url}/web/plans/nope/timeline.json",
                        headers={"Authorization": f"Bearer {KEY}"})
    assert missing.status_code == 404 and "nope" in missing.json()["error"]["message"]


def test_what_the_page_lists_needs_the_key(server: ServerProcess, jobs: dict[str, Any]) -> None:
    """The lists and the presets the page reads are the API's, behind the same key."""
    for path in ("/v1/plans", "/v1/sweeps", "/v1/resources/presets"):
        assert httpx.get(server.url + path).status_code == 401, path
        answer = httpx.get(server.url + path, headers={"Authorization": f"Bearer {KEY}"})
        assert answer.status_code == 200, path
    sweeps = httpx.get(server.url + "/v1/sweeps",
                       headers={"Authorization": f"Bearer {KEY}"}).json()["sweeps"]
    assert [s["finished"] for s in sweeps if s["id"] == jobs["sweep"]["id"]] == [3]


# -- in the browser --------------------------------------------------------------------------
def chromium_path() -> str | None:
    for name in (os.environ.get("PLANNER_CHROMIUM"), "chromium", "chromium-browser"):
        if name and (path := shutil.which(name)):
            return path
    return None


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    playwright_api = pytest.importorskip(
        "playwright.sync_api", reason="playwright is not installed (pip install -e '.[test]')"
    )
    path = chromium_path()
    if path is None:
        pytest.skip("no chromium on this machine: scripts/setup_browser.sh installs it "
                    "(apt-get install chromium); scripts/test runs it")
    with playwright_api.sync_playwright() as pw:
        # executable_path: Playwright drives the system chromium and downloads nothing.
        b = pw.chromium.launch(executable_path=path, headless=True,
                               args=["--no-sandbox", "--disable-dev-shm-usage"])
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser: Any, server: ServerProcess) -> Iterator[Any]:
    """A fresh browser context that may reach only the server: anything else (a CDN) is
    refused and recorded in page.external."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    p = context.new_page()
    p.external, p.errors = [], []

    def route(r: Any) -> None:
        if r.request.url.startswith(server.url) or r.request.url.startswith(("data:", "blob:")):
            r.continue_()
        else:
            p.external.append(r.request.url)
            r.abort()

    p.route("**/*", route)
    p.on("pageerror", lambda e: p.errors.append(str(e)))
    p.set_default_timeout(30_000)
    try:
        yield p
    finally:
        context.close()


def keep(png: bytes, tmp_path: Path, name: str) -> Path:
    out = tmp_path / name
    out.write_bytes(png)
    if target := os.environ.get("PLANNER_TEST_SCREENSHOTS"):
        Path(target).mkdir(parents=True, exist_ok=True)
        shutil.copy(out, Path(target) / name)
    return out


def ink(png: bytes, colour: tuple[int, int, int] | None = None, tolerance: int = 40) -> float:
    """Share of pixels that are not the white background (or close to `colour`)."""
    import numpy as np
    from PIL import Image

    pixels = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), dtype=np.int16)
    if colour is None:
        hits = pixels.min(axis=2) < 235
    else:
        hits = (np.abs(pixels - np.array(colour)) <= tolerance).all(axis=2)
    return float(hits.mean())


def enter_key(page: Any, server: ServerProcess) -> None:
    page.goto(server.url + "/")
    banner = page.locator("#banner")
    banner.wait_for(state="visible")
    assert "needs an API key" in banner.inner_text()
    page.fill("#api-key", KEY)
    page.click("#key-form button[type=submit]")
    # The methods list loads once the key is accepted. (No wait_for_function: the page's
    # Content-Security-Policy forbids the eval it uses.)
    page.wait_for_selector("#method option[value='chen-greedy']", state="attached")


def test_docs_show_the_operations_offline(page: Any, server: ServerProcess,
                                          tmp_path: Path) -> None:
    page.goto(server.url + "/docs")
    page.locator(".opblock").first.wait_for()
    summaries = page.locator(".opblock-summary-path").all_inner_texts()
    assert "/v1/plans" in summaries and "/v1/sweeps/{sweep_id}" in summaries, summaries
    keep(page.screenshot(), tmp_path, "docs.png")
    page.goto(server.url + "/redoc")
    page.get_by_text("Ask for a plan within a memory budget").first.wait_for()
    assert page.external == [], page.external
    assert page.errors == [], page.errors


def test_page_shows_a_finished_plan_with_its_chart_and_a_sweep(
    page: Any, server: ServerProcess, jobs: dict[str, Any], tmp_path: Path
) -> None:
    enter_key(page, server)
    plan_id, sweep_id = jobs["plan"]["id"], jobs["sweep"]["id"]
    for job_id in (plan_id, sweep_id):
        page.fill("#open-id", job_id)
        page.click("#open-form button")
        page.wait_for_selector(f"#detail[data-ready$='{job_id}']")
    # Both appear in the lists; the plan's row says done.
    page.wait_for_selector(f"#jobs tr[data-id='{plan_id}'][data-status='done']")
    page.wait_for_selector(f"#sweeps tr[data-id='{sweep_id}']")

    page.click(f"#jobs tr[data-id='{plan_id}']")
    page.wait_for_selector(f"#detail[data-ready='plan/{plan_id}']")
    chart = page.locator("svg.memory-chart")
    chart.wait_for()
    shot = keep(page.screenshot(full_page=True), tmp_path, "plan.png")
    chart_png = chart.screenshot()
    assert ink(chart_png) > 0.15, f"the memory chart looks empty: {shot}"
    assert ink(chart_png, LINE_BLUE) > 0.002, f"no memory line drawn: {shot}"
    n_actions = len(jobs["plan"]["plan"]["actions"])
    assert chart.locator("path.line").get_attribute("d").count("V") == n_actions - 1
    assert chart.locator("line.budget").count() == 1 and chart.locator("circle.peak").count() == 1
    tokens = page.locator("#actions-text").inner_text().split()
    assert len(tokens) == n_actions and tokens[0].startswith("C")
    assert page.locator("#actions-text mark").count() == 1  # the peak action
    figures = page.locator("[data-view=summary]").inner_text()
    assert "done" in figures and "chen-greedy" in figures

    page.click(f"#sweeps tr[data-id='{sweep_id}']")
    page.wait_for_selector(f"#detail[data-ready='sweep/{sweep_id}']")
    pareto = page.locator("svg.pareto-chart")
    drawn = [p for p in jobs["sweep"]["plans"] if p["overhead_percent"] is not None]
    assert drawn and pareto.locator("circle.point").count() == len(drawn)
    assert pareto.locator("path.no-plan").count() == len(jobs["sweep"]["plans"]) - len(drawn)
    keep(page.screenshot(full_page=True), tmp_path, "sweep.png")
    assert ink(pareto.screenshot(), LINE_BLUE) > 0.001
    assert page.external == [] and page.errors == [], (page.external, page.errors)


def ready_plan_id(page: Any) -> str:
    """The plan the detail pane shows once it is ready, read in the same check that sees it
    ready (the pane re-renders: a second read may find the attribute gone for a moment)."""
    ready = page.wait_for_function(
        "() => { const v = document.querySelector('#detail')?.getAttribute('data-ready');"
        " return v && v.startsWith('plan/') ? v : null; }")
    return str(ready.json_value()).split("/")[1]


def test_page_submits_the_example_and_follows_it_to_done(
    page: Any, server: ServerProcess, tmp_path: Path
) -> None:
    enter_key(page, server)
    page.select_option("#method", "chen-greedy")
    page.fill("#budget", "0.8")
    page.click("#submit-plan")
    plan_id = ready_plan_id(page)
    page.wait_for_selector(f"#jobs tr[data-id='{plan_id}'][data-status='done']")
    page.wait_for_selector(f"#detail[data-ready='plan/{plan_id}'] svg.memory-chart")
    keep(page.screenshot(full_page=True), tmp_path, "submitted.png")
    with server.client(token=KEY) as c:
        view = c.get(f"/v1/plans/{plan_id}").json()
    assert view["status"] == "done" and view["method"] == "chen-greedy"
    assert page.errors == [], page.errors


@pytest.mark.slow
def test_page_follows_a_running_job_live(page: Any, server: ServerProcess,
                                         tmp_path: Path) -> None:
    graph = json.loads(EXAMPLE.read_text())
    with server.client(token=KEY) as c:
        # api_server's slow-test method: reports progress for sleep_s, then plans.
        job = c.post("/v1/plans", json={"graph": graph, "budget": 0.75, "method": "slow-test",
                                        "options": {"sleep_s": 4}, "time_limit": 30}).json()
    enter_key(page, server)
    page.fill("#open-id", job["id"])
    page.click("#open-form button")
    row = page.locator(f"#jobs tr[data-id='{job['id']}'][data-status='running']")
    row.wait_for()
    assert row.locator(".bar").count() == 1
    page.wait_for_selector(f"#detail[data-ready='plan/{job['id']}'] [data-view=progress]")
    keep(page.screenshot(full_page=True), tmp_path, "running.png")
    # No reload: the poll turns the row to done and draws the plan.
    page.wait_for_selector(f"#jobs tr[data-id='{job['id']}'][data-status='done']")
    page.wait_for_selector(f"#detail[data-ready='plan/{job['id']}'] svg.memory-chart")
    assert page.locator("[data-view=progress]").count() == 0
    assert page.errors == [], page.errors


def percent_text(x: float) -> str:
    """fmt.percent of core.js: '+0.57 %'."""
    return f"{'+' if x >= 0 else ''}{x:.2f} %"


def test_page_lists_the_servers_sweeps_and_each_finished_plans_overhead(
    page: Any, server: ServerProcess, jobs: dict[str, Any], tmp_path: Path
) -> None:
    """A fresh browser (nothing tracked in its storage) lists what the server has: the sweep
    made through the API, and the plan's overhead and peak without opening it."""
    enter_key(page, server)
    plan_id, sweep = jobs["plan"]["id"], jobs["sweep"]
    row = page.locator(f"#sweeps tr[data-id='{sweep['id']}']")
    row.wait_for()
    cells = row.locator("td").all_inner_texts()
    assert cells[1:] == ["chen-greedy", "3", "3"], cells
    job_row = page.locator(f"#jobs tr[data-id='{plan_id}'][data-status='done']")
    job_row.wait_for()
    report = jobs["plan"]["report"]
    assert job_row.locator(".overhead").inner_text() == percent_text(report["overhead_percent"])
    assert job_row.locator(".peak").count() == 1
    assert page.locator("#detail[data-ready]").count() == 0  # nothing was opened
    keep(page.screenshot(full_page=True), tmp_path, "lists.png")
    row.click()
    page.wait_for_selector(f"#detail[data-ready='sweep/{sweep['id']}'] svg.pareto-chart")
    assert page.errors == [], page.errors


def test_page_downloads_the_plan_json_and_the_pictures(
    page: Any, server: ServerProcess, jobs: dict[str, Any], tmp_path: Path
) -> None:
    from xml.etree import ElementTree

    from PIL import Image

    enter_key(page, server)
    plan_id = jobs["plan"]["id"]
    page.fill("#open-id", plan_id)
    page.click("#open-form button")
    page.wait_for_selector(f"#detail[data-ready='plan/{plan_id}'] svg.memory-chart")
    with page.expect_download() as download:
        page.click("#download-plan")
    assert download.value.suggested_filename == f"plan-{plan_id[:8]}.json"
    saved = json.loads(Path(download.value.path()).read_text())
    assert saved == jobs["plan"]["plan"]
    Plan.model_validate(saved)  # what `planner-cli validate` and runtime.apply read

    chart = page.locator("svg.memory-chart")
    width, height = int(chart.get_attribute("width")), int(chart.get_attribute("height"))
    with page.expect_download() as download:
        page.click("[data-view=timeline] .save-png")
    png = Path(download.value.path()).read_bytes()
    keep(png, tmp_path, "timeline-download.png")
    assert Image.open(io.BytesIO(png)).size == (2 * width, 2 * height)
    assert ink(png, LINE_BLUE) > 0.002 and ink(png) > 0.15, "the saved PNG has no chart"
    with page.expect_download() as download:
        page.click("[data-view=timeline] .save-svg")
    root = ElementTree.parse(download.value.path()).getroot()
    namespace = "{http://www.w3.org/2000/svg}"
    assert root.tag == namespace + "svg"
    lines = [e for e in root.iter(namespace + "path") if e.get("class") == "line"]
    assert len(lines) == 1 and lines[0].get("d") == chart.locator("path.line").get_attribute("d")
    assert page.errors == [], page.errors


def test_page_submits_an_offload_plan_on_a_preset_machine(
    page: Any, server: ServerProcess, tmp_path: Path
) -> None:
    enter_key(page, server)
    page.wait_for_selector("#resources-preset option[value='h100-pcie-gen5']", state="attached")
    page.select_option("#resources-preset", "h100-pcie-gen5")
    page.fill("#host-memory", "16GiB")
    page.select_option("#method", "offload-greedy")
    page.fill("#budget", "0.8")
    page.click("#submit-plan")
    plan_id = ready_plan_id(page)
    page.wait_for_selector(f"#jobs tr[data-id='{plan_id}'][data-status='done']")
    page.wait_for_selector(f"#detail[data-ready='plan/{plan_id}'] svg.memory-chart")
    keep(page.screenshot(full_page=True), tmp_path, "offload.png")
    with server.client(token=KEY) as c:
        view = c.get(f"/v1/plans/{plan_id}").json()
    assert view["status"] == "done" and view["method"] == "offload-greedy"
    assert view["resources"]["host_memory_bytes"] == 16 * 2**30
    assert view["plan"]["kind"] in ("offload", "remat+offload")
    assert "host peak" in page.locator("[data-view=summary]").inner_text()
    # A host memory without a machine is refused in the page, before any request.
    page.select_option("#resources-preset", "")
    page.click("#submit-plan")
    page.wait_for_selector("#submit-message.error-text")
    assert "pick a machine" in page.locator("#submit-message").inner_text()
    assert page.errors == [], page.errors


def test_page_submits_a_partition_and_shows_its_stages(
    page: Any, server: ServerProcess, tmp_path: Path
) -> None:
    enter_key(page, server)
    page.wait_for_selector("#pp-method option[value='dp']", state="attached")
    page.fill("#pp-devices", "2")
    page.fill("#pp-device-memory", "256MiB")
    page.fill("#pp-microbatches", "4")
    page.select_option("#pp-schedule", "1f1b")
    page.click("#submit-partition")
    plan_id = ready_plan_id(page)
    stages = page.locator(f"#detail[data-ready='plan/{plan_id}'] [data-view=stages] tr[data-stage]")
    stages.first.wait_for()
    keep(page.screenshot(full_page=True), tmp_path, "partition.png")
    with server.client(token=KEY) as c:
        view = c.get(f"/v1/plans/{plan_id}").json()
    assert view["status"] == "done" and view["method"] == "pipeline-dp", view["status"]
    assert view["resources"]["device_count"] == 2 and view["budget_bytes"] == 256 * 2**20
    assert stages.count() == len(view["plan"]["partition"]["stages"]) == 2
    assert "1f1b" in page.locator("[data-view=stages]").inner_text()
    assert page.errors == [], page.errors
