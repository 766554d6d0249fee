"""The web console of a deployed platform, walked in Chromium: what tests/deploy/test_compose_up.py (through
the gateway, HTTPS) and tests/deploy/kube/test_helm_install.py (through the control plane's Service) both
check, with the browser helpers of tests/support/browser.py.

Signed in with the admin token, the overview lists the endpoint with the versions the API has and reads
the statistics service (no "does not answer" banner: SERVING_STATISTICS_URL is right); the playground's
answer, sent by the control plane to the data plane (SERVING_CONSOLE_DATA_PLANE_URL) with the client
key, equals the answer of the version that gave it, asked directly; and a configuration change made
with the CLI arrives on the open endpoint page by its event stream, without a reload (server-sent
events through whatever is in front: nginx must not buffer them).

Why the bound here is the event stream's keepalive period and not the console's 2 s: what this check
must tell apart is an event passed on at once from one held in a proxy's buffer, which a 13-byte
keepalive every ``KEEPALIVE_S`` would not flush for minutes. How fast the page follows is a latency,
measured on a stack of its own (tests/registry/console/test_console_browser.py: 0.02 s); a whole
cluster or compose stack beside the rest of the suite on 2 cores once took 4.9 s to re-read the page,
and failed a 2 s bound while nothing was buffered.
"""
from __future__ import annotations

import json
import time
from typing import Callable

from registry.console.app import KEEPALIVE_S
from registry.console.sessions import COOKIE
from tests.support.browser import chromium, shown, sign_in
from tests.support.procs import wait_until

TEXT = "the staff were friendly and quick"


def check_console(base: str, token: str, endpoint: str, versions: set[int], key: str,
                  direct: Callable[[str, str], dict], change: Callable[[], None], shows: str,
                  trust_spki: tuple[str, ...] = ()) -> dict:
    """Walk the console at ``base`` (…/console). ``direct(version, text)``: the data plane's own answer of
    that version; ``change()``: a CLI command that changes ``endpoint``'s configuration, after which the
    endpoint page ``shows`` a text (its audit entry in "Last configuration changes"). Returns the
    session cookie as the browser holds it."""
    from selenium.webdriver.common.by import By

    with chromium(trust_spki) as browser:
        sign_in(browser, base, token)
        section = browser.find_element(By.CSS_SELECTOR, f"[data-endpoint='{endpoint}']")
        shown_versions = {int(r.get_attribute("data-version")) for r in section.find_elements(By.CSS_SELECTOR,
                                                                                            "tr[data-version]")}
        assert shown_versions == versions, (shown_versions, section.text)
        banners = [b.text for b in browser.find_elements(By.CSS_SELECTOR, ".flash.bad")]
        assert not banners, banners
        cookie = browser.get_cookie(COOKIE)

        browser.get(f"{base}/playground?endpoint={endpoint}")
        browser.find_element(By.ID, "input").send_keys(TEXT)
        browser.find_element(By.ID, "key").send_keys(key)
        browser.find_element(By.ID, "send").click()
        version = shown(browser, "answer-version").text
        assert browser.find_element(By.ID, "answer-status").text == "200", browser.find_element(By.ID, "answer").text
        assert json.loads(browser.find_element(By.ID, "answer").text) == direct(version, TEXT)

        browser.get(f"{base}/endpoint?name={endpoint}")
        browser.execute_script("window.notReloaded = true;")
        revision = lambda: browser.find_element(By.TAG_NAME, "body").get_attribute("data-revision")  # noqa: E731
        before = wait_until(revision, timeout=20, what="the page's event stream connected")
        change()
        made = time.monotonic()

        def arrived() -> bool:  # the event (only server-sent events set data-revision), and the page re-read
            return revision() != before and shows in browser.find_element(By.ID, "live-endpoint").text
        wait_until(arrived, timeout=20, interval=0.05, what=f"{shows!r} on the open page, by its event stream")
        took = time.monotonic() - made
        print(f"\nconsole at {base}: a CLI change on the open page {took:.2f} s after the CLI returned")
        assert took < KEEPALIVE_S, f"{took:.1f} s: the event was held on its way (a buffering proxy?)"
        assert browser.execute_script("return window.notReloaded === true;")
        return cookie
