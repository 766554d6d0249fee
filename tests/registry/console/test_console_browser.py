"""The web console (registry/console/) in a real browser: `serving up` (workers on onnxruntime, no
Triton or LLM launcher: what the console shows does not depend on the engine) with the demo's
endpoint shape, `sentiment` at 90/10, driven in Debian's chromium through selenium.

The tests run in this file's order on one stack: sign-in and the 90/10 split, the numbers against
the statistics service, a CLI change arriving without reload, the viewer, promote, the playground,
keys, then every page's screenshot, axe-core check and keyboard walk. Screenshots go to the test
run's directory (``SERVING_CONSOLE_SHOTS``, else a pytest temporary folder); docs/console.md's
pictures are those of a run with SERVING_CONSOLE_SHOTS=docs/console.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import httpx
import pytest

from registry.rollout_metrics import StatisticsServiceSource, quantile
from serving.testmodels import build_bert_classifier
from tests.registry.console.browser import axe_violations, fresh_profile, start_chromium, tab_walk
from tests.serving.stack import Stack, make_stack
from tests.support import auth
from tests.support.procs import wait_until

EP = "sentiment"
TEXTS = ["the staff were friendly and quick", "an awful slow and noisy place", "calm and bright", "rude late broken"]
N = 40

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def stack(tmp_path_factory, tiny_model):
    v2 = build_bert_classifier(tmp_path_factory.mktemp("console-v2"), seed=7)
    s = make_stack(tmp_path_factory.mktemp("console-stack"), workers=1)
    try:
        s.up(1, "--no-triton", "--no-llm")
        labels = ",".join(tiny_model.labels)
        s.cli("model", "upload", "--name", EP, "--path", str(tiny_model.onnx_path))
        s.cli("model", "add", "--endpoint", EP, "--model", f"{EP}:1", "--engine", "onnxruntime",
              "--tokenizer", str(tiny_model.tokenizer_dir), "--labels", labels)
        s.cli("model", "upload", "--name", EP, "--path", str(v2.onnx_path))
        s.cli("model", "add", "--endpoint", EP, "--model", f"{EP}:2", "--engine", "onnxruntime",
              "--tokenizer", str(v2.tokenizer_dir), "--labels", labels, "--canary", "10%")
        wait_until(lambda: httpx.get(f"{s.worker_url()}/v2/models/{EP}/versions/2/ready", timeout=5).status_code == 200,
                   timeout=60, what="version 2 ready on the worker")
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
    driver = start_chromium(fresh_profile())
    driver.set_page_load_timeout(60)
    driver.set_script_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def console(stack: Stack, path: str = "/") -> str:
    return f"{stack.control_plane}/console{path}"


def sign_in(driver, stack: Stack, token: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    driver.delete_all_cookies()
    driver.get(console(stack, "/signin"))
    field = driver.find_element(By.ID, "token")
    field.send_keys(token)
    field.send_keys(Keys.ENTER)  # the keyboard signs in
    wait_until(lambda: driver.find_elements(By.CSS_SELECTOR, "nav[aria-label=Pages]"), timeout=20, what="signed in")


def shown(driver, element_id: str, containing: str = ""):
    """The element once the page a click started shows it (with ``containing`` in its text): a click
    returns before the next page has replaced this one."""
    from selenium.webdriver.common.by import By

    def found():
        for element in driver.find_elements(By.ID, element_id):
            if containing in element.text:
                return element
        return None

    return wait_until(found, timeout=30, what=f"#{element_id} showing {containing!r}",
                      on_timeout=lambda: driver.find_element(By.TAG_NAME, "body").text[:1500])


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


def test_sign_in_shows_the_demo_endpoint_at_90_10(stack, browser, shots):
    from selenium.webdriver.common.by import By

    browser.get(console(stack))
    assert browser.current_url.endswith("/console/signin")
    browser.find_element(By.ID, "token").send_keys("srv_not_a_token")
    browser.find_element(By.ID, "signin").click()
    shown(browser, "signin-error", "unknown, revoked")
    browser.save_screenshot(str(shots / "signin.png"))
    sign_in(browser, stack, auth.token(stack.home))
    cells = version_cells(browser, EP)
    assert {v: c["weight"] for v, c in cells.items()} == {1: "90", 2: "10"}


def test_numbers_equal_the_statistics_service(stack, browser, shots):
    with httpx.Client(timeout=30) as client:
        for i in range(N):
            assert client.post(f"{stack.worker_url()}/serve/{EP}", json={"text": TEXTS[i % 4]}).status_code == 200
    source = StatisticsServiceSource(stack.statistics_url())
    wait_until(lambda: sum(source.snapshot(EP, v).requests for v in (1, 2)) == N, timeout=30,
               what=f"the statistics service counted {N} requests")
    browser.get(console(stack))
    cells = version_cells(browser, EP)
    for version in (1, 2):
        counted = source.snapshot(EP, version)
        shown = cells[version]
        assert shown["requests"] == f"{counted.requests:,.0f}"
        assert shown["errors"] == f"{counted.errors:,.0f}"
        for q, cell in ((0.5, "p50"), (0.99, "p99")):
            value = quantile(q, counted.buckets)
            assert shown[cell] == ("–" if value is None else f"{value * 1000:,.1f}"), (version, cell)
    assert sum(int(cells[v]["requests"]) for v in (1, 2)) == N
    browser.save_screenshot(str(shots / "overview.png"))


def test_a_cli_change_shows_on_an_open_page_without_reload(stack, browser, shots):
    from selenium.webdriver.common.by import By

    browser.get(console(stack, f"/endpoint?name={EP}"))
    browser.execute_script("window.notReloaded = true;")
    wait_until(lambda: browser.find_element(By.TAG_NAME, "body").get_attribute("data-revision"), timeout=10,
               what="the page's event stream connected")
    stack.cli("canary", "set", "--endpoint", EP, "--weights", "1=80,2=20")

    def split_shown() -> bool:
        return browser.find_element(By.CSS_SELECTOR, "tr[data-version='2'] td.weight").text == "20"

    wait_until(split_shown, timeout=10, what="the new split on the open page")
    assert browser.execute_script("return window.notReloaded === true;")
    browser.save_screenshot(str(shots / "endpoint.png"))


def test_a_viewer_sees_no_action_and_a_forged_post_is_refused(stack, browser):
    from selenium.webdriver.common.by import By

    with stack.api() as api:
        viewer = api.post("/tokens", json={"name": "console-viewer", "role": "viewer"}).json()["token"]
    sign_in(browser, stack, viewer)
    browser.get(console(stack, f"/endpoint?name={EP}"))
    assert not browser.find_elements(By.ID, "actions")
    assert not browser.find_elements(By.CSS_SELECTOR, "form[action^='/console/act/']")
    assert not browser.find_elements(By.LINK_TEXT, "Keys")
    cookie = browser.get_cookie("serving_console")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    jar = {"serving_console": cookie["value"]}
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
    html = browser.page_source
    csrf = re.search(r'name="csrf" value="([^"]+)"', html).group(1)
    answer = httpx.post(url, data={"endpoint": EP, "confirm": "yes", "csrf": csrf}, cookies=jar, follow_redirects=True)
    assert "promote refused (403)" in answer.text and "needs role deployer or admin" in answer.text
    assert endpoint_routes(stack) == {1: 80.0, 2: 20.0}


def test_promote_from_the_page(stack, browser, shots):
    from selenium.webdriver.common.by import By

    sign_in(browser, stack, auth.token(stack.home))
    browser.get(console(stack, f"/endpoint?name={EP}"))
    field = browser.find_element(By.ID, "weight-1")  # the API's validation, in its words, on the page
    field.clear()
    field.send_keys("70")
    browser.find_element(By.ID, "set-weights").click()
    shown(browser, "flash", "weights refused (422): weights: weights must add up to 100, got 90")
    assert endpoint_routes(stack) == {1: 80.0, 2: 20.0}
    browser.find_element(By.ID, "promote").click()
    shown(browser, "confirm-question", "cannot be undone")
    browser.save_screenshot(str(shots / "confirm.png"))
    assert axe_violations(browser) == []
    shown(browser, "confirm").click()
    shown(browser, "flash", "done, promote")
    assert endpoint_routes(stack) == {2: 100.0}
    with stack.api() as api:
        mine = [e for e in api.get("/audit").json() if e["action"] == "POST /endpoints/{name}/promote"]
    assert mine and mine[0]["actor"] == "bootstrap-admin" and mine[0]["target"] == EP


def test_the_playground_answers_as_the_data_plane(stack, browser, shots):
    from selenium.webdriver.common.by import By

    wait_until(lambda: httpx.get(f"{stack.worker_url()}/status", timeout=5).json()["endpoints"][EP]["versions"]
               == [{"version": 2, "weight": 100.0}], timeout=30, what="the worker routes all to version 2")
    browser.get(console(stack, f"/playground?endpoint={EP}"))
    browser.find_element(By.ID, "input").send_keys(TEXTS[0])
    browser.find_element(By.ID, "send").click()
    version = shown(browser, "answer-version").text
    answer = json.loads(browser.find_element(By.ID, "answer").text)
    direct = httpx.post(f"{stack.worker_url()}/serve/{EP}", json={"text": TEXTS[0]}, timeout=30)
    assert version == direct.headers["X-Model-Version"] == "2"
    assert answer == direct.json()
    browser.save_screenshot(str(shots / "playground.png"))


def test_keys_created_once_and_revoked(stack, browser, shots):
    from selenium.webdriver.common.by import By

    browser.get(console(stack, "/keys"))
    browser.find_element(By.ID, "k-name").send_keys("console-key")
    browser.find_element(By.ID, "create-key").click()
    secret = shown(browser, "secret").get_attribute("value")
    assert axe_violations(browser) == []  # the page that shows it once
    ok = httpx.post(f"{stack.worker_url()}/serve/{EP}", json={"text": "fine"}, timeout=30,
                    headers={"Authorization": f"Bearer {secret}"})
    assert ok.status_code == 200
    browser.get(console(stack, "/keys"))
    assert secret not in browser.page_source
    browser.save_screenshot(str(shots / "keys.png"))
    browser.find_element(By.CSS_SELECTOR, "button[aria-label='Revoke key console-key']").click()
    shown(browser, "confirm").click()
    shown(browser, "flash", "revoked key console-key")
    with stack.api() as api:
        assert [k["revoked"] for k in api.get("/client-keys").json() if k["name"] == "console-key"] == [True]


def test_a_rollout_started_and_aborted_from_the_page(stack, browser, shots):
    from selenium.webdriver.common.by import By

    browser.get(console(stack, f"/endpoint?name={EP}"))
    browser.find_element(By.ID, "rollout-model").send_keys(f"{EP}:1")
    interval = browser.find_element(By.ID, "rollout-interval")
    interval.clear()
    interval.send_keys("3600")
    browser.find_element(By.ID, "rollout-start").click()
    shown(browser, "flash", "done, start a gated rollout")
    assert endpoint_routes(stack) == {2: 90.0, 1: 10.0}
    assert "running" in browser.find_element(By.CSS_SELECTOR, "details summary").text
    browser.save_screenshot(str(shots / "rollout.png"))
    browser.find_element(By.ID, "rollout-abort").click()
    shown(browser, "confirm").click()
    shown(browser, "flash", "done, abort the rollout")
    with stack.api() as api:
        assert [r["state"] for r in api.get("/rollouts", params={"endpoint": EP}).json()] == ["aborted"]
    assert endpoint_routes(stack) == {2: 100.0}


PAGES = {"overview": "/", "endpoint": f"/endpoint?name={EP}", "playground": f"/playground?endpoint={EP}",
         "models": "/models", "workers": "/workers", "audit": "/audit?actor=bootstrap-admin", "keys": "/keys"}


@pytest.mark.parametrize("page", list(PAGES))
def test_every_page_passes_axe_and_the_keyboard_reaches_everything(stack, browser, shots, page):
    browser.get(console(stack, PAGES[page]))
    browser.save_screenshot(str(shots / f"{page}-page.png"))
    assert axe_violations(browser) == []
    reached, focusable = tab_walk(browser)
    assert reached[0].startswith("A||#content|"), reached[:3]  # the skip link first
    assert [f for f in focusable if f not in reached] == []


def test_the_sign_in_page_passes_axe(stack, browser, shots):
    browser.delete_all_cookies()
    browser.get(console(stack, "/signin"))
    assert axe_violations(browser) == []
    sign_in(browser, stack, auth.token(stack.home))


def test_an_action_by_keyboard_alone(stack, browser):
    """Tab to the shadow form, type its fields, Enter: shadow on; Tab to "Shadow off", Enter: off."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    def tab_to(element_id: str):
        browser.switch_to.active_element.send_keys(Keys.TAB)
        for _ in range(150):
            focused = browser.switch_to.active_element
            if focused.get_attribute("id") == element_id:
                return focused
            focused.send_keys(Keys.TAB)
        raise AssertionError(f"Tab never reached #{element_id}")

    def shadow() -> list:
        with stack.api() as api:
            return [(t["version"], t["weight"]) for t in api.get(f"/endpoints/{EP}").json()["targets"] if t["role"] == "shadow"]

    with stack.api() as api:  # the shadow: a version that does not answer (run alone, both still do)
        if len(api.get(f"/endpoints/{EP}").json()["targets"]) > 1:
            api.post(f"/endpoints/{EP}/promote").raise_for_status()
        live = api.get(f"/endpoints/{EP}").json()["targets"][0]["version"]
    other = 3 - live
    sign_in(browser, stack, auth.token(stack.home))
    browser.get(console(stack, f"/endpoint?name={EP}"))
    tab_to("shadow-model").send_keys(f"{EP}:{other}", Keys.TAB, Keys.CONTROL, "a")
    browser.switch_to.active_element.send_keys("30", Keys.ENTER)
    wait_until(lambda: "done, copy a share" in browser.page_source, timeout=20, what="shadow on",
               on_timeout=lambda: browser.find_element(By.TAG_NAME, "main").text[:2000])
    assert shadow() == [(other, 30.0)]
    tab_to("shadow-off").send_keys(Keys.ENTER)
    wait_until(lambda: "done, stop shadowing" in browser.page_source, timeout=20, what="shadow off")
    assert shadow() == []
