"""The web console (registry/console/) in a real browser: `serving up` (workers on onnxruntime, no
Triton or LLM launcher: what the console shows does not depend on the engine) with the demo's
endpoint shape, `sentiment` at 90/10, driven in Debian's chromium through selenium
(tests/support/browser.py). The LLM playground's streaming chat: test_console_llm.py.

One stack and one browser for the module, but every test stands alone (``-k name``): the
``admin`` fixture signs the browser in when it is not, ``demo`` puts the endpoint back to the
demo's 90/10 (v1 stable, v2 canary, no rollout, no shadow) when a test before changed it.
The TorchServe playground's tests (at the end) add an endpoint ``digest`` of a tiny archive, made
by the module's own ``archive`` fixture once one of them asks for it.
Screenshots go to the test run's directory (``SERVING_CONSOLE_SHOTS``, else a pytest temporary
folder); docs/console.md's pictures are those of a run with SERVING_CONSOLE_SHOTS=docs/console.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from registry.console.sessions import COOKIE
from registry.rollout_metrics import StatisticsServiceSource, quantile
from serving.settings import WorkerSettings
from serving.testmodels import build_bert_classifier
from tests.serving.stack import Stack, make_stack
from tests.support import auth
from tests.support.browser import FOCUSABLE, axe_violations, chromium, shown, sign_in, tab_walk
from tests.support.ci import cannot_run
from tests.support.procs import wait_until

EP = "sentiment"
TEXTS = ["the staff were friendly and quick", "an awful slow and noisy place", "calm and bright", "rude late broken"]
N = 40
DEMO = {1: ("stable", 90.0), 2: ("canary", 10.0)}
LIVE_UPDATE_S = 2.0  # the promise: a CLI change on an open page within 2 s, no reload

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def stack(tmp_path_factory, tiny_model):
    v2 = build_bert_classifier(tmp_path_factory.mktemp("console-v2"), seed=7)
    s = make_stack(tmp_path_factory.mktemp("console-stack"), workers=1)
    s.env["SERVING_CONSOLE_SAMPLE_S"] = "1"  # charts with a few seconds of traffic in them
    try:
        s.up(1, "--no-triton", "--no-llm")
        labels = ",".join(tiny_model.labels)
        s.cli("model", "upload", "--name", EP, "--path", str(tiny_model.onnx_path))
        s.cli("model", "add", "--endpoint", EP, "--model", f"{EP}:1", "--engine", "onnxruntime",
              "--tokenizer", str(tiny_model.tokenizer_dir), "--labels", labels)
        s.cli("model", "upload", "--name", EP, "--path", str(v2.onnx_path))
        s.cli("model", "add", "--endpoint", EP, "--model", f"{EP}:2", "--engine", "onnxruntime",
              "--tokenizer", str(v2.tokenizer_dir), "--labels", labels, "--canary", "10%")
        wait_for_the_worker(s)
        yield s
    finally:
        s.stop_all()


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    given = os.environ.get("SERVING_CONSOLE_SHOTS")
    where = Path(given) if given else tmp_path_factory.mktemp("console-screenshots")
    where.mkdir(parents=True, exist_ok=True)
    return where


@pytest.fixture(scope="module")
def browser(stack):
    with chromium() as driver:
        driver.signed_in_as = None  # which token the browser's session belongs to
        yield driver


@pytest.fixture
def admin(stack, browser):
    """The browser signed in as the bootstrap admin; signs in only when it is not already."""
    if browser.signed_in_as != "admin" or not browser.get_cookie(COOKIE):
        sign_in(browser, console(stack), auth.token(stack.home))
        browser.signed_in_as = "admin"
    return browser


@pytest.fixture
def demo(stack):
    """The endpoint as the demo leaves it: v1 stable at 90%, v2 canary at 10%, no rollout, no shadow,
    applied on the worker."""
    with stack.api() as api:
        live = [r for r in api.get("/rollouts", params={"endpoint": EP}).json() if r["state"] in ("running", "paused")]
        if live:
            api.post(f"/rollouts/{EP}/abort").raise_for_status()
        if targets(stack) != DEMO:
            for version, canary in ((1, None), (2, 10.0)):
                api.post("/endpoints", json={"endpoint": EP, "model": EP, "version": version, "engine": "onnxruntime",
                                             "canary": canary}).raise_for_status()
    assert targets(stack) == DEMO
    wait_for_the_worker(stack)


def wait_for_the_worker(stack: Stack) -> None:
    """The worker routes 90/10 with version 2 ready."""
    def applied() -> bool:
        versions = httpx.get(f"{stack.worker_url()}/status", timeout=5).json()["endpoints"][EP]["versions"]
        ready = httpx.get(f"{stack.worker_url()}/v2/models/{EP}/versions/2/ready", timeout=5).status_code == 200
        return ready and sorted((v["version"], v["weight"]) for v in versions) == [(1, 90.0), (2, 10.0)]
    wait_until(applied, timeout=60, what="the worker routing 90/10 with version 2 ready")


def targets(stack: Stack) -> dict[int, tuple[str, float]]:
    with stack.api() as api:
        return {t["version"]: (t["role"], t["weight"]) for t in api.get(f"/endpoints/{EP}").json()["targets"]}


def console(stack: Stack, path: str = "") -> str:
    return f"{stack.control_plane}/console{path}"


def version_cells(driver, endpoint: str) -> dict[int, dict[str, str]]:
    from selenium.webdriver.common.by import By

    section = driver.find_element(By.CSS_SELECTOR, f"[data-endpoint='{endpoint}']")
    out = {}
    for row in section.find_elements(By.CSS_SELECTOR, "tr[data-version]"):
        out[int(row.get_attribute("data-version"))] = {
            c: row.find_element(By.CSS_SELECTOR, f"td.{c}").text
            for c in ("role", "weight", "requests", "errors", "p50", "p99")}
    return out


def endpoint_routes(stack: Stack) -> dict[int, float]:
    listed = json.loads(stack.cli("endpoint", "list", "--json").stdout)
    ep = next(e for e in listed if e["name"] == EP)
    return {t["version"]: t["weight"] for t in ep["targets"] if t["role"] != "shadow"}


def rollout_state(stack: Stack) -> str:
    with stack.api() as api:
        return api.get("/rollouts", params={"endpoint": EP}).json()[0]["state"]


def test_sign_in_shows_the_demo_endpoint_at_90_10(stack, browser, demo, shots):
    from selenium.webdriver.common.by import By

    browser.delete_all_cookies()
    browser.signed_in_as = None
    browser.get(console(stack, "/"))
    assert browser.current_url.endswith("/console/signin")
    browser.find_element(By.ID, "token").send_keys("srv_not_a_token")
    browser.find_element(By.ID, "signin").click()
    shown(browser, "signin-error", "unknown, revoked")
    browser.save_screenshot(str(shots / "signin.png"))
    sign_in(browser, console(stack), auth.token(stack.home))
    browser.signed_in_as = "admin"
    cells = version_cells(browser, EP)
    assert {v: (c["role"], c["weight"]) for v, c in cells.items()} == {1: ("stable", "90"), 2: ("canary", "10")}


def test_numbers_equal_the_statistics_service(stack, admin, demo, shots):
    source = StatisticsServiceSource(stack.statistics_url())
    before = sum(source.snapshot(EP, v).requests for v in (1, 2))
    with httpx.Client(timeout=30) as client:
        for i in range(N):
            assert client.post(f"{stack.worker_url()}/serve/{EP}", json={"text": TEXTS[i % 4]}).status_code == 200
    wait_until(lambda: sum(source.snapshot(EP, v).requests for v in (1, 2)) == before + N, timeout=30,
               what=f"the statistics service counted {N} more requests")
    admin.get(console(stack, "/"))
    cells = version_cells(admin, EP)
    for version in (1, 2):
        counted = source.snapshot(EP, version)
        on_page = cells[version]
        assert on_page["requests"] == f"{counted.requests:,.0f}"
        assert on_page["errors"] == f"{counted.errors:,.0f}"
        for q, cell in ((0.5, "p50"), (0.99, "p99")):
            value = quantile(q, counted.buckets)
            assert on_page[cell] == ("–" if value is None else f"{value * 1000:,.1f}"), (version, cell)
    assert sum(int(cells[v]["requests"].replace(",", "")) for v in (1, 2)) == before + N
    admin.save_screenshot(str(shots / "overview.png"))


def test_a_cli_change_shows_on_an_open_page_within_2_seconds(stack, admin, demo):
    from selenium.webdriver.common.by import By

    admin.get(console(stack, f"/endpoint?name={EP}"))
    admin.execute_script("window.notReloaded = true;")
    wait_until(lambda: admin.find_element(By.TAG_NAME, "body").get_attribute("data-revision"), timeout=10,
               what="the page's event stream connected")
    started = time.monotonic()
    stack.cli("canary", "set", "--endpoint", EP, "--weights", "1=80,2=20")
    made = time.monotonic()  # the CLI has its answer: the change is made

    def split_shown() -> bool:
        return admin.find_element(By.CSS_SELECTOR, "tr[data-version='2'] td.weight").text == "20"

    wait_until(split_shown, timeout=10, interval=0.02, what="the new split on the open page")
    seen = time.monotonic()
    print(f"\nCLI change on the open page {seen - made:.2f} s after the CLI returned "
          f"({seen - started:.2f} s after it was started)")
    assert seen - made < LIVE_UPDATE_S
    assert admin.execute_script("return window.notReloaded === true;")


def test_pages_left_behind_hold_no_connection(stack, admin):
    """Each live page holds a connection for its event stream, and browsers open at most six to one
    host over HTTP/1.1. A page left for another closes its stream, also when the browser keeps the
    page for "back": after eight live pages in a row, the next one gets a connection at once (before
    console.js closed streams on pagehide, it waited about 40 s for one)."""
    from selenium.webdriver.common.by import By

    for i in range(8):
        admin.get(console(stack, ("/", "/workers", f"/endpoint?name={EP}")[i % 3]))
        wait_until(lambda: admin.find_element(By.TAG_NAME, "body").get_attribute("data-revision"), timeout=10,
                   what="the page's event stream connected")
    admin.get(console(stack, "/models"))
    waited_ms = admin.execute_script("const n = performance.getEntriesByType('navigation')[0];"
                                     "return n.connectStart - n.fetchStart;")
    assert waited_ms < 5000, f"the page waited {waited_ms:.0f} ms for a connection"


def test_the_endpoint_page_charts_both_versions(stack, admin, demo, shots):
    """A few seconds of traffic to each version (v1 about 8 req/s, v2 about 3): the charts draw a
    line per version, and the page's words say their last figures."""
    from selenium.webdriver.common.by import By

    admin.get(console(stack, f"/endpoint?name={EP}"))  # the console samples every second from now on
    stop = threading.Event()

    def traffic(version: int, pause_s: float) -> None:
        with httpx.Client(timeout=30) as client:
            i = 0
            while not stop.is_set():
                client.post(f"{stack.worker_url()}/serve/{EP}/{version}", json={"text": TEXTS[i % 4]})
                i += 1
                time.sleep(pause_s)

    threads = [threading.Thread(target=traffic, args=a, daemon=True) for a in ((1, 0.12), (2, 0.33))]
    for t in threads:
        t.start()

    def charted() -> dict[int, float] | None:
        """The last rate of each version the requests chart states, once both are above 0 for the
        last three samples (each version's line then rises and runs along at its rate)."""
        admin.get(console(stack, f"/endpoint?name={EP}"))
        chart = admin.find_element(By.CSS_SELECTOR, "figure.chart svg")  # the first: requests/s
        label = chart.get_attribute("aria-label")
        rates = {int(v): float(r) for v, r in re.findall(r"v(\d) \(\w+\): last ([\d.]+) req/s", label)}
        lines = [p for p in chart.find_elements(By.TAG_NAME, "path") if p.get_attribute("d").count("L") >= 3]
        return rates if len(lines) == 2 and set(rates) == {1, 2} and min(rates.values()) > 0 else None

    try:
        wait_until(charted, timeout=40, interval=1.0, what="both versions' request lines on the chart")
        time.sleep(3.0)  # three more samples of traffic: a line that shows, not a dot
        rates = charted()
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=10)
    assert rates and rates[1] > rates[2] > 0, rates  # v1 is sent about three times v2's traffic
    admin.save_screenshot(str(shots / "endpoint.png"))


def test_a_viewer_sees_no_action_and_a_forged_post_is_refused(stack, browser, demo):
    from selenium.webdriver.common.by import By

    with stack.api() as api:
        made = api.post("/tokens", json={"name": f"console-viewer-{time.monotonic_ns()}", "role": "viewer"})
    sign_in(browser, console(stack), made.json()["token"])
    browser.signed_in_as = "viewer"
    browser.get(console(stack, f"/endpoint?name={EP}"))
    assert not browser.find_elements(By.ID, "actions")
    assert not browser.find_elements(By.CSS_SELECTOR, "form[action^='/console/act/']")
    assert not browser.find_elements(By.LINK_TEXT, "Keys")
    cookie = browser.get_cookie(COOKIE)
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    jar = {COOKIE: cookie["value"]}
    url = console(stack, "/act/promote")
    # a forged POST: the session's cookie, but not its CSRF token
    for form in ({"endpoint": EP, "confirm": "yes"}, {"endpoint": EP, "confirm": "yes", "csrf": "guessed"}):
        assert httpx.post(url, data=form, cookies=jar).status_code == 403
    # the browser's own page cannot act without it either
    status = browser.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "fetch('/console/act/promote', {method: 'POST', headers: {'Content-Type': 'application/x-www-form-urlencoded'},"
        " body: 'endpoint=sentiment&confirm=yes'}).then(r => done(r.status));")
    assert status == 403
    # with the CSRF token, the API itself refuses the viewer's promote, and says so
    csrf = re.search(r'name="csrf" value="([^"]+)"', browser.page_source).group(1)
    answer = httpx.post(url, data={"endpoint": EP, "confirm": "yes", "csrf": csrf}, cookies=jar, follow_redirects=True)
    assert "promote refused (403)" in answer.text and "needs role deployer or admin" in answer.text
    assert endpoint_routes(stack) == {1: 90.0, 2: 10.0}


def test_promote_from_the_page(stack, admin, demo, shots):
    from selenium.webdriver.common.by import By

    admin.get(console(stack, f"/endpoint?name={EP}"))
    field = admin.find_element(By.ID, "weight-1")  # the API's validation, in its words, on the page
    field.clear()
    field.send_keys("70")
    admin.find_element(By.ID, "set-weights").click()
    shown(admin, "flash", "weights refused (422): weights: weights must add up to 100, got 80")
    assert endpoint_routes(stack) == {1: 90.0, 2: 10.0}
    admin.find_element(By.ID, "promote").click()
    shown(admin, "confirm-question", "cannot be undone")
    admin.save_screenshot(str(shots / "confirm.png"))
    assert axe_violations(admin) == []
    shown(admin, "confirm").click()
    shown(admin, "flash", "done, promote")
    assert endpoint_routes(stack) == {2: 100.0}
    with stack.api() as api:
        mine = [e for e in api.get("/audit").json() if e["action"] == "POST /endpoints/{name}/promote"]
    assert mine and mine[0]["actor"] == "bootstrap-admin" and mine[0]["target"] == EP


def test_the_playground_answers_as_the_data_plane(stack, admin, demo, shots):
    """At 90/10 either version may answer: the page's answer equals that version's own, asked directly."""
    from selenium.webdriver.common.by import By

    admin.get(console(stack, f"/playground?endpoint={EP}"))
    admin.find_element(By.ID, "input").send_keys(TEXTS[0])
    admin.find_element(By.ID, "send").click()
    version = shown(admin, "answer-version").text
    answer = json.loads(admin.find_element(By.ID, "answer").text)
    assert version in ("1", "2")
    direct = httpx.post(f"{stack.worker_url()}/serve/{EP}/{version}", json={"text": TEXTS[0]}, timeout=30)
    assert direct.headers["X-Model-Version"] == version
    assert answer == direct.json()
    admin.save_screenshot(str(shots / "playground.png"))


def test_keys_created_once_and_revoked(stack, admin, shots):
    from selenium.webdriver.common.by import By

    name = f"console-key-{time.monotonic_ns()}"
    admin.get(console(stack, "/keys"))
    admin.find_element(By.ID, "k-name").send_keys(name)
    admin.find_element(By.ID, "create-key").click()
    secret = shown(admin, "secret").get_attribute("value")
    assert axe_violations(admin) == []  # the page that shows it once
    ok = httpx.post(f"{stack.worker_url()}/serve/{EP}", json={"text": "fine"}, timeout=30,
                    headers={"Authorization": f"Bearer {secret}"})
    assert ok.status_code == 200
    admin.get(console(stack, "/keys"))
    assert secret not in admin.page_source
    admin.save_screenshot(str(shots / "keys.png"))
    admin.find_element(By.CSS_SELECTOR, f"button[aria-label='Revoke key {name}']").click()
    shown(admin, "confirm").click()
    shown(admin, "flash", f"revoked key {name}")
    with stack.api() as api:
        assert [k["revoked"] for k in api.get("/client-keys").json() if k["name"] == name] == [True]


def test_a_rollout_started_paused_resumed_and_aborted_from_the_page(stack, admin, demo, shots):
    from selenium.webdriver.common.by import By

    admin.get(console(stack, f"/endpoint?name={EP}"))
    assert not admin.find_elements(By.ID, "rollout-pause")  # nothing to pause yet
    admin.find_element(By.ID, "rollout-model").send_keys(f"{EP}:2")
    admin.find_element(By.ID, "rollout-steps").clear()
    admin.find_element(By.ID, "rollout-steps").send_keys("20,50,100")
    interval = admin.find_element(By.ID, "rollout-interval")
    interval.clear()
    interval.send_keys("3600")
    admin.find_element(By.ID, "rollout-start").click()
    shown(admin, "flash", "done, start a gated rollout")
    assert endpoint_routes(stack) == {1: 80.0, 2: 20.0}
    assert "running" in admin.find_element(By.CSS_SELECTOR, "details summary").text

    admin.find_element(By.ID, "rollout-pause").click()  # can be undone: no confirmation
    shown(admin, "flash", "done, pause the rollout")
    assert rollout_state(stack) == "paused" and endpoint_routes(stack) == {1: 80.0, 2: 20.0}
    summary = admin.find_element(By.CSS_SELECTOR, "details summary").text
    assert "paused (paused by bootstrap-admin at step 1 (20%))" in summary, summary
    assert admin.find_elements(By.ID, "rollout-resume") and not admin.find_elements(By.ID, "rollout-pause")
    admin.execute_script("document.querySelector('details').scrollIntoView(); window.scrollBy(0, -200);")  # its timeline
    admin.save_screenshot(str(shots / "rollout.png"))
    admin.get(console(stack, "/"))
    assert admin.find_element(By.CSS_SELECTOR, f"[data-endpoint='{EP}'] .rollout-state").text == "paused"

    admin.get(console(stack, f"/endpoint?name={EP}"))
    admin.find_element(By.ID, "rollout-resume").click()
    shown(admin, "flash", "done, resume the rollout")
    assert rollout_state(stack) == "running"
    admin.find_element(By.ID, "rollout-abort").click()
    shown(admin, "confirm").click()
    shown(admin, "flash", "done, abort the rollout")
    assert rollout_state(stack) == "aborted" and endpoint_routes(stack) == {1: 100.0}
    with stack.api() as api:
        audit = api.get("/audit", params={"limit": 20}).json()
    actions = [(e["action"], e["actor"]) for e in audit if e["target"] == EP and "/rollouts" in e["action"]]
    assert actions[:3] == [("POST /rollouts/{endpoint}/abort", "bootstrap-admin"),
                           ("POST /rollouts/{endpoint}/resume", "bootstrap-admin"),
                           ("POST /rollouts/{endpoint}/pause", "bootstrap-admin")], actions


PAGES = {"overview": "/", "endpoint": f"/endpoint?name={EP}", "playground": f"/playground?endpoint={EP}",
         "models": "/models", "workers": "/workers", "audit": "/audit?actor=bootstrap-admin", "keys": "/keys"}


@pytest.mark.parametrize("page", list(PAGES))
def test_every_page_passes_axe_and_the_keyboard_reaches_everything(stack, admin, demo, shots, page):
    admin.get(console(stack, PAGES[page]))
    admin.save_screenshot(str(shots / f"{page}-page.png"))
    assert axe_violations(admin) == []
    reached, focusable = tab_walk(admin)
    assert reached[0].startswith("A||#content|"), reached[:3]  # the skip link first
    assert [f for f in focusable if f not in reached] == []


def test_the_sign_in_page_passes_axe(stack, browser):
    browser.delete_all_cookies()
    browser.signed_in_as = None
    browser.get(console(stack, "/signin"))
    assert axe_violations(browser) == []


def test_an_action_by_keyboard_alone(stack, admin, demo):
    """Tab to the shadow form, type its fields, Enter: shadow on; Tab to "Shadow off", Enter: off.
    The shadow is version 1 once version 2 is promoted (a version that does not answer)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    def tab_to(element_id: str):
        admin.switch_to.active_element.send_keys(Keys.TAB)
        for _ in range(150):
            focused = admin.switch_to.active_element
            if focused.get_attribute("id") == element_id:
                return focused
            focused.send_keys(Keys.TAB)
        raise AssertionError(f"Tab never reached #{element_id}")

    def shadow() -> list:
        return [(v, w) for v, (role, w) in targets(stack).items() if role == "shadow"]

    with stack.api() as api:
        api.post(f"/endpoints/{EP}/promote").raise_for_status()
    admin.get(console(stack, f"/endpoint?name={EP}"))
    tab_to("shadow-model").send_keys(f"{EP}:1", Keys.TAB, Keys.CONTROL, "a")
    admin.switch_to.active_element.send_keys("30", Keys.ENTER)
    wait_until(lambda: "done, copy a share" in admin.page_source, timeout=20, what="shadow on",
               on_timeout=lambda: admin.find_element(By.TAG_NAME, "main").text[:2000])
    assert shadow() == [(1, 30.0)]
    tab_to("shadow-off").send_keys(Keys.ENTER)
    wait_until(lambda: "done, stop shadowing" in admin.page_source, timeout=20, what="shadow off")
    assert shadow() == []


# ------------------------------------------------------------------- a TorchServe archive's playground

ARCHIVE = "digest"
DIGEST_HANDLER = '''\
"""Answers what reached it: the byte count, sha256 and content type of each request's raw body, so a
test can tell that the bytes a client sent arrived unchanged."""
import hashlib
import json


def handle(data, context):
    if data is None:  # TorchServe's initialisation call
        return None
    answers = []
    for i, row in enumerate(data):
        body = row.get("data") or row.get("body") or b""
        if isinstance(body, str):  # text/* bodies arrive decoded
            body = body.encode("utf-8")
        elif not isinstance(body, (bytes, bytearray)):  # application/json arrives as the decoded value
            body = json.dumps(body).encode("utf-8")
        answers.append({"bytes": len(body), "sha256": hashlib.sha256(body).hexdigest(),
                        "content_type": context.get_request_header(i, "content-type")})
    return answers
'''


@pytest.fixture(scope="module")
def archive(stack, tmp_path_factory) -> str:
    """Endpoint ``digest``: DIGEST_HANDLER archived by torch-model-archiver, uploaded and deployed
    with the CLI (engine torchserve, implied by the archive)."""
    archiver = Path(sys.executable).parent / "torch-model-archiver"
    if not archiver.is_file():
        cannot_run(f"{archiver} is missing: scripts/setup.sh installs the torch extra (torch-model-archiver)")
    src = tmp_path_factory.mktemp("console-archive")
    (src / "digest_handler.py").write_text(DIGEST_HANDLER)
    subprocess.run([str(archiver), "--model-name", ARCHIVE, "--version", "1.0", "--handler",
                    str(src / "digest_handler.py"), "--export-path", str(src)], check=True, timeout=120)
    stack.cli("model", "upload", "--name", ARCHIVE, "--path", str(src / f"{ARCHIVE}.mar"))
    stack.cli("model", "add", "--endpoint", ARCHIVE, "--model", ARCHIVE, "--wait")
    return ARCHIVE


def digest(data: bytes, content_type: str) -> dict:
    """What DIGEST_HANDLER answers for ``data`` sent with ``content_type``."""
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(), "content_type": content_type}


def noise_png(path: Path, seed: int = 5) -> bytes:
    """A PNG of random pixels (its bytes hold every value, NUL and CR LF included), written to ``path``."""
    from PIL import Image

    rng = random.Random(seed)
    Image.frombytes("RGB", (48, 48), bytes(rng.randrange(256) for _ in range(48 * 48 * 3))).save(path)
    return path.read_bytes()


def answer_on_page(driver) -> dict:
    """The playground's answer once the page that a Send started shows it: status, version, what
    was sent, and the answer (parsed when JSON)."""
    from selenium.webdriver.common.by import By

    status = shown(driver, "answer-status").text
    text = driver.find_element(By.ID, "answer").text
    sent = driver.find_elements(By.ID, "answer-sent")
    try:
        answer = json.loads(text)
    except ValueError:
        answer = text
    return {"status": status, "version": driver.find_element(By.ID, "answer-version").text,
            "sent": sent[0].text if sent else None, "answer": answer}


def unreached_by_tab(driver, limit: int = 200) -> list[str]:
    """The focusable, visible controls that Tab from the top of the page never reaches. Like
    tab_walk, but each Tab is pressed on the page (ActionChains), not sent to the focused element:
    chromedriver takes keys sent to a file input for the path of a file to choose."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    controls = [e for e in driver.find_elements(By.CSS_SELECTOR, FOCUSABLE) if e.is_displayed()]
    driver.execute_script("document.activeElement && document.activeElement.blur(); window.scrollTo(0, 0);")
    reached: list = []
    for _ in range(limit):
        ActionChains(driver).send_keys(Keys.TAB).perform()
        here = driver.switch_to.active_element
        if reached and here == reached[0]:
            break
        if here not in reached:
            reached.append(here)
    return [f"{e.tag_name}#{e.get_attribute('id')}" for e in controls if e not in reached]


def test_the_playground_sends_a_file_as_curl_T_does(stack, admin, archive, shots, tmp_path):
    """An image chosen on the page (then sent by keyboard) reaches the handler byte for byte, with its
    content type: the page's answer is what ``curl -T`` gets, with the status and version."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    image = tmp_path / "noise.png"
    data = noise_png(image)
    limit = WorkerSettings().max_body_bytes
    admin.get(console(stack, f"/playground?endpoint={archive}"))
    assert f"{stack.worker_url()}/predictions/ENDPOINT" in admin.find_element(By.TAG_NAME, "main").text
    assert f"at most {limit:,} bytes" in admin.find_element(By.ID, "file-hint").text
    admin.find_element(By.ID, "file").send_keys(str(image))
    admin.find_element(By.ID, "send").send_keys(Keys.ENTER)
    got = answer_on_page(admin)
    assert got == {"status": "200", "version": "1", "answer": digest(data, "image/png"),
                   "sent": f"PUT /predictions/{archive}: {len(data):,} bytes of image/png from noise.png"}
    direct = httpx.put(f"{stack.worker_url()}/predictions/{archive}", content=data, timeout=30,
                       headers={"Content-Type": "image/png"})  # curl -T noise.png, with its type
    assert (direct.status_code, direct.headers["X-Model-Version"], direct.json()) == (200, "1", got["answer"])
    admin.save_screenshot(str(shots / "playground-upload.png"))
    assert axe_violations(admin) == []
    assert unreached_by_tab(admin) == []


def test_the_text_box_is_the_raw_body_when_no_file_is_chosen(stack, admin, archive):
    """Text goes as text/plain, JSON as application/json (the handler gets the decoded value, which
    it answers for as compact JSON); with neither, the page says what is missing."""
    from selenium.webdriver.common.by import By

    for typed, content_type in (("héllo torchserve", "text/plain; charset=utf-8"),
                                ('{"a": [1, 2]}', "application/json")):
        admin.get(console(stack, f"/playground?endpoint={archive}"))
        admin.find_element(By.ID, "input").send_keys(typed)
        admin.find_element(By.ID, "send").click()
        got = answer_on_page(admin)
        assert got["status"] == "200" and got["answer"] == digest(typed.encode(), content_type), got
        assert got["sent"] == (f"PUT /predictions/{archive}: {len(typed.encode()):,} bytes of {content_type} "
                               "from the text box"), got
        assert admin.find_element(By.ID, "input").get_attribute("value") == typed  # kept for the next try
    admin.get(console(stack, f"/playground?endpoint={archive}"))
    admin.find_element(By.ID, "send").click()
    shown(admin, "error", "choose a file, or type a body")


def test_a_file_over_the_workers_limit_is_refused_in_words(stack, admin, archive, tmp_path):
    """One byte over SERVING_MAX_BODY_BYTES, and three times over (the console stops reading at its
    cap but still answers the page): each refused before the data plane, saying the sizes."""
    from selenium.webdriver.common.by import By

    limit = WorkerSettings().max_body_bytes
    for name, size, said in (("over.bin", limit + 1, f"over.bin is {limit + 1:,} bytes"),
                             ("huge.bin", 3 * limit, "the upload is ")):
        big = tmp_path / name
        big.write_bytes(b"\x01" * size)
        admin.get(console(stack, f"/playground?endpoint={archive}"))
        admin.find_element(By.ID, "file").send_keys(str(big))
        admin.find_element(By.ID, "send").click()
        error = shown(admin, "error", said).text
        assert f"at most {limit:,} bytes" in error and "SERVING_MAX_BODY_BYTES" in error, error
        assert not admin.find_elements(By.ID, "result")
        assert admin.find_element(By.ID, "pick").get_attribute("value") == archive  # back on its own endpoint


def test_an_upload_needs_the_sessions_csrf_token(stack, admin, archive):
    """The multipart form is authorised as every console form: the session's cookie and its CSRF token."""
    from selenium.webdriver.common.by import By

    admin.get(console(stack, f"/playground?endpoint={archive}"))
    csrf = admin.find_element(By.CSS_SELECTOR, "input[name=csrf]").get_attribute("value")
    jar = {COOKIE: admin.get_cookie(COOKIE)["value"]}
    url = console(stack, f"/playground/upload?endpoint={archive}")
    files = {"file": ("x.png", b"\x89PNG", "image/png")}
    assert httpx.post(url, files=files, data={"csrf": csrf}).status_code == 403  # no session
    for form in ({}, {"csrf": "guessed"}):
        assert httpx.post(url, files=files, data=form, cookies=jar).status_code == 403
    ok = httpx.post(url, files=files, data={"csrf": csrf}, cookies=jar, timeout=30)
    assert ok.status_code == 200 and hashlib.sha256(b"\x89PNG").hexdigest() in ok.text


def test_the_prediction_log_set_from_the_page_and_live_accuracy_shown(stack, admin, demo, shots):
    """docs/prediction-log.md: the page sets what the log keeps (through the API, audited as the signed-in
    user); requests then logged and given their ground truth show as each version's live accuracy."""
    from selenium.webdriver.common.by import By

    admin.get(console(stack, f"/endpoint?name={EP}"))
    shown(admin, "prediction-log", "Prediction log: off")
    sample = admin.find_element(By.ID, "log-sample")
    sample.clear()
    sample.send_keys("100")
    admin.find_element(By.ID, "log-redact").send_keys(r"secret-\w+")
    admin.find_element(By.ID, "prediction-log-set").click()
    shown(admin, "flash", "done, set what the prediction log keeps")
    with stack.api() as api:
        assert api.get(f"/endpoints/{EP}").json()["prediction_log"]["redact"] == [r"secret-\w+"]
        mine = [e for e in api.get("/audit").json() if e["action"] == "PUT /endpoints/{name}/prediction-log"]
    assert mine and mine[0]["actor"] == "bootstrap-admin"
    labelled: dict[str, int] = {}

    def one_labelled() -> bool:  # until the worker has the new config and the statistics service the event
        r = httpx.post(f"{stack.worker_url()}/serve/{EP}", json={"text": TEXTS[0]}, timeout=10)
        version = r.headers["X-Model-Version"]
        fb = httpx.post(f"{stack.worker_url()}/serve/{EP}/feedback", timeout=10,
                        json={"request_id": r.headers["X-Request-Id"], "label": r.json()["label"]})
        if fb.status_code == 200:
            labelled[version] = labelled.get(version, 0) + 1
        return bool(labelled)
    wait_until(one_labelled, 60, "a logged request given its label", interval=0.5)
    (version, count), = labelled.items()
    admin.get(console(stack, f"/endpoint?name={EP}"))
    shown(admin, "prediction-log", "Prediction log: 100.0 % of requests")
    row = admin.find_element(By.CSS_SELECTOR, f"tr[data-version='{version}']")
    assert row.find_element(By.CSS_SELECTOR, "td.labelled").text == str(count)
    assert row.find_element(By.CSS_SELECTOR, "td.accuracy").text == "100.0 %"
    admin.save_screenshot(str(shots / "prediction-log.png"))
    with stack.api() as api:
        api.put(f"/endpoints/{EP}/prediction-log", json={"sample": 0}).raise_for_status()
