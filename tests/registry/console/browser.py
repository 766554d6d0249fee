"""Debian's chromium driven through chromedriver by selenium, as the console's tests use it; axe-core
(npm, installed by scripts/setup.sh into node_modules/) injected into a page to check it.

Headless with a fresh profile and every background feature that would reach the network off
(this machine has no internet; chromium would otherwise try it at start)."""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from tests.support.ci import cannot_run, require_module
from tests.support.procs import REPO

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
AXE = REPO / "node_modules" / "axe-core" / "axe.min.js"
SERIOUS = ("serious", "critical")
FOCUSABLE = ("a[href], button:not([disabled]), input:not([type=hidden]):not([disabled]), select:not([disabled]), "
             "textarea:not([disabled]), [tabindex]:not([tabindex='-1'])")


def start_chromium(profile: Path):
    """A headless chromium (``webdriver.Chrome``), or the suite's rule when it cannot start here."""
    webdriver = require_module("selenium.webdriver")
    for exe in (CHROMIUM, CHROMEDRIVER):
        if not Path(exe).exists() and not shutil.which(Path(exe).name):
            cannot_run(f"{exe} is missing: scripts/setup.sh installs Debian's chromium and chromium-driver")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
                 f"--user-data-dir={profile}", "--window-size=1280,1000"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.get = _steady_get(driver)
    return driver


def _steady_get(driver, tries: int = 3):
    """``driver.get`` that loads the page again when Chromium showed its own error page instead.

    Chromium aborts a navigation, localhost included, with ERR_NETWORK_CHANGED when any interface of
    the host comes or goes (a container network, a Kubernetes bridge or veth of another suite on the same
    machine; Chromium has no switch to ignore it). That is the machine's doing, not the console's: the
    page is asked for again; a console that really fails still fails all ``tries``."""
    plain = driver.get

    def get(url: str) -> None:
        for _ in range(tries):
            plain(url)
            if not driver.current_url.startswith("chrome-error://"):
                return
    return get


def axe_violations(driver) -> list[dict]:
    """axe-core's serious and critical violations on the page now loaded."""
    if not AXE.exists():
        cannot_run(f"{AXE} is missing: scripts/setup.sh runs `npm install` (package.json: axe-core)")
    driver.execute_script(AXE.read_text())
    result = driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "axe.run(document, {resultTypes: ['violations']}).then(r => done(r.violations), e => done([{id: 'axe failed', "
        "impact: 'critical', description: String(e), nodes: []}]));")
    return [{"id": v["id"], "impact": v["impact"], "description": v["description"],
             "where": [n.get("target") for n in v.get("nodes", [])][:5]}
            for v in result if v.get("impact") in SERIOUS]


def tab_walk(driver, limit: int = 200) -> tuple[list[str], list[str]]:
    """Press Tab from the top of the page until the focus comes round again: the elements reached
    (as identifiers), and every focusable, visible element the page has (same identifiers)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    describe = ("const e = arguments[0] || document.activeElement; return e.tagName + '|' + (e.id || e.name || '') + '|' + "
                "(e.getAttribute('href') || e.getAttribute('formaction') || e.getAttribute('value') || '') + '|' + "
                "(e.textContent || '').trim().slice(0, 40);")
    everything = [driver.execute_script(describe, e) for e in driver.find_elements(By.CSS_SELECTOR, FOCUSABLE)
                  if e.is_displayed()]
    driver.execute_script("document.activeElement && document.activeElement.blur(); window.scrollTo(0, 0);")
    body = driver.find_element(By.TAG_NAME, "body")
    body.send_keys(Keys.TAB)  # the first Tab from nowhere lands on the page's first element
    reached: list[str] = []
    for _ in range(limit):
        here = driver.execute_script(describe)
        if reached and here == reached[0]:
            break
        if here not in reached:
            reached.append(here)
        driver.switch_to.active_element.send_keys(Keys.TAB)
    return reached, everything


def fresh_profile() -> Path:
    return Path(tempfile.mkdtemp(prefix="console-chromium-"))
